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
