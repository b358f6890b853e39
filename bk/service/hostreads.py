"""The reads only the host may make: the audit trail, the probe, the ping.

On a shared server the audit log is the service account's (it holds
everyone's before/after details) and the probe tries the writes a commit
needs as that account, so these rows are served by the broker; in private
mode ``LocalGateway`` serves them here.
"""

from __future__ import annotations

from bk.service.results import AuditResult, PingResult, ProbeResult

# How much of the audit log (the live log and its sealed segments together)
# one ordinary user's request may read: about five thousand records, what a
# booking's history used to look through.  The administrator's reads are not bounded so.
USER_AUDIT_SCAN = 2 << 20


def _serve_audit(service, req, call) -> AuditResult:
    """Audit entries, newest ``limit`` (oldest first): the caller's own
    (records they made, or about their bookings), everyone's for the
    administrator with ``all``, or one reservation's lifecycle."""
    store = service.reader.store
    budget = None if call.actor.is_admin else USER_AUDIT_SCAN
    if req.reservation is not None:
        # Bookings are public on a shared server (the ledger is
        # world-readable), so a reservation's lifecycle is too.
        tail = store.audit_tail(limit=req.limit, reservation=req.reservation, budget=budget)
    else:
        uid = None if (req.all and call.actor.is_admin) else call.actor.uid
        tail = store.audit_tail(limit=req.limit, uid=uid, budget=budget)
    if budget is not None and not tail.complete and len(tail.entries) < req.limit:
        call.warn(f"only the newest {budget >> 20} MiB of the audit log were searched (the most one "
                  "user's request may read); older records are not shown")
    return AuditResult(tuple(tail.entries), tuple(tail.problems), tail.complete)


def _serve_probe(service, req, call) -> ProbeResult:
    """``bk doctor --probe``: try the writes a commit needs, for real."""
    from bk.store import health

    return ProbeResult(tuple(health.probe(service.reader.store)))


def _serve_ping(service, req, call) -> PingResult:
    import os

    from bk import __version__

    actor = call.actor
    return PingResult({"version": __version__, "pid": os.getpid(), "uid": os.geteuid()},
                      {"pid": call.peer_pid, "uid": actor.uid, "user": actor.user, "admin": actor.is_admin})
