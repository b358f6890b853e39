"""The application API every front end calls.

A ``Service`` is built from parts, not from modes: a ledger reader (the
committed file, read without the lock: world-readable on a shared server),
one gateway that runs operations (``LocalGateway``: a store transaction
here; ``BrokerGateway``: the broker does it with the caller's kernel
identity), the GPU telemetry, and the defaults of a call (the process's
identity, the clock, the zone).  Every method takes the call's context
(``call=``, from ``Service.call()``) so that one command sees one instant,
and the shared service of the broker keeps no per-request state.

Nothing here prints.  Methods return typed results or raise ``BkError``.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from bk import clock
from bk.core.errors import Ambiguous, BkError, InvalidInput, IOFailure, NotFound, PermissionDenied
from bk.core.models import ACTIVE, CANCELLED, ENDED, UPCOMING, LedgerState, Notice, Reservation
from bk.service.context import Actor, Call

# The request types are for writes and the broker's reads: bk l, st and n
# never load bk.service.requests (~0.5 ms).  The names below are for the
# annotations only (a constant False: importing typing costs more).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from bk.service.requests import (
        BookRequest,
        CancelRequest,
        EditRequest,
        NoticeArchiveRequest,
        NoticeRequest,
    )

_HEX = set("0123456789abcdef-")


def user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def process_actor() -> Actor:
    uid = os.getuid()
    return Actor(uid, user_name(uid))


class LedgerReader:
    """The committed ledger and the archive, read without the lock.  On a
    shared server with access limited to a group the data directory is 0750:
    a non-member cannot read it, which is a permission, not a broken disk."""

    def __init__(self, store, *, shared: bool = False, group: str | None = None):
        self.store = store
        self._shared, self._group = shared, group

    def read(self, keep=None):
        try:
            return self.store.read(keep=keep) if keep is not None else self.store.read()
        except IOFailure as e:
            if self._shared and e.details.get("errno") in (errno.EACCES, errno.EPERM):
                from bk.ipc.client import group_hint

                raise PermissionDenied(f"you may not read the bookings in {self.store.paths.data_dir}",
                                       hint=group_hint(self._group)) from None
            raise

    def archived(self, uid: int | None = None):
        return self.store.archived(uid=uid)


def policy_of(settings, telemetry):
    """The scheduling policy; the GPU count asks the inventory only when the
    configuration does not fix it (a cached inventory costs no backend call)."""
    count = settings["gpu_count"]
    return settings.policy(count if count else telemetry.inventory().count)


def make_store(settings, *, clock_fn: Callable[[], int], owner_uid: int | None, capacity: int):
    from bk.store.ledger import Store

    return Store(settings.data_dir, private=settings.mode == "private",
                 lock_timeout=settings["lock_timeout_seconds"], backup_keep=settings["backup_keep"],
                 retention_days=settings["ledger_retention_days"],
                 archive_after_hours=settings["archive_after_hours"],
                 audit_retention_days=settings["audit_retention_days"],
                 owner_uid=owner_uid if owner_uid is not None else settings["service_uid"],
                 clock=clock_fn, capacity=capacity)


class Service:
    def __init__(self, *, settings, policy, reader: LedgerReader, gateway_for: Callable[[Service], object],
                 telemetry, actor: Actor, clock_fn: Callable[[], int] = clock.now,
                 tz_fn: Callable[[], object] = clock.local_tz):
        self.settings = settings
        self.policy = policy
        self.reader = reader
        self.telemetry = telemetry
        self.actor = actor
        self._clock = clock_fn
        self._tz = tz_fn
        self._gateway_for = gateway_for
        self._gateway = None
        self.id_source: Callable[[], str] | None = None    # tests: deterministic IDs

    @classmethod
    def local(cls, settings, telemetry, *, actor: Actor | None = None,
              clock_fn: Callable[[], int] = clock.now, owner_uid: int | None = None,
              policy=None) -> Service:
        """Operations run here, on ``settings.data_dir``: private mode, and
        the broker's own service."""
        def gateway(svc):
            from bk.service.gateway import LocalGateway

            return LocalGateway(store, svc)

        policy = policy or policy_of(settings, telemetry)
        store = make_store(settings, clock_fn=clock_fn, owner_uid=owner_uid, capacity=policy.max_shared_users)
        return cls(settings=settings, policy=policy, reader=LedgerReader(store),
                   gateway_for=gateway, telemetry=telemetry,
                   actor=actor or process_actor(), clock_fn=clock_fn)

    @classmethod
    def remote(cls, settings, telemetry, *, actor: Actor | None = None,
               clock_fn: Callable[[], int] = clock.now, connect: Callable[[], object] | None = None) -> Service:
        """A client of a shared server: reads from the committed file,
        operations through the broker."""
        def gateway(svc):
            from bk.service.gateway import BrokerGateway

            return BrokerGateway(connect or default_connect)

        def default_connect():
            from bk.ipc.client import BrokerClient

            return BrokerClient(settings["socket"], service_uid=settings["service_uid"], group=settings["group"])

        policy = policy_of(settings, telemetry)
        store = make_store(settings, clock_fn=clock_fn, owner_uid=None, capacity=policy.max_shared_users)
        return cls(settings=settings, policy=policy,
                   reader=LedgerReader(store, shared=True, group=settings["group"]),
                   gateway_for=gateway, telemetry=telemetry,
                   actor=actor or process_actor(), clock_fn=clock_fn)

    # -- the call ----------------------------------------------------------

    def call(self, actor: Actor | None = None, *, telemetry=None, peer_pid: int | None = None) -> Call:
        """A fresh context: this service's defaults, the clock read once.  A
        call for this process (no ``actor``) carries what the clock has to say
        about its zone (an unknown ``TZ``); a broker's call for a peer does
        not: the peer's zone is not the broker's."""
        call = Call(actor or self.actor, self._clock(), self._tz(), self.policy,
                    telemetry if telemetry is not None else self.telemetry, peer_pid=peer_pid,
                    make_id=self.id_source)
        if actor is None:
            call.warn(*clock.zone_warnings(call.tz))
        return call

    def _call(self, call: Call | None) -> Call:
        return call if call is not None else self.call()

    @property
    def gateway(self):
        """Where operations run; made on the first operation (reads never need it)."""
        if self._gateway is None:
            self._gateway = self._gateway_for(self)
        return self._gateway

    @gateway.setter
    def gateway(self, value) -> None:
        self._gateway = value

    @property
    def shared(self) -> bool:
        return self.settings.mode == "shared"

    @property
    def store(self):
        return self.reader.store

    def ledger(self, *, call: Call | None = None, keep=None) -> LedgerState:
        """The committed ledger.  ``keep`` (``bk.core.ledgerdoc.DocKeep``):
        the reservations the caller will look at; the state may then hold
        only those (a view's read, never one to decide a write on)."""
        call = self._call(call)
        read = self.reader.read(keep) if keep is not None else self.reader.read()
        call.warn(*read.warnings)
        bound = (read.state.policy or {}).get("gpu_count")
        if isinstance(bound, int) and bound != call.policy.gpu_count:
            # Writes refuse this (policy binding); reads go on, but say why
            # the picture may not match the machine.
            call.warn(f"this machine has {call.policy.gpu_count} GPUs but the ledger was made for "
                      f"{bound}: writes are refused until they agree (bk doctor says more)")
        return read.state

    # -- operations (bk.service.ops) ----------------------------------------

    def run(self, name: str, req, *, call: Call | None = None):
        """Run row ``name`` of the operation table (``bk.service``) with
        ``req`` for this call: a local row (``served=False``) here, in this
        process; any other through the gateway (this host's store, or the
        broker).  A refusal comes back worded by the row's ``explain``."""
        from bk.service import get

        op = get(name)
        call = self._call(call)
        try:
            if not op.served:
                op.check_type(req)
                if op.check is not None:
                    op.check(req)
                return op.serve(self, req, call)
            return self.gateway.run(op, req, call)
        except BkError as e:
            if op.explain is None:
                raise
            raise op.explain(e, req, call) from None

    def write_batch(self, items: list) -> list:
        """``[(op name, request, call)]`` in one transaction (the broker's
        group commit); one rendered result or BkError per item."""
        from bk.service import get

        return self.gateway.write_batch([(get(name), req, call) for name, req, call in items])

    def book(self, req: BookRequest, *, call: Call | None = None):
        return self.run("book", req, call=call)

    def edit(self, req: EditRequest, *, call: Call | None = None):
        return self.run("edit", req, call=call)

    def cancel(self, req: CancelRequest, *, call: Call | None = None):
        return self.run("cancel", req, call=call)

    def publish_notice(self, req: NoticeRequest, *, call: Call | None = None):
        return self.run("notice_publish", req, call=call)

    def archive_notice(self, req: NoticeArchiveRequest, *, call: Call | None = None):
        return self.run("notice_archive", req, call=call)

    def audit(self, limit: int = 50, all_users: bool = False, *, reservation: str | None = None,
              call: Call | None = None):
        """Audit entries, newest ``limit`` (oldest first): the caller's own
        (records they made, or about their bookings), everyone's for the
        administrator with ``all_users``, or one reservation's lifecycle.
        On a shared server the log is the service account's (it holds
        everyone's before/after details), so the broker reads it."""
        from bk.service.requests import AuditRequest

        return self.run("audit", AuditRequest(limit, all_users, reservation), call=call)

    def probe(self, *, call: Call | None = None):
        from bk.service.requests import Empty

        return self.run("probe", Empty(), call=call).checks

    def ping(self, *, call: Call | None = None) -> dict:
        from bk.service.requests import Empty

        return self.run("ping", Empty(), call=call).to_json()

    def lost_data(self, *, call: Call | None = None):
        """What the audit log records beyond the ledger (``data_lost``)."""
        from bk.service.requests import Empty

        return self.run("data_lost", Empty(), call=call)

    def recover_data(self, *, replay: bool = False, dry_run: bool = False, call: Call | None = None):
        """Accept the loss the audit log witnesses now (replaying the lost
        bookings first with ``replay``); a dry run only reports it."""
        from bk.service.requests import RecoverRequest

        call = self._call(call)
        lost = self.lost_data(call=call)
        if dry_run or lost.status == "nothing_lost":
            return lost
        return self.run("data_recover", RecoverRequest(lost.ledger_seq, lost.audit_seq, replay=replay),
                        call=call)

    # -- reads -------------------------------------------------------------

    def own_current(self, state: LedgerState | None = None, *, call: Call | None = None) -> list[Reservation]:
        """The caller's current and upcoming bookings in list order; list
        numbers (``bk d 1``) index this list in every command."""
        call = self._call(call)
        state = state or self.ledger(call=call)
        mine = [r for r in state.reservations if r.uid == call.actor.uid and r.is_live(call.now)]
        # Same start: the order they were booked in, so numbers match what the
        # user typed.  The sort is stable and the ledger keeps bookings in the
        # order they were made, so even the same second keeps that order.
        return sorted(mine, key=lambda r: (r.start, r.created))

    def numbers(self, state: LedgerState, *, call: Call) -> dict[str, int]:
        """List numbers of the caller's current bookings: the same in every command."""
        return {r.id: i for i, r in enumerate(self.own_current(state, call=call), 1)}

    def list(self, scope: str = "mine", *, limit: int | None = None, call: Call | None = None,
             state: LedgerState | None = None) -> list[Reservation]:
        call = self._call(call)
        state, now = state or self.ledger(call=call), call.now
        if scope == "mine":
            out = self.own_current(state, call=call)
        elif scope == "all":
            out = sorted((r for r in state.reservations if r.is_live(now)),
                         key=lambda r: (r.start, r.created))
        elif scope == "history":
            uid = call.actor.uid
            hot = [r for r in state.reservations if r.uid == uid and not r.is_live(now)]
            seen = {r.id for r in hot}
            cold = [r for r in self.reader.archived(uid=uid) if r.id not in seen]
            out = sorted(hot + cold, key=lambda r: (r.end, r.id), reverse=True)
        else:
            raise InvalidInput(f"unknown list scope {scope!r}")
        return out[:limit] if limit else out

    def resolve(self, ref: str, *, state: LedgerState | None = None, any_owner: bool = False,
                call: Call | None = None) -> Reservation:
        """A full reservation from a list number (1-3 digits), a unique ID
        prefix of at least 4 characters, or a full ID."""
        call = self._call(call)
        state = state or self.ledger(call=call)
        ref = ref.strip().lower()
        if ref.isdigit() and len(ref) <= 3:
            mine = self.own_current(state, call=call)
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
                            hint="type more characters of the ID",
                            details={"candidates": [r.id for r in hits]})
        return hits[0]

    def op_reservation(self, op_id: str | None, operation: str, *, state: LedgerState | None = None,
                       call: Call | None = None) -> Reservation | None:
        """The reservation that ``op_id`` already produced for the caller with
        ``operation`` (``edit``, ``cancel``, ``book``), as that operation
        found it; None when the op-id is new (``booking.op_target``).

        A front end asks this *before* it resolves a list number or an ID
        prefix, and takes that reservation when there is one: a retried
        ``bk d 1 --op-id K`` then names the booking the first run cancelled
        (numbers move once it is gone) and the operation answers ``exists``,
        here and through the broker alike.  The op records are in the
        committed ledger, which every user may read."""
        if not op_id:
            return None
        from bk.service import booking

        call = self._call(call)
        state = state or self.ledger(call=call)
        return booking.op_target(state, call.actor, op_id, booking.OP_ACTIONS[operation])

    def history(self, ref: str, *, call: Call | None = None) -> tuple[Reservation, list[dict]]:
        """One booking's lifecycle: the record and its audit entries."""
        call = self._call(call)
        try:
            res = self.resolve(ref, any_owner=True, call=call)
        except NotFound:
            res = next((r for r in self.reader.archived() if r.id.startswith(ref.lower())), None)
            if res is None:
                raise
        return res, list(self.audit(reservation=res.id, call=call).entries)

    def notices(self, include_archived: bool = False, state: LedgerState | None = None, *,
                call: Call | None = None) -> list[Notice]:
        call = self._call(call)
        if state is None:
            from bk.core.ledgerdoc import DocKeep

            # Notices are their own list in the document (an administrator's
            # cancellation of your booking is a notice to you, not a field of
            # the booking), so no reservation needs building (a sealed ledger).
            state = self.ledger(call=call, keep=DocKeep())
        now, actor = call.now, call.actor
        out = []
        for n in state.notices:
            if (n.archived or n.at > now) and not include_archived:
                continue       # archived, or published to start later
            current = n.until is None or n.until > now or include_archived
            # The administrator's --all view includes notices to other users,
            # so that one can be found (and archived) by its ID.
            mine = n.uid in (None, actor.uid) or (include_archived and actor.is_admin)
            if current and mine:
                out.append(n)
        return sorted(out, key=lambda n: n.at, reverse=True)

    def recommend(self, req: BookRequest, alternatives: int = 3, state: LedgerState | None = None, *,
                  call: Call | None = None):
        """Options for ``req`` without booking: a ``Recommendation``."""
        from bk.core import scheduler, telemetry
        from bk.service import booking
        from bk.service.advice import Recommendation
        from bk.service.requests import check_request

        call = self._call(call)
        check_request(req)
        if state is None:
            state = self.ledger(call=call, keep=live_keep(call))
        snap = call.telemetry.snapshot()
        found = scheduler.recommend(booking._sched_request(req), reservations=state.reservations,
                                    blackouts=state.blackouts, policy=call.policy, gpus=list(snap.gpus),
                                    now=call.now, alternatives=alternatives, tz=call.tz,
                                    load=telemetry.placement_load(snap, state.reservations, call.now,
                                                                  uid=call.actor.uid))
        return Recommendation(req, tuple(found), call.now, call.policy.slot_minutes)


def live_keep(call: Call):
    """What a placement reads: the caller's bookings (their list numbers,
    their own limits) and every booking that still holds capacity at
    ``call.now``.  The scheduler (``capacity.index_holds``) and attribution
    (``telemetry.active_gpus_by_uid``) skip cancelled and ended ones, so on
    a sealed ledger the rest need not be built (tests/test_reads.py)."""
    from bk.core.ledgerdoc import DocKeep

    return DocKeep(uid=call.actor.uid, lo=call.now)


def status_word(r: Reservation, now: int) -> str:
    return {UPCOMING: "upcoming", ACTIVE: "active", ENDED: "ended", CANCELLED: "cancelled"}[r.status(now)]
