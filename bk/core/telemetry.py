"""What bk knows about the GPUs, split by how fast it changes.

``Inventory``: how many GPUs, their UUIDs, names and memory totals.  Stable
for the life of a boot, so it may be cached and costs nothing per command.

``Snapshot``: the live view (utilisation, memory used, processes) at one
instant, with where it came from and what it could not see (``gaps``).  A
snapshot is taken only by the commands that show or use live data (status,
placement); ``bk l`` and friends never take one.

``attribute_all`` is the one judgement of the GPU processes against the
bookings (status rows, placement and booking warnings all use it).  Pure:
callers pass the bookings and ``now`` in.

Who runs a process is read from /proc: its real UID.  That is the truth for
an ordinary process (``verified``).  A container started through a daemon
(Docker, containerd, CRI-O, rootful Podman) runs as root whoever asked for
it, so UID 0 inside a container says nothing about the user.  The decision:
such a process on GPU g is credited to the one user whose booking holds g
now (``inferred``; that user could have started it), ``ambiguous`` when
several bookings hold g (the state is then ``unknown``: bk will not pick
one), and ``unreserved`` with UID 0 when nobody holds g.  The identity is
always reported next to the state, so an inference is never passed off as a
fact.
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

# How sure the UID of an attribution is (SPEC 8), part of the JSON contract.
VERIFIED = "verified"        # the process's own UID, read from /proc
INFERRED = "inferred"        # a root container process credited to the one booker of its GPU
AMBIGUOUS = "ambiguous"      # a root container process on a GPU several users hold
IDENTITIES = (VERIFIED, INFERRED, AMBIGUOUS)

# What a source can see, in the order humans read it.  A backend states the
# ones it offers (``Snapshot.capabilities``); ``gaps`` names the ones a look
# missed (or that the source never has).
CAPABILITIES = ("uuid", "memory", "utilisation", "temperature", "processes", "process_sm",
                "process_owner", "mig")
GAP_WORDS = {"utilisation": "utilisation", "memory": "memory readings", "processes": "process list",
             "temperature": "temperature", "process_sm": "per-process SM", "uuid": "UUID of some GPUs",
             "process_owner": "process owners"}
GAP_NOTES = {"mig": "MIG mode: readings are the whole GPU's", "nvml": "the driver failed during this look",
             "gpus": "no GPUs seen"}


# The range of every reading, for readers of files that another process
# wrote (the monitor's snapshot, the usage history): a value outside it is
# damage, never a measurement, and such a file is not believed.  The bounds
# are the hardware's and the kernel's, with room to spare, not a guess at
# what is plausible today.
MAX_GPUS = 64                    # BK_GPU_COUNT and gpu_count allow 1..64
MAX_PID = 1 << 22                # PID_MAX_LIMIT on 64-bit Linux
MAX_UID = (1 << 32) - 2          # uid_t; (uid_t)-1 means "no user"
MAX_MEM_MIB = 1 << 24            # 16 TiB, far above any one GPU's memory
TEMPERATURE_C = (-100, 200)      # a sensor reading in degrees Celsius
MAX_TEXT = 256                   # names, labels, UUIDs, containers
MAX_PROCESSES = 4096             # per GPU


def whole(v, lo: int, hi: int) -> bool:
    """``v`` is an int (not a bool) in ``lo..hi``."""
    return type(v) is int and lo <= v <= hi


def _opt_whole(v, lo: int, hi: int) -> bool:
    return v is None or whole(v, lo, hi)


def _opt_text(v) -> bool:
    return v is None or (isinstance(v, str) and len(v) <= MAX_TEXT)


def process_problem(p: GpuProcess) -> str | None:
    """What is out of range in one process reading; None when nothing is."""
    checks = (("pid", whole(p.pid, 1, MAX_PID)), ("mem_mib", _opt_whole(p.mem_mib, 0, MAX_MEM_MIB)),
              ("sm", _opt_whole(p.sm, 0, 100)), ("uid", _opt_whole(p.uid, 0, MAX_UID)),
              ("since", _opt_whole(p.since, 0, 1 << 40)), ("user", _opt_text(p.user)),
              ("label", _opt_text(p.label)), ("container", _opt_text(p.container)),
              ("identity", p.identity is None or p.identity in IDENTITIES))
    for name, fine in checks:
        if not fine:
            return f"process {name} {getattr(p, name)!r} is out of range"
    return None


def gpu_problem(g: GpuInfo) -> str | None:
    """What is out of range in one GPU reading (its processes included)."""
    lo_t, hi_t = TEMPERATURE_C
    checks = (("index", whole(g.index, 0, MAX_GPUS - 1)),
              ("uuid", isinstance(g.uuid, str) and 0 < len(g.uuid) <= MAX_TEXT),
              ("name", isinstance(g.name, str) and len(g.name) <= MAX_TEXT),
              ("mem_total_mib", _opt_whole(g.mem_total_mib, 1, MAX_MEM_MIB)),
              ("mem_used_mib", _opt_whole(g.mem_used_mib, 0, MAX_MEM_MIB)),
              ("util", _opt_whole(g.util, 0, 100)), ("temperature", _opt_whole(g.temperature, lo_t, hi_t)),
              ("processes", g.processes is None or (isinstance(g.processes, list)
                                                    and len(g.processes) <= MAX_PROCESSES)))
    for name, fine in checks:
        if not fine:
            return f"GPU {g.index!r}: {name} {getattr(g, name)!r} is out of range"
    for p in g.processes or ():
        why = process_problem(p)
        if why is not None:
            return f"GPU {g.index}: {why}"
    return None


def gpus_problem(gpus) -> str | None:
    """``gpu_problem`` for a whole view, and the view itself: GPUs 0..n-1
    in order (as NVML and every backend number them), 1 to ``MAX_GPUS`` of
    them, each UUID once."""
    if not 1 <= len(gpus) <= MAX_GPUS:
        return f"{len(gpus)} GPUs"
    for g in gpus:
        why = gpu_problem(g)
        if why is not None:
            return why
    if [g.index for g in gpus] != list(range(len(gpus))):
        return "the GPU indexes are not 0.." + str(len(gpus) - 1)
    if len({g.uuid for g in gpus}) != len(gpus):
        return "a GPU UUID appears twice"
    return None


def identities(gpus) -> list[tuple[int, str]]:
    """What makes two views the same GPUs: each one's index and UUID."""
    return [(g.index, g.uuid) for g in gpus]


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
    reason: str | None = None            # why this source, when it is a fallback
    capabilities: tuple[str, ...] = ()   # what this source can see at best (CAPABILITIES)

    def by_index(self) -> dict[int, GpuInfo]:
        return {g.index: g for g in self.gpus}

    def load(self) -> dict[int, float]:
        """Each GPU's load for placement, 0..1: the utilisation seen now."""
        return {g.index: g.util / 100 for g in self.gpus if g.util is not None}

    def describe(self) -> str | None:
        """One line for humans when the view is incomplete ("telemetry:
        nvidia-smi; no process list"), None when nothing is missing."""
        if not self.gaps and not self.reason:
            return None
        parts = [f"telemetry: {self.source}" + (" (simulated)" if self.simulated and
                                                 not self.source.startswith("sim") else "")]
        if self.reason:
            parts.append(self.reason)
        missing = [GAP_WORDS.get(g, g) for g in self.gaps if g not in GAP_NOTES]
        if missing:
            parts.append("no " + ", ".join(missing))
        parts.extend(GAP_NOTES[g] for g in self.gaps if g in GAP_NOTES)
        return "; ".join(parts)

    def telemetry_json(self) -> dict:
        return {"source": self.source, "simulated": self.simulated, "reason": self.reason,
                "gaps": list(self.gaps), "capabilities": list(self.capabilities)}


EMPTY = Snapshot(0, "none", (), ("gpus",))


def active_gpus_by_uid(reservations, now: int) -> dict[int, set[int]]:
    """The GPUs each user holds a booking on at ``now``."""
    out: dict[int, set[int]] = {}
    for r in reservations:
        if r.cancelled_at is None and r.start <= now < r.end:
            out.setdefault(r.uid, set()).update(r.gpus)
    return out


@dataclass(frozen=True)
class Attribution:
    """The judgement of one process: its state (STATES), how sure its UID
    is (IDENTITIES, None when no UID is known) and the UID it is credited
    to (the booker for an inferred container process)."""

    state: str
    identity: str | None
    uid: int | None


def attribute(p: GpuProcess, gpu: int, active: dict[int, set[int]]) -> str:
    """One process on GPU ``gpu`` judged against ``active`` (uid -> GPUs
    booked now): ok, wrong-gpu, unreserved, unknown or system."""
    return judge(p, gpu, active).state


def judge(p: GpuProcess, gpu: int, active: dict[int, set[int]],
          candidates: set[int] | None = None) -> Attribution:
    """``attribute`` with the identity.  ``candidates``: the users who could
    have started a root container process on ``gpu`` (by default everyone
    in ``active`` holding ``gpu``)."""
    if (p.label or "").lower() in SYSTEM_LABELS:
        return Attribution(SYSTEM, VERIFIED if p.uid is not None else None, p.uid)
    if p.uid is None:
        return Attribution(UNKNOWN, None, None)
    if p.uid == 0 and p.container and gpu not in active.get(0, ()):
        holders = candidates if candidates is not None else {u for u, gs in active.items() if gpu in gs}
        if len(holders) == 1:
            return Attribution(OK, INFERRED, next(iter(holders)))
        if holders:
            return Attribution(UNKNOWN, AMBIGUOUS, None)
        return Attribution(UNRESERVED, VERIFIED, 0)
    if gpu in active.get(p.uid, ()):
        return Attribution(OK, VERIFIED, p.uid)
    if p.uid in active:
        return Attribution(WRONG_GPU, VERIFIED, p.uid)
    return Attribution(UNRESERVED, VERIFIED, p.uid)


def attribute_all(snapshot: Snapshot, reservations, now: int) -> dict[tuple[int, int], Attribution]:
    """Every process of ``snapshot`` judged against the bookings active at
    ``now``: ``{(gpu, pid): Attribution}``."""
    if not any(g.processes for g in snapshot.gpus):
        return {}                # no process to judge: no pass over the bookings
    active = active_gpus_by_uid(reservations, now)
    return {(g.index, p.pid): judge(p, g.index, active) for g in snapshot.gpus for p in g.processes or ()}


# A GPU's live state for people (bk st) and placement, worst last.
IDLE, BUSY, UNRESERVED_USE = "idle", "busy", "unreserved-use"


def gpu_state(g: GpuInfo, attributions: dict[tuple[int, int], Attribution]) -> str:
    """``idle``, ``busy``, ``unreserved-use`` (a process runs there without
    a booking of its user on that GPU) or ``unknown``."""
    for p in g.processes or ():
        a = attributions.get((g.index, p.pid))
        if a is not None and a.state in (UNRESERVED, WRONG_GPU):
            return UNRESERVED_USE
    return g.live_state()


# Added to a GPU's load when a process uses it without a booking: more than
# any utilisation (0..1) can add, so such a GPU ranks after every busy one.
UNRESERVED_LOAD = 1.0


def placement_load(snapshot: Snapshot, reservations, now: int, *, uid: int | None = None) -> dict[int, float]:
    """Each GPU's load for placement: the utilisation seen now (0..1), plus
    1 for a GPU that a process uses without a booking there, so that such a
    GPU comes after every other busy one (the scheduler ranks idle, unknown,
    busy first, then by this load).  ``uid``'s own processes (the user
    asking) do not count against a GPU: they are probably why they book."""
    atts = attribute_all(snapshot, reservations, now)
    out = {}
    for g in snapshot.gpus:
        load = g.util / 100 if g.util is not None else 0.0
        for p in g.processes or ():
            a = atts.get((g.index, p.pid))
            if a is not None and a.state in (UNRESERVED, WRONG_GPU) and (uid is None or a.uid != uid):
                load += UNRESERVED_LOAD
                break
        if g.util is not None or load:
            out[g.index] = load
    return out


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
    for an exclusive booking, anyone else's.  Uses ``judge`` with the
    new booking counted as active."""
    if booking.start > now:
        return []
    others = [r for r in reservations if r.id != booking.id]
    active = active_gpus_by_uid(others, now)
    if booking.mode == "exclusive":
        active = {booking.uid: set(booking.gpus)}
    else:
        active.setdefault(booking.uid, set()).update(booking.gpus)
    # A process already running was not started under a booking that begins
    # now: it is credited only to the others who hold the GPU.
    holders = active_gpus_by_uid(others, now) if booking.mode != "exclusive" else {}
    out = []
    for g in snapshot.gpus:
        if g.index not in booking.gpus or not g.processes:
            continue
        cands = {u for u, gs in holders.items() if g.index in gs}
        odd = [p for p in g.processes
               if judge(p, g.index, active, cands).state in (UNRESERVED, UNKNOWN, WRONG_GPU)]
        if not odd:
            continue
        users = tuple(sorted({p.user or (f"uid {p.uid}" if p.uid is not None else "an unknown user")
                              for p in odd}))
        out.append(Intruder(g.index, users, len(odd), sum(p.mem_mib or 0 for p in odd),
                            tuple(p.pid for p in odd)))
    return out
