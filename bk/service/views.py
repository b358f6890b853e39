"""JSON shapes of results (SPEC 6.3).  Field names are part of the contract:
documented in bk(1) and docs/JSON.md and checked by contract tests."""

from __future__ import annotations

from bk.core.models import EXCLUSIVE, Notice, Policy, Reservation, iso
from bk.core.record import dataclass, field


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
