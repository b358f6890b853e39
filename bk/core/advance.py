"""Bookings that move earlier on their own (``--advance``).

The facts.  A booking that was queued (the GPUs were taken when it was
made) waits behind bookings that may end early: a cancellation, a release
of an idle booking, a job that finished, an edit that shortens.  The owner
would take the earlier start if asked; ``--advance`` asks once, in advance.

The rules.

1. Only an *advancing* booking moves: one with an ``Advance`` record, not
   cancelled, that has not started (its start is after now's slice).  It
   never moves before the start it asked for (``Advance.after``) nor onto
   GPUs it excluded; a booking that pinned its GPUs keeps them.
2. It moves only earlier: to the earliest start that fits, found by the
   scheduler (``scheduler.place``, the same rules as a new booking) with
   every other booking where it is.  So no other booking is moved, shrunk
   or overlapped: a booking that does not advance cannot be harmed, and
   an advancing one is never later than it was (its start is the latest
   start bk guarantees it, ``bk l`` shows it).
3. Its owner's limits (``bk.core.limits``) hold at the new place, as for an
   edit: a start the search finds that the limits refuse (the owner would
   hold more GPUs at once than they may) is skipped and the search resumes
   one slice later, at most ``MAX_TRIES`` times; what is not found then may
   be found at the next write.
4. Several advancing bookings that want the same capacity: they are
   served in order, each taking the earliest start that fits given the
   moves before it, and the round is repeated until nothing moves (a
   booking that moved frees its old place for the ones after it, and the
   ones before it may then move again).  The order is first come, first
   served (``Advance.since``, then creation, then the ledger's order), or, with fair share,
   by the owner's decayed past usage (``bk.core.fairshare``, least first)
   and then first come.  Fair share orders only this competition: it never
   moves a booking later and never refuses one.
5. Who runs it.  Capacity frees only through a write (time passing frees
   nothing a placement did not already count; a change of the
   configuration, a GPU enabled again, is seen at the next write near it),
   so the service runs ``plan``
   inside the same transaction as every write other than a new booking
   (``bk.service.advancing``): the cancel or edit that freed capacity
   commits together with the moves it allows, and a crash loses both or
   neither.  Each move is an ``Edit`` of the booking with
   ``cause: booking_advanced``, an audit record with the action
   ``booking_advanced`` (the stable event name the notifier consumes) and a
   notice to the owner.
6. What it costs.  A placement search per booking tried, so ``plan`` tries
   only the bookings that room made by the write (``freed_by``), or by a
   move made before, could let start earlier (``plan``'s docstring says why
   that misses nothing); a cancellation tomorrow evening tries no booking
   that ends before it.  A try costs a placement against the scheduler's
   kept index (``bk.core.capacity``) changed by the moves made so far,
   not a pass over the ledger, and the queue's order is found once: at
   10,000 live bookings ten advancing bookings add about 13 ms to the
   write that freed room for them (``benchmarks/limits.py``).  The bounds
   are ``MAX_ROUNDS`` rounds and ``MAX_TRIES`` places per booking whose
   owner's limits refuse; neither is reached by a real ledger, and no
   try is put off to a later write, so every booking stays at the
   earliest start the rules allow it after each commit.

Pure: the ledger, the policy, the GPU inventory and ``now`` are arguments.
"""

from __future__ import annotations

from bk.core import limits as lim
from bk.core.errors import BkError
from bk.core.models import ADVANCED, EXCLUSIVE, Policy, Reservation
from bk.core.record import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:   # annotations only: collections.abc would import collections
    from collections.abc import Callable, Mapping, Sequence

EVENT = ADVANCED               # "booking_advanced": the audit action and the edit's cause, part of the format
MAX_ROUNDS = 16                # each round moves something earlier; real ledgers settle in two
MAX_TRIES = 32                 # places tried for one booking whose owner's limits refuse the first


@dataclass(frozen=True)
class Move:
    before: Reservation
    after: Reservation


def advancing(r: Reservation, now: int, slot_seconds: int) -> bool:
    """``r`` may still move earlier (rule 1)."""
    return (r.advance is not None and r.cancelled_at is None
            and r.start > now - now % slot_seconds and r.end > now)


def order_key(r: Reservation, usage: Mapping[int, float] | None = None, place: int = 0) -> tuple:
    """Rule 4's order: fair share (when ``usage`` is given) then first come
    (``place``: the booking's place in the ledger, which keeps bookings in
    the order they were made, for two made in the same second)."""
    a = r.advance
    first = (a.since if a is not None else r.created, r.created, place)
    if usage is None:
        return first
    return (usage.get(r.uid, 0.0),) + first


def queue(reservations: Sequence[Reservation], now: int, slot_seconds: int,
          usage: Mapping[int, float] | None = None) -> list[Reservation]:
    """The advancing bookings in the order they are served."""
    return [r for _, r in sorted(((order_key(r, usage, i), r) for i, r in enumerate(reservations)
                                  if advancing(r, now, slot_seconds)), key=lambda kr: kr[0])]


def positions(reservations: Sequence[Reservation], now: int, slot_seconds: int,
              usage: Mapping[int, float] | None = None) -> dict[str, int]:
    """Each advancing booking's place in the queue, from 1."""
    return {r.id: i for i, r in enumerate(queue(reservations, now, slot_seconds, usage), 1)}


def held(r: Reservation, policy: Policy, gpu_mem: Mapping[int, int | None] | None) -> lim.Held:
    """``r`` as the limits see it: its counted VRAM per GPU on its smallest GPU."""
    from bk.core.scheduler import effective_mem

    vram = None
    if r.mode != EXCLUSIVE:
        totals = [t for t in ((gpu_mem or {}).get(g) for g in r.gpus) if t]
        if r.mem_mib is not None:
            vram = r.mem_mib
        elif totals:
            vram = effective_mem(r, policy, min(totals))
    return lim.Held(r.id, r.start, r.end, tuple(r.gpus), vram)


def plan(reservations: Sequence[Reservation], blackouts, policy: Policy, gpus, now: int, *,
         usage: Mapping[int, float] | None = None,
         bounds_of: Callable[[Reservation], lim.Bounds] | None = None,
         freed: Sequence[tuple[int, int]] | None = None, changed=(),
         max_rounds: int = MAX_ROUNDS) -> list[Move]:
    """The moves the advancing bookings make now, in the order made; a
    booking that moves twice appears once, with its first and last place.
    ``gpus``: the inventory (memory totals); ``bounds_of``: the owner's
    limits of a booking (None: no limits).

    ``freed``: the intervals the write made room in (``freed_by``), and
    ``changed``: the ids of bookings the write itself changed; None: look
    at every advancing booking.  Which ones are tried (rule 6 of the essay):
    a booking can move only into room made since it was last placed, at an
    instant before its end (any earlier window it could take ends before
    its current end); so a booking is tried when some room made since its
    last try (the write's, or a move's old place) starts before its end,
    or when the write changed it.  Every booking is at its earliest after
    each commit, so this finds exactly the moves trying all of them would
    (``tests/test_fair_oracle.py`` checks it against the full brute force)."""
    from bk.core.scheduler import Request, place

    q = policy.slot_seconds
    current = list(reservations)
    first: dict[str, Reservation] = {}
    gpu_mem = {g.index: g.mem_total_mib for g in gpus or ()}
    room = [(-(1 << 62), 1)] if freed is None else [(a, 1) for a, b in freed if b > a]
    version, tried = 1, {}
    forced = set(changed)
    # The queue's order is that of the first round in every round: a move
    # changes a booking's times and GPUs, never what orders it (its
    # advance, its creation, its place), and makes no other booking an
    # advancing one; so it is found once, not by a pass over every
    # booking per round.
    order = [i for _, i in sorted((order_key(r, usage, i), i) for i, r in enumerate(current)
                                  if advancing(r, now, q))]
    index = {current[i].id: i for i in order}
    for _ in range(max_rounds):
        moved = False
        for i in order:
            r = current[i]
            if not advancing(r, now, q):
                continue
            last = tried.get(r.id, 0)
            if r.id not in forced and not any(v > last and a < r.end for a, v in room):
                continue
            forced.discard(r.id)
            tried[r.id] = version
            a = r.advance
            frm = max(a.after, now - now % q)
            frm = -(-frm // q) * q
            if frm >= r.start:
                continue
            req = Request(count=len(r.gpus), duration=r.end - r.start, mode=r.mode,
                          share=1 if r.mode == EXCLUSIVE else r.share, mem_mib=r.mem_mib, start=frm,
                          queue=True, pinned=tuple(r.gpus) if a.pinned else None,
                          excluded=tuple(g for g in a.excluded if g < policy.gpu_count), ignore_id=r.id)
            bounds = bounds_of(r) if bounds_of is not None else None
            new = _earliest(req, r, current, blackouts, policy, gpus, now, bounds, gpu_mem, place)
            if new is None:
                continue
            first.setdefault(r.id, r)
            current[i] = new
            version += 1
            room.append((r.start, version))
            tried[r.id] = version
            moved = True
        if not moved:
            break
    return [Move(first[rid], current[index[rid]]) for rid in first]


def freed_by(before: Sequence[Reservation], after: Sequence[Reservation], before_blackouts=(),
             after_blackouts=(), now: int = 0) -> tuple[list[tuple[int, int]], set[str]]:
    """What one write made room in, for ``plan``: the old window of every
    booking it cancelled, shortened, moved or changed (all of it: more
    than the room, never less), and of every maintenance window it ended
    or removed; and the ids of the bookings it changed."""
    old = {r.id: r for r in before}
    freed, changed = [], set()
    for r in after:
        o = old.get(r.id)
        if o is None or o is r:
            continue
        changed.add(r.id)
        if o.cancelled_at is None and o.end > now:
            freed.append((o.start, o.end))
    gone = {r.id for r in after}
    freed += [(o.start, o.end) for rid, o in old.items() if rid not in gone and o.cancelled_at is None
              and o.end > now]
    still = {(b.id, b.start, b.end) for b in after_blackouts}
    freed += [(b.start, b.end) for b in before_blackouts if (b.id, b.start, b.end) not in still]
    return freed, changed


def _earliest(req, r, current, blackouts, policy, gpus, now, bounds, gpu_mem, place):
    """The first place before ``r.start`` that fits and passes the owner's
    limits (rule 3), or None."""
    from bk.core.record import replace

    q = policy.slot_seconds
    frm, tries = req.start, MAX_TRIES
    while frm < r.start:
        try:
            p = place(replace(req, start=frm), reservations=current, blackouts=blackouts, policy=policy,
                      gpus=gpus, now=now)
        except BkError:
            return None
        if p.start >= r.start:
            return None
        new = r.replace(start=p.start, end=p.end, gpus=tuple(p.gpus))
        if not bounds:
            return new
        others = [lim.Held(x.id, x.start, x.end, tuple(x.gpus)) for x in current
                  if x.uid == r.uid and x.id != r.id and x.cancelled_at is None and x.end > now]
        cand = held(new, policy, gpu_mem)
        broken = lim.first_broken(bounds, cand, others, now, before=held(r, policy, gpu_mem))
        if broken is None:
            return new
        tries -= 1
        if not tries:
            return None
        frm = p.start + q
    return None
