"""Advancing bookings in the write path, and fair share's usage.

Who runs the advance: every write but a new booking, in its own
transaction (``bk.service.gateway.LocalGateway.write_batch`` calls
``after_write`` on the state the write left).  In private mode that is the
command that cancelled or shortened; on a shared server the broker, for
every client's write.  A new booking never frees capacity, so it never
runs it; time passing frees nothing a placement did not already count.  See
``bk.core.advance`` for the rules.

What a move leaves behind (the stable contract the notifier reads, issue
26): the booking's new start, end and GPUs, with an ``Edit`` whose ``cause``
is ``booking_advanced`` (``before``/``after``: the start, end and GPUs that
changed); an audit record with the action ``booking_advanced``, ``owner``
the booking's owner, ``before`` and ``after`` the booking's summary; and a
notice to the owner for ``bk n`` and their next login.  The write's actor
is the edit's and the record's actor: their write made the room.

Fair share reads the usage history's per-day totals (sealed days cost a
small file each, ``bk.store.usage``) only when two or more bookings
compete, and keeps the answer ``USAGE_TTL`` seconds in the process (the
broker's), since an order that is a few minutes stale is as fair.
"""

from __future__ import annotations

from bk.core import advance, fairshare
from bk.core.errors import BkError
from bk.core.models import ADVANCED, AuditEntry, Edit, Notice
from bk.core.timegrid import format_span

USAGE_TTL = 300
NOTICE_DAYS = 2
_usage_cache: dict = {}


def after_write(before, state, call, service) -> list[AuditEntry]:
    """Move the advancing bookings that now fit earlier, in ``state`` (what
    the write left of ``before``); the audit records."""
    policy, now = call.policy, call.now
    q = policy.slot_seconds
    waiting = advance.queue(state.reservations, now, q)
    if not waiting:
        return []
    freed, changed = advance.freed_by(before.reservations, state.reservations, before.blackouts,
                                      state.blackouts, now)
    if not freed and not changed & {r.id for r in waiting}:
        return []
    usage = None
    if policy.fair_share_half_life_s and len({r.uid for r in waiting}) > 1:
        usage = decayed_usage(service, now, policy.fair_share_half_life_s)
    from bk.service import limits

    try:
        gpus = list(call.telemetry.inventory().gpus)
        moves = advance.plan(state.reservations, state.blackouts, policy, gpus, now, usage=usage,
                             bounds_of=limits.bounds_of_owner(call) if policy.limits else None,
                             freed=freed, changed=changed)
    except BkError as e:
        # The write stands; the bookings may move at the next one.
        call.warn(f"queued bookings were not moved earlier: {e.message}")
        return []
    out = []
    index = {r.id: i for i, r in enumerate(state.reservations)}
    for m in moves:
        old, new = m.before, m.after
        before = {k: v for k, v in _times(old).items() if _times(new)[k] != v}
        after = {k: v for k, v in _times(new).items() if _times(old)[k] != v}
        new = new.replace(edits=[*old.edits, Edit(now, call.actor.uid, call.actor.user, before, after,
                                                  {"cause": advance.EVENT})])
        state.reservations[index[new.id]] = new
        state.notices.append(Notice(
            id=call.new_id(f"advance-{new.id}"), at=now, uid=new.uid, level="info", reservation=new.id,
            created_by=call.actor.uid, until=now + NOTICE_DAYS * 86400,
            text=f"Your booking {new.short_id} moved earlier: now "
                 f"{format_span(new.start, new.end, call.tz, now)} (was {format_span(old.start, old.end, call.tz, now)})"))
        from bk.service.booking import summary

        out.append(AuditEntry(ADVANCED, "advanced", new.id, None, summary(old), summary(new), new.uid))
    return out


def _times(r) -> dict:
    return {"start": r.start, "end": r.end, "gpus": list(r.gpus)}


def decayed_usage(service, now: int, half_life_s: int) -> dict[int, float]:
    """Each uid's decayed GPU-seconds (``bk.core.fairshare``); {} without a history."""
    key = (getattr(service.settings, "data_dir", None), half_life_s)
    hit = _usage_cache.get(key)
    if hit is not None and 0 <= now - hit[0] < USAGE_TTL:
        return hit[1]
    try:
        from bk.store.usage import UsageStore

        store = UsageStore.for_settings(service.settings)
        lo, hi = fairshare.window(now, half_life_s)
        if store.span() is None:
            days = []
        else:
            days = [(start, {uid: fairshare.used_seconds(t) for uid, t in s.by_uid.items()})
                    for start, s in store.daily(lo, hi)]
    except Exception:          # noqa: BLE001  (no readable history: first come, first served)
        days = []
    got = fairshare.decayed(days, now, half_life_s)
    _usage_cache[key] = (now, got)
    return got


def positions(state, call, service=None) -> dict[str, int]:
    """Each advancing booking's place in line (``bk l``, the JSON)."""
    policy, now = call.policy, call.now
    q = policy.slot_seconds
    waiting = advance.queue(state.reservations, now, q)
    if not waiting:
        return {}
    usage = None
    if policy.fair_share_half_life_s and service is not None and len({r.uid for r in waiting}) > 1:
        usage = decayed_usage(service, now, policy.fair_share_half_life_s)
    return advance.positions(state.reservations, now, q, usage)
