"""What the screen shows, read off the draw path.

A ``World`` is one consistent look: the committed ledger, the notices, the
GPUs' live rows, the monitor's heartbeat and the worker's state, all at one
``now``.  ``Loader`` makes one in a background thread once a second and
publishes it by replacing one attribute (a reference store is atomic in
CPython), so the draw loop never waits for a read.

Each look is the service's ``screen`` row: it reads the committed file
without the lock (again only when the file changed), and the GPUs through
the service's telemetry, which prefers the monitor's snapshot while it is
fresh; without a monitor a backend snapshot is taken at most every
``LIVE_EVERY_S`` seconds, on this thread, so a stalled driver stalls only
the live columns, never the keys.
"""

from __future__ import annotations

import threading
import time

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
    gpus: tuple = ()                   # bk.service.GpuRow, or () when not read yet
    live: str | None = None            # what the telemetry misses, in one line
    monitor: dict = field(default_factory=lambda: {"state": "absent"})
    worker: dict = field(default_factory=lambda: {"state": "absent"})
    shared: bool = False
    usable: frozenset = frozenset()    # others' bookings shared with this user (bk e ID --with)
    warnings: tuple = ()
    error: str | None = None           # the ledger could not be read: why
    seq: int = 0                       # loads so far: lets the screen tell a new world
    activity: dict = field(default_factory=dict)   # booking id -> the monitor's activity row (issue 25)

    @property
    def gpu_indices(self) -> list[int]:
        n = self.policy.gpu_count
        extra = sorted({g for r in self.reservations for g in r.gpus if g >= n})
        return [*range(n), *extra]


def world_of(got, call, *, seq: int = 0, worker: dict | None = None) -> World:
    """The screen's world from one look (the ``screen`` row's result)."""
    base = {"now": got.now, "tz": call.tz, "policy": call.policy, "actor_uid": call.actor.uid,
            "actor_user": call.actor.user, "shared": got.shared, "seq": seq}
    if got.state is None:
        return World(**base, error=got.error)
    return World(**base, reservations=tuple(r for r in got.state.reservations if r.cancelled_at is None),
                 usable=got.usable, activity=got.activity, blackouts=tuple(got.state.blackouts),
                 notices=got.notices, gpus=got.gpus, live=got.live,
                 monitor=got.monitor, worker=worker or got.worker or {"state": "absent"},
                 warnings=tuple(call.warnings))


def load_world(app, *, live: bool = False, seq: int = 0) -> World:
    """One look at everything (``live``: the GPUs' live rows too)."""
    from bk.service import ScreenRequest

    call = app.call()
    return world_of(app.run("screen", ScreenRequest(live=live), call=call), call, seq=seq)


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
        self.inventory = None
        self._live_at = -1e9
        self._worker_at = -1e9
        self._worker = None
        self._seq = 0
        self._look = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_load = None             # called (from the thread) after each load

    def load_once(self) -> World:
        from bk.service import ScreenRequest

        t = self._mono()
        live = t - self._live_at >= LIVE_EVERY_S or self.snapshot is None
        worker = t - self._worker_at >= WORKER_EVERY_S
        call = self.app.call()
        got = self.app.run("screen", ScreenRequest(live=live, worker=worker, previous=self._look), call=call)
        if live:
            self._live_at = t
        if worker:
            self._worker, self._worker_at = got.worker, t
        self._look = got
        self.snapshot, self.inventory = got.snapshot, got.inventory
        self._seq += 1
        self.latest = world_of(got, call, seq=self._seq, worker=self._worker)
        return self.latest

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
