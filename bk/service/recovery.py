"""Commits the audit log witnesses but the ledger lacks (SPEC 5, issue 10).

When the ledger was read from an older backup, or is gone with every
backup, the store refuses to write (``LostCommits``): a commit on top would
forget the bookings of the missing commits for good.  Two rows of the
operation table end that state, on purpose:

* ``data_lost`` (read): what is missing, from the audit log: the commit
  numbers and each booking's last recorded action and owner;
* ``data_recover`` (write): accept exactly that loss (the request names the
  commits it accepts, so a loss that grew meanwhile is refused), optionally
  replaying the lost bookings from the audit records, which hold each
  booking's GPUs, mode, share, memory, start and end (not notes or op-ids).

Both are for whoever owns the data: you in private mode, root on a shared
server (the table's ``host``).
"""

from __future__ import annotations

from bk.core.errors import InvalidInput
from bk.core.models import (
    ADMIN_CANCEL,
    CANCEL,
    CREATE,
    EDIT,
    RECOVER,
    AuditEntry,
    LedgerState,
    Mutation,
    Reservation,
)
from bk.core.record import replace
from bk.core.utctime import parse_utc
from bk.service.context import Call
from bk.service.requests import RecoverRequest
from bk.service.results import LostBooking, LostResult


def lost_bookings(records: list[dict]) -> list[LostBooking]:
    last: dict[str, LostBooking] = {}
    for e in records:
        rid = e.get("reservation")
        if isinstance(rid, str) and e.get("action") in (CREATE, EDIT, CANCEL, ADMIN_CANCEL):
            owner = e.get("owner", e.get("uid"))
            last[rid] = LostBooking(rid, owner if isinstance(owner, int) else None,
                                    e.get("user") if e.get("uid") == owner else None, e["action"])
    return list(last.values())


def replay(state: LedgerState, records: list[dict]) -> list[str]:
    """Rebuild the lost bookings in ``state`` from the audit records, in
    commit order; returns the IDs replayed.  A change the records cannot
    carry (an edit of a booking the ledger never had) is skipped."""
    done: list[str] = []
    for e in sorted(records, key=lambda r: (r.get("seq", 0), r.get("index", 0))):
        rid, action, after = e.get("reservation"), e.get("action"), e.get("after")
        if not isinstance(rid, str):
            continue
        have = state.find(rid)
        when = parse_utc(e["time"]) if isinstance(e.get("time"), str) else None
        if action == CREATE and have is None and isinstance(after, dict) and when is not None:
            owner = e.get("owner", e.get("uid"))
            state.reservations.append(Reservation(
                id=rid, uid=owner, user=str(e.get("user") or owner), mode=after["mode"],
                gpus=tuple(after["gpus"]), share=after["share"], start=after["start"], end=after["end"],
                created=when, mem_mib=after.get("mem_mib"), op_id=e.get("op_id")))
            done.append(rid)
        elif action == EDIT and have is not None and isinstance(after, dict):
            changed = {k: (tuple(v) if k == "gpus" else v) for k, v in after.items()
                       if k in ("gpus", "mode", "share", "mem_mib", "start", "end")}
            state.reservations[state.reservations.index(have)] = replace(have, **changed)
            done.append(rid)
        elif action in (CANCEL, ADMIN_CANCEL) and have is not None and have.cancelled_at is None \
                and when is not None:
            state.reservations[state.reservations.index(have)] = replace(
                have, cancelled_at=when, cancelled_by=e.get("uid"), cancel_reason=e.get("reason"))
            done.append(rid)
    return list(dict.fromkeys(done))


def _serve_lost(service, req, call: Call) -> LostResult:
    lost = service.store.lost_commits()
    if lost is None:
        seq = service.store.read().state.seq
        return LostResult(seq, seq, (), "nothing_lost")
    seq, newest, records = lost
    return LostResult(seq, newest, tuple(lost_bookings(records)))


def apply_recover(state: LedgerState, req: RecoverRequest, call: Call, *, lost) -> Mutation:
    """Accept the witnessed loss (``lost``: the store's ``lost_commits()``,
    passed by the gateway to rows that accept a loss), replaying what the
    audit records can carry when asked."""
    if lost is None:
        raise InvalidInput("nothing is lost: the ledger has every commit the audit log records")
    seq, newest, records = lost
    if (seq, newest) != (req.ledger_seq, req.audit_seq):
        raise InvalidInput(f"the loss is now commits {seq + 1}-{newest}, not "
                           f"{req.ledger_seq + 1}-{req.audit_seq}: look again (bk admin data recover)")
    books = tuple(lost_bookings(records))
    done = tuple(replay(state, records)) if req.replay else ()
    result = LostResult(seq, newest, books, "dry_run" if req.dry_run else "recovered", done)
    if req.dry_run:
        return Mutation(False, [], result)
    entry = AuditEntry(RECOVER, "accepted_loss", before={"ledger_seq": seq, "audit_seq": newest},
                       after={"replayed": list(done),
                              "lost": [b.reservation for b in books if b.reservation not in done]})
    return Mutation(True, [entry], result)
