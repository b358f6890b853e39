"""A brute-force scheduler, slow and obvious, to check ``bk.core.scheduler``.

It reads SPEC section 4 as literally as possible: it tries every slice start
from the requested one up to the search limit, and for each start checks
every slice of the window against every live booking.  It shares no code
with the real scheduler beyond the data models, so an error in the clever
search cannot hide behind the same error here.

It assumes bookings are slice-aligned (the ledger guarantees it); blackouts
may fall anywhere and are checked as plain intervals.

``reference_place`` returns ``("ok", start, gpus)`` or
``("error", class name, rule)``.
"""

from __future__ import annotations

from bk.core.models import EXCLUSIVE, MODES, SHARED


def _usable(total, policy):
    return None if total is None else total - policy.shared_memory_reserve_mb


def _share_mem(mem_mib, share, usable, capacity):
    if mem_mib is not None:
        return mem_mib
    if usable is None:
        return None
    return max(0, usable) * share // capacity


class Reference:
    def __init__(self, req, reservations, blackouts, policy, gpus, now, load=None):
        self.req, self.policy, self.now = req, policy, now
        self.blackouts = list(blackouts)
        self.load = load or {}
        self.q = policy.slot_minutes * 60
        self.cap = policy.max_shared_users
        self.info = {g.index: g for g in gpus or []}
        self.total = {g: (self.info[g].mem_total_mib if g in self.info else None)
                      for g in range(policy.gpu_count)}
        self.live = [r for r in reservations
                     if r.cancelled_at is None and r.end > now and r.id != req.ignore_id]

    # -- one slice, one GPU ------------------------------------------------
    def slice_load(self, g, t):
        """(slots, counted memory) of the bookings on GPU g in [t, t + q)."""
        slots = mem = 0
        usable = _usable(self.total[g], self.policy)
        for r in self.live:
            if g in r.gpus and r.start < t + self.q and t < r.end:
                if r.mode == EXCLUSIVE:
                    slots += self.cap
                else:
                    slots += r.share
                    mem += _share_mem(r.mem_mib, r.share, usable, self.cap) or 0
        return slots, mem

    def request_need(self, g):
        req = self.req
        if req.mode == EXCLUSIVE:
            return self.cap, None
        usable = _usable(self.total[g], self.policy)
        return req.share, _share_mem(req.mem_mib, req.share, usable, self.cap)

    def gpu_fails(self, g, s):
        """None if GPU g takes the window at s, else 'slots' or 'memory'."""
        need, mem = self.request_need(g)
        usable = _usable(self.total[g], self.policy)
        memory_short = False
        for t in range(s, s + self.req.duration, self.q):
            slots, used = self.slice_load(g, t)
            if slots + need > self.cap:
                return "slots"
            if mem is not None and usable is not None and used + mem > usable:
                memory_short = True
        return "memory" if memory_short else None

    def pressure(self, g, s):
        return sum(self.slice_load(g, t)[0] * self.q for t in range(s, s + self.req.duration, self.q))

    def dark(self, s):
        e = s + self.req.duration
        return any(b.start < e and s < b.end for b in self.blackouts)

    # -- the rules, in the documented order ----------------------------------
    def invalid(self):
        req, p, q = self.req, self.policy, self.q
        n = p.gpu_count
        if req.count < 1 or req.duration <= 0 or req.duration % q or req.mode not in MODES:
            return True
        if req.mode == SHARED and not 1 <= req.share <= self.cap:
            return True
        if req.mem_mib is not None and req.mem_mib <= 0:
            return True
        if req.start is not None and (req.start % q or req.start < self.now - self.now % q):
            return True
        if any(not 0 <= g < n for g in (req.pinned or ()) + tuple(req.excluded)):
            return True
        if req.pinned is not None and (len(set(req.pinned)) != req.count or len(req.pinned) != req.count
                                       or set(req.pinned) & set(req.excluded)):
            return True
        return False

    def static_misfit(self, g):
        req, total = self.req, self.total[g]
        if total is None:
            return False
        if req.mode == EXCLUSIVE:
            return req.mem_mib is not None and req.mem_mib > total
        usable = _usable(total, self.policy)
        return usable <= 0 or (req.mem_mib is not None and req.mem_mib > usable)

    def run(self):
        req, p, q, now = self.req, self.policy, self.q, self.now
        if self.invalid():
            return ("error", "InvalidInput", "input")
        if req.duration > p.max_booking_hours * 3600:
            return ("error", "PolicyRefused", "max_length")
        if req.mode == SHARED and req.mem_mib is None and p.require_shared_memory:
            return ("error", "PolicyRefused", "require_shared_memory")
        first = now - now % q if req.start is None else req.start
        horizon_end = now + p.booking_horizon_days * 86400
        if first + req.duration > horizon_end:
            return ("error", "PolicyRefused", "horizon")
        eligible, blame = [], set()
        for g in range(p.gpu_count):
            if req.pinned is not None and g not in req.pinned:
                continue
            if g in req.excluded:
                blame.add("excluded")
            elif g in p.disabled_gpus:
                blame.add("disabled_gpu")
            elif self.static_misfit(g):
                blame.add("memory")
            else:
                eligible.append(g)
        if len(eligible) < req.count:
            if req.pinned is None and req.count > p.gpu_count:
                return ("error", "Conflict", "gpu_count")
            rule = next(r for r in ("disabled_gpu", "memory", "excluded") if r in blame)
            return ("error", "PolicyRefused" if rule == "disabled_gpu" else "Conflict", rule)
        exact = req.start is not None and not req.queue
        if exact:
            if self.dark(first):
                return ("error", "PolicyRefused", "blackout")
            last = first
        else:
            last = min(first + p.queue_search_hours * 3600, horizon_end - req.duration)
        s = first
        while s <= last:
            if not self.dark(s):
                free = [g for g in eligible if self.gpu_fails(g, s) is None]
                if len(free) >= req.count:
                    return ("ok", s, self.choose(free, s))
            s += q
        if exact:
            fails = [self.gpu_fails(g, first) for g in eligible]
            if all(f in (None, "memory") for f in fails):
                return ("error", "Conflict", "memory")
        return ("error", "Conflict", "capacity")

    def choose(self, free, s):
        rank = {"idle": 0, "unknown": 1, "busy": 2}
        prio = dict(self.policy.gpu_priority)

        def key(g):
            state = self.info[g].live_state() if g in self.info else "unknown"
            return (prio.get(g, 0), rank[state], self.load.get(g, 0.0), self.pressure(g, s), g)
        return tuple(sorted(sorted(free, key=key)[:self.req.count]))


def reference_place(req, reservations, blackouts, policy, gpus, now, load=None):
    return Reference(req, reservations, blackouts, policy, gpus, now, load).run()


def reference_fits(req, reservations, blackouts, policy, gpus, now, start, chosen):
    """Whether the request may run at ``start`` on exactly ``chosen``."""
    ref = Reference(req, reservations, blackouts, policy, gpus, now)
    return not ref.dark(start) and all(ref.gpu_fails(g, start) is None for g in chosen)


# ---------------------------------------------------------------- limits
# The per-user limits of bk.core.limits, read as literally as the rules
# above: every slice of the window, every second of the future.  ``bounds``
# is a plain {limit: value} dict (who it applies to is tested by hand).

REQUEST_ORDER = ("booking_hours", "shared_vram_gib", "gpu_hours")
PLACED_ORDER = ("ahead_hours", "gpus", "shared_vram_gib")
SCALE = {"gpus": 1, "gpu_hours": 3600, "booking_hours": 3600, "ahead_hours": 3600, "shared_vram_gib": 1024}


def ref_future(start, end, n, now):
    """GPU-seconds of [start, end) on n GPUs at or after now, second by slice."""
    total = 0
    t = start
    while t < end:
        nxt = min(end, t + 60)
        lo = max(t, now)
        if nxt > lo:
            total += (nxt - lo) * n
        t = nxt
    return total


def ref_instants(start, end, now, q):
    """Every instant where the held set may differ: the window's first
    instant from now on, and each slice boundary in it (bookings are
    slice-aligned)."""
    lo = max(start, now)
    if lo >= end:
        return []
    out = [lo]
    t = lo - lo % q + q
    while t < end:
        out.append(t)
        t += q
    return out


def ref_measure(name, new, held, now, q):
    """``new`` and ``held``: (start, end, gpus, vram_mib or None)."""
    s, e, gpus, vram = new
    if name == "booking_hours":
        return e - s
    if name == "ahead_hours":
        return max(0, s - now)
    if name == "shared_vram_gib":
        return vram or 0
    if name == "gpu_hours":
        return sum(ref_future(hs, he, len(hg), now) for hs, he, hg, _ in held) + ref_future(s, e, len(gpus), now)
    best = 0
    for t in ref_instants(s, e, now, q):
        at = set(gpus)
        for hs, he, hg, _ in held:
            if hs <= t < he:
                at |= set(hg)
        best = max(best, len(at))
    return best


def ref_breaks(name, value, new, held, now, q, before=None):
    m = ref_measure(name, new, held, now, q)
    if m <= value * SCALE[name]:
        return False
    return before is None or m > ref_measure(name, before, held, now, q)


RULE_NAMES = {"booking_hours": "limit_booking_hours", "shared_vram_gib": "limit_shared_vram",
              "gpu_hours": "limit_gpu_hours", "ahead_hours": "limit_ahead", "gpus": "limit_gpus"}


def reference_book(req, bounds, uid, reservations, blackouts, policy, gpus, now, load=None):
    """``reference_place`` with one user's limits in the documented order:
    input, the request's limits, the scheduler's rules, the placement's."""
    q = policy.slot_minutes * 60
    ref = Reference(req, reservations, blackouts, policy, gpus, now, load)
    if ref.invalid():
        return ("error", "InvalidInput", "input")
    held = [(r.start, r.end, tuple(r.gpus), None) for r in reservations
            if r.uid == uid and r.cancelled_at is None and r.end > now and r.id != req.ignore_id]
    start = max(req.start, now) if req.start is not None else now
    explicit = req.mem_mib if req.mode != EXCLUSIVE else None
    new = (start, start + req.duration, tuple(range(req.count)), explicit)
    for name in REQUEST_ORDER:
        if name in bounds and not (name == "shared_vram_gib" and explicit is None):
            if ref_breaks(name, bounds[name], new, held, now, q):
                return ("error", "PolicyRefused", RULE_NAMES[name])
    out = ref.run()
    if out[0] != "ok":
        return out
    _, s, chosen = out
    vram = explicit
    if req.mode != EXCLUSIVE and vram is None:
        known = [ref.total[g] for g in chosen if ref.total[g]]
        if known:
            usable = _usable(min(known), policy)
            vram = _share_mem(None, req.share, usable, ref.cap)
    placed = (s, s + req.duration, chosen, vram)
    for name in PLACED_ORDER:
        if name == "shared_vram_gib" and (explicit is not None or req.mode == EXCLUSIVE):
            continue
        if name in bounds and ref_breaks(name, bounds[name], placed, held, now, q):
            return ("error", "PolicyRefused", RULE_NAMES[name])
    return out


# ---------------------------------------------------------------- advances

def reference_advance(reservations, blackouts, policy, gpus, now, *, usage=None, bounds_by_uid=None,
                      max_rounds=16, max_tries=32):
    """bk.core.advance.plan by brute force: the same order and rounds, each
    earliest start found by ``reference_place`` and each limit measured
    slice by slice.  Returns the final list of reservations."""
    from bk.core.scheduler import Request

    q = policy.slot_minutes * 60
    here = now - now % q
    cur = list(reservations)
    gpu_mem = {g.index: g.mem_total_mib for g in gpus or []}

    place = {r.id: i for i, r in enumerate(reservations)}

    def key(r):
        first = (r.advance.since, r.created, place[r.id])
        return ((usage or {}).get(r.uid, 0.0),) + first if usage is not None else first

    def vram_of(r):
        if r.mode == EXCLUSIVE:
            return None
        if r.mem_mib is not None:
            return r.mem_mib
        known = [gpu_mem.get(g) for g in r.gpus if gpu_mem.get(g)]
        if not known:
            return None
        return _share_mem(None, r.share, _usable(min(known), policy), policy.max_shared_users)

    for _ in range(max_rounds):
        moved = False
        order = sorted((r for r in cur if r.advance is not None and r.cancelled_at is None
                        and r.start > here and r.end > now), key=key)
        for r0 in order:
            i = next(j for j, x in enumerate(cur) if x.id == r0.id)
            r = cur[i]
            frm = max(r.advance.after, here)
            frm = -(-frm // q) * q
            bounds = (bounds_by_uid or {}).get(r.uid)
            tries = max_tries
            while frm < r.start:
                req = Request(count=len(r.gpus), duration=r.end - r.start, mode=r.mode,
                              share=1 if r.mode == EXCLUSIVE else r.share, mem_mib=r.mem_mib, start=frm,
                              queue=True, pinned=tuple(r.gpus) if r.advance.pinned else None,
                              excluded=tuple(g for g in r.advance.excluded if g < policy.gpu_count),
                              ignore_id=r.id)
                out = reference_place(req, cur, blackouts, policy, gpus, now)
                if out[0] != "ok" or out[1] >= r.start:
                    break
                new = r.replace(start=out[1], end=out[1] + (r.end - r.start), gpus=out[2])
                ok = True
                if bounds:
                    held = [(x.start, x.end, tuple(x.gpus), None) for x in cur
                            if x.uid == r.uid and x.id != r.id and x.cancelled_at is None and x.end > now]
                    a = (new.start, new.end, new.gpus, vram_of(new))
                    b = (r.start, r.end, r.gpus, vram_of(r))
                    ok = not any(name in bounds and ref_breaks(name, bounds[name], a, held, now, q, before=b)
                                 for name in REQUEST_ORDER + PLACED_ORDER[:2])
                if ok:
                    cur[i] = new
                    moved = True
                    break
                tries -= 1
                if not tries:
                    break
                frm = out[1] + q
        if not moved:
            break
    return cur
