"""One booking's lifecycle (``bk history ID``): the record, and what the
audit log says happened to it, or, when the log no longer holds it
(rotated, or another host's copy), what the record itself remembers."""

from __future__ import annotations

from bk.core.errors import NotFound
from bk.core.models import Reservation, iso
from bk.core.record import dataclass


@dataclass(frozen=True)
class HistoryRequest:
    ref: str                           # a list number, an ID prefix, or a full ID (anyone's)


@dataclass(frozen=True)
class HistoryResult:
    reservation: Reservation
    events: tuple                      # audit entries (dicts), oldest first
    source: str                        # audit | record
    view: object                       # bk.service.views.View

    def to_json(self) -> dict:
        return {"reservation": self.view.reservation(self.reservation), "events": list(self.events),
                "source": self.source}


def events_from_record(r: Reservation) -> list[dict]:
    """The lifecycle from the reservation itself, for when the audit log no
    longer holds it (rotated, or another host's copy)."""
    first = r.edits[0].before if r.edits else {}
    created = {"gpus": first.get("gpus", list(r.gpus)), "mode": first.get("mode", r.mode),
               "start": first.get("start", r.start), "end": first.get("end", r.end)}
    out = [{"time": iso(r.created), "action": "create", "uid": r.uid, "user": r.user,
            "before": None, "after": created, "result": "created", "op_id": r.op_id}]
    for ed in r.edits:
        out.append({"time": iso(ed.at), "action": "edit", "uid": ed.actor_uid, "user": ed.actor,
                    "before": ed.before, "after": ed.after, "result": "updated"})
    if r.cancelled_at is not None:
        out.append({"time": iso(r.cancelled_at), "action": "cancel" if r.cancelled_by == r.uid
                    else "admin_cancel", "uid": r.cancelled_by, "user": None, "before": None,
                    "after": None, "result": "cancelled", "reason": r.cancel_reason})
    return out


def _serve_history(service, req: HistoryRequest, call) -> HistoryResult:
    from bk.service.booking import resolve
    from bk.service.requests import AuditRequest
    from bk.service.views import View

    try:
        res = resolve(service.ledger(call=call), req.ref, call, any_owner=True)
    except NotFound:
        res = next((r for r in service.reader.archived() if r.id.startswith(req.ref.lower())), None)
        if res is None:
            raise
    entries = list(service.run("audit", AuditRequest(reservation=res.id), call=call).entries)
    events = entries or events_from_record(res)
    return HistoryResult(res, tuple(events), "audit" if entries else "record", View.of(call))
