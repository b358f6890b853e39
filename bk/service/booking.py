"""Booking rules applied to a ledger state inside one transaction.

Each ``apply_*`` function receives the freshly re-read ledger (under the
lock) and the call's context (who, when, the policy, the GPU snapshot),
decides, mutates the state and returns a ``Mutation`` for the store to
commit.  They do no I/O themselves; the store commits or discards.  Each is
one row of ``bk.service.ops``.
Idempotency lives here: an ``op_id`` seen before returns the original
result without a change, and the same key with another request is refused.
A booking typed again by hand, exactly the same, a few minutes later is a
repeat, not a second booking (``repeat_of``).
"""

from __future__ import annotations

from operator import attrgetter

from bk.core import scheduler, telemetry
from bk.core.errors import (
    Ambiguous,
    BkError,
    Conflict,
    InvalidInput,
    NotFound,
    PermissionDenied,
    PolicyRefused,
)
from bk.core.models import (
    ACTIVE,
    ADMIN_CANCEL,
    CANCEL,
    CANCELLED,
    CREATE,
    EDIT,
    ENDED,
    EXCLUSIVE,
    Advance,
    AuditEntry,
    Edit,
    Job,
    LedgerState,
    Mutation,
    Notice,
    OpRecord,
    Reservation,
    iso,
)
from bk.core.record import dataclass, replace
from bk.core.timegrid import counted, floor_slice
from bk.service.context import Actor, Call
from bk.service.requests import BookRequest, CancelRequest, CleanupRequest, EditRequest, canonical
from bk.service.results import BookResult, CancelResult, CleanupResult, EditResult

# How long a notice to one user (an administrator cancelled their booking)
# stays in `bk n` and at login.  Long enough to be seen after a week away.
USER_NOTICE_DAYS = 7

# A booking that repeats one the same user made at most this long ago is
# answered with the first one (``repeat_of``).  Five minutes covers the
# second Enter, the command run again from the shell's history because its
# output scrolled away, and the user who was unsure it worked; it is short
# enough that a booking made on purpose later is never swallowed.
REPEAT_WINDOW = 5 * 60

# The operation names of the table (bk.service.ops) to the action an op-id
# records for them.
OP_ACTIONS = {"book": CREATE, "edit": EDIT, "cancel": CANCEL}


def summary(r: Reservation) -> dict:
    """The compact before/after picture an audit record carries."""
    out = {"gpus": list(r.gpus), "mode": r.mode, "share": r.share, "mem_mib": r.mem_mib,
           "start": r.start, "end": r.end}
    if r.extra and ("idle_release_minutes" in r.extra or "idle_keep_until" in r.extra):
        # Issue 25's opt-in and keep (bk.service.follow, loaded only for them).
        from bk.service import follow

        out.update(follow.summary(r))
    return out


def _replay(state: LedgerState, actor: Actor, op_id: str | None, action: str, digest: str):
    """The earlier result for this op-id, or None when it is new."""
    if not op_id:
        return None
    for op in state.ops:
        if op.op_id == op_id and op.uid == actor.uid:
            if op.action != action or op.digest != digest:
                raise InvalidInput(f"op-id {op_id!r} was already used for a different request",
                                   hint="use a new --op-id for a new request")
            res = state.find(op.reservation)
            if res is None:
                raise NotFound(f"op-id {op_id!r} refers to a reservation that has left the ledger")
            return res
    return None


def op_target(state: LedgerState, actor: Actor, op_id: str | None, action: str) -> Reservation | None:
    """The reservation that ``op_id`` already produced or changed for this
    actor with ``action``, as that operation found it; None when the op-id
    is new, was used for another action (the apply refuses that), or its
    reservation has left the ledger.

    A front end asks this before it resolves a list number or an ID prefix:
    ``bk d 1 --op-id K`` retried after the first run must name the booking
    the first run cancelled, not whichever booking is number 1 now.  For an
    edit the reservation is rebuilt as the edit found it (its recorded edits
    from that one on undone), so a retried ``bk e 1 -d +30m --op-id K``
    builds the same request, and the apply answers ``exists``."""
    if not op_id:
        return None
    op = next((o for o in state.ops if o.op_id == op_id and o.uid == actor.uid), None)
    if op is None or op.action != action:
        return None
    res = state.find(op.reservation)
    if res is None or action != EDIT:
        return res
    edits = list(res.edits)
    mark = op.extra.get("edit")
    if type(mark) is not int or not 0 <= mark < len(edits):
        # Recorded before ops named their edit: the newest one made then, by them.
        mark = next((i for i in range(len(edits) - 1, -1, -1)
                     if edits[i].at == op.at and edits[i].actor_uid == actor.uid), None)
    if mark is None:
        return res
    before = res
    for e in reversed(edits[mark:]):
        undo = {k: (tuple(v) if k == "gpus" else v) for k, v in e.before.items()
                if k in ("gpus", "mode", "share", "mem_mib", "start", "end")}
        before = before.replace(**undo)
    return before.replace(edits=edits[:mark])


def repeat_of(state: LedgerState, req: BookRequest, call: Call) -> Reservation | None:
    """The booking that ``req`` repeats, or None.

    The rule: a new booking (no ``--op-id``, no ``--again``, not a dry run)
    repeats booking B when
      1. B is the same user's, made without an op-id, not cancelled, not
         yet ended, and made at most ``REPEAT_WINDOW`` seconds ago;
      2. the request has B's shape: mode, GPU count, share (shared
         bookings), memory figure, note, and length (B's end minus its start);
         GPUs only where the request names them: pinned GPUs must be B's,
         excluded GPUs must not hold B;
      3. and B's start is where the request would start if B had not been
         made (placed now with B ignored), or the request starts now and B
         started in the slice it was made in (the clock has moved to the
         next slice since: ``bk 1 30m`` at 10:04 and again at 10:06 is one
         booking).
    So the GPUs B was given are not compared: a second ``bk 1 30m`` that
    would land on another GPU only because B took the first one is still a
    repeat, and a bare booking that B pushed into the queue too.  A
    different length, memory, count, mode, share or start is a new booking.
    A different note says it is for something else.  Bookings with an
    ``--op-id`` are governed by the op-id rules only, as the request and as
    the earlier booking alike (a script's retry key says what a retry is);
    ``--again`` books a second on purpose."""
    if req.op_id or req.again or req.dry_run or req.job_id or req.adopt:
        return None
    now, slot = call.now, call.policy.slot_minutes
    for b in reversed(state.reservations):
        if (b.uid != call.actor.uid or b.op_id or b.note != req.note or not b.is_live(now) or not 0 <= now - b.created <= REPEAT_WINDOW
                or b.mode != req.mode or len(b.gpus) != req.count or b.mem_mib != req.mem_mib
                or b.end - b.start != req.duration or (req.mode != EXCLUSIVE and b.share != req.share)
                or (req.pinned and tuple(b.gpus) != tuple(req.pinned))
                or set(b.gpus) & set(req.excluded)):
            continue
        try:
            p = _place(state, _sched_request(req, ignore_id=b.id), call)
        except BkError:
            continue
        if p.start == b.start or (req.start is None and b.start == floor_slice(b.created, slot)
                                  and p.start == floor_slice(now, slot)):
            return b
    return None


def _gone(status: str, already: str = "") -> str:
    """``was already cancelled`` / ``has already ended``: a status is an
    adjective, not a verb ("has cancelled" read as if it had cancelled
    something)."""
    return f"was {already}cancelled" if status == CANCELLED else f"has {already}ended"


def _repeat_hint(b: Reservation, now: int) -> str:
    ago = max(0, now - b.created)
    when = ("just now" if not ago else f"{counted(ago, 'second')} ago" if ago < 120
            else f"{counted(ago // 60, 'minute')} ago")
    return (f"you made this same booking {when}: {b.short_id} is that one, not a second; "
            "to book another on purpose, run the command again with --again")


def _record_op(state: LedgerState, actor: Actor, op_id: str | None, action: str, digest: str,
               rid: str, now: int, extra: dict | None = None) -> None:
    if op_id:
        state.ops.append(OpRecord(op_id, actor.uid, action, digest, rid, now, dict(extra or {})))


def _sched_request(req: BookRequest, ignore_id: str | None = None) -> scheduler.Request:
    return scheduler.Request(
        count=req.count, duration=req.duration, mode=req.mode, share=req.share,
        mem_mib=req.mem_mib, start=req.start, queue=req.queue, pinned=req.pinned,
        excluded=tuple(req.excluded), ignore_id=ignore_id)


def _place(state: LedgerState, sreq: scheduler.Request, call: Call, *, live: bool = True,
           limited: BookRequest | None = None):
    """Placement with the live snapshot (a new booking: avoid busy GPUs, and
    after them GPUs someone uses without a booking: ``placement_load``), or
    with the inventory alone (an edit: its GPUs and memory figures, no look
    at the driver; ``bk e`` needs nothing live).  ``limited``: a new
    booking, placed within its owner's limits (``bk.service.limits``)."""
    if live:
        snap = call.telemetry.snapshot()
        gpus = list(snap.gpus)
        load = telemetry.placement_load(snap, state.reservations, call.now, uid=call.actor.uid)
    else:
        gpus, load = list(call.telemetry.inventory().gpus), None
    if limited is not None and call.policy.limits:
        from bk.service import limits

        return limits.place(state, sreq, call, gpus=gpus, load=load, req=limited)
    return scheduler.place(sreq, reservations=state.reservations, blackouts=state.blackouts,
                           policy=call.policy, gpus=gpus, now=call.now, load=load, tz=call.tz)


def placement_json(p) -> dict:
    return {"gpus": {str(g): why for g, why in sorted(p.reasons.items())},
            "queued": p.queued, "mem_mib_effective": p.mem_mib_effective}


def in_use_warnings(state: LedgerState, res: Reservation, snapshot, now: int) -> list[str]:
    """bk coordinates, it does not enforce: when a booking starts now on a
    GPU that someone's processes already use without a booking there (or,
    for an exclusive booking, anyone else's processes), say so rather than
    let the user find out from an out-of-memory error."""
    out = []
    for x in telemetry.intruders(snapshot, state.reservations, booking=res, now=now):
        what = "processes" if x.count != 1 else "a process"
        out.append(f"GPU {x.gpu} is in use right now by {what} of {', '.join(x.users)} "
                   f"without a booking there" + (f" ({x.mem_mib} MiB)" if x.mem_mib else ""))
    return out


def apply_book(state: LedgerState, req: BookRequest, call: Call) -> Mutation:
    actor, now, policy = call.actor, call.now, call.policy
    digest = canonical(CREATE, req) if req.op_id else ""
    earlier = _replay(state, actor, req.op_id, CREATE, digest)
    if earlier is not None:
        return Mutation(False, [], BookResult("exists", earlier))
    first = repeat_of(state, req, call)
    if first is not None:
        call.warn(_repeat_hint(first, now))
        return Mutation(False, [], BookResult("exists", first, {"repeat_of": first.id}))
    if call.limits is not None and not actor.is_admin:
        from bk.core import ledgerlimits  # a shared server's broker only

        ledgerlimits.check_new(state.reservations, actor.uid, now, call.limits, req.note)
    uid, user = actor.uid, actor.user
    if req.adopt:
        # bk adopt: the processes must still run, and be the actor's (or
        # the administrator adopts for their owner): read here, where the
        # booking is written (the broker on a shared server).
        from bk.service.adopt import check_adopt

        uid, user = check_adopt(req, actor, state, now)
    try:
        p = _place(state, _sched_request(req), call, limited=req)
    except Conflict as e:
        raise _with_nearest(e, state, req, call) from None
    share = policy.max_shared_users if req.mode == EXCLUSIVE else req.share
    res = Reservation(id=call.new_id("reservation"), uid=uid, user=user, mode=req.mode, gpus=tuple(p.gpus),
                      share=share, start=p.start, end=p.end, created=now, mem_mib=req.mem_mib,
                      op_id=req.op_id, note=req.note, job=_attached_job(req, now),
                      advance=_new_advance(req, p, call), shared_with=_shared(req.shared_with, actor),
                      # Placed later than asked: the owner's deliverer tells them
                      # when it could start earlier (bk.service.notifier).
                      extra={**({"queued_from": iso(req.start if req.start is not None else now)}
                                 if p.queued else {}), **_follow_extra(req)})
    status = "queued" if p.queued else "created"
    if res.start <= now:
        call.warn(*in_use_warnings(state, res, call.telemetry.snapshot(), now))
    result = BookResult(status, res, placement_json(p), dry_run=req.dry_run)
    if req.dry_run:
        return Mutation(False, [], result)
    state.reservations.append(res)
    _record_op(state, actor, req.op_id, CREATE, digest, res.id, now)
    result = replace(result, same_shape=same_shape_count(state.reservations, actor.uid, res))
    return Mutation(True, [AuditEntry(CREATE, status, res.id, req.op_id, None, summary(res), res.uid)],
                    result)


def _with_nearest(e: Conflict, state: LedgerState, req: BookRequest, call: Call) -> Conflict:
    """An exact start that is taken: the nearest start that fits, found on
    the same state in the same transaction, goes into the refusal's details
    (``nearest_start``, ``nearest_gpus``), from which ``explain_book`` words
    the hint in the caller's own process and zone."""
    if req.start is None or req.queue or e.details.get("rule") not in ("capacity", "memory"):
        return e
    snap = call.telemetry.snapshot()
    try:
        found = scheduler.recommend(_sched_request(replace(req, queue=True)), reservations=state.reservations,
                                    blackouts=state.blackouts, policy=call.policy, gpus=list(snap.gpus),
                                    now=call.now, alternatives=1, tz=call.tz,
                                    load=telemetry.placement_load(snap, state.reservations, call.now,
                                                                  uid=call.actor.uid))
    except BkError:
        return e
    if not found:
        return e
    p = found[0]
    return Conflict(e.message, e.hint, details={**e.details, "nearest_start": iso(p.start),
                                                "nearest_gpus": list(p.gpus)})


def explain_book(e: BkError, req: BookRequest, call: Call) -> BkError:
    """The ``book`` row's refusal for the caller: an exact start that is
    taken names the nearest start that fits (``_with_nearest``), with the
    command that books it, rather than leave the user guessing.  Run by
    ``Service.run`` for both gateways: the broker's reply carries the same
    details, and the words are in this caller's zone."""
    start, gpus = e.details.get("nearest_start"), e.details.get("nearest_gpus")
    if not isinstance(e, Conflict) or not isinstance(start, str) or not isinstance(gpus, list):
        return e
    from bk.core.models import parse_iso
    from bk.core.timegrid import format_local_short
    from bk.service.advice import local_command

    try:
        at = parse_iso(start)
        option = scheduler.Placement(at, at + req.duration, tuple(gpus), True, {}, None)
    except (TypeError, ValueError):
        return e
    command = local_command(replace(req, queue=True, op_id=None, dry_run=False), option, call.now,
                            call.policy.slot_minutes, call.tz)
    hint = (f"the nearest start that fits is {format_local_short(option.start, call.tz, call.now)}: "
            f"{command} (or add --queue to take it)")
    return Conflict(e.message, hint, details=e.details)


def _new_advance(req: BookRequest, p, call: Call) -> Advance | None:
    """A queued booking that asked to (``--advance``, or the server's
    ``advance_default`` without ``--no-advance``) waits to move earlier,
    never before the start it asked for (``bk.core.advance``)."""
    if req.advance and req.no_advance:
        raise InvalidInput("--advance and --no-advance contradict each other", hint="give one of them")
    if not (req.advance or (call.policy.advance_default and not req.no_advance)):
        return None
    if not p.queued:
        if req.advance:
            call.warn("it starts when asked: --advance has nothing to wait for")
        return None
    after = req.start if req.start is not None else floor_slice(call.now, call.policy.slot_minutes)
    return Advance(call.now, after, req.pinned is not None, tuple(req.excluded))


def _shared(text: str | None, actor: Actor) -> tuple[str, ...]:
    """``--with``: names this server knows (a typo shares with nobody)."""
    if text is None:
        return ()
    from bk.core.sharing import parse
    from bk.store.accounts import accounts

    names = parse(text, owner=actor.user)
    unknown = [e for e in names if (accounts().group_exists(e[1:]) if e.startswith("@")
                                    else accounts().uid_of(e) is not None) is False]
    if unknown:
        raise InvalidInput(f"--with names {', '.join(unknown)}, which this server does not know",
                           hint="users by login name, groups as @group (see: id USER, getent group GROUP)")
    return names


def _follow_extra(req: BookRequest) -> dict:
    if req.idle_release_minutes is None and not req.adopt:
        return {}
    from bk.service import follow

    return follow.book_extra(req)


SHAPE_WINDOW = 20      # the user's latest bookings the preset suggestion looks at (presets.RECENT)
_CREATED, _CREATED_ID = attrgetter("created"), attrgetter("created", "id")


def shape_of(r: Reservation) -> tuple:
    """What makes two bookings "the same" for a preset: count, duration, mode, memory, share."""
    return (len(r.gpus), r.end - r.start, r.mode, r.mem_mib, 1 if r.mode == EXCLUSIVE else r.share)


def same_shape_count(reservations, uid: int, booked: Reservation, window: int = SHAPE_WINDOW) -> int:
    """How many of ``uid``'s latest ``window`` bookings that are not cancelled
    (newest first by creation) have ``booked``'s shape, ``booked`` counted
    once whether or not it is among them."""
    mine = [r for r in reservations if r.uid == uid and r.cancelled_at is None]
    if len(mine) > window:
        # Only bookings made at or after the window-th newest creation time
        # can be among the latest: sort those, not every one of the user's.
        cut = sorted(map(_CREATED, mine))[-window]
        mine = [r for r in mine if r.created >= cut]
    recent = sorted(mine, key=_CREATED_ID, reverse=True)[:window]
    shape = shape_of(booked)
    return sum(1 for r in recent if shape_of(r) == shape) + (booked.id not in {r.id for r in recent})


def _attached_job(req: BookRequest, now: int) -> Job | None:
    """``bk N DUR -- CMD``: the job as the ledger knows it (bk.core.jobs):
    pending, its safe summary, and the private spec's id and digest."""
    if not req.job_id:
        return None
    if not req.job_digest:
        raise InvalidInput("a job needs the digest of its spec")
    return Job("pending", req.job_summary, {"id": req.job_id, "digest": req.job_digest,
                                             "reason": None, "exit_code": None, "updated": iso(now)})


def _owned(state: LedgerState, rid: str, actor: Actor, verb: str) -> Reservation:
    res = state.find(rid)
    if res is None:
        raise NotFound(f"no reservation {rid[:8]}", hint="list yours with: bk l")
    if res.uid != actor.uid:
        raise PermissionDenied(f"reservation {res.short_id} belongs to {res.user}; you may {verb} "
                               "only your own", hint="ask its owner, or the administrator")
    return res


def apply_edit(state: LedgerState, req: EditRequest, call: Call) -> Mutation:
    actor, now = call.actor, call.now
    digest = canonical(EDIT, req) if req.op_id else ""
    earlier = _replay(state, actor, req.op_id, EDIT, digest)
    if earlier is not None:
        return Mutation(False, [], EditResult("exists", earlier, earlier))
    old = _owned(state, req.ref, actor, "edit")
    status = old.status(now)
    if status in (ENDED, CANCELLED):
        raise InvalidInput(f"reservation {old.short_id} {_gone(status)}; it can no longer be edited",
                           hint="book again with: bk N DUR")
    if status == ACTIVE:
        new = _edit_active(state, old, req, call)
    else:
        new = _edit_upcoming(state, old, req, call)
    if req.idle_release_minutes is not None or req.keep_until is not None:
        from bk.service import follow

        new = follow.edited(new, req, now)
    before, after = summary(old), summary(new)
    if before != after and call.policy.limits:
        from bk.service import limits

        limits.check_edit(state, old, new, call)
    new = _edit_fair(old, new, req, call, moved=before != after)
    if before == after and (req.note is None or req.note == old.note) and _fair_of(new) == _fair_of(old):
        return Mutation(False, [], EditResult("unchanged", old, old, dry_run=req.dry_run))
    if req.note is not None:
        if call.limits is not None and not actor.is_admin:
            from bk.core import ledgerlimits

            ledgerlimits.check_note(state.reservations, actor.uid, now, call.limits, old.note, req.note)
        new = new.replace(note=req.note)
    fair_before, fair_after = _fair_of(old), _fair_of(new)
    fair_was = {k: v for k, v in fair_before.items() if fair_after[k] != v}
    fair_now = {k: v for k, v in fair_after.items() if fair_before[k] != v}
    new = new.replace(edits=[*old.edits, Edit(now, actor.uid, actor.user,
                                              {k: v for k, v in before.items() if after.get(k) != v} | fair_was,
                                              {k: v for k, v in after.items() if before.get(k) != v} | fair_now)])
    result = EditResult("updated", new, old, dry_run=req.dry_run)
    if req.dry_run:
        return Mutation(False, [], result)
    state.swap(old, new)
    # "edit": which of the booking's edits this op made (op_target undoes from it).
    _record_op(state, actor, req.op_id, EDIT, digest, new.id, now, {"edit": len(old.edits)})
    return Mutation(True, [AuditEntry(EDIT, "updated", new.id, req.op_id, before | fair_was, after | fair_now,
                                      new.uid)], result)


def _fair_of(r: Reservation) -> dict:
    """The issue-27 fields an edit records when they change."""
    return {"advance": r.advance is not None, "shared_with": list(r.shared_with)}


def _edit_fair(old: Reservation, new: Reservation, req: EditRequest, call: Call, *, moved: bool) -> Reservation:
    """``--with``, ``--advance``, ``--no-advance``; a new start the owner
    picked (without ``--advance``) ends the wait, since they chose a time."""
    if req.advance and req.no_advance:
        raise InvalidInput("--advance and --no-advance contradict each other", hint="give one of them")
    if req.shared_with is not None:
        new = new.replace(shared_with=_shared(req.shared_with, call.actor))
    if req.advance:
        if old.status(call.now) != "upcoming":
            raise InvalidInput(f"reservation {old.short_id} has started; there is nothing earlier to move to")
        after = req.start if req.start is not None else floor_slice(call.now, call.policy.slot_minutes)
        since = old.advance.since if old.advance is not None else call.now
        new = new.replace(advance=Advance(since, after, req.pinned is not None or (
            old.advance is not None and old.advance.pinned and req.excluded is None),
            tuple(req.excluded or (old.advance.excluded if old.advance else ()))))
    elif req.no_advance or (moved and req.start is not None and new.start != old.start):
        new = new.replace(advance=None)
    return new


def _edit_active(state, old: Reservation, req: EditRequest, call: Call) -> Reservation:
    """After start only the end may move: the elapsed part and the GPUs are history."""
    now, policy = call.now, call.policy
    frozen = [k for k in ("start", "mode", "share", "mem_mib", "clear_mem", "pinned", "excluded")
              if getattr(req, k) not in (None, False)]
    if frozen:
        raise InvalidInput(f"reservation {old.short_id} has started; only its end may change "
                           f"(not {', '.join(frozen)})",
                           hint="extend or shorten with: bk e ID -d +30m, or -d 2h for a new total")
    end = req.end if req.end is not None else (old.start + req.duration if req.duration else old.end)
    if end <= now:
        raise InvalidInput("the new end is in the past", hint="to stop now, cancel it: bk d ID")
    if end % policy.slot_seconds:
        raise InvalidInput(f"the new end is not on a {policy.slot_minutes}-minute boundary")
    if end - old.start > policy.max_booking_hours * 3600:
        raise PolicyRefused(f"a booking may last at most {counted(policy.max_booking_hours, 'hour')} "
                            "(max_booking_hours)", hint="shorten the extension")
    if end > old.end:
        # Check only what is added, on the same GPUs, with the booking itself ignored.
        check_from = max(floor_slice(now, policy.slot_minutes), old.start)
        sreq = scheduler.Request(count=len(old.gpus), duration=end - check_from, mode=old.mode,
                                 share=old.share if old.mode != EXCLUSIVE else 1,
                                 mem_mib=old.mem_mib, start=check_from, pinned=tuple(old.gpus),
                                 ignore_id=old.id)
        try:
            _place(state, sreq, call, live=False)
        except Conflict as e:
            # A running booking keeps its GPUs: queueing cannot help here.
            raise Conflict(f"cannot extend {old.short_id}: {e.message}",
                           hint="extend it less, or book the extra time separately (see bk slots)",
                           details=e.details) from None
    return old.replace(end=end)


def _edit_upcoming(state, old: Reservation, req: EditRequest, call: Call) -> Reservation:
    """Before start anything may change; the result is placed as if the old booking were absent."""
    now, policy = call.now, call.policy
    mode = req.mode or old.mode
    if req.share is not None:
        share = req.share
    elif mode == EXCLUSIVE or old.mode == EXCLUSIVE:
        share = 1
    else:
        share = old.share
    duration = req.duration if req.duration is not None else old.end - old.start
    start = req.start if req.start is not None else old.start
    if req.end is not None:
        duration = req.end - start
        if duration <= 0:
            raise InvalidInput("the new end is not after the start")
    mem = None if req.clear_mem else (req.mem_mib if req.mem_mib is not None else old.mem_mib)
    pinned = req.pinned
    if pinned is None and req.excluded is None:
        pinned = tuple(old.gpus)   # keep the GPUs unless the user asks for others
    if not req.queue and _frees_only(old, start, duration, mode, share, mem, pinned, req.excluded):
        # Inside what the booking already holds: nothing is placed, since
        # nothing is taken.  A booking the administrator kept inside a
        # maintenance window (or against a changed policy) may so be
        # shortened, or given a note, where placing it anew is refused.
        end = start + duration
        if start % policy.slot_seconds or end % policy.slot_seconds:
            raise InvalidInput(f"the new times are not on {policy.slot_minutes}-minute boundaries")
        return old.replace(mem_mib=mem, gpus=tuple(sorted(pinned)), start=start, end=end)
    count = len(pinned) if pinned else len(old.gpus)
    sreq = scheduler.Request(count=count, duration=duration, mode=mode, share=share, mem_mib=mem,
                             start=max(start, floor_slice(now, policy.slot_minutes)),
                             queue=req.queue, pinned=pinned, excluded=tuple(req.excluded or ()),
                             ignore_id=old.id)
    try:
        p = _place(state, sreq, call, live=False)
    except PolicyRefused as e:
        window = e.details.get("blackout") if e.details.get("rule") == "blackout" else None
        if window and any(b.id == window.get("id") and b.start < old.end and old.start < b.end
                          for b in state.blackouts):
            # Kept there by the administrator: "--queue" alone would move it.
            e.hint = ("it was kept in this window: where it is, it may be shortened or given a note; "
                      "a longer or later one must avoid the window (--queue moves it past it)")
        raise
    new_share = policy.max_shared_users if mode == EXCLUSIVE else share
    return old.replace(mode=mode, share=new_share, mem_mib=mem, gpus=tuple(p.gpus),
                       start=p.start, end=p.end)


def _frees_only(old: Reservation, start: int, duration: int, mode: str, share: int, mem, pinned,
                excluded) -> bool:
    """The edited booking takes nothing the old one did not hold: within its
    time, on some of its GPUs, the same mode and share, no more memory."""
    if excluded is not None or not pinned or not set(pinned) <= set(old.gpus):
        return False
    if mode != old.mode or (mode != EXCLUSIVE and share != old.share):
        return False
    if old.mem_mib is not None and (mem is None or mem > old.mem_mib):
        return False
    if old.mem_mib is None and mem is not None and mode != EXCLUSIVE:
        return False          # a figure where there was none is a rule change, placed as usual
    return duration > 0 and old.start <= start and start + duration <= old.end


def apply_cancel(state: LedgerState, req: CancelRequest, call: Call) -> Mutation:
    actor, now = call.actor, call.now
    digest = canonical(CANCEL, req) if req.op_id else ""
    earlier = _replay(state, actor, req.op_id, CANCEL, digest)
    if earlier is not None:
        return Mutation(False, [], CancelResult("exists", earlier))
    res = state.find(req.ref)
    if res is None:
        raise NotFound(f"no reservation {req.ref[:8]}", hint="list yours with: bk l")
    by_admin = res.uid != actor.uid
    if by_admin and not actor.is_admin:
        raise PermissionDenied(f"reservation {res.short_id} belongs to {res.user}; you may cancel "
                               "only your own", hint="ask its owner, or the administrator")
    if by_admin and not (req.reason or "").strip():
        raise InvalidInput("cancelling another user's booking needs a reason; the owner is told",
                           hint="sudo bk admin cancel ID --reason 'maintenance'")
    status = res.status(now)
    if status in (ENDED, CANCELLED):
        raise InvalidInput(f"reservation {res.short_id} {_gone(status, 'already ')}")
    new = res.replace(cancelled_at=now, cancelled_by=actor.uid,
                      cancel_reason=(req.reason or None))
    if status != ACTIVE and new.note:
        # It never started: its note would sit in the hot ledger for a day
        # (bk.core.ledgerlimits) and says nothing about any use of the GPUs.
        new = new.replace(note=None)
    if new.job is not None and new.job.status == "pending":
        # Never started: nothing for the worker to stop.  A running job
        # stays running until its worker has stopped it and says so.
        new = new.replace(job=Job("cancelled", new.job.summary,
                                  {**new.job.extra, "reason": "the booking was cancelled",
                                   "updated": iso(now)}))
    result = CancelResult("cancelled", new, dry_run=req.dry_run)
    if req.dry_run:
        return Mutation(False, [], result)
    state.swap(res, new)
    if by_admin:
        state.notices.append(Notice(id=call.new_id("notice"), at=now, uid=res.uid, level="warning",
                                    reservation=res.id, created_by=actor.uid,
                                    until=now + USER_NOTICE_DAYS * 86400,
                                    text=f"Your booking {res.short_id} was cancelled by the "
                                         f"administrator: {req.reason.strip()}"))
    _record_op(state, actor, req.op_id, CANCEL, digest, res.id, now)
    return Mutation(True, [AuditEntry(ADMIN_CANCEL if by_admin else CANCEL, "cancelled", res.id, req.op_id,
                                      summary(res), None, res.uid, req.reason)], result)


def check_cleanup(req: CleanupRequest) -> None:
    if (req.op_id_prefix is None) == (not req.all):
        raise InvalidInput("cleanup takes either op_id_prefix or all: true (not both, not neither)",
                           hint='e.g. {"op_id_prefix": "agent-run-7-"}')


def apply_cleanup(state: LedgerState, req: CleanupRequest, call: Call) -> Mutation:
    """Cancel the caller's live bookings that match, in this one transaction;
    a retry finds nothing left to cancel (``nothing``), so it is idempotent."""
    uid, now = call.actor.uid, call.now
    hits = [r for r in state.reservations if r.uid == uid and r.is_live(now)
            and (req.all or (r.op_id or "").startswith(req.op_id_prefix or "\0"))]
    done, audit, changed = [], [], False
    for r in hits:
        m = apply_cancel(state, CancelRequest(r.id, dry_run=req.dry_run), call)
        done.append(m.result.reservation)
        audit.extend(m.audit)
        changed = changed or m.changed
    status = "nothing" if not hits else "dry_run" if req.dry_run else "cancelled"
    return Mutation(changed, audit, CleanupResult(status, tuple(done), req.dry_run))


# ------------------------------------------------------------ naming a booking

_HEX = set("0123456789abcdef-")


def resolve(state: LedgerState, ref: str, call: Call, *, any_owner: bool = False) -> Reservation:
    """A full reservation from a list number (1-3 digits), a unique ID
    prefix of at least 4 characters, or a full ID."""
    from bk.service.views import own_current

    ref = ref.strip().lower()
    if ref.isdigit() and len(ref) <= 3:
        mine = own_current(state, call)
        n = int(ref)
        if not 1 <= n <= len(mine):
            raise NotFound(f"you have no booking number {n}" + (f" (you have {len(mine)})"
                           if mine else ""), hint="list yours with: bk l")
        return mine[n - 1]
    if len(ref) < 4 or not set(ref) <= _HEX:
        raise InvalidInput(f"{ref!r} is neither a list number nor an ID prefix of 4+ hex characters",
                           hint="use the number or ID shown by: bk l")
    hits = [r for r in state.reservations if r.id.startswith(ref)]
    if not any_owner:
        own = [r for r in hits if r.uid == call.actor.uid]
        hits = own or hits
    if not hits:
        raise NotFound(f"no reservation with ID {ref}", hint="list yours with: bk l")
    if len(hits) > 1:
        raise Ambiguous(f"ID prefix {ref} matches {len(hits)} reservations: "
                        + ", ".join(f"{r.id[:12]} ({r.user})" for r in hits[:10]),
                        hint="type more characters of the ID", details={"candidates": [r.id for r in hits]})
    return hits[0]


@dataclass(frozen=True)
class ResolveRequest:
    """Which booking a front end means: ``ref`` (a list number, an ID
    prefix, a full ID), unless ``op_id`` already did ``action`` (edit,
    cancel, book) to one, which is then the one (``op_target``)."""

    ref: str
    op_id: str | None = None
    action: str | None = None
    any_owner: bool = False           # the administrator names anyone's booking


@dataclass(frozen=True)
class ResolveResult:
    reservation: Reservation
    by_op_id: bool
    view: object                      # bk.service.views.View

    def to_json(self) -> dict:
        return {"reservation": self.view.reservation(self.reservation), "by_op_id": self.by_op_id}


def _serve_resolve(service, req: ResolveRequest, call: Call) -> ResolveResult:
    """A front end asks this *before* it builds an edit or a cancellation:
    a retried ``bk d 1 --op-id K`` then names the booking the first run
    cancelled (numbers move once it is gone) and the operation answers
    ``exists``, here and through the broker alike.  The op records are in
    the committed ledger, which every user may read."""
    from bk.service.views import View

    if req.op_id and req.action:
        state = service.ledger(call=call)
    else:
        # A list number names one of yours, an ID prefix anyone's booking
        # with that prefix: on a sealed ledger only those are built.
        from bk.core.ledgerdoc import DocKeep

        ref = req.ref.strip().lower()
        state = service.ledger(call=call, keep=DocKeep(
            uid=call.actor.uid, prefix=None if ref.isdigit() and len(ref) <= 3 else ref))
    res = None
    if req.op_id and req.action:
        if req.action not in OP_ACTIONS:
            raise InvalidInput(f"unknown action {req.action!r}", hint=", ".join(OP_ACTIONS))
        res = op_target(state, call.actor, req.op_id, OP_ACTIONS[req.action])
    by_op = res is not None
    if res is None:
        res = resolve(state, req.ref, call, any_owner=req.any_owner)
    return ResolveResult(res, by_op, View.of(call))


@dataclass(frozen=True)
class OpLookupRequest:
    op_id: str


@dataclass(frozen=True)
class OpLookupResult:
    """What an op-id did here (``bk c op``: a lost reply looked up), if anything."""

    op_id: str
    action: str | None
    reservation: Reservation | None   # None: not found, or it has left the ledger
    view: object
    reservation_id: str | None = None  # what the op-id's record names

    @property
    def found(self) -> bool:
        return self.action is not None

    def to_json(self) -> dict:
        return {"op_id": self.op_id, "found": self.found, "action": self.action,
                "reservation": self.view.reservation(self.reservation) if self.reservation is not None else None}


def _serve_op_lookup(service, req: OpLookupRequest, call: Call) -> OpLookupResult:
    from bk.service.views import View

    state = service.ledger(call=call)
    op = next((o for o in state.ops if o.op_id == req.op_id and o.uid == call.actor.uid), None)
    res = state.find(op.reservation) if op is not None else None
    return OpLookupResult(req.op_id, op.action if op else None, res, View.of(call),
                          op.reservation if op else None)
