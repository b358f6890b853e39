"""One user cannot bloat the ledger for everyone (issue 22, item 4), with
real accounts through the built ``bk.pyz`` and a broker run as the service
account.

Each test sets small limits in the trusted configuration (the broker reads
a changed file at its next request) and plays the flood as a fresh user:
the booking past a limit is refused with ``ledger_limit`` (exit 3) naming
the key, the user's count and the maximum; another user and the
administrator are not held back; a booking cancelled before it started
gives its note up, so its bytes leave the ledger at once.
"""

from __future__ import annotations

import json
import os

import pytest
from helpers_broker import needs_root, site

pytestmark = [needs_root, pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def srv():
    with site(gpu_count=8) as s:
        p = s.init()
        assert p.returncode == 0, p.stderr
        s.start_broker("--frame-timeout", "5")
        yield s


def limits(srv, **values) -> None:
    """Set ledger limits (the rest off) in the trusted config, replaced atomically."""
    doc = json.loads(srv.config.read_text())
    doc.update({"ledger_bookings_per_user": 0, "ledger_bookings_per_minute": 0,
                "ledger_note_bytes_per_user": 0}, **values)
    tmp = srv.config.with_name(".config.json.new")
    tmp.write_text(json.dumps(doc, indent=1))
    os.chmod(tmp, 0o644)
    os.replace(tmp, srv.config)


def book(srv, user, *args):
    return srv.run_json(user, "1", "30m", "--again", *args)


def refused(env: dict, key: str, value: int, maximum: int, uid: int) -> None:
    assert env["ok"] is False and env["error"]["code"] == "ledger_limit", env
    assert env["error"]["details"] == {**env["error"]["details"], "limit": key, "value": value,
                                       "max": maximum, "uid": uid}
    assert f"({key} {maximum})" in env["error"]["message"]


def test_bookings_per_minute(srv):
    limits(srv, ledger_bookings_per_minute=3)
    flood, other = srv.accounts.user(), srv.accounts.user()
    for _ in range(3):
        rc, env = book(srv, flood)
        assert rc == 0, env
    rc, env = book(srv, flood)
    assert rc == 3
    refused(env, "ledger_bookings_per_minute", 3, 3, flood.uid)
    assert 1 <= env["error"]["details"]["retry_after"] <= 60
    p = srv.run(flood, "1", "30m", "--again")
    assert p.returncode == 3 and "error: you made 3 bookings in the last minute" in p.stderr, p.stderr
    rc, env = book(srv, other)                        # someone else is not held back
    assert rc == 0, env
    for _ in range(4):                                # nor is the administrator
        rc, env = book(srv, None)
        assert rc == 0, env


def test_live_and_recently_cancelled_bookings(srv):
    limits(srv, ledger_bookings_per_user=4)
    flood = srv.accounts.user()
    for _ in range(4):
        rc, env = book(srv, flood)
        assert rc == 0, env
        rc, _ = srv.run_json(flood, "d", env["data"]["reservation"]["id"], "-y")
        assert rc == 0
    # Four cancelled bookings still sit in the hot ledger: a fifth is refused.
    rc, env = book(srv, flood)
    assert rc == 3
    refused(env, "ledger_bookings_per_user", 4, 4, flood.uid)
    rc, env = srv.run_json(flood, "1", "30m", "--again", "--dry-run")      # a dry run says so too
    assert rc == 3 and env["error"]["code"] == "ledger_limit"
    assert sum(1 for r in srv.ledger().state.reservations if r.uid == flood.uid) == 4


def test_note_bytes_and_a_booking_cancelled_before_it_started_gives_its_note_up(srv):
    limits(srv, ledger_note_bytes_per_user=2500)
    flood = srv.accounts.user()
    note = "n" * 1000
    rc, now = book(srv, flood, "--note", note)
    assert rc == 0, now
    rc, later = book(srv, flood, "-t", "+3h", "--note", note)
    assert rc == 0, later
    rc, env = book(srv, flood, "-t", "+6h", "--note", note)
    assert rc == 3
    refused(env, "ledger_note_bytes_per_user", 3000, 2500, flood.uid)
    rc, env = book(srv, flood, "-t", "+6h", "--note", "short")          # a short one still fits
    assert rc == 0, env
    rc, env = srv.run_json(flood, "e", env["data"]["reservation"]["id"], "--note", note)
    assert rc == 3 and env["error"]["details"]["limit"] == "ledger_note_bytes_per_user", env

    # Cancelled before it started: its 1,000 bytes leave the ledger at once.
    rid = later["data"]["reservation"]["id"]
    rc, _ = srv.run_json(flood, "d", rid, "-y")
    assert rc == 0
    record = srv.ledger().state.find(rid)
    assert record.cancelled_at is not None and record.note is None
    rc, env = book(srv, flood, "-t", "+9h", "--note", note)
    assert rc == 0, env
    # One that has started keeps its note when cancelled.
    rc, _ = srv.run_json(flood, "d", now["data"]["reservation"]["id"], "-y")
    assert rc == 0
    assert srv.ledger().state.find(now["data"]["reservation"]["id"]).note == note


def test_limits_off_and_the_administrator_exempt(srv):
    limits(srv)
    flood = srv.accounts.user()
    for _ in range(3):
        rc, env = book(srv, flood, "--note", "x" * 1000)
        assert rc == 0, env
    limits(srv, ledger_bookings_per_user=1, ledger_bookings_per_minute=1, ledger_note_bytes_per_user=10)
    rc, env = book(srv, None, "--note", "x" * 1000)
    assert rc == 0, env
