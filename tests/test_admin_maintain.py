"""``bk admin maintain`` and ``bk admin notice`` through the built archive:
privately (root owns the data), and on a shared server through a real
broker with real users, including the refusals."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from helpers_admin import as_nobody, private
from helpers_broker import needs_root, site


@pytest.fixture
def bk(pyz):
    yield from private(pyz)


@pytest.mark.slow
def test_a_window_lists_the_bookings_in_it_and_the_administrator_must_choose(bk):
    inside = bk.book("2", "3h", "-t", "12:00")
    outside = bk.book("1", "30m")
    env = bk.json("admin", "maintain", "--reason", "driver update", "-t", "13:00", "-d", "2h", "--yes", code=2)
    assert inside["short_id"] in env["error"]["message"] and outside["short_id"] not in env["error"]["message"]
    assert "--keep" in env["error"]["hint"]
    assert not bk.ledger()["blackouts"]                        # nothing was written

    before = bk.digest()
    dry = bk.data_of("admin", "maintain", "--reason", "driver update", "-t", "13:00", "-d", "2h", "--keep",
                     "--dry-run")
    assert dry["status"] == "dry_run" and [r["id"] for r in dry["overlapping"]] == [inside["id"]]
    assert bk.digest() == before

    got = bk.data_of("admin", "maintain", "--reason", "driver update", "-t", "13:00", "-d", "2h", "--keep", "--yes")
    assert got["status"] == "created" and got["cancelled"] == []
    assert got["blackout"]["start"] == "2026-07-13T13:00:00Z" and got["blackout"]["end"] == "2026-07-13T15:00:00Z"
    assert got["notice"]["level"] == "warning" and got["notice"]["until"] == "2026-07-13T15:00:00Z"
    # The kept booking runs on; a new one in the window is refused by the blackout.
    assert [r["id"] for r in bk.data_of("l")["reservations"]] == [outside["id"], inside["id"]]
    refused = bk.json("1", "1h", "-t", "13:30", code=3)
    assert refused["error"]["details"]["rule"] == "blackout"
    assert "driver update" in bk.run("n").stdout
    audit = [json.loads(x) for x in (bk.data / "audit.jsonl").read_text().splitlines()]
    add = [e for e in audit if e["action"] == "blackout_add"]
    assert add and add[0]["after"]["kept"] == [inside["id"]] and add[0]["uid"] == 0


def test_a_kept_booking_may_be_shortened_or_noted_inside_its_window(bk):
    """Issue 30 item 8: a booking kept in a window could get neither a note
    nor a shorter time (refused by the window it was kept in), and the hint
    offered --queue, which would move it."""
    kept = bk.book("1", "3h", "-t", "12:00")
    bk.data_of("admin", "maintain", "--reason", "driver update", "-t", "13:00", "-d", "1h", "--keep", "--yes")
    noted = bk.data_of("e", kept["short_id"], "--note", "checkpointing at 13:00")
    assert noted["status"] == "updated" and noted["reservation"]["note"] == "checkpointing at 13:00"
    short = bk.data_of("e", kept["short_id"], "-d", "1h30m")["reservation"]
    assert (short["start"], short["end"], short["gpus"]) == ("2026-07-13T12:00:00Z", "2026-07-13T13:30:00Z", [0])
    later = bk.data_of("e", kept["short_id"], "-t", "12:30", "-d", "1h")["reservation"]
    assert (later["start"], later["end"]) == ("2026-07-13T12:30:00Z", "2026-07-13T13:30:00Z")
    # More time in the window is still refused, and the hint says what may change in place.
    env = bk.json("e", kept["short_id"], "-d", "2h", code=3)
    assert env["error"]["details"]["rule"] == "blackout"
    assert "shortened or given a note" in env["error"]["hint"] and "moves it" in env["error"]["hint"]
    assert "13:00" in env["error"]["message"] and "T13:00" not in env["error"]["message"]   # local time, for people
    (r,) = bk.data_of("l")["reservations"]
    assert (r["start"], r["end"], r["note"]) == ("2026-07-13T12:30:00Z", "2026-07-13T13:30:00Z",
                                                 "checkpointing at 13:00")


@pytest.mark.slow
def test_cancel_overlapping_cancels_them_and_ending_the_window_reopens_it(bk):
    inside = bk.book("1", "1h", "-t", "13:30")
    got = bk.data_of("admin", "maintain", "--reason", "reboot", "-t", "13:00", "-d", "1h",
                     "--cancel-overlapping", "--level", "critical", "--yes")
    assert got["cancelled"] == [inside["id"]]
    assert bk.data_of("l")["reservations"] == []
    listed = bk.data_of("admin", "maintain", "list")["windows"]
    assert [w["id"] for w in listed] == [got["blackout"]["id"]]
    ended = bk.data_of("admin", "maintain", "end", got["blackout"]["short_id"])
    assert ended["status"] == "ended" and ended["notice"]["archived"]
    assert bk.data_of("admin", "maintain", "list")["windows"] == []
    assert not bk.ledger()["blackouts"]                 # not begun: withdrawn (the audit log keeps it)
    bk.book("1", "1h", "-t", "13:30")                   # the time is bookable again
    notices = bk.data_of("admin", "notice", "list")["notices"]
    mine = [n for n in notices if n["id"] == got["notice"]["id"]]
    assert mine[0]["state"] == "archived" and mine[0]["archived_by"] == 0 and mine[0]["archived_at"]


@pytest.mark.slow
def test_a_running_window_ended_early_keeps_its_past(bk):
    got = bk.data_of("admin", "maintain", "--reason", "now", "-d", "2h", "--yes")
    assert got["blackout"]["start"] == "2026-07-13T10:40:00Z"
    bk.data_of("admin", "maintain", "end", got["blackout"]["id"][:6], now="2026-07-13T11:02:00Z")
    (b,) = bk.ledger()["blackouts"]
    assert (b["start"], b["end"]) == ("2026-07-13T10:40:00Z", "2026-07-13T11:05:00Z")
    bk.book("1", "30m", "-t", "11:05", now="2026-07-13T11:02:00Z")


@pytest.mark.slow
def test_no_block_announces_only(bk):
    got = bk.data_of("admin", "maintain", "--reason", "network work, expect hiccups", "-t", "14:00",
                     "-d", "1h", "--no-block", "--yes", "--level", "info")
    assert got["blackout"] is None and got["notice"]["level"] == "info"
    bk.book("1", "30m", "-t", "14:15")
    assert not bk.ledger()["blackouts"]


def test_without_yes_and_no_terminal_it_asks_for_yes(bk):
    env = bk.json("admin", "maintain", "--reason", "x", code=2)
    assert "--yes" in env["error"]["message"]


def test_a_past_until_is_refused_as_until_not_as_a_start(bk):
    """Issue 30 item 13: `--until=-1h` was refused as "start '-1h' is in the
    past", an option nobody typed; `--until -1h` was "expected one argument"."""
    pub = bk.data_of("admin", "notice", "publish", "Reboot at 18:00", "--until", "18:30")
    for argv in (["admin", "notice", "publish", "x"], ["admin", "notice", "edit", pub["notice"]["id"][:8]]):
        for until in (["--until=-1h"], ["--until", "-1h"], ["--until", "today 09:00"]):
            env = bk.json(*argv, *until, code=2)
            message = env["error"]["message"]
            assert message.startswith("--until ") and "start" not in message, (argv, until, message)
            assert "past" in message or "not in the future" in message, message
        env = bk.json(*argv, "--until", "soonish", code=2)
        assert env["error"]["message"].startswith("--until: cannot read 'soonish'"), env


@pytest.mark.slow
def test_notice_start_list_and_edit_keep_the_original_in_the_audit_trail(bk):
    pub = bk.data_of("admin", "notice", "publish", "Reboot at 18:00", "--start", "17:00", "--until", "18:30",
                     "--level", "warning")
    nid = pub["notice"]["id"]
    assert bk.data_of("n")["notices"] == []                          # not yet
    later = bk.data_of("n", now="2026-07-13T17:01:00Z")["notices"]
    assert [n["id"] for n in later] == [nid]
    listed = {n["id"]: n for n in bk.data_of("admin", "notice", "list")["notices"]}
    assert listed[nid]["state"] == "scheduled"

    before = bk.digest()
    dry = bk.data_of("admin", "notice", "edit", nid[:8], "--text", "Reboot moved to 19:00", "--dry-run")
    assert dry["status"] == "dry_run" and bk.digest() == before
    ed = bk.data_of("admin", "notice", "edit", nid[:8], "--text", "Reboot moved to 19:00", "--until", "19:30",
                    "--level", "critical")
    assert ed["status"] == "edited" and ed["before"]["text"] == "Reboot at 18:00"
    assert ed["notice"]["text"] == "Reboot moved to 19:00" and ed["notice"]["until"] == "2026-07-13T19:30:00Z"
    lg = bk.data_of("lg", "--all", "-n", "20")["entries"]
    edit = [e for e in lg if e["action"] == "notice_edit"]
    assert edit[0]["before"]["text"] == "Reboot at 18:00" and edit[0]["after"]["level"] == "critical"
    env = bk.json("admin", "notice", "edit", nid[:8], code=2)            # nothing to change
    assert "nothing to change" in env["error"]["message"]
    bk.data_of("admin", "notice", "archive", nid[:8])
    env = bk.json("admin", "notice", "edit", nid[:8], "--text", "again", code=2)
    assert "archived" in env["error"]["message"]
    (n,) = [n for n in bk.ledger()["notices"] if n["id"] == nid]      # never deleted
    assert n["archived"] and n["archived_by"] == 0 and len(n["edits"]) == 1


def test_notice_without_action_outside_a_terminal_names_the_actions(bk):
    env = bk.json("admin", "notice", code=2)
    assert "publish|list|edit|archive" in env["error"]["hint"]


@needs_root
@pytest.mark.root
@pytest.mark.parametrize("argv", [["admin", "maintain", "--reason", "x", "--yes"], ["admin", "maintain", "list"],
                                  ["admin", "notice", "list"], ["admin", "notice", "edit", "abcd", "--text", "x"]],
                         ids=" ".join)
def test_non_root_is_refused_with_a_hint(pyz, argv):
    p = as_nobody(pyz, *argv)
    assert p.returncode == 5, (p.stdout, p.stderr)
    err = json.loads(p.stdout)["error"]
    assert err["code"] == "permission_denied" and err["hint"].startswith("sudo bk admin")


# ------------------------------------------------------------- shared server

@pytest.fixture(scope="module")
def srv():
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root and useradd (real accounts)")
    with site() as s:
        s.users = (s.accounts.user(), s.accounts.user())
        p = s.init()
        assert p.returncode == 0, p.stderr
        s.start_broker()
        yield s


@pytest.mark.slow
@needs_root
@pytest.mark.root
def test_through_the_broker_root_opens_a_window_and_owners_are_told(srv):
    ada, bob = srv.users
    rc, env = srv.run_json(ada, "1", "1h", "-t", "+2h")
    assert rc == 0, env
    booked = env["data"]["reservation"]
    # Users may not open windows, neither through the command nor the row itself.
    rc, env = srv.run_json(bob, "admin", "maintain", "--reason", "x", "--yes")
    assert rc == 5 and env["error"]["code"] == "permission_denied"
    rc, env = srv.run_json(None, "admin", "maintain", "--reason", "PSU swap", "-t", "+1h", "-d", "3h",
                           "--cancel-overlapping", "--yes")
    assert rc == 0, env
    assert env["data"]["cancelled"] == [booked["id"]]
    rc, env = srv.run_json(ada, "n")
    texts = [n["text"] for n in env["data"]["notices"]]
    assert any("cancelled by the administrator: PSU swap" in t for t in texts), texts
    assert "PSU swap" in texts
    rc, env = srv.run_json(bob, "1", "30m", "-t", "+90m")
    assert rc == 3 and env["error"]["details"]["rule"] == "blackout"
    wid = srv.ledger().state.blackouts[0].id
    rc, env = srv.run_json(bob, "admin", "maintain", "end", wid[:8])
    assert rc == 5
    rc, env = srv.run_json(None, "admin", "maintain", "end", wid[:8])
    assert rc == 0 and env["data"]["status"] == "ended", env
    rc, env = srv.run_json(bob, "1", "30m", "-t", "+90m")
    assert rc == 0, env


@pytest.mark.slow
@needs_root
@pytest.mark.root
def test_through_the_broker_notice_edit_is_admin_only(srv):
    _, bob = srv.users
    rc, env = srv.run_json(None, "admin", "notice", "publish", "Quota talk at 3", "--level", "info")
    assert rc == 0, env
    nid = env["data"]["notice"]["id"]
    rc, env = srv.run_json(None, "admin", "notice", "edit", nid[:8], "--text", "Quota talk at 4")
    assert rc == 0 and env["data"]["before"]["text"] == "Quota talk at 3", env
    rc, env = srv.run_json(bob, "n")
    assert "Quota talk at 4" in [n["text"] for n in env["data"]["notices"]]


# ------------------------------------------------------------- guided, in process

@pytest.fixture
def inproc(monkeypatch, capsys):
    from helpers_cli import bk_fixture

    yield from bk_fixture(monkeypatch, capsys)


def _guided(inproc, answers: list[str], *argv: str) -> tuple[int, str]:
    from helpers_cli import ROOT as ROOT_ACTOR

    from bk.cli import app as cli_app
    from bk.service import open_app

    it = iter(answers)
    inproc.mp.setattr(cli_app, "_stdin_is_tty", lambda: True)
    inproc.mp.setattr("builtins.input", lambda *a: next(it))
    inproc.capsys.readouterr()
    code = cli_app.run(list(argv), dict(os.environ), opener=lambda env: open_app(env, actor=ROOT_ACTOR))
    out, err = inproc.capsys.readouterr()
    assert next(it, None) is None, "not every answer was asked for"
    return code, out + err


def test_guided_maintain_asks_one_question_at_a_time_with_the_defaults(inproc):
    bob = inproc.service()
    from bk.service.requests import BookRequest

    booked = bob.run("book", BookRequest(1, 3600, start=inproc_start("11:30"))).reservation
    # reason, start (Enter: now), length, level (Enter: warning), block (Enter: yes),
    # cancel the overlapping booking? (y), confirm (y)
    code, out = _guided(inproc, ["firmware update", "11:00", "2h", "", "", "y", "y"], "admin", "maintain")
    assert code == 0, out
    assert booked.short_id in out and "cancelled" in out
    state = inproc.service().ledger()
    (b,) = state.blackouts
    assert b.reason == "firmware update" and b.end - b.start == 7200
    assert state.find(booked.id).cancelled_at is not None


def test_guided_notice_publishes_after_the_review(inproc):
    code, out = _guided(inproc, ["Cluster picnic on Friday", "info", "never", "y"], "admin", "notice")
    assert code == 0, out
    (n,) = inproc.service().ledger().notices
    assert n.text == "Cluster picnic on Friday" and n.until is None
    code, out = _guided(inproc, ["Other news", "cancel"], "admin", "notice")
    assert code == 2 and len(inproc.service().ledger().notices) == 1


def inproc_start(hhmm: str) -> int:
    from helpers_cli import NOW

    h, m = map(int, hhmm.split(":"))
    return NOW - NOW % 86400 + h * 3600 + m * 60


RAW_CALL = """
import json, sys
sys.path.insert(0, sys.argv[1])
from bk.core.errors import BkError
from bk.ipc.client import BrokerClient
try:
    BrokerClient(sys.argv[2], service_uid=int(sys.argv[3])).call(sys.argv[4], json.loads(sys.argv[5]))
    print("accepted")
except BkError as e:
    print(e.code)
"""


@pytest.mark.slow
@needs_root
@pytest.mark.root
@pytest.mark.parametrize("op,fields", [
    ("blackout_add", {"start": 1, "end": 2**31, "reason": "mine now", "overlapping": "keep"}),
    ("blackout_end", {"ref": "abcd"}),
    ("notice_edit", {"ref": "abcd", "text": "x"}),
    ("policy_bind", {"gpu_count": 4, "slot_minutes": 5, "max_shared_users": 2, "shared_memory_reserve_mb": 0,
                     "require_shared_memory": False}),
], ids=lambda v: v if isinstance(v, str) else "")
def test_the_broker_refuses_the_admin_rows_to_a_user_who_skips_the_command(srv, op, fields):
    import subprocess

    from helpers_broker import SYSTEM_PYTHON

    _, bob = srv.users
    rc, env = srv.run_json(bob, "1", "30m", "--again")         # so that there is a ledger to compare
    assert rc == 0, env
    before = srv.ledger_digest()
    p = subprocess.run([SYSTEM_PYTHON, "-c", RAW_CALL, str(srv.pyz), str(srv.socket), str(srv.service.uid), op,
                        json.dumps(fields)], capture_output=True, text=True, timeout=60, env=srv.env(bob),
                       cwd=srv.base, **srv.popen_args(bob))
    assert p.stdout.strip() == "permission_denied", (p.stdout, p.stderr)
    assert srv.ledger_digest() == before
