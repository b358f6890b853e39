"""Each row of the exit-status table (SPEC 6.4) that these commands can
reach, reached for real: with the JSON envelope's ``error.code`` to match."""

from __future__ import annotations

import fcntl
import os

import pytest
from helpers_cli import BOB, ME, bk_fixture

from bk.core import errors
from bk.service.requests import BookRequest


@pytest.fixture
def bk(monkeypatch, capsys):
    yield from bk_fixture(monkeypatch, capsys)


def test_0_success(bk):
    r = bk.json("1", "30m")
    assert r.code == errors.EXIT_OK and r.envelope["ok"]


def test_1_doctor_strict_with_a_failing_check(bk):
    bk.ok("1", "30m")
    bk.data_dir.chmod(0o750)             # private mode wants 0700
    assert bk("doctor").code == errors.EXIT_OK
    r = bk.json("doctor", "--strict")
    assert r.code == errors.EXIT_PARTIAL and r.envelope["ok"] and not r.data["ok"]


@pytest.mark.slow
@pytest.mark.parametrize("argv", [
    ["1"],                       # no duration
    ["1", "7m"],                 # not whole slices
    ["frobnicate"],              # no such command
    ["l", "--bogus"],            # no such flag
    ["d", "zz"],                 # neither a number nor an ID prefix
    ["tl", "--step", "1h", "--window", "6h", "--from", "yesterday"],
])
def test_2_usage_and_invalid_input(bk, argv):
    r = bk.json(*argv)
    assert r.code == errors.EXIT_USAGE and r.error["code"] == "invalid_input"


def test_2_ambiguous_prefix(bk):
    from bk.core.models import Mutation, Reservation

    svc = bk.service(ME)
    now = svc.call().now
    t = now - now % 300

    def two_alike(state):
        for tail in ("1111", "2222"):
            state.reservations.append(Reservation(
                id=f"abcd{tail}-0000-4000-8000-000000000000", uid=ME.uid, user=ME.user,
                mode="shared", gpus=(0,), share=1, start=t, end=t + 1800, created=t))
        return Mutation(True, [], None)

    svc.store.transact(two_alike, policy=svc.policy.bound(), actor_uid=ME.uid, actor=ME.user)
    r = bk.json("history", "abcd")
    assert (r.code, r.error["code"]) == (errors.EXIT_USAGE, "ambiguous")
    assert bk.json("history", "abcd1").code == 0


def test_3_conflict_policy_and_nothing_found(bk):
    bk.ok("x", "4", "1h")
    r = bk.json("1", "30m", "-t", "11:00")
    assert (r.code, r.error["code"]) == (errors.EXIT_CAPACITY, "conflict")
    r = bk.json("1", "800h")
    assert (r.code, r.error["code"], r.error["details"]["rule"]) == (errors.EXIT_CAPACITY, "policy", "max_length")
    r = bk.json("1", "1h", "-t", "2026-08-20 10:00")
    assert (r.code, r.error["code"], r.error["details"]["rule"]) == (errors.EXIT_CAPACITY, "policy", "horizon")
    assert bk.json("slots", "5", "1h").code == errors.EXIT_CAPACITY
    assert bk.json("g", "5").code == errors.EXIT_CAPACITY       # never fits (nothing free now is exit 0)


def test_4_not_found(bk):
    r = bk.json("d", "3")
    assert (r.code, r.error["code"]) == (errors.EXIT_NOT_FOUND, "not_found")
    r = bk.json("history", "abcdef12")
    assert (r.code, r.error["code"]) == (errors.EXIT_NOT_FOUND, "not_found")


def test_5_another_users_booking(bk):
    theirs = bk.service(BOB).run("book", BookRequest(count=1, duration=3600)).reservation
    for argv in (["d", theirs.id[:8]], ["e", theirs.id[:8], "-d", "2h"]):
        r = bk.json(*argv)
        assert (r.code, r.error["code"]) == (errors.EXIT_PERMISSION, "permission_denied")


def test_70_internal_error_is_one_line(bk, monkeypatch):
    import bk.cli.cmd_list as cmd_list

    def broken(args, ctx):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(cmd_list, "run", broken)
    r = bk("l")
    assert r.code == errors.EXIT_INTERNAL and "Traceback" not in r.err
    assert r.err.splitlines() == ["error: unexpected error: RuntimeError: kaboom",
                                  "hint: run with BK_DEBUG=1 for details"]
    r = bk.json("l")
    assert (r.code, r.error["code"]) == (errors.EXIT_INTERNAL, "internal")
    with pytest.raises(RuntimeError):
        bk("l", BK_DEBUG="1")


def test_74_unreadable_ledger_without_a_valid_backup(bk):
    bk.ok("1", "30m")
    (bk.data_dir / "ledger.json").write_text("{ not json")
    for f in (bk.data_dir / "backups").iterdir():
        f.unlink()
    r = bk.json("l")
    assert (r.code, r.error["code"]) == (errors.EXIT_IO, "io_error")


def test_75_lock_busy(bk):
    bk.config(lock_timeout_seconds=0.1)
    bk.ok("1", "30m")
    fd = os.open(bk.data_dir / "ledger.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        r = bk.json("1", "30m")
        assert (r.code, r.error["code"]) == (errors.EXIT_TEMPFAIL, "busy")
        assert bk.json("l").code == 0              # readers never take the lock
    finally:
        os.close(fd)
    assert bk.json("1", "30m").code == 0


def test_78_policy_mismatch_with_the_ledger(bk):
    bk.ok("1", "30m")                               # binds slot_minutes 5
    bk.config(slot_minutes=10)
    r = bk.json("1", "30m")
    assert (r.code, r.error["code"]) == (errors.EXIT_CONFIG, "config")
    assert "slot_minutes" in r.error["message"] + (r.error["hint"] or "")


def test_78_bad_configuration(bk):
    bk.config(slot_minuts=5)
    r = bk.json("l")
    assert (r.code, r.error["code"]) == (errors.EXIT_CONFIG, "config")
    assert "slot_minutes" in r.error["hint"]
