"""Maintenance windows and notice edits: the administrator's writes.

A maintenance window is three things that must change together or not at
all: a blackout (no booking may run in it; ``--no-block`` leaves it out), an
announcement that says when and why, and the bookings that already overlap
it, which the administrator either keeps or cancels (their owners get the
same notice as ``bk admin cancel`` gives).  One row of the operation table,
``blackout_add``, does all three in one ledger commit, so a crash leaves
either the old ledger or the whole window, and it works through the broker
like every other write (ADMIN: the kernel says the caller is root).

The administrator decides on what they were shown.  A booking made between
the listing and the confirmation is not cancelled unseen: the request names
the overlapping bookings the administrator saw (``seen``), and a window that
now overlaps others is refused with the new ones named, to look again.

Running processes are never stopped: a blackout only refuses new bookings
and edits into the window (the scheduler's ``blackout`` rule).

``blackout_end`` ends a window early (or withdraws one that has not begun)
and archives its announcement.  ``notice_edit`` changes an announcement's
text, level or expiry; the audit record keeps the content it had before, and
notices are never deleted, only archived (with who and when).
"""

from __future__ import annotations

from bk.core.errors import Conflict, InvalidInput
from bk.core.models import (
    ADMIN_CANCEL,
    CANCELLED,
    ENDED,
    AuditEntry,
    Blackout,
    LedgerState,
    Mutation,
    Notice,
    iso,
)
from bk.core.record import dataclass, replace
from bk.core.timegrid import counted
from bk.service.context import Call
from bk.service.requests import BlackoutEndRequest, MaintainRequest, NoticeEditRequest
from bk.service.results import MaintainResult, NoticeEditResult

# Audit actions of these rows (the audit log's ``action``).
BLACKOUT_ADD, BLACKOUT_END, NOTICE_EDIT = "blackout_add", "blackout_end", "notice_edit"
OVERLAP_CHOICES = ("refuse", "keep", "cancel")
USER_NOTICE_DAYS = 7          # as an administrator's cancel (bk.service.booking)


def check_maintain(req: MaintainRequest) -> None:
    if req.end <= req.start:
        raise InvalidInput("the window ends at or before its start", hint="e.g. -d 2h")
    if not req.reason.strip():
        raise InvalidInput("say why: the reason is shown to every user", hint="--reason 'driver update'")
    if req.overlapping not in OVERLAP_CHOICES:
        raise InvalidInput("overlapping must be one of " + ", ".join(OVERLAP_CHOICES))


def check_notice_edit(req: NoticeEditRequest) -> None:
    if req.text is None and req.level is None and req.until is None and not req.clear_until:
        raise InvalidInput("nothing to change", hint="give --text, --level, --until or --no-until")
    if req.until is not None and req.clear_until:
        raise InvalidInput("--until and --no-until contradict each other")
    if req.text is not None and not req.text.strip():
        raise InvalidInput("the announcement text is empty")


# ------------------------------------------------------------ the rules

def overlapping(state: LedgerState, start: int, end: int, now: int) -> list:
    """Bookings that still run or will run inside [start, end)."""
    return sorted((r for r in state.reservations
                   if r.status(now) not in (ENDED, CANCELLED) and r.start < end and start < r.end
                   and r.end > now),
                  key=lambda r: (r.start, r.id))


def apply_maintain(state: LedgerState, req: MaintainRequest, call: Call) -> Mutation:
    now, actor = call.now, call.actor
    start = max(req.start, now - now % call.policy.slot_seconds) if req.start <= now else req.start
    if req.end <= now:
        raise InvalidInput("the window is already over", hint="give a later end, e.g. -d 2h")
    over = overlapping(state, start, req.end, now)
    ids = [r.id for r in over]
    if over and req.overlapping == "refuse":
        raise Conflict(f"{counted(len(over), 'booking')} {'overlaps' if len(over) == 1 else 'overlap'} the window: "
                       + ", ".join(f"{r.short_id} ({r.user})" for r in over[:10]),
                       hint="choose: --keep (they run on) or --cancel-overlapping (their owners are told)",
                       details={"rule": "maintenance", "overlapping": ids})
    if req.overlapping == "cancel":
        unseen = [r for r in over if r.id not in req.seen_ids]
        if unseen:
            raise Conflict("bookings made since the window was shown overlap it too: "
                           + ", ".join(f"{r.short_id} ({r.user})" for r in unseen[:10]),
                           hint="run bk admin maintain again to see them all",
                           details={"rule": "maintenance", "unseen": [r.id for r in unseen]})
    text = (req.text or req.reason).strip()
    notice = Notice(id=call.new_id("notice"), at=now, text=text, level=req.level, until=req.end,
                    created_by=actor.uid)
    blackout = None
    if req.block:
        blackout = Blackout(id=call.new_id("blackout"), start=start, end=req.end, reason=req.reason.strip(),
                            created_by=actor.uid, extra={"notice": notice.id})
        notice = replace(notice, extra={"blackout": blackout.id, "start": iso(start)})
    else:
        notice = replace(notice, extra={"start": iso(start)})
    cancelled = tuple(ids) if req.overlapping == "cancel" else ()
    result = MaintainResult("dry_run" if req.dry_run else "created", blackout, notice, tuple(over),
                            cancelled, req.dry_run)
    if req.dry_run:
        return Mutation(False, [], result)
    audit = []
    for r in over:
        if r.id not in cancelled:
            continue
        state.reservations[state.reservations.index(r)] = r.replace(
            cancelled_at=now, cancelled_by=actor.uid, cancel_reason=req.reason.strip())
        if r.uid != actor.uid:
            state.notices.append(Notice(
                id=call.new_id(f"notice-{r.id}"), at=now, uid=r.uid, level="warning", reservation=r.id,
                created_by=actor.uid, until=now + USER_NOTICE_DAYS * 86400,
                text=f"Your booking {r.short_id} was cancelled by the administrator: {req.reason.strip()}"))
        audit.append(AuditEntry(ADMIN_CANCEL, "cancelled", r.id, None,
                                {"gpus": list(r.gpus), "start": iso(r.start), "end": iso(r.end)},
                                None, r.uid, req.reason.strip()))
    state.notices.append(notice)
    if blackout is not None:
        state.blackouts.append(blackout)
    audit.insert(0, AuditEntry(BLACKOUT_ADD, "created", after={
        "blackout": blackout.id if blackout else None, "notice": notice.id, "start": iso(start),
        "end": iso(req.end), "reason": req.reason.strip(), "level": req.level,
        "kept": [i for i in ids if i not in cancelled], "cancelled": list(cancelled)}))
    return Mutation(True, audit, result)


def find_blackout(state: LedgerState, ref: str) -> Blackout:
    from bk.service.notices import by_prefix

    return by_prefix(state.blackouts, ref, "maintenance window", "windows",
                     "list them with: bk admin maintain list")


def apply_end(state: LedgerState, req: BlackoutEndRequest, call: Call) -> Mutation:
    """End a window now: one that runs keeps its past (end = now, on the
    slice grid so the ledger stays aligned); one that has not begun is
    withdrawn.  Its announcement is archived.  The audit log keeps both."""
    now = call.now
    b = find_blackout(state, req.ref)
    notice = next((n for n in state.notices if n.id == b.extra.get("notice")), None)
    if b.end <= now:
        return Mutation(False, [], MaintainResult("unchanged", b, notice))
    q = call.policy.slot_seconds
    cut = -(-now // q) * q            # the end of the current slice
    # The window's own change counter (additive: readers that do not know
    # it ignore it): a calendar feed's SEQUENCE, so subscribers take the new end.
    ended = replace(b, end=cut, extra={**b.extra, "sequence": _seq(b) + 1, "changed_at": iso(now)}) \
        if b.start < cut < b.end else None
    archived = None if notice is None or notice.archived else replace(
        notice, archived=True, extra={**notice.extra, "archived_at": iso(now), "archived_by": call.actor.uid})
    result = MaintainResult("dry_run" if req.dry_run else "ended", ended or b, archived or notice,
                            dry_run=req.dry_run)
    if req.dry_run:
        return Mutation(False, [], result)
    i = state.blackouts.index(b)
    if ended is None:
        del state.blackouts[i]
    else:
        state.blackouts[i] = ended
    if archived is not None:
        state.notices[state.notices.index(notice)] = archived
    return Mutation(True, [AuditEntry(BLACKOUT_END, "ended" if ended else "withdrawn",
                                      before={"blackout": b.id, "start": iso(b.start), "end": iso(b.end),
                                              "reason": b.reason},
                                      after={"end": iso(ended.end)} if ended else None)], result)


def _seq(b) -> int:
    n = b.extra.get("sequence")
    return n if type(n) is int and n >= 0 else 0


def apply_notice_edit(state: LedgerState, req: NoticeEditRequest, call: Call) -> Mutation:
    from bk.service.notices import find_notice

    n = find_notice(state, req.ref)
    if req.level is not None and req.level not in Notice.LEVELS:
        raise InvalidInput(f"level must be one of {', '.join(Notice.LEVELS)}")
    if req.until is not None and req.until <= call.now:
        raise InvalidInput("'until' is already past", hint="give a later time, or --no-until")
    if n.archived:
        raise InvalidInput(f"notice {n.id[:8]} is archived; publish a new one instead",
                           hint="sudo bk admin notice publish TEXT")
    changed = {}
    if req.text is not None and req.text.strip() != n.text:
        changed["text"] = req.text.strip()
    if req.level is not None and req.level != n.level:
        changed["level"] = req.level
    until = None if req.clear_until else req.until if req.until is not None else n.until
    if until != n.until:
        changed["until"] = until
    new = replace(n, **changed) if changed else n
    if req.dry_run:
        return Mutation(False, [], NoticeEditResult("dry_run", new, n, True))
    if not changed:
        return Mutation(False, [], NoticeEditResult("unchanged", n, n))
    edits = list(n.extra.get("edits") or [])
    edits.append({"at": iso(call.now), "by": call.actor.uid, "fields": sorted(changed)})
    new = replace(new, extra={**n.extra, "edits": edits})
    state.notices[state.notices.index(n)] = new

    def content(x: Notice) -> dict:
        return {"id": x.id, "text": x.text, "level": x.level, "until": iso(x.until)}

    return Mutation(True, [AuditEntry(NOTICE_EDIT, "edited", before=content(n), after=content(new))],
                    NoticeEditResult("edited", new, n))


# ------------------------------------------------------------ the administrator's reads

@dataclass(frozen=True)
class BlackoutsRequest:
    all: bool = False                 # past windows too


@dataclass(frozen=True)
class BlackoutsResult:
    windows: tuple                    # Blackouts, by start

    def to_json(self) -> dict:
        from bk.service.results import blackout_json

        return {"windows": [blackout_json(b) for b in self.windows]}


def _serve_blackouts(service, req: BlackoutsRequest, call) -> BlackoutsResult:
    state = service.ledger(call=call)
    return BlackoutsResult(tuple(b for b in sorted(state.blackouts, key=lambda b: b.start)
                                 if req.all or b.end > call.now))


def notice_state(n, now: int) -> str:
    """archived, expired, scheduled (shown from later) or shown."""
    if n.archived:
        return "archived"
    if n.until is not None and n.until <= now:
        return "expired"
    return "scheduled" if n.at > now else "shown"


@dataclass(frozen=True)
class NoticeListResult:
    """Every notice, archived ones too, newest first, with its state."""

    notices: tuple
    now: int

    def state(self, n) -> str:
        return notice_state(n, self.now)

    def to_json(self) -> dict:
        from bk.service.views import notice_json

        return {"notices": [{**notice_json(n), "state": self.state(n), "uid": n.uid, "created_by": n.created_by,
                             "archived_at": n.extra.get("archived_at"), "archived_by": n.extra.get("archived_by"),
                             "edits": n.extra.get("edits", [])} for n in self.notices]}


def _serve_notice_list(service, req, call) -> NoticeListResult:
    state = service.ledger(call=call)
    return NoticeListResult(tuple(sorted(state.notices, key=lambda n: n.at, reverse=True)), call.now)
