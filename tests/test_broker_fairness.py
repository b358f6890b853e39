"""One user cannot slow everyone's writes (issue 22, item 3), with real accounts.

The broker serves reads that scan (``bk lg``, ``bk history``) outside the
writers' lock, at most two of one UID's at once, and an ordinary user's scan
reads a bounded part of the log.  Each test plays the attack through the
built ``bk.pyz``: user A's scans are held in progress by the store's test
seam (``BK_TEST_SCAN_PAUSE``: a scan of A's records parks on a FIFO once its
files are open, and leaves when the test writes a byte), while user B books,
cancels and reads.  No timing is measured: the properties are that B's
commands complete while A's scans are parked, that no more than two of A's
scans are ever inside the broker at once, and which records each reader
gets back.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from helpers_broker import SYSTEM_PYTHON, needs_root, poll, site

pytestmark = [needs_root, pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def srv():
    with site() as s:
        a, b = s.accounts.user(), s.accounts.user()
        s.users = (a, b)
        p = s.init()
        assert p.returncode == 0, p.stderr
        s.fifo = s.socket.parent / "scan.fifo"
        os.mkfifo(s.fifo, 0o600)
        os.chown(s.fifo, s.service.uid, s.service.gid)
        s.start_broker("--frame-timeout", "5", env={"BK_TEST_SCAN_PAUSE": f"{s.fifo}:{a.uid}"})
        # Held open for the whole module: releasing a scan is one byte.
        s.release_fd = os.open(s.fifo, os.O_RDWR)
        try:
            yield s
        finally:
            os.write(s.release_fd, b"x" * 64)           # let any parked scan go before the broker stops
            os.close(s.release_fd)


def parked(srv) -> int:
    return sum(1 for n in os.listdir(srv.fifo.parent) if n.startswith(srv.fifo.name + ".parked-"))


def start(srv, user, *args) -> subprocess.Popen:
    return subprocess.Popen([SYSTEM_PYTHON, str(srv.pyz), "--json", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=srv.env(user), cwd=srv.base,
                            **srv.popen_args(user))


def test_another_users_writes_and_reads_complete_while_a_users_scans_are_in_progress(srv):
    a, b = srv.users
    rc, env = srv.run_json(b, "1", "30m", "--note", "before")
    assert rc == 0, env
    scans = [start(srv, a, "lg", "-n", "1000") for _ in range(2)]
    try:
        poll(lambda: parked(srv) == 2, 60, "two of A's scans to be in progress in the broker")
        third = start(srv, a, "history", env["data"]["reservation"]["id"][:8])
        # B's booking, its cancellation and B's own audit trail, all while A's
        # two scans sit inside the broker (the old broker held its one lock
        # through every scan: B's write waited for it, then timed out).
        rc, booked = srv.run_json(b, "1", "1h", "--note", "during A's scans", timeout=60)
        assert rc == 0 and booked["data"]["status"] == "created", booked
        rc, cancelled = srv.run_json(b, "d", booked["data"]["reservation"]["id"], "-y", timeout=60)
        assert rc == 0 and cancelled["data"]["status"] == "cancelled", cancelled
        rc, trail = srv.run_json(b, "lg", "-n", "20", timeout=60)
        assert rc == 0 and booked["data"]["reservation"]["id"] in {e["reservation"] for e in trail["data"]["entries"]}
        assert [p.poll() for p in scans] == [None, None], "A's scans were not held in progress"
        # A's third read waits for one of A's two read slots: it never got in.
        assert parked(srv) == 2 and third.poll() is None
    finally:
        os.write(srv.release_fd, b"xxx")
    for p in [*scans, third]:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, (out, err)
        assert json.loads(out)["ok"] is True
    assert parked(srv) == 0


def _filler(n: int, uid: int, start_index: int) -> bytes:
    line = {"time": "2026-01-01T00:00:00Z", "seq": 0, "index": 0, "uid": uid, "user": "filler",
            "action": "create", "reservation": None, "op_id": None, "before": None,
            "after": {"gpus": [0], "mode": "shared", "share": 1, "mem_mib": None, "start": 1, "end": 2},
            "result": "created", "pad": "p" * 200}
    out = []
    for i in range(n):
        line["index"] = start_index + i
        line["reservation"] = f"{i:08x}-0000-4000-8000-000000000000"
        out.append(json.dumps(line, separators=(",", ":")).encode() + b"\n")
    return b"".join(out)


def test_an_ordinary_users_audit_read_is_bounded_and_the_administrators_is_not(srv):
    """The oldest records of B and of root sit behind 5 MiB of a third
    account's records: B's ``bk lg`` stops at its bound (and says so),
    root's finds its own."""
    _a, b = srv.users
    rc, env = srv.run_json(b, "1", "30m", "--note", "recent")
    assert rc == 0, env
    log = srv.data / "audit.jsonl"
    old = [dict(json.loads(_filler(1, uid, i)), reservation=rid) for i, (uid, rid) in enumerate(
        [(b.uid, "0b0b0b0b-0000-4000-8000-00000000000b"), (0, "00000000-0000-4000-8000-0000000000aa")])]
    head = b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in old)
    filler = _filler(5 * 1024 * 1024 // 400, 4242424, 10)
    assert len(filler) > 4 << 20
    log.write_bytes(head + filler + log.read_bytes())      # same inode: owner and mode kept

    rc, mine = srv.run_json(b, "lg", "-n", "1000", timeout=60)
    assert rc == 0, mine
    rids = {e["reservation"] for e in mine["data"]["entries"]}
    assert env["data"]["reservation"]["id"] in rids
    assert old[0]["reservation"] not in rids and mine["data"]["complete"] is False
    assert any("only the newest 2 MiB of the audit log were searched" in w for w in mine["warnings"])

    rc, root = srv.run_json(None, "lg", "-n", "1000", timeout=60)
    assert rc == 0, root
    assert old[1]["reservation"] in {e["reservation"] for e in root["data"]["entries"]}


def test_ordinary_users_share_one_write_probe_and_root_gets_its_own(srv):
    """The probe writes, fsyncs and takes the ledger lock for real: sixteen
    connections of it were an ordinary user's way to load the disk every
    commit needs.  Within 10 s, an ordinary user gets the last one's result."""
    _a, b = srv.users
    got = []
    for user in (b, b, None):
        rc, env = srv.run_json(user, "doctor", "--probe", timeout=60)
        assert env["ok"] is True or rc == 1, env
        # A shared result is a real measurement: never a failed check of its own.
        assert "ledger_read" not in env["data"]["failed"], env["data"]["failed"]
        got.append([w for w in env["warnings"] if "for another caller" in w])
        if got[-1]:
            details = {c["name"]: c["detail"] for c in env["data"]["checks"]}
            assert "for another caller" in details["atomic replace"], details
    assert got[1] and "ordinary users share one probe" in got[1][0], got
    assert not got[2], got


def test_a_dry_run_takes_no_place_in_a_commit(srv):
    """A dry run changes nothing, so the broker serves it from the committed
    ledger like a read: it neither waits for nor holds the writers' lock, and
    one user's dry runs (placements that search far ahead) do not sit in the
    commit another user's booking waits for.  Played with the ledger lock
    held by root from outside: the dry run still answers at once (the old
    broker ran it as a transaction, which waited lock_timeout_seconds and
    answered busy)."""
    import fcntl

    _a, b = srv.users
    rc, env = srv.run_json(b, "1", "30m", "--note", "so the lock file exists")
    assert rc == 0, env
    seq = srv.ledger().state.seq
    fd = os.open(srv.data / "ledger.lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        rc, env = srv.run_json(b, "2", "1h", "--dry-run", timeout=60)
        assert rc == 0 and env["data"]["dry_run"] is True, env
    finally:
        os.close(fd)
    assert srv.ledger().state.seq == seq                  # and nothing was committed
