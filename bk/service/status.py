"""The status view (``bk st``, ``bk``, ``bk login``) as data, for every front end.

One GPU snapshot (``call.telemetry.snapshot()``, one backend call per
command) and one read of the ledger make the whole view; nothing here is
computed per cell or per row from a fresh read.  The views are typed: the
CLI renders its text from the records, and ``to_json()`` is the JSON every
front end shows.  Process attribution is ``bk.core.telemetry.attribute``,
the same judgement the booking warnings use.

"Next fully free" is the first instant from now on at which a GPU holds no
booking at all (no share slot taken) and no blackout runs: the moment a
user could book the whole GPU.  Bookings on a GPU can chain (one ends as the
next starts), so it is the end of the chain of holds that covers now, found
in one pass over the holds sorted by start.
"""

from __future__ import annotations

from bk.core import telemetry
from bk.core.models import EXCLUSIVE, GpuInfo, GpuProcess, Policy, Reservation, iso
from bk.core.record import dataclass
from bk.service.views import notice_json

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


def shown_gpus(reservations, now: int, gpu_count: int) -> list[int]:
    """The GPUs a view shows: this machine's, and any other a live booking
    holds (the machine lost a GPU, or the ledger came from a bigger one), so
    that no booking disappears from the picture."""
    extra = {g for r in reservations if r.cancelled_at is None and r.end > now for g in r.gpus
             if g >= gpu_count}
    return [*range(gpu_count), *sorted(extra)]


def holds_by_gpu(reservations, now: int, gpu_count: int) -> dict[int, list[Reservation]]:
    """Bookings that still hold capacity, per GPU, sorted by start (one pass)."""
    per: dict[int, list[Reservation]] = {g: [] for g in shown_gpus(reservations, now, gpu_count)}
    for r in reservations:
        if r.cancelled_at is None and r.end > now:
            for g in r.gpus:
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


@dataclass(frozen=True)
class ProcessRow:
    pid: int
    uid: int | None
    user: str | None
    label: str | None
    mem_mib: int | None
    sm: int | None
    state: str                         # bk.core.telemetry.STATES

    def to_json(self) -> dict:
        # Container attribution (SPEC 8) refines ``identity`` and ``since`` later.
        return {"pid": self.pid, "uid": self.uid, "user": self.user, "label": self.label,
                "mem_mib": self.mem_mib, "sm": self.sm, "state": self.state,
                "identity": "verified" if self.uid is not None else None, "since": None}


@dataclass(frozen=True)
class GpuRow:
    index: int
    uuid: str | None
    name: str | None
    util: int | None
    mem_used_mib: int | None
    mem_total_mib: int | None
    temperature: int | None
    state: str                         # idle | busy | unknown | disabled
    share_used: int
    capacity: int
    processes: tuple | None            # ProcessRow; None: the backend cannot list them
    next_free: int | None              # None: never (disabled)

    def to_json(self) -> dict:
        return {"index": self.index, "uuid": self.uuid, "name": self.name, "util": self.util,
                "mem_used_mib": self.mem_used_mib, "mem_total_mib": self.mem_total_mib,
                "temperature": self.temperature, "state": self.state, "share_used": self.share_used,
                "capacity": self.capacity,
                "processes": None if self.processes is None else [p.to_json() for p in self.processes],
                "next_free": iso(self.next_free)}


def process_row(p: GpuProcess, gpu: int, active: dict[int, set[int]]) -> ProcessRow:
    return ProcessRow(p.pid, p.uid, p.user, p.label, p.mem_mib, p.sm, telemetry.attribute(p, gpu, active))


def gpu_rows(state, snapshot, policy, now: int) -> list[GpuRow]:
    info: dict[int, GpuInfo] = snapshot.by_index()
    per = holds_by_gpu(state.reservations, now, policy.gpu_count)
    dark = [(b.start, b.end) for b in state.blackouts if b.end > now]
    active = telemetry.active_gpus_by_uid(state.reservations, now)
    rows = []
    for g in per:
        gi = info.get(g)
        if g >= policy.gpu_count:        # booked, but not a GPU of this machine (any more)
            rows.append(GpuRow(g, None, None, None, None, None, None, "absent",
                               share_used(per[g], now, policy.max_shared_users), policy.max_shared_users,
                               None, None))
            continue
        disabled = g in policy.disabled_gpus
        procs = None
        if gi is not None and gi.processes is not None:
            procs = tuple(process_row(p, g, active) for p in gi.processes)
        free = None if disabled else next_fully_free([(r.start, r.end) for r in per[g]] + dark, now)
        rows.append(GpuRow(
            g, gi.uuid if gi else None, gi.name if gi else None, gi.util if gi else None,
            gi.mem_used_mib if gi else None, gi.mem_total_mib if gi else None,
            gi.temperature if gi else None, "disabled" if disabled else (gi.live_state() if gi else "unknown"),
            share_used(per[g], now, policy.max_shared_users), policy.max_shared_users, procs, free))
    return rows


@dataclass(frozen=True)
class StatusView:
    """``bk st``: GPUs, the caller's bookings (everyone's with ``verbose``), notices."""

    now: int
    backend: dict
    gpus: tuple
    reservations: tuple
    notices: tuple
    view: object                       # bk.service.results.View: numbers, capacity, memory
    verbose: bool = False

    def to_json(self) -> dict:
        return {"now": iso(self.now), "backend": dict(self.backend),
                "gpus": [g.to_json() for g in self.gpus],
                "reservations": [self.view.reservation(r) for r in self.reservations],
                "notices": [notice_json(n) for n in self.notices],
                # The monitor daemon (SPEC 8) does not exist yet; say so rather than guess.
                "monitor": {"state": "absent"}}


@dataclass(frozen=True)
class LoginView:
    now: int
    notices: tuple
    reservations: tuple
    view: object

    def to_json(self) -> dict:
        return {"now": iso(self.now), "notices": [notice_json(n) for n in self.notices],
                "reservations": [self.view.reservation(r) for r in self.reservations]}


def status_view(app, verbose: bool = False, *, call=None) -> StatusView:
    from bk.service.views import View

    call = call or app.call()
    state, now = app.ledger(call=call), call.now
    mine = app.own_current(state, call=call)
    numbers = {r.id: i for i, r in enumerate(mine, 1)}
    snap = call.telemetry.snapshot()
    if verbose:
        shown = sorted((r for r in state.reservations if r.is_live(now)), key=lambda r: (r.start, r.created))
    else:
        shown = mine
    view = View(now, call.actor.uid, call.policy, {g.index: g.mem_total_mib for g in snap.gpus}, numbers)
    return StatusView(now, {"name": snap.source, "simulated": snap.simulated},
                      tuple(gpu_rows(state, snap, call.policy, now)), tuple(shown),
                      tuple(app.notices(state=state, call=call)), view, verbose)


def login_view(app, lookahead: int = LOGIN_LOOKAHEAD_S, *, call=None) -> LoginView:
    """``bk login``: notices, and the caller's bookings active now or starting soon."""
    from bk.service.views import View

    call = call or app.call()
    state, now = app.ledger(call=call), call.now
    mine = app.own_current(state, call=call)
    numbers = {r.id: i for i, r in enumerate(mine, 1)}
    soon = [r for r in mine if r.start < now + lookahead]
    view = View(now, call.actor.uid, call.policy, call.gpu_mem() if soon else {}, numbers)
    return LoginView(now, tuple(app.notices(state=state, call=call)), tuple(soon), view)
