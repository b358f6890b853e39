"""The service of a bk client on a shared server.

Reads need no broker: the committed ledger is world-readable (0644, written
by atomic replace, so a reader sees the old or the new file, never a half
one), and every read method of ``Service`` works on it unchanged.  Writes go
to the broker, which runs the same ``Service`` with the caller's identity
from the kernel; the reply carries the result in its ledger form, and this
module rebuilds the very result objects a local call returns, so every
front end renders a remote booking exactly like a private one.

The ``actor`` argument of the write methods is ignored here: who is asking
is decided by the broker from SO_PEERCRED, whatever this process claims.
"""

from __future__ import annotations

import errno

from bk.core import record
from bk.core.errors import Internal, IOFailure, PermissionDenied
from bk.core.models import Notice, Reservation
from bk.service.app import Service
from bk.service.requests import (
    Actor,
    BookRequest,
    BookResult,
    CancelRequest,
    CancelResult,
    EditRequest,
)


def to_wire(req) -> dict:
    """A request's fields for a frame: only those that differ from the
    default (the broker fills in the rest), tuples as lists."""
    out = {}
    for f in record.fields(req):
        value = getattr(req, f.name)
        if value == f.default:
            continue
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def _record(data: dict, key: str = "record") -> dict:
    rec = data.get(key)
    if not isinstance(rec, dict):
        raise Internal("the broker's reply has no record", hint="client and broker may be different bk versions")
    return rec


def book_result(data: dict, warnings: list[str]) -> BookResult:
    try:
        res = Reservation.from_dict(_record(data))
    except (KeyError, TypeError, ValueError) as e:
        raise Internal(f"the broker's reply holds a malformed reservation: {e}") from None
    return BookResult(status=data.get("status", "created"), reservation=res,
                      placement=data.get("placement"), warnings=list(warnings),
                      dry_run=bool(data.get("dry_run")))


def cancel_result(data: dict) -> CancelResult:
    try:
        res = Reservation.from_dict(_record(data))
    except (KeyError, TypeError, ValueError) as e:
        raise Internal(f"the broker's reply holds a malformed reservation: {e}") from None
    return CancelResult(status=data.get("status", "cancelled"), reservation=res,
                        dry_run=bool(data.get("dry_run")))


class RemoteService(Service):
    """``Service`` whose writes travel through the broker."""

    def __init__(self, settings, backend, *, client=None, **kwargs):
        super().__init__(settings, backend, **kwargs)
        self._client = client

    @property
    def client(self):
        # Imported on the first write: reads (bk l, bk st) never load the socket code.
        if self._client is None:
            from bk.broker.client import BrokerClient

            self._client = BrokerClient(self.settings["socket"], service_uid=self.settings["service_uid"],
                                        group=self.settings["group"])
        return self._client

    def _call(self, op: str, fields: dict) -> tuple[dict, list[str]]:
        return self.client.call(op, fields)

    def ledger(self):
        try:
            return super().ledger()
        except IOFailure as e:
            # With access limited to a group, the data directory is 0750: a
            # non-member cannot read the ledger.  That is a permission, not
            # a broken disk.
            if e.details.get("errno") in (errno.EACCES, errno.EPERM):
                from bk.broker.client import group_hint

                raise PermissionDenied(f"you may not read the bookings in {self.settings.data_dir}",
                                       hint=group_hint(self.settings["group"])) from None
            raise

    def _transact(self, apply, actor):
        # Every write of a shared server is the broker's.  A write method of
        # Service that has no broker operation yet must fail loudly here, not
        # try the ledger (which would refuse this account anyway).
        raise Internal("this change has no broker operation yet, so it cannot be made on a shared server",
                       hint="run it on a private ledger, or ask for it to be added to bk.broker.handlers")

    def book(self, req: BookRequest, actor: Actor | None = None) -> BookResult:
        data, warnings = self._call("book", to_wire(req))
        return book_result(data, warnings)

    def edit(self, req: EditRequest, actor: Actor | None = None) -> BookResult:
        data, warnings = self._call("edit", to_wire(req))
        return book_result(data, warnings)

    def cancel(self, req: CancelRequest, actor: Actor | None = None) -> CancelResult:
        data, warnings = self._call("cancel", to_wire(req))
        self.warnings.extend(w for w in warnings if w not in self.warnings)
        return cancel_result(data)

    def publish_notice(self, text: str, level: str = "info", until: int | None = None,
                       actor: Actor | None = None, dry_run: bool = False) -> Notice:
        data, warnings = self._call("notice_publish", {"text": text, "level": level, "until": until,
                                                       "dry_run": dry_run})
        self.warnings.extend(w for w in warnings if w not in self.warnings)
        try:
            return Notice.from_dict(_record(data))
        except (KeyError, TypeError, ValueError) as e:
            raise Internal(f"the broker's reply holds a malformed notice: {e}") from None

    def audit(self, limit: int = 50, all_users: bool = False, *, reservation: str | None = None,
              actor: Actor | None = None):
        # The audit log is readable only by the service account (it holds
        # everyone's before/after details), so it is read by the broker,
        # which filters it by the caller's kernel UID.
        from bk.store.audit import AuditTail

        fields = {"limit": limit, "all": all_users}
        if reservation is not None:
            fields["reservation"] = reservation
        data, warnings = self._call("audit", fields)
        self.warnings.extend(w for w in warnings if w not in self.warnings)
        try:
            return AuditTail(list(data["entries"]), list(data.get("problems", [])),
                             bool(data.get("complete", True)))
        except (KeyError, TypeError) as e:
            raise Internal(f"the broker's reply holds malformed audit entries: {e}") from None

    def archive_notice(self, ref: str, actor: Actor | None = None, dry_run: bool = False) -> Notice:
        data, warnings = self._call("notice_archive", {"ref": ref, "dry_run": dry_run})
        self.warnings.extend(w for w in warnings if w not in self.warnings)
        try:
            return Notice.from_dict(_record(data))
        except (KeyError, TypeError, ValueError) as e:
            raise Internal(f"the broker's reply holds a malformed notice: {e}") from None

    def probe(self) -> list[tuple[str, bool, str]]:
        # Only the service account may write the data directory: the broker
        # runs the probe there and reports.
        data, _ = self._call("probe", {})
        try:
            return [(str(c["name"]), bool(c["ok"]), str(c["detail"])) for c in data["checks"]]
        except (KeyError, TypeError) as e:
            raise Internal(f"the broker's reply holds malformed probe results: {e}") from None

    def ping(self) -> dict:
        """What the broker knows about itself and about us (doctor's probe)."""
        data, _ = self._call("ping", {})
        return data
