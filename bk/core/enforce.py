"""The enforcement rule: which GPUs a cgroup may open, when, and why.

Pure: the bookings, the devices, the cgroups found and the clocks are
arguments.  ``bk.enforce`` (the side effects) and ``bk admin enforce``
(the plan) both ask this module, so the plan an administrator reads is the
rule the enforcer applies.

The rule (issue 31).  While enforcement is on, a process may open GPU N's
device nodes (``/dev/nvidiaN``, char 195:N, and the MIG capability nodes
of its instances) only while the user its cgroup belongs to holds a
booking on GPU N that has started and not ended, in either mode (an
exclusive owner, or a shared-slot holder).  Every other device stays
open.  Whose a cgroup is:

* ``user.slice/user-UID.slice`` and everything below it (SSH and console
  sessions, tmux and screen servers, ``systemd --user`` units, cron and at
  jobs started through PAM, anything they fork, double fork or ``setsid``):
  UID's.  A process cannot leave its cgroup for one outside the slice
  without write access to the common ancestor, which only root has.
* A container's cgroup (Docker, Podman, containerd, CRI-O, Kubernetes;
  outside user slices, since a rootless container is already inside one):
  the one user it is **credited** to.  A container whose processes run as
  one non-root host UID is that user's (``verified``); a root-only
  container is credited to the user the monitor's judgement infers for its
  processes on a GPU (the one booker of that GPU, ``inferred``).  A credit
  lasts for the container's life (the cgroup, by its id), so a container
  keeps following its user's bookings after the booking that credited it
  ends.  Several users' processes in one container are ``ambiguous``: no
  credit from them.
* Root (UID 0), the service and monitor accounts and the administrator's
  bypass list are never restricted.

Time.  Bookings are wall-clock seconds; the programs compare the boot
clock (``CLOCK_BOOTTIME``, which the kernel offers them).  ``offset_ns``
is realtime minus boottime, read together; the enforcer regenerates every
program when it moves (the wall clock was stepped).  Windows are clipped
to the program's ``expiry``, the lease that the running enforcer renews:
after it, a program allows everything (fail open) or nothing managed
(fail closed), so an enforcer that died or hung leaves the GPUs as the
administrator chose, at the latest one lease later.
"""

from __future__ import annotations

from bk.core.devprog import Grants
from bk.core.models import SYSTEM_LABELS
from bk.core.record import dataclass, field
from bk.core.telemetry import INFERRED, judge

NVIDIA_MAJOR = 195                # "nvidia-frontend": /dev/nvidia0..253, nvidiactl 255, modeset 254
LEASE_S = 60                      # a program's expiry is at most this far ahead ...
RENEW_S = 20                      # ... and every program is renewed on this grid
SECOND = 1_000_000_000

SLICE, CONTAINER = "slice", "container"
VERIFIED = "verified"             # container credits: a non-root UID of its own
AMBIGUOUS = "ambiguous"


@dataclass(frozen=True)
class Device:
    """One GPU's device nodes: ``/dev/nvidia<minor>`` and the minors of its
    MIG capability nodes (``/dev/nvidia-caps/nvidia-cap<N>``)."""

    gpu: int
    minor: int
    caps: tuple[int, ...] = ()


@dataclass(frozen=True)
class DeviceMap:
    gpus: tuple[Device, ...]
    caps_major: int | None = None
    nvidia_major: int = NVIDIA_MAJOR
    source: str = "index"          # how minors were found: "driver" (/proc/driver/nvidia) or "index"

    def nodes(self, gpu: int) -> tuple[tuple[int, int], ...]:
        return _index(self)[0].get(gpu, ())

    def managed(self) -> tuple[tuple[int, int], ...]:
        return _index(self)[1]

    def to_json(self) -> dict:
        return {"nvidia_major": self.nvidia_major, "caps_major": self.caps_major, "source": self.source,
                "gpus": [{"gpu": d.gpu, "minor": d.minor, "caps": list(d.caps)} for d in self.gpus]}


_INDEX: dict = {}


def _index(m: DeviceMap) -> tuple[dict, tuple]:
    """GPU -> its nodes, and every managed node sorted, once per map."""
    hit = _INDEX.get(m)
    if hit is None:
        nodes = {}
        for d in m.gpus:
            out = [(m.nvidia_major, d.minor)]
            if m.caps_major is not None:
                out += [(m.caps_major, c) for c in d.caps]
            nodes[d.gpu] = tuple(out)
        if len(_INDEX) > 64:
            _INDEX.clear()
        hit = _INDEX[m] = (nodes, tuple(sorted(n for ns in nodes.values() for n in ns)))
    return hit


def index_map(gpu_count: int) -> DeviceMap:
    """GPU N is ``/dev/nvidiaN``: what a driver without ``/proc/driver/nvidia``
    (or a test) gives."""
    return DeviceMap(tuple(Device(g, g) for g in range(gpu_count)))


def driver_map(gpu_count: int, minors_by_bus: dict[str, int], caps_major: int | None,
               caps_by_minor: dict[int, tuple[int, ...]]) -> DeviceMap:
    """The map from the driver's own words: ``minors_by_bus`` (PCI bus id ->
    ``Device Minor`` from ``/proc/driver/nvidia/gpus/*/information``).
    NVML and ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` number GPUs in PCI bus order,
    so GPU N is the N-th bus id; the minor is whatever the driver gave it.
    Falls back to ``index_map`` when the driver lists another count."""
    if len(minors_by_bus) != gpu_count:
        return index_map(gpu_count)
    devs = []
    for g, bus in enumerate(sorted(minors_by_bus, key=str.lower)):
        minor = minors_by_bus[bus]
        devs.append(Device(g, minor, tuple(sorted(caps_by_minor.get(minor, ())))))
    return DeviceMap(tuple(devs), caps_major, source="driver")


@dataclass(frozen=True)
class Target:
    """A cgroup the enforcer governs.  ``path`` is relative to the cgroup
    root (``user.slice/user-1000.slice``); ``ident`` is the cgroup's id
    (its directory's inode), so a new cgroup at an old path is another
    target; ``how`` says why it is ``uid``'s."""

    path: str
    uid: int
    kind: str                      # SLICE or CONTAINER
    how: str                       # "slice", VERIFIED or INFERRED
    ident: int = 0

    def to_json(self) -> dict:
        return {"cgroup": self.path, "id": self.ident, "uid": self.uid, "kind": self.kind, "how": self.how}


def slice_uid(name: str) -> int | None:
    """``user-1000.slice`` -> 1000; anything else -> None."""
    if name.startswith("user-") and name.endswith(".slice"):
        digits = name[5:-6]
        if digits.isdigit() and len(digits) <= 10:
            uid = int(digits)
            if uid < 2 ** 32:
                return uid
    return None


# ------------------------------------------------------------------ windows

def booked_windows(reservations, uid: int, since: int, until: int) -> dict[int, list[tuple[int, int]]]:
    """The GPUs ``uid`` holds a booking on within ``[since, until)`` (epoch
    seconds): per GPU, its merged, sorted windows, clipped to ``until``."""
    raw: dict[int, list[tuple[int, int]]] = {}
    for r in reservations:
        if r.uid != uid or r.cancelled_at is not None or r.end <= since or r.start >= until:
            continue
        for g in r.gpus:
            raw.setdefault(g, []).append((r.start, min(r.end, until)))
    out = {}
    for g, spans in raw.items():
        spans.sort()
        merged = [list(spans[0])]
        for a, b in spans[1:]:
            if a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        out[g] = [(a, b) for a, b in merged]
    return out


def allowed_now(reservations, uid: int, now: int) -> set[int]:
    return {g for g, spans in booked_windows(reservations, uid, now, now + 1).items() if spans}


def next_boundary(reservations, now: int, uids=None) -> int | None:
    """The first booking start or end after ``now`` (of ``uids`` when
    given): when the allowed sets next change by the clock alone."""
    best = None
    for r in reservations:
        if r.cancelled_at is not None or r.end <= now or (uids is not None and r.uid not in uids):
            continue
        for t in (r.start, r.end):
            if t > now and (best is None or t < best):
                best = t
    return best


def expiry_for(now_s: float, lease: int = LEASE_S, renew: int = RENEW_S) -> int:
    """A program made at ``now_s`` expires on the renewal grid, between
    ``lease - renew`` and ``lease`` seconds later: programs made in one
    renewal period share their expiry, so a user's slice and containers
    share one loaded program."""
    return (int(now_s) // renew + 1) * renew + lease - renew


def grants_for(reservations, uid: int, devices: DeviceMap, *, now_ns: int, offset_ns: int,
               fail_open: bool, expiry_s: int | None = None) -> Grants:
    """The program's meaning for ``uid`` at realtime ``now_ns``:
    ``offset_ns`` is realtime minus boottime, read together; ``expiry_s``
    (default: the lease, ``expiry_for``) when the program must not outlive
    others already attached."""
    now_s = now_ns // SECOND
    if expiry_s is None:
        expiry_s = expiry_for(now_ns / SECOND)
    windows = []
    for g, spans in booked_windows(reservations, uid, now_s, expiry_s).items():
        for major, minor in devices.nodes(g):
            for a, b in spans:
                lo = max(0, a * SECOND - offset_ns)
                hi = max(0, b * SECOND - offset_ns)
                if hi > lo:
                    windows.append((major, minor, lo, hi))
    return Grants(devices.managed(), tuple(sorted(windows)), max(0, expiry_s * SECOND - offset_ns), fail_open)


PROGRAM = "gpubk"                 # the name of a program several users' cgroups share


def program_name(uid: int | None) -> str:
    """The kernel's name for a program (15 characters at most): ``gpubk``
    and the UID when one user's cgroups use it, ``gpubk`` alone when it is
    shared (users whose bookings say the same, most often: none now).
    ``bk admin enforce status``, ``off`` and a restarted enforcer tell
    gpubk's programs from other programs by it."""
    return PROGRAM if uid is None else f"{PROGRAM}{uid}"


def uid_of_program(name: str) -> int | None:
    if name.startswith(PROGRAM) and name[len(PROGRAM):].isdigit():
        return int(name[len(PROGRAM):])
    return None


def is_program(name: str) -> bool:
    """One of gpubk's device programs (attached by an enforcer)."""
    return name == PROGRAM or uid_of_program(name) is not None


# ------------------------------------------------------------------ credits

@dataclass(frozen=True)
class Credit:
    uid: int | None
    how: str | None                # VERIFIED, INFERRED, "kept" or AMBIGUOUS/None


def credit(host_uids: set[int], inferred: set[int], prior: int | None) -> Credit:
    """Whose a container is (see the module essay): ``host_uids`` are the
    real UIDs of its processes now, ``inferred`` the users the monitor's
    judgement credits its processes on GPUs to, ``prior`` the credit it
    already has (kept for the container's life unless its own non-root
    processes say otherwise)."""
    own = {u for u in host_uids if u != 0}
    if len(own) == 1:
        return Credit(next(iter(own)), VERIFIED)
    if prior is not None:
        return Credit(prior, "kept")
    if own:
        return Credit(None, AMBIGUOUS)
    if len(inferred) == 1:
        return Credit(next(iter(inferred)), INFERRED)
    return Credit(None, AMBIGUOUS if inferred else None)


def inferred_users(snapshot, reservations, container_of_pid: dict[int, str]) -> dict[str, set[int]]:
    """For each container cgroup (by path), the users the judgement infers
    for its root processes on a GPU at the snapshot's time."""
    from bk.core.telemetry import active_gpus_by_uid

    active = active_gpus_by_uid(reservations, snapshot.taken_at)
    out: dict[str, set[int]] = {}
    for g in snapshot.gpus:
        for p in g.processes or ():
            path = container_of_pid.get(p.pid)
            if path is None:
                continue
            a = judge(p, g.index, active)
            if a.identity == INFERRED and a.uid is not None:
                out.setdefault(path, set()).add(a.uid)
    return out


# ------------------------------------------------------------------ holders

@dataclass(frozen=True)
class Holder:
    """A process on a GPU its (credited) owner holds no booking on now."""

    pid: int
    since: int | None
    uid: int
    gpu: int
    label: str | None = None

    @property
    def key(self) -> tuple[int, int | None]:
        return (self.pid, self.since)

    def to_json(self) -> dict:
        return {"pid": self.pid, "uid": self.uid, "gpu": self.gpu, "label": self.label}


def holders(snapshot, reservations, now: int, *, enforced, container_uid: dict[int, int]) -> list[Holder]:
    """Processes of the snapshot that hold a GPU their owner has not booked
    at ``now``: the ones the device programs cannot stop, because they
    opened it earlier (or outside any governed cgroup).  ``enforced(uid)``
    says whose processes count; ``container_uid`` maps the PIDs of credited
    containers to their user (a root process elsewhere is never one)."""
    from bk.core.telemetry import active_gpus_by_uid

    active = active_gpus_by_uid(reservations, now)
    out = []
    for g in snapshot.gpus:
        for p in g.processes or ():
            uid = container_uid.get(p.pid, p.uid)
            if uid is None or uid == 0 or not enforced(uid) or (p.label or "").lower() in SYSTEM_LABELS:
                continue
            if g.index not in active.get(uid, ()):
                out.append(Holder(p.pid, p.since, uid, g.index, p.label))
    return out


@dataclass(frozen=True)
class SignalStep:
    term: tuple[Holder, ...]
    kill: tuple[Holder, ...]
    pending: dict = field(default_factory=dict)      # key -> (term_at, killed)


def signal_step(pending: dict, found: list[Holder], now: float, grace: float) -> SignalStep:
    """TERM for a holder seen for the first time, KILL for one still there
    ``grace`` seconds after its TERM (once); holders no longer seen (gone,
    or booked meanwhile) are forgotten."""
    term, kill, nxt = [], [], {}
    for h in found:
        seen = pending.get(h.key)
        if seen is None:
            term.append(h)
            nxt[h.key] = (now, False)
        elif not seen[1] and now - seen[0] >= grace:
            kill.append(h)
            nxt[h.key] = (seen[0], True)
        else:
            nxt[h.key] = seen
    return SignalStep(tuple(term), tuple(kill), nxt)


# --------------------------------------------------------------------- plan

@dataclass(frozen=True)
class UserPlan:
    uid: int
    cgroups: tuple[str, ...]
    keeps: tuple[int, ...]
    loses: tuple[int, ...]
    holding: tuple[Holder, ...] = ()

    def to_json(self, name=None) -> dict:
        return {"uid": self.uid, "user": name, "cgroups": list(self.cgroups), "keeps": list(self.keeps),
                "loses": list(self.loses), "holding": [h.to_json() for h in self.holding]}


def plan(targets: list[Target], reservations, now: int, gpus: list[int], found: list[Holder]) -> list[UserPlan]:
    """Per user with a governed cgroup (and per user holding a GPU without
    a booking): the GPUs they may open now, the ones they would lose, and
    their processes that keep a GPU open without a booking."""
    uids = sorted({t.uid for t in targets} | {h.uid for h in found})
    out = []
    for uid in uids:
        ok = allowed_now(reservations, uid, now)
        out.append(UserPlan(uid, tuple(sorted(t.path for t in targets if t.uid == uid)),
                            tuple(g for g in gpus if g in ok), tuple(g for g in gpus if g not in ok),
                            tuple(h for h in found if h.uid == uid)))
    return out
