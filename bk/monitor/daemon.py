"""The monitor loop: look, judge, fold, publish; until SIGTERM.

The facts that shape it:

* One writer per server.  The monitor holds ``flock(LOCK_EX)`` on
  ``<data_dir>/monitor/monitor.lock`` for its whole life (``bk.store.lock``:
  the kernel drops it when the process dies, however it dies), so a second
  ``bk m`` fails at once with exit 75 naming the holder's pid from
  ``/proc/locks``.  Two monitors would double every minute of usage history.
* The account.  On a shared server the snapshot steers placement for
  everyone, so readers believe only files owned by the monitor account
  (``monitor_uid``, else ``service_uid``); the monitor refuses to run as
  anyone else (exit 77), as ``bk broker`` does.  In private mode it runs as
  the user, in the user's data directory.
* Nothing a backend does ends the loop.  A driver call that raises, a lost
  GPU (NVML's gap ``nvml``), a fallback backend, a ledger that cannot be
  read or history that cannot be written make the heartbeat ``degraded``
  with a detail; the next sample tries again.  When a look fails outright
  no snapshot is written: the old one ages out (three intervals) and
  clients ask the GPUs themselves, rather than read "no processes".
* The ledger is read each sample through the store's read path, without
  its lock, and only when the file changed (its inode, size and mtime): a
  stat every two seconds, a parse per commit.
* Signals.  SIGTERM (systemctl stop) and SIGINT end the loop's wait at once
  (``bk.daemon.Stop``, the frame every daemon shares, with the account
  check, the lock, the log lines and readiness); the loop then
  flushes the open minute (``Folder.flush``) into the history, records
  ``stopped`` (fsync-ed) and exits 0.  SIGKILL or a crash records nothing:
  the heartbeat ages into ``stale``, and its pid no longer runs.
* Cadence.  Samples are due every ``interval_s`` on the monotonic clock;
  a sample that took longer than an interval skips the ticks it missed
  instead of sampling back to back.
* Activity.  Every sample judges each running booking (``bk.core.activity``:
  active, idle-held, empty or unknown) from its own processes, the GPUs'
  power against their learned idle baselines, and the CPU time of its
  processes' trees (``bk.gpu.procinfo.CpuTrees``, from /proc); the states
  and idle clocks are published in the snapshot (``activity``) and kept in
  ``activity.json`` once a minute and at a clean stop, so that a restart
  keeps the idle clocks (``bk.store.activity``).  The baselines also split
  each interval's energy between the bookings in the usage history.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from bk import daemon
from bk.core import journal
from bk.core.errors import BkError, ConfigError
from bk.core.record import dataclass, field
from bk.core.telemetry import Snapshot
from bk.core.timegrid import counted
from bk.store import snapshot as files

DEFAULT_INTERVAL = 2.0
USAGE_BACKLOG = 10_000            # minute records kept for a retry while history cannot be written


log_stderr = daemon.stderr_log("bk m")


def check_account(settings) -> None:
    """Shared mode: the process must be the monitor account (exit 77)."""
    if settings.mode != "shared":
        return
    want = files.monitor_owner(settings) if (settings["monitor_uid"] is not None
                                             or settings["service_uid"] is not None) else None
    if want is None:
        raise ConfigError(f"{settings.source}: neither monitor_uid nor service_uid is set",
                          hint="add \"service_uid\" (see man 5 gpubk-config), or rerun: sudo bk admin init")
    daemon.check_account(want, command="bk m", role="monitor account")


# ------------------------------------------------------------- one look

@dataclass
class Sample:
    """One look at the GPUs, judged.  ``snapshot`` is None when the
    backend gave nothing usable (nothing is published then)."""

    t: int
    snapshot: Snapshot | None
    attributions: dict
    reservations: list
    status: str                      # running, degraded or topology-mismatch
    detail: str | None
    problems: list = field(default_factory=list)
    sharers: dict = field(default_factory=dict)     # shared booking id -> uids it is shared with


class LedgerView:
    """The active bookings, re-read only when the ledger file changed."""

    def __init__(self, store):
        self.store = store
        self._stamp = None
        self.state = None

    def _stat(self):
        try:
            st = os.stat(self.store.paths.ledger)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def read(self):
        stamp = self._stat()
        if self.state is None or stamp is None or stamp != self._stamp:
            got = self.store.read()          # raises BkError: the caller keeps the last state
            self.state, self._stamp = got.state, stamp
        return self.state


def _attribute(snapshot: Snapshot, reservations, now: int, sharers: dict | None = None) -> dict:
    from bk.core.telemetry import attribute_all

    if sharers:
        from bk.core.sharing import expand

        reservations = expand(reservations, sharers)
    return attribute_all(snapshot, reservations, now)


def _sharers(reservations) -> dict:
    """Who each shared booking is shared with (issue 27), looked up only
    when a booking is: a sharer's process there is the booking's."""
    if not any(r.shared_with for r in reservations):
        return {}
    from bk.core.sharing import Sharing, sharers_map
    from bk.store.accounts import accounts

    return sharers_map(reservations, Sharing(accounts()))


def _blind(last: Snapshot, t: int) -> Snapshot:
    """The GPUs last seen, with nothing live: what a failed look knows."""
    from bk.core.models import GpuInfo

    gpus = tuple(GpuInfo(g.index, g.uuid, g.name, mem_total_mib=g.mem_total_mib) for g in last.gpus)
    return Snapshot(t, last.source, gpus, ("memory", "nvml", "processes", "temperature", "utilisation"),
                    last.simulated)


class Monitor:
    """The sampling, folding and publishing, without the loop, the lock or
    signals: tests drive ``step`` with a fake clock and fake backends."""

    def __init__(self, backend, ledger: Callable[[], object], directory: str, *,
                 clock: Callable[[], int], interval_s: float = DEFAULT_INTERVAL,
                 folder=None, usage=None, gpu_count: int | None = None,
                 log: Callable[[str], None] = log_stderr, pid: int | None = None,
                 tracker=None, cpu_trees=None, keep_activity: bool = False, exporter=None):
        self.backend = backend
        self.ledger = ledger
        self.directory = directory
        self.clock = clock
        self.interval_s = interval_s
        self.folder = folder
        self.usage = usage
        self.gpu_count = gpu_count           # the configuration's, when it fixes one
        self.log = log
        self.pid = os.getpid() if pid is None else pid
        self.started_at = clock()
        self.samples = 0
        self._last: Snapshot | None = None
        self._reservations: list = []
        self._pending: list = []              # minute records not yet written
        self._said: str | None = None         # the last problem logged, to log changes only
        self.tracker = tracker                # bk.core.activity.Tracker, or None: no activity states
        self.cpu_trees = cpu_trees            # bk.gpu.procinfo.CpuTrees (or a fake with .advance)
        self.keep_activity = keep_activity    # write activity.json (the daemon; not bk m --once)
        self._activity_at: int | None = None  # when activity.json was last written
        self._capacity: int | None = None     # the ledger policy's share slots per GPU
        self.activity_doc: dict | None = None # the latest sample's published activity
        self.exporter = exporter              # bk.monitor.exporter.Exporter, or None: no exports
        self._state = None                    # the ledger state of the latest look

    # -- looking

    def look(self) -> Sample:
        t = self.clock()
        problems: list[str] = []
        snap: Snapshot | None
        try:
            snap = self.backend.snapshot(t)
        except Exception as e:      # any driver surprise: degraded, never dead
            problems.append(f"the GPU backend failed: {getattr(e, 'message', None) or e}")
            snap = _blind(self._last, t) if self._last is not None else None
        if snap is not None:
            if "nvml" in snap.gaps:
                problems.append("the driver failed during this look")
            reason = getattr(snap, "reason", None) or getattr(self.backend, "reason", None)
            if reason:
                problems.append(reason)
        state = None
        try:
            state = self.ledger()
            self._state = state
            self._reservations = list(state.reservations)
            policy = getattr(state, "policy", None) or {}
            if isinstance(policy.get("max_shared_users"), int):
                self._capacity = policy["max_shared_users"]
        except BkError as e:
            problems.append(f"cannot read the ledger: {e.message}")
        status, detail = files.RUNNING, None
        expected = self._expected(state)
        if snap is not None and expected is not None and len(snap.gpus) != expected:
            status = files.MISMATCH
            detail = (f"the GPUs seen ({len(snap.gpus)}, from {snap.source}) differ from the "
                      f"{expected} the bookings are made for")
        if problems:
            if status == files.RUNNING:
                status = files.DEGRADED
            detail = "; ".join(([detail] if detail else []) + problems)
        sharers = _sharers(self._reservations)
        atts = _attribute(snap, self._reservations, t, sharers) if snap is not None else {}
        return Sample(t, snap, atts, self._reservations, status, detail, problems, sharers)

    def _expected(self, state) -> int | None:
        policy = getattr(state, "policy", None) if state is not None else None
        if policy and policy.get("gpu_count"):
            return int(policy["gpu_count"])
        return self.gpu_count

    # -- one step of the daemon

    def judge_activity(self, s: Sample) -> dict | None:
        """Advance every running booking's activity state by this sample;
        the snapshot's ``activity`` object."""
        if self.tracker is None or s.snapshot is None:
            return None
        atts = s.attributions
        if s.sharers:
            # A shared booking is in use when anyone it is shared with works on it.
            from bk.core.sharing import as_owner

            atts = as_owner(atts, s.snapshot, s.reservations, s.sharers, s.t)
        roots = self.tracker.roots(s.snapshot, atts, s.reservations, s.t)
        cpu = self.cpu_trees.advance(roots) if self.cpu_trees is not None else {}
        self.tracker.observe(s.t, s.snapshot, atts, s.reservations, cpu)
        return self.tracker.doc(s.snapshot, s.reservations)

    def step(self) -> Sample:
        s = self.look()
        try:
            activity = self.activity_doc = self.judge_activity(s)
        except Exception as e:      # a bug in the judgement must not cost the history or the snapshot
            activity = self.activity_doc = None
            s.status = files.DEGRADED if s.status == files.RUNNING else s.status
            s.detail = "; ".join(x for x in (s.detail, f"the activity state failed (a bug): "
                                             f"{type(e).__name__}: {e}") if x)
        closed = False
        if s.snapshot is not None:
            self._last = s.snapshot
            if self.folder is not None:
                baselines = self.tracker.baselines_by_index(s.snapshot) if self.tracker is not None else None
                done = self.folder.add(s.t, s.snapshot, s.attributions, s.reservations, baselines=baselines,
                                       capacity=self._capacity, sharers=s.sharers)
                closed = bool(done)
                self._pending.extend(done)
                if self.exporter is not None:
                    self.exporter.fold(done)
        self._write_usage(s)
        if self.keep_activity and (closed or self._activity_at is None or s.t - self._activity_at >= 60):
            self._save_activity(s)
        if s.snapshot is not None:
            try:
                files.write_snapshot(self.directory, s.snapshot, interval_s=self.interval_s,
                                     inventory_fingerprint=self._fingerprint(), attributions=s.attributions,
                                     activity=activity)
            except BkError as e:
                s.status = files.DEGRADED if s.status == files.RUNNING else s.status
                s.detail = "; ".join(x for x in (s.detail, f"cannot write the snapshot: {e.message}") if x)
        self.samples += 1
        if self.exporter is not None and self.exporter.due(s.t):
            self._export(s, activity)
        self._heartbeat(s.status, s.detail, s.t)
        if s.detail != self._said:
            line = s.detail or f"{s.status}: sampling every {self.interval_s:g} s"
            self.log(journal.warning(line) if s.status == files.DEGRADED else journal.info(line))
            self._said = s.detail
        return s

    def _export(self, s: Sample, activity: dict | None) -> None:
        """The exports of this minute (``bk.monitor.exporter``); a failure
        degrades the heartbeat, as a failed history write does."""
        snap = s.snapshot
        count = len(snap.gpus) if snap is not None and snap.gpus else (self.gpu_count or 1)
        beat = files.Heartbeat(s.status, self.pid, s.t, self.started_at, self.interval_s, s.detail, 0,
                               self.samples)
        try:
            problems = self.exporter.step(s.t, state=self._state, snapshot=snap, attributions=s.attributions,
                                          activity=activity, heartbeat=beat,
                                          policy=self.exporter.settings.policy(count))
        except Exception as e:          # a bug in an export must not cost the sample
            problems = [f"the exports failed (a bug): {type(e).__name__}: {e}"]
        if problems:
            s.status = files.DEGRADED if s.status == files.RUNNING else s.status
            s.detail = "; ".join(x for x in (s.detail, *problems) if x)

    def safe_step(self) -> Sample | None:
        """``step`` for the daemon: a surprise (a bug) is logged and recorded
        as ``degraded``, and the next tick tries again; it never ends the loop."""
        try:
            return self.step()
        except Exception as e:
            detail = f"a sample failed (a bug): {type(e).__name__}: {e}"
            self.log(journal.error(detail))
            self._said = detail
            self._heartbeat(files.DEGRADED, detail, self.clock())
            return None

    def _fingerprint(self) -> str | None:
        try:
            return self.backend.fingerprint()
        except Exception:
            return None

    def _write_usage(self, s: Sample | None) -> None:
        if self.usage is None or not self._pending:
            return
        try:
            self.usage.append(self._pending)
            self._pending = []
        except (BkError, OSError) as e:
            del self._pending[:-USAGE_BACKLOG]
            if s is not None:
                s.status = files.DEGRADED if s.status == files.RUNNING else s.status
                why = getattr(e, "message", None) or str(e)
                s.detail = "; ".join(x for x in (s.detail, f"cannot write usage history: {why}") if x)
            else:
                self.log(journal.error(f"usage history not written: {getattr(e, 'message', None) or e}"))

    def _save_activity(self, s: Sample | None) -> None:
        """Keep the idle clocks and baselines (``activity.json``)."""
        if not self.keep_activity or self.tracker is None:
            return
        t = s.t if s is not None else self.clock()
        from bk.store import activity as store

        try:
            store.write(self.directory, self.tracker.to_store(), t)
            self._activity_at = t
        except BkError as e:
            if s is not None:
                s.status = files.DEGRADED if s.status == files.RUNNING else s.status
                s.detail = "; ".join(x for x in (s.detail, f"cannot keep the idle clocks: {e.message}") if x)
            else:
                self.log(f"idle clocks not kept: {e.message}")

    def _heartbeat(self, status: str, detail: str | None, t: int, *, sync: bool = False) -> None:
        doc = files.heartbeat_doc(status=status, pid=self.pid, started_at=self.started_at, updated_at=t,
                                  interval_s=self.interval_s, detail=detail, samples=self.samples)
        try:
            files.write_heartbeat(self.directory, doc, sync=sync)
        except BkError as e:
            self.log(journal.error(f"cannot write the heartbeat: {e.message}"))

    def finish(self) -> int:
        """The clean stop: the open minute into the history, ``stopped``
        recorded.  Returns the number of minute records flushed."""
        flushed = 0
        if self.folder is not None:
            tail = self.folder.flush()
            flushed = len(tail)
            self._pending.extend(tail)
        self._write_usage(None)
        self._save_activity(None)
        self._heartbeat(files.STOPPED, f"stopped by signal after {counted(self.samples, 'sample')}", self.clock(),
                        sync=True)
        return flushed


# ------------------------------------------------------------- assembly

@dataclass
class RunStats:
    samples: int
    flushed: int
    pid: int


def _settings(env: dict):
    from bk.store.config import load
    from bk.store.paths import locate

    return load(locate(env))


def _take_lock(directory: str, log: Callable[[str], None] = log_stderr) -> int:
    path = os.path.join(directory, files.LOCK_FILE)
    return daemon.instance_lock(directory, files.LOCK_FILE, what="the monitor's lock", log=log,
                                create_mode=files.DIR_MODE,
                                busy=daemon.refusal("another monitor is running here",
                                                    "see: systemctl status gpubk-monitor, or bk m status", path))


def _prepare_dir(settings, directory: str) -> None:
    """Private mode: make the data directory as the store would (0700), so
    a monitor started before the first booking does not leave it 0755."""
    if settings.mode == "private" and not os.path.isdir(settings.data_dir):
        try:
            os.makedirs(settings.data_dir, 0o700, exist_ok=True)
        except OSError as e:
            from bk.store.fsutil import io_error

            raise io_error(e, "creating", settings.data_dir) from None


def _open_usage(settings):
    from bk.store.usage import UsageStore

    # Owned by the monitor account on a shared server, 0755/0644 so that
    # every user's bk u reads it; seals, roll-ups and retention happen in
    # append when a new day begins.
    return UsageStore.for_settings(settings)


def build(env: dict, settings, *, interval_s: float, clock: Callable[[], int], backend=None,
          log: Callable[[str], None] = log_stderr, proc_root: str = "/proc") -> Monitor:
    """The monitor for this server: its backend, ledger, history and
    activity tracker."""
    from bk.core.usage import Folder
    from bk.gpu import open_backend
    from bk.gpu.procinfo import CpuTrees
    from bk.service.app import make_store

    if backend is None:
        backend = open_backend(env, settings["gpu_count"], simulated=settings["simulated_gpus"])
    store = make_store(settings, clock_fn=clock, owner_uid=None, capacity=settings["max_shared_users"])
    view = LedgerView(store)
    directory = files.monitor_dir(settings)
    usage = _open_usage(settings)
    return Monitor(backend, view.read, directory, clock=clock, interval_s=interval_s,
                   folder=Folder(60, interval_s=max(1, round(interval_s)), capacity=settings["max_shared_users"]),
                   usage=usage, gpu_count=settings["gpu_count"], log=log,
                   tracker=open_tracker(settings, directory, interval_s), cpu_trees=CpuTrees(proc_root),
                   keep_activity=True, exporter=open_exporter(settings, usage, store))


def open_exporter(settings, usage, store):
    """The exports the configuration asks for (None when it names no
    directory): the textfile, the calendars, the page of the week."""
    from bk.monitor.exporter import Exporter

    exporter = Exporter(settings, usage=usage, store=store, tz=_local_tz())
    return exporter if exporter.enabled else None


def _local_tz():
    from bk import clock

    return clock.local_tz()


def open_tracker(settings, directory: str, interval_s: float):
    """The activity tracker with the configuration's thresholds and what
    the previous monitor kept in ``activity.json``."""
    from bk.core.activity import Tracker
    from bk.store import activity as store

    tracker = Tracker(interval_s, nudge_minutes=settings["idle_nudge_minutes"],
                      policy_release_minutes=settings["idle_release_minutes"])
    tracker.load(store.read(directory, owner=files.monitor_owner(settings)))
    return tracker


def run(env: dict, *, interval_s: float = DEFAULT_INTERVAL, log: Callable[[str], None] = log_stderr,
        backend=None, monotonic: Callable[[], float] = time.monotonic) -> RunStats:
    """Check the account, take the lock, sample until SIGTERM or SIGINT."""
    from bk import clock

    os.umask(0o022)
    settings = _settings(env)
    check_account(settings)
    directory = files.monitor_dir(settings)
    _prepare_dir(settings, directory)
    lock_fd = _take_lock(directory, log)
    try:
        with daemon.Stop() as stop, stop.signals():
            monitor = build(env, settings, interval_s=interval_s, clock=clock.now, backend=backend, log=log)
            daemon.ready(log, f"pid {os.getpid()}: sampling {getattr(monitor.backend, 'name', 'GPUs')} every "
                         f"{interval_s:g} s into {directory}")
            due = monotonic()
            while not stop.is_set():
                monitor.safe_step()
                due += interval_s
                now = monotonic()
                if now > due:                  # a slow look: skip the ticks it missed
                    due += ((now - due) // interval_s + 1) * interval_s
                stop.wait(due - monotonic())
            daemon.stopping()
            flushed = monitor.finish()
            log(f"stopped after {counted(monitor.samples, 'sample')}; "
                f"{counted(flushed, 'partial minute record')} flushed")
            return RunStats(monitor.samples, flushed, os.getpid())
    finally:
        os.close(lock_fd)


# ------------------------------------------------------------- bk m --once, bk m status

@dataclass(frozen=True)
class OnceResult:
    sample: Sample
    interval_s: float
    fingerprint: str | None

    def to_json(self) -> dict:
        s = self.sample
        doc = (files.snapshot_doc(s.snapshot, interval_s=self.interval_s, inventory_fingerprint=self.fingerprint,
                                  attributions=s.attributions) if s.snapshot is not None else {"gpus": None})
        doc.pop("schema", None)
        doc.pop("pid", None)
        doc["taken_at"] = doc.pop("taken_at_iso", None)
        doc["status"], doc["detail"] = s.status, s.detail
        return doc


def once(env: dict, *, backend=None, clock_fn: Callable[[], int] | None = None) -> OnceResult:
    """One sample, judged, printed by the caller; nothing is written
    (no lock, no snapshot, no heartbeat, no history)."""
    from bk import clock
    from bk.gpu import open_backend
    from bk.service.app import make_store

    settings = _settings(env)
    clock_fn = clock_fn or clock.now
    backend = backend or open_backend(env, settings["gpu_count"], simulated=settings["simulated_gpus"])
    store = make_store(settings, clock_fn=clock_fn, owner_uid=None, capacity=settings["max_shared_users"])
    m = Monitor(backend, LedgerView(store).read, files.monitor_dir(settings), clock=clock_fn,
                gpu_count=settings["gpu_count"], log=lambda line: None)
    sample = m.look()
    return OnceResult(sample, m.interval_s, m._fingerprint())


def heartbeat(env: dict, *, now: int | None = None) -> files.Heartbeat:
    """``bk m status``: the heartbeat as every reader sees it."""
    from bk import clock

    settings = _settings(env)
    return files.read_heartbeat(files.monitor_dir(settings), clock.now() if now is None else now,
                                owner=files.monitor_owner(settings))
