"""``bk admin services run``: the broker and the monitor in the foreground,
for machines without systemd (a container's entry point, LXC, WSL).

What systemd would do, and what this does instead.  It reads the two
installed units (``bk.admin.unitfile``) and runs each as systemd would:
as its ``User=`` and ``Group=`` with the account's supplementary groups
(systemd calls initgroups(3) for ``User=``), with ``UMask=``, in ``/``,
with systemd's environment for a service (its default ``PATH``, the
account's ``HOME``, ``USER``, ``LOGNAME``, ``SHELL``, ``LANG``, and
``RUNTIME_DIRECTORY``) plus the unit's ``Environment=`` lines and nothing
of the caller's but ``LANG`` and ``TZ``.  On the real root it makes the
``RuntimeDirectory=`` (``/run/gpubk``) with the unit's owner and mode
before a start, as systemd does after every boot.  ``ExecStartPre=`` runs
before each start of its service.  The sandbox (``ProtectSystem=`` and
the rest) is not reproduced: that needs systemd, or the container itself.

Order.  The broker first; the monitor once the broker said ``READY=1``
(``Type=notify``; the monitor's unit is ordered ``After=`` it).  The
notification socket is an abstract Unix datagram socket with
``SO_PASSCRED``, so the kernel attaches the sender's pid to each message
and only the broker's own process (``NotifyAccess=main``) is believed.
Stopping goes the other way: the monitor, then the broker.

Signals.  SIGTERM (``docker stop``), SIGINT (Ctrl-C) and SIGHUP stop both:
SIGTERM to each, ``TimeoutStopSec=`` to finish, then SIGKILL; every child
is reaped and the run exits 0.  The children run in their own sessions, so
a Ctrl-C reaches them only through this order.  As a container's PID 1 it
also reaps any orphan that is re-parented to it.  Signal handlers only
write to a pipe (``signal.set_wakeup_fd``); the loop ``select``s on it, so
no child's exit or signal waits for a timer.

A child that dies.  The unit's ``Restart=on-failure`` is followed: a
failed exit (a status other than 0, or a signal other than SIGTERM, SIGINT,
SIGHUP, SIGPIPE) is restarted after ``RestartSec=``, unless the status is
in ``RestartPreventExitStatus=`` (75, 77, 78: what a restart cannot fix)
or the unit's start limit is reached (``StartLimitBurst=`` starts within
``StartLimitIntervalSec=``).  Each exit and restart is logged on stderr.
A service that ends for good ends the run: the other is stopped, and the
run exits with the service's own status when it is one of 75, 77 and 78,
else 69 (unavailable), so a container's restart policy takes over.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

from bk.admin import unitfile, units
from bk.admin.layout import Layout
from bk.core.errors import (
    EXIT_CONFIG,
    EXIT_TEMPFAIL,
    EXIT_UNAVAILABLE,
    EXIT_WRONG_ACCOUNT,
    BkError,
    PermissionDenied,
)
from bk.core.record import dataclass, field

# systemd's PATH for services (systemd.exec(5), "$PATH"; a distribution
# without merged /usr adds /sbin:/bin, which changes nothing for bk).
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Exits systemd counts as clean for Restart=on-failure (systemd.service(5)).
CLEAN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE)
CANNOT_FIX = (EXIT_TEMPFAIL, EXIT_WRONG_ACCOUNT, EXIT_CONFIG)
START_TIMEOUT = 90.0              # systemd's default TimeoutStartSec=


def log_stderr(line: str) -> None:
    try:
        sys.stderr.write(f"bk admin services run: {line}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


@dataclass
class Child:
    """One unit's process and its history."""

    unit: str
    svc: unitfile.Service
    uid: int
    gid: int
    groups: list[int]
    env: dict[str, str]
    switch: bool                                   # change to User=/Group= (running as root)
    pid: int | None = None
    ready: bool = False
    started_at: float = 0.0
    starts: list[float] = field(default_factory=list)
    restart_at: float | None = None
    last_exit: int | None = None                   # waitstatus_to_exitcode: -N for signal N
    timed_out: bool = False
    ended: bool = False                            # for good: no more restarts

    def to_json(self) -> dict:
        return {"unit": self.unit, "user": self.svc.user, "pid": self.pid, "starts": len(self.starts),
                "last_exit": self.last_exit}


@dataclass
class RunResult:
    status: str                                    # stopped | failed
    exit_code: int
    reason: str
    services: list[dict]

    def to_json(self) -> dict:
        return {"status": self.status, "reason": self.reason, "services": self.services}


def _account(uid: int, gid: int, switch: bool):
    import pwd

    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return None, [gid]
    groups = os.getgrouplist(pw.pw_name, gid) if switch else os.getgroups()
    return pw, groups


def _environment(svc: unitfile.Service, pw, runtime: str | None, caller: dict) -> dict[str, str]:
    env = {"PATH": SYSTEMD_PATH, "LANG": caller.get("LANG") or "C.UTF-8"}
    if caller.get("TZ"):
        env["TZ"] = caller["TZ"]
    if pw is not None:
        env |= {"HOME": pw.pw_dir, "USER": pw.pw_name, "LOGNAME": pw.pw_name, "SHELL": pw.pw_shell}
    if runtime:
        env["RUNTIME_DIRECTORY"] = runtime
    env |= svc.environment
    return env


def children(layout: Layout, caller: dict, euid: int) -> list[Child]:
    """The broker's and the monitor's units, resolved: who runs them, with what."""
    out = []
    for unit in units.SYSTEM_UNITS:
        path = os.path.join(layout.unit_dir, unit)
        svc = unitfile.load(path)
        uid = unitfile.uid_of(svc.user, f"{path}: User=")
        gid = unitfile.gid_of(svc.group, uid, f"{path}: Group=")
        switch = euid == 0
        if not switch and euid != uid:
            raise PermissionDenied(f"{unit} runs as uid {uid}; bk admin services run must be root to "
                                   f"start it as that account (or run as it)",
                                   hint="sudo bk admin services run")
        pw, groups = _account(uid, gid, switch)
        runtime = _runtime_path(layout, svc)
        out.append(Child(unit, svc, uid, gid, groups, _environment(svc, pw, runtime, caller), switch))
    return out


def _runtime_path(layout: Layout, svc: unitfile.Service) -> str | None:
    """``RuntimeDirectory=`` on the real root; under a staging root the
    installer made the socket directory the staged config names."""
    if layout.root != "/" or not svc.runtime_directory:
        return None
    return os.path.join("/run", svc.runtime_directory)


def _make_runtime(child: Child) -> None:
    path = child.env.get("RUNTIME_DIRECTORY")
    if not path or not child.switch:
        return
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    import stat

    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        from bk.core.errors import ConfigError

        raise ConfigError(f"{path} is not a directory", hint=f"move it away; {child.unit} needs it")
    os.chown(path, child.uid, child.gid, follow_symlinks=False)
    os.chmod(path, child.svc.runtime_directory_mode)


class Supervisor:
    """The loop, apart from the CLI; tests drive it with real processes."""

    def __init__(self, kids: list[Child], *, log: Callable[[str], None] = log_stderr,
                 monotonic: Callable[[], float] = time.monotonic, out_fd: int | None = None):
        self.kids = kids
        self.log = log
        self.monotonic = monotonic
        self.out_fd = sys.stderr.fileno() if out_fd is None else out_fd
        self.stopping: list[int] = []          # the signals that asked us to stop
        self.ended: Child | None = None        # the service that ended for good, ending the run
        self.reason = ""
        self._shutting = False
        self._wake_r = self._wake_w = -1
        self._notify: socket.socket | None = None
        self._notify_addr = ""

    # -- processes

    def _spawn_args(self, child: Child) -> dict:
        args = {"env": child.env, "cwd": "/", "stdin": subprocess.DEVNULL, "stdout": self.out_fd,
                "stderr": self.out_fd, "umask": child.svc.umask, "close_fds": True}
        if child.switch:
            args |= {"user": child.uid, "group": child.gid, "extra_groups": child.groups}
        return args

    def _pre(self, child: Child) -> int | None:
        """ExecStartPre= lines; the first failing status, else None."""
        for argv, may_fail in zip(child.svc.exec_start_pre, child.svc.pre_may_fail, strict=True):
            try:
                p = subprocess.run(argv, timeout=START_TIMEOUT, check=False, **self._spawn_args(child))
            except subprocess.TimeoutExpired:
                self.log(f"{child.unit}: {' '.join(argv)} did not finish within {START_TIMEOUT:g} s")
                return EXIT_UNAVAILABLE
            except OSError as e:
                self.log(f"{child.unit}: cannot run {argv[0]}: {e.strerror}")
                return EXIT_UNAVAILABLE
            if p.returncode != 0 and not may_fail:
                self.log(f"{child.unit}: {' '.join(argv)} exited with status {p.returncode}")
                return p.returncode
        return None

    def start(self, child: Child) -> None:
        now = self.monotonic()
        child.restart_at, child.ready, child.timed_out = None, False, False
        child.starts.append(now)
        try:
            _make_runtime(child)
        except (BkError, OSError) as e:
            self.log(f"{child.unit}: cannot make its runtime directory: {getattr(e, 'message', None) or e}")
            self._exited(child, EXIT_CONFIG)
            return
        failed = self._pre(child)
        if failed is not None:
            self._exited(child, failed)
            return
        if self.stopping:                  # asked to stop while ExecStartPre= ran
            return
        env = dict(child.env)
        if child.svc.type == "notify":
            env["NOTIFY_SOCKET"] = self._notify_addr
        args = self._spawn_args(child) | {"env": env, "start_new_session": True}
        try:
            proc = subprocess.Popen(child.svc.exec_start, **args)
        except OSError as e:
            self.log(f"{child.unit}: cannot start {child.svc.exec_start[0]}: {e.strerror}")
            self._exited(child, EXIT_UNAVAILABLE)
            return
        # Reaped with os.waitpid below, not by Popen: say so, so that Popen
        # never waits for (or reports) a pid this loop already collected.
        proc.returncode = 0
        child.pid, child.started_at = proc.pid, now
        child.ready = child.svc.type != "notify"
        self.log(f"{child.unit}: started pid {proc.pid} as {child.svc.user}: {' '.join(child.svc.exec_start)}")

    def _exited(self, child: Child, code: int) -> None:
        """``child`` ended with ``code`` (waitstatus_to_exitcode): restart it, or end the run."""
        child.pid, child.ready, child.last_exit = None, False, code
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        if self.stopping or self._shutting:
            return
        failed = child.timed_out or (code > 0) or (code < 0 and -code not in CLEAN_SIGNALS)
        if not failed:
            self._end(child, f"{child.unit} {how} on its own")
            return
        if code in child.svc.prevent_restart:
            self._end(child, f"{child.unit} {how}, which a restart cannot fix")
            return
        if child.svc.restart not in ("on-failure", "always", "on-abnormal"):
            self._end(child, f"{child.unit} {how} (Restart={child.svc.restart})")
            return
        now = self.monotonic()
        recent = [t for t in child.starts if now - t < child.svc.start_limit_interval]
        if len(recent) >= child.svc.start_limit_burst:
            self._end(child, f"{child.unit} {how}; it started {len(recent)} times within "
                             f"{child.svc.start_limit_interval:g} s, its start limit")
            return
        child.restart_at = now + child.svc.restart_sec
        self.log(f"{child.unit} {how}; restarting in {child.svc.restart_sec:g} s "
                 f"(start {len(recent) + 1} of {child.svc.start_limit_burst} within "
                 f"{child.svc.start_limit_interval:g} s)")

    def _end(self, child: Child, why: str) -> None:
        child.ended = True
        if self.ended is None:
            self.ended = child
            self.reason = why
            self.log(why + "; stopping the others")

    def reap(self) -> None:
        """Collect every exited child (our services, and any orphan given
        to us as PID 1)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for child in self.kids:
                if child.pid == pid:
                    self._exited(child, os.waitstatus_to_exitcode(status))

    # -- notifications

    def _open_notify(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        name = f"gpubk-services-run/{os.getpid()}/{os.urandom(8).hex()}"
        s.bind("\0" + name)
        self._notify, self._notify_addr = s, "@" + name

    def _read_notify(self) -> None:
        import struct

        assert self._notify is not None
        size = struct.calcsize("3i")
        while True:
            try:
                data, anc, _flags, _addr = self._notify.recvmsg(4096, socket.CMSG_SPACE(size))
            except (BlockingIOError, InterruptedError):
                return
            pid = None
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= size:
                    pid = struct.unpack("3i", payload[:size])[0]
            for child in self.kids:
                if child.pid is not None and child.pid == pid and b"READY=1" in data.split(b"\n"):
                    if not child.ready:
                        child.ready = True
                        self.log(f"{child.unit}: ready")

    # -- the loop

    def _on_signal(self, signum, frame) -> None:
        if signum != signal.SIGCHLD:
            self.stopping.append(signum)

    def _wait(self, timeout: float | None) -> None:
        fds = [self._wake_r] + ([self._notify] if self._notify is not None else [])
        try:
            ready, _, _ = select.select(fds, [], [], None if timeout is None else max(0.0, timeout))
        except InterruptedError:
            ready = []
        if self._wake_r in ready:
            try:
                while os.read(self._wake_r, 512):
                    pass
            except BlockingIOError:
                pass
        if self._notify is not None and self._notify in ready:
            self._read_notify()

    def run(self) -> RunResult:
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)
        old = {s: signal.signal(s, self._on_signal) for s in handled}
        old_fd = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        try:
            if any(c.svc.type == "notify" for c in self.kids):
                self._open_notify()
            try:
                self._loop()
            finally:
                self._stop_all()           # whatever ended the loop, no child outlives it
        finally:
            signal.set_wakeup_fd(old_fd)
            for s, h in old.items():
                signal.signal(s, h)
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            if self._notify is not None:
                self._notify.close()
        services = [c.to_json() for c in self.kids]
        if self.ended is not None:
            code = self.ended.last_exit
            exit_code = code if code in CANNOT_FIX else EXIT_UNAVAILABLE
            return RunResult("failed", exit_code, self.reason, services)
        sig = signal.Signals(self.stopping[0]).name if self.stopping else "a signal"
        return RunResult("stopped", 0, f"stopped on {sig}", services)

    def _loop(self) -> None:
        first, *rest = self.kids
        self.start(first)
        waiting = list(rest)                # started once the one before is ready
        while not self.stopping and self.ended is None:
            self.reap()
            now = self.monotonic()
            deadlines = []
            for child in self.kids:
                if self.stopping or self.ended is not None:
                    break
                if child.restart_at is not None:
                    if now >= child.restart_at:
                        self.start(child)
                    else:
                        deadlines.append(child.restart_at)
                elif child.pid is not None and not child.ready and not child.timed_out:
                    due = child.started_at + START_TIMEOUT
                    if now >= due:
                        self.log(f"{child.unit}: not ready within {START_TIMEOUT:g} s; killing it")
                        child.timed_out = True
                        os.kill(child.pid, signal.SIGKILL)
                    else:
                        deadlines.append(due)
            if waiting and self.ended is None and not self.stopping and self.kids[0].ready:
                self.start(waiting.pop(0))
                continue
            if self.stopping or self.ended is not None:
                break
            self._wait(min(deadlines) - self.monotonic() if deadlines else None)

    def _stop_all(self) -> None:
        """SIGTERM to each running service, the last started first; SIGKILL
        after its TimeoutStopSec=; everything reaped."""
        self._shutting = True
        for child in reversed(self.kids):
            child.restart_at = None
            if child.pid is None:
                continue
            pid = child.pid
            self.log(f"{child.unit}: stopping pid {pid}")
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = self.monotonic() + child.svc.timeout_stop
            killed = False
            while child.pid is not None:
                self.reap()
                if child.pid is None:
                    break
                left = deadline - self.monotonic()
                if left <= 0 and not killed:
                    self.log(f"{child.unit}: pid {pid} did not stop within {child.svc.timeout_stop:g} s; SIGKILL")
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    killed = True
                self._wait(None if killed else left)
            self.log(f"{child.unit}: pid {pid} " + (f"exited with status {child.last_exit}"
                                                     if (child.last_exit or 0) >= 0
                                                     else f"ended by signal {-(child.last_exit or 0)}"))
        self.reap()


def run(layout: Layout, env: dict, *, log: Callable[[str], None] = log_stderr,
        euid: int | None = None) -> RunResult:
    """``bk admin services run``: both services until a signal, or until one ends for good."""
    kids = children(layout, env, os.geteuid() if euid is None else euid)
    log(f"running {', '.join(c.unit for c in kids)} from {layout.unit_dir} (pid {os.getpid()}); "
        "SIGTERM or Ctrl-C stops them")
    return Supervisor(kids, log=log).run()
