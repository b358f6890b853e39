"""``bk broker``: the Unix socket server that owns the shared ledger.

How the kernel tells us who is calling.  For a connected AF_UNIX stream
socket, ``getsockopt(SOL_SOCKET, SO_PEERCRED)`` returns the pid, uid and gid
of the process that called ``connect()``, recorded by the kernel at that
moment.  A client cannot choose them: a process can only connect as itself
(root aside, who may do anything anyway), and passing the connected socket
to another process keeps the credentials of the one that connected.  That
triple, not anything inside a request, is the caller's identity.

Who may connect.  Connecting to a socket file needs write permission on it
and search permission on every directory above it.  With ``access: all`` the
socket is 0666; with ``access: group`` it is 0660 in a directory that
``bk admin init`` made 2750 with that group, so a non-member cannot even
reach it.  The socket is bound under a temporary name, given its mode (and
group), then renamed into place: no client ever sees it with the wrong
permissions, and a stale socket is replaced atomically.

One broker per socket.  The broker holds ``flock(LOCK_EX)`` on
``SOCKET.lock`` for its whole life; the kernel drops the lock when the
process dies, however it dies.  A socket file left behind by a killed broker
is replaced only when it is provably dead and ours: we hold that lock, the
file is a socket owned by our account, and ``connect()`` to it is refused.
Anything else there (a regular file, a link, another account's socket, a
socket that answers) is left alone and the broker refuses to start.

Start-up refuses, with the error classes' exit statuses, when the config is
untrusted (78), the process is not the service account (77), the data or
socket directory has the wrong owner or mode (78), or another broker answers
(75).  ``bk broker --check`` runs the same checks without binding, for
systemd's ExecStartPre.

Concurrency.  The main thread only accepts; each client gets a thread, at
most ``max_clients`` at once (the next is told ``busy`` and closed).  Service
calls are serialised by the dispatcher.  Each connection has an idle timeout
between frames and a deadline for each frame and each reply, so a stalled or
malicious client holds one thread for a bounded time and nothing else.

Shutdown.  SIGTERM (what ``systemctl stop`` sends) and SIGINT set a flag and
wake the accept loop through a pipe.  The broker stops accepting, removes its
socket (only if the file is still the one it bound), lets requests already
being served finish and answer, and exits 0.  A write is committed by the
store's transaction before its reply is sent, so SIGKILL at any point leaves
either no change or a committed one.
"""

from __future__ import annotations

import grp
import os
import selectors
import signal
import socket
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable

from bk.broker.handlers import GPU_SNAPSHOT_SECONDS, Dispatcher, Latest, Peer
from bk.core.envelope import failure
from bk.core.errors import Busy, ConfigError, InvalidInput, WrongAccount
from bk.core.record import dataclass
from bk.ipc import protocol
from bk.store.config import check_owned_dir  # noqa: F401  (the broker's start-up check; tests use it here)

_PEERCRED = struct.Struct("3i")      # struct ucred { pid_t pid; uid_t uid; gid_t gid; }
SUN_PATH_MAX = 107                   # sizeof(sockaddr_un.sun_path) - 1 on Linux
DEFAULT_MAX_CLIENTS = 64
DEFAULT_IDLE_TIMEOUT = 30.0
DEFAULT_FRAME_TIMEOUT = 10.0
BACKLOG = 128
FULL = "max_clients"                 # details.reason of the refusal a client may retry at once


def log_stderr(line: str) -> None:
    # systemd's journal timestamps each line; keep ours plain.
    try:
        sys.stderr.write(f"bk broker: {line}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def peer_of(conn: socket.socket) -> Peer:
    pid, uid, gid = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                     _PEERCRED.size))
    return Peer(pid, uid, gid)


# ------------------------------------------------------------- start-up checks

def _account(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


@dataclass(frozen=True)
class Plan:
    """What the checks established; the broker serves from it."""

    config_file: str
    data_dir: str
    socket_path: str
    service_uid: int
    access: str
    gid: int | None          # the socket's group when access is 'group'


def preflight(settings) -> Plan:
    """Every start-up refusal except 'another broker answers'."""
    if settings.mode != "shared":
        raise ConfigError("bk broker runs only on a shared server; no trusted configuration was found",
                          hint="set it up with: sudo bk admin init (or point BK_CONFIG_FILE at it)")
    uid = settings["service_uid"]
    if uid is None:
        raise ConfigError(f"{settings.source}: service_uid is not set",
                          hint="add \"service_uid\" (see man 5 gpubk-config), or rerun: sudo bk admin init")
    if os.geteuid() != uid:
        raise WrongAccount(f"bk broker must run as the service account {_account(uid)} (uid {uid}), "
                           f"not as {_account(os.geteuid())} (uid {os.geteuid()})",
                           hint=f"systemd: User={_account(uid)}; by hand: sudo -u {_account(uid)} bk broker")
    path = settings["socket"]
    if len(os.fsencode(path)) > SUN_PATH_MAX:
        raise ConfigError(f"socket path {path} is longer than {SUN_PATH_MAX} bytes, the kernel's limit",
                          hint="choose a shorter path for 'socket'")
    check_owned_dir(settings.data_dir, uid, "data directory")
    check_owned_dir(os.path.dirname(path), uid, "socket directory")
    gid = None
    if settings["access"] == "group":
        try:
            gid = grp.getgrnam(settings["group"]).gr_gid
        except KeyError:
            raise ConfigError(f"{settings.source}: group {settings['group']!r} does not exist",
                              hint="create it (groupadd) or fix 'group'") from None
    return Plan(settings.source, settings.data_dir, path, uid, settings["access"], gid)


def answers(path: str, timeout: float = 1.0) -> bool:
    """True when something accepts connections at ``path`` (a live broker)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(timeout)
    try:
        s.connect(path)
        return True
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
        return False
    except OSError:
        # EAGAIN: the listener's backlog is full, so it is alive; a timeout
        # likewise.  Either way, not provably dead.
        return True
    finally:
        s.close()


def _refuse_if_answering(path: str) -> None:
    if answers(path):
        raise Busy(f"another broker already answers at {path}",
                   hint="see: systemctl status gpubk-broker")


def _claimable(path: str, uid: int) -> bool:
    """Whether ``path`` is free to bind: absent, or a dead socket of ours."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"{path} exists and is not a socket; the broker will not touch it",
                          hint="move it away, or choose another 'socket' path")
    if st.st_uid != uid:
        raise ConfigError(f"{path} is a socket of {_account(st.st_uid)}, not of the service account; "
                          "the broker will not replace it", hint=f"check who created it; remove it: rm {path}")
    _refuse_if_answering(path)
    return True


def _sd_notify(message: str) -> None:
    """Tell systemd (Type=notify) about our state; silent without it."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto(message.encode(), addr)
    except OSError:
        pass


# ------------------------------------------------------------- the server

@dataclass
class Stats:
    connections: int = 0
    refused: int = 0
    requests: int = 0
    errors: int = 0


class Broker:
    """The socket server.  ``start()`` binds (after the lock and the stale
    check), ``serve()`` runs until ``stop()`` or SIGTERM, then cleans up."""

    def __init__(self, plan: Plan, dispatcher: Dispatcher, *, max_clients: int = DEFAULT_MAX_CLIENTS,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT, frame_timeout: float = DEFAULT_FRAME_TIMEOUT,
                 drain_timeout: float = 30.0, log: Callable[[str], None] = log_stderr):
        self.plan = plan
        self.dispatcher = dispatcher
        self.max_clients = max_clients
        self.idle_timeout = idle_timeout
        self.frame_timeout = frame_timeout
        self.drain_timeout = drain_timeout
        self.log = log
        self.stats = Stats()
        self._slots = threading.BoundedSemaphore(max_clients)
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._active: dict[socket.socket, threading.Thread] = {}
        self._active_lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._bound: tuple[int, int] | None = None
        self._lock_fd: int | None = None

    # -- start -------------------------------------------------------------

    def _take_lock(self) -> None:
        from bk.store.lock import mark, take

        path = self.plan.socket_path + ".lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise ConfigError(f"cannot open the broker lock {path}: {e.strerror}",
                              hint="check the socket directory's owner and mode") from None
        try:
            # One try (timeout 0): a second broker should refuse, not queue.
            take(fd, path, timeout=0, busy=lambda pid: Busy(
                f"another broker is running on {self.plan.socket_path}"
                + (f" (pid {pid})" if pid else ""), hint="see: systemctl status gpubk-broker",
                details={"path": path, "holder_pid": pid}))
        except BaseException:
            os.close(fd)
            raise
        mark(fd)
        self._lock_fd = fd

    def _bind(self) -> socket.socket:
        path = self.plan.socket_path
        tmp = os.path.join(os.path.dirname(path), f".bk-broker.{os.getpid()}")
        if len(os.fsencode(tmp)) > SUN_PATH_MAX:
            raise ConfigError(f"the socket directory {os.path.dirname(path)} is too long a path",
                              hint=f"keep it under {SUN_PATH_MAX - 20} bytes")
        try:
            if stat.S_ISSOCK(os.lstat(tmp).st_mode):
                os.unlink(tmp)        # our own leftover: the name carries our pid
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(tmp)
            try:
                if self.plan.gid is not None and os.lstat(tmp).st_gid != self.plan.gid:
                    os.chown(tmp, -1, self.plan.gid)
            except PermissionError:
                raise ConfigError(f"cannot give the socket to group {self.plan.gid}: the socket "
                                  "directory does not pass its group on",
                                  hint="sudo bk admin init --access group --group G sets it up "
                                       "(directory mode 2750 with that group)") from None
            os.chmod(tmp, 0o660 if self.plan.access == "group" else 0o666)
            sock.listen(BACKLOG)
            os.rename(tmp, path)          # atomic: replaces a dead socket of ours
        except BaseException:
            sock.close()
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        st = os.lstat(path)
        self._bound = (st.st_dev, st.st_ino)
        return sock

    def start(self) -> None:
        self._take_lock()
        try:
            _claimable(self.plan.socket_path, self.plan.service_uid)
            self._listener = self._bind()
        except BaseException:
            self._release_lock()
            raise
        self._listener.setblocking(False)

    # -- serve -------------------------------------------------------------

    def stop(self) -> None:
        """Ask the server to stop; safe from any thread and from signal handlers."""
        self._stopping.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _on_signal(self, signum, frame) -> None:
        self.stop()

    def serve(self) -> Stats:
        if self._listener is None:
            self.start()
        old = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                old[sig] = signal.signal(sig, self._on_signal)
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        self.log(f"listening on {self.plan.socket_path} as {_account(os.geteuid())} "
                 f"(pid {os.getpid()}, data {self.plan.data_dir})")
        _sd_notify("READY=1")
        try:
            while not self._stopping.is_set():
                for key, _ in sel.select():
                    if key.fileobj is self._listener:
                        self._accept()
        finally:
            sel.close()
            _sd_notify("STOPPING=1")
            self._shutdown()
            for sig, handler in old.items():
                signal.signal(sig, handler)
        return self.stats

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:          # EMFILE and friends: keep serving the others
                self.log(f"accept failed: {e}")
                return
            self.stats.connections += 1
            try:
                peer = peer_of(conn)
            except OSError:
                conn.close()
                continue
            if not self._slots.acquire(blocking=False):
                self.stats.refused += 1
                self._reply(conn, failure("broker", Busy(
                    f"the broker is serving its limit of {self.max_clients} clients",
                    hint="retry in a moment", details={"reason": FULL})), timeout=0.2)
                conn.close()
                continue
            thread = threading.Thread(target=self._serve_conn, args=(conn, peer),
                                      name=f"bk-client-{peer.pid}", daemon=True)
            with self._active_lock:
                self._active[conn] = thread
            thread.start()

    def _reply(self, conn: socket.socket, envelope: dict, timeout: float | None = None) -> bool:
        try:
            frame = protocol.encode(envelope)
        except (protocol.FrameTooLarge, TypeError, ValueError) as e:
            self.log(f"reply could not be encoded: {e}")
            frame = protocol.encode(failure(envelope.get("command", "broker"), InvalidInput(
                "the reply would exceed the frame limit")))
        try:
            protocol.send_frame(conn, frame, self.frame_timeout if timeout is None else timeout)
            return True
        except (OSError, protocol.FrameTimeout):
            return False           # the client left or stopped reading: its loss only

    def _serve_conn(self, conn: socket.socket, peer: Peer) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    body = protocol.recv_frame(conn, idle_timeout=self.idle_timeout,
                                               frame_timeout=self.frame_timeout)
                except protocol.FrameTooLarge as e:
                    self._reply(conn, failure("broker", InvalidInput(
                        f"a frame of {e.size} bytes is over the limit of {e.limit} bytes")))
                    break
                except (protocol.FrameTimeout, protocol.ConnectionEnded, OSError):
                    break
                if body is None:
                    break
                reply = self.dispatcher.dispatch_frame(body, peer)
                with self._active_lock:          # counters shared by the client threads
                    self.stats.requests += 1
                    self.stats.errors += not reply.get("ok")
                if not self._reply(conn, reply):
                    break
        except Exception as exc:  # never let one connection's surprise escape its thread
            self.log(f"connection from pid {peer.pid} (uid {peer.uid}) failed: {type(exc).__name__}: {exc}")
        finally:
            with self._active_lock:
                self._active.pop(conn, None)
            try:
                conn.close()
            except OSError:
                pass
            self._slots.release()

    # -- stop --------------------------------------------------------------

    def _shutdown(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self._unlink_own_socket()
        # Wake readers blocked between frames (recv returns end-of-file after
        # SHUT_RD); a thread inside a request finishes it and answers first.
        with self._active_lock:
            active = list(self._active.items())
        for conn, _ in active:
            try:
                conn.shutdown(socket.SHUT_RD)
            except OSError:
                pass
        deadline = time.monotonic() + self.drain_timeout
        for _, thread in active:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._release_lock()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        s = self.stats
        def n(count: int, word: str) -> str:
            return f"{count} {word}" + ("" if count == 1 else "s")

        self.log(f"stopped after {n(s.connections, 'connection')}, {n(s.requests, 'request')} "
                 f"({s.errors} answered with an error, {s.refused} refused as over the limit)")

    def _unlink_own_socket(self) -> None:
        # Remove the socket only if it is still the file we bound: a successor
        # may already have replaced it, and its socket is not ours to remove.
        if self._bound is None:
            return
        try:
            st = os.lstat(self.plan.socket_path)
            if (st.st_dev, st.st_ino) == self._bound:
                os.unlink(self.plan.socket_path)
        except OSError:
            pass
        self._bound = None

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


# ------------------------------------------------------------- assembly

@dataclass
class CheckResult:
    plan: Plan
    ledger: str              # what the store's check said


def open_service(env: dict, plan: Plan, settings, telemetry=None):
    """The broker's one service: operations run here, on the shared ledger
    (``bk.service.open_host``).  ``telemetry`` is shared across configuration
    reloads, so a reload does not open the GPU backend again."""
    from bk.service import open_host

    return open_host(env, settings, service_uid=plan.service_uid, telemetry=telemetry)


def refresher(latest, stop: threading.Event, log: Callable[[str], None], every: float) -> threading.Thread:
    """Take a new GPU snapshot every ``every`` seconds, off the request path."""
    def loop():
        while not stop.wait(every):
            try:
                latest.refresh()
            except Exception as e:  # a driver hiccup must not end the broker
                log(f"GPU snapshot failed: {type(e).__name__}: {e}")
    th = threading.Thread(target=loop, name="gpu-snapshots", daemon=True)
    th.start()
    return th


def _load(env: dict):
    from bk.store.config import load
    from bk.store.paths import locate

    return load(locate(env))


def check(env: dict) -> CheckResult:
    """``bk broker --check``: everything ``run`` would refuse, without binding."""
    settings = _load(env)
    plan = preflight(settings)
    service = open_service(env, plan, settings)
    ledger = _check_store(service)
    if os.path.lexists(plan.socket_path):
        _claimable(plan.socket_path, plan.service_uid)
    return CheckResult(plan, ledger)


def _check_store(service) -> str:
    """Read and validate the ledger as the broker's first transaction will
    (an invalid one with no valid backup raises IOFailure, exit 74), and
    refuse a configuration that disagrees with the policy the ledger bound
    at its first write: every write would fail, so the broker should not
    pretend to serve."""
    from bk.core.policy import policy_diff  # the rule the store applies at every write

    got = service.store.read()
    if got.source == "empty":
        return "empty (no booking yet)"
    diff = policy_diff(got.state.policy, service.policy.bound())
    if diff.conflicts:
        raise ConfigError("the configuration disagrees with the policy bound in the ledger: "
                          + diff.describe(),
                          hint="put those values back in the configuration; the ledger keeps the policy "
                               "of its first write", details={"differences": diff.conflicts})
    words = f"valid (seq {got.state.seq}, {len(got.state.reservations)} reservations, from {got.source})"
    return words + "".join(f"; warning: {w}" for w in got.warnings)


class ConfigWatch:
    """Reload the policy when the administrator edits the configuration.

    Clients read the configuration on every run, the broker only at start:
    without this, `bk info` would show a new maximum length that the broker
    does not enforce until it restarts.  A stat per request is cheap; the
    file is re-read (and its trust re-checked) only when it changed.  What
    decides whom the broker trusts (data dir, socket, accounts, access) is
    fixed at start: a change there needs a restart, and is logged."""

    SECURITY = ("data_dir", "socket", "service_uid", "service_gid", "monitor_uid", "access", "group")

    def __init__(self, env: dict, plan: Plan, settings, log: Callable[[str], None], telemetry=None):
        self.env, self.plan, self.settings, self.log = env, plan, settings, log
        self.telemetry = telemetry
        self.seen = self._stamp()

    def _stamp(self):
        try:
            st = os.stat(self.plan.config_file)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def __call__(self):
        stamp = self._stamp()
        if stamp == self.seen:
            return None
        self.seen = stamp
        settings = _load(self.env)
        changed = [k for k in self.SECURITY if settings[k] != self.settings[k]]
        if changed:
            self.log("configuration changed " + ", ".join(changed) + "; restart the broker to "
                     "apply them (the policy is reloaded now)")
            settings = type(settings)(self.settings.locations, {**settings.values,
                                      **{k: self.settings[k] for k in changed}},
                                      settings.source, settings.explicit)
        self.settings = settings
        return open_service(self.env, self.plan, settings, self.telemetry)


def run(env: dict, *, max_clients: int = DEFAULT_MAX_CLIENTS, idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        frame_timeout: float = DEFAULT_FRAME_TIMEOUT, log: Callable[[str], None] = log_stderr) -> Stats:
    """Check, bind and serve until SIGTERM.  Raises BkError on refusal."""
    os.umask(0o022)
    settings = _load(env)
    plan = preflight(settings)
    service = open_service(env, plan, settings)
    log(f"ledger: {_check_store(service)}")
    latest = Latest(service.telemetry)
    latest.refresh()
    dispatcher = Dispatcher(service, log=log, reload=ConfigWatch(env, plan, settings, log, service.telemetry),
                            latest=latest)
    broker = Broker(plan, dispatcher, max_clients=max_clients, idle_timeout=idle_timeout,
                    frame_timeout=frame_timeout,
                    drain_timeout=settings["lock_timeout_seconds"] + frame_timeout + 5, log=log)
    broker.start()
    stop = threading.Event()
    refresher(latest, stop, log, GPU_SNAPSHOT_SECONDS)
    try:
        return broker.serve()
    finally:
        stop.set()
