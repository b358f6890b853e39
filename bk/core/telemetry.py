"""What bk knows about the GPUs, split by how fast it changes.

``Inventory``: how many GPUs, their UUIDs, names and memory totals.  Stable
for the life of a boot, so it may be cached and costs nothing per command.

``Snapshot``: the live view (utilisation, memory used, processes) at one
instant, with where it came from and what it could not see (``gaps``).  A
snapshot is taken only by the commands that show or use live data (status,
placement); ``bk l`` and friends never take one.

``attribute`` is the one judgement of a GPU process against the bookings
(status rows and booking warnings both use it).  Pure: callers pass the
active bookings in.
"""

from __future__ import annotations

from bk.core.models import SYSTEM_LABELS, GpuInfo, GpuProcess
from bk.core.record import dataclass, field

# Attribution states (SPEC 8), part of the JSON contract.
OK = "ok"                    # runs under a booking of its owner on this GPU
WRONG_GPU = "wrong-gpu"      # its owner has a booking now, on other GPUs
UNRESERVED = "unreserved"    # its owner has no booking running now
UNKNOWN = "unknown"          # owner not known (no /proc access, another container)
SYSTEM = "system"            # display server, persistence daemon, monitoring
STATES = (OK, WRONG_GPU, UNRESERVED, UNKNOWN, SYSTEM)


@dataclass(frozen=True)
class Inventory:
    """The stable facts of each GPU; ``source`` names the backend."""

    source: str
    gpus: tuple[GpuInfo, ...] = ()
    simulated: bool = True
    reason: str | None = None       # why this backend was chosen, when it is a fallback

    @property
    def count(self) -> int:
        return len(self.gpus)

    def mem_totals(self) -> dict[int, int | None]:
        return {g.index: g.mem_total_mib for g in self.gpus}

    def to_dict(self) -> dict:
        return {"source": self.source, "simulated": self.simulated, "reason": self.reason,
                "gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name,
                          "mem_total_mib": g.mem_total_mib} for g in self.gpus]}

    @classmethod
    def from_dict(cls, d: dict) -> Inventory:
        gpus = tuple(GpuInfo(int(g["index"]), str(g["uuid"]), str(g["name"]),
                             mem_total_mib=g.get("mem_total_mib")) for g in d["gpus"])
        return cls(str(d["source"]), gpus, bool(d.get("simulated", True)), d.get("reason"))


@dataclass(frozen=True)
class Snapshot:
    """The GPUs as seen at ``taken_at`` (epoch seconds) from ``source``.

    ``gaps`` says what this source cannot see ("processes", "utilisation"),
    so that "no processes" is never shown where the truth is "cannot tell"."""

    taken_at: int
    source: str
    gpus: tuple[GpuInfo, ...] = ()
    gaps: tuple[str, ...] = ()
    simulated: bool = True

    def by_index(self) -> dict[int, GpuInfo]:
        return {g.index: g for g in self.gpus}

    def load(self) -> dict[int, float]:
        """Each GPU's load for placement, 0..1: the utilisation seen now."""
        return {g.index: g.util / 100 for g in self.gpus if g.util is not None}


EMPTY = Snapshot(0, "none", (), ("gpus",))


def active_gpus_by_uid(reservations, now: int) -> dict[int, set[int]]:
    """The GPUs each user holds a booking on at ``now``."""
    out: dict[int, set[int]] = {}
    for r in reservations:
        if r.cancelled_at is None and r.start <= now < r.end:
            out.setdefault(r.uid, set()).update(r.gpus)
    return out


def attribute(p: GpuProcess, gpu: int, active: dict[int, set[int]]) -> str:
    """One process on GPU ``gpu`` judged against ``active`` (uid -> GPUs
    booked now): ok, wrong-gpu, unreserved, unknown or system."""
    if (p.label or "").lower() in SYSTEM_LABELS:
        return SYSTEM
    if p.uid is None:
        return UNKNOWN
    if gpu in active.get(p.uid, ()):
        return OK
    if p.uid in active:
        return WRONG_GPU
    return UNRESERVED


@dataclass(frozen=True)
class Intruder:
    """Processes on a GPU that a new booking should be warned about."""

    gpu: int
    users: tuple[str, ...]
    count: int
    mem_mib: int
    pids: tuple[int, ...] = field(default=())


def intruders(snapshot: Snapshot, reservations, *, booking, now: int) -> list[Intruder]:
    """Processes already running on the GPUs of ``booking`` (which starts
    now) that are not entitled to them: unattributed to a booking there, or,
    for an exclusive booking, anyone else's.  Uses ``attribute`` with the
    new booking counted as active."""
    if booking.start > now:
        return []
    others = [r for r in reservations if r.id != booking.id]
    active = active_gpus_by_uid(others, now)
    if booking.mode == "exclusive":
        active = {booking.uid: set(booking.gpus)}
    else:
        active.setdefault(booking.uid, set()).update(booking.gpus)
    out = []
    for g in snapshot.gpus:
        if g.index not in booking.gpus or not g.processes:
            continue
        odd = [p for p in g.processes if attribute(p, g.index, active) in (UNRESERVED, UNKNOWN, WRONG_GPU)]
        if not odd:
            continue
        users = tuple(sorted({p.user or (str(p.uid) if p.uid is not None else "unknown") for p in odd}))
        out.append(Intruder(g.index, users, len(odd), sum(p.mem_mib or 0 for p in odd),
                            tuple(p.pid for p in odd)))
    return out
