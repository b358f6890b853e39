"""JSON shapes of results (SPEC 6.3).  Field names are part of the contract:
documented in bk(1) and docs/JSON.md and checked by contract tests."""

from __future__ import annotations

from bk.core.models import EXCLUSIVE, Notice, Policy, Reservation, iso
from bk.core.record import dataclass, field, replace


def reservation_json(r: Reservation, *, now: int, actor_uid: int, policy: Policy,
                     gpu_mem: dict | None = None, number: int | None = None, position: int | None = None,
                     usable: bool = False, activity: dict | None = None) -> dict:
    eff = None
    if r.mode != EXCLUSIVE:
        totals = [(gpu_mem or {}).get(g) for g in r.gpus]
        known = [t for t in totals if t]
        if r.mem_mib is not None:
            eff = r.mem_mib
        elif known:
            from bk.core import scheduler

            eff = scheduler.effective_mem(r, policy, min(known))
    return {
        "id": r.id, "short_id": r.short_id, "number": number, "uid": r.uid, "user": r.user,
        "mine": r.uid == actor_uid, "mode": r.mode, "gpus": list(r.gpus),
        "share": policy.max_shared_users if r.mode == EXCLUSIVE else r.share,
        "capacity": policy.max_shared_users, "mem_mib": r.mem_mib, "mem_mib_effective": eff,
        "start": iso(r.start), "end": iso(r.end), "status": r.status(now), "created": iso(r.created),
        "op_id": r.op_id, "job": r.job.to_dict() if r.job is not None else None, "note": r.note,
        "cancelled_at": iso(r.cancelled_at), "cancel_reason": r.cancel_reason,
        "edits": len(r.edits),
        # Issue 27: a booking that moves earlier on its own (its place in
        # line, the latest start it keeps), and who else may use it.
        "advance": None if r.advance is None or r.cancelled_at is not None or r.start <= now else {
            "position": position, "latest_start": iso(r.start), "after": iso(r.advance.after),
            "since": iso(r.advance.since)},
        "shared_with": list(r.shared_with), "shared_with_you": usable and r.uid != actor_uid,
        # Issue 25: the monitor's state of a running booking (None: not
        # running, or no monitor says), its opt-in, keep and adopted processes.
        "activity": _activity_json(activity),
        **_follow_json(r),
    }


def _activity_json(row):
    if row is None:
        return None
    from bk.service.activity import row_json

    return row_json(row)


def _follow_json(r: Reservation) -> dict:
    if not r.extra or not any(k in r.extra for k in ("idle_release_minutes", "idle_keep_until", "adopt")):
        return {"idle_release_minutes": None, "keep_until": None, "adopted": None}
    from bk.service.follow import json_fields

    return json_fields(r)


def notice_json(n: Notice) -> dict:
    return {"id": n.id, "short_id": n.id[:8], "at": iso(n.at), "level": n.level, "text": n.text,
            "scope": "everyone" if n.uid is None else "you", "until": iso(n.until),
            "reservation": n.reservation, "archived": n.archived}


# JSON Schemas of the shapes above, for a tool's outputSchema (MCP): each
# result type's ``json_schema()`` describes what its ``to_json()`` gives.

def typed(kind: str, *, null: bool = False, **more) -> dict:
    """``{"type": kind}``, or with ``null`` also JSON null."""
    return {"type": [kind, "null"] if null else kind, **more}


def obj(props: dict, *, required: tuple | None = None, **more) -> dict:
    """An object with these properties, all required unless ``required`` says."""
    return {"type": "object", "properties": props,
            "required": list(props if required is None else required), **more}


def reservation_schema() -> dict:
    s, i, b = typed("string"), typed("integer"), typed("boolean")
    return obj({"id": s, "short_id": s, "number": typed("integer", null=True), "uid": i, "user": s,
                "mine": b, "mode": {"enum": ["shared", "exclusive"]}, "gpus": {"type": "array", "items": i},
                "share": i, "capacity": i, "mem_mib": typed("integer", null=True),
                "mem_mib_effective": typed("integer", null=True), "start": s, "end": s,
                "status": {"enum": ["upcoming", "active", "ended", "cancelled"]}, "created": s,
                "op_id": typed("string", null=True), "job": typed("object", null=True),
                "note": typed("string", null=True), "cancelled_at": typed("string", null=True),
                "cancel_reason": typed("string", null=True), "edits": i,
                "advance": typed("object", null=True, description="it moves earlier on its own: its place in "
                                 "line and the latest start it keeps"),
                "shared_with": {"type": "array", "items": s}, "shared_with_you": b},
               description="a booking (docs/JSON.md: reservation); times ISO-8601 UTC")


def notice_schema() -> dict:
    s = typed("string")
    return obj({"id": s, "short_id": s, "at": s, "level": {"enum": ["info", "warning", "critical"]}, "text": s,
                "scope": {"enum": ["everyone", "you"]}, "until": typed("string", null=True),
                "reservation": typed("string", null=True), "archived": typed("boolean")})


@dataclass(frozen=True)
class View:
    """What rendering needs, captured once per call."""

    now: int
    actor_uid: int
    policy: Policy
    gpu_mem: dict
    numbers: dict = field(default_factory=dict)
    positions: dict = field(default_factory=dict)     # advancing booking -> place in line
    usable: frozenset = frozenset()                  # others' bookings shared with the caller
    activity: dict = field(default_factory=dict)     # booking id -> the monitor's activity row
    tz: object = None

    @classmethod
    def of(cls, call, numbers: dict | None = None, activity: dict | None = None) -> View:
        return cls(call.now, call.actor.uid, call.policy, call.gpu_mem(), numbers or {}, activity=activity or {},
                   tz=call.tz)

    def reservation(self, r: Reservation) -> dict:
        return reservation_json(r, now=self.now, actor_uid=self.actor_uid, policy=self.policy,
                                gpu_mem=self.gpu_mem, number=self.numbers.get(r.id),
                                position=self.positions.get(r.id), usable=r.id in self.usable,
                                activity=self.activity.get(r.id) if r.start <= self.now < r.end else None)

    def activity_text(self, r: Reservation) -> str | None:
        """``idle 35m``, ``in use``, or None (bk.core.activity.short_text)."""
        row = self.activity.get(r.id) if r.start <= self.now < r.end and r.cancelled_at is None else None
        if row is None:
            return None
        from bk.core.activity import short_text

        return short_text(row.get("state"), row.get("idle_s"))


# ------------------------------------------------------------ the everyday reads
#
# What every front end shows first: the caller's bookings, numbered the same
# in every command, and the notices.  Their rows (``list``, ``notices``) live
# here, in a module every command loads anyway, so ``bk l`` runs its row
# without loading one more.

def own_current(state, call) -> list[Reservation]:
    """The caller's current and upcoming bookings in list order; list
    numbers (``bk d 1``) index this list in every command."""
    uid, now = call.actor.uid, call.now
    mine = [r for r in state.reservations if r.uid == uid and r.is_live(now)]
    # Same start: the order they were booked in, so numbers match what the
    # user typed.  The sort is stable and the ledger keeps bookings in the
    # order they were made, so even the same second keeps that order.
    return sorted(mine, key=lambda r: (r.start, r.created))


def numbers_of(state, call) -> dict[str, int]:
    """List numbers of the caller's current bookings: the same in every command."""
    return {r.id: i for i, r in enumerate(own_current(state, call), 1)}


def current_notices(state, call, *, include_archived: bool = False) -> list[Notice]:
    """The notices the caller is shown, newest first: current announcements
    and notices to them; with ``include_archived`` archived and expired
    ones too (and, for the administrator, notices to other users, so that
    one can be found and archived by its ID)."""
    now, actor = call.now, call.actor
    out = []
    for n in state.notices:
        if (n.archived or n.at > now) and not include_archived:
            continue       # archived, or published to start later
        current = n.until is None or n.until > now or include_archived
        mine = n.uid in (None, actor.uid) or (include_archived and actor.is_admin)
        if current and mine:
            out.append(n)
    return sorted(out, key=lambda n: n.at, reverse=True)


LIST_SCOPES = ("mine", "all", "history")


@dataclass(frozen=True)
class ListRequest:
    scope: str = "mine"               # mine | all | history
    limit: int | None = None          # at most this many (None: all); ``total`` counts them all


@dataclass(frozen=True)
class ListResult:
    """``bk l`` and the agent's ``list``: the bookings shown, how many there
    are in all, and the view that numbers them."""

    scope: str
    reservations: tuple
    total: int
    view: View

    def to_json(self) -> dict:
        return {"scope": self.scope, "reservations": [self.view.reservation(r) for r in self.reservations],
                "total": self.total}

    @staticmethod
    def json_schema() -> dict:
        return obj({"scope": {"enum": list(LIST_SCOPES)},
                    "reservations": {"type": "array", "items": reservation_schema()},
                    "total": typed("integer", description="how many there are, however many are shown")})


def _serve_list(service, req: ListRequest, call) -> ListResult:
    from bk.core.errors import InvalidInput
    from bk.core.ledgerdoc import DocKeep

    scope, now = req.scope, call.now
    if scope not in LIST_SCOPES:
        raise InvalidInput(f"unknown list scope {scope!r}", hint="mine, all or history")
    # One read: the list and the numbering.  Only the bookings it can show
    # are built: yours (mine, history), or every live one (all).
    state = service.ledger(call=call, keep=DocKeep(uid=call.actor.uid, lo=now if scope == "all" else None,
                                                   shared=scope == "mine"))
    mine = own_current(state, call)
    theirs: list = []
    if scope == "mine":
        # Bookings others shared with you follow yours, unnumbered (numbers
        # name your own bookings in every command).
        if any(r.shared_with and r.uid != call.actor.uid for r in state.reservations):
            from bk.service.fairview import shared_with_me

            theirs = shared_with_me(state, call)
        every = mine + theirs
    elif scope == "all":
        every = sorted((r for r in state.reservations if r.is_live(now)), key=lambda r: (r.start, r.created))
    else:
        uid = call.actor.uid
        hot = [r for r in state.reservations if r.uid == uid and not r.is_live(now)]
        seen = {r.id for r in hot}
        cold = [r for r in service.reader.archived(uid=uid) if r.id not in seen]
        # Newest first: the reverse of a list's order, so the WHEN
        # column reads back in time (a booking's end says less: a long
        # one that ended last started long before a short one after it).
        every = sorted(hot + cold, key=lambda r: (r.start, r.created, r.id), reverse=True)
    numbers = {r.id: i for i, r in enumerate(mine, 1)} if scope != "history" else {}
    shown = every[:req.limit] if req.limit else every
    view = View.of(call, numbers)
    if any(r.advance is not None for r in state.reservations):
        from bk.service.advancing import positions

        view = replace(view, positions=positions(state, call, service))
    if theirs:
        view = replace(view, usable=frozenset(r.id for r in theirs))
    if any(r.cancelled_at is None and r.start <= now < r.end for r in shown):
        # The monitor's activity states of the running ones (issue 25).
        from bk.service.activity import rows

        view = replace(view, activity=rows(service.settings, shown, now))
    return ListResult(scope, tuple(shown), len(every), view)


@dataclass(frozen=True)
class NoticesRequest:
    all: bool = False                 # archived and expired ones too


@dataclass(frozen=True)
class NoticesResult:
    notices: tuple

    def to_json(self) -> dict:
        return {"notices": [notice_json(n) for n in self.notices]}

    @staticmethod
    def json_schema() -> dict:
        return obj({"notices": {"type": "array", "items": notice_schema()}})


def _serve_notices(service, req: NoticesRequest, call) -> NoticesResult:
    from bk.core.ledgerdoc import DocKeep

    # Notices are their own list in the document (an administrator's
    # cancellation of your booking is a notice to you, not a field of the
    # booking), so no reservation needs building (a sealed ledger).
    state = service.ledger(call=call, keep=DocKeep())
    return NoticesResult(tuple(current_notices(state, call, include_archived=req.all)))
