"""What the screen shows, read off the draw path.

A ``World`` is one consistent look: the committed ledger, the notices, the
GPUs' live rows, the monitor's heartbeat and the worker's state, all at one
``now``.  ``Loader`` makes one in a background thread once a second and
publishes it by replacing one attribute (a reference store is atomic in
CPython), so the draw loop never waits for a read.

Reads never take the ledger lock (``Service.ledger`` reads the committed
file).  Live GPU data comes through the service's telemetry, which prefers
the monitor's snapshot while it is fresh; without a monitor a backend
snapshot is taken at most every ``LIVE_EVERY_S`` seconds, on this thread,
so a stalled driver stalls only the live columns, never the keys.
"""

from __future__ import annotations

import os
import threading
import time

from bk.core.errors import BkError
from bk.core.record import dataclass, field

LIVE_EVERY_S = 5.0        # a backend look (no monitor) at most this often
WORKER_EVERY_S = 5.0      # the worker's state changes rarely; /proc/locks costs a read


@dataclass(frozen=True)
class World:
    now: int
    tz: object
    policy: object                     # bk.core.models.Policy
    actor_uid: int
    actor_user: str
    reservations: tuple = ()           # not cancelled, newest state of the ledger
    blackouts: tuple = ()
    notices: tuple = ()                # current, for this user (newest first)
    gpus: tuple = ()                   # bk.service.status.GpuRow, or () when not read yet
    live: str | None = None            # what the telemetry misses, in one line
    monitor: dict = field(default_factory=lambda: {"state": "absent"})
    worker: dict = field(default_factory=lambda: {"state": "absent"})
    shared: bool = False
    warnings: tuple = ()
    error: str | None = None           # the ledger could not be read: why
    seq: int = 0                       # loads so far: lets the screen tell a new world

    @property
    def gpu_indices(self) -> list[int]:
        n = self.policy.gpu_count
        extra = sorted({g for r in self.reservations for g in r.gpus if g >= n})
        return [*range(n), *extra]


def read_ledger(app) -> tuple:
    """-> (the committed ledger's state or None, the read's warnings, why it failed or None)."""
    call = app.call()
    try:
        state = app.ledger(call=call)
    except BkError as e:
        return None, (), e.message + (f" ({e.hint})" if e.hint else "")
    return state, tuple(call.warnings), None


def load_world(app, *, snapshot=None, worker=None, seq: int = 0, read=None) -> World:
    """One look at everything (``snapshot``: the GPUs' latest, or None to
    show them without live data; ``read``: a ``read_ledger`` already made)."""
    from bk.service.status import gpu_rows
    from bk.service.telemetry import monitor_json

    state, warnings, error = read if read is not None else read_ledger(app)
    call = app.call()
    call.warn(*warnings)
    now, policy = call.now, call.policy
    base = {"now": now, "tz": call.tz, "policy": policy, "actor_uid": call.actor.uid,
            "actor_user": call.actor.user, "shared": app.shared, "seq": seq}
    if state is None:
        return World(**base, error=error)
    gpus: tuple = ()
    live = "live: unknown (reading the GPUs)"
    if snapshot is not None:
        gpus = tuple(gpu_rows(state, snapshot, policy, now))
        live = snapshot.describe()
    return World(**base, reservations=tuple(r for r in state.reservations if r.cancelled_at is None),
                 blackouts=tuple(state.blackouts), notices=tuple(app.notices(state=state, call=call)),
                 gpus=gpus, live=live, monitor=monitor_json(app.telemetry),
                 worker=worker or {"state": "absent"}, warnings=tuple(call.warnings))


class Loader:
    """Loads a ``World`` every ``interval`` seconds on a daemon thread.

    ``latest`` is the newest world (None until the first); ``wake()`` asks
    for a load now (after a write, so the screen shows it at once).  The
    snapshot of the GPUs is kept in ``snapshot`` for writes: a booking
    placed from the TUI uses the live data the user saw."""

    def __init__(self, app, *, interval: float = 1.0, monotonic=time.monotonic):
        self.app = app
        self.interval = interval
        self._mono = monotonic
        self.latest: World | None = None
        self.snapshot = None
        self._live_at = -1e9
        self._worker_at = -1e9
        self._worker = None
        self._seq = 0
        self._ledger_id = None
        self._read = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_load = None             # called (from the thread) after each load

    def load_once(self) -> World:
        t = self._mono()
        if t - self._live_at >= LIVE_EVERY_S or self.snapshot is None:
            self.snapshot = self._take_snapshot()
            self._live_at = t
        if t - self._worker_at >= WORKER_EVERY_S:
            self._worker = self._worker_state()
            self._worker_at = t
        self._seq += 1
        ident = self._ledger_identity()
        if ident is None or ident != self._ledger_id or self._read is None:
            self._read = read_ledger(self.app)
            self._ledger_id = ident if self._read[0] is not None else None
        self.latest = load_world(self.app, snapshot=self.snapshot, worker=self._worker, seq=self._seq,
                                 read=self._read)
        return self.latest

    def _ledger_identity(self):
        """The committed ledger's identity: every commit replaces the file
        (``os.replace`` of a new one, bk.store.ledger), so the same inode,
        size and modification time mean the same bytes, and decoding them
        again (4 ms for 1,000 bookings, most of an idle screen's CPU) can
        be skipped.  None (read every time) when it cannot be seen."""
        try:
            st = os.stat(self.app.store.paths.ledger)
        except (OSError, AttributeError):
            return None
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def _take_snapshot(self):
        tel = self.app.telemetry
        try:
            if hasattr(tel, "refresh"):
                tel.refresh()
            return tel.snapshot()
        except BkError:
            return None

    def _worker_state(self) -> dict:
        from bk.service import Empty

        try:
            return self.app.run("worker_status", Empty()).worker
        except (BkError, OSError):
            return {"state": "absent"}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bk-tui-loader", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.load_once()
            except Exception as exc:  # noqa: BLE001 - a failed look must not end the screen
                if self.latest is not None:
                    from bk.core.record import replace

                    self.latest = replace(self.latest, error=f"could not refresh: {type(exc).__name__}: "
                                                             f"{exc}")
            if self.on_load is not None:
                self.on_load()
            self._wake.wait(self.interval)
            self._wake.clear()
