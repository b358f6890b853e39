"""The one record every export renders: the bookings, the GPUs' live state,
today's use, the maintenance windows, the announcements and the monitor's
health, at one instant.  Typed and frozen; built by
``bk.service.exports.assemble`` (the ``export`` row and the monitor)."""

from __future__ import annotations

from bk.core.record import dataclass, field

# Activity states as the monitor publishes them (bk.core.activity.STATES).
ACTIVITY_STATES = ("active", "idle-held", "empty", "unknown")
# Monitor states as a reader reports them (bk.store.snapshot.STATES).
MONITOR_STATES = ("running", "degraded", "stale", "stopped", "topology-mismatch", "damaged", "absent")
BOOKING_STATUSES = ("upcoming", "active", "ended", "cancelled")


@dataclass(frozen=True)
class Gpu:
    """One GPU: what the inventory says, and the live look when there is one."""

    index: int
    uuid: str | None
    name: str
    disabled: bool = False
    live: str = "unknown"                 # idle | busy | unknown (GpuInfo.live_state)
    util: int | None = None               # percent
    mem_used_mib: int | None = None
    mem_total_mib: int | None = None
    power_mw: int | None = None
    processes: int | None = None          # None: the processes could not be listed
    unreserved: tuple[str, ...] = ()      # owners of processes running here without a booking here


@dataclass(frozen=True)
class Booking:
    id: str
    uid: int
    user: str
    mode: str                             # shared | exclusive
    gpus: tuple[int, ...]
    slots: int                            # share slots held on each GPU (all of them when exclusive)
    start: int
    end: int
    created: int
    updated: int                          # its last change: made, edited or cancelled
    sequence: int                         # how many times it changed since it was made
    status: str                           # BOOKING_STATUSES, at ``Export.now``
    cancelled_at: int | None = None
    note: str | None = None
    activity: str | None = None           # ACTIVITY_STATES; None: no monitor judged it
    idle_s: int | None = None
    energy_j: float | None = None         # today's (UTC) energy in the usage history

    @property
    def short_id(self) -> str:
        return self.id[:8]


@dataclass(frozen=True)
class Window:
    """A maintenance window (a blackout): no booking runs in it."""

    id: str
    start: int
    end: int
    reason: str
    sequence: int = 0                     # how many times it changed (ended early)
    updated: int | None = None            # its last change (None: never changed)


@dataclass(frozen=True)
class Announcement:
    id: str
    at: int
    level: str                            # info | warning | critical
    text: str
    until: int | None = None


@dataclass(frozen=True)
class Monitor:
    """The monitor as a reader sees it now (bk.store.snapshot.Heartbeat)."""

    state: str = "absent"
    age_s: int | None = None
    samples: int | None = None
    interval_s: float | None = None
    started_at: int | None = None
    updated_at: int | None = None


@dataclass(frozen=True)
class Use:
    """Sums over today's (UTC) usage history for one GPU or one user."""

    booked_s: int = 0
    active_s: int = 0
    unreserved_s: int = 0
    energy_j: float | None = None


@dataclass(frozen=True)
class Export:
    now: int
    host: str
    capacity: int                         # share slots per GPU
    slot_minutes: int
    gpus: tuple = ()                      # Gpu, by index
    bookings: tuple = ()                  # Booking, by start
    windows: tuple = ()                   # Window
    announcements: tuple = ()             # Announcement, newest first
    monitor: Monitor = field(default_factory=Monitor)
    live_at: int | None = None            # when the live look was taken (None: no live look)
    live_source: str | None = None        # which backend answered (nvml, nvidia-smi, sim-file, ...)
    day_start: int = 0                    # 00:00 UTC today: where the use counters start
    gpu_use: dict = field(default_factory=dict)     # GPU index -> Use
    user_use: dict = field(default_factory=dict)    # user name -> Use
    history: bool = False                 # whether any usage history was read

    def gpu(self, index: int) -> Gpu | None:
        return next((g for g in self.gpus if g.index == index), None)
