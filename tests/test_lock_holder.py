"""The lock-busy error names the process that really holds the lock: the
kernel's ``/proc/locks`` entry for the lock file's inode, not the pid a
past holder wrote into the file.  Real locks held by real processes; a
stale pid is the pid of a process that has exited."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers_build import copy_to

from bk.core.errors import Busy
from bk.store import lock

ROOT = Path(__file__).resolve().parents[1]
NOW_ISO = "2026-07-13T10:41:30Z"
HOLD = ("import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n")

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs /proc/locks")


def hold(path: str) -> subprocess.Popen:
    """A process that holds flock(LOCK_EX) on ``path`` until its stdin closes."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, path], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "held\n"
    return p


def let_go(p: subprocess.Popen) -> None:
    p.stdin.close()
    p.wait(timeout=30)


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.fixture
def lockfile(tmp_path):
    path = str(tmp_path / "ledger.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    stale = dead_pid()
    os.pwrite(fd, f"{stale:<20}\n".encode(), 0)       # written by a holder long gone
    yield path, fd, stale
    os.close(fd)


def test_busy_names_the_process_holding_the_lock_not_the_pid_in_the_file(lockfile):
    path, fd, stale = lockfile
    p = hold(path)
    try:
        assert lock.holder(fd) == p.pid
        with pytest.raises(Busy) as e:
            lock.take(fd, path, timeout=0, what="the ledger")
    finally:
        let_go(p)
    assert e.value.message == f"the ledger is busy: process {p.pid} has held {path} for more than 0 s"
    assert str(stale) not in e.value.message + e.value.hint
    assert e.value.details["holder_pid"] == p.pid
    assert f"ps -o pid,etime,args -p {p.pid}" in e.value.hint


def test_a_waiter_is_not_taken_for_the_holder(lockfile):
    path, fd, _stale = lockfile
    first = hold(path)
    # A second process blocks in flock: /proc/locks lists it with "->".
    waiter = subprocess.Popen([sys.executable, "-c", HOLD, path], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        import time

        deadline = time.monotonic() + 30
        while f" {waiter.pid} " not in open("/proc/locks").read():   # poll with a deadline
            assert time.monotonic() < deadline, "the waiter never queued on the lock"
        assert lock.holder(fd) == first.pid
        let_go(first)
        assert waiter.stdout.readline() == "held\n"
        assert lock.holder(fd) == waiter.pid
    finally:
        if first.poll() is None:
            let_go(first)
        let_go(waiter)


def test_holder_unknown_falls_back_to_the_pid_in_the_file_saying_so(lockfile, tmp_path):
    path, fd, stale = lockfile
    # The kernel cannot name the holder (another pid namespace, no /proc):
    # a locks table without its line.
    blind = tmp_path / "locks"
    blind.write_text("1: POSIX  ADVISORY  WRITE 1 00:00:1 0 EOF\n")
    p = hold(path)
    try:
        assert lock.holder(fd, str(blind)) is None
        with pytest.raises(Busy) as e:
            lock.take(fd, path, timeout=0, what="the ledger", proc_locks=str(blind))
    finally:
        let_go(p)
    assert e.value.message == (f"the ledger is busy: another process has held {path} for more than 0 s "
                               f"(last written by pid {stale})")
    assert e.value.details == {"path": path, "holder_pid": None, "last_written_pid": stale}
    assert f"process {stale}" not in e.value.message


def test_a_free_lock_has_no_holder_whatever_the_file_says(lockfile):
    path, fd, stale = lockfile
    p = hold(path)
    let_go(p)                                  # exited: the kernel dropped its lock
    assert lock.holder(fd) is None and lock.written_pid(fd) == stale
    lock.take(fd, path, timeout=0)
    assert lock.holder(fd) == os.getpid()


@pytest.mark.slow
def test_bk_through_the_archive_names_the_holder(tmp_path):
    pyz = copy_to(tmp_path / "bk.pyz")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update(BK_DATA_DIR=str(tmp_path / "data"), BK_GPU_COUNT="4", BK_NOW=NOW_ISO, TZ="UTC",
               HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "cfg"),
               XDG_STATE_HOME=str(tmp_path / "state"), NO_COLOR="1")
    (tmp_path / "cfg" / "bk").mkdir(parents=True)
    (tmp_path / "cfg" / "bk" / "config.json").write_text('{"lock_timeout_seconds": 0.1}')

    def bk(*argv):
        return subprocess.run([sys.executable, str(pyz), "--json", *argv], env=env, capture_output=True,
                              text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert bk("1", "30m").returncode == 0                   # creates ledger.lock (our pid in it)
    lockpath = str(tmp_path / "data" / "ledger.lock")
    p = hold(lockpath)
    try:
        r = bk("1", "30m")
    finally:
        let_go(p)
    assert r.returncode == 75, r.stderr
    err = json.loads(r.stdout)["error"]
    assert err["code"] == "busy" and f"process {p.pid} has held {lockpath}" in err["message"]
    assert err["details"]["holder_pid"] == p.pid
