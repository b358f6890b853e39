"""Whether a booking is used now: its live activity state, idle time, and
the nudge and release decisions that follow.  Pure: the monitor passes each
sample (the snapshot, the attributions, the CPU its processes used) and the
sample's own time in; nothing here reads a clock, a file or a driver.

The facts that shape it:

* A GPU's utilisation is device-wide and says nothing about whose work it
  is; it can also stick at 100 % with no process at all (a known driver
  state after some faults).  So a booking's state comes from its own
  processes: those attributed to its owner (``ok``) on its GPUs.  None
  there: ``empty``.
* Memory says nothing about work: frameworks reserve most of a GPU's
  memory up front (TensorFlow, JAX) and keep it while idle (a notebook that
  ran one cell).  A process that holds memory and computes nothing is
  ``idle-held``.
* The driver's per-process SM utilisation says whether a process ran
  kernels since the last look (``nvmlDeviceGetProcessUtilization``; the
  backend keeps the highest sample between two looks).  It counts a kernel
  that spins on one SM as 100 %, the same as a kernel that uses every SM:
  that is how a rule on utilisation alone is defeated by a fake load.
  Power is not so easily faked: a spinning kernel leaves the board near its
  idle draw, real arithmetic does not.  So an SM reading of ``SPIN_SM`` or
  more while the board draws less than its idle baseline plus a margin is
  not believed (reason ``spin``: a hung NCCL collective looks the same,
  and is as idle).  A kernel that really computes, on any data, cannot be
  told from work, and is not: it is paid for in energy, which is counted.
* Under MPS the driver credits every client's kernels to the MPS server,
  and with the gap ``process_sm`` no process has a reading at all.  Then a
  process of the booking counts as computing when the board draws more
  than its idle baseline plus the margin (or, without power readings, when
  the device utilisation is at least ``UTIL_MIN``).  MPS clients sharing
  one GPU cannot be told apart: all count as active while any computes.
* Work that is not on the GPU still uses the booking: a data loader, a
  download, a checkpoint write, an evaluation on the CPU.  So the CPU time
  of the trees of the booking's GPU processes (the processes and their
  descendants, from /proc) counts: at least ``CPU_BUSY`` of one core over
  the last ``CPU_WINDOW_S`` makes the booking active.  A download at a
  trickle (under about 2 % of a core) is not seen, and neither is work of
  a program that has not touched the GPU yet (the booking is ``empty``).
  Burning a CPU core keeps a booking active; that is the price of counting
  data loaders, and it shows in the evidence.
* Some things cannot be seen: a GPU without a process list (the
  ``nvidia-smi`` fallback, a failed look; a GPU in MIG mode that lists
  none, since the driver may hide its instances' processes), or a process on the booking's
  GPU whose owner is unknown (hidden /proc, a root container on a GPU that
  several users hold) while it computes.  Then the state is ``unknown``:
  the idle clock neither runs nor resets, so idle time is only ever time
  that was seen to be idle.

Idle time: the seconds since the last ``active`` sample that were seen
idle, counting an interval between two samples only when both saw the
booking ``idle-held`` or ``empty`` (so neither the interval after an active
sample nor one next to an ``unknown`` sample counts), and at most three
intervals for one (the rule of the usage history: a gap, such as a stopped
monitor, is never counted).  One active sample resets it.

The idle baseline of a GPU (``Baseline``): the lowest power seen while the
GPU was quiet (no process, or processes with SM readings of 0 and low
utilisation), rising slowly towards what quiet samples show so that one
odd reading does not fix it for ever.  Until a GPU was seen quiet, power is
not used as evidence on it.  The margin above it is the larger of
``MARGIN_MIN_MW`` and ``MARGIN_SHARE`` of the power limit.
"""

from __future__ import annotations

from bk.core.record import dataclass, field

ACTIVE, IDLE_HELD, EMPTY, UNKNOWN = "active", "idle-held", "empty", "unknown"
STATES = (ACTIVE, IDLE_HELD, EMPTY, UNKNOWN)
IDLE_STATES = (IDLE_HELD, EMPTY)

# Why a state was given (``Judgement.reason``), part of the snapshot's JSON.
REASONS = ("sm", "power", "util", "cpu", "spin", "memory-held", "no-process", "no-process-list",
           "unknown-owner", "no-evidence")

SM_MIN = 1                 # an SM reading (percent) at least this counts as compute
SPIN_SM = 90               # ... unless it is this high while the board draws idle power
UTIL_MIN = 5               # device utilisation that counts where no process has an SM reading
CPU_BUSY = 0.02            # share of one core, over CPU_WINDOW_S, that makes a booking busy
CPU_WINDOW_S = 30
MARGIN_MIN_MW = 25_000     # power above the idle baseline that counts as work: at least 25 W ...
MARGIN_SHARE = 0.10        # ... or a tenth of the power limit
BASELINE_RISE = 1 / 512    # how fast the baseline follows quiet samples above it
GAP_INTERVALS = 3          # a sample stands for at most this many intervals
NUDGE_MINUTES = (30, 45)   # idle_nudge_minutes' default
MPS_LABEL = "nvidia-cuda-mps-server"


# ---------------------------------------------------------------- words for people

_WORDS = {ACTIVE: "in use", IDLE_HELD: "memory held, no compute", EMPTY: "no process on its GPUs",
          UNKNOWN: "cannot tell"}


def state_words(state: str) -> str:
    """What a state means, for a sentence (``released: idle 1h (memory held, no compute)``)."""
    return _WORDS.get(state, "cannot tell")


def short_text(state: str | None, idle_s: int | None) -> str | None:
    """The few words every list shows for a running booking (``bk l``,
    ``bk st``, ``bk t``): ``in use``, ``idle 35m`` (memory held),
    ``empty 35m`` (none of its processes on its GPUs); None when it cannot
    be told (no monitor, or ``unknown``)."""
    from bk.core.timegrid import format_duration

    if state == ACTIVE:
        return "in use"
    if state in IDLE_STATES:
        word = "idle" if state == IDLE_HELD else "empty"
        return f"{word} {format_duration(max(60, idle_s or 0) // 60 * 60)}" if (idle_s or 0) >= 60 else word
    return None


# ---------------------------------------------------------------- the idle baseline

def margin_mw(limit_mw: int | None) -> int:
    return max(MARGIN_MIN_MW, int(MARGIN_SHARE * limit_mw)) if limit_mw else MARGIN_MIN_MW


def quiet(g) -> bool:
    """Whether GPU ``g`` (a ``GpuInfo``) computes nothing now, as far as
    one can tell without power: no process at all (whatever a stuck
    utilisation says), or processes with no SM above 0 since the last look
    and low utilisation (under MPS the server carries the clients' SM).
    Only quiet samples teach the baseline."""
    if g.processes is None:
        return False
    if not g.processes:
        return True
    return all((p.sm or 0) < SM_MIN for p in g.processes) and g.util is not None and g.util < UTIL_MIN


def learn_baseline(old_mw: int | None, g) -> int | None:
    """The baseline after one more sample of ``g``."""
    p = g.power_mw
    if p is None or p <= 0 or not quiet(g):
        return old_mw
    if old_mw is None or p < old_mw:
        return p
    return int(old_mw + (p - old_mw) * BASELINE_RISE)


def power_level(g, baseline_mw: int | None) -> str | None:
    """``hot`` (above baseline plus margin), ``cold`` or None (cannot tell)."""
    if g.power_mw is None or baseline_mw is None:
        return None
    return "hot" if g.power_mw >= baseline_mw + margin_mw(g.power_limit_mw) else "cold"


# ---------------------------------------------------------------- one sample

@dataclass(frozen=True)
class Judgement:
    """A booking's state at one sample, why, and the evidence."""

    state: str
    reason: str
    processes: int = 0
    mem_mib: int | None = None
    sm_max: int | None = None
    power_mw: int | None = None           # the booking's GPUs' highest draw
    baseline_mw: int | None = None        # and that GPU's baseline
    threshold_mw: int | None = None
    cpu_share: float | None = None        # of one core over the CPU window

    def evidence(self) -> dict:
        return {"processes": self.processes, "mem_mib": self.mem_mib, "sm_max": self.sm_max,
                "power_mw": self.power_mw, "baseline_mw": self.baseline_mw,
                "threshold_mw": self.threshold_mw,
                "cpu_pct": None if self.cpu_share is None else round(self.cpu_share * 100, 1)}


def _label(p) -> str:
    return (p.label or "").split(" ", 1)[0].lower()


def _att(attributions, gpu: int, p):
    a = attributions.get((gpu, p.pid))
    if a is None:
        return None, p.uid
    if isinstance(a, str):
        return a, p.uid
    return a.state, (p.uid if a.uid is None else a.uid)


def gpu_judgement(g, uid: int, attributions: dict, baseline_mw: int | None, *,
                  sm_readable: bool) -> tuple[str, str, list]:
    """The state of one GPU for a booking of ``uid``: (state, reason, own
    processes).  ``sm_readable``: the backend reads per-process SM on it."""
    if g.processes is None:
        return UNKNOWN, "no-process-list", []
    own, strangers, maybe = [], False, False
    mps = any(_label(p) == MPS_LABEL for p in g.processes)
    for p in g.processes:
        state, owner = _att(attributions, g.index, p)
        if state == "ok" and owner == uid:
            own.append(p)
        elif state == "unknown":
            # A process whose owner cannot be read may be this booking's own
            # (a hidden /proc, an ambiguous root container).
            if (p.sm or 0) >= SM_MIN:
                strangers = True
            elif p.sm is None and (mps or not sm_readable):
                maybe = True
    level = power_level(g, baseline_mw)
    if not own:
        if strangers or (maybe and (level == "hot" or (level is None and (g.util or 0) >= UTIL_MIN))):
            return UNKNOWN, "unknown-owner", own
        return EMPTY, "no-process", own
    if sm_readable and not mps:
        sm = max((p.sm or 0) for p in own)
        if sm >= SM_MIN:
            if sm >= SPIN_SM and level == "cold":
                return IDLE_HELD, "spin", own
            return ACTIVE, "sm", own
        return IDLE_HELD, "memory-held", own
    if level == "hot":
        return ACTIVE, "power", own
    if level == "cold":
        return IDLE_HELD, "memory-held", own
    if g.util is not None:
        return (ACTIVE, "util", own) if g.util >= UTIL_MIN else (IDLE_HELD, "memory-held", own)
    return UNKNOWN, "no-evidence", own


_RANK = {ACTIVE: 0, UNKNOWN: 1, IDLE_HELD: 2, EMPTY: 3}


def judge_booking(res, gpus: dict, attributions: dict, baselines: dict, *, cpu_share: float | None,
                  sm_readable: bool, hidden: frozenset = frozenset()) -> Judgement:
    """A booking's state from its GPUs (``gpus``: index -> ``GpuInfo``):
    active when any GPU is, or when its processes' trees keep a CPU busy;
    else unknown when any GPU cannot tell; else idle-held when it holds
    memory anywhere; else empty.  A GPU of the booking that is not in the
    snapshot cannot tell, and neither can one in ``hidden`` (a GPU in MIG
    mode, whose processes the driver may not list)."""
    per = []
    for i in res.gpus:
        g = gpus.get(i)
        if g is None or (i in hidden and not g.processes):
            per.append((UNKNOWN, "no-process-list", [], g))
            continue
        state, reason, own = gpu_judgement(g, res.uid, attributions, baselines.get(i), sm_readable=sm_readable)
        per.append((state, reason, own, g))
    procs = [p for _, _, own, _ in per for p in own]
    mems = [p.mem_mib for p in procs if p.mem_mib is not None]
    sms = [p.sm for p in procs if p.sm is not None]
    hot = max((g for *_, g in per if g is not None and g.power_mw is not None),
              key=lambda g: g.power_mw, default=None)
    base = baselines.get(hot.index) if hot is not None else None
    ev = dict(processes=len(procs), mem_mib=sum(mems) if mems else None, sm_max=max(sms) if sms else None,
              power_mw=hot.power_mw if hot is not None else None, baseline_mw=base,
              threshold_mw=base + margin_mw(hot.power_limit_mw) if base is not None else None,
              cpu_share=cpu_share)
    best = min(per, key=lambda x: _RANK[x[0]])
    if best[0] == ACTIVE:
        return Judgement(ACTIVE, best[1], **ev)
    if procs and cpu_share is not None and cpu_share >= CPU_BUSY:
        return Judgement(ACTIVE, "cpu", **ev)
    if best[0] == IDLE_HELD and any(r == "spin" for s, r, *_ in per if s == IDLE_HELD):
        return Judgement(IDLE_HELD, "spin", **ev)
    return Judgement(best[0], best[1], **ev)


# ---------------------------------------------------------------- over time

@dataclass
class Activity:
    """One booking's state over time, as the monitor keeps it (and writes
    it to ``activity.json`` so that a restart keeps the idle clock)."""

    reservation: str
    uid: int
    state: str = UNKNOWN
    reason: str = "no-evidence"
    idle_s: int = 0                   # idle seconds since the last active sample
    idle_since: int | None = None     # the start of this idle streak (its first idle sample)
    last_t: int | None = None         # the last sample that judged it
    nudged: tuple[int, ...] = ()      # idle_nudge_minutes reached in this streak
    cpu: list = field(default_factory=list)   # [(t, dt, seconds)] within CPU_WINDOW_S, newest last
    judgement: Judgement | None = None

    def to_store(self) -> dict:
        return {"uid": self.uid, "state": self.state, "reason": self.reason, "idle_s": self.idle_s,
                "idle_since": self.idle_since, "last_t": self.last_t, "nudged": list(self.nudged)}

    @classmethod
    def from_store(cls, rid: str, d: dict) -> Activity:
        """Raises ValueError for an entry that is not one."""
        if not isinstance(d, dict) or _opt_int(d.get("uid")) is None:
            raise ValueError("not an activity entry")
        state = d.get("state") if d.get("state") in STATES else UNKNOWN
        reason = d.get("reason") if d.get("reason") in REASONS else "no-evidence"
        nudged = d.get("nudged") if isinstance(d.get("nudged"), list) else []
        return cls(rid, d["uid"], state, reason, max(0, _opt_int(d.get("idle_s")) or 0),
                   _opt_int(d.get("idle_since")), _opt_int(d.get("last_t")),
                   tuple(sorted({x for x in nudged if _opt_int(x) is not None})))


def _opt_int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def cpu_share(act: Activity, t: int, seconds: float | None, dt: int) -> float | None:
    """Add this sample's CPU seconds to ``act``'s window; the share of one
    core over the window (None: nothing measured)."""
    if seconds is None:
        return None
    act.cpu.append((t, dt, seconds))
    act.cpu[:] = [x for x in act.cpu if x[0] > t - CPU_WINDOW_S]
    span = sum(x[1] for x in act.cpu)
    return sum(x[2] for x in act.cpu) / span if span > 0 else None


def step(act: Activity, j: Judgement, t: int, interval_s: float) -> Activity:
    """``act`` after the sample at ``t`` judged ``j``."""
    dt = sample_dt(act, t, interval_s)
    was_idle = act.state in IDLE_STATES and act.last_t is not None and t > act.last_t
    if act.last_t is None or t > act.last_t:
        act.last_t = t
    act.state, act.reason, act.judgement = j.state, j.reason, j
    if j.state == ACTIVE:
        act.idle_s, act.idle_since, act.nudged = 0, None, ()
    elif j.state in IDLE_STATES:
        if act.idle_since is None:
            act.idle_since = t
        if was_idle:               # only an interval seen idle at both ends counts
            act.idle_s += dt
    return act


def sample_dt(act: Activity, t: int, interval_s: float) -> int:
    """The seconds the sample at ``t`` stands for, for ``act`` (before
    ``step``): the time since its previous sample, one interval after a
    gap (or for the first), none when the clock did not move or went back
    (the clock is whole seconds, and a test may sample faster)."""
    last = act.last_t
    if last is not None and t <= last:
        return 0
    if last is None or t - last > GAP_INTERVALS * interval_s:
        return max(1, int(round(interval_s)))
    return t - last


# ---------------------------------------------------------------- decisions

@dataclass(frozen=True)
class Decision:
    """What the idle time of one booking calls for now."""

    nudge: int | None = None          # the idle_nudge_minutes threshold reached, not given yet
    release: bool = False             # end the booking now (its opt-in or the policy's)
    release_after_s: int | None = None


def release_after(booking_minutes: int | None, policy_minutes: int | None) -> int | None:
    """Seconds of idle time after which a booking is released: its own
    opt-in (``--idle-release``) first, else the administrator's
    ``idle_release_minutes``; None: never."""
    m = booking_minutes if booking_minutes is not None else policy_minutes
    return None if m is None or m <= 0 else int(m) * 60


def decide(act: Activity, *, now: int, nudge_minutes=NUDGE_MINUTES, release_after_s: int | None = None,
           snoozed_until: int | None = None) -> Decision:
    """The nudge due (the highest threshold reached in this idle streak
    that was not given yet) and whether to release.  Only a booking seen
    idle now (``idle-held`` or ``empty``) is nudged or released; ``unknown``
    never is.  A snooze (keep until a time) holds both back."""
    if act.state not in IDLE_STATES or (snoozed_until is not None and now < snoozed_until):
        return Decision(release_after_s=release_after_s)
    reached = [m for m in sorted(set(nudge_minutes)) if m > 0 and act.idle_s >= m * 60]
    nudge = reached[-1] if reached and reached[-1] not in act.nudged else None
    release = release_after_s is not None and act.idle_s >= release_after_s
    return Decision(nudge, release, release_after_s)


def mark_nudged(act: Activity, minutes: int, nudge_minutes=NUDGE_MINUTES) -> None:
    """Record a nudge as given: it and every lower threshold of this streak."""
    act.nudged = tuple(sorted({m for m in nudge_minutes if m <= minutes} | set(act.nudged)))


# ---------------------------------------------------------------- every booking

def booking_decision(act: Activity, res, *, now: int, nudge_minutes=NUDGE_MINUTES,
                     policy_release_minutes: int | None = None) -> Decision:
    """``decide`` with the booking's own opt-in and snooze, which the
    ledger keeps in the booking's extra fields ``idle_release_minutes``
    (an int) and ``idle_keep_until`` (epoch seconds or ISO-8601 UTC)."""
    extra = getattr(res, "extra", None) or {}
    own = extra.get("idle_release_minutes")
    own = own if isinstance(own, int) and not isinstance(own, bool) else None
    keep = extra.get("idle_keep_until")
    if isinstance(keep, str):
        from bk.core.utctime import parse_utc

        try:
            keep = parse_utc(keep)
        except ValueError:
            keep = None
    keep = keep if isinstance(keep, int) and not isinstance(keep, bool) else None
    return decide(act, now=now, nudge_minutes=nudge_minutes,
                  release_after_s=release_after(own, policy_release_minutes), snoozed_until=keep)


class Tracker:
    """Every running booking's ``Activity`` and every GPU's idle baseline,
    advanced one sample at a time.  The monitor's order per sample:
    ``roots`` (whose CPU to measure), then the CPU from /proc, then
    ``observe``."""

    def __init__(self, interval_s: float = 2.0, *, nudge_minutes=NUDGE_MINUTES,
                 policy_release_minutes: int | None = None):
        self.interval_s = interval_s
        self.nudge_minutes = tuple(nudge_minutes)
        self.policy_release_minutes = policy_release_minutes
        self.bookings: dict[str, Activity] = {}
        self.baselines: dict[str, int] = {}        # GPU UUID -> baseline mW
        self.decisions: dict[str, Decision] = {}   # booking id -> the latest sample's decision

    # -- persistence (bk.store.activity writes and reads the file)

    def to_store(self) -> dict:
        return {"bookings": {rid: a.to_store() for rid, a in sorted(self.bookings.items())},
                "baselines": dict(sorted(self.baselines.items()))}

    def load(self, doc: dict) -> None:
        """Take what a previous monitor kept (unusable entries are skipped)."""
        for rid, d in (doc.get("bookings") or {}).items():
            try:
                self.bookings[str(rid)] = Activity.from_store(str(rid), d)
            except (KeyError, TypeError, ValueError):
                continue
        for uuid, mw in (doc.get("baselines") or {}).items():
            if isinstance(mw, int) and not isinstance(mw, bool) and mw > 0:
                self.baselines[str(uuid)] = mw

    # -- one sample

    def running(self, reservations, t: int) -> list:
        return [r for r in reservations if r.cancelled_at is None and r.start <= t < r.end]

    def roots(self, snapshot, attributions: dict, reservations, t: int) -> dict[str, list[int]]:
        """Booking id -> the PIDs of its own processes on its GPUs (the roots
        of the trees whose CPU counts)."""
        gpus = snapshot.by_index()
        out = {}
        for r in self.running(reservations, t):
            pids = []
            for i in r.gpus:
                g = gpus.get(i)
                for p in (g.processes or ()) if g is not None else ():
                    state, owner = _att(attributions, i, p)
                    if state == "ok" and owner == r.uid:
                        pids.append(p.pid)
            if pids:
                out[r.id] = sorted(set(pids))
        return out

    def baselines_by_index(self, snapshot) -> dict[int, int]:
        return {g.index: self.baselines[g.uuid] for g in snapshot.gpus if g.uuid in self.baselines}

    def observe(self, t: int, snapshot, attributions: dict, reservations,
                cpu_seconds: dict[str, float] | None = None) -> list[Activity]:
        """Judge every running booking at ``t``; forget the others.
        ``cpu_seconds``: booking id -> CPU seconds its trees used since the
        previous sample (a booking missing from it had no processes)."""
        cpu_seconds = cpu_seconds or {}
        gpus = snapshot.by_index()
        base = self.baselines_by_index(snapshot)
        sm_readable = "process_sm" not in snapshot.gaps
        # The NVML backend names a GPU in MIG mode "... (MIG)" and reports the gap "mig".
        hidden = frozenset(g.index for g in snapshot.gpus if "mig" in snapshot.gaps and "(MIG)" in g.name)
        out, keep = [], set()
        for r in self.running(reservations, t):
            act = self.bookings.get(r.id)
            if act is None or act.uid != r.uid:
                act = self.bookings[r.id] = Activity(r.id, r.uid)
            keep.add(r.id)
            share = cpu_share(act, t, cpu_seconds.get(r.id), sample_dt(act, t, self.interval_s))
            j = judge_booking(r, gpus, attributions, base, cpu_share=share, sm_readable=sm_readable,
                              hidden=hidden)
            step(act, j, t, self.interval_s)
            d = booking_decision(act, r, now=t, nudge_minutes=self.nudge_minutes,
                                 policy_release_minutes=self.policy_release_minutes)
            if d.nudge is not None:
                mark_nudged(act, d.nudge, self.nudge_minutes)
            self.decisions[r.id] = d
            out.append(act)
        for rid in set(self.bookings) - keep:
            del self.bookings[rid]
        for rid in set(self.decisions) - keep:
            del self.decisions[rid]
        for g in snapshot.gpus:
            learned = learn_baseline(self.baselines.get(g.uuid), g)
            if learned is not None:
                self.baselines[g.uuid] = learned
        return out

    # -- what the snapshot publishes

    def doc(self, snapshot, reservations) -> dict:
        """The snapshot's ``activity`` object (docs/TELEMETRY.md)."""
        from bk.core.models import iso

        rows = []
        by_id = {r.id: r for r in reservations}
        for rid, act in sorted(self.bookings.items()):
            r = by_id.get(rid)
            if r is None or act.judgement is None:
                continue
            d = self.decisions.get(rid) or Decision()
            rows.append({"reservation": rid, "uid": r.uid, "gpus": list(r.gpus), "state": act.state,
                         "reason": act.reason, "idle_s": act.idle_s, "idle_since": iso(act.idle_since),
                         "nudges": list(act.nudged), "release_after_s": d.release_after_s,
                         "release_due": d.release, "evidence": act.judgement.evidence()})
        gpus = []
        for g in snapshot.gpus:
            b = self.baselines.get(g.uuid)
            gpus.append({"index": g.index, "baseline_mw": b,
                         "threshold_mw": b + margin_mw(g.power_limit_mw) if b is not None else None})
        return {"v": 1, "interval_s": self.interval_s, "bookings": rows, "gpus": gpus}
