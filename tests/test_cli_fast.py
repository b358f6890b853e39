"""The everyday words' shortcut (bk.cli.fast) against argparse (bk.cli.app).

For every command line the shortcut takes, argparse must read the same
namespace (same attributes, same values, the same handler); every line it
does not take must be left alone (None) so argparse answers it, errors and
help included.  Lines are drawn at random from the grammar's own pieces and
from near misses (abbreviations, glued flags, bad numbers, '--', values
that start with '-'); the seed is printed on failure."""

from __future__ import annotations

import contextlib
import io
import os
import random
import subprocess
import sys

import pytest

from bk.cli import app, fast
from bk.core.errors import BkError

SEED = int(os.environ.get("BK_TEST_SEED", random.randrange(1 << 30)))

WORDS = ["l", "ls", "list", "st", "status", "n", "notices", "g", "gpu", "d", "del", "rm", "cancel",
         "e", "edit", "book", "s", "x", "exclusive", "1", "2", "07", "tl", "slots", "p", "help", "٣"]
VALUES = ["30m", "1h", "+30m", "-15m", "-1", "0", "5", "05", "-5", "0,1", "12g", "shared", "exclusive",
          "tomorrow 09:00", "", "a1b2c3d4", "x=y", "1_0", " 3", "+3", "٣", "-", "--", "-h"]
OPTIONS = sorted({o for g in fast.WORDS.values() for o in g.options} | fast.LEADING_FLAGS | fast.LEADING_VALUE)
NEAR = ["--json", "-h", "--help", "--dry", "-qy", "-d30m", "--note=hi", "--all=1", "-m=2g", "--mode=shared",
        "--limit=3", "--duration=-15m", "--", "-V", "--version", "--from", "--quiet", "-r", "--bogus", "-"]


def argparse_reads(argv):
    """argparse's namespace and normalised words for ``argv`` (as bk.cli.app.run), or the refusal."""
    typed, as_json = app._strip_json(argv)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return vars(app.parse_argv(typed)), as_json, app.normalise(typed)
    except (BkError, SystemExit) as e:
        return type(e).__name__


def random_line(rnd: random.Random) -> list[str]:
    line = []
    for _ in range(rnd.randrange(0, 7)):
        pick = rnd.random()
        if pick < 0.35:
            line.append(rnd.choice(OPTIONS))
            if rnd.random() < 0.7:
                line.append(rnd.choice(VALUES))
        elif pick < 0.5:
            line.append(rnd.choice(NEAR))
        elif pick < 0.75:
            line.append(rnd.choice(VALUES))
        else:
            line.append(rnd.choice(WORDS))
    if rnd.random() < 0.7:
        line.insert(rnd.randrange(0, len(line) + 1), rnd.choice(WORDS))
    return line


TABLE = [
    ["l"], ["l", "--json"], ["--json", "l", "-n", "5"], ["l", "--all", "-n", "0"], ["l", "--history"],
    ["ls", "--limit=3"], ["-n", "5", "l"], ["--all", "l"], ["st"], ["st", "-v"], ["-v", "status"],
    ["n"], ["n", "--all"], ["g"], ["g", "4"], ["g", "2", "-d", "3h", "-m", "20g"], ["g", "--mode", "exclusive"],
    ["1", "30m"], ["2", "1h30m", "12g"], ["-q", "1", "30m"], ["1", "30m", "-q", "--json"],
    ["-t", "20:00", "1", "1h"], ["--dry-run", "1", "30m"], ["x", "1", "1h"], ["book", "2", "-d", "1h", "12g"],
    ["1", "30m", "--note", "hi there"], ["1", "30m", "--note="], ["1", "-d", "1h", "-g", "0,1", "-s", "2"],
    ["1", "30m", "-t", "tomorrow 09:00", "--queue", "--advance", "--with", "alice,@nlp", "--op-id", "k1"],
    ["d", "1"], ["d", "1", "-y"], ["rm", "a1b2c3d4", "--dry-run"], ["d", "2", "-y", "--op-id", "retry-7"],
    ["-y", "d", "1"], ["e", "1", "-d", "+30m"], ["e", "1", "-d", "-15m"], ["e", "1", "--duration", "-15m"],
    ["e", "1", "--duration=-15m"], ["e", "2", "-d", "2h", "--mode", "shared", "--keep-for", "off"],
    ["-d", "2h", "e", "2"], ["e", "1"], ["e", "1", "-q", "--note", ""],
]
REFUSED = [  # the shortcut leaves these to argparse (help, errors, forms it does not read)
    [], ["-h"], ["l", "-h"], ["l", "--help"], ["l", "5"], ["l", "--all", "--history"], ["l", "-n", "-1"],
    ["l", "-n", "x"], ["l", "-n", " 3"], ["l", "-n", "٣"], ["l", "--al"], ["st", "-vv"], ["d"], ["d", "1", "2"],
    ["d", "1", "-qy"], ["e", "1", "-d30m"], ["e", "1", "-m=2g"], ["g", "1", "2"], ["g", "--mode", "both"],
    ["g", "-s", "0x1"], ["book"], ["1", "30m", "--", "python3"], ["1", "30m", "--note", "-x"],
    ["--quiet", "1", "30m"], ["-d", "1h", "l"], ["tl"], ["slots", "2", "1h"], ["--version", "l"],
    ["1", "30m", "--dry-run=1"], ["1", "30m", "--bogus"], ["-t", "-5m", "1", "1h"],
]


def check(argv, seed=None):
    mine, theirs = fast.parse(list(argv)), argparse_reads(list(argv))
    where = f"bk {' '.join(argv)!r}" + (f" (seed {seed})" if seed is not None else "")
    if mine is None:
        return False
    ns, as_json, words = mine
    assert not isinstance(theirs, str), f"{where}: the shortcut read what argparse refuses ({theirs})"
    assert (vars(ns), as_json, words) == theirs, where
    return True


@pytest.mark.parametrize("argv", TABLE, ids=" ".join)
def test_every_everyday_form_reads_as_argparse_reads_it(argv):
    assert check(argv), f"the shortcut should read bk {' '.join(argv)}"


@pytest.mark.parametrize("argv", REFUSED, ids=lambda a: " ".join(a) or "(empty)")
def test_what_the_shortcut_does_not_know_goes_to_argparse(argv):
    assert fast.parse(list(argv)) is None


@pytest.mark.slow
def test_random_lines_read_the_same_or_fall_through():
    rnd = random.Random(SEED)
    taken = 0
    for _ in range(800):
        taken += check(random_line(rnd), SEED)
    assert taken > 30, f"seed {SEED}: only {taken} lines were read by the shortcut"


def test_options_before_the_word_split_as_argparse_splits_them():
    # argparse decides from every command's options which leading option takes a value.
    takes_value = app._value_options()
    assert fast.LEADING_VALUE <= takes_value
    assert not fast.LEADING_FLAGS & takes_value
    for g in fast.WORDS.values():
        for opt, (_dest, kind) in g.options.items():
            assert opt in (fast.LEADING_VALUE if kind != fast.FLAG else fast.LEADING_FLAGS | {"--quiet"}), opt


def test_the_shortcut_knows_every_option_of_its_words():
    parser = app.build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for word, grammar in fast.WORDS.items():
        if word.isdigit():
            continue
        theirs = {o for a in sub.choices[word]._actions for o in a.option_strings} - {"-h", "--help"}
        assert set(grammar.options) == theirs, word


def test_the_built_archive_answers_the_same_through_either_reader(pyz, tmp_path):
    # The same line through the shortcut and through argparse (a leading
    # option the shortcut does not take sends it there), as the user runs it.
    env = {**os.environ, "BK_DATA_DIR": str(tmp_path / "d"), "BK_GPU_COUNT": "2", "HOME": str(tmp_path),
           "TZ": "UTC", "XDG_CONFIG_HOME": str(tmp_path / "c"), "XDG_STATE_HOME": str(tmp_path / "s")}

    def bk(*argv):
        p = subprocess.run([sys.executable, str(pyz), *argv], env=env, capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout, p.stderr

    assert fast.parse(["1", "30m", "-q"]) and fast.parse(["1", "30m", "-qy"]) is None
    code, rid, _ = bk("1", "30m", "-q")
    assert code == 0 and len(rid.strip()) == 8
    fast_l, slow_l = bk("l", "--json"), bk("l", "--json", "--limit", "20", "--lim", "20")
    assert fast_l == slow_l and rid.strip() in fast_l[1]
    assert bk("l", "--all", "--history")[0] == 2          # argparse's refusal, not the shortcut's
