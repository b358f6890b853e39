"""The status view (``bk st``, ``bk``, ``bk login``) as data, for every front end.

One look at the GPUs (``app.gpus()``, one backend call per command) and one
read of the ledger make the whole view; nothing here is computed per cell or
per row from a fresh read.  The CLI renders the dict this module returns,
and the prompt, the TUI header and MCP can use the same dict.

"Next fully free" is the first instant from now on at which a GPU holds no
booking at all (no share slot taken) and no blackout runs: the moment a
user could book the whole GPU.  Bookings on a GPU can chain (one ends as the
next starts), so it is the end of the chain of holds that covers now, found
in one pass over the holds sorted by start.
"""

from __future__ import annotations

from bk.core.models import EXCLUSIVE, SYSTEM_LABELS, GpuInfo, GpuProcess, Policy, Reservation, iso
from bk.service.views import notice_json, reservation_json

# How far ahead ``bk login`` looks for bookings about to start.
LOGIN_LOOKAHEAD_S = 3600


def policy_summary(policy: Policy) -> dict:
    """The policy as users need to know it (``bk info``, ``bk tutorial``, JSON)."""
    return {
        "gpu_count": policy.gpu_count, "slot_minutes": policy.slot_minutes,
        "max_shared_users": policy.max_shared_users,
        "shared_memory_reserve_mb": policy.shared_memory_reserve_mb,
        "require_shared_memory": policy.require_shared_memory,
        "booking_horizon_days": policy.booking_horizon_days,
        "max_booking_hours": policy.max_booking_hours,
        "queue_search_hours": policy.queue_search_hours,
        "disabled_gpus": sorted(policy.disabled_gpus),
        "gpu_priority": {str(g): p for g, p in policy.gpu_priority},
    }


def holds_by_gpu(reservations, now: int, gpu_count: int) -> dict[int, list[Reservation]]:
    """Bookings that still hold capacity, per GPU, sorted by start (one pass)."""
    per: dict[int, list[Reservation]] = {g: [] for g in range(gpu_count)}
    for r in reservations:
        if r.cancelled_at is None and r.end > now:
            for g in r.gpus:
                if g in per:
                    per[g].append(r)
    for lst in per.values():
        lst.sort(key=lambda r: (r.start, r.end))
    return per


def next_fully_free(holds: list[tuple[int, int]], now: int) -> int:
    """The first instant >= ``now`` that no interval of ``holds`` covers."""
    t = now
    for a, b in sorted(holds):
        if a > t:
            break
        t = max(t, b)
    return t


def share_used(holds: list[Reservation], t: int, capacity: int) -> int:
    """Share slots taken on one GPU at instant ``t`` (an exclusive booking takes all)."""
    used = 0
    for r in holds:
        if r.start <= t < r.end:
            used += capacity if r.mode == EXCLUSIVE else r.share
    return used


def process_json(p: GpuProcess, gpu: int, active_gpus_by_uid: dict[int, set[int]]) -> dict:
    """A GPU process with a first, simple attribution: whose booking it runs
    under.  Container attribution (SPEC 8) refines ``identity`` later."""
    label = p.label or ""
    if label.lower() in SYSTEM_LABELS:
        state = "system"
    elif p.uid is None:
        state = "unknown"
    elif gpu in active_gpus_by_uid.get(p.uid, ()):
        state = "ok"
    elif p.uid in active_gpus_by_uid:
        state = "wrong-gpu"
    else:
        state = "unreserved"
    return {"pid": p.pid, "uid": p.uid, "user": p.user, "label": p.label, "mem_mib": p.mem_mib,
            "sm": p.sm, "state": state, "identity": "verified" if p.uid is not None else None,
            "since": None}


def gpu_rows(app, state, now: int) -> list[dict]:
    policy = app.policy
    info: dict[int, GpuInfo] = {g.index: g for g in app.gpus()}
    per = holds_by_gpu(state.reservations, now, policy.gpu_count)
    dark = [(b.start, b.end) for b in state.blackouts if b.end > now]
    active_by_uid: dict[int, set[int]] = {}
    for lst in per.values():
        for r in lst:
            if r.start <= now:
                active_by_uid.setdefault(r.uid, set()).update(r.gpus)
    rows = []
    for g in range(policy.gpu_count):
        gi = info.get(g)
        disabled = g in policy.disabled_gpus
        live = gi.live_state() if gi else "unknown"
        procs = None
        if gi is not None and gi.processes is not None:
            procs = [process_json(p, g, active_by_uid) for p in gi.processes]
        free = None if disabled else next_fully_free([(r.start, r.end) for r in per[g]] + dark, now)
        rows.append({
            "index": g, "uuid": gi.uuid if gi else None, "name": gi.name if gi else None,
            "util": gi.util if gi else None, "mem_used_mib": gi.mem_used_mib if gi else None,
            "mem_total_mib": gi.mem_total_mib if gi else None,
            "temperature": gi.temperature if gi else None,
            "state": "disabled" if disabled else live,
            "share_used": share_used(per[g], now, policy.max_shared_users),
            "capacity": policy.max_shared_users,
            "processes": procs,
            "next_free": iso(free) if free is not None else None,
        })
    return rows


def _res_list(app, items, now, numbers, mem) -> list[dict]:
    return [reservation_json(r, now=now, actor_uid=app.actor.uid, policy=app.policy, gpu_mem=mem,
                             number=numbers.get(r.id)) for r in items]


def status_view(app, verbose: bool = False) -> dict:
    """``bk st``: GPUs, the user's bookings (everyone's with ``verbose``), notices."""
    state, now = app.ledger(), app.now()
    mine = app.own_current(state, now=now)
    numbers = {r.id: i for i, r in enumerate(mine, 1)}
    mem = {g.index: g.mem_total_mib for g in app.gpus()}
    if verbose:
        shown = sorted((r for r in state.reservations if r.is_live(now)), key=lambda r: (r.start, r.created))
    else:
        shown = mine
    return {
        "now": iso(now),
        "backend": {"name": app.backend.name, "simulated": bool(getattr(app.backend, "simulated", False))},
        "gpus": gpu_rows(app, state, now),
        "reservations": _res_list(app, shown, now, numbers, mem),
        "notices": [notice_json(n) for n in app.notices(state=state)],
        # The monitor daemon (SPEC 8) does not exist yet; say so rather than guess.
        "monitor": {"state": "absent"},
    }


def login_view(app, lookahead: int = LOGIN_LOOKAHEAD_S) -> dict:
    """``bk login``: notices, and the user's bookings active now or starting soon."""
    state, now = app.ledger(), app.now()
    mine = app.own_current(state, now=now)
    numbers = {r.id: i for i, r in enumerate(mine, 1)}
    soon = [r for r in mine if r.start < now + lookahead]
    mem = {g.index: g.mem_total_mib for g in app.gpus()} if soon else {}
    return {"now": iso(now), "notices": [notice_json(n) for n in app.notices(state=state)],
            "reservations": _res_list(app, soon, now, numbers, mem)}
