"""Stored text cannot steer the terminal (issue 10, item 4).

Every string a person stored (a note, a notice, a user name, a process
label, a cancel reason, a preset's note, an op-id) is put into the ledger
holding terminal escapes, a bidi override, C1 controls and a lone
surrogate; every human view that shows it must print visible escapes and
no raw control character.  The JSON keeps the stored strings."""

from __future__ import annotations

import json
import os
import re

import pytest
from helpers_cli import ROOT, SIM_GPUS, bk_fixture
from helpers_text import CLASSES, STRICT

from bk.cli import app as cli_app
from bk.cli.render import safe
from bk.service.requests import Actor, BookRequest, CancelRequest, NoticeRequest

# Clear the screen, set the window title, a one-byte CSI (C1), DEL, a
# right-to-left override, a lone surrogate, a newline and a carriage return.
EVIL = "x\x1b[2J\x1b]0;pwned\x07\x9b31m\x7f\u202eevil\u2066\ud800\nline2\r"
EVIL_USER = "mal\x1b[31mlory\u202e"
# What no human view may print: every C0 control but the newline, DEL, C1,
# line/paragraph separators, bidi embeddings/overrides/isolates, surrogates.
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
MALLORY = Actor(3000, "mallorytoken")


@pytest.fixture
def bk(monkeypatch, capsys):
    yield from bk_fixture(monkeypatch, capsys)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_class_is_shown_as_visible_escapes(name):
    from bk.core import safetext

    text = CLASSES[name]
    for shown in (safe(text), safetext.safe(text, multiline=True)):
        assert not STRICT.search(shown), (name, shown)
        assert "\\" in shown, shown                            # visibly: as escapes
    assert not STRICT.search(safetext.safe(text, mark="?"))     # or as a mark, in a TUI cell
    from bk.tui.render import clean

    assert not STRICT.search(clean(text)) and "?" in clean(text)
    assert all(safetext.escaped(c) or c.isprintable() or c in " " for c in text)


def test_multiline_text_keeps_its_line_breaks_and_nothing_else():
    from bk.core.safetext import safe_lines

    assert safe_lines("one\r\ntwo\n\tthree\rfour\x1b[2J") == "one\ntwo\n\tthree\\rfour\\x1b[2J"
    assert safe("one\ntwo") == "one\\ntwo"                     # one-line text: the break is shown


def test_printable_text_of_any_script_is_unchanged():
    for text in ("café 日本語 – ok", "emoji 🎉 and 🫠", "\u00a0nbsp\u3000wide", "नमस्ते", "عربى", "\ue0b0 icon"):
        assert safe(text) == text


def test_the_ledger_refuses_what_steers_and_accepts_the_invisible():
    from bk.core.errors import InvalidInput
    from bk.service.fields import check_text

    for bad in ("a\u200fb", "a\u061cb", "a\u2028b", "a\u202eb", "a\x1bb", "a\tb"):
        with pytest.raises(InvalidInput, match="control characters"):
            check_text(bad, "--note", max_len=100)
    assert check_text("👩\u200d💻 a\u200bb", "--note", max_len=100)     # shown escaped, stored as is


def test_safe_escapes_what_steers_a_terminal_and_keeps_the_rest():
    assert safe("plain note, 12g") == "plain note, 12g"
    assert safe("café 日本語 – ok") == "café 日本語 – ok"
    assert safe("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert safe("\x9b\x7f\x00\t\n\r") == "\\x9b\\x7f\\x00\\t\\n\\r"
    assert safe("\u202eabc\u2069\u2028") == "\\u202eabc\\u2069\\u2028"
    assert safe("\ud800") == "\\ud800"
    assert safe(1000) == "1000"
    assert not RAW.search(safe(EVIL))


TOKEN, USER_TOKEN = "EVILTOKEN", "mallorytoken"


def _plant(root) -> None:
    """Put the hostile strings where the placeholders are, in every file bk
    wrote (ledger, backups, audit log, archive, presets): the service
    refuses control characters at input, so this is what an older or a
    hand-edited ledger holds.  The files stay valid JSON."""
    for path in root.rglob("*"):
        if path.is_file() and path.name != "sim.json" and not path.name.endswith(".lock"):
            text = path.read_text()
            if TOKEN in text or USER_TOKEN in text:
                text = text.replace(TOKEN, json.dumps(EVIL)[1:-1])
                path.write_text(text.replace(USER_TOKEN, json.dumps(EVIL_USER)[1:-1]))


def _world(bk) -> dict:
    """A ledger full of hostile strings."""
    doc = json.loads(json.dumps(SIM_GPUS))
    doc["gpus"][1]["processes"] = [{"pid": 31337, "uid": 3000, "user": EVIL_USER, "label": EVIL,
                                    "mem_mib": 100}]
    doc["gpus"][3]["name"] = "GPU\x1b[5m"
    bk.sim(doc)
    mine = bk.data("1", "1h", "-t", "20:00", "--note", TOKEN, "--op-id", "op-" + TOKEN)["reservation"]
    bk.data("1", "30m", "--note", TOKEN)
    bk.ok("e", mine["id"][:8], "--note", TOKEN + "2")
    bk.data("p", "save", "train", "1", "1h", "--note", TOKEN)
    theirs = bk.service(MALLORY).run("book", BookRequest(count=1, duration=3600, note=TOKEN)).reservation
    root = bk.service(ROOT)
    root.run("notice_publish", NoticeRequest(TOKEN, level="warning"))
    # Started before it is cancelled: a booking cancelled before it starts
    # leaves no note behind in the history (issue 22, item 4).
    cancelled = bk.data("1", "2h", "--note", TOKEN)["reservation"]
    root.run("cancel", CancelRequest(ref=cancelled["id"], reason=TOKEN))
    _plant(bk.root)
    return {"mine": mine["id"], "theirs": theirs.id, "cancelled": cancelled["id"]}


VIEWS = {
    "list": lambda w: ["l"],
    "list all": lambda w: ["l", "--all"],
    "list history": lambda w: ["l", "--history"],
    "status": lambda w: ["st"],
    "status verbose": lambda w: ["st", "-v"],
    "timeline": lambda w: ["tl"],
    "history": lambda w: ["history", w["mine"][:8]],
    "history of a cancel": lambda w: ["history", w["cancelled"][:8]],
    "log": lambda w: ["lg"],
    "notices": lambda w: ["n"],
    "notices all": lambda w: ["n", "--all"],
    "login": lambda w: ["login"],
    "presets": lambda w: ["p"],
    "preset show": lambda w: ["p", "show", "train"],
    "book": lambda w: ["1", "10m", "-t", "23:00"],
    "edit": lambda w: ["e", w["mine"][:8], "-d", "2h"],
    "cancel": lambda w: ["d", w["mine"][:8], "-y"],
    "unknown booking": lambda w: ["d", "zz\x1b[2Jzz"],
}
ADMIN_VIEWS = {
    "admin cancel": lambda w: ["admin", "cancel", w["theirs"][:8], "--reason", "maintenance", "-y"],
    "admin log all": lambda w: ["lg", "--all"],
    "admin status": lambda w: ["st", "-v"],
}


def _check(code: int, out: str, err: str) -> None:
    assert code in (0, 2, 4), (code, out, err)
    assert not RAW.search(out), repr(out)
    assert not RAW.search(err), repr(err)


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_no_view_prints_a_raw_control_character(bk, view):
    w = _world(bk)
    r = bk(*VIEWS[view](w))
    _check(r.code, r.out, r.err)
    if view not in ("timeline", "unknown booking", "book", "edit", "cancel"):   # no stored text
        assert "\\x1b" in r.out + r.err, r.out


@pytest.mark.skipif(os.geteuid() != 0, reason="bk admin checks the real uid")
@pytest.mark.parametrize("view", sorted(ADMIN_VIEWS))
def test_no_admin_view_prints_a_raw_control_character(bk, view, capsys):
    w = _world(bk)
    capsys.readouterr()
    from bk.service import open_app

    code = cli_app.run(ADMIN_VIEWS[view](w), dict(os.environ), opener=lambda env: open_app(env, actor=ROOT))
    out, err = capsys.readouterr()
    _check(code, out, err)
    assert "\\x1b" in out + err, out


def test_json_keeps_the_stored_strings(bk):
    _world(bk)
    rows = bk.data("l", "--all")["reservations"]
    assert EVIL in [r.get("note") for r in rows]
    assert EVIL_USER in [r["user"] for r in rows]
    raw = bk.json("l", "--all").out
    assert raw.isascii() and "\x1b" not in raw          # the encoder escapes, the data is intact
    assert EVIL in [n["text"] for n in bk.data("n")["notices"]]


def test_the_guided_dialog_shows_typed_words_escaped(bk):
    from bk.cli.guided import Dialog, Question
    from bk.core.errors import InvalidInput

    said: list[str] = []
    answers = iter(["bad\x1b[2J\u202e", "ok"])

    def parse(word: str) -> str:
        if word != "ok":
            raise InvalidInput(f"not a word: {word}", hint=f"you typed {word}")
        return word

    got = Dialog(lambda prompt: next(answers), said.append).run([Question("w", "Word?", parse)])
    assert got == {"w": "ok"}
    assert said and not any(RAW.search(s) for s in said), said
    assert any("\\x1b[2J\\u202e" in s for s in said)


def test_a_name_from_the_ledger_is_escaped_in_every_table(bk):
    bk.service(MALLORY).run("book", BookRequest(count=1, duration=1800))
    _plant(bk.root)
    for argv in (["l", "--all"], ["st", "-v"]):
        out = bk.ok(*argv).out
        assert "mal\\x1b[31mlory\\u202e" in out and not RAW.search(out)


def test_a_process_label_from_a_hostile_argv_is_neutralised_in_the_snapshot_json_and_views(pyz, tmp_path):
    """A real process whose argv[0] carries every class: the monitor's
    snapshot file, ``bk st --json`` and ``bk st -v`` all show escapes."""
    import subprocess
    import sys

    from helpers_broker import poll
    from helpers_text import CLASSES, STRICT

    # Everything but the line breaks and the surrogate (argv holds bytes; a
    # lone surrogate cannot be encoded, and the separators are enough).
    evil = "".join(v for k, v in CLASSES.items() if "surrogate" not in k).replace("/", "|")
    sleeper = subprocess.Popen([f"/nowhere/ev{evil}il", "120"], executable="/bin/sleep")
    monitor = None
    try:
        sim = tmp_path / "sim.json"
        sim.write_text(json.dumps({"gpus": [{"name": "H100", "mem_total_mib": 81559, "processes": [
            {"pid": sleeper.pid, "mem_mib": 100, "proc": True}]}]}))
        data = tmp_path / "data"
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "TZ": "UTC",
               "BK_DATA_DIR": str(data), "BK_GPU_SIM_FILE": str(sim)}
        monitor = subprocess.Popen([sys.executable, str(pyz), "m", "--interval", "0.2"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

        def snapshot_label():
            if monitor.poll() is not None:
                raise AssertionError(f"bk m exited: {monitor.stderr.read()}")
            try:
                doc = json.loads((data / "monitor" / "snapshot.json").read_text())
            except (OSError, ValueError):
                return None
            procs = doc["gpus"][0].get("processes") or []
            return procs[0].get("label") if procs else None

        label = poll(snapshot_label, 60, "the monitor's snapshot with the process")
        assert label.startswith("ev\\x1b") and not STRICT.search(label), repr(label)
        st = subprocess.run([sys.executable, str(pyz), "st", "--json"], env=env, capture_output=True, text=True,
                            timeout=60)
        (proc,) = json.loads(st.stdout)["data"]["gpus"][0]["processes"]
        assert proc["label"] == label
        human = subprocess.run([sys.executable, str(pyz), "st", "-v"], env=env, capture_output=True, text=True,
                               timeout=60)
        assert human.returncode == 0 and label[:20] in human.stdout, human.stdout
        assert not STRICT.search(human.stdout + human.stderr), repr(human.stdout)
    finally:
        for p in (monitor, sleeper):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)
