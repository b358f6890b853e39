"""The writers' lock: ``flock`` on a file that is never replaced.

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
* Readers never take this lock: they rely on the atomic rename of the
  ledger instead, so a stuck writer cannot stop anyone from reading.

After locking, the holder writes its pid into the file.  It is advice for
the ``Busy`` message only: a stale pid in an unlocked file means nothing.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Callable

from bk.core.errors import Busy
from bk.store.fsutil import Safety, io_error, open_file


class LedgerLock:
    """``with LedgerLock(...):`` holds the exclusive writer lock."""

    def __init__(self, dirfd: int, name: str, path: str, safety: Safety, *, mode: int,
                 timeout: float, monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.dirfd, self.name, self.path, self.safety = dirfd, name, path, safety
        self.mode, self.timeout = mode, timeout
        self.monotonic, self.sleep = monotonic, sleep
        self.fd: int | None = None

    def acquire(self) -> None:
        fd = open_file(self.dirfd, self.name, self.path, self.safety, os.O_RDWR,
                       create_mode=self.mode)
        try:
            self._wait(fd)
            try:
                # Fixed width, so no truncation is needed (ftruncate is a
                # journalled metadata change on ext4: half a millisecond).
                os.pwrite(fd, f"{os.getpid():<20}\n".encode(), 0)
            except OSError:
                pass
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

    def _wait(self, fd: int) -> None:
        deadline = self.monotonic() + self.timeout
        pause = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EINTR):
                    raise io_error(e, "locking", self.path) from None
            left = deadline - self.monotonic()
            if left <= 0:
                raise self._busy(fd)
            self.sleep(min(left, pause * (0.5 + int.from_bytes(os.urandom(2), 'big') / 65535)))
            pause = min(pause * 2, 0.05)

    def _busy(self, fd: int) -> Busy:
        try:
            pid = int(os.pread(fd, 32, 0).split()[0])
        except (OSError, ValueError, IndexError):
            pid = None
        holder = f"process {pid}" if pid else "another process"
        return Busy(f"the ledger is busy: {holder} has held {self.path} for more than "
                    f"{self.timeout:g} s",
                    "retry in a moment" + (f"; if it stays busy, see what it is doing: "
                                           f"ps -o pid,etime,args -p {pid}" if pid else ""),
                    details={"path": self.path, "holder_pid": pid})

    def release(self) -> None:
        # Closing the descriptor releases the lock; no explicit LOCK_UN needed.
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)

    def __enter__(self) -> LedgerLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def probe(dirfd: int, name: str, path: str, safety: Safety) -> tuple[str, int | None]:
    """For doctor: ("free", None) after taking and dropping the lock at once,
    ("held", pid or None) when a writer holds it, ("missing", None)."""
    fd = open_file(dirfd, name, path, safety, os.O_RDONLY)
    if fd is None:
        return "missing", None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return "free", None
        except OSError:
            try:
                return "held", int(os.pread(fd, 32, 0).split()[0])
            except (OSError, ValueError, IndexError):
                return "held", None
    finally:
        os.close(fd)
