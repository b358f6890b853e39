"""Announcements and notices: the administrator's writes, as ops rows.

Who may call them (root) is the operation table's ``who``, checked once by
the gateway before these run; here are the rules of the notices themselves.
"""

from __future__ import annotations

from bk.core.errors import Ambiguous, InvalidInput, NotFound
from bk.core.models import NOTICE_ARCHIVE, NOTICE_PUBLISH, AuditEntry, LedgerState, Mutation, Notice, iso
from bk.core.record import replace
from bk.service.context import Call
from bk.service.requests import NoticeArchiveRequest, NoticeRequest
from bk.service.results import NoticeResult


def apply_publish(state: LedgerState, req: NoticeRequest, call: Call) -> Mutation:
    text = req.text.strip()
    if not text:
        raise InvalidInput("the announcement text is empty")
    if req.level not in Notice.LEVELS:
        raise InvalidInput(f"level must be one of {', '.join(Notice.LEVELS)}")
    if req.until is not None and req.until <= call.now:
        raise InvalidInput("'until' is already past", hint="give a later time, or none")
    # ``at`` is when users start to see it: now, or the start asked for
    # (Service.notices hides one whose time has not come).
    start = call.now if req.start is None or req.start < call.now else req.start
    if req.until is not None and req.until <= start:
        raise InvalidInput("'until' is not after the start", hint="give a later --until")
    notice = Notice(id=call.new_id("notice"), at=start, text=text, level=req.level,
                    until=req.until, created_by=call.actor.uid)
    if req.dry_run:
        return Mutation(False, [], NoticeResult("dry_run", notice, dry_run=True))
    state.notices.append(notice)
    after = {"id": notice.id, "text": notice.text, "level": notice.level}
    if start != call.now:
        after["start"] = iso(start)
    return Mutation(True, [AuditEntry(NOTICE_PUBLISH, "published", after=after)],
                    NoticeResult("published", notice))


def by_prefix(items, ref: str, what: str, plural: str, list_hint: str):
    """The one item whose ID starts with ``ref`` (4+ characters): notices and
    maintenance windows are found the same way."""
    key = ref.strip().lower()
    hits = [x for x in items if x.id.startswith(key)] if len(key) >= 4 else []
    if not hits:
        raise NotFound(f"no {what} with ID {ref}", hint=list_hint)
    if len(hits) > 1:
        raise Ambiguous(f"ID prefix {ref} matches {len(hits)} {plural}", hint="type more characters of the ID")
    return hits[0]


def find_notice(state: LedgerState, ref: str) -> Notice:
    return by_prefix(state.notices, ref, "notice", "notices", "list them with: bk n --all")


def apply_archive(state: LedgerState, req: NoticeArchiveRequest, call: Call) -> Mutation:
    """Withdraw an announcement (or a notice to one user): it stays in the
    ledger, marked archived, until retention drops it."""
    n = find_notice(state, req.ref)
    if req.dry_run:
        return Mutation(False, [], NoticeResult("dry_run", n, dry_run=True))
    if n.archived:
        return Mutation(False, [], NoticeResult("archived", n))
    # Who archived it and when stay with the notice (it is never deleted).
    done = replace(n, archived=True, extra={**n.extra, "archived_at": iso(call.now),
                                            "archived_by": call.actor.uid})
    state.notices[state.notices.index(n)] = done
    return Mutation(True, [AuditEntry(NOTICE_ARCHIVE, "archived", before={"id": n.id, "text": n.text})],
                    NoticeResult("archived", done))
