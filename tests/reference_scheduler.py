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
