"""The frame every daemon of bk shares: the account it must run as, its
single-instance lock, the signals that stop it, its log lines and its
readiness.  The broker, the monitor, the enforcer and the per-user worker
each fill it with their own loop, as a ``socketserver`` server fills its
named hooks.

The facts that shape it:

* The account.  A daemon that steers what everyone's bk believes (the
  broker's ledger, the monitor's snapshot) runs as the one account whose
  files readers trust; run as anyone else it would write files nobody
  believes, so it refuses at start with ``WrongAccount`` (exit 77, which
  the units' ``RestartPreventExitStatus=`` turns into "down until a person
  acts") and says which account and how to become it.  The enforcer
  refuses anything but root: only root may load and attach BPF programs.
* One instance.  ``flock(LOCK_EX)`` on a lock file held for the daemon's
  life (``bk.store.lock.acquire``: created 0600; one that others could
  open, or that another account holds, replaced with a fresh one; a holder
  of another account named with its uid).  The kernel drops the lock when
  the process dies, however it dies.  It is tried once (timeout 0): a
  second instance refuses at once with ``Busy`` (exit 75) naming the
  holder's pid, rather than queue behind the first.
* Signals.  Python runs a handler in the main thread between two bytecodes,
  and retries a blocking call that a signal interrupted (PEP 475) unless
  the handler raises: a handler that only set a flag would leave a
  ``select`` asleep until its timeout.  So ``Stop``'s handler sets the flag
  and writes a byte to a pipe whose read end every wait includes, and the
  wait ends at once.  It takes no lock (a second signal may arrive while
  the first handler runs), and only the main thread may install handlers
  (``signal.signal`` raises elsewhere): a daemon served from a test's
  thread is stopped with ``Stop.set`` instead.  The previous handlers come
  back when the daemon returns, since tests run daemons in-process.
  ``signal.set_wakeup_fd`` is not used: there is one per process, and
  ``bk admin services run`` needs it for SIGCHLD.
* Log lines.  A daemon logs to stderr, one line per record, tagged with
  its name; on the journal each line carries its priority
  (``bk.core.journal``).  The logger stays a ``Callable[[str], None]``, so
  tests pass ``list.append``.
* Readiness.  systemd starts a ``Type=notify`` unit's dependants once it
  sends ``READY=1`` to the datagram socket named in ``NOTIFY_SOCKET``
  (sd_notify(3); a leading ``@`` is the abstract namespace), and
  ``bk admin services run`` listens the same way.  ``ready`` logs the
  daemon's first line and sends it; without ``NOTIFY_SOCKET`` (a terminal,
  a ``Type=simple`` unit) nothing is sent.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator

from bk.core import journal
from bk.core.errors import Busy, ConfigError, WrongAccount

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)     # systemctl stop; Ctrl-C


# ------------------------------------------------------------------ log lines

def stderr_log(tag: str) -> Callable[[str], None]:
    """A daemon's logger: each message on stderr as ``TAG: line``, with its
    priority when the journal reads it."""
    def log(line: str) -> None:
        journal.write(sys.stderr, tag, line, os.environ, os.fstat)
    return log


# ------------------------------------------------------------------ the account

def account_name(uid: int) -> str:
    from bk.users import user_name

    return user_name(uid) or f"uid {uid}"


def check_account(want: int, *, command: str, role: str) -> None:
    """Refuse (exit 77) unless this process runs as ``want``: "COMMAND must
    run as the ROLE NAME (uid N), not as ...", with how to start it so."""
    me = os.geteuid()
    if me != want:
        name = account_name(want)
        raise WrongAccount(f"{command} must run as the {role} {name} (uid {want}), "
                           f"not as {account_name(me)} (uid {me})",
                           hint=f"systemd: User={name}; by hand: sudo -u {name} {command}")


def check_root(message: str, hint: str) -> None:
    """Refuse (exit 77) unless this process runs as root."""
    if os.geteuid() != 0:
        raise WrongAccount(message, hint=hint)


# ------------------------------------------------------------------ one instance

def refusal(text: str, hint: str, path: str) -> Callable[[int | None], Busy]:
    """The refusal of a second instance: ``TEXT (pid N)`` with the holder's
    pid when the kernel names it."""
    return lambda pid: Busy(text + (f" (pid {pid})" if pid else ""), hint=hint,
                            details={"path": path, "holder_pid": pid})


def instance_lock(directory: str, name: str, *, what: str, busy: Callable[[int | None], Busy],
                  log: Callable[[str], None] | None = None, uid: int | None = None,
                  create_mode: int | None = None, missing: Exception | None = None,
                  dirfd: int | None = None) -> int:
    """Take the daemon's lock ``directory/name`` (one try) and return its
    descriptor; the lock lasts until it is closed.  ``uid``: the account
    that owns the directory and the lock (this process's by default);
    ``create_mode``: make a missing directory so, else raise ``missing``;
    ``dirfd``: the directory already open (the caller keeps it).  ``log``
    hears each replacement of a lock file others could reach, as a
    warning; ``busy(pid)`` is the refusal when another instance holds it."""
    from bk.store.fsutil import Safety, open_dir
    from bk.store.lock import acquire

    safety = Safety(os.geteuid() if uid is None else uid)
    path = os.path.join(directory, name)
    own = dirfd is None
    if own:
        dirfd = open_dir(directory, safety, create_mode=create_mode)
        if dirfd is None:
            raise missing or ConfigError(f"{directory} does not exist")
    try:
        return acquire(dirfd, name, path, safety, timeout=0, what=what, busy=busy,
                       log=None if log is None else (lambda line: log(journal.warning(line))))
    finally:
        if own:
            os.close(dirfd)


# ------------------------------------------------------------------ signals

class Stop:
    """A daemon's stop flag: set by a stop signal (inside ``signals()``) or
    by ``set()`` from any thread, and final.  ``wait`` sleeps until it is
    set, a descriptor is readable or the timeout passes."""

    def __init__(self):
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._set = False
        self.signum: int | None = None           # the first signal that stopped it

    def set(self, signum: int | None = None) -> None:
        if self.signum is None:
            self.signum = signum
        self._set = True
        if self._w >= 0:
            try:
                os.write(self._w, b"x")
            except OSError:                      # full: a wake-up is waiting already
                pass

    def is_set(self) -> bool:
        return self._set

    def fileno(self) -> int:
        """The pipe's read end, readable once stopped: for a selector."""
        return self._r

    def wait(self, timeout: float | None, fds=()) -> list:
        """Sleep up to ``timeout`` seconds (None: until stopped or ready);
        the ready ones of ``fds``.  The pipe is never drained: once stopped,
        every wait returns at once."""
        ready, _, _ = select.select([self._r, *fds], [], [], None if timeout is None else max(0.0, timeout))
        return [fd for fd in ready if fd != self._r]

    @contextlib.contextmanager
    def signals(self, which=STOP_SIGNALS) -> Iterator[Stop]:
        """Stop on each of ``which`` while inside; the handlers before come
        back after.  Outside the main thread nothing is installed."""
        saved = {}
        if threading.current_thread() is threading.main_thread():
            for s in which:
                saved[s] = signal.signal(s, self._on_signal)
        try:
            yield self
        finally:
            for s, h in saved.items():
                signal.signal(s, h)

    def _on_signal(self, signum, frame) -> None:
        self.set(signum)

    def close(self) -> None:
        for fd in (self._r, self._w):
            if fd >= 0:
                os.close(fd)
        self._r = self._w = -1

    def __enter__(self) -> Stop:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------ readiness

def notify(message: str, environ=None) -> None:
    """Tell systemd (``Type=notify``) about our state; silent without it."""
    addr = (os.environ if environ is None else environ).get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto(message.encode(), addr)
    except OSError:
        pass


def ready(log: Callable[[str], None], line: str, environ=None) -> None:
    """The daemon serves: its first line in the log, then ``READY=1``."""
    log(line)
    notify("READY=1", environ)


def stopping(environ=None) -> None:
    """The daemon stops: ``STOPPING=1``, before it lets go of its work."""
    notify("STOPPING=1", environ)
