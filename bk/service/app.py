"""The application API every front end calls.

``Service`` does the work against a local ``Store``: in private mode for the
user's own ledger, and inside the broker for the shared one (with the actor
taken from SO_PEERCRED).  Reads never take the lock; each write is one store
transaction whose rules live in ``bk.service.booking``.

Nothing here prints.  Methods return result objects or raise ``BkError``.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from bk import clock
from bk.core.errors import Ambiguous, BkError, InvalidInput, NotFound, PermissionDenied
from bk.core.models import ACTIVE, CANCELLED, ENDED, UPCOMING, LedgerState, Notice, Reservation
from bk.core.record import replace
from bk.service.requests import Actor, BookRequest, CancelRequest, EditRequest, check_request
from bk.store.config import Settings
from bk.store.ledger import Mutation, Store

_HEX = set("0123456789abcdef-")
# How many recent audit records one booking's history looks through.
AUDIT_SCAN_FOR_ONE = 5000


def _new_id() -> str:
    """A random (version 4) UUID.  Built from os.urandom directly: the uuid
    module imports platform and _uuid, a few milliseconds on every booking."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40      # version 4
    b[8] = (b[8] & 0x3F) | 0x80      # RFC 4122 variant
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def process_actor() -> Actor:
    uid = os.getuid()
    return Actor(uid, user_name(uid))


class Service:
    """Local service: reads and writes the ledger in ``settings.data_dir``."""

    def __init__(self, settings: Settings, backend, *, now: Callable[[], int] = clock.now,
                 actor: Actor | None = None, owner_uid: int | None = None):
        self.settings = settings
        self.backend = backend
        self.now = now
        self.actor = actor or process_actor()
        self.policy = settings.policy(backend.count())
        private = settings.mode == "private"
        self.store = Store(
            settings.data_dir, private=private,
            lock_timeout=settings["lock_timeout_seconds"], backup_keep=settings["backup_keep"],
            retention_days=settings["ledger_retention_days"],
            archive_after_hours=settings["archive_after_hours"],
            owner_uid=owner_uid if owner_uid is not None else settings["service_uid"],
            clock=now, capacity=self.policy.max_shared_users)
        self._gpus = None
        self.warnings: list[str] = []

    # -- snapshots ---------------------------------------------------------

    def gpus(self):
        """This command's one look at the GPUs (never one per row)."""
        if self._gpus is None:
            self._gpus = self.backend.devices()
        return self._gpus

    def refresh(self) -> None:
        """Forget the GPU snapshot; long-lived callers (the broker) take a new one."""
        self._gpus = None

    @staticmethod
    def load(gpus) -> dict[int, float]:
        """Each GPU's load for placement, 0..1.  Until the monitor keeps a
        recent average (a later release), the utilisation seen now."""
        return {g.index: g.util / 100 for g in gpus if g.util is not None}

    def ledger(self) -> LedgerState:
        read = self.store.read()
        for w in read.warnings:
            if w not in self.warnings:
                self.warnings.append(w)
        return read.state

    # -- reads -------------------------------------------------------------

    def own_current(self, state: LedgerState | None = None, actor: Actor | None = None,
                    now: int | None = None) -> list[Reservation]:
        """The user's current and upcoming bookings in list order; list
        numbers (``bk d 1``) index this list in every command."""
        state = state or self.ledger()
        actor = actor or self.actor
        now = self.now() if now is None else now
        mine = [r for r in state.reservations if r.uid == actor.uid and r.is_live(now)]
        # Same start: the order they were booked in, so numbers match what the
        # user typed.  The sort is stable and the ledger keeps bookings in the
        # order they were made, so even the same second keeps that order.
        return sorted(mine, key=lambda r: (r.start, r.created))

    def list(self, scope: str = "mine", *, limit: int | None = None) -> list[Reservation]:
        state, now = self.ledger(), self.now()
        if scope == "mine":
            out = self.own_current(state, now=now)
        elif scope == "all":
            out = sorted((r for r in state.reservations if r.is_live(now)),
                         key=lambda r: (r.start, r.created))
        elif scope == "history":
            hot = [r for r in state.reservations if r.uid == self.actor.uid and not r.is_live(now)]
            seen = {r.id for r in hot}
            cold = [r for r in self.store.archived(uid=self.actor.uid) if r.id not in seen]
            out = sorted(hot + cold, key=lambda r: (r.end, r.id), reverse=True)
        else:
            raise InvalidInput(f"unknown list scope {scope!r}")
        return out[:limit] if limit else out

    def resolve(self, ref: str, *, state: LedgerState | None = None, any_owner: bool = False) -> Reservation:
        """A full reservation from a list number (1-3 digits), a unique ID
        prefix of at least 4 characters, or a full ID."""
        state = state or self.ledger()
        ref = ref.strip().lower()
        if ref.isdigit() and len(ref) <= 3:
            mine = self.own_current(state)
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
            own = [r for r in hits if r.uid == self.actor.uid]
            hits = own or hits
        if not hits:
            raise NotFound(f"no reservation with ID {ref}", hint="list yours with: bk l")
        if len(hits) > 1:
            raise Ambiguous(f"ID prefix {ref} matches {len(hits)} reservations: "
                            + ", ".join(f"{r.id[:12]} ({r.user})" for r in hits[:10]),
                            hint="type more characters of the ID",
                            details={"candidates": [r.id for r in hits]})
        return hits[0]

    def history(self, ref: str) -> tuple[Reservation, list[dict]]:
        """One booking's lifecycle: the record and its audit entries."""
        try:
            res = self.resolve(ref, any_owner=True)
        except NotFound:
            res = next((r for r in self.store.archived() if r.id.startswith(ref.lower())), None)
            if res is None:
                raise
        return res, self.audit(reservation=res.id).entries

    def audit(self, limit: int = 50, all_users: bool = False, *, reservation: str | None = None,
              actor: Actor | None = None):
        """Audit entries, newest ``limit`` (oldest first): the actor's own
        (records they made, or about their bookings), everyone's for the
        administrator with ``all_users``, or one reservation's lifecycle.
        Bookings are public on a shared server (the ledger is world-readable),
        so a reservation's lifecycle is too."""
        actor = actor or self.actor
        if reservation is not None:
            tail = self.store.audit_tail(limit=AUDIT_SCAN_FOR_ONE)
            tail.entries = [e for e in tail.entries if e.get("reservation") == reservation][-limit:]
            return tail
        uid = None if (all_users and actor.is_admin) else actor.uid
        return self.store.audit_tail(limit=limit, uid=uid)

    def notices(self, include_archived: bool = False, state: LedgerState | None = None) -> list[Notice]:
        state, now = state or self.ledger(), self.now()
        out = []
        for n in state.notices:
            if n.archived and not include_archived:
                continue
            current = n.until is None or n.until > now or include_archived
            # The administrator's --all view includes notices to other users,
            # so that one can be found (and archived) by its ID.
            mine = n.uid in (None, self.actor.uid) or (include_archived and self.actor.is_admin)
            if current and mine:
                out.append(n)
        return sorted(out, key=lambda n: n.at, reverse=True)

    def archive_notice(self, ref: str, actor: Actor | None = None, dry_run: bool = False) -> Notice:
        """Withdraw an announcement (or a notice to one user): it stays in the
        ledger, marked archived, until retention drops it."""
        actor = actor or self.actor
        if not actor.is_admin:
            raise PermissionDenied("only the administrator (root) may archive notices",
                                   hint="sudo bk admin notice archive ID")

        def find(state: LedgerState) -> Notice:
            key = ref.strip().lower()
            hits = [n for n in state.notices if n.id.startswith(key)] if len(key) >= 4 else []
            if not hits:
                raise NotFound(f"no notice with ID {ref}", hint="list them with: bk n --all")
            if len(hits) > 1:
                raise Ambiguous(f"ID prefix {ref} matches {len(hits)} notices",
                                hint="type more characters of the ID")
            return hits[0]

        if dry_run:
            return find(self.ledger())

        def apply(state):
            n = find(state)
            if n.archived:
                return Mutation(False, [], n)
            done = replace(n, archived=True)
            state.notices[state.notices.index(n)] = done
            return Mutation(True, [{"action": "notice_archive", "reservation": None, "op_id": None,
                                    "before": {"id": n.id, "text": n.text}, "after": None,
                                    "result": "archived"}], done)
        return self._transact(apply, actor)

    def recommend(self, req: BookRequest, alternatives: int = 3,
                  state: LedgerState | None = None) -> list:
        from bk.core import scheduler
        from bk.service import booking

        check_request(req)
        state = state or self.ledger()
        gpus = self.gpus()
        return scheduler.recommend(booking._sched_request(req), reservations=state.reservations,
                                   blackouts=state.blackouts, policy=self.policy, gpus=gpus,
                                   now=self.now(), alternatives=alternatives, load=self.load(gpus),
                                   tz=clock.local_tz())

    # -- writes ------------------------------------------------------------

    def _transact(self, apply: Callable[[LedgerState], Mutation], actor: Actor):
        return self.store.transact(apply, policy=self.policy.bound(), actor_uid=actor.uid,
                                   actor=actor.user)

    def _applier(self, kind: str, req, actor: Actor) -> Callable[[LedgerState], Mutation]:
        """The function one write applies inside a transaction."""
        from bk.service import booking

        if kind == "cancel":
            notice_id = _new_id()
            return lambda state: booking.apply_cancel(state, req, actor, now=self.now(),
                                                      notice_id=notice_id)
        check_request(req)
        gpus = self.gpus()
        live = {"load": self.load(gpus), "tz": clock.local_tz()}
        if kind == "book":
            new_id = _new_id()
            return lambda state: booking.apply_book(state, req, actor, now=self.now(),
                                                    policy=self.policy, gpus=gpus, new_id=new_id,
                                                    **live)
        if kind == "edit":
            return lambda state: booking.apply_edit(state, req, actor, now=self.now(),
                                                    policy=self.policy, gpus=gpus, **live)
        raise InvalidInput(f"unknown write {kind!r}")

    def book(self, req: BookRequest, actor: Actor | None = None):
        actor = actor or self.actor
        return self._transact(self._applier("book", req, actor), actor)

    def edit(self, req: EditRequest, actor: Actor | None = None):
        actor = actor or self.actor
        return self._transact(self._applier("edit", req, actor), actor)

    def cancel(self, req: CancelRequest, actor: Actor | None = None):
        actor = actor or self.actor
        return self._transact(self._applier("cancel", req, actor), actor)

    def write_batch(self, items: list[tuple[str, object, Actor]]) -> list:
        """Several callers' writes in one transaction: the broker's group
        commit.  Each write is applied, in order, to the state the earlier
        ones left, exactly as if it had its own transaction; a refused one is
        rolled back alone and answered with its error; one commit (one round
        of fsyncs, the cost that dominates a write) acknowledges them all.
        Returns one result or ``BkError`` per item, in order."""
        appliers = []
        for kind, req, actor in items:
            try:
                appliers.append((self._applier(kind, req, actor), actor))
            except BkError as e:
                appliers.append((e, actor))

        def apply(state: LedgerState) -> Mutation:
            outcomes, audit, changed = [], [], False
            for fn, actor in appliers:
                if isinstance(fn, BkError):
                    outcomes.append(fn)
                    continue
                saved = (list(state.reservations), list(state.blackouts), list(state.notices),
                         list(state.ops))
                try:
                    m = fn(state)
                except BkError as e:
                    (state.reservations[:], state.blackouts[:], state.notices[:],
                     state.ops[:]) = saved
                    outcomes.append(e)
                    continue
                outcomes.append(m.result)
                changed = changed or m.changed
                audit.extend({**a, "uid": actor.uid, "user": actor.user} for a in m.audit)
            return Mutation(changed, audit, outcomes)

        try:
            return self._transact(apply, items[0][2])
        except BkError as e:      # the transaction itself failed: busy, I/O, policy mismatch
            return [e] * len(items)

    def probe(self) -> list[tuple[str, bool, str]]:
        """``bk doctor --probe``: try the writes a commit needs, for real."""
        return self.store.probe()

    def publish_notice(self, text: str, level: str = "info", until: int | None = None,
                       actor: Actor | None = None, dry_run: bool = False) -> Notice:
        actor = actor or self.actor
        if not actor.is_admin:
            raise PermissionDenied("only the administrator (root) may publish announcements",
                                   hint="sudo bk admin notice publish TEXT")
        if not text.strip():
            raise InvalidInput("the announcement text is empty")
        if level not in Notice.LEVELS:
            raise InvalidInput(f"level must be one of {', '.join(Notice.LEVELS)}")
        notice = Notice(id=_new_id(), at=self.now(), text=text.strip(), level=level,
                        until=until, created_by=actor.uid)
        if dry_run:
            return notice

        def apply(state):
            state.notices.append(notice)
            return Mutation(True, [{"action": "notice_publish", "reservation": None, "op_id": None,
                                    "before": None, "after": {"id": notice.id, "text": notice.text,
                                                              "level": level}, "result": "published"}],
                            notice)
        return self._transact(apply, actor)


def status_word(r: Reservation, now: int) -> str:
    return {UPCOMING: "upcoming", ACTIVE: "active", ENDED: "ended", CANCELLED: "cancelled"}[r.status(now)]
