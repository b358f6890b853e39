"""The Service: what every front end runs the operation table's rows on.

A ``Service`` is built from parts, not from modes: a ledger reader (the
committed file, read without the lock: world-readable on a shared server),
one gateway that runs operations (``LocalGateway``: a store transaction
here; ``BrokerGateway``: the broker does it with the caller's kernel
identity), the GPU telemetry, and the defaults of a call (the process's
identity, the clock, the zone).

Its face is three methods: ``call()`` (one context per command: who, now,
the zone, the policy, the GPUs, a warnings sink), ``run(name, request,
call=...)`` (one row of ``bk.service.OPERATIONS``) and ``write_batch``
(the broker's group commit).  The rest (``ledger``, ``settings``,
``telemetry``, ``reader``) is what the rows themselves read with; a front
end asks a row instead.  The shared service of the broker keeps no
per-request state.

Nothing here prints.  Rows return typed results or raise ``BkError``.
"""

from __future__ import annotations

import errno
import os

from bk import clock
from bk.core.errors import BkError, IOFailure, PermissionDenied
from bk.core.models import LedgerState
from bk.core.timegrid import counted
from bk.service.context import Actor, Call

TYPE_CHECKING = False
if TYPE_CHECKING:   # annotations only: collections.abc would import collections
    from collections.abc import Callable


def user_name(uid: int) -> str:
    """The account name, or the UID as text: an actor always has a name."""
    from bk import users

    return users.user_name(uid) or str(uid)


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
        # One user's share of the ledger, where writes run on a shared one
        # (``local``, the broker's); private mode has one user, and a client's
        # writes are checked by the broker.
        self.limits = None

    @property
    def now_fn(self) -> Callable[[], int]:
        """The clock this service's calls read: the ``BK_NOW`` of the
        environment it was opened with, or the system's."""
        return self._clock

    def zone(self):
        """The time zone of this service's calls (its environment's ``TZ``)."""
        return self._tz()

    @classmethod
    def local(cls, settings, telemetry, *, actor: Actor | None = None,
              clock_fn: Callable[[], int] = clock.now, owner_uid: int | None = None,
              policy=None, tz_fn: Callable[[], object] = clock.local_tz) -> Service:
        """Operations run here, on ``settings.data_dir``: private mode, and
        the broker's own service."""
        def gateway(svc):
            from bk.service.gateway import LocalGateway

            return LocalGateway(store, svc)

        policy = policy or policy_of(settings, telemetry)
        store = make_store(settings, clock_fn=clock_fn, owner_uid=owner_uid, capacity=policy.max_shared_users)
        svc = cls(settings=settings, policy=policy, reader=LedgerReader(store),
                  gateway_for=gateway, telemetry=telemetry,
                  actor=actor or process_actor(), clock_fn=clock_fn, tz_fn=tz_fn)
        if settings.mode == "shared":
            svc.limits = settings.ledger_limits()
        return svc

    @classmethod
    def remote(cls, settings, telemetry, *, actor: Actor | None = None,
               clock_fn: Callable[[], int] = clock.now, connect: Callable[[], object] | None = None,
               tz_fn: Callable[[], object] = clock.local_tz) -> Service:
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
                   actor=actor or process_actor(), clock_fn=clock_fn, tz_fn=tz_fn)

    # -- the call ----------------------------------------------------------

    def call(self, actor: Actor | None = None, *, telemetry=None, peer_pid: int | None = None,
             fresh: bool = False) -> Call:
        """A fresh context: this service's defaults, the clock read once.  A
        call for this process (no ``actor``) carries what the clock has to say
        about its zone (an unknown ``TZ``); a broker's call for a peer does
        not: the peer's zone is not the broker's.  ``fresh``: the GPUs are
        looked at again for this call (a long-lived front end: an MCP tool
        call), not the snapshot an earlier call of this process took."""
        if fresh and telemetry is None and hasattr(self.telemetry, "refresh"):
            self.telemetry.refresh()
        call = Call(actor or self.actor, self._clock(), self._tz(), self.policy,
                    telemetry if telemetry is not None else self.telemetry, peer_pid=peer_pid,
                    make_id=self.id_source, limits=self.limits)
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
            call.warn(f"this machine has {counted(call.policy.gpu_count, 'GPU')} but the ledger was made for "
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
                if op.who in ("admin", "host") and not call.actor.is_admin and (op.who == "admin" or self.shared):
                    raise PermissionDenied(f"only the administrator (root) may {op.summary}", hint=op.admin_hint)
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
