"""How bk reads a command line before any command runs (issue 10, item 9):
command options before the command word, ``--json`` anywhere (``--version``
included), help for sub-commands, the promised commands this release lacks,
``NO_COLOR=`` and the cheat sheet that opens ``bk -h``.  Argv handling is
tested through the built archive, the rest in-process."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers_cli import NOW_ISO, bk_fixture

from bk.cli import app as cli_app

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def run(pyz, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update(BK_DATA_DIR=str(tmp_path / "data"), BK_GPU_COUNT="4", BK_NOW=NOW_ISO, TZ="UTC",
               HOME=str(tmp_path), COLUMNS="80", NO_COLOR="1")

    def bk(*argv: str, code: int = 0) -> subprocess.CompletedProcess:
        p = subprocess.run([sys.executable, str(pyz), *argv], env=env, capture_output=True,
                           stdin=subprocess.DEVNULL, text=True, timeout=60)
        assert p.returncode == code, (argv, p.returncode, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr
        return p
    return bk


@pytest.fixture
def bk(monkeypatch, capsys):
    yield from bk_fixture(monkeypatch, capsys)


# ------------------------------------------------ options before the command

@pytest.mark.slow
def test_command_options_before_the_command_word(run):
    dry = run("--dry-run", "1", "30m")
    assert dry.stdout.startswith("would book 1 GPU (0) shared 07-13 10:40–11:10")
    assert json.loads(run("--json", "l").stdout)["data"]["reservations"] == []   # nothing booked
    short_id = run("-q", "1", "30m").stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{8}", short_id)
    verbose = run("-v", "2", "1h").stdout
    assert "chosen" in verbose and "booked 2 GPUs" in verbose
    assert "11:00–11:30" in run("-t", "11:00", "1", "30m").stdout      # a value travels along
    assert run("-q", "d", "1", "-y").stdout == ""                       # before another command
    assert run("--dry-run", "p", "save", "train", "2", "1h").stdout.startswith("would be created")
    assert run("-v", "st").stdout == run("st", "-v").stdout != run("st").stdout


@pytest.mark.slow
def test_an_option_the_command_lacks_says_where_it_goes(run):
    bad = run("--dry-run", "st", code=2)
    assert bad.stderr.startswith("error: bk st takes no --dry-run\n")
    assert "it goes after the command word of: bk book," in bad.stderr and "bk cancel" in bad.stderr
    env = json.loads(run("--json", "--dry-run", "st", code=2).stdout)
    assert env["command"] == "status" and env["error"]["code"] == "invalid_input"
    alone = run("-v", code=2)
    assert alone.stderr.startswith("error: -v needs a command\n") and "bk status" in alone.stderr


@pytest.mark.slow
def test_json_in_any_position_version_included(run):
    for argv in (["--json", "--version"], ["--version", "--json"], ["--json", "-V"]):
        env = json.loads(run(*argv).stdout)
        assert env["ok"] and env["command"] == "version" and env["data"]["version"], argv
    assert run("--version").stdout.startswith("bk ")
    for argv in (["--json", "l"], ["l", "--json"], ["--json", "-q", "1", "30m"]):
        assert json.loads(run(*argv).stdout)["ok"], argv
    helped = json.loads(run("p", "save", "-h", "--json").stdout)
    assert helped["command"] == "help" and helped["data"]["path"] == ["p", "save"]
    assert helped["data"]["text"].startswith("usage: bk preset save")


def test_hoisting_is_idempotent_and_keeps_what_follows_dashdash():
    once = cli_app.normalise(["-q", "-t", "11:00", "1", "30m", "--", "-q"])
    assert once == ["book", "1", "30m", "-q", "-t", "11:00", "--", "-q"]
    assert cli_app.normalise(once) == once
    assert cli_app.normalise(["-h", "l"]) == ["-h", "l"]       # bk's own option stays in front


# ------------------------------------------------ help for sub-commands

@pytest.mark.slow
def test_help_for_nested_sub_commands(run):
    show = run("help", "preset", "show").stdout
    assert show.startswith("usage: bk preset show") and "NAME" in show
    assert run("help", "p", "save").stdout.startswith("usage: bk preset save")
    assert run("help", "admin", "notice", "publish").stdout.startswith("usage: bk admin notice publish")
    bad = run("help", "preset", "bogus", code=2)
    assert "no sub-command of bk preset named 'bogus'" in bad.stderr and "save" in bad.stderr


def _help_hints() -> set[str]:
    found = set()
    for path in (ROOT / "bk").rglob("*.py"):
        for m in re.finditer(r"bk help ((?:[a-z][a-z-]*)(?: [a-z][a-z-]*)*)", path.read_text()):
            found.add(m.group(1))
    return found - {"help"}


def test_every_bk_help_hint_in_the_code_works(bk):
    hints = _help_hints()
    assert {"admin", "book"} <= hints, hints           # the scan sees the hints
    for topic in hints:
        r = bk.json("help", *topic.split())
        assert r.code == 0, (topic, r.out)
        assert r.data["text"].startswith("usage: bk "), topic


def test_every_usage_hint_of_a_sub_command_works(bk):
    r = bk.json("p", "save")                              # missing NAME N
    hint = r.error["hint"]
    assert r.code == 2 and hint == "see: bk help preset save"
    assert bk.data(*hint.removeprefix("see: bk ").split())["text"].startswith("usage: bk preset save")


# ------------------------------------------------ promised commands

# Every command word SPEC 6.1 and the seed README promise; each is a real
# command now (the table of "planned" stand-ins is gone with the last of them).
PROMISED = ("t", "tui", "u", "usage", "m", "monitor", "run", "j", "jobs", "w", "worker", "update",
            "c", "cluster", "mcp", "agent")


def test_promised_commands_are_commands(run):
    t = run("t")            # without a terminal it prints the text timeline
    assert "here is the text timeline (bk tl)" in t.stderr and "GPU 0" in t.stdout
    r = run("mcp", "--help")       # help with the client configuration snippet
    assert '"mcpServers"' in r.stdout and "bk rm" not in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("word", PROMISED)
def test_each_promised_command_has_help(bk, word):
    r = bk.json("help", word)
    assert r.code == 0, (word, r.out)
    assert r.data["text"].startswith("usage: bk "), word
    assert "not in this release" not in bk.ok("help").out


def test_an_unknown_word_is_suggested_never_run(bk):
    r = bk("workr")
    assert r.code == 2 and "unknown command 'workr'" in r.err and "did you mean: bk worker?" in r.err


# ------------------------------------------------ NO_COLOR and the cheat sheet

class _Tty:
    encoding = "utf-8"

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        raise OSError


@pytest.mark.parametrize("env, colour", [({}, True), ({"NO_COLOR": ""}, True),
                                         ({"NO_COLOR": "1"}, False), ({"NO_COLOR": "0"}, False),
                                         ({"TERM": "dumb"}, False)])
def test_only_a_non_empty_no_color_turns_colour_off(env, colour):
    from bk.cli.render import Term

    assert Term.detect(_Tty(), {"TERM": "xterm", "COLUMNS": "80", **env}).color is colour


@pytest.mark.slow
def test_help_opens_with_the_cheat_sheet(run, bk):
    text = run("-h").stdout
    sheet = text.split("Everyday commands:\n", 1)[1].split("\n\n", 1)[0]
    assert text.index("Everyday commands:") < text.index("positional arguments")
    assert text.splitlines()[0].startswith("usage: bk") and len(text.splitlines()[2]) < 60
    commands = [re.split(r"\s{2,}", line.strip())[0] for line in sheet.splitlines()]
    firsts = {shlex.split(c)[1] for c in commands}
    assert {"1", "l", "d", "e", "st", "tl", "slots", "g", "p", "doctor"} <= firsts
    bk.ok("1", "30m")                                       # so that "bk d 1" and "bk e 1" name one
    for c in commands:
        cli_app.parse_argv(shlex.split(c)[1:])              # every example is a real command line
    assert run("help").stdout == text
