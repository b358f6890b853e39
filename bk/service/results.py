"""Typed results, each owning its JSON.

A result is made by an operation (``bk.service.ops``) and *rendered* once by
the service layer with the call's ``View`` (now, who asks, the policy,
memory totals): ``to_json()`` is then the JSON every front end shows, the
CLI's ``--json``, the broker's reply, MCP tool output.  Results that cross
the broker also carry the ledger records they were made from
(``to_wire``/``from_wire``), so a client has the same typed object, with
the broker's JSON, without recomputing anything under its own policy or
GPU snapshot.
"""

from __future__ import annotations

from bk.core.errors import Internal
from bk.core.models import Blackout, Notice, Reservation, iso
from bk.core.record import dataclass, field, replace
from bk.service.views import View, notice_json, obj, reservation_schema, typed  # noqa: F401  (View: results are rendered with it)


def _malformed(what: str, e: Exception) -> Internal:
    return Internal(f"the broker's reply holds a malformed {what}: {e}",
                    hint="client and broker may be different bk versions")


def _record(data: dict, key: str = "record") -> dict:
    rec = data.get(key) if isinstance(data, dict) else None
    if not isinstance(rec, dict):
        raise Internal("the broker's reply has no record", hint="client and broker may be different bk versions")
    return rec


def _reservation(data: dict, key: str = "record") -> Reservation:
    try:
        return Reservation.from_dict(_record(data, key))
    except (KeyError, TypeError, ValueError) as e:
        raise _malformed("reservation", e) from None


class _Rendered:
    """``to_json`` of a rendered result; a result that was never rendered is
    a bug in the service layer, said loudly."""

    json: dict | None

    def to_json(self) -> dict:
        if self.json is None:
            raise Internal(f"{type(self).__name__} was returned without being rendered")
        return self.json


@dataclass(frozen=True)
class BookResult(_Rendered):
    status: str                        # created | queued | exists | dry_run
    reservation: Reservation
    placement: dict | None = None      # {"gpus": {index: reason}, "queued": bool, ...}
    dry_run: bool = False
    json: dict | None = field(default=None, compare=False)
    # How many of the booker's recent bookings have this one's shape, counted
    # in the transaction (the preset suggestion needs no second ledger read);
    # None from a broker that does not count them.  Not part of the JSON.
    same_shape: int | None = field(default=None, compare=False)

    def rendered(self, view: View) -> BookResult:
        return replace(self, json={"status": self.status, "reservation": view.reservation(self.reservation),
                                   "placement": self.placement, "dry_run": self.dry_run})

    def to_wire(self) -> dict:
        return {**self.to_json(), "record": self.reservation.to_dict(), "same_shape": self.same_shape}

    @staticmethod
    def json_schema() -> dict:
        return obj({"status": {"enum": ["created", "queued", "exists", "dry_run"]},
                    "reservation": reservation_schema(),
                    "placement": typed("object", null=True, description="GPU -> why it was or was not chosen"),
                    "dry_run": typed("boolean")})

    @classmethod
    def from_wire(cls, data: dict) -> BookResult:
        res = _reservation(data)
        same = data.get("same_shape")
        return cls(str(data.get("status", "created")), res, data.get("placement"),
                   bool(data.get("dry_run")), {k: v for k, v in data.items() if k not in ("record", "same_shape")},
                   same_shape=same if type(same) is int else None)


@dataclass(frozen=True)
class EditResult(_Rendered):
    status: str                        # updated | unchanged | exists
    reservation: Reservation
    before: Reservation
    placement: dict | None = None
    dry_run: bool = False
    json: dict | None = field(default=None, compare=False)

    def rendered(self, view: View) -> EditResult:
        return replace(self, json={"status": self.status, "reservation": view.reservation(self.reservation),
                                   "before": view.reservation(self.before),
                                   "placement": self.placement, "dry_run": self.dry_run})

    def to_wire(self) -> dict:
        return {**self.to_json(), "record": self.reservation.to_dict(),
                "before_record": self.before.to_dict()}

    @staticmethod
    def json_schema() -> dict:
        return obj({"status": {"enum": ["updated", "unchanged", "exists"]}, "reservation": reservation_schema(),
                    "before": reservation_schema(), "placement": typed("object", null=True),
                    "dry_run": typed("boolean")})

    @classmethod
    def from_wire(cls, data: dict) -> EditResult:
        res, before = _reservation(data), _reservation(data, "before_record")
        return cls(str(data.get("status", "updated")), res, before, data.get("placement"),
                   bool(data.get("dry_run")),
                   {k: v for k, v in data.items() if k not in ("record", "before_record")})


@dataclass(frozen=True)
class CancelResult(_Rendered):
    status: str                        # cancelled | exists
    reservation: Reservation
    dry_run: bool = False
    json: dict | None = field(default=None, compare=False)

    def rendered(self, view: View) -> CancelResult:
        return replace(self, json={"status": self.status, "reservation": view.reservation(self.reservation),
                                   "dry_run": self.dry_run})

    def to_wire(self) -> dict:
        return {**self.to_json(), "record": self.reservation.to_dict()}

    @staticmethod
    def json_schema() -> dict:
        return obj({"status": {"enum": ["cancelled", "exists"]}, "reservation": reservation_schema(),
                    "dry_run": typed("boolean")})

    @classmethod
    def from_wire(cls, data: dict) -> CancelResult:
        res = _reservation(data)
        return cls(str(data.get("status", "cancelled")), res, bool(data.get("dry_run")),
                   {k: v for k, v in data.items() if k != "record"})


@dataclass(frozen=True)
class NoticeResult(_Rendered):
    status: str                        # published | archived | unchanged | dry_run
    notice: Notice
    dry_run: bool = False
    json: dict | None = field(default=None, compare=False)

    def rendered(self, view: View) -> NoticeResult:
        return replace(self, json={"status": self.status, "notice": notice_json(self.notice),
                                   "dry_run": self.dry_run})

    def to_wire(self) -> dict:
        return {**self.to_json(), "record": self.notice.to_dict()}

    @classmethod
    def from_wire(cls, data: dict) -> NoticeResult:
        try:
            notice = Notice.from_dict(_record(data))
        except (KeyError, TypeError, ValueError) as e:
            raise _malformed("notice", e) from None
        return cls(str(data.get("status", "published")), notice, bool(data.get("dry_run")),
                   {k: v for k, v in data.items() if k != "record"})


@dataclass(frozen=True)
class AuditResult(_Rendered):
    """Audit entries (oldest first); ``problems``: malformed lines met on the
    way; ``complete``: False when the scan stopped before ``limit``."""

    entries: tuple = ()
    problems: tuple = ()
    complete: bool = True
    json: dict | None = field(default=None, compare=False)

    def rendered(self, view: View) -> AuditResult:
        return replace(self, json={"entries": list(self.entries), "problems": list(self.problems),
                                   "complete": self.complete})

    def to_wire(self) -> dict:
        return self.to_json()

    @classmethod
    def from_wire(cls, data: dict) -> AuditResult:
        try:
            entries, problems = list(data["entries"]), list(data.get("problems", []))
            if not all(isinstance(e, dict) for e in entries):
                raise TypeError("an entry is not an object")
            return cls(tuple(entries), tuple(str(p) for p in problems), bool(data.get("complete", True)),
                       dict(data))
        except (KeyError, TypeError) as e:
            raise _malformed("audit entries", e) from None


@dataclass(frozen=True)
class ProbeResult(_Rendered):
    checks: tuple = ()                 # (name, ok, detail)
    json: dict | None = field(default=None, compare=False)

    def rendered(self, view: View) -> ProbeResult:
        return replace(self, json={"checks": [{"name": n, "ok": ok, "detail": d} for n, ok, d in self.checks]})

    def to_wire(self) -> dict:
        return self.to_json()

    @classmethod
    def from_wire(cls, data: dict) -> ProbeResult:
        try:
            checks = tuple((str(c["name"]), bool(c["ok"]), str(c["detail"])) for c in data["checks"])
        except (KeyError, TypeError) as e:
            raise _malformed("probe results", e) from None
        return cls(checks, dict(data))


@dataclass(frozen=True)
class PingResult(_Rendered):
    """What the broker knows about itself and about the caller."""

    broker: dict = field(default_factory=dict)
    peer: dict = field(default_factory=dict)
    json: dict | None = field(default=None, compare=False)

    def rendered(self, view: View) -> PingResult:
        return replace(self, json={"broker": dict(self.broker), "peer": dict(self.peer)})

    def to_wire(self) -> dict:
        return self.to_json()

    @classmethod
    def from_wire(cls, data: dict) -> PingResult:
        if not isinstance(data.get("broker"), dict) or not isinstance(data.get("peer"), dict):
            raise _malformed("ping reply", ValueError("no broker or peer"))
        return cls(dict(data["broker"]), dict(data["peer"]), dict(data))


@dataclass(frozen=True)
class LostBooking:
    reservation: str
    owner: int | None
    user: str | None
    action: str                # the last recorded change: create, edit, cancel, admin_cancel

    def to_json(self) -> dict:
        return {"reservation": self.reservation, "owner": self.owner, "user": self.user,
                "last_action": self.action}


@dataclass(frozen=True)
class LostResult:
    ledger_seq: int
    audit_seq: int
    bookings: tuple = ()
    status: str = "lost"       # lost | nothing_lost | recovered | dry_run
    replayed: tuple = ()
    json: dict | None = field(default=None, compare=False)

    def rendered(self, view) -> LostResult:
        return replace(self, json={
            "status": self.status, "ledger_seq": self.ledger_seq, "audit_seq": self.audit_seq,
            "lost_commits": list(range(self.ledger_seq + 1, self.audit_seq + 1)),
            "bookings": [b.to_json() for b in self.bookings], "replayed": list(self.replayed)})

    def to_json(self) -> dict:
        return self.json

    def to_wire(self) -> dict:
        return self.to_json()

    @classmethod
    def from_wire(cls, data: dict) -> LostResult:
        try:
            books = tuple(LostBooking(str(b["reservation"]), b.get("owner"), b.get("user"), str(b["last_action"]))
                          for b in data["bookings"])
            return cls(int(data["ledger_seq"]), int(data["audit_seq"]), books, str(data["status"]),
                       tuple(str(r) for r in data.get("replayed", ())), dict(data))
        except (KeyError, TypeError, ValueError) as e:
            raise _malformed("recovery report", e) from None


@dataclass(frozen=True)
class MaintainResult:
    status: str                        # created | dry_run | ended | unchanged
    blackout: Blackout | None
    notice: Notice | None
    overlapping: tuple = ()            # Reservations in the window (as they were)
    cancelled: tuple = ()              # their IDs, cancelled by this window
    dry_run: bool = False
    json: dict | None = field(default=None, compare=False)

    def rendered(self, view: View) -> MaintainResult:
        return replace(self, json={
            "status": self.status, "dry_run": self.dry_run,
            "blackout": None if self.blackout is None else blackout_json(self.blackout),
            "notice": None if self.notice is None else notice_json(self.notice),
            "overlapping": [view.reservation(r) for r in self.overlapping],
            "cancelled": list(self.cancelled)})

    def to_json(self) -> dict:
        return self.json

    def to_wire(self) -> dict:
        return {**self.json, "records": {
            "blackout": None if self.blackout is None else self.blackout.to_dict(),
            "notice": None if self.notice is None else self.notice.to_dict(),
            "overlapping": [r.to_dict() for r in self.overlapping]}}

    @classmethod
    def from_wire(cls, data: dict) -> MaintainResult:
        try:
            rec = data["records"]
            b = Blackout.from_dict(rec["blackout"]) if rec.get("blackout") else None
            n = Notice.from_dict(rec["notice"]) if rec.get("notice") else None
            over = tuple(Reservation.from_dict(r) for r in rec.get("overlapping", ()))
            return cls(str(data["status"]), b, n, over, tuple(data.get("cancelled", ())),
                       bool(data.get("dry_run")), {k: v for k, v in data.items() if k != "records"})
        except (KeyError, TypeError, ValueError) as e:
            raise Internal(f"the broker's reply holds a malformed maintenance window: {e}",
                           hint="client and broker may be different bk versions") from None


@dataclass(frozen=True)
class NoticeEditResult:
    status: str                        # edited | unchanged | dry_run
    notice: Notice
    before: Notice
    dry_run: bool = False
    json: dict | None = field(default=None, compare=False)

    def rendered(self, view: View) -> NoticeEditResult:
        return replace(self, json={"status": self.status, "notice": notice_json(self.notice),
                                   "before": notice_json(self.before), "dry_run": self.dry_run})

    def to_json(self) -> dict:
        return self.json

    def to_wire(self) -> dict:
        return {**self.json, "records": {"notice": self.notice.to_dict(), "before": self.before.to_dict()}}

    @classmethod
    def from_wire(cls, data: dict) -> NoticeEditResult:
        try:
            rec = data["records"]
            return cls(str(data["status"]), Notice.from_dict(rec["notice"]), Notice.from_dict(rec["before"]),
                       bool(data.get("dry_run")), {k: v for k, v in data.items() if k != "records"})
        except (KeyError, TypeError, ValueError) as e:
            raise Internal(f"the broker's reply holds a malformed notice: {e}",
                           hint="client and broker may be different bk versions") from None


def blackout_json(b: Blackout) -> dict:
    return {"id": b.id, "short_id": b.id[:8], "start": iso(b.start), "end": iso(b.end), "reason": b.reason,
            "created_by": b.created_by, "notice": b.extra.get("notice")}


@dataclass(frozen=True)
class PolicyBindResult:
    status: str                  # bound | unchanged | dry_run
    before: dict | None
    after: dict
    forced: tuple = ()           # reservation IDs kept against the new rules
    json: dict | None = field(default=None, compare=False)

    def rendered(self, view: View) -> PolicyBindResult:
        return replace(self, json={"status": self.status, "before": self.before, "after": self.after,
                                   "forced": list(self.forced)})

    def to_json(self) -> dict:
        return self.json

    def to_wire(self) -> dict:
        return self.json

    @classmethod
    def from_wire(cls, data: dict) -> PolicyBindResult:
        try:
            return cls(str(data["status"]), data.get("before"), dict(data["after"]),
                       tuple(data.get("forced", ())), dict(data))
        except (KeyError, TypeError, ValueError) as e:
            raise Internal(f"the broker's reply holds a malformed policy binding: {e}") from None


@dataclass(frozen=True)
class CleanupResult(_Rendered):
    status: str                          # cancelled | nothing | dry_run
    cancelled: tuple = ()                # Reservations, as cancelled
    dry_run: bool = False
    json: dict | None = field(default=None, compare=False)

    def rendered(self, view) -> CleanupResult:
        return replace(self, json={"status": self.status, "dry_run": self.dry_run,
                                   "reservations": [view.reservation(r) for r in self.cancelled],
                                   "count": len(self.cancelled)})

    def to_wire(self) -> dict:
        return {**self.to_json(), "records": [r.to_dict() for r in self.cancelled]}

    @staticmethod
    def json_schema() -> dict:
        return obj({"status": {"enum": ["cancelled", "nothing", "dry_run"]}, "dry_run": typed("boolean"),
                    "reservations": {"type": "array", "items": reservation_schema()},
                    "count": typed("integer")})

    @classmethod
    def from_wire(cls, data: dict) -> CleanupResult:
        try:
            recs = tuple(Reservation.from_dict(r) for r in data["records"])
            return cls(str(data["status"]), recs, bool(data.get("dry_run")),
                       {k: v for k, v in data.items() if k != "records"})
        except (KeyError, TypeError, ValueError) as e:
            raise _malformed("cleanup result", e) from None
