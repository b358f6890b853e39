"""What one GPU holds over time, and where a new booking would not fit.

The facts.  A GPU has ``max_shared_users`` share slots.  A shared booking
holds ``share`` slots on each of its GPUs; an exclusive booking holds all of
them, so it overlaps nothing and nothing overlaps it.  When the GPU reports
its total memory, shared bookings also hold VRAM: their explicit per-GPU
value, or by default ``usable * share / capacity``, where usable is the total
minus the administrator's reserve.  Bookings may overlap in any pattern, so
the load is a step function of time that changes only where a booking
starts or ends.

The consequence.  Whether a request fits at start ``s`` does not need a scan
of every slice of ``[s, s + duration)``: it is enough to know the *bad runs*,
the maximal intervals where the load already leaves too little room for the
request (too few slots, or too little memory).  The request fits at ``s``
exactly when ``[s, s + duration)`` meets no bad run.  Bad runs come from one
sort of the booking edges (n log n), and the search in ``scheduler`` never
looks at a slice.

Holds are kept as plain tuples ``(start, end, slots, mem, reservation)``
sorted by start.  Building that index from the whole ledger is one pass
over every booking (about 25 ms at 10,000), and a writer asks for it once
per placement: a booking, an edit, each try of an advance.  Between two
such requests the ledger changes by a few bookings, so the last index is
kept (``_last``, a ``HoldIndex``) and the next one is derived from it by
the change alone.  The change is found by identity (bookings are frozen
records: the same object holds the same facts), the kept index holds its
own copy of the list it was built from, so a list changed in place after
the call cannot make it stale, and anything it cannot derive exactly (the
GPUs or their memory differ, ``now`` went back, many bookings changed) is
built afresh.  A derived index holds the same holds as a fresh one, in a
possibly different order among equal starts, which no query depends on
(``tests/test_capacity_index.py`` compares them on random edits).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import compress
from operator import is_, is_not, itemgetter

from .models import EXCLUSIVE, MODES, SHARED, Blackout, Policy, Reservation, iso

TYPE_CHECKING = False
if TYPE_CHECKING:   # annotations only: collections.abc would import collections
    from collections.abc import Iterable, Mapping, Sequence

# Positions in a hold tuple.
START, END, SLOTS, MEM, RES = range(5)


def usable_mib(total_mib: int | None, reserve_mib: int) -> int | None:
    """VRAM that shared bookings may divide among themselves (None: unknown)."""
    if total_mib is None:
        return None
    return total_mib - reserve_mib


def default_mem(usable: int | None, share: int, capacity: int) -> int | None:
    """A shared booking's VRAM when it did not say: its fraction of usable."""
    if usable is None:
        return None
    # Rounding down keeps ``capacity`` single-slot bookings within usable.
    return max(0, usable) * share // capacity


class GpuLedger:
    """The live holds on one GPU, sorted by start, with the queries the
    scheduler needs.  Build it with ``index_holds``.  ``now``: holds that
    end at or before it hold nothing (a kept index may still list them);
    None: every hold counts."""

    __slots__ = ("index", "capacity", "usable", "holds", "starts", "max_len", "now")

    def __init__(self, index: int, capacity: int, usable: int | None, holds: list[tuple], *,
                 now: int | None = None, starts: list[int] | None = None, max_len: int | None = None):
        if starts is None:
            holds.sort(key=itemgetter(START))
            starts = [h[START] for h in holds]
        self.index = index
        self.capacity = capacity
        self.usable = usable
        self.holds = holds
        self.starts = starts
        # An upper bound of the holds' lengths (a derived index keeps the
        # bound of the holds it dropped): it only bounds the scan below.
        self.max_len = max((h[END] - h[START] for h in holds), default=0) if max_len is None else max_len
        self.now = now

    def overlapping(self, lo: int, hi: int) -> list[tuple]:
        """Holds that cover some instant of ``[lo, hi)``, in start order."""
        # No hold is longer than max_len, so one that still runs at lo
        # started after lo - max_len: the bisect bounds the scan.
        i = bisect_right(self.starts, lo - self.max_len)
        j = bisect_left(self.starts, hi)
        floor = lo if self.now is None or self.now < lo else self.now
        return [h for h in self.holds[i:j] if h[END] > floor]

    def bad_runs(self, need: int, mem: int | None, lo: int, hi: int) -> list[tuple[int, int]]:
        """Maximal intervals, sorted and disjoint, where a request for
        ``need`` slots and ``mem`` MiB would not fit.  Exact inside
        ``[lo, hi)``; outside it only holds reaching into the range count.

        ``mem`` None (or a GPU without memory telemetry) means slots alone
        decide."""
        holds = self.overlapping(lo, hi)
        if not holds:
            return []
        if need >= self.capacity:
            return _union(holds)
        slot_room = self.capacity - need
        check_mem = mem is not None and self.usable is not None
        mem_room = (self.usable - mem) if check_mem else 0
        edges = []
        for h in holds:
            m = (h[MEM] or 0) if check_mem else 0
            edges.append((h[START], h[SLOTS], m))
            edges.append((h[END], -h[SLOTS], -m))
        edges.sort(key=itemgetter(0))
        runs = []
        slots = used = 0
        run_start = None
        i, n = 0, len(edges)
        while i < n:
            t = edges[i][0]
            # Apply every edge at t before judging: a booking that ends at t
            # frees its room for one that starts at t.
            while i < n and edges[i][0] == t:
                slots += edges[i][1]
                used += edges[i][2]
                i += 1
            bad = slots > slot_room or (check_mem and used > mem_room)
            if bad and run_start is None:
                run_start = t
            elif not bad and run_start is not None:
                runs.append((run_start, t))
                run_start = None
        return runs

    def run_end(self, t: int, need: int, mem: int | None) -> int:
        """When the bad run that contains ``t`` ends (``t`` itself if none)."""
        width = max(self.max_len, 1)
        while True:
            hi = t + width
            for a, b in self.bad_runs(need, mem, t, hi):
                if a <= t < b:
                    if b < hi:
                        return b
                    break
            else:
                return t
            # The run reaches the edge of what we looked at: look further.
            width *= 2

    def load_at(self, t: int) -> tuple[int, int, list[tuple]]:
        """Slots, counted VRAM and the holds at instant ``t``."""
        # Sorted fully so that messages do not depend on the ledger's order.
        here = sorted(self.overlapping(t, t + 1), key=lambda h: (h[START], h[END], h[RES].id))
        return (sum(h[SLOTS] for h in here), sum(h[MEM] or 0 for h in here), here)

    def pressure(self, lo: int, hi: int) -> int:
        """Booked slot-seconds in ``[lo, hi)``: how crowded the window is."""
        return sum(h[SLOTS] * (min(h[END], hi) - max(h[START], lo))
                   for h in self.overlapping(lo, hi))


def _union(holds: list[tuple]) -> list[tuple[int, int]]:
    """Merge holds (sorted by start) into disjoint runs; touching ones join."""
    runs = []
    cur_a, cur_b = holds[0][START], holds[0][END]
    for h in holds:
        a = h[START]
        if a > cur_b:
            runs.append((cur_a, cur_b))
            cur_a, cur_b = a, h[END]
        elif h[END] > cur_b:
            cur_b = h[END]
    runs.append((cur_a, cur_b))
    return runs


def _holds(r: Reservation, capacity: int, usable: Mapping[int, int | None]):
    """(gpu, hold) for each GPU of ``usable`` that ``r`` holds (it is live)."""
    if r.mode == EXCLUSIVE:
        return [(g, (r.start, r.end, capacity, None, r)) for g in r.gpus if g in usable]
    share, mem = r.share, r.mem_mib
    return [(g, (r.start, r.end, share, default_mem(usable[g], share, capacity) if mem is None else mem, r))
            for g in r.gpus if g in usable]


MAX_CHANGED = 64        # bookings changed since the kept index beyond which it is built afresh
REBUILD_AFTER = 3600    # seconds of ``now`` after which a kept index is built afresh (drops ended holds)


class HoldIndex:
    """Every hold of ``source`` (its own copy of a ledger's bookings) that
    ends after ``now``, per GPU: ``per[g]`` is (holds sorted by start,
    their starts, a bound of their lengths).  Never changed once made:
    ``derive`` makes a new one, sharing the GPUs the change did not touch."""

    __slots__ = ("source", "key", "now", "per", "by_id")

    def __init__(self, source: list, key: tuple, now: int, per: dict, by_id=None):
        self.source, self.key, self.now, self.per, self.by_id = source, key, now, per, by_id

    @classmethod
    def build(cls, reservations: Sequence[Reservation], *, now: int, capacity: int,
              usable: Mapping[int, int | None]) -> HoldIndex:
        per: dict[int, list] = {g: [] for g in usable}
        source = list(reservations)
        for r in source:
            if r.cancelled_at is not None or r.end <= now:
                continue
            if r.mode == EXCLUSIVE:
                for g in r.gpus:
                    lst = per.get(g)
                    if lst is not None:
                        lst.append((r.start, r.end, capacity, None, r))
                continue
            share = r.share
            for g in r.gpus:
                lst = per.get(g)
                if lst is None:
                    continue
                mem = r.mem_mib
                if mem is None:
                    mem = default_mem(usable[g], share, capacity)
                lst.append((r.start, r.end, share, mem, r))
        out = {}
        for g, holds in per.items():
            holds.sort(key=itemgetter(START))
            out[g] = (holds, [h[START] for h in holds], max((h[END] - h[START] for h in holds), default=0))
        return cls(source, _key(capacity, usable), now, out)

    def derive(self, reservations: Sequence[Reservation], now: int, delta=None) -> HoldIndex | None:
        """The index of ``reservations`` at ``now``, from this one by the
        bookings that differ (by identity); None when a fresh build is due.
        ``delta``: a ``ledgerdoc.Delta`` to ``reservations`` from a list
        holding the records of ``source`` in its order (the caller's own
        comparison, so that the lists are not compared twice)."""
        if now < self.now or now - self.now > REBUILD_AFTER:
            return None
        old = self.source
        if delta is not None and delta.new is reservations and len(delta.old) == len(old):
            gone, fresh = delta.gone, delta.fresh
            if max(len(gone), len(fresh)) > MAX_CHANGED:
                return None
        else:
            n = min(len(old), len(reservations))
            if all(map(is_, old, reservations)):       # the common case, at C speed: nothing, or appends
                at = []
            else:
                at = list(compress(range(n), map(is_not, old, reservations)))
            if len(at) + abs(len(old) - len(reservations)) > MAX_CHANGED:
                return None
            gone = [old[i] for i in at] + old[n:]
            fresh = [reservations[i] for i in at] + list(reservations[n:])
        source = list(reservations)
        if not gone and not fresh:
            return HoldIndex(source, self.key, self.now, self.per, self.by_id)
        capacity, usable = self.key[0], dict(self.key[1])
        per = dict(self.per)
        copied: set[int] = set()

        def lists(g):
            if g not in copied:
                holds, starts, ml = per[g]
                per[g] = (list(holds), list(starts), ml)
                copied.add(g)
            return per[g]
        for r in gone:
            for g, _h in self._held(r, capacity, usable):
                holds, starts, _ml = lists(g)
                _drop(holds, starts, r)
        for r in fresh:
            for g, h in self._held(r, capacity, usable):
                holds, starts, ml = lists(g)
                i = bisect_right(starts, h[START])
                starts.insert(i, h[START])
                holds.insert(i, h)
                if h[END] - h[START] > ml:
                    per[g] = (holds, starts, h[END] - h[START])
        by_id = self.by_id or None          # (ids, changed ids), or not made yet
        if by_id is not None:
            base, over = by_id
            over = dict(over)
            for r in gone:
                if _lookup(base, over, r.id) is r:
                    over[r.id] = None
            for r in fresh:
                if _lookup(base, over, r.id) is not None:
                    over = None               # an id twice: found by a scan if asked
                    break
                over[r.id] = r
            if over is None:
                by_id = None
            elif len(over) > MAX_OVERLAY:
                base = dict(base)
                base.update(over)
                by_id = ({k: v for k, v in base.items() if v is not None}, {})
            else:
                by_id = (base, over)
        return HoldIndex(source, self.key, self.now, per, by_id)

    def _held(self, r: Reservation, capacity: int, usable):
        if r.cancelled_at is not None or r.end <= self.now:
            return []
        return _holds(r, capacity, usable)

    def ignoring(self, rid: str) -> dict:
        """``per`` without the holds of the bookings with id ``rid``."""
        if self.by_id is None:
            by_id: dict | None = {}
            for r in self.source:
                if r.id in by_id:
                    by_id = None
                    break
                by_id[r.id] = r
            self.by_id = (by_id, {}) if by_id is not None else False    # a cache of source, set once
        if not self.by_id:
            return {g: ([h for h in holds if h[RES].id != rid], None, ml) for g, (holds, _s, ml) in self.per.items()}
        r = _lookup(*self.by_id, rid)
        per = dict(self.per)
        if r is None:
            return per
        for g in r.gpus:
            if g in per:
                holds, starts, ml = per[g]
                holds, starts = list(holds), list(starts)
                _drop(holds, starts, r)
                per[g] = (holds, starts, ml)
        return per


MAX_OVERLAY = 256       # ids changed since the id map was last copied whole


def _lookup(base: dict, over: dict, rid: str):
    got = over.get(rid, base)
    return base.get(rid) if got is base else got


def _drop(holds: list, starts: list, r: Reservation) -> None:
    """Remove ``r``'s hold from one GPU's sorted lists (if it has one)."""
    i = bisect_left(starts, r.start)
    while i < len(holds) and starts[i] == r.start:
        if holds[i][RES] is r:
            del holds[i], starts[i]
            return
        i += 1


def _key(capacity: int, usable: Mapping[int, int | None]) -> tuple:
    return capacity, tuple(usable.items())


_last: HoldIndex | None = None     # the index the last request built (module docstring)


def index_holds(reservations: Iterable[Reservation], *, now: int, capacity: int,
                usable: Mapping[int, int | None], ignore_id: str | None = None,
                keep: bool = True) -> dict[int, GpuLedger]:
    """The holds that still matter, per GPU: one pass over the ledger, or
    the kept index of the last call changed by what differs (``keep``;
    False: neither use nor replace it).

    Only GPUs that are keys of ``usable`` get a ledger; cancelled, ended and
    ignored (being edited) reservations hold nothing."""
    global _last
    if not isinstance(reservations, (list, tuple)):
        reservations = list(reservations)
    got = None
    base = _last if keep else None
    if base is not None and base.key == _key(capacity, usable):
        got = base.derive(reservations, now)
    if got is None:
        got = HoldIndex.build(reservations, now=now, capacity=capacity, usable=usable)
    if keep:
        _last = got
    per = got.ignoring(ignore_id) if ignore_id is not None else got.per
    return {g: GpuLedger(g, capacity, usable[g], holds, now=now, starts=starts, max_len=ml)
            for g, (holds, starts, ml) in per.items()}


def check_invariants(reservations: Iterable[Reservation], blackouts: Iterable[Blackout], policy: Policy,
                     gpu_mem: Mapping[int, int | None]) -> list[str]:
    """Every way the ledger breaks SPEC section 4, as sorted messages.

    Counts every reservation that is not cancelled, ended ones too: an edit
    or a bug that overfilled the past is still a bug.  ``gpu_mem`` maps a
    GPU to its total MiB (None or missing: no memory check).  Used by tests
    after every write, by ledger validation and by ``bk doctor``."""
    q, cap, n = policy.slot_seconds, policy.max_shared_users, policy.gpu_count
    problems: list[str] = []
    live: list[Reservation] = []
    seen: set[str] = set()
    for r in reservations:
        if r.id in seen:
            problems.append(f"{r.id}: duplicate id")
        seen.add(r.id)
        if r.cancelled_at is not None:
            continue
        live.append(r)
        tag = f"{r.id} ({r.user})"
        if r.mode not in MODES:
            problems.append(f"{tag}: unknown mode {r.mode!r}")
        if r.mode == SHARED and not 1 <= r.share <= cap:
            problems.append(f"{tag}: share {r.share} outside 1..{cap}")
        if not r.gpus or len(set(r.gpus)) != len(r.gpus) or any(not 0 <= g < n for g in r.gpus):
            problems.append(f"{tag}: bad GPU list {list(r.gpus)}")
        if r.end <= r.start:
            problems.append(f"{tag}: ends at or before its start")
        if r.start % q or r.end % q:
            problems.append(f"{tag}: not aligned to {policy.slot_minutes}-minute slices")
        if r.mem_mib is not None and r.mem_mib <= 0:
            problems.append(f"{tag}: memory {r.mem_mib} MiB is not positive")
    for b in blackouts:
        for r in live:
            if r.start < b.end and b.start < r.end:
                problems.append(f"{r.id} ({r.user}): overlaps blackout {b.id} "
                                f"{iso(b.start)} to {iso(b.end)}")
    if not live:
        return sorted(problems)
    usable = {g: usable_mib(gpu_mem.get(g), policy.shared_memory_reserve_mb) for g in range(n)}
    lo = min(r.start for r in live)
    hi = max(r.end for r in live)
    ledgers = index_holds([r for r in live if r.end > r.start], now=lo - 1, capacity=cap, usable=usable,
                          keep=False)
    for g, ledger in ledgers.items():
        # A request of zero slots and zero memory "does not fit" exactly
        # where the holds alone already exceed the GPU.
        for a, b in ledger.bad_runs(0, 0, lo, hi):
            slots, mem, here = ledger.load_at(a)
            who = ", ".join(sorted(f"{h[RES].id} ({h[RES].user}, {h[RES].mode})" for h in here))
            what = f"{slots}/{cap} slots" if slots > cap else f"{mem}/{usable[g]} MiB"
            problems.append(f"GPU {g} over capacity {iso(a)} to {iso(b)}: {what} held by {who}")
    return sorted(problems)
