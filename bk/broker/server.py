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
most ``max_clients`` at once.  Service calls are serialised by the
dispatcher.  A connection costs the broker a thread and a slot whether or
not it ever sends anything, and a kernel-reported UID is the only identity a
connection has, so the limits below are per connection and per UID:

- Slots per UID.  One UID holds at most ``max_per_uid`` of the slots
  (default ``per_uid_limit(max_clients)``: ``max(4, max_clients // 4)``, 16
  of 64).  Its next connection is answered ``busy`` naming that quota and
  closed, before anything of it is read; other UIDs still get in.
- The whole broker full (``max_clients``) is answered ``busy`` likewise.
  Both refusals carry ``details.reason`` ``max_clients``: nothing was done,
  so a client retries them at once (``bk.ipc.client``); ``details.quota``
  says which limit it was (``per_uid`` or ``max_clients``).
- Arrival.  A request must arrive promptly: its first byte within
  ``arrival_timeout`` (default 5 s) of the connection opening, and a frame,
  once started, whole within ``min(frame_timeout, arrival_timeout)``.  Our
  own client connects, sends one frame at once and reads one reply, so only
  a stalled or hostile client is ever cut off.  The service call itself is
  not under this clock (it may wait ``lock_timeout_seconds`` for the ledger
  lock); the reply must be taken within ``frame_timeout``.
- Idle between requests.  After a reply a connection may wait up to
  ``idle_timeout`` (default 30 s) for its next request, but only while the
  broker has room: it looks every ``arrival_timeout`` and closes an idle
  connection once fewer than ``max_per_uid`` slots are free, so idle
  connections give way to callers who have something to ask.

So one user cannot deny others by holding connections: at most
``max_per_uid`` slots, each released within ``arrival_timeout`` unless it
is sending or being served.

Shutdown.  SIGTERM (what ``systemctl stop`` sends) and SIGINT set the stop
flag and wake the accept loop at once (``bk.daemon``: the frame the daemons
share, with the account check, the lock, the log lines and ``READY=1``).
The broker stops accepting, removes its
socket (only if the file is still the one it bound), lets requests already
being served finish and answer, and exits 0.  A write is committed by the
store's transaction before its reply is sent, so SIGKILL at any point leaves
either no change or a committed one.
"""

from __future__ import annotations

import grp
import os
import select
import selectors
import socket
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable

from bk import daemon
from bk.broker.handlers import GPU_SNAPSHOT_SECONDS, Dispatcher, Latest, Peer
from bk.core import journal
from bk.core.envelope import failure
from bk.core.errors import BkError, Busy, ConfigError, InvalidInput
from bk.core.record import dataclass
from bk.core.timegrid import counted
from bk.ipc import protocol
from bk.store.config import check_owned_dir  # noqa: F401  (the broker's start-up check; tests use it here)

_PEERCRED = struct.Struct("3i")      # struct ucred { pid_t pid; uid_t uid; gid_t gid; }
SUN_PATH_MAX = 107                   # sizeof(sockaddr_un.sun_path) - 1 on Linux
DEFAULT_MAX_CLIENTS = 64
DEFAULT_IDLE_TIMEOUT = 30.0
DEFAULT_FRAME_TIMEOUT = 10.0
DEFAULT_ARRIVAL_TIMEOUT = 5.0
BACKLOG = 128
SWITCH_INTERVAL = 0.0005             # seconds; see Broker.serve
FULL = "max_clients"                 # details.reason of the refusal a client may retry at once
PER_UID = "per_uid"                  # details.quota of the refusal of a UID at its quota


def per_uid_limit(max_clients: int) -> int:
    """The default number of slots one UID may hold: a quarter of the whole,
    so that three other users still get in when one holds all of its share,
    while one user's parallel scripts (16 at once with the default 64) are
    not turned away."""
    return min(max_clients, max(4, max_clients // 4))


def _readable(conn: socket.socket, timeout: float) -> bool:
    """Whether ``conn`` has a byte (or end-of-file) to read within ``timeout``.
    ``poll`` reports POLLHUP/POLLERR even unasked, so a peer that left, and
    our own SHUT_RD at shutdown, count as readable: the recv that follows
    sees the end and the connection closes."""
    p = select.poll()
    p.register(conn, select.POLLIN)
    return bool(p.poll(max(0, int(timeout * 1000))))


# systemd's journal timestamps each line; ours stay plain, with their
# priority when the journal reads them (bk.daemon, bk.core.journal).
log_stderr = daemon.stderr_log("bk broker")


def peer_of(conn: socket.socket) -> Peer:
    pid, uid, gid = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                     _PEERCRED.size))
    return Peer(pid, uid, gid)


# ------------------------------------------------------------- start-up checks

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
    daemon.check_account(uid, command="bk broker", role="service account")
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
        raise ConfigError(f"{path} is a socket of {daemon.account_name(st.st_uid)}, not of the service account; "
                          "the broker will not replace it", hint=f"check who created it; remove it: rm {path}")
    _refuse_if_answering(path)
    return True


# ------------------------------------------------------------- the server

KEEP_FREED = 32 << 20      # bytes glibc may keep of what the broker frees (and its largest heap block)


def keep_freed_memory() -> None:
    """Let glibc keep freed memory for reuse rather than hand it back.

    How glibc behaves.  A block of more than ``M_MMAP_THRESHOLD`` (128 KiB
    at first, raised to the size of the largest such block freed) is its
    own mmap, returned to the kernel when freed; free room at the top of
    a heap past ``M_TRIM_THRESHOLD`` is handed back too, and a request
    thread's heap (its own arena, not the main one) is trimmed eagerly.
    Memory the kernel gets back is faulted in again, a zeroed 4 KiB page
    at a time, by the next block that needs it.  Each commit at 10,000
    bookings reads the 2 MB ledger to compare it and builds the next
    2 MB document, on the thread that serves the request: both met fresh
    pages every time (about 1,000 faults, several ms on a busy machine,
    the gap between a commit through the broker and one in-process).

    The decision.  The broker, a long-running process that commits the
    same sizes again and again, lets glibc keep up to ``KEEP_FREED``
    (``mallopt``, through ctypes; nothing changes on another C library).
    Its RSS grows by at most that much (``benchmarks/broker.py --scale``
    prints it: within the 100 MiB target at 10,000 bookings)."""
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (ImportError, OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3          # glibc's malloc.h
    mallopt(m_trim_threshold, KEEP_FREED)
    mallopt(m_mmap_threshold, KEEP_FREED)


@dataclass
class Stats:
    connections: int = 0
    refused: int = 0
    requests: int = 0
    errors: int = 0
    over_quota: int = 0      # of ``refused``: a UID at its ``max_per_uid``


class Broker:
    """The socket server.  ``start()`` binds (after the lock and the stale
    check), ``serve()`` runs until ``stop()`` or SIGTERM, then cleans up."""

    def __init__(self, plan: Plan, dispatcher: Dispatcher, *, max_clients: int = DEFAULT_MAX_CLIENTS,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT, frame_timeout: float = DEFAULT_FRAME_TIMEOUT,
                 arrival_timeout: float = DEFAULT_ARRIVAL_TIMEOUT, max_per_uid: int | None = None,
                 drain_timeout: float = 30.0, log: Callable[[str], None] = log_stderr):
        if max_per_uid is not None and max_per_uid < 1:
            raise ValueError("max_per_uid must be at least 1")
        self.plan = plan
        self.dispatcher = dispatcher
        self.max_clients = max_clients
        self.max_per_uid = min(max_clients, max_per_uid or per_uid_limit(max_clients))
        self.idle_timeout = idle_timeout
        self.frame_timeout = frame_timeout
        self.arrival_timeout = arrival_timeout
        self.drain_timeout = drain_timeout
        self.log = log
        self.stats = Stats()
        self._slots = threading.BoundedSemaphore(max_clients)
        self._stop = daemon.Stop()
        self._active: dict[socket.socket, threading.Thread] = {}
        self._active_lock = threading.Lock()
        self._per_uid: dict[int, int] = {}         # slots held, by UID (under _active_lock)
        self._listener: socket.socket | None = None
        self._bound: tuple[int, int] | None = None
        self._lock_fd: int | None = None

    # -- start -------------------------------------------------------------

    def _take_lock(self) -> None:
        # A second broker should refuse, not queue.  A lock file others
        # could open, or one an intruder holds, is replaced (bk.store.lock),
        # so no user can keep the broker down.
        path = self.plan.socket_path + ".lock"
        where = os.path.dirname(path)
        self._lock_fd = daemon.instance_lock(
            where, os.path.basename(path), uid=self.plan.service_uid, what="the broker's lock", log=self.log,
            missing=ConfigError(f"the socket directory {where} does not exist", hint="sudo bk admin init makes it"),
            busy=daemon.refusal(f"another broker is running on {self.plan.socket_path}",
                                "see: systemctl status gpubk-broker", path))

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
        self._stop.set()

    def serve(self) -> Stats:
        if self._listener is None:
            self.start()
        # Every client thread shares one interpreter lock.  A thread back
        # from a system call (a commit makes dozens: open, write, fsync,
        # rename) waits for the lock up to the switch interval, 5 ms by
        # default, whenever another thread computes; a commit would then
        # pay that for each of its calls while someone's read runs.
        switch = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL)
        keep_freed_memory()
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        sel.register(self._stop, selectors.EVENT_READ)
        try:
            with self._stop.signals():
                daemon.ready(self.log, f"listening on {self.plan.socket_path} as "
                             f"{daemon.account_name(os.geteuid())} (pid {os.getpid()}, data {self.plan.data_dir})")
                try:
                    while not self._stop.is_set():
                        for key, _ in sel.select():
                            if key.fileobj is self._listener:
                                self._accept()
                finally:
                    sel.close()
                    daemon.stopping()
                    self._shutdown()
        finally:
            sys.setswitchinterval(switch)
        return self.stats

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:          # EMFILE and friends: keep serving the others
                self.log(journal.error(f"accept failed: {e}"))
                return
            self.stats.connections += 1
            try:
                peer = peer_of(conn)
            except OSError:
                conn.close()
                continue
            # The UID's quota first: a user at it is told so, even when the
            # broker as a whole is full too.
            with self._active_lock:
                held = self._per_uid.get(peer.uid, 0)
                if held < self.max_per_uid:
                    self._per_uid[peer.uid] = held + 1
            if held >= self.max_per_uid:
                self.stats.refused += 1
                self.stats.over_quota += 1
                self._refuse(conn, Busy(
                    f"uid {peer.uid} already has {counted(held, 'connection')} open to the broker, the most one "
                    f"user may hold (max_per_uid {self.max_per_uid} of max_clients {self.max_clients})",
                    hint="wait for this user's other bk commands to finish, or close the programs that "
                         "hold broker connections open", details={
                        "reason": FULL, "quota": PER_UID, "limit": self.max_per_uid, "uid": peer.uid}))
                continue
            if not self._slots.acquire(blocking=False):
                self._release_uid(peer.uid)
                self.stats.refused += 1
                self._refuse(conn, Busy(
                    f"the broker is serving its limit of {counted(self.max_clients, 'client')}",
                    hint="retry in a moment", details={"reason": FULL, "quota": FULL,
                                                       "limit": self.max_clients}))
                continue
            thread = threading.Thread(target=self._serve_conn, args=(conn, peer),
                                      name=f"bk-client-{peer.pid}", daemon=True)
            with self._active_lock:
                self._active[conn] = thread
            try:
                thread.start()
            except RuntimeError as e:        # no thread to be had: refuse this one, serve the rest
                self.log(journal.error(f"cannot start a client thread: {e}"))
                with self._active_lock:
                    self._active.pop(conn, None)
                self._slots.release()
                self._release_uid(peer.uid)
                self.stats.refused += 1
                self._refuse(conn, Busy("the broker cannot take another client now", hint="retry in a moment",
                                        details={"reason": FULL, "quota": "threads"}))

    def _refuse(self, conn: socket.socket, error: Busy) -> None:
        # Answered before the request is read, so a short send deadline: the
        # accept loop must not wait on a client that does not read.
        self._reply(conn, failure("broker", error), timeout=0.2)
        conn.close()

    def held(self) -> dict[int, int]:
        """Slots held now, by UID."""
        with self._active_lock:
            return dict(self._per_uid)

    def _release_uid(self, uid: int) -> None:
        with self._active_lock:
            left = self._per_uid.get(uid, 0) - 1
            if left > 0:
                self._per_uid[uid] = left
            else:
                self._per_uid.pop(uid, None)

    def _crowded(self) -> bool:
        """Fewer slots free than one user's quota: idle connections should go."""
        with self._active_lock:
            used = sum(self._per_uid.values())
        return self.max_clients - used < self.max_per_uid

    def _await_request(self, conn: socket.socket, first: bool) -> bool:
        """Wait for the first byte of the next request; False: close the
        connection.  A new connection gets ``arrival_timeout``; between
        requests a connection may idle for ``idle_timeout``, looked at every
        ``arrival_timeout`` and closed as soon as the broker is crowded."""
        if first:
            return _readable(conn, min(self.arrival_timeout, self.idle_timeout))
        deadline = time.monotonic() + self.idle_timeout
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if _readable(conn, min(left, self.arrival_timeout)):
                return True
            if self._crowded():
                return False
        return False

    def _reply(self, conn: socket.socket, envelope: dict, timeout: float | None = None) -> bool:
        from bk.core.errors import Internal

        # A reply is made after its commit: failing to send it must not read
        # as "nothing happened".  protocol.encode escapes what UTF-8 cannot
        # hold, so what is left is a reply over the frame limit or a bug
        # (something that is not JSON), and each is named as what it is.
        command = envelope.get("command", "broker")
        check = "; check with bk l whether the change was made" if envelope.get("ok") else ""
        try:
            frame = protocol.encode(envelope)
        except protocol.FrameTooLarge as e:
            self.log(journal.error(f"reply to {command} not sent: {e}"))
            frame = protocol.encode(failure(command, Internal(
                f"the broker's reply ({e.size} bytes) is over the frame limit of {e.limit} bytes" + check)))
        except (TypeError, ValueError) as e:
            self.log(journal.error(f"reply to {command} could not be encoded (a bug): {type(e).__name__}: {e}"))
            frame = protocol.encode(failure(command, Internal(
                "the broker could not encode its reply (a bug)" + check,
                hint="the administrator can read: journalctl -u gpubk-broker")))
        try:
            protocol.send_frame(conn, frame, self.frame_timeout if timeout is None else timeout)
            return True
        except (OSError, protocol.FrameTimeout):
            return False           # the client left or stopped reading: its loss only

    def _serve_conn(self, conn: socket.socket, peer: Peer) -> None:
        served = 0
        frame_deadline = min(self.frame_timeout, self.arrival_timeout)
        try:
            while not self._stop.is_set():
                if not self._await_request(conn, first=served == 0):
                    break
                served += 1
                try:
                    # A byte (or the end) is waiting, so the first recv returns at once.
                    body = protocol.recv_frame(conn, idle_timeout=self.arrival_timeout,
                                               frame_timeout=frame_deadline)
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
            self.log(journal.error(f"connection from pid {peer.pid} (uid {peer.uid}) failed: "
                                   f"{type(exc).__name__}: {exc}"))
        finally:
            with self._active_lock:
                self._active.pop(conn, None)
            try:
                conn.close()
            except OSError:
                pass
            self._release_uid(peer.uid)
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
        self._stop.close()
        s = self.stats
        self.log(f"stopped after {counted(s.connections, 'connection')}, {counted(s.requests, 'request')} "
                 f"({s.errors} answered with an error, {s.refused} refused as over the limit, "
                 f"{s.over_quota} of them over the per-user quota)")

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
    """Take a new GPU snapshot every ``every`` seconds, off the request path.
    While ``bk m`` runs, each refresh reads the monitor's fresh snapshot file
    (``bk.service.telemetry.Telemetry.snapshot``) instead of asking the GPUs,
    so the broker never holds NVML open beside the monitor; when no monitor
    runs (or its file is stale or for other GPUs) it asks the backend."""
    def loop():
        while not stop.wait(every):
            try:
                latest.refresh()
            except Exception as e:  # a driver hiccup must not end the broker
                log(journal.warning(f"GPU snapshot failed: {type(e).__name__}: {e}"))
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
    ledger, _damage = _check_store(service)
    if os.path.lexists(plan.socket_path):
        _claimable(plan.socket_path, plan.service_uid)
    return CheckResult(plan, ledger)


def _check_store(service) -> tuple[str, list[str]]:
    """Read and validate the ledger as the broker's first transaction will
    (an invalid one with no valid backup raises IOFailure, exit 74), and
    refuse a configuration that disagrees with the policy the ledger bound
    at its first write: every write would fail, so the broker should not
    pretend to serve."""
    from bk.core.policy import policy_diff  # the rule the store applies at every write

    got = service.store.read()
    if got.source == "empty":
        return "empty (no booking yet)", []
    diff = policy_diff(got.state.policy, service.policy.bound())
    if diff.conflicts:
        raise ConfigError("the configuration disagrees with the policy bound in the ledger: "
                          + diff.describe(),
                          hint="put those values back in the configuration; the ledger keeps the policy "
                               "of its first write", details={"differences": diff.conflicts})
    words = f"valid (seq {got.state.seq}, {counted(len(got.state.reservations), 'reservation')}, from {got.source})"
    return words + "".join(f"; warning: {w}" for w in got.warnings), list(got.warnings)


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
            self.log(journal.warning("configuration changed " + ", ".join(changed) + "; restart the broker "
                                     "to apply them (the policy is reloaded now)"))
            settings = type(settings)(self.settings.locations, {**settings.values,
                                      **{k: self.settings[k] for k in changed}},
                                      settings.source, settings.explicit)
        self.settings = settings
        return open_service(self.env, self.plan, settings, self.telemetry)


def run(env: dict, *, max_clients: int = DEFAULT_MAX_CLIENTS, idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        frame_timeout: float = DEFAULT_FRAME_TIMEOUT, arrival_timeout: float = DEFAULT_ARRIVAL_TIMEOUT,
        max_per_uid: int | None = None, log: Callable[[str], None] = log_stderr) -> Stats:
    """Check, bind and serve until SIGTERM.  Raises BkError on refusal."""
    os.umask(0o022)
    settings = _load(env)
    plan = preflight(settings)
    service = open_service(env, plan, settings)
    words, damage = _check_store(service)
    log(journal.info(f"ledger: {words}") if not damage else journal.error(
        f"ledger: {words}; the first write replaces the ledger with that backup: to keep the bookings made "
        "after it, stop the broker and restore the ledger by hand first (sudo bk admin data recover "
        "--dry-run shows what the audit log records beyond it)"))
    latest = Latest(service.telemetry)
    latest.refresh()
    dispatcher = Dispatcher(service, log=log, reload=ConfigWatch(env, plan, settings, log, service.telemetry),
                            latest=latest)
    try:
        service.store.secure_lock()       # a ledger lock others could open: replaced now (and logged)
    except BkError as e:
        log(journal.warning(f"the ledger's lock was not checked at start: {e.message}"))
    broker = Broker(plan, dispatcher, max_clients=max_clients, idle_timeout=idle_timeout,
                    frame_timeout=frame_timeout, arrival_timeout=arrival_timeout, max_per_uid=max_per_uid,
                    drain_timeout=settings["lock_timeout_seconds"] + frame_timeout + 5, log=log)
    broker.start()
    stop = threading.Event()
    refresher(latest, stop, log, GPU_SNAPSHOT_SECONDS)
    try:
        return broker.serve()
    finally:
        stop.set()
