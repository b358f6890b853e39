"""Usage history, the pure half: folding samples into period records, and sums.

The facts: the monitor samples every GPU every ``interval_s`` (2 s) and each
sample is a ``Snapshot`` plus the attribution of each process (contract A:
``(gpu, pid) -> Attribution`` with ``.state``, ``.identity``, ``.uid``; a plain
state string from the older ``telemetry.attribute`` is accepted too).  A
sample is an instant; what it stands for is the time since the previous one.
Samples are late when the machine is loaded and missing while the monitor is
down, so a sample counts the seconds since the previous sample, but at most
``3 x interval_s`` (the freshness rule of the snapshot); the first sample
after a gap counts one interval.  Nothing is invented for a gap.

The decision: one ``MinuteRecord`` per (period start, GPU), ``period_s`` = 60
for raw history and 3600 for roll-ups.  It carries the GPU's own readings
(samples, seconds covered, average utilisation, peak memory, seconds without
a process list) and one ``Use`` per (uid, reservation) seen on that GPU:

* a booking active on the GPU (start <= t < end, not cancelled) gets
  ``booked_s`` for every sample, and ``active_s`` for the samples in which a
  process of its owner was attributed ``ok`` there (for a container process
  the attributed uid, the booker, counts as the owner);
* a process attributed ``unreserved`` or ``wrong-gpu`` gives its uid a Use
  with ``reservation`` None and ``unreserved_s``;
* each Use keeps the SM average over the samples where an SM reading existed
  (``sm_avg`` with its weight ``sm_n``) and the peak of the summed memory of
  those processes.

Energy (record format 2): each record has the GPU's energy in the
period from the driver's energy counter (``energy_mj``, with ``energy_s``
the seconds it covers; unknown intervals are left out, and a record with
none has ``energy_mj`` None) and each use its part (``bk.core.energy``:
an exclusive booking all of it; shared bookings the idle baseline by their
slots and the rest by their processes' SM), with ``energy_other_mj`` what
nobody is credited with; the parts and ``other`` add up to ``energy_mj``
exactly.  A format 1 record (before energy) reads as energy unknown.

Averages carry their weights so that roll-ups and totals stay exact: a
roll-up is the weighted mean of the minutes, not the mean of means.  No
command line, label or user name is ever in a record: only uids, reservation
ids, GPU indices and numbers, because the monitor writes them to files that
every user can read.
"""

from __future__ import annotations

from bk.core.record import dataclass, field
from bk.core.telemetry import (
    OK,
    SYSTEM,
    UNKNOWN,
    UNRESERVED,
    WRONG_GPU,
    active_gpus_by_uid,
    attribute,
)

VERSION = 2          # 2: energy fields (a reader ignores the number: every field added is optional)
RAW_PERIOD = 60
ROLLUP_PERIOD = 3600
DAY = 86400


@dataclass(frozen=True)
class Use:
    """One user's use of one GPU in one period, under one booking or none."""

    uid: int
    reservation: str | None = None       # None: use without a booking on this GPU
    mode: str | None = None              # the booking's mode (shared/exclusive)
    booked_s: int = 0
    active_s: int = 0
    unreserved_s: int = 0
    sm_avg: float | None = None          # mean SM % over the sm_n samples that had one
    sm_n: int = 0
    mem_peak_mib: int | None = None
    energy_mj: int | None = None         # its part of the record's energy; None: unknown

    def to_dict(self) -> dict:
        return {"uid": self.uid, "reservation": self.reservation, "mode": self.mode,
                "booked_s": self.booked_s, "active_s": self.active_s,
                "unreserved_s": self.unreserved_s, "sm_avg": self.sm_avg, "sm_n": self.sm_n,
                "mem_peak_mib": self.mem_peak_mib, "energy_mj": self.energy_mj}

    @classmethod
    def from_dict(cls, d: dict) -> Use:
        return cls(int(d["uid"]), d.get("reservation"), d.get("mode"), int(d.get("booked_s", 0)),
                   int(d.get("active_s", 0)), int(d.get("unreserved_s", 0)), d.get("sm_avg"),
                   int(d.get("sm_n", 0)), d.get("mem_peak_mib"), _opt_int(d.get("energy_mj")))


@dataclass(frozen=True)
class MinuteRecord:
    """One GPU over one period ``[t, t + period_s)``."""

    t: int                                # period start, epoch seconds, a multiple of period_s
    gpu: int
    period_s: int = RAW_PERIOD
    samples: int = 0
    covered_s: int = 0                    # seconds the samples stand for
    util_avg: float | None = None         # mean GPU utilisation % over util_n samples
    util_n: int = 0
    mem_peak_mib: int | None = None       # peak memory used on the GPU
    blind_s: int = 0                      # seconds without a process list (a gap, not idle)
    uses: tuple[Use, ...] = field(default=())
    energy_mj: int | None = None          # the GPU's energy in the seconds energy_s covers; None: unknown
    energy_s: int = 0
    energy_other_mj: int | None = None    # the part of energy_mj no use is credited with

    @property
    def end(self) -> int:
        return self.t + self.period_s

    def to_dict(self) -> dict:
        # "t" first: the store reads a line's period from its first bytes.
        return {"t": self.t, "gpu": self.gpu, "v": VERSION, "period_s": self.period_s,
                "samples": self.samples, "covered_s": self.covered_s, "util_avg": self.util_avg,
                "util_n": self.util_n, "mem_peak_mib": self.mem_peak_mib, "blind_s": self.blind_s,
                "uses": [u.to_dict() for u in self.uses], "energy_mj": self.energy_mj,
                "energy_s": self.energy_s, "energy_other_mj": self.energy_other_mj}

    @classmethod
    def from_dict(cls, d: dict) -> MinuteRecord:
        return cls(int(d["t"]), int(d["gpu"]), int(d.get("period_s", RAW_PERIOD)),
                   int(d.get("samples", 0)), int(d.get("covered_s", 0)), d.get("util_avg"),
                   int(d.get("util_n", 0)), d.get("mem_peak_mib"), int(d.get("blind_s", 0)),
                   tuple(Use.from_dict(u) for u in d.get("uses") or ()), _opt_int(d.get("energy_mj")),
                   int(d.get("energy_s") or 0), _opt_int(d.get("energy_other_mj")))


def _opt_int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _add(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


class _Acc:
    """A use being accumulated: sums, not means."""

    __slots__ = ("mode", "booked", "active", "unres", "sm_sum", "sm_n", "mem", "energy")

    def __init__(self, mode=None):
        self.mode = mode
        self.booked = self.active = self.unres = self.sm_n = 0
        self.sm_sum = 0.0
        self.mem = None
        self.energy = None           # float mJ while folding; int in a roll-up; None: unknown

    def take(self, sm_sum: float, sm_n: int, mem: int | None) -> None:
        self.sm_sum += sm_sum
        self.sm_n += sm_n
        self.mem = _max(self.mem, mem)


class _GpuAcc:
    __slots__ = ("samples", "covered", "util_sum", "util_n", "mem", "blind", "uses", "energy", "energy_s",
                 "other")

    def __init__(self):
        self.samples = self.covered = self.util_n = self.blind = 0
        self.util_sum = 0.0
        self.mem = None
        self.uses: dict[tuple[int, str | None], _Acc] = {}
        self.energy = None               # the counter's differences added up (mJ); None: none known
        self.energy_s = 0
        self.other = 0.0

    def record(self, t: int, gpu: int, period_s: int, *, rolled: bool = False) -> MinuteRecord:
        ordered = sorted(self.uses.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))
        if self.energy is None:
            energies, other = {}, None
        elif rolled:                     # sums of settled integers: already exact
            energies = {k: a.energy for k, a in ordered if a.energy is not None}
            other = int(self.other)
        else:
            from bk.core.energy import settle

            energies, other = settle(self.energy, {k: a.energy or 0.0 for k, a in ordered})
        uses = tuple(
            Use(uid, rid, a.mode, a.booked, a.active, a.unres,
                _round(a.sm_sum / a.sm_n) if a.sm_n else None, a.sm_n, a.mem,
                energies.get((uid, rid)) if self.energy is not None else None)
            for (uid, rid), a in ordered)
        return MinuteRecord(t, gpu, period_s, self.samples, self.covered,
                            _round(self.util_sum / self.util_n) if self.util_n else None,
                            self.util_n, self.mem, self.blind, uses, self.energy,
                            self.energy_s if self.energy is not None else 0, other)


def _state_and_uid(att, p) -> tuple[str, int | None]:
    if isinstance(att, str):
        return att, p.uid
    uid = getattr(att, "uid", None)
    return att.state, (p.uid if uid is None else uid)


class Folder:
    """Folds samples into ``MinuteRecord``s, one open period at a time.

    ``add`` returns the records of the period that the sample closed (empty
    while the period is still open); ``flush`` returns the open period as it
    stands (on SIGTERM), marked by fewer seconds covered.  The clock is the
    samples' own ``t``: a sample older than the open period (the clock went
    back) closes it too, so no record ever mixes two periods."""

    def __init__(self, period_s: int = RAW_PERIOD, interval_s: int = 2, *, capacity: int = 2):
        if period_s <= 0 or interval_s <= 0:
            raise ValueError("period_s and interval_s must be positive")
        self.period_s = period_s
        self.interval_s = interval_s
        self.capacity = capacity         # share slots per GPU (max_shared_users): the baseline's split
        self._start: int | None = None
        self._last: int | None = None
        self._gpus: dict[int, _GpuAcc] = {}
        self._counters: dict[int, tuple[int, int]] = {}   # gpu -> (t, energy counter) of its last look

    def _dt(self, t: int) -> int:
        last = self._last
        if last is None or t <= last or t - last > 3 * self.interval_s:
            return self.interval_s
        return t - last

    def _energy(self, t: int, g) -> int | None:
        """This interval's energy on ``g`` from its counter (None: unknown)."""
        from bk.core.energy import counter_delta

        prev = self._counters.get(g.index)
        if g.energy_mj is None:
            self._counters.pop(g.index, None)
            return None
        delta = counter_delta(prev, t, g.energy_mj, interval_s=self.interval_s, limit_mw=g.power_limit_mw)
        if prev is None or t > prev[0]:
            self._counters[g.index] = (t, g.energy_mj)
        return delta

    def add(self, t: int, snapshot, attributions, reservations, *, baselines: dict | None = None,
            capacity: int | None = None, sharers: dict | None = None) -> list[MinuteRecord]:
        """Fold one sample.  ``baselines``: GPU index -> idle baseline (mW,
        ``bk.core.activity``); ``capacity``: the share slots per GPU, when
        the ledger's policy says (else the folder's); ``sharers``: booking
        id -> the uids it is shared with (``bk.core.sharing``), whose
        processes there are credited to them under that booking."""
        from bk.core.energy import OTHER, split

        t = int(t)
        start = t - t % self.period_s
        out: list[MinuteRecord] = []
        if self._start is not None and start != self._start:
            out = self.flush()
        counters = self._counters
        dt = self._dt(t)
        self._last = t
        self._start = start
        attributions = attributions or {}
        booked_now = [r for r in reservations if r.cancelled_at is None and r.start <= t < r.end]
        active_map = None
        for g in snapshot.gpus:
            acc = self._gpus.get(g.index)
            if acc is None:
                acc = self._gpus[g.index] = _GpuAcc()
            acc.samples += 1
            acc.covered += dt
            if g.util is not None:
                acc.util_sum += g.util
                acc.util_n += 1
            acc.mem = _max(acc.mem, g.mem_used_mib)
            before = counters.get(g.index)
            energy = self._energy(t, g)
            here = [r for r in booked_now if g.index in r.gpus]
            for r in here:
                u = acc.uses.get((r.uid, r.id))
                if u is None:
                    u = acc.uses[(r.uid, r.id)] = _Acc(r.mode)
                u.booked += dt
            sm_by_key: dict = {}
            present: set = set()
            if g.processes is None:
                acc.blind += dt
            else:
                self._fold_processes(g, acc, here, dt, t, attributions, booked_now, active_map,
                                     sm_by_key, present, sharers or {})
            if energy is not None:
                span = t - before[0]
                acc.energy = (acc.energy or 0) + energy
                acc.energy_s += span
                holders = [((r.uid, r.id), r.mode, r.share) for r in here]
                parts, other = split(energy, span, baseline_mw=(baselines or {}).get(g.index),
                                     capacity=capacity or self.capacity, holders=holders, sm=sm_by_key,
                                     present=present)
                acc.other += other
                for k, v in parts.items():
                    if k == OTHER:
                        acc.other += v
                        continue
                    u = acc.uses.get(k)
                    if u is None:
                        u = acc.uses[k] = _Acc()
                    u.energy = (u.energy or 0.0) + v
        return out

    def _fold_processes(self, g, acc, here, dt, t, attributions, booked_now, active_map, sm_by_key,
                        present, sharers) -> None:
        """One GPU's processes of one sample: active and unreserved seconds,
        SM and memory per use; and, for the energy split, each use's SM sum
        (``sm_by_key``; unknown and system processes under ``OTHER``) and the
        bookings with a process here (``present``)."""
        from bk.core.energy import OTHER

        # Per uid this sample: (SM sum, SM known?, memory sum, state).
        seen: dict[tuple[int, str], list] = {}
        for p in g.processes:
            att = attributions.get((g.index, p.pid))
            if att is None:
                if active_map is None:
                    active_map = active_gpus_by_uid(booked_now, t)
                att = attribute(p, g.index, active_map)
            state, uid = _state_and_uid(att, p)
            if uid is None or state in (SYSTEM, UNKNOWN):
                if p.sm:
                    sm_by_key[OTHER] = sm_by_key.get(OTHER, 0) + p.sm
                continue
            kind = OK if state == OK else (UNRESERVED if state in (UNRESERVED, WRONG_GPU) else None)
            if kind is None:
                if p.sm:
                    sm_by_key[OTHER] = sm_by_key.get(OTHER, 0) + p.sm
                continue
            s = seen.get((uid, kind))
            if s is None:
                s = seen[(uid, kind)] = [0.0, False, None]
            if p.sm is not None:
                s[0] += p.sm
                s[1] = True
            if p.mem_mib is not None:
                s[2] = (s[2] or 0) + p.mem_mib
        for (uid, kind), (sm, sm_known, mem) in seen.items():
            if kind == OK:
                owned = [r for r in here if r.uid == uid] or \
                    [r for r in here if uid in sharers.get(r.id, ())]
                if not owned:
                    # ok without a booking here: the attribution knew of
                    # one the reservations given to us do not; count it
                    # as use, not as a booking.
                    owned = None
                for r in owned or ():
                    u = acc.uses.get((uid, r.id))
                    if u is None:       # a user the booking is shared with (no booked time of theirs)
                        u = acc.uses[(uid, r.id)] = _Acc(r.mode)
                    u.active += dt
                    u.take(sm, int(sm_known), mem)
                    present.add((uid, r.id))
                    if sm:
                        sm_by_key[(uid, r.id)] = sm_by_key.get((uid, r.id), 0) + sm / len(owned)
                if owned is not None:
                    continue
            u = acc.uses.get((uid, None))
            if u is None:
                u = acc.uses[(uid, None)] = _Acc()
            u.unres += dt
            u.take(sm, int(sm_known), mem)
            if sm:
                sm_by_key[(uid, None)] = sm_by_key.get((uid, None), 0) + sm

    def flush(self) -> list[MinuteRecord]:
        """The open period's records (possibly partial); the folder is then empty."""
        if self._start is None:
            return []
        out = [acc.record(self._start, gpu, self.period_s) for gpu, acc in sorted(self._gpus.items())]
        self._gpus = {}
        self._start = None
        return out

    def pending(self) -> list[MinuteRecord]:
        """The open period as it stands, without closing it (live views)."""
        if self._start is None:
            return []
        return [acc.record(self._start, gpu, self.period_s) for gpu, acc in sorted(self._gpus.items())]


# ---------------------------------------------------------------- roll-ups

def rollup(records, period_s: int = ROLLUP_PERIOD) -> list[MinuteRecord]:
    """Coarser records: one per (period, GPU), sums added, averages weighted,
    peaks kept.  Rolling up a roll-up with the same period changes nothing."""
    groups: dict[tuple[int, int], list[MinuteRecord]] = {}
    for r in records:
        groups.setdefault((r.t - r.t % period_s, r.gpu), []).append(r)
    out = []
    for (t, gpu), rs in sorted(groups.items()):
        acc = _GpuAcc()
        for r in rs:
            acc.samples += r.samples
            acc.covered += r.covered_s
            acc.blind += r.blind_s
            if r.util_n:
                acc.util_sum += (r.util_avg or 0.0) * r.util_n
                acc.util_n += r.util_n
            acc.mem = _max(acc.mem, r.mem_peak_mib)
            if r.energy_mj is not None:
                acc.energy = (acc.energy or 0) + r.energy_mj
                acc.energy_s += r.energy_s
                acc.other += r.energy_other_mj or 0
            for u in r.uses:
                a = acc.uses.get((u.uid, u.reservation))
                if a is None:
                    a = acc.uses[(u.uid, u.reservation)] = _Acc(u.mode)
                a.booked += u.booked_s
                a.active += u.active_s
                a.unres += u.unreserved_s
                a.take((u.sm_avg or 0.0) * u.sm_n, u.sm_n, u.mem_peak_mib)
                a.energy = _add(a.energy, u.energy_mj)
        out.append(acc.record(t, gpu, period_s, rolled=True))
    return out


# ---------------------------------------------------------------- totals

@dataclass
class Totals:
    """Sums over a set of records for one user, GPU or booking.

    ``idle_s`` is booked time in which no process of the booker was seen;
    ``sm_avg`` is SM % for users and bookings, GPU utilisation for GPUs."""

    booked_s: int = 0
    active_s: int = 0
    unreserved_s: int = 0
    sm_sum: float = 0.0
    sm_n: int = 0
    mem_peak_mib: int | None = None
    covered_s: int = 0
    first: int | None = None          # first period start with something counted
    last: int | None = None           # end of the last such period
    energy_mj: int | None = None      # known energy (the parts of records that had it); None: none known

    @property
    def idle_s(self) -> int:
        return max(self.booked_s - self.active_s, 0)

    @property
    def idle_share(self) -> float | None:
        return None if not self.booked_s else round(self.idle_s / self.booked_s, 4)

    @property
    def sm_avg(self) -> float | None:
        return _round(self.sm_sum / self.sm_n) if self.sm_n else None

    def add_use(self, u: Use, t: int, end: int) -> None:
        self.booked_s += u.booked_s
        self.active_s += u.active_s
        self.unreserved_s += u.unreserved_s
        if u.sm_n:
            self.sm_sum += (u.sm_avg or 0.0) * u.sm_n
            self.sm_n += u.sm_n
        self.mem_peak_mib = _max(self.mem_peak_mib, u.mem_peak_mib)
        self.energy_mj = _add(self.energy_mj, u.energy_mj)
        self.first = t if self.first is None else min(self.first, t)
        self.last = end if self.last is None else max(self.last, end)

    def merge(self, o: Totals) -> None:
        self.booked_s += o.booked_s
        self.active_s += o.active_s
        self.unreserved_s += o.unreserved_s
        self.sm_sum += o.sm_sum
        self.sm_n += o.sm_n
        self.covered_s += o.covered_s
        self.mem_peak_mib = _max(self.mem_peak_mib, o.mem_peak_mib)
        self.energy_mj = _add(self.energy_mj, o.energy_mj)
        if o.first is not None:
            self.first = o.first if self.first is None else min(self.first, o.first)
            self.last = o.last if self.last is None else max(self.last, o.last)

    def to_dict(self) -> dict:
        return {"booked_s": self.booked_s, "active_s": self.active_s, "idle_s": self.idle_s,
                "idle_share": self.idle_share, "unreserved_s": self.unreserved_s,
                "sm_avg": self.sm_avg, "sm_n": self.sm_n, "mem_peak_mib": self.mem_peak_mib,
                "covered_s": self.covered_s, "first": self.first, "last": self.last}

    @classmethod
    def from_dict(cls, d: dict) -> Totals:
        sm_n = int(d.get("sm_n", 0))
        return cls(int(d.get("booked_s", 0)), int(d.get("active_s", 0)), int(d.get("unreserved_s", 0)),
                   (d.get("sm_avg") or 0.0) * sm_n if d.get("sm_sum") is None else float(d["sm_sum"]),
                   sm_n, d.get("mem_peak_mib"), int(d.get("covered_s", 0)), d.get("first"), d.get("last"),
                   _opt_int(d.get("energy_mj")))

    def to_store(self) -> dict:
        """The exact form (the SM sum, not its rounded mean) kept in seals."""
        d = self.to_dict()
        d["sm_sum"] = self.sm_sum
        d["energy_mj"] = self.energy_mj
        del d["idle_s"], d["idle_share"], d["sm_avg"]
        return d


@dataclass
class Summary:
    """Totals by user, by GPU and by booking (the reservation's Totals also
    record its owner and GPUs)."""

    by_uid: dict = field(default_factory=dict)            # uid -> Totals
    by_gpu: dict = field(default_factory=dict)            # gpu -> Totals
    by_reservation: dict = field(default_factory=dict)    # rid -> Totals
    owners: dict = field(default_factory=dict)            # rid -> uid
    booking_gpus: dict = field(default_factory=dict)      # rid -> set of gpus
    records: int = 0

    def add(self, r: MinuteRecord) -> None:
        self.add_dict(r.to_dict())

    def add_dict(self, r: dict) -> None:
        """``add`` for a record in its stored form (``MinuteRecord.to_dict``):
        a query over a day of raw lines sums the parsed JSON without making
        ~10,000 records first (twice as fast; benchmarks/usage.py)."""
        self.records += 1
        gpu, t0 = r["gpu"], r["t"]
        end = t0 + r.get("period_s", RAW_PERIOD)
        g = self.by_gpu.get(gpu)
        if g is None:
            g = self.by_gpu[gpu] = Totals()
        g.covered_s += r.get("covered_s", 0)
        n = r.get("util_n", 0)
        if n:
            g.sm_sum += (r.get("util_avg") or 0.0) * n
            g.sm_n += n
        g.mem_peak_mib = _max(g.mem_peak_mib, r.get("mem_peak_mib"))
        e = r.get("energy_mj")
        if e is not None:
            g.energy_mj = e if g.energy_mj is None else g.energy_mj + e
        if g.first is None or t0 < g.first:
            g.first = t0
        if g.last is None or end > g.last:
            g.last = end
        for u in r.get("uses") or ():
            uid, rid = u["uid"], u.get("reservation")
            booked, active, unres = u.get("booked_s", 0), u.get("active_s", 0), u.get("unreserved_s", 0)
            sm_n = u.get("sm_n", 0)
            sm_sum = (u.get("sm_avg") or 0.0) * sm_n
            peak = u.get("mem_peak_mib")
            energy = u.get("energy_mj")
            g.booked_s += booked
            g.active_s += active
            g.unreserved_s += unres
            targets = [self.by_uid.get(uid)]
            if targets[0] is None:
                targets[0] = self.by_uid[uid] = Totals()
            if rid is not None:
                b = self.by_reservation.get(rid)
                if b is None:
                    b = self.by_reservation[rid] = Totals()
                    self.owners[rid] = uid
                    self.booking_gpus[rid] = set()
                elif booked:
                    # A shared booking has uses of others (issue 27): its
                    # owner is the one it is booked for.
                    self.owners[rid] = uid
                self.booking_gpus[rid].add(gpu)
                targets.append(b)
            for t in targets:
                t.booked_s += booked
                t.active_s += active
                t.unreserved_s += unres
                if sm_n:
                    t.sm_sum += sm_sum
                    t.sm_n += sm_n
                if peak is not None and (t.mem_peak_mib is None or peak > t.mem_peak_mib):
                    t.mem_peak_mib = peak
                if energy is not None:
                    t.energy_mj = energy if t.energy_mj is None else t.energy_mj + energy
                if t.first is None or t0 < t.first:
                    t.first = t0
                if t.last is None or end > t.last:
                    t.last = end

    def merge(self, o: Summary) -> None:
        self.records += o.records
        for mine, theirs in ((self.by_uid, o.by_uid), (self.by_gpu, o.by_gpu),
                             (self.by_reservation, o.by_reservation)):
            for k, v in theirs.items():
                t = mine.get(k)
                if t is None:
                    t = mine[k] = Totals()
                t.merge(v)
        self.owners.update(o.owners)
        for k, v in o.booking_gpus.items():
            self.booking_gpus.setdefault(k, set()).update(v)

    def to_store(self) -> dict:
        return {"records": self.records,
                "by_uid": {str(k): v.to_store() for k, v in sorted(self.by_uid.items())},
                "by_gpu": {str(k): v.to_store() for k, v in sorted(self.by_gpu.items())},
                "by_reservation": {k: dict(v.to_store(), uid=self.owners[k],
                                           gpus=sorted(self.booking_gpus[k]))
                                   for k, v in sorted(self.by_reservation.items())}}

    @classmethod
    def from_store(cls, d: dict) -> Summary:
        s = cls(records=int(d.get("records", 0)))
        s.by_uid = {int(k): Totals.from_dict(v) for k, v in (d.get("by_uid") or {}).items()}
        s.by_gpu = {int(k): Totals.from_dict(v) for k, v in (d.get("by_gpu") or {}).items()}
        for k, v in (d.get("by_reservation") or {}).items():
            s.by_reservation[k] = Totals.from_dict(v)
            s.owners[k] = int(v["uid"])
            s.booking_gpus[k] = set(v.get("gpus") or ())
        return s


def summarise(records) -> Summary:
    s = Summary()
    for r in records:
        s.add(r)
    return s


# ---------------------------------------------------------------- events

@dataclass(frozen=True)
class Event:
    """A derived episode: ``unreserved`` (a user ran on a GPU without a
    booking there) or ``idle-booking`` (booked time with no process of the
    booker, at least ``min_idle_s`` in a row)."""

    kind: str
    uid: int
    gpu: int
    start: int
    end: int
    seconds: int
    reservation: str | None = None
    mem_peak_mib: int | None = None
    sm_avg: float | None = None


UNRESERVED_EVENT = "unreserved"
IDLE_EVENT = "idle-booking"


def events(records, *, min_idle_s: int = 1800, min_unreserved_s: int = 0) -> list[Event]:
    """Episodes from records: consecutive periods (one ending where the next
    starts) of the same (kind, uid, GPU, booking) join into one."""
    runs: dict[tuple, list] = {}
    done: list[Event] = []

    def close(key, run):
        kind, uid, gpu, rid = key
        start, end, secs, mem, sm_sum, sm_n = run
        if kind == IDLE_EVENT and secs < min_idle_s:
            return
        if kind == UNRESERVED_EVENT and secs <= min_unreserved_s:
            return
        done.append(Event(kind, uid, gpu, start, end, secs, rid, mem,
                          _round(sm_sum / sm_n) if sm_n else None))

    for r in sorted(records, key=lambda r: (r.t, r.gpu)):
        end = r.t + r.period_s
        for u in r.uses:
            if u.reservation is None and u.unreserved_s > 0:
                key, secs = (UNRESERVED_EVENT, u.uid, r.gpu, None), u.unreserved_s
            elif u.reservation is not None and u.booked_s > 0 and u.active_s == 0 and r.blind_s == 0:
                key, secs = (IDLE_EVENT, u.uid, r.gpu, u.reservation), u.booked_s
            else:
                continue
            run = runs.get(key)
            if run is not None and run[1] < r.t:
                close(key, run)
                run = None
            if run is None:
                runs[key] = [r.t, end, secs, u.mem_peak_mib, (u.sm_avg or 0.0) * u.sm_n, u.sm_n]
            else:
                run[1] = end
                run[2] += secs
                run[3] = _max(run[3], u.mem_peak_mib)
                run[4] += (u.sm_avg or 0.0) * u.sm_n
                run[5] += u.sm_n
        # A run not continued by this period's start is over; closing lazily
        # (above) is enough because records come in time order.
    for key, run in runs.items():
        close(key, run)
    done.sort(key=lambda e: (e.start, e.gpu, e.uid, e.kind))
    return done


def day_start(t: int) -> int:
    return t - t % DAY


# ---------------------------------------------------------------- --since

_AGO = None


def parse_since(text: str, now: int, tz) -> int:
    """``30d``, ``2w``, ``12h``, ``90m`` (that long before ``now``),
    ``today`` (local midnight), ``YYYY-MM-DD`` (local midnight of that day)
    or an ISO-8601 time -> epoch seconds.  Raises InvalidInput."""
    import re
    from datetime import datetime

    from bk.core.errors import InvalidInput
    from bk.core.utctime import parse_iso_general

    global _AGO
    if _AGO is None:
        _AGO = re.compile(r"(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?")
    s = (text or "").strip().lower()
    hint = "examples: 30d, 2w, 12h, today, 2026-11-01, 2026-11-01T08:00Z"
    m = _AGO.fullmatch(s)
    if s and m and m.lastindex:
        w, d, h, mi = (int(g) if g else 0 for g in m.groups())
        return now - (((w * 7 + d) * 24 + h) * 60 + mi) * 60
    if s == "today":
        return local_midnight(now, tz)
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", s):
        try:
            day = datetime.strptime(s, "%Y-%m-%d").replace(tzinfo=tz)
        except ValueError:
            raise InvalidInput(f"{text!r} is not a date", hint) from None
        return int(day.timestamp())
    try:
        return parse_iso_general(text.strip())
    except ValueError:
        raise InvalidInput(f"cannot read {text!r} as a time", hint) from None


def local_midnight(t: int, tz) -> int:
    """The start of the local day that holds ``t``."""
    from datetime import datetime

    d = datetime.fromtimestamp(t, tz)
    return int(d.replace(hour=0, minute=0, second=0, microsecond=0).timestamp())


def local_days(now: int, tz, n: int) -> list[tuple[int, int]]:
    """The last ``n`` local days as (start, end), oldest first, today last
    (its end is tomorrow's midnight).  DST days are 23 or 25 hours long."""
    from datetime import datetime, timedelta

    today = datetime.fromtimestamp(now, tz).replace(hour=0, minute=0, second=0, microsecond=0)
    out = []
    for k in range(n - 1, -1, -1):
        a = (today - timedelta(days=k)).replace(tzinfo=tz)
        b = (today - timedelta(days=k - 1)).replace(tzinfo=tz)
        out.append((int(a.timestamp()), int(b.timestamp())))
    return out
