"""The ledger's invariants, checked (pure): ``check_state`` for a whole
state, ``check_next`` for what one transaction changed.

Every writer runs the check before it seals what it writes
(``bk.core.ledgerdoc.seal``), and a reader of bytes without a seal runs it
on what it decoded: a booking out of range, two bookings over one GPU's
capacity, an op record that names no booking are refused, never written.
``Checked`` is the proof a writer keeps of the state it checked, so that
its next transaction is checked by what it changed (``check_next``), which
with that proof is the full check (tests/test_store_kept.py holds the two
to the same answer).  Only what checks a state loads this module; the
document's format and its reading are ``bk.core.ledgerdoc``.
"""

from __future__ import annotations

from bk.core.ledgerdoc import OP_ACTIONS, Delta, _Problems, decode, plain_copy
from bk.core.models import EXCLUSIVE, MODES, SHARED, Advance, Edit, Job, LedgerState, Notice, Reservation
from bk.core.timegrid import counted
from bk.core.utctime import format_utc


def _is_int(v) -> bool:
    return type(v) is int


def _opt(v, typ) -> bool:
    return v is None or type(v) is typ


def _reservation_ok(r: Reservation, gpu_count, cap) -> bool:
    """The common case in one expression: every field well typed and in range.
    ``_reservation_problems`` says what is wrong when this is False."""
    g = r.gpus
    return (
        type(r.id) is str and r.id != "" and type(r.uid) is int and r.uid >= 0
        and type(r.user) is str and r.mode in MODES
        and type(g) is tuple and len(g) > 0
        and (type(g[0]) is int and 0 <= g[0] < (gpu_count or 1 << 30) if len(g) == 1
             else _gpus_ok(g, gpu_count))
        and type(r.share) is int and r.share >= 1
        and (cap is None or r.mode != SHARED or r.share <= cap)
        and type(r.start) is int and type(r.end) is int and type(r.created) is int
        and r.end > r.start
        and (r.mem_mib is None or (type(r.mem_mib) is int and r.mem_mib >= 0))
        and (r.op_id is None or type(r.op_id) is str)
        and (r.note is None or type(r.note) is str)
        and (r.cancel_reason is None or type(r.cancel_reason) is str)
        and (r.cancelled_at is None or type(r.cancelled_at) is int)
        and (r.cancelled_by is None or type(r.cancelled_by) is int)
        and type(r.edits) is list and (not r.edits or all(type(e) is Edit for e in r.edits))
        and (r.job is None or type(r.job) is Job) and type(r.extra) is dict
        and (r.advance is None or type(r.advance) is Advance)
        and (not r.shared_with or _shared_ok(r.shared_with))
    )


def _shared_ok(v) -> bool:
    from bk.core.sharing import MAX_SHARED, valid_entry

    return type(v) is tuple and len(v) <= MAX_SHARED and all(valid_entry(x) for x in v)


def _gpus_ok(g: tuple, gpu_count) -> bool:
    top = gpu_count or 1 << 30
    return all(type(x) is int and 0 <= x < top for x in g) and len(set(g)) == len(g)


def _reservation_problems(r: Reservation, gpu_count, cap) -> list[str]:
    bad = []
    if type(r.id) is not str or not r.id:
        bad.append("id must be a non-empty string")
    if type(r.uid) is not int or r.uid < 0:
        bad.append(f"uid {r.uid!r} is not a non-negative integer")
    if type(r.user) is not str:
        bad.append("user must be a string")
    if r.mode not in MODES:
        bad.append(f"mode {r.mode!r} is not one of {', '.join(MODES)}")
    g = r.gpus
    if type(g) is not tuple or not g or not _gpus_ok(g, None):
        bad.append(f"gpus {g!r} must be distinct non-negative integers")
    elif not _gpus_ok(g, gpu_count):
        bad.append(f"gpu {max(g)} does not exist (gpu_count {gpu_count})")
    if type(r.share) is not int or r.share < 1:
        bad.append(f"share {r.share!r} is not a positive integer")
    elif cap is not None and r.mode == SHARED and r.share > cap:
        bad.append(f"share {r.share} exceeds max_shared_users {cap}")
    if not (type(r.start) is int and type(r.end) is int and type(r.created) is int):
        bad.append("start, end and created must be integer times")
    elif r.end <= r.start:
        bad.append("end is not after start")
    if r.mem_mib is not None and (type(r.mem_mib) is not int or r.mem_mib < 0):
        bad.append(f"mem_mib {r.mem_mib!r} is not a non-negative integer")
    if not all(v is None or type(v) is str for v in (r.op_id, r.note, r.cancel_reason)):
        bad.append("op_id, note and cancel_reason must be strings or null")
    if not all(v is None or type(v) is int for v in (r.cancelled_at, r.cancelled_by)):
        bad.append("cancelled_at and cancelled_by must be integers or null")
    if (type(r.edits) is not list or not all(type(e) is Edit for e in r.edits)
            or not (r.job is None or type(r.job) is Job) or type(r.extra) is not dict):
        bad.append("edits, job or extra has the wrong type")
    if not (r.advance is None or type(r.advance) is Advance):
        bad.append("advance must be an object with since and after times")
    if r.shared_with and not _shared_ok(r.shared_with):
        from bk.core.sharing import MAX_SHARED

        bad.append(f"shared_with must be a list of at most {MAX_SHARED} user names and @groups")
    return bad


def _check_reservations(state: LedgerState, gpu_count, cap, probs: _Problems) -> None:
    seen: set[str] = set()
    for i, r in enumerate(state.reservations):
        if _reservation_ok(r, gpu_count, cap):
            bad = []
        else:
            bad = _reservation_problems(r, gpu_count, cap) or ["invalid"]
        if type(r.id) is str:
            if r.id in seen:
                bad.append("duplicate id")
            seen.add(r.id)
        for b in bad:
            probs.add(f"reservations[{i}] (id {str(r.id)[:8]}): {b}")


def _check_capacity(state: LedgerState, cap, probs: _Problems) -> None:
    """Sweep each GPU's timeline.  An exclusive booking weighs the whole
    capacity, so one check covers both rules: shared loads never exceed the
    capacity, and an exclusive booking overlaps nothing.  Intervals are
    half-open ([start, end)): at equal times ends sort before starts."""
    limit = cap if cap is not None else 1 << 40
    events: dict[int, list[tuple[int, int]]] = {}
    for r in state.reservations:
        if r.cancelled_at is not None:
            continue
        w = limit if r.mode == EXCLUSIVE else r.share
        s, e = r.start * 2 + 1, r.end * 2
        for g in r.gpus:
            ev = events.get(g)
            if ev is None:
                ev = events[g] = []
            ev.append((s, w))
            ev.append((e, -w))
    for g in sorted(events):
        ev = events[g]
        ev.sort()
        load = 0
        for key, w in ev:
            load += w
            if load > limit:
                what = (f"more than {counted(cap, 'share slot')} in use" if cap is not None
                        else "an exclusive booking overlaps another booking")
                probs.add(f"capacity: gpu {g} at {format_utc(key // 2)}: {what}")
                break


def _check_others(state: LedgerState, probs: _Problems) -> None:
    ids: set = set()
    for i, b in enumerate(state.blackouts):
        if type(b.id) is not str or b.id in ids:
            probs.add(f"blackouts[{i}]: id must be a unique string")
        ids.add(b.id)
        if not (_is_int(b.start) and _is_int(b.end)) or b.end <= b.start:
            probs.add(f"blackouts[{i}] (id {b.id}): end is not after start")
    ids = set()
    for i, n in enumerate(state.notices):
        if type(n.id) is not str or n.id in ids:
            probs.add(f"notices[{i}]: id must be a unique string")
        ids.add(n.id)
        if n.level not in Notice.LEVELS:
            probs.add(f"notices[{i}] (id {n.id}): level {n.level!r} is not one of "
                      f"{', '.join(Notice.LEVELS)}")
        if not (_opt(n.uid, int) and type(n.text) is str):
            probs.add(f"notices[{i}] (id {n.id}): uid must be an integer or null, text a string")
    keys: set = set()
    for i, o in enumerate(state.ops):
        if type(o.op_id) is not str or (o.uid, o.op_id) in keys:
            probs.add(f"ops[{i}]: op_id must be a string, unique per uid")
        keys.add((o.uid, o.op_id))
        if o.action not in OP_ACTIONS:
            probs.add(f"ops[{i}] ({o.op_id}): action {o.action!r} is not one of "
                      f"{', '.join(OP_ACTIONS)}")


def _limits(state: LedgerState, capacity: int | None, probs: _Problems) -> tuple[int | None, int | None]:
    """The seq and the policy checked; the GPU count and share capacity
    that the reservations are checked against."""
    if not _is_int(state.seq) or state.seq < 0:
        probs.add(f"seq {state.seq!r} is not a non-negative integer")
    pol = state.policy
    gpu_count = cap = None
    if pol is not None:
        if not isinstance(pol, dict):
            probs.add("policy must be an object or null")
            pol = {}
        gpu_count, cap = pol.get("gpu_count"), pol.get("max_shared_users")
        if gpu_count is not None and (not _is_int(gpu_count) or gpu_count < 1):
            probs.add(f"policy.gpu_count {gpu_count!r} is not a positive integer")
            gpu_count = None
        if cap is not None and (not _is_int(cap) or cap < 1):
            probs.add(f"policy.max_shared_users {cap!r} is not a positive integer")
            cap = None
    return gpu_count, cap if cap is not None else capacity


def check_state(state: LedgerState, capacity: int | None = None) -> list[str]:
    """Every invariant a ledger must hold, as a list of problems (empty: valid).

    ``capacity`` (share slots per GPU) comes from the bound policy when the
    state has one; the argument is used only for a ledger not yet bound.
    """
    probs = _Problems()
    gpu_count, cap = _limits(state, capacity, probs)
    _check_reservations(state, gpu_count, cap, probs)
    if not probs:
        _check_capacity(state, cap, probs)
    _check_others(state, probs)
    return probs.done()


class Checked:
    """A state that passed ``check_state``, remembered so that the state a
    transaction makes from it can be checked by what changed (``Delta``).

    Why that is the same check.  Under the same policy and capacity a
    booking that was valid stays valid, so only the bookings the
    transaction added (new or changed: records are frozen, a change is a
    new record) need the field checks; ids stay unique if no added one
    meets an id that is still there; and taking bookings away only lowers
    a GPU's load, so capacity can be exceeded only at an instant an added
    booking covers: the sweep looks at the bookings that overlap the added
    ones on their GPUs, where it sees every booking there is.  Blackouts,
    notices and op keys are few and checked whole.  A policy or capacity
    other than the one checked, or any problem found, runs the full
    ``check_state``, whose messages are then the ones reported."""

    __slots__ = ("reservations", "policy", "capacity", "by_id", "holds", "quick")

    def __init__(self, state: LedgerState, capacity: int | None, by_id: dict | None = None,
                 holds=None, quick: int = 0):
        self.reservations = state.reservations    # what ``Delta.of`` compares the next state's with
        self.policy = plain_copy(state.policy)
        self.capacity = capacity
        self.by_id = by_id if by_id is not None else {r.id: r for r in state.reservations}
        # The live bookings per GPU and time (``capacity.HoldIndex`` of
        # ``reservations``), which finds the bookings near the added ones
        # without a pass over all of them.  Made at the second check by
        # changes in a row (a process that commits again and again: the
        # broker), since making it costs a pass more than it saves once.
        self.holds = holds
        self.quick = quick               # checks by changes in a row that led here


def check_next(state: LedgerState, capacity: int | None, base: Checked | None,
               delta: Delta | None = None) -> tuple[list[str], Checked | None]:
    """``check_state(state, capacity)``, and (when it is valid) the
    ``Checked`` that lets the state after it be checked by its changes.
    ``base``: the ``Checked`` of the state this one was made from (None:
    check in full); ``delta``: the bookings' ``Delta`` from
    ``base.reservations``, if the caller has it.  The ``Checked`` returned
    holds ``state.reservations``, which must not change afterwards."""
    if base is not None and base.capacity == capacity and state.policy == base.policy:
        if delta is None or delta.old is not base.reservations or delta.new is not state.reservations:
            delta = Delta.of(base.reservations, state.reservations)
        quick = _check_changes(state, capacity, base, delta) if delta is not None else None
        if quick is not None:
            return [], quick
    problems = check_state(state, capacity)
    return problems, (None if problems else Checked(state, capacity))


def _check_changes(state: LedgerState, capacity: int | None, base: Checked, delta: Delta) -> Checked | None:
    """The ``Checked`` of ``state`` if it is valid; None if it may not be."""
    probs = _Problems()
    gpu_count, cap = _limits(state, capacity, probs)
    if probs:
        return None
    by_id = base.by_id
    if delta.fresh or delta.gone:
        by_id = dict(by_id)
        for gone in delta.gone:
            if by_id.get(gone.id) is gone:
                del by_id[gone.id]
        for r in delta.fresh:
            if not _reservation_ok(r, gpu_count, cap) or r.id in by_id:
                return None
            by_id[r.id] = r
    from bk.core.capacity import RES

    holds = _holds_next(base, state.reservations, gpu_count, delta)
    live = [r for r in delta.fresh if r.cancelled_at is None]
    if live:
        lo, hi = min(r.start for r in live), max(r.end for r in live)
        gpus = {g for r in live for g in r.gpus}
        if holds is not None:
            near = list({id(h[RES]): h[RES] for g in gpus if g in holds.per
                         for h in _near(holds.per[g], lo, hi)}.values())
        else:
            near = [r for r in state.reservations if r.cancelled_at is None and r.start < hi and r.end > lo
                    and not gpus.isdisjoint(r.gpus)]
        _check_capacity(LedgerState(reservations=near), cap, probs)
    _check_others(state, probs)
    if probs:
        return None
    return Checked(state, capacity, by_id, holds, base.quick + 1)


_EVER = -(1 << 62)        # the ``now`` of a check's hold index: ended bookings count too


def _holds_next(base: Checked, reservations: list, gpu_count: int, delta: Delta | None = None):
    """The hold index of ``reservations`` from the base's (None: not kept
    yet); ``delta``: from ``base.reservations``, whose records the base's
    index holds."""
    from bk.core.capacity import HoldIndex

    if gpu_count is None or gpu_count > 4096:       # bookings' GPUs unbounded, or a silly policy
        return None
    usable = {g: None for g in range(gpu_count)}
    if base.holds is not None and base.holds.key == (1, tuple(usable.items())):
        got = base.holds.derive(reservations, _EVER, delta if delta is not None and delta.old is base.reservations
                                else None)
        if got is not None:
            return got
    if base.quick >= 1:
        return HoldIndex.build(reservations, now=_EVER, capacity=1, usable=usable)
    return None


def _near(per: tuple, lo: int, hi: int) -> list[tuple]:
    from bk.core.capacity import GpuLedger

    holds, starts, ml = per
    return GpuLedger(0, 1, None, holds, starts=starts, max_len=ml).overlapping(lo, hi)


def validate(obj, capacity: int | None = None) -> list[str]:
    """Problems with a document (dict) or a state; an empty list means valid."""
    if isinstance(obj, LedgerState):
        return check_state(obj, capacity)
    state, _meta, problems = decode(obj)
    if state is None or problems:
        return problems
    return check_state(state, capacity)


def trusted(state: LedgerState, capacity: int | None) -> Checked | None:
    """The ``Checked`` of a state decoded whole from sealed bytes: their
    writer ran the check before it sealed them (``seal``), so the state
    after a transaction on it may be checked by what the transaction
    changed (``check_next``), which with that check is the full one.  The
    writer checked under the policy the ledger binds; where that binds no
    share capacity (``max_shared_users``), its own capacity decided, which
    may differ from ``capacity``: None, and the full check runs."""
    pol = state.policy
    if type(pol) is not dict:
        return None
    cap, count = pol.get("max_shared_users"), pol.get("gpu_count")
    if not (_is_int(cap) and cap >= 1 and (count is None or (_is_int(count) and count >= 1))):
        return None
    return Checked(state, capacity)


