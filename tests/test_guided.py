"""The guided flows: the question engine in-process (streams), ``bk a`` and
``bk e ID`` end to end in a pseudo-terminal, and their refusal without one."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bk.cli.guided import Cancelled, Dialog, Question, parse_mode, parse_yes
from bk.core.errors import InvalidInput

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("_bk_pty_helpers", HERE / "test_prompt.py")
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)
Pty, bk_env, ROOT = _helpers.Pty, _helpers.bk_env, _helpers.ROOT


# ----------------------------------------------------------- the engine

def number(word: str) -> int:
    if not word.isdigit():
        raise InvalidInput(f"{word!r} is not a number", hint="e.g. 2")
    return int(word)


def dialog(answers: str):
    out = io.StringIO()
    return Dialog.from_streams(io.StringIO(answers), out), out


QUESTIONS = [
    Question("a", "First?", number, "1", help="a number"),
    Question("b", "Second?", number, None),
    Question("c", "Third?", number, "3", when=lambda a: a["b"] > 5),
]


def test_defaults_and_answers():
    d, out = dialog("\n7\n\n")
    assert d.run(QUESTIONS) == {"a": 1, "b": 7, "c": 3}
    assert "First? [1] " in out.getvalue() and "Second? " in out.getvalue()


def test_skipped_question_is_not_asked():
    d, out = dialog("2\n4\n")
    assert d.run(QUESTIONS) == {"a": 2, "b": 4}
    assert "Third?" not in out.getvalue()


def test_invalid_answer_is_explained_and_asked_again():
    d, out = dialog("x\n2\n\n1\n")
    assert d.run(QUESTIONS) == {"a": 2, "b": 1}
    text = out.getvalue()
    assert "error: 'x' is not a number\nhint: e.g. 2\nFirst? [1] " in text
    assert "error: '' is not a number" in text           # no default: Enter is not an answer


def test_back_returns_to_the_previous_question():
    d, out = dialog("back\n5\nback\n6\n9\n\n")
    assert d.run(QUESTIONS) == {"a": 6, "b": 9, "c": 3}
    assert "this is the first question" in out.getvalue()


def test_back_skips_questions_that_were_not_asked():
    qs = [QUESTIONS[0], Question("c", "Only for big?", number, when=lambda a: a["a"] > 5),
          QUESTIONS[1]]
    d, out = dialog("1\nback\n8\n3\n4\n")
    assert d.run(qs) == {"a": 8, "c": 3, "b": 4}
    assert out.getvalue().count("Only for big?") == 1     # back from Second went to First


@pytest.mark.parametrize("word", ["cancel", "CANCEL", "q"])
def test_cancel_leaves(word):
    d, _ = dialog(f"1\n{word}\n")
    with pytest.raises(Cancelled):
        d.run(QUESTIONS)


def test_end_of_input_is_a_cancel():
    d, _ = dialog("1\n")
    with pytest.raises(Cancelled):
        d.run(QUESTIONS)


def test_help_is_shown_then_the_question_again():
    d, out = dialog("?\n1\n2\n")
    d.run(QUESTIONS)
    assert "a number\nEnter takes the value" in out.getvalue()
    assert out.getvalue().count("First?") == 2


def test_a_failing_preview_goes_back_one_question():
    calls = []

    def preview(a):
        calls.append(dict(a))
        if a["b"] == 0:
            raise InvalidInput("zero does not fit", hint="try more")
        return f"Preview {a['b']}\nOK?"
    qs = [QUESTIONS[0], QUESTIONS[1], Question("ok", preview, parse_yes, "y", shown="Y/n")]
    d, out = dialog("1\n0\n4\n\n")
    assert d.run(qs) == {"a": 1, "b": 4, "ok": True}
    text = out.getvalue()
    assert "error: zero does not fit\nhint: try more\nSecond? " in text
    assert "Preview 4\nOK? [Y/n] " in text


def test_no_at_the_confirmation_cancels():
    with pytest.raises(Cancelled):
        parse_yes("n")
    with pytest.raises(InvalidInput):
        parse_yes("maybe")
    assert parse_mode("X") == "exclusive" and parse_mode("shared") == "shared"


# ----------------------------------------------------------- refusals

@pytest.mark.parametrize("argv", [["a"], ["--json", "add"], ["a", "--yes"]])
def test_add_needs_a_terminal(tmp_path, argv):
    proc = subprocess.run([sys.executable, "-m", "bk", *argv], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=bk_env(tmp_path), cwd=ROOT, timeout=60)
    assert proc.returncode == 2
    if "--json" in argv:
        doc = json.loads(proc.stdout)
        assert doc["ok"] is False and doc["error"]["code"] == "invalid_input"
        assert "bk N DUR" in doc["error"]["hint"]
    else:
        assert "needs a terminal" in proc.stderr and "bk N DUR" in proc.stderr


def test_add_with_yes_is_refused_even_at_a_terminal(tmp_path):
    t = Pty(["a", "-y"], bk_env(tmp_path))
    try:
        t.expect(r"needs a terminal \(--yes\)")
        assert t.wait() == 2
    finally:
        t.close()


# ----------------------------------------------------------- end to end

@pytest.fixture
def term(tmp_path):
    sessions = []

    def start(*args: str) -> Pty:
        p = Pty(list(args), bk_env(tmp_path))
        sessions.append(p)
        return p
    yield start
    for p in sessions:
        p.close()


def run_bk(tmp_path, *argv) -> dict:
    proc = subprocess.run([sys.executable, "-m", "bk", "--json", *argv], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=bk_env(tmp_path), cwd=ROOT, timeout=60)
    return json.loads(proc.stdout)


def test_guided_add_books_after_back_invalid_and_confirm(term, tmp_path):
    t = term("a")
    t.expect(r"How many GPUs\? \[1\] ")
    t.line("9")
    t.expect(r"error: this server has 4 GPUs")
    t.expect(r"How many GPUs\? \[1\] ")
    t.line("2")
    t.expect(r"Shared or exclusive\? \(s/x\) \[s\] ")
    t.line("x")
    t.expect(r"For how long\? \[1h\] ")
    t.line("back")                                   # change the mode after all
    t.expect(r"Shared or exclusive\? \(s/x\) \[s\] ")
    t.line("s")
    t.expect(r"For how long\? \[1h\] ")
    t.line("7m")
    t.expect(r"error: '7m' is not a whole number of 5-minute slices")
    t.line("1h30m")
    t.expect(r"Memory per GPU\? \(none to skip\) \[none\] ")
    t.line("12g")
    t.expect(r"Start when\? \[now\] ")
    t.line("20:00")
    t.expect(r"Preview: 2 GPUs \(0,1\) shared, 12g per GPU, 07-13 20:00–21:30")
    t.expect(r"Book it\? \[Y/n\] ")
    t.line()
    t.expect(r"booked 2 GPUs \(0,1\) shared 12g 07-13 20:00–21:30")
    t.expect(r"next time: bk 2 1h30m 12g -t 20:00")
    assert t.wait() == 0
    [r] = run_bk(tmp_path, "l")["data"]["reservations"]
    assert (r["gpus"], r["mem_mib"], r["start"], r["end"]) == \
        ([0, 1], 12288, "2026-07-13T20:00:00Z", "2026-07-13T21:30:00Z")


def test_guided_add_cancel_books_nothing(term, tmp_path):
    t = term("add")
    t.expect(r"How many GPUs\? ")
    t.line("1")
    t.expect(r"Shared or exclusive\? ")
    t.line("cancel")
    t.expect(r"cancelled, nothing booked")
    assert t.wait() == 0
    assert run_bk(tmp_path, "l")["data"]["reservations"] == []


def test_guided_add_learns_defaults_and_queues(term, tmp_path):
    for _ in range(2):       # --again: the same booking twice in one instant, on purpose
        assert run_bk(tmp_path, "x", "2", "2h", "--again")["ok"]
    t = term("a")
    t.expect(r"from your last 2 bookings")
    t.expect(r"How many GPUs\? \[2\] ")
    t.line()
    t.expect(r"\(s/x\) \[x\] ")
    t.line()
    t.expect(r"For how long\? \[2h\] ")         # exclusive: no memory question
    t.line()
    t.expect(r"Start when\? \[now\] ")
    t.line()
    # Four GPUs, four held until 12:40: the preview says it will be queued.
    t.expect(r"queued: now is full; the earliest start that fits is 12:40")
    t.expect(r"Book it\? \[Y/n\] ")
    t.line("n")
    t.expect(r"cancelled, nothing booked")
    assert t.wait() == 0


@pytest.mark.slow
def test_guided_edit_of_an_upcoming_booking(term, tmp_path):
    booked = run_bk(tmp_path, "1", "1h", "-t", "15:00")
    assert booked["ok"], booked
    t = term("e", "1")
    t.expect(r"Editing 1 GPU \(0\) shared 07-13 15:00–16:00")
    t.expect(r"Change what\? .*\[duration\] ")
    t.line("s")
    t.expect(r"error: 's' is ambiguous")
    t.line("duration,start")
    t.expect(r"New duration\? \[1h\] ")
    t.line("2h")
    t.expect(r"New start\? \[07-13 15:00\] ")
    t.line("16:00")
    t.expect(r"would update 1 GPU \(0\) shared 07-13 16:00–18:00")
    t.expect(r"Save the change\? \[Y/n\] ")
    t.line("back")
    t.expect(r"New start\? ")
    t.line("17:00")
    t.expect(r"would update 1 GPU \(0\) shared 07-13 17:00–19:00")
    t.line("y")
    t.expect(r"updated 1 GPU \(0\) shared 07-13 17:00–19:00")
    t.expect(r"next time: bk e \w{8} -d 2h -t 17:00")
    assert t.wait() == 0
    [r] = run_bk(tmp_path, "l")["data"]["reservations"]
    assert (r["start"], r["end"]) == ("2026-07-13T17:00:00Z", "2026-07-13T19:00:00Z")


@pytest.mark.slow
def test_guided_edit_of_an_active_booking_moves_only_the_end(term, tmp_path):
    assert run_bk(tmp_path, "1", "30m")["ok"]
    t = term("e", "1")
    t.expect(r"only its end can move")
    t.expect(r"New end\? .*\[\+30m\] ")
    t.line("-15m")
    t.expect(r"would update 1 GPU \(0\) shared 07-13 10:40–10:55")
    t.line("n")
    t.expect(r"cancelled, nothing changed")
    assert t.wait() == 0
    [r] = run_bk(tmp_path, "l")["data"]["reservations"]
    assert r["end"] == "2026-07-13T11:10:00Z"


def test_guided_edit_needs_a_terminal(tmp_path):
    assert run_bk(tmp_path, "1", "30m")["ok"]
    proc = subprocess.run([sys.executable, "-m", "bk", "e", "1"], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=bk_env(tmp_path), cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and "hint:" in proc.stderr


def test_add_in_process_requires_memory_when_the_policy_does(tmp_path, monkeypatch):
    from bk import clock
    from bk.cli import guided
    from bk.cli.app import Context

    monkeypatch.setenv("BK_NOW", _helpers.NOW)
    monkeypatch.setenv("TZ", "UTC")
    clock.local_tz.cache_clear()
    monkeypatch.setattr(guided, "require_terminal", lambda *a: None)
    env = bk_env(tmp_path)
    cfg = tmp_path / "cfg" / "bk"
    cfg.mkdir(parents=True)
    (cfg / "config.json").write_text('{"require_shared_memory": true}')
    ctx = Context(env=env, json=False, argv=["a"], stdin_tty=True)
    d, out = dialog("1\ns\n1h\n\n8g\n+1h\ny\n")
    result = guided.run_add(None, ctx, dialog=d)
    clock.local_tz.cache_clear()
    text = out.getvalue()
    assert "Memory per GPU? (required here) " in text
    assert "error: this server needs the memory per GPU" in text
    r = result.data["reservation"]
    assert (r["mem_mib"], r["start"]) == (8192, "2026-07-13T11:40:00Z")
    assert "next time: bk 1 1h 8g -t +1h" in result.human(ctx.term)


# ------------------------------------------- refusals at the preview or the write

def test_a_failing_preview_returns_to_the_question_it_blames():
    def preview(a):
        if a["a"] == 0:
            raise InvalidInput("a zero first answer does not fit")
        return "OK?"
    qs = [QUESTIONS[0], QUESTIONS[1],
          Question("ok", preview, parse_yes, "y", blame=lambda a, err: "a")]
    d, out = dialog("0\n4\n3\n\n")            # a=0 fails the preview: First? again, Second kept
    assert d.run(qs) == {"a": 3, "b": 4, "ok": True}
    assert "error: a zero first answer does not fit\nFirst? [1] OK? [y] " in out.getvalue()


def test_a_refused_write_asks_the_blamed_question_again_keeping_the_rest():
    from bk.core.errors import Conflict

    tried = []

    def submit(a):
        tried.append(dict(a))
        if len(tried) == 1:
            raise Conflict("taken meanwhile", hint="pick another")
        return "done"
    qs = [QUESTIONS[0], QUESTIONS[1],
          Question("ok", "OK?", parse_yes, "y", blame=lambda a, err: "a")]
    d, out = dialog("1\n2\ny\n5\ny\n")
    assert d.converse(qs, submit) == "done"
    assert tried[1] == {"a": 5, "b": 2, "ok": True}
    assert "error: taken meanwhile\nhint: pick another\nFirst? [1] " in out.getvalue()
    assert out.getvalue().count("Second?") == 1


def test_a_refused_write_without_blame_asks_the_last_answer_again():
    from bk.core.errors import PolicyRefused

    def submit(a):
        if a["b"] == 2:
            raise PolicyRefused("two is not allowed")
        return a["b"]
    qs = [QUESTIONS[0], QUESTIONS[1], Question("ok", "OK?", parse_yes, "y")]
    d, out = dialog("1\n2\ny\n4\ny\n")
    assert d.converse(qs, submit) == 4
    assert "error: two is not allowed\nSecond? " in out.getvalue()


def test_a_write_failing_for_another_reason_ends_the_dialog():
    from bk.core.errors import Busy

    def submit(a):
        raise Busy("the ledger is busy")
    d, out = dialog("1\n2\ny\n")
    with pytest.raises(Busy):
        d.converse([QUESTIONS[0], QUESTIONS[1], Question("ok", "OK?", parse_yes, "y")], submit)


@pytest.fixture
def inproc(tmp_path, monkeypatch):
    """Run a guided flow in this process against a data directory that other
    (real) bk processes also write; ``ask`` may book from one of them."""
    from bk import clock
    from bk.cli import guided

    env = bk_env(tmp_path)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    clock.local_tz.cache_clear()
    monkeypatch.setattr(guided, "require_terminal", lambda *a: None)
    yield env
    clock.local_tz.cache_clear()


def _scripted(answers: list, out: io.StringIO) -> Dialog:
    """A dialog whose answers are strings or callables run at that prompt."""
    feed = iter(answers)

    def ask(prompt: str) -> str:
        out.write(prompt)
        nxt = next(feed, None)
        if nxt is None:
            raise EOFError
        if callable(nxt):
            nxt = nxt(prompt)
        out.write(nxt + "\n")
        return nxt

    return Dialog(ask, lambda text: out.write(text + "\n"))


def _edit(env, ref: str, answers: list):
    import argparse

    from bk.cli import guided
    from bk.cli.app import Context

    ctx = Context(env=env, json=False, argv=["e", ref], stdin_tty=True)
    out = io.StringIO()
    result = guided.edit_flow(argparse.Namespace(ref=ref, yes=False), ctx,
                              dialog=_scripted(answers, out))
    return result, out.getvalue(), ctx


@pytest.mark.slow
def test_guided_edit_goes_back_to_the_field_that_collides(inproc, tmp_path):
    assert run_bk(tmp_path, "x", "4", "1h", "-t", "13:00")["ok"]
    rid = run_bk(tmp_path, "1", "1h", "-t", "11:00")["data"]["reservation"]["id"][:8]
    # Start 11:30 is fine; 3h from it hits the exclusive booking at 13:00.
    result, text, ctx = _edit(inproc, rid, ["duration,start", "3h", "11:30", "1h", "y"])
    assert "error: 1 GPU (shared, 1 slot) for 3h not free" in text
    after = text.split("for 3h not free", 1)[1]
    assert after.index("New duration? [1h] ") < after.index("would update")
    assert "New start?" not in after                      # the start answer was kept
    assert result.data["status"] == "updated"
    [r] = [r for r in run_bk(tmp_path, "l")["data"]["reservations"] if r["id"].startswith(rid)]
    assert (r["start"], r["end"]) == ("2026-07-13T11:30:00Z", "2026-07-13T12:30:00Z")


@pytest.mark.slow
def test_guided_edit_asks_again_when_the_time_is_taken_before_the_save(inproc, tmp_path):
    rid = run_bk(tmp_path, "1", "1h", "-t", "15:00")["data"]["reservation"]["id"][:8]

    def someone_books_it(prompt: str) -> str:
        # Between the preview and the "y", another process takes 16:00-17:00.
        assert "Save the change?" in prompt
        assert run_bk(tmp_path, "x", "4", "1h", "-t", "16:00")["ok"]
        return "y"
    result, text, ctx = _edit(inproc, rid, ["start", "16:00", someone_books_it, "18:00", "y"])
    assert "would update 1 GPU (0) shared 07-13 16:00–17:00" in text
    refused = text.split("Save the change? [Y/n] y\n", 1)[1]
    assert refused.startswith("error: ") and "not free" in refused.splitlines()[0]
    assert "\nNew start? [07-13 15:00] 18:00\n" in refused
    assert result.data["status"] == "updated"
    assert "next time: bk e" in result.human(ctx.term) and "-t 18:00" in result.human(ctx.term)
    [r] = [r for r in run_bk(tmp_path, "l")["data"]["reservations"] if r["id"].startswith(rid)]
    assert (r["start"], r["end"]) == ("2026-07-13T18:00:00Z", "2026-07-13T19:00:00Z")


def test_guided_add_asks_the_start_again_when_it_is_taken_before_the_confirmation(inproc, tmp_path):
    from bk.cli import guided
    from bk.cli.app import Context

    def someone_books_it(prompt: str) -> str:
        assert "Book it?" in prompt
        assert run_bk(tmp_path, "x", "4", "2h", "-t", "20:00")["ok"]
        return "y"
    out = io.StringIO()
    ctx = Context(env=inproc, json=False, argv=["a"], stdin_tty=True)
    d = _scripted(["1", "x", "1h", "20:00", someone_books_it, "22:00", "y"], out)
    result = guided.run_add(None, ctx, dialog=d)
    text = out.getvalue()
    refused = text.split("Book it? [Y/n] y\n", 1)[1]
    assert refused.startswith("error: ") and "Start when? [now] 22:00\n" in refused
    assert "How many GPUs?" not in refused                 # the other answers were kept
    r = result.data["reservation"]
    assert (r["gpus"], r["start"], r["end"]) == ([0], "2026-07-13T22:00:00Z", "2026-07-13T23:00:00Z")
