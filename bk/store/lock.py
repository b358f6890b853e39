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

Who may hold it.  ``flock`` needs nothing but an open descriptor, and a
descriptor needs only read permission: anyone who can open a lock file can
hold it, or wait on it and take it the moment its holder dies, and a daemon
whose single-instance lock someone else holds refuses to start (75), which
systemd's ``RestartPreventExitStatus=75`` turns into "down until a person
acts".  So every lock file is created 0600, and ``acquire``, run by the
account that owns it, replaces one it finds readable by others (or with a
second name) with a fresh 0600 file: a descriptor opened while the old one
was readable then locks an inode nobody else uses.  It does the same when
the holder is another account than the owner and root: only the owner (and
root, for a backup) ever takes these locks, so such a holder got in through
a readable file.  The replacement is made while holding the old lock (or
while an intruder holds it), locked before it gets the name, and renamed
over the old one; and every ``acquire`` checks, once it holds a lock, that
the name still leads to the inode it locked, trying again when not.  So
the rule above stays true for bk's own writers: two of them never hold
different inodes of one lock at once.  The one race left is two daemons of
the owner's started at the same instant while an intruder holds the old
file; systemd never starts a unit twice, and a second broker still meets
the first one's socket.  A holder of another account is named with its uid
(``holder_uid``, from ``/proc/PID``).

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
import stat
import time

from bk.core.errors import Busy
from bk.store.fsutil import O_CLOEXEC, O_NOFOLLOW, Safety, io_error, open_file

TYPE_CHECKING = False
if TYPE_CHECKING:   # annotations only: collections.abc would import collections
    from collections.abc import Callable

PAUSE_FIRST, PAUSE_MAX = 0.001, 0.05
PROC_LOCKS = "/proc/locks"
PROC = "/proc"
MODE = 0o600                     # every lock file
REPLACE_TRIES = 5                # acquire's reopenings after the name moved to another inode


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


def holder_uid(pid: int | None, proc: str = PROC) -> int | None:
    """The effective uid of process ``pid`` (from ``/proc/PID/status``), or
    None when it is unknown or has gone."""
    if not pid:
        return None
    try:
        with open(f"{proc}/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[2])
    except (OSError, ValueError, IndexError):
        pass
    return None


def account(uid: int) -> str:
    from bk.users import user_name

    name = user_name(uid)
    return f"uid {uid} ({name})" if name is not None else f"uid {uid}"


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


def _open_lock(dirfd: int, name: str, path: str, safety: Safety) -> int:
    """The lock file, opened for writing (created 0600 when missing).  A
    second hard link is tolerated here, since ``acquire`` replaces such a
    file; everything else is checked like any managed file."""
    try:
        st = os.lstat(name, dir_fd=dirfd)
    except FileNotFoundError:
        return open_file(dirfd, name, path, safety, os.O_RDWR, create_mode=MODE)
    if st.st_nlink > 1 and os.geteuid() == safety.uid and st.st_uid == safety.uid:
        try:
            fd = os.open(name, os.O_RDWR | O_NOFOLLOW | O_CLOEXEC | os.O_NONBLOCK, dir_fd=dirfd)
        except OSError as e:
            raise io_error(e, "opening", path) from None
        fst = os.fstat(fd)
        if (fst.st_dev, fst.st_ino) == (st.st_dev, st.st_ino) and stat.S_ISREG(fst.st_mode):
            return fd
        os.close(fd)
    return open_file(dirfd, name, path, safety, os.O_RDWR)


def _same_file(fd: int, dirfd: int, name: str) -> bool:
    """Whether ``name`` still leads to the inode open as ``fd``."""
    try:
        st = os.lstat(name, dir_fd=dirfd)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def _fresh(dirfd: int, name: str, path: str) -> int:
    """A new 0600 lock file, locked, renamed over ``name``; its descriptor."""
    prefix = f".{name}.new-"
    for old in os.listdir(dirfd):          # one left by a crash between create and rename
        if old.startswith(prefix):
            try:
                os.unlink(old, dir_fd=dirfd)
            except OSError:
                pass
    tmp = f"{prefix}{os.getpid()}-{os.urandom(4).hex()}"
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC, MODE, dir_fd=dirfd)
    except OSError as e:
        raise io_error(e, "creating", os.path.join(os.path.dirname(path), tmp)) from None
    try:
        os.fchmod(fd, MODE)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)       # nobody else can have it open
        os.rename(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    except OSError as e:
        os.close(fd)
        try:
            os.unlink(tmp, dir_fd=dirfd)
        except OSError:
            pass
        raise io_error(e, "replacing", path) from None
    return fd


def acquire(dirfd: int, name: str, path: str, safety: Safety, *, timeout: float,
            what: str = "the lock", monotonic: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep,
            busy: Callable[[int | None], Busy] | None = None,
            log: Callable[[str], None] | None = None, proc: str = PROC) -> int:
    """Take the exclusive lock on lock file ``name`` in ``dirfd`` within
    ``timeout`` (``take``) and return its descriptor, with our pid written
    in.  Run by the file's owner (``safety.uid``), it replaces a file that
    others could open, and one held by another account than the owner and
    root, with a fresh 0600 one (the module docstring); ``log`` hears each
    replacement, with the holder's uid.  ``Busy`` names a holder of another
    account with its uid."""
    owner = os.geteuid() == safety.uid
    for _ in range(REPLACE_TRIES):
        fd = _open_lock(dirfd, name, path, safety)
        try:
            fd = _locked(fd, dirfd, name, path, safety, owner, timeout=timeout, what=what,
                         monotonic=monotonic, sleep=sleep, busy=busy, log=log, proc=proc)
        except BaseException:
            os.close(fd)
            raise
        if fd is None:
            continue                       # the name moved to a new inode meanwhile: open that one
        mark(fd)
        return fd
    raise Busy(f"{what} is busy: {path} was replaced {REPLACE_TRIES} times while bk waited for it",
               "retry in a moment", details={"path": path})


def _locked(fd: int, dirfd: int, name: str, path: str, safety: Safety, owner: bool, *, timeout: float,
            what: str, monotonic, sleep, busy, log, proc: str) -> int | None:
    """``acquire``'s one try: the locked descriptor (maybe of a fresh file),
    or None (``fd`` closed) when the name no longer leads to ``fd``."""
    try:
        take(fd, path, timeout=0, what=what)
    except Busy as first:
        pid = first.details.get("holder_pid")
        uid = holder_uid(pid, proc)
        if owner and uid is not None and uid not in (safety.uid, 0):
            new = _fresh(dirfd, name, path)
            os.close(fd)
            if log is not None:
                log(f"{path} was held by pid {pid} of {account(uid)}, not by the account that owns it "
                    f"({account(safety.uid)}); it could only have opened the file while it was readable "
                    "by others: replaced it with a fresh 0600 lock file, which that process cannot reach")
            return new
        try:
            take(fd, path, timeout=timeout, what=what, monotonic=monotonic, sleep=sleep, busy=busy)
        except Busy as e:
            raise _foreign(e, safety.uid, proc) from None
    if not _same_file(fd, dirfd, name):
        os.close(fd)
        return None
    st = os.fstat(fd)
    if owner and (st.st_mode & 0o077 or st.st_nlink > 1):
        new = _fresh(dirfd, name, path)
        os.close(fd)
        if log is not None:
            why = (f"mode {st.st_mode & 0o7777:04o}" if st.st_mode & 0o077 else f"{st.st_nlink} hard links")
            log(f"{path} had {why}, so other accounts could open it, hold it and keep this daemon from "
                "starting: replaced it with a fresh 0600 lock file")
        return new
    return fd


def _foreign(e: Busy, owner: int, proc: str) -> Busy:
    """``e`` with the holder's account named when it is not ``owner``."""
    uid = holder_uid(e.details.get("holder_pid"), proc)
    if uid is None or uid == owner:
        return e
    return Busy(f"{e.message}; the holder runs as {account(uid)}, not as the account that owns the lock "
                f"({account(owner)})", e.hint, details={**e.details, "holder_uid": uid})


class FileLock:
    """``with FileLock(...):`` holds an exclusive lock on a managed lock
    file in ``dirfd`` (created 0600 if missing, checked like every managed
    file, replaced by ``acquire`` when others could open it), with our pid
    written into it.  ``mode`` is accepted for the callers that name it;
    every lock file is ``MODE``."""

    def __init__(self, dirfd: int, name: str, path: str, safety: Safety, *, mode: int = MODE,
                 timeout: float, what: str = "the lock",
                 monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 busy: Callable[[int | None], Busy] | None = None,
                 log: Callable[[str], None] | None = None):
        self.dirfd, self.name, self.path, self.safety = dirfd, name, path, safety
        self.mode, self.timeout, self.what, self.busy = mode, timeout, what, busy
        self.monotonic, self.sleep, self.log = monotonic, sleep, log
        self.fd: int | None = None

    def acquire(self) -> None:
        self.fd = acquire(self.dirfd, self.name, self.path, self.safety, timeout=self.timeout,
                          what=self.what, monotonic=self.monotonic, sleep=self.sleep, busy=self.busy,
                          log=self.log)

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
