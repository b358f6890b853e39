"""Locks: ``flock`` on a file that is never replaced, with a bounded wait.

How the kernel behaves, and what follows:

* ``flock(LOCK_EX)`` locks the *open file description*, not the path and
  not the process.  The kernel drops the lock when the last descriptor of
  that description is closed, which includes the process dying by
  ``kill -9``: a crashed writer never leaves a stale lock behind, so there
  is no lock-breaking logic (and none of its races).
* Because the lock lives on an inode, the lock file must never be replaced
  or deleted while bk runs: a writer that locked the old inode and one that
  opened the new name would both "hold" the lock.  The ledger is replaced by
  rename; the lock file is a separate name that only ever gets created.
* Two opens of the same file in one process are two descriptions and
  exclude each other like two processes; a descriptor inherited across
  ``fork`` shares the description (and the lock), so it is opened with
  ``O_CLOEXEC`` and a child that execs does not keep it.
* ``flock`` has no timeout.  bk asks with ``LOCK_NB`` and retries with a
  short, growing, jittered pause until ``timeout`` has passed on the
  injected monotonic clock, then reports ``Busy`` (exit 75).  Polling is
  not fair, but transactions take milliseconds and the wait is bounded.
  ``take`` is that loop, for every lock bk takes (the ledger's, the
  presets', the broker's); ``FileLock`` adds opening the lock file.
* Readers never take the ledger's lock: they rely on the atomic rename of
  the ledger instead, so a stuck writer cannot stop anyone from reading.

Who holds it.  The kernel lists every lock in ``/proc/locks``, one line
each: ``ID: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE 0 EOF`` (the device
numbers in hex; ``->`` marks a waiter, not a holder).  For ``flock`` the pid
is the process that took the lock, shown in the reader's pid namespace (0 or
missing when the holder is outside it).  So the ``Busy`` message names the
pid that holds a lock on *this inode* right now.  After locking, the holder
also writes its pid into the file; that is only a fallback, worded "last
written by pid N", for when ``/proc/locks`` cannot say (no ``/proc``, the
holder in another pid namespace, or the lock released a moment ago): a pid
in the file outlives its writer, so it never passes for the holder.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Callable

from bk.core.errors import Busy
from bk.store.fsutil import Safety, io_error, open_file

PAUSE_FIRST, PAUSE_MAX = 0.001, 0.05
PROC_LOCKS = "/proc/locks"


def _jitter() -> float:
    """A factor in [0.5, 1.5]: waiters that collided once do not collide again."""
    return 0.5 + int.from_bytes(os.urandom(2), "big") / 65535


def written_pid(fd: int) -> int | None:
    """The pid the last holder wrote into the lock file, if any: advice
    only, it may have exited long ago."""
    try:
        pid = int(os.pread(fd, 32, 0).split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if pid > 0 else None


def holder(fd: int, proc_locks: str = PROC_LOCKS) -> int | None:
    """The pid that holds an ``flock`` on ``fd``'s inode now, from
    ``/proc/locks``; None when nobody does or the kernel cannot say."""
    try:
        st = os.fstat(fd)
        with open(proc_locks, encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in lines:
        parts = line.split()
        if len(parts) < 6 or parts[1] != "FLOCK":      # waiters ("->") and POSIX locks
            continue
        try:
            major, minor, ino = parts[5].split(":")
            pid = int(parts[4])
            if (int(major, 16), int(minor, 16), int(ino)) == want and pid > 0:
                return pid
        except ValueError:
            continue
    return None


def mark(fd: int) -> None:
    """Write our pid into the lock file we now hold.  Fixed width, so no
    truncation is needed (ftruncate is a journalled metadata change on ext4:
    half a millisecond); failing to write it costs only a vaguer message."""
    try:
        os.pwrite(fd, f"{os.getpid():<20}\n".encode(), 0)
    except OSError:
        pass


def take(fd: int, path: str, *, timeout: float, what: str = "the lock",
         monotonic: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], None] = time.sleep, jitter: Callable[[], float] = _jitter,
         busy: Callable[[int | None], Busy] | None = None, proc_locks: str = PROC_LOCKS) -> None:
    """``flock(LOCK_EX)`` on ``fd`` within ``timeout`` seconds of ``monotonic``,
    or raise ``Busy`` (exit 75) naming the holder's pid from ``/proc/locks``
    (None when unknown): ``busy(pid)`` when given, else "WHAT is busy:
    process N has held PATH for more than T s", or, holder unknown, "another
    process ... (last written by pid N)" from the file.

    Every bk lock is taken here.  The first try is immediate; then pauses of
    1 ms doubling up to 50 ms, each times ``jitter()`` and never past the
    deadline.  ``timeout=0`` tries exactly once.  Other errors than "held"
    (``ENOLCK``) are ``IOFailure``."""
    deadline = monotonic() + timeout
    pause = PAUSE_FIRST
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EINTR):
                raise io_error(e, "locking", path) from None
        left = deadline - monotonic()
        if left <= 0:
            pid = holder(fd, proc_locks)
            if busy is not None:
                raise busy(pid)
            raise _busy(what, path, timeout, pid, None if pid else written_pid(fd))
        sleep(min(left, pause * jitter()))
        pause = min(pause * 2, PAUSE_MAX)


def _busy(what: str, path: str, timeout: float, pid: int | None, written: int | None) -> Busy:
    if pid:
        return Busy(f"{what} is busy: process {pid} has held {path} for more than {timeout:g} s",
                    f"retry in a moment; if it stays busy, see what it is doing: "
                    f"ps -o pid,etime,args -p {pid}", details={"path": path, "holder_pid": pid})
    # The kernel did not name a holder: the lock was let go a moment ago, or
    # its holder is out of our sight (another pid namespace, no /proc).
    last = f" (last written by pid {written})" if written else ""
    return Busy(f"{what} is busy: another process has held {path} for more than {timeout:g} s{last}",
                "retry in a moment; to see who holds it: fuser -v " + path,
                details={"path": path, "holder_pid": None, "last_written_pid": written})


class FileLock:
    """``with FileLock(...):`` holds an exclusive lock on a managed lock
    file in ``dirfd`` (created with ``mode`` if missing, checked like every
    managed file), with our pid written into it."""

    def __init__(self, dirfd: int, name: str, path: str, safety: Safety, *, mode: int,
                 timeout: float, what: str = "the lock",
                 monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 busy: Callable[[int | None], Busy] | None = None):
        self.dirfd, self.name, self.path, self.safety = dirfd, name, path, safety
        self.mode, self.timeout, self.what, self.busy = mode, timeout, what, busy
        self.monotonic, self.sleep = monotonic, sleep
        self.fd: int | None = None

    def acquire(self) -> None:
        fd = open_file(self.dirfd, self.name, self.path, self.safety, os.O_RDWR,
                       create_mode=self.mode)
        try:
            take(fd, self.path, timeout=self.timeout, what=self.what, monotonic=self.monotonic,
                 sleep=self.sleep, busy=self.busy)
        except BaseException:
            os.close(fd)
            raise
        mark(fd)
        self.fd = fd

    def release(self) -> None:
        # Closing the descriptor releases the lock; no explicit LOCK_UN needed.
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def probe(dirfd: int, name: str, path: str, safety: Safety) -> tuple[str, int | None]:
    """For doctor: ("free", None) after taking and dropping the lock at once,
    ("held", pid or None) when a writer holds it (the pid from ``/proc/locks``,
    else the one written in the file), ("missing", None)."""
    fd = open_file(dirfd, name, path, safety, os.O_RDONLY)
    if fd is None:
        return "missing", None
    try:
        take(fd, path, timeout=0)
        return "free", None
    except Busy as e:
        return "held", e.details.get("holder_pid") or e.details.get("last_written_pid")
    finally:
        os.close(fd)
