"""The pure scheduler: where and when a booking goes, and if not, why not.

``place`` answers one request against the live ledger, the policy, the GPU
snapshot and ``now``; it never reads a clock or a file, so the service layer
can call it inside its storage transaction and tests can call it with any
world they like.

The search.  A GPU can take the request at start ``s`` unless the window
``[s, s + duration)`` meets one of the GPU's *bad runs* (``capacity``): so
the starts it cannot take form a few intervals, one per bad run, reaching
back ``duration`` before the run.  Blackouts block every GPU the same way.
Each such interval begins or ends at a slice boundary, and sweeping all of
them in time order keeps a count of blocked GPUs: the earliest start is the
requested one, or the first boundary where enough eligible GPUs are free.
That boundary is always the (rounded-up) end of a booking or a blackout, as
SPEC section 4 says; no slice is ever visited, and the cost is one sort of
the ledger's edges.  ``tests/reference_scheduler.py`` checks this against a
brute-force slice scanner.

Refusals.  Every refusal raises the error class of its rule with
``details["rule"]`` set to one of ``RULES``; the first rule that fails in
this order wins: input, max_length, require_shared_memory, horizon, then the
GPU rules (gpu_count, disabled_gpu, memory, excluded), then blackout (for
an exact start) and capacity.
"""

from __future__ import annotations

from bisect import bisect_right

from bk.core.record import dataclass
from bk.core.timegrid import counted
from bk.core.utctime import datetime, timezone, tzinfo

from .capacity import RES, check_invariants, default_mem, index_holds, usable_mib
from .errors import Conflict, InvalidInput, PolicyRefused
from .models import EXCLUSIVE, MODES, SHARED, Blackout, GpuInfo, Policy, Reservation, iso
from .telemetry import UNRESERVED_LOAD

TYPE_CHECKING = False
if TYPE_CHECKING:   # annotations only: collections.abc would import collections
    from collections.abc import Mapping, Sequence

__all__ = ["RULES", "Placement", "Request", "check_invariants", "effective_mem",
           "options_now", "place", "recommend"]

RULES = ("input", "max_length", "require_shared_memory", "horizon", "gpu_count",
         "disabled_gpu", "memory", "excluded", "blackout", "capacity")

_STATE_RANK = {"idle": 0, "unknown": 1, "busy": 2}
# The first range a placement sweeps (seconds ahead, or four times the
# request's length): a booking that fits soon looks at the holds of the next
# hour only, not at every booking of the day (first_fit widens it fourfold).
FIRST_SWEEP = 3600


@dataclass(frozen=True)
class Request:
    """What the user asked for, already parsed (the grammar lives elsewhere)."""

    count: int                              # number of GPUs
    duration: int                           # seconds, whole slices
    mode: str = SHARED                      # SHARED | EXCLUSIVE
    share: int = 1                          # slots per GPU for shared bookings
    mem_mib: int | None = None              # per-GPU VRAM expectation
    start: int | None = None                # None: now's slice; else an exact aligned start
    queue: bool = False                     # exact start: take the earliest at or after it
    pinned: tuple[int, ...] | None = None   # -g: exactly these GPUs
    excluded: tuple[int, ...] = ()          # -e
    ignore_id: str | None = None            # edits: the reservation being replaced


@dataclass(frozen=True)
class Placement:
    start: int
    end: int
    gpus: tuple[int, ...]
    queued: bool                            # later than requested (or than now's slice)
    reasons: dict[int, str]                 # per GPU: why chosen, or why not
    mem_mib_effective: int | None           # VRAM counted per GPU (smallest over the GPUs)


def _floor(t: int, slot_seconds: int) -> int:
    # Seconds, unlike timegrid (minutes, validated on each call): the search
    # calls these once per bad run.
    return t - t % slot_seconds


def _ceil(t: int, slot_seconds: int) -> int:
    return -(-t // slot_seconds) * slot_seconds


def effective_mem(res_or_req: Reservation | Request, policy: Policy, gpu_total_mib: int | None) -> int | None:
    """The VRAM a booking counts as on one GPU (SPEC section 4).

    Shared: its explicit per-GPU value, else ``usable * share / capacity``
    when the GPU reports its total, else None (slots alone decide).
    Exclusive: the whole GPU when known, else the explicit value."""
    if res_or_req.mode == EXCLUSIVE:
        return gpu_total_mib if gpu_total_mib is not None else res_or_req.mem_mib
    if res_or_req.mem_mib is not None:
        return res_or_req.mem_mib
    usable = usable_mib(gpu_total_mib, policy.shared_memory_reserve_mb)
    return default_mem(usable, res_or_req.share, policy.max_shared_users)


def place(req: Request, *, reservations: Sequence[Reservation], blackouts: Sequence[Blackout],
          policy: Policy, gpus: Sequence[GpuInfo] | None, now: int,
          load: Mapping[int, float] | None = None, tz: tzinfo | None = None,
          allow_past_start: bool = False) -> Placement:
    """Place one request, or raise the error of the first rule that refuses.

    ``tz`` is the zone for times in messages (UTC when None).
    ``allow_past_start`` lets an edit of a running booking keep its original
    start, which lies before now's slice."""
    plan = _Plan(req, reservations, blackouts, policy, gpus, now, load, tz, allow_past_start, window=True)
    s = plan.first_fit()
    if s is None:
        plan.refuse_capacity()
    return plan.placement(s, plan.choose(s))


def recommend(req: Request, *, reservations: Sequence[Reservation], blackouts: Sequence[Blackout],
              policy: Policy, gpus: Sequence[GpuInfo] | None, now: int,
              load: Mapping[int, float] | None = None, tz: tzinfo | None = None,
              alternatives: int = 3) -> list[Placement]:
    """Up to ``alternatives`` distinct options, earliest first, for ``bk slots``.

    Options differ in start or in GPU set: at each start the best set comes
    first, then disjoint runners-up; a later start is offered when its GPU
    set differs or it begins after an earlier option with that set ends.
    Always searches (as if ``queue`` were set); raises like ``place`` when
    nothing fits at all."""
    plan = _Plan(req, reservations, blackouts, policy, gpus, now, load, tz, False, force_queue=True)
    options: list[Placement] = []
    frm = plan.requested
    while len(options) < alternatives:
        s = plan.earliest(frm)
        if s is None:
            break
        plan.options_at(s, options, alternatives)
        # Nothing new can appear before the blocked set changes or an
        # offered window ends: jump there instead of stepping slices.
        later = [o.end for o in options if o.end > s]
        nxt = plan.next_change(s)
        if nxt is not None:
            later.append(nxt)
        if not later:
            break
        frm = min(later)
    if not options:
        plan.refuse_capacity()
    return options


def options_now(req: Request, *, reservations: Sequence[Reservation], blackouts: Sequence[Blackout],
                policy: Policy, gpus: Sequence[GpuInfo] | None, now: int, complete_until: int,
                load: Mapping[int, float] | None = None, tz: tzinfo | None = None,
                alternatives: int = 3) -> list[Placement] | None:
    """The options of ``recommend`` that start at the requested time (the
    ones ``bk g`` shows), from ``reservations`` that hold every booking
    holding capacity before ``complete_until``, and maybe some later ones.

    ``recommend`` offers the options at the requested start first, and
    whether a GPU fits there, how it ranks and why another does not are
    told by the bookings of the window, except when a booking holding it
    there belongs to a run that lasts to ``complete_until`` or beyond (the
    reason says when it ends).  So these are ``recommend``'s options at
    that start, or None where that is not known from these bookings
    (nothing fits then, a reason reaches that far): the caller asks
    ``recommend`` with every booking.  Refusals are ``recommend``'s."""
    plan = _Plan(req, reservations, blackouts, policy, gpus, now, load, tz, False, force_queue=True,
                 until=complete_until)
    s = plan.requested
    if s + plan.d > complete_until or plan.earliest(s) != s:
        return None
    options = plan.options_at(s, [], alternatives)
    return None if plan.reach >= complete_until else options


class _Plan:
    """One request checked against the static rules, with the index and
    the blocked intervals its search needs."""

    def __init__(self, req, reservations, blackouts, policy, gpus, now, load, tz,
                 allow_past_start, force_queue=False, window=False, until=None):
        self.req, self.policy, self.now, self.tz = req, policy, now, tz or timezone.utc
        self.q = policy.slot_seconds
        self.cap = policy.max_shared_users
        _validate(req, policy, now, allow_past_start)
        self.requested = _floor(now, self.q) if req.start is None else req.start
        self.d = req.duration
        self.exact = req.start is not None and not req.queue and not force_queue
        self.need = self.cap if req.mode == EXCLUSIVE else req.share
        info = {g.index: g for g in gpus or ()}
        self.info = info
        self.total = {g: (info[g].mem_total_mib if g in info else None) for g in range(policy.gpu_count)}
        self.usable = {g: usable_mib(t, policy.shared_memory_reserve_mb) for g, t in self.total.items()}
        self.mem = {g: self._request_mem(g) for g in range(policy.gpu_count)}
        self.load = load or {}
        self.prio = dict(policy.gpu_priority)
        self._check_policy()
        self.eligible, self.ineligible = self._eligibility()
        self.limited_by = "exact start"
        self.latest = self._latest_start()
        self.blackouts = sorted(blackouts, key=lambda b: (b.start, b.end, b.id))
        if self.exact:
            self._refuse_blackout()
        self.ledgers = index_holds(reservations, now=now, capacity=self.cap,
                                   usable=self.usable, ignore_id=req.ignore_id)
        self.reach = self.requested         # the latest end of a run a reason names (options_now)
        # ``window``: sweep only as far ahead as the search needs (first_fit),
        # an hour (or four times the request) first; ``until``: only as far
        # as the bookings given are all there are.
        self._build_sweep(self.requested + max(4 * self.d, FIRST_SWEEP) if window else until)

    # -- static rules -------------------------------------------------------

    def _request_mem(self, g: int) -> int | None:
        """The VRAM this request counts as on GPU ``g`` (None: not checked)."""
        if self.req.mode == EXCLUSIVE:
            return None
        return self.req.mem_mib if self.req.mem_mib is not None else \
            default_mem(self.usable[g], self.req.share, self.cap)

    def _check_policy(self) -> None:
        req, p = self.req, self.policy
        if req.duration > p.max_booking_hours * 3600:
            raise PolicyRefused(
                f"a booking may last at most {p.max_booking_hours} h (max_booking_hours); "
                f"{_dur(req.duration)} asked",
                f"book at most {p.max_booking_hours} h",
                details={"rule": "max_length", "duration": req.duration,
                         "max_booking_hours": p.max_booking_hours})
        if req.mode == SHARED and req.mem_mib is None and p.require_shared_memory:
            raise PolicyRefused(
                "this server requires the expected VRAM per GPU for shared bookings "
                "(require_shared_memory)",
                "add -m, for example -m 12g", details={"rule": "require_shared_memory"})
        horizon_end = self.now + p.booking_horizon_days * 86400
        if self.requested + self.d > horizon_end:
            raise PolicyRefused(
                f"a booking must end within {counted(p.booking_horizon_days, 'day')} of now "
                f"(booking_horizon_days): {self._span(self.requested, self.requested + self.d)} "
                f"ends after {self._clock(horizon_end)}",
                "choose an earlier start or a shorter duration",
                details={"rule": "horizon", "start": iso(self.requested),
                         "end": iso(self.requested + self.d), "horizon_end": iso(horizon_end),
                         "booking_horizon_days": p.booking_horizon_days})

    def _latest_start(self) -> int:
        """The last start the search may return: the queue window or the
        horizon, whichever ends first (the requested start fits both)."""
        if self.exact:
            return self.requested
        by_horizon = _floor(self.now + self.policy.booking_horizon_days * 86400 - self.d, self.q)
        self.limited_by = "queue_search_hours"
        by_queue = self.requested + self.policy.queue_search_hours * 3600
        if by_horizon < by_queue:
            self.limited_by = "horizon"
            return by_horizon
        return by_queue

    def _eligibility(self) -> tuple[list[int], dict[int, str]]:
        req, p = self.req, self.policy
        pinned = set(req.pinned) if req.pinned is not None else None
        eligible, why, rule = [], {}, {}
        for g in range(p.gpu_count):
            if pinned is not None and g not in pinned:
                why[g] = "not among the pinned GPUs (-g)"
            elif g in req.excluded:
                why[g], rule[g] = "excluded (-e)", "excluded"
            elif g in p.disabled_gpus:
                why[g], rule[g] = "disabled by policy", "disabled_gpu"
            elif (msg := self._memory_misfit(g)) is not None:
                why[g], rule[g] = msg, "memory"
            else:
                eligible.append(g)
        if len(eligible) >= req.count:
            return eligible, why
        if pinned is None and req.count > p.gpu_count:
            raise Conflict(f"{_gpus(req.count)} asked; this server has {p.gpu_count}",
                           details={"rule": "gpu_count", "gpu_count": p.gpu_count})
        blamed = sorted(rule)
        first = next(r for r in ("disabled_gpu", "memory", "excluded") if r in rule.values())
        listing = "; ".join(f"GPU {g} {why[g]}" for g in blamed)
        details = {"rule": first, "gpus": {str(g): why[g] for g in blamed}}
        if pinned is not None:
            msg = f"pinned GPUs cannot be booked: {listing}"
        else:
            msg = f"{_gpus(req.count)} asked but only {len(eligible)} can be booked: {listing}"
        cls = PolicyRefused if first == "disabled_gpu" else Conflict
        hint = ("ask for less memory per GPU (-m), or fewer GPUs" if first == "memory"
                else "pin or exclude other GPUs (see bk g)")
        raise cls(msg, hint, details=details)

    def _memory_misfit(self, g: int) -> str | None:
        req, total, usable = self.req, self.total[g], self.usable[g]
        if total is None:
            return None
        if req.mode == EXCLUSIVE:
            if req.mem_mib is not None and req.mem_mib > total:
                return f"memory: {req.mem_mib} MiB asked, the GPU has {total} MiB"
            return None
        if usable <= 0:
            return (f"memory: no VRAM left for shared bookings ({total} MiB total, "
                    f"{self.policy.shared_memory_reserve_mb} MiB reserved)")
        if req.mem_mib is not None and req.mem_mib > usable:
            return (f"memory: {req.mem_mib} MiB asked, {usable} MiB usable "
                    f"({total} MiB total - {self.policy.shared_memory_reserve_mb} MiB reserve)")
        return None

    def _refuse_blackout(self) -> None:
        s, e = self.requested, self.requested + self.d
        for b in self.blackouts:
            if b.start < e and s < b.end:
                raise PolicyRefused(
                    f"{self._span(s, e)} overlaps the maintenance window {self._span(b.start, b.end)}"
                    + (f": {b.reason}" if b.reason else ""),
                    f"choose a start at or after {self._clock(_ceil(b.end, self.q))}, or add --queue",
                    details={"rule": "blackout", "blackout": {
                        "id": b.id, "start": iso(b.start), "end": iso(b.end), "reason": b.reason}})

    # -- the search ---------------------------------------------------------

    def _blocked(self, runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Aligned starts ``[A, B)`` whose window meets one of ``runs``."""
        q, d = self.q, self.d
        out: list[tuple[int, int]] = []
        for a, b in runs:
            lo = _floor(a - d, q) + q      # first aligned s with s + d > a
            hi = _ceil(b, q)               # first aligned s at or after b
            if lo >= hi:
                continue
            if out and lo <= out[-1][1]:
                if hi > out[-1][1]:
                    out[-1] = (out[-1][0], hi)
            else:
                out.append((lo, hi))
        return out

    def _build_sweep(self, until: int | None = None) -> None:
        """The blocked starts of every eligible GPU, exact for each start
        whose window ends by ``until`` (None: the whole search): bad runs
        are exact inside the range they are asked for, and a window inside
        the range meets no instant outside it."""
        lo, hi = self.requested, self.latest + self.d
        if until is not None and until < hi:
            hi = until
        self.swept_to = hi
        self.blocked = {g: self._blocked(self.ledgers[g].bad_runs(self.need, self.mem[g], lo, hi))
                        for g in self.eligible}
        self.blocked_starts = {g: [iv[0] for iv in ivs] for g, ivs in self.blocked.items()}
        # A blackout blocks every GPU: weigh it more than all of them.
        everyone = len(self.eligible) + 1
        dark = self._blocked([(b.start, b.end) for b in self.blackouts if b.end > lo and b.start < hi])
        events = [(t, w) for g in self.eligible for a, b in self.blocked[g] for t, w in ((a, 1), (b, -1))]
        events += [(t, w) for a, b in dark for t, w in ((a, everyone), (b, -everyone))]
        events.sort()
        self.times = [t for t, _ in events]
        self.after: list[int] = []              # blocked weight once events[:i+1] applied
        cur = 0
        for _, w in events:
            cur += w
            self.after.append(cur)
        self.allowed = len(self.eligible) - self.req.count

    def earliest(self, frm: int) -> int | None:
        """The earliest start in ``[frm, latest]`` where enough GPUs are free."""
        if frm > self.latest:
            return None
        times, after = self.times, self.after
        i = bisect_right(times, frm)
        if (after[i - 1] if i else 0) <= self.allowed:
            return frm
        n = len(times)
        while i < n:
            t = times[i]
            if t > self.latest:
                return None
            while i + 1 < n and times[i + 1] == t:
                i += 1
            if after[i] <= self.allowed:
                return t
            i += 1
        return None

    def first_fit(self) -> int | None:
        """``earliest(requested)`` over the whole search, sweeping a range
        that grows fourfold until it holds the answer's window or the whole
        search: on a long ledger most requests fit within the first hours,
        and the bookings after them are never looked at (a request that
        fits only days ahead sweeps a few short ranges more first)."""
        full, width = self.latest + self.d, self.swept_to - self.requested
        while True:
            s = self.earliest(self.requested)
            if self.swept_to >= full or (s is not None and s + self.d <= self.swept_to):
                return s
            width *= 4
            self._build_sweep(self.requested + width)

    def next_change(self, t: int) -> int | None:
        """The first time after ``t`` where the set of free GPUs may change."""
        i = bisect_right(self.times, t)
        return self.times[i] if i < len(self.times) else None

    def fitting(self, s: int) -> list[int]:
        out = []
        for g in self.eligible:
            i = bisect_right(self.blocked_starts[g], s) - 1
            if i < 0 or s >= self.blocked[g][i][1]:
                out.append(g)
        return out

    def _rank_key(self, g: int, s: int) -> tuple:
        state = self.info[g].live_state() if g in self.info else "unknown"
        return (self.prio.get(g, 0), _STATE_RANK[state], self.load.get(g, 0.0),
                self.ledgers[g].pressure(s, s + self.d), g)

    def ranked(self, s: int) -> list[int]:
        """GPUs free at ``s``, best first (SPEC section 4's preference order)."""
        return sorted(self.fitting(s), key=lambda g: self._rank_key(g, s))

    def choose(self, s: int) -> list[int]:
        return self.ranked(s)[:self.req.count]

    def options_at(self, s: int, options: list[Placement], alternatives: int) -> list[Placement]:
        """Add to ``options`` those at start ``s`` (``recommend``): the best
        set first, then disjoint runners-up, none an option already has."""
        count = self.req.count
        ranked = self.ranked(s)
        sets = [ranked[:count]] if self.req.pinned else \
            [ranked[k:k + count] for k in range(0, len(ranked) - count + 1, count)]
        for chosen in sets:
            gset = tuple(sorted(chosen))
            if any(o.gpus == gset and o.start <= s < o.end for o in options):
                continue
            options.append(self.placement(s, chosen))
            if len(options) >= alternatives:
                break
        return options

    # -- results and refusals ------------------------------------------------

    def placement(self, s: int, chosen: list[int]) -> Placement:
        e = s + self.d
        free = set(self.fitting(s))
        reasons = dict(self.ineligible)
        for g in self.eligible:
            if g in chosen:
                reasons[g] = "chosen: " + self._rank_text(g, s)
            elif g in free:
                reasons[g] = "free, not needed: " + self._rank_text(g, s)
            else:
                reasons[g] = self._describe(g, s)[0]
        mems = [m for g in chosen if (m := effective_mem(self.req, self.policy, self.total[g])) is not None]
        return Placement(start=s, end=e, gpus=tuple(sorted(chosen)), queued=s > self.requested,
                         reasons=dict(sorted(reasons.items())), mem_mib_effective=min(mems, default=None))

    def _rank_text(self, g: int, s: int) -> str:
        prio, state, load, pressure, _ = self._rank_key(g, s)
        word = ('idle', 'unknown', 'busy')[state]
        if load >= UNRESERVED_LOAD:     # telemetry.placement_load's mark, not utilisation
            word, load = word + ", used without a booking", load - UNRESERVED_LOAD
        return (f"priority {prio}, {word}, load {load:.2f}, "
                f"{pressure // 60} slot-min booked in the window")

    def _describe(self, g: int, s: int) -> tuple[str, list[dict], bool]:
        """Why GPU ``g`` cannot take the window at ``s``: the message, the
        holders, and whether memory alone is short (slots would do)."""
        e, ledger = s + self.d, self.ledgers[g]
        runs = [r for r in ledger.bad_runs(self.need, self.mem[g], s, e) if r[0] < e and r[1] > s]
        if not runs:
            return "free", [], False
        a = max(runs[0][0], s)
        slots, mem, here = ledger.load_at(a)
        end = ledger.run_end(a, self.need, self.mem[g])
        self.reach = max(self.reach, end)
        until = self._clock(end)
        when = f" from {self._clock(a)}" if a > s else ""
        names = _names(here)
        holders = [_holder(g, h[RES]) for h in here]
        memory_only = not any(r[0] < e and r[1] > s for r in ledger.bad_runs(self.need, None, s, e))
        # Describe the first instant that does not fit by what is short
        # there; the rule (memory only or not) looks at the whole window.
        if any(h[RES].mode == EXCLUSIVE for h in here):
            msg = f"busy{when}: exclusive booking by {names} until {until}"
        elif slots + self.need > self.cap:
            msg = f"busy{when}: {slots}/{self.cap} slots held by {names} until {until}"
        else:
            msg = (f"memory{when}: {mem} of {self.usable[g]} MiB booked by {names} until {until}; "
                   f"this booking needs {self.mem[g]} MiB")
        return msg, holders, memory_only

    def refuse_capacity(self):
        """Raise the Conflict that says what holds the requested window."""
        s, e, req = self.requested, self.requested + self.d, self.req
        what = (f"{counted(req.count, 'GPU')} ({req.mode}"
                + (f", {counted(req.share, 'slot')}" if req.mode == SHARED else "")
                + f") for {_dur(self.d)}")
        if not self.exact:
            limit = (f"{self.policy.queue_search_hours} h (queue_search_hours)"
                     if self.limited_by == "queue_search_hours"
                     else f"the {self.policy.booking_horizon_days}-day booking horizon")
            dark = [b for b in self.blackouts if b.start < self.latest + self.d and b.end > s]
            note = "".join(f"; blackout {iso(b.start)} to {iso(b.end)}" + (f": {b.reason}" if b.reason else "")
                           for b in dark)
            raise Conflict(
                f"no start from {self._clock(s)} up to {self._clock(self.latest)} has {what} "
                f"(searched up to {limit}){note}",
                "ask for fewer GPUs or a shorter time, or see bk slots",
                details={"rule": "capacity", "limit": self.limited_by, "search_from": iso(s),
                         "search_until": iso(self.latest), "request": what,
                         "blackouts": [b.id for b in dark]})
        free = self.fitting(s)
        parts, holders, gpus, memory_only = [], [], {}, True
        for g in self.eligible:
            if g in free:
                continue
            msg, held, mem_only = self._describe(g, s)
            parts.append(f"GPU {g} {msg}")
            holders += held
            gpus[str(g)] = msg
            memory_only = memory_only and mem_only
        rule = "memory" if memory_only else "capacity"
        head = f"{what} not free {self._span(s, e)}"
        if free and not req.pinned:
            head += f" (only {len(free)} of {len(self.eligible)} eligible GPUs free)"
        raise Conflict(head + ": " + "; ".join(parts),
                       "add --queue for the earliest start at or after it, or see bk slots",
                       details={"rule": rule, "start": iso(s), "end": iso(e), "gpus": gpus,
                                "holders": holders})

    def _clock(self, t: int) -> str:
        """A time for humans in the caller's zone, as short as is clear."""
        dt = datetime.fromtimestamp(t, self.tz)
        today = datetime.fromtimestamp(self.now, self.tz)
        if dt.date() == today.date():
            return dt.strftime("%H:%M")
        if dt.year == today.year:
            return dt.strftime("%m-%d %H:%M")
        return dt.strftime("%Y-%m-%d %H:%M")

    def _span(self, s: int, e: int) -> str:
        return f"{self._clock(s)}–{self._clock(e)}"


def _validate(req: Request, policy: Policy, now: int, allow_past_start: bool) -> None:
    """Re-check what the grammar should already have refused: the scheduler
    is also called by the broker, the MCP server and edits."""
    q, n = policy.slot_seconds, policy.gpu_count

    def bad(msg: str, field: str, hint: str | None = None) -> InvalidInput:
        return InvalidInput(msg, hint, details={"rule": "input", "field": field})

    if not _is_int(req.count) or req.count < 1:
        raise bad(f"the GPU count must be a whole number of at least 1, not {req.count!r}", "count")
    if not _is_int(req.duration) or req.duration <= 0 or req.duration % q:
        raise bad(f"the duration must be a positive whole number of {policy.slot_minutes}-minute slices",
                  "duration")
    if req.mode not in MODES:
        raise bad(f"unknown mode {req.mode!r} (expected {' or '.join(MODES)})", "mode")
    if req.mode == SHARED and (not _is_int(req.share) or not 1 <= req.share <= policy.max_shared_users):
        raise bad(f"--share must be 1 to {policy.max_shared_users} (max_shared_users), not {req.share!r}",
                  "share")
    if req.mem_mib is not None and (not _is_int(req.mem_mib) or req.mem_mib <= 0):
        raise bad(f"the memory per GPU must be positive, not {req.mem_mib!r}", "mem_mib")
    if req.start is not None:
        current = _floor(now, q)
        if not _is_int(req.start):
            raise bad(f"the start must be whole epoch seconds, not {req.start!r}", "start")
        if req.start % q:
            near = _floor(req.start, q)
            # Suggest only starts the horizon rule (checked next) accepts:
            # a start far ahead (the schema's maximum) would get hints
            # years past it.
            horizon_end = now + policy.booking_horizon_days * 86400
            latest = _floor(horizon_end - req.duration, q)
            options = sorted({t for t in (max(near, current), max(near + q, current)) if t <= latest})
            if req.start + req.duration > horizon_end or not options:
                hint = (f"and it lies beyond the {policy.booking_horizon_days}-day horizon "
                        "(booking_horizon_days): " + (f"the latest valid start is {iso(latest)}"
                                                      if latest >= current else "that duration does not fit in it"))
            else:
                hint = "nearest valid start" + ("s: " if len(options) > 1 else ": ") + \
                    " or ".join(iso(t) for t in options)
            raise bad(f"the start must fall on a {policy.slot_minutes}-minute boundary", "start", hint)
        if req.start < current and not allow_past_start:
            raise bad("the start lies in the past", "start", f"the earliest valid start is {iso(current)}")
    for name, gs in (("pinned", req.pinned or ()), ("excluded", req.excluded)):
        wrong = [g for g in gs if not _is_int(g) or not 0 <= g < n]
        if wrong:
            raise bad(f"no GPU {', '.join(map(str, wrong))} on this server (GPUs 0 to {n - 1})", name)
    if req.pinned is not None:
        if len(set(req.pinned)) != len(req.pinned) or len(req.pinned) != req.count:
            raise bad(f"-g must name {req.count} different GPUs, not {list(req.pinned)}", "pinned")
        both = sorted(set(req.pinned) & set(req.excluded))
        if both:
            raise bad(f"GPU {', '.join(map(str, both))} is both pinned (-g) and excluded (-e)", "pinned")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _names(holds: list[tuple]) -> str:
    seen: list[str] = []
    for h in sorted(holds, key=lambda h: (h[0], h[RES].user)):
        if h[RES].user not in seen:
            seen.append(h[RES].user)
    return ", ".join(seen)


def _holder(g: int, r: Reservation) -> dict:
    return {"gpu": g, "id": r.id, "user": r.user, "mode": r.mode, "share": r.share,
            "mem_mib": r.mem_mib, "start": iso(r.start), "end": iso(r.end)}


def _gpus(n: int) -> str:
    return counted(n, "GPU")


def _dur(seconds: int) -> str:
    d, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m = rest // 60
    return "".join(f"{v}{u}" for v, u in ((d, "d"), (h, "h"), (m, "m")) if v) or "0m"
