"""One behaviour for retries and repeats.

* ``--op-id`` is looked up before a list number or an ID prefix is resolved:
  ``bk d 1 --op-id K`` and ``bk e 1 ... --op-id K`` run twice answer
  ``exists`` the second time, naming the booking the first run changed,
  even though "1" names another booking by then (private mode, through a
  real broker, and through the built archive).
* The same booking typed again within ``booking.REPEAT_WINDOW`` answers
  ``exists`` with the first booking and a hint naming ``--again``;
  ``--again``, a later time, a different request, another user, an
  ``--op-id`` and ``--dry-run`` book (or show) as before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers_cli import BOB, ME, NOW, bk_fixture

from bk.cli import app as cli_app
from bk.core.models import iso
from bk.service import booking
from bk.service.requests import BookRequest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bk(monkeypatch, capsys):
    yield from bk_fixture(monkeypatch, capsys)


def later(seconds: int) -> str:
    return iso(NOW + seconds)


def live(bk) -> list[dict]:
    return bk.data("l")["reservations"]


# ------------------------------------------------------- op-id retries

def test_cancel_retried_by_list_number_answers_exists_and_cancels_nothing_more(bk):
    a = bk.data("1", "30m")["reservation"]["id"]
    b = bk.data("1", "1h")["reservation"]["id"]
    c = bk.data("1", "2h")["reservation"]["id"]
    first = bk.data("d", "1", "--op-id", "K", "-y")
    assert first["status"] == "cancelled" and first["reservation"]["id"] == a
    # "1" now names b; the op-id names a.
    again = bk.data("d", "1", "--op-id", "K", "-y")
    assert again["status"] == "exists" and again["reservation"]["id"] == a
    assert [r["id"] for r in live(bk)] == [b, c]
    human = bk.ok("d", "1", "--op-id", "K", "-y")
    assert human.out.startswith("already cancelled (same --op-id)") and a[:8] in human.out


def test_edit_retried_by_list_number_answers_exists_and_changes_nothing_more(bk):
    a = bk.data("1", "30m", "-t", "11:00")["reservation"]["id"]
    b = bk.data("1", "1h", "-t", "12:00")["reservation"]["id"]
    # Booking 1 (upcoming) moves after booking 2: "1" names b afterwards.
    first = bk.data("e", "1", "-t", "15:00", "--op-id", "E")
    assert first["status"] == "updated" and first["reservation"]["id"] == a
    assert [r["id"] for r in live(bk)] == [b, a]
    again = bk.data("e", "1", "-t", "15:00", "--op-id", "E")
    assert again["status"] == "exists" and again["reservation"]["id"] == a
    rows = {r["id"]: r for r in live(bk)}
    assert rows[a]["start"] == "2026-07-13T15:00:00Z" and rows[b]["start"] == "2026-07-13T12:00:00Z"


def test_relative_edit_retried_is_the_same_request_not_a_second_extension(bk):
    # -d +30m is worked out from the booking's end: the retry must be worked
    # out from the end the first run found, or it would be "a different request".
    a = bk.data("1", "30m")["reservation"]
    first = bk.data("e", "1", "-d", "+30m", "--op-id", "X")
    assert first["status"] == "updated" and first["reservation"]["end"] == "2026-07-13T11:40:00Z"
    again = bk.data("e", "1", "-d", "+30m", "--op-id", "X")
    assert again["status"] == "exists" and again["reservation"]["id"] == a["id"]
    assert live(bk)[0]["end"] == "2026-07-13T11:40:00Z"
    # A later edit of the same booking does not make the old key mean something else.
    bk.data("e", "1", "-d", "+5m")
    assert bk.data("e", "1", "-d", "+30m", "--op-id", "X")["status"] == "exists"
    assert live(bk)[0]["end"] == "2026-07-13T11:45:00Z"


def test_the_same_op_id_for_another_change_is_still_refused(bk):
    bk.data("1", "30m")
    bk.data("1", "1h")
    bk.data("e", "1", "-d", "+30m", "--op-id", "X")
    other = bk.json("e", "1", "-d", "+1h", "--op-id", "X")
    assert other.code == 2 and "different request" in other.error["message"]
    cancel = bk.json("d", "1", "--op-id", "X", "-y")
    assert cancel.code == 2 and "different request" in cancel.error["message"]
    assert len(live(bk)) == 2


def _by_op_id(app, op_id, action):
    """The booking the resolve row names by ``op_id`` alone (``----``: an
    ID prefix no booking has, so nothing else can be named)."""
    from bk.core.errors import NotFound
    from bk.service import ResolveRequest

    try:
        got = app.run("resolve", ResolveRequest("----", op_id, action))
    except NotFound:
        return None
    return got.reservation if got.by_op_id else None


def test_op_reservation_is_none_for_new_keys_and_other_users(bk):
    app = bk.service(BOB)
    made = app.run("book", BookRequest(count=1, duration=1800, op_id="B"))
    assert _by_op_id(app, "B", "book").id == made.reservation.id
    assert _by_op_id(app, "B", "cancel") is None          # another action: the apply refuses it
    assert _by_op_id(app, "new", "cancel") is None
    assert _by_op_id(app, None, "cancel") is None
    assert _by_op_id(bk.service(ME), "B", "book") is None    # ada's keys are not bob's


# ------------------------------------------------------------- repeats

def test_the_same_booking_again_answers_exists_with_a_hint(bk):
    first = bk.data("1", "30m")["reservation"]["id"]
    r = bk.json("1", "30m")
    assert r.code == 0
    env = r.envelope
    assert env["data"]["status"] == "exists" and env["data"]["reservation"]["id"] == first
    assert env["data"]["placement"] == {"repeat_of": first}
    assert any("--again" in w and first[:8] in w for w in env["warnings"])
    human = bk("1", "30m")
    assert human.code == 0 and "--again" in human.err and first[:8] in human.out
    assert "already booked (the same booking, made moments ago)" in human.out and "--op-id" not in human.out
    assert len(live(bk)) == 1


def test_again_books_a_second_one(bk):
    bk.data("1", "30m")
    second = bk.data("1", "30m", "--again")
    assert second["status"] == "created"
    assert len(live(bk)) == 2


def test_a_repeat_that_would_land_on_another_gpu_is_still_a_repeat(bk):
    first = bk.data("x", "1", "30m")["reservation"]
    assert first["gpus"] == [0]
    # GPU 0 is taken now, so a second one would go to GPU 1: the same booking all the same.
    assert bk.data("x", "1", "30m")["status"] == "exists"
    assert bk.data("x", "1", "30m", "--again")["reservation"]["gpus"] == [1]


def test_a_bare_booking_a_slice_later_is_still_a_repeat(bk):
    first = bk.data("1", "30m")["reservation"]["id"]         # 10:41:30, slice 10:40
    bk.mp.setenv("BK_NOW", later(4 * 60))                    # 10:45:30: slice 10:45
    r = bk.data("1", "30m")
    assert r["status"] == "exists" and r["reservation"]["id"] == first


def test_after_the_window_the_same_booking_books_normally(bk):
    bk.data("1", "30m")
    bk.mp.setenv("BK_NOW", later(booking.REPEAT_WINDOW + 60))
    r = bk.data("1", "30m")
    assert r["status"] == "created"
    assert len(live(bk)) == 2


@pytest.mark.parametrize("argv", [
    ("1", "1h"), ("1", "30m", "12g"), ("2", "30m"), ("x", "1", "30m"), ("1", "30m", "-s", "2"),
    ("1", "30m", "-t", "12:00"), ("1", "30m", "-g", "1"), ("1", "30m", "-e", "0"),
    ("1", "30m", "--op-id", "script-1"), ("1", "30m", "-g", "0", "--note", "the other job"),
])
def test_a_different_request_books_normally(bk, argv):
    first = bk.data("1", "30m", "-g", "0")["reservation"]["id"]
    r = bk.data(*argv)
    assert r["status"] in ("created", "queued") and r["reservation"]["id"] != first


def test_a_booking_made_with_an_op_id_is_not_repeated_by_hand(bk):
    # Scripts' bookings follow the op-id rules alone, as requests and as the earlier booking.
    bk.data("1", "30m", "--op-id", "job-1")
    assert bk.data("1", "30m")["status"] == "created"
    assert bk.data("1", "30m", "--op-id", "job-2")["status"] == "created"
    assert len(live(bk)) == 3


def test_another_users_identical_booking_is_not_a_repeat(bk):
    bk.service(BOB).run("book", BookRequest(count=1, duration=1800))
    assert bk.data("1", "30m")["status"] == "created"


def test_dry_runs_are_unaffected(bk):
    bk.data("1", "30m")
    dry = bk.data("1", "30m", "--dry-run")
    assert dry["status"] == "created" and dry["dry_run"] is True
    # and a dry run leaves nothing a later booking could repeat
    bk2 = bk.data("1", "1h", "--dry-run")
    assert bk2["dry_run"] is True
    assert bk.data("1", "1h")["status"] == "created"


def test_a_cancelled_booking_is_not_repeated(bk):
    bk.data("1", "30m")
    bk.data("d", "1", "-y")
    assert bk.data("1", "30m")["status"] == "created"


def test_repeat_window_is_the_one_bk1_states():
    from bk.cli import cmd_book

    assert cmd_book.REPEAT_MINUTES * 60 == booking.REPEAT_WINDOW
    man = (ROOT / "man" / "bk.1").read_text()
    assert r"\-\-again" in man and f"within {cmd_book.REPEAT_MINUTES} minutes" in man


def test_again_travels_in_the_request_spec():
    from bk.service import ops

    op = ops.get("book")
    assert op.encode(BookRequest(count=1, duration=60, again=True)) == {"count": 1, "duration": 60, "again": True}
    assert op.decode({"count": 1, "duration": 60, "again": True}).again is True
    # the op-id digest ignores it, so keys recorded before it existed still match
    from bk.service.requests import canonical

    assert canonical("create", BookRequest(1, 60)) == canonical("create", BookRequest(1, 60, again=True))


# ------------------------------------------------------ through a broker

@pytest.fixture
def base():
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="bkr", dir="/tmp")       # AF_UNIX names: 107 bytes at most
    os.chmod(d, 0o755)
    os.mkdir(os.path.join(d, "data"), 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def through(r, capsys, *argv: str) -> dict:
    """``bk --json ARGV`` in this process, its writes through the broker ``r``."""
    capsys.readouterr()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BK_")}
    env["TZ"] = "UTC"
    code = cli_app.run([*argv, "--json"], env, opener=lambda env: r.remote())
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ok"], out
    return out


def test_retries_and_repeats_through_a_real_broker(base, capsys, monkeypatch):
    from test_broker_server import Running

    monkeypatch.setattr(cli_app, "_stdin_is_tty", lambda: False)
    with Running(base) as r:
        a = through(r, capsys, "1", "30m")["data"]["reservation"]["id"]
        rep = through(r, capsys, "1", "30m")
        assert rep["data"]["status"] == "exists" and rep["data"]["reservation"]["id"] == a
        assert any("--again" in w for w in rep["warnings"])
        b = through(r, capsys, "1", "30m", "--again")["data"]["reservation"]["id"]
        assert b != a
        c = through(r, capsys, "1", "1h")["data"]["reservation"]["id"]

        edited = through(r, capsys, "e", "1", "-d", "+30m", "--op-id", "E")["data"]
        assert edited["status"] == "updated" and edited["reservation"]["id"] == a
        # a now ends after b: "1" names b
        assert through(r, capsys, "e", "1", "-d", "+30m", "--op-id", "E")["data"]["status"] == "exists"

        gone = through(r, capsys, "d", "1", "--op-id", "K", "-y")["data"]
        assert gone["status"] == "cancelled"
        retry = through(r, capsys, "d", "1", "--op-id", "K", "-y")["data"]
        assert retry["status"] == "exists" and retry["reservation"]["id"] == gone["reservation"]["id"]
        left = [x.id for x in r.service.ledger().reservations if x.cancelled_at is None]
        assert len(left) == 2 and gone["reservation"]["id"] not in left and c in left


# ------------------------------------------------- through the archive

@pytest.mark.slow
def test_retries_and_repeats_through_the_built_archive(pyz, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update(BK_DATA_DIR=str(tmp_path / "data"), BK_GPU_COUNT="4", BK_NOW="2026-07-13T10:41:30Z",
               TZ="UTC", HOME=str(tmp_path), NO_COLOR="1")
    for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_STATE_HOME", "state"), ("XDG_DATA_HOME", "share"),
                     ("XDG_CACHE_HOME", "cache")):
        env[var] = str(tmp_path / sub)

    def bk(*argv):
        p = subprocess.run([sys.executable, str(pyz), "--json", *argv], env=env, capture_output=True,
                           text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert p.returncode == 0 and "Traceback" not in p.stderr, (argv, p.stdout, p.stderr)
        return json.loads(p.stdout)

    a = bk("1", "30m")["data"]["reservation"]["id"]
    rep = bk("1", "30m")
    assert rep["data"]["status"] == "exists" and rep["data"]["reservation"]["id"] == a
    assert any("--again" in w for w in rep["warnings"])
    assert bk("1", "30m", "--again")["data"]["status"] == "created"
    assert bk("d", "1", "--op-id", "K", "-y")["data"]["reservation"]["id"] == a
    retry = bk("d", "1", "--op-id", "K", "-y")["data"]
    assert retry["status"] == "exists" and retry["reservation"]["id"] == a
    assert len(bk("l")["data"]["reservations"]) == 1
