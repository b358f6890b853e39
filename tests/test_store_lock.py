"""``bk.store.lock.take``: the one bounded ``flock``, driven by a fake clock.

Real locks (a second open of the same file is a second open file
description, which ``flock`` excludes like another process), fake time: the
fake ``sleep`` advances the fake ``monotonic``, so nothing here sleeps."""

from __future__ import annotations

import fcntl
import os

import pytest

from bk.core.errors import EXIT_TEMPFAIL, Busy
from bk.store import lock


class FakeTime:
    def __init__(self):
        self.now = 100.0
        self.sleeps: list[float] = []
        self.on_sleep = None

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        self.now += seconds
        if self.on_sleep:
            self.on_sleep(len(self.sleeps))


@pytest.fixture
def held(tmp_path):
    """(path, holder fd, waiter fd): the holder has the lock and its pid in the file."""
    path = str(tmp_path / "x.lock")
    holder = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)
    lock.mark(holder)
    waiter = os.open(path, os.O_RDWR)
    yield path, holder, waiter
    for fd in (holder, waiter):
        try:
            os.close(fd)
        except OSError:
            pass


def test_free_lock_is_taken_at_once_without_sleeping(tmp_path):
    t = FakeTime()
    fd = os.open(tmp_path / "free.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        lock.take(fd, "free.lock", timeout=5, monotonic=t.monotonic, sleep=t.sleep)
        assert t.sleeps == []
    finally:
        os.close(fd)


def test_timeout_backs_off_then_reports_the_holder_pid(held):
    path, _holder, waiter = held
    t = FakeTime()
    with pytest.raises(Busy) as e:
        lock.take(waiter, path, timeout=2.0, what="the ledger", monotonic=t.monotonic,
                  sleep=t.sleep, jitter=lambda: 1.0)
    # Doubling from 1 ms, capped at 50 ms, the last pause cut to the deadline.
    assert t.sleeps[:7] == [0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.05]
    assert set(t.sleeps[7:-1]) == {0.05} and 0 < t.sleeps[-1] <= 0.05
    assert t.now == pytest.approx(102.0) and sum(t.sleeps) == pytest.approx(2.0)
    err = e.value
    assert err.exit_code == EXIT_TEMPFAIL and err.code == "busy"
    assert err.message == (f"the ledger is busy: process {os.getpid()} has held {path} "
                           f"for more than 2 s")
    assert err.details == {"path": path, "holder_pid": os.getpid()}
    assert f"ps -o pid,etime,args -p {os.getpid()}" in err.hint


def test_jitter_never_sleeps_past_the_deadline(held):
    path, _holder, waiter = held
    t = FakeTime()
    with pytest.raises(Busy):
        lock.take(waiter, path, timeout=0.3, monotonic=t.monotonic, sleep=t.sleep,
                  jitter=lambda: 1.5)
    assert max(t.sleeps) == pytest.approx(0.075) and t.sleeps[0] == pytest.approx(0.0015)
    assert t.now == pytest.approx(100.3) and t.now <= 100.3 + 1e-9      # never past the deadline


def test_the_lock_is_taken_when_the_holder_lets_go_mid_wait(held):
    path, holder, waiter = held
    t = FakeTime()
    t.on_sleep = lambda n: os.close(holder) if n == 4 else None
    lock.take(waiter, path, timeout=10, monotonic=t.monotonic, sleep=t.sleep, jitter=lambda: 1.0)
    assert len(t.sleeps) == 4 and t.now == pytest.approx(100.015)


def test_timeout_zero_tries_once_and_the_caller_words_the_refusal(held):
    path, _holder, waiter = held
    t = FakeTime()
    with pytest.raises(Busy, match=rf"another broker is running \(pid {os.getpid()}\)"):
        lock.take(waiter, path, timeout=0, monotonic=t.monotonic, sleep=t.sleep,
                  busy=lambda pid: Busy(f"another broker is running (pid {pid})"))
    assert t.sleeps == []


def test_an_unmarked_lock_still_names_its_holder(held):
    path, holder, waiter = held
    os.pwrite(holder, b" " * 32, 0)
    # The kernel names the holder (this process, through another open file
    # description) even when nothing was written into the file.
    with pytest.raises(Busy, match=f"process {os.getpid()} has held") as e:
        lock.take(waiter, path, timeout=0)
    assert e.value.details["holder_pid"] == os.getpid()


def test_an_unmarked_lock_with_no_known_holder_says_another_process(held, tmp_path):
    path, holder, waiter = held
    os.pwrite(holder, b" " * 32, 0)
    blind = tmp_path / "no-locks"
    blind.write_text("")
    with pytest.raises(Busy, match="another process has held") as e:
        lock.take(waiter, path, timeout=0, proc_locks=str(blind))
    assert e.value.details["holder_pid"] is None and "last written" not in e.value.message


def test_errors_other_than_held_are_io_failures(tmp_path):
    from bk.core.errors import IOFailure

    with pytest.raises(IOFailure, match="locking"):
        lock.take(9999, "nowhere.lock", timeout=1)          # EBADF


# ------------------------------------------------------------- acquire: lock files others could open

def _dir(tmp_path):
    from bk.store.fsutil import Safety, open_dir

    safety = Safety(os.geteuid())
    return open_dir(str(tmp_path), safety), safety


def test_a_lock_file_others_could_open_is_replaced_while_held(tmp_path):
    """A 0644 lock file (an older bk made the daemons' so): ``acquire``
    locks it, puts a fresh 0600 file under the name, locked before it got
    the name, and keeps that one; whoever opened the old file holds nothing."""
    path = tmp_path / "x.lock"
    path.write_bytes(b"")
    os.chmod(path, 0o644)
    outsider = os.open(path, os.O_RDONLY)          # opened while it was readable
    said: list[str] = []
    dirfd, safety = _dir(tmp_path)
    try:
        fd = lock.acquire(dirfd, "x.lock", str(path), safety, timeout=0, log=said.append)
        st = os.lstat(path)
        assert (st.st_mode & 0o777, st.st_ino) == (0o600, os.fstat(fd).st_ino)
        assert st.st_ino != os.fstat(outsider).st_ino
        fcntl.flock(outsider, fcntl.LOCK_EX | fcntl.LOCK_NB)   # the old inode: nobody's lock now
        with pytest.raises(Busy):
            lock.acquire(dirfd, "x.lock", str(path), safety, timeout=0)
        assert said and "mode 0644" in said[0] and not [n for n in os.listdir(tmp_path) if ".new-" in n]
        os.close(fd)
    finally:
        os.close(outsider)
        os.close(dirfd)


def test_a_writer_that_locked_the_old_inode_follows_the_name(tmp_path):
    """The one rule of lock files (never two holders of two inodes): a
    writer that opened the file before it was replaced, and gets the old
    inode's lock once it is let go, sees that the name leads elsewhere and
    gives it up (``acquire`` then opens the name again)."""
    path = tmp_path / "x.lock"
    path.write_bytes(b"")
    os.chmod(path, 0o644)
    early = os.open(path, os.O_RDWR)
    dirfd, safety = _dir(tmp_path)
    try:
        fd = lock.acquire(dirfd, "x.lock", str(path), safety, timeout=0)
        got = lock._locked(early, dirfd, "x.lock", str(path), safety, True, timeout=0, what="x",
                           monotonic=lambda: 0.0, sleep=lambda s: None, busy=None, log=None, proc="/proc")
        assert got is None
        with pytest.raises(OSError):
            os.fstat(early)                        # given up (closed)
        os.close(fd)
    finally:
        os.close(dirfd)


def test_holder_uid_reads_the_effective_uid(tmp_path):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "status").write_text("Name:\tx\nUid:\t1000\t1234\t1000\t1000\n")
    assert lock.holder_uid(42, proc=str(tmp_path)) == 1234
    assert lock.holder_uid(43, proc=str(tmp_path)) is None and lock.holder_uid(None) is None
    assert lock.holder_uid(os.getpid()) == os.geteuid()
