"""The status view (``bk st``, ``bk``, ``bk login``) as data, for every front end.

One GPU snapshot (``call.telemetry.snapshot()``, one backend call per
command) and one read of the ledger make the whole view; nothing here is
computed per cell or per row from a fresh read.  The views are typed: the
CLI renders its text from the records, and ``to_json()`` is the JSON every
front end shows.  Process attribution is ``bk.core.telemetry.attribute_all``,
the same judgement placement, the monitor and the booking warnings use.
The snapshot may come from the monitor's file (through the telemetry seam);
this module never asks where.

How much of each of the caller's running bookings was used comes from the
usage history the monitor writes (``bk.store.usage``): shown only when that
history has records of the booking, never estimated.

"Next fully free" is the first instant from now on at which a GPU holds no
booking at all (no share slot taken) and no blackout runs: the moment a
user could book the whole GPU.  Bookings on a GPU can chain (one ends as the
next starts), so it is the end of the chain of holds that covers now, found
in one pass over the holds sorted by start.
"""

from __future__ import annotations

import os

from bk.core import telemetry
from bk.core.errors import BkError
from bk.core.models import EXCLUSIVE, GpuInfo, GpuProcess, Policy, Reservation, iso
from bk.core.record import dataclass, field
from bk.core.utctime import format_utc, parse_utc
from bk.service.telemetry import monitor_json
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


def next_free_text(holds: list[tuple[str, str]], now: int) -> int:
    """``next_fully_free`` on intervals in the ledger document's UTC strings
    (``LedgerState.holds``), which sort as the instants do: only the instant
    found is parsed, not the thousands of bookings it was found among."""
    lo = format_utc(now)
    t = lo
    for a, b in sorted(holds):
        if a > t:
            break
        if b > t:
            t = b
    return now if t == lo else parse_utc(t)


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
    uid: int | None                    # the UID it is credited to (the booker, when inferred)
    user: str | None
    label: str | None
    mem_mib: int | None
    sm: int | None
    state: str                         # bk.core.telemetry.STATES
    identity: str | None = None        # bk.core.telemetry.IDENTITIES; None: no UID known
    since: int | None = None
    container: str | None = None

    def to_json(self) -> dict:
        return {"pid": self.pid, "uid": self.uid, "user": self.user, "label": self.label,
                "mem_mib": self.mem_mib, "sm": self.sm, "state": self.state,
                "identity": self.identity, "since": iso(self.since), "container": self.container}


@dataclass(frozen=True)
class GpuRow:
    index: int
    uuid: str | None
    name: str | None
    util: int | None
    mem_used_mib: int | None
    mem_total_mib: int | None
    temperature: int | None
    state: str                         # idle | busy | unreserved-use | unknown | disabled | absent
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


def process_row(p: GpuProcess, a, names: dict[int, str]) -> ProcessRow:
    """One process as shown: credited to ``a.uid`` (an ``Attribution``),
    named from the bookings when it is not its own UID (an inferred
    container process runs as root)."""
    user = p.user if a.uid == p.uid else names.get(a.uid) if a.uid is not None else None
    return ProcessRow(p.pid, a.uid, user, p.label, p.mem_mib, p.sm, a.state, a.identity, p.since,
                      p.container)


def _as_judged(reservations):
    """The bookings as process attribution judges them: a shared one also as
    its sharers' (``bk.service.fairview.expanded``, loaded only when some
    booking is shared, so that ``bk st`` loads nothing more otherwise)."""
    if not any(r.shared_with for r in reservations):
        return reservations
    from bk.service.fairview import expanded

    return expanded(reservations)


class _Names:
    """UID -> user name from the bookings, made on first use (``load``):
    only a process credited to someone other than its own UID asks."""

    def __init__(self, load):
        self._load, self._names = load, None

    def get(self, uid, default=None):
        if self._names is None:
            self._names = self._load()
        return self._names.get(uid, default)


def gpu_rows(state, snapshot, policy, now: int, names=None) -> list[GpuRow]:
    """One row per shown GPU.  ``state`` may be a partial read whose later
    bookings are only ``state.holds`` (``DocKeep(holds=True)``); ``names``
    then says who the bookings' UIDs are (a ``_Names``), since the read did
    not build everyone's."""
    info: dict[int, GpuInfo] = snapshot.by_index()
    per = holds_by_gpu(state.reservations, now, policy.gpu_count)
    dark = [(b.start, b.end) for b in state.blackouts if b.end > now]
    free = {g: next_fully_free([(r.start, r.end) for r in per[g]] + dark, now)
            for g in per if g < policy.gpu_count and g not in policy.disabled_gpus}
    if state.holds:
        free = _free_with_holds(free, state.holds, per, dark, now)
    atts = telemetry.attribute_all(snapshot, _as_judged(state.reservations), now)
    if names is None:
        names = {r.uid: r.user for r in state.reservations}
    unknown = telemetry.Attribution(telemetry.UNKNOWN, None, None)
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
            procs = tuple(process_row(p, atts.get((g, p.pid), unknown), names) for p in gi.processes)
        rows.append(GpuRow(
            g, gi.uuid if gi else None, gi.name if gi else None, gi.util if gi else None,
            gi.mem_used_mib if gi else None, gi.mem_total_mib if gi else None,
            gi.temperature if gi else None,
            "disabled" if disabled else (telemetry.gpu_state(gi, atts) if gi else "unknown"),
            share_used(per[g], now, policy.max_shared_users), policy.max_shared_users, procs, free.get(g)))
    return rows


def _free_with_holds(free: dict[int, int], holds: list, per: dict, dark: list, now: int) -> dict[int, int]:
    """``free`` (each GPU's next fully free instant from its built bookings
    and the blackouts) with the later bookings of ``holds`` too.  Only a
    GPU where one of them covers that instant needs its chain again, with
    them all; on a ledger whose later bookings leave a gap now, one C-speed
    ``min`` over them says there is none."""
    text = {g: format_utc(t) for g, t in free.items()}
    if not text or min(holds)[0] > max(text.values()):
        return free
    covered = set()
    for a, b, gs in holds:
        for g in gs:
            t = text.get(g)
            if t is not None and a <= t < b:
                covered.add(g)
    if not covered:
        return free
    out = dict(free)
    dark_text = [(format_utc(a), format_utc(b)) for a, b in dark]
    for g in covered:
        out[g] = next_free_text([(a, b) for a, b, gs in holds if g in gs]
                                + [(format_utc(r.start), format_utc(r.end)) for r in per[g]] + dark_text, now)
    return out


@dataclass(frozen=True)
class BookingUse:
    """How much of one running booking was used so far, from the usage
    history: ``booked_s`` of GPU time it held, ``active_s`` of it with a
    process of its owner seen."""

    reservation: str
    booked_s: int
    active_s: int

    @property
    def idle_fraction(self) -> float:
        return max(0.0, 1 - self.active_s / self.booked_s) if self.booked_s else 0.0

    def to_json(self) -> dict:
        return {"reservation": self.reservation, "booked_s": self.booked_s, "active_s": self.active_s,
                "idle_fraction": round(self.idle_fraction, 4)}


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
    telemetry: dict | None = None      # Snapshot.telemetry_json(): source, reason, gaps, capabilities
    describe: str | None = None        # the one line saying what the telemetry misses
    usage: tuple = ()                  # BookingUse of the caller's running bookings, where recorded
    monitor: dict | None = None        # the monitor's heartbeat (bk.service.telemetry.monitor_json)

    def to_json(self) -> dict:
        return {"now": iso(self.now), "backend": dict(self.backend),
                "telemetry": dict(self.telemetry or {}),
                "gpus": [g.to_json() for g in self.gpus],
                "reservations": [self.view.reservation(r) for r in self.reservations],
                "usage": [u.to_json() for u in self.usage],
                "notices": [notice_json(n) for n in self.notices],
                "monitor": dict(self.monitor or {"state": "absent"})}


@dataclass(frozen=True)
class LoginView:
    now: int
    notices: tuple
    reservations: tuple
    view: object

    def to_json(self) -> dict:
        return {"now": iso(self.now), "notices": [notice_json(n) for n in self.notices],
                "reservations": [self.view.reservation(r) for r in self.reservations]}


@dataclass(frozen=True)
class StatusRequest:
    verbose: bool = False              # everyone's bookings, and the processes


def _serve_status(service, req: StatusRequest, call) -> StatusView:
    from bk.core.ledgerdoc import DocKeep
    from bk.service.views import View, current_notices, own_current

    now = call.now
    # Everything here looks at bookings that hold capacity now or later
    # (the GPU rows, their chains to "next free", attribution) or at yours:
    # ended and cancelled ones are not built (a sealed ledger; DocKeep).
    # Without -v only yours, those running now (the shares in use, the
    # attribution) and those on GPUs this machine lacks are built; the
    # later ones are summarised (state.holds) for the chains to "next free".
    # A process credited to another UID (an inferred container process) is
    # named from every live booking, read again for that rare case.
    everyone = DocKeep(uid=call.actor.uid, lo=now)
    names = None
    if req.verbose:
        state = service.ledger(call=call, keep=everyone)
    else:
        state = service.ledger(call=call, keep=DocKeep(uid=call.actor.uid, lo=now, hi=now + 1,
                                                        gpu_count=call.policy.gpu_count, holds=True))
        if state.holds:
            names = _Names(lambda: {r.uid: r.user for r in service.reader.read(everyone).state.reservations})
    mine = own_current(state, call)
    numbers = {r.id: i for i, r in enumerate(mine, 1)}
    snap = call.telemetry.snapshot()
    if req.verbose:
        shown = sorted((r for r in state.reservations if r.is_live(now)), key=lambda r: (r.start, r.created))
    else:
        shown = mine
    activity = {}
    if any(r.cancelled_at is None and r.start <= now < r.end for r in shown):
        # The monitor's activity states of the running ones (issue 25).
        from bk.service.activity import rows

        activity = rows(service.settings, shown, now)
    view = View(now, call.actor.uid, call.policy, {g.index: g.mem_total_mib for g in snap.gpus}, numbers,
                activity=activity)
    running = [r for r in mine if r.status(now) == "active"]
    return StatusView(now, {"name": snap.source, "simulated": snap.simulated},
                      tuple(gpu_rows(state, snap, call.policy, now, names)), tuple(shown),
                      tuple(current_notices(state, call)), view, req.verbose,
                      snap.telemetry_json(), snap.describe(), tuple(_booking_usage(service.settings, running)),
                      monitor_json(call.telemetry))


def _booking_usage(settings, reservations) -> list[BookingUse]:
    """What the usage history says of each of ``reservations`` (running
    bookings); a booking it has no record of is left out, never shown as
    unused.  No history (no monitor ever ran) costs one failed stat."""
    if not reservations:
        return []
    try:
        from bk.store.usage import UsageStore
    except ImportError:         # a build without the usage history
        return []
    try:
        store = UsageStore.for_settings(settings)
        if not os.path.isdir(store.dir):
            return []
        out = []
        for r in reservations:
            booked, active = store.booking_usage(r.id, start=r.start, end=r.end)
            if booked > 0:
                out.append(BookingUse(r.id, booked, min(active, booked)))
        return out
    except (OSError, ValueError, BkError):  # the history is advice: a damaged one hides the line
        return []


@dataclass(frozen=True)
class GpuLive:
    """One GPU's live state for ``bk g``: what placement also looked at."""

    index: int
    state: str
    util: int | None
    mem_free_mib: int | None
    processes: int | None              # None: the source cannot list them

    def to_json(self) -> dict:
        return {"index": self.index, "state": self.state, "util": self.util,
                "mem_free_mib": self.mem_free_mib, "processes": self.processes}


def live_gpus(state, call) -> tuple[dict[int, GpuLive], str | None]:
    """Each GPU's live state (the command's one snapshot, the one placement
    used) and the telemetry line when something is missing."""
    snap = call.telemetry.snapshot()
    atts = telemetry.attribute_all(snap, _as_judged(state.reservations), call.now)
    out = {}
    for g in snap.gpus:
        free = (g.mem_total_mib - g.mem_used_mib
                if g.mem_total_mib is not None and g.mem_used_mib is not None else None)
        out[g.index] = GpuLive(g.index, telemetry.gpu_state(g, atts), g.util, free,
                               None if g.processes is None else len(g.processes))
    return out, snap.describe()


@dataclass(frozen=True)
class LoginRequest:
    lookahead: int = LOGIN_LOOKAHEAD_S     # bookings starting within this many seconds


def _serve_login(service, req: LoginRequest, call) -> LoginView:
    """``bk login``: notices, and the caller's bookings active now or starting soon."""
    from bk.core.ledgerdoc import DocKeep
    from bk.service.views import View, current_notices, own_current

    state, now = service.ledger(call=call, keep=DocKeep(uid=call.actor.uid)), call.now
    mine = own_current(state, call)
    numbers = {r.id: i for i, r in enumerate(mine, 1)}
    soon = [r for r in mine if r.start < now + req.lookahead]
    view = View(now, call.actor.uid, call.policy, call.gpu_mem() if soon else {}, numbers)
    return LoginView(now, tuple(current_notices(state, call)), tuple(soon), view)


# ------------------------------------------------------------ an agent's first look

@dataclass(frozen=True)
class ContextResult:
    """Everything an agent asks first (the ``context`` row): who it is, the
    rules, the GPUs and their live state, its bookings, the time."""

    json: dict

    def to_json(self) -> dict:
        return self.json

    @staticmethod
    def json_schema() -> dict:
        from bk.service.views import obj, reservation_schema, typed

        s, i, b = typed("string"), typed("integer"), typed("boolean")
        return obj({"version": s, "now": s, "now_epoch": i, "you": obj({"uid": i, "user": s, "admin": b}),
                    "mode": {"enum": ["private", "shared"]},
                    "policy": obj({k: i for k in ("gpu_count", "slot_minutes", "max_shared_users",
                                                  "booking_horizon_days", "max_booking_hours",
                                                  "queue_search_hours")}
                                  | {"require_shared_memory": b, "advance_default": b, "fair_share": b,
                                     "your_limits": typed("object", null=True,
                                                          description="your own limits (none: null)")}),
                    "gpus": {"type": "array", "items": obj({"index": i, "name": typed("string", null=True),
                                                            "uuid": typed("string", null=True),
                                                            "mem_total_mib": typed("integer", null=True),
                                                            "disabled": b},
                                                           description="with its live state when known")},
                    "telemetry": typed("string", null=True, description="what the GPU telemetry misses"),
                    "monitor": typed("object", null=True),
                    "reservations": {"type": "array", "items": reservation_schema()},
                    "shared_with_you": {"type": "array", "items": reservation_schema(),
                                        "description": "others' bookings you may run on (bk run -r ID)"}})


def _serve_context(service, req, call) -> ContextResult:
    from bk import __version__
    from bk.core.record import replace
    from bk.service.advancing import positions
    from bk.service.fairview import shared_with_me
    from bk.service.limits import bounds
    from bk.service.views import View, own_current

    state = service.ledger(call=call)
    mine = own_current(state, call)
    theirs = shared_with_me(state, call)
    from bk.service.activity import rows

    view = replace(View.of(call, {r.id: i for i, r in enumerate(mine, 1)}, rows(service.settings, mine, call.now)),
                   positions=positions(state, call, service), usable=frozenset(r.id for r in theirs))
    limits = bounds(call)
    inv = call.telemetry.inventory()
    live, missing = live_gpus(state, call)
    p = call.policy
    gpus = [{"index": g.index, "name": g.name, "uuid": g.uuid, "mem_total_mib": g.mem_total_mib,
             "disabled": g.index in p.disabled_gpus,
             **({k: v for k, v in live[g.index].to_json().items() if k != "index"} if g.index in live else {})}
            for g in inv.gpus]
    try:
        monitor = monitor_json(call.telemetry)
    except Exception:       # a context without the monitor's state is still a context
        monitor = None
    return ContextResult({
        "version": __version__, "now": iso(call.now), "now_epoch": call.now,
        "you": {"uid": call.actor.uid, "user": call.actor.user, "admin": call.actor.is_admin},
        "mode": service.settings.mode,
        "policy": {"gpu_count": p.gpu_count, "slot_minutes": p.slot_minutes,
                   "max_shared_users": p.max_shared_users, "booking_horizon_days": p.booking_horizon_days,
                   "max_booking_hours": p.max_booking_hours, "queue_search_hours": p.queue_search_hours,
                   "require_shared_memory": p.require_shared_memory,
                   # Issue 27: the caller's own limits, and how queued bookings wait.
                   "your_limits": None if limits is None else limits.to_json(),
                   "advance_default": p.advance_default, "fair_share": p.fair_share_half_life_s is not None},
        "gpus": gpus, "telemetry": missing, "monitor": monitor,
        "reservations": [view.reservation(r) for r in mine],
        "shared_with_you": [view.reservation(r) for r in theirs],
    })


# ------------------------------------------------------------ the TUI's look

@dataclass(frozen=True)
class ScreenRequest:
    """One look for ``bk t``: the committed ledger, the notices, the GPUs'
    live rows, the monitor's heartbeat and (``worker``) the worker's state.

    ``live``: take a new GPU snapshot (the telemetry refreshed first: the
    monitor's file while fresh, else the backend); otherwise the previous
    look's is reused.  ``previous``: the last look, whose ledger is reused
    when the committed file is the same one (every commit replaces the
    file, so the same inode, size and time mean the same bytes: decoding
    them again is most of an idle screen's CPU)."""

    live: bool = True
    worker: bool = True
    previous: object = None            # the ScreenResult of the last look


@dataclass(frozen=True)
class ScreenResult:
    now: int
    state: object                      # the committed LedgerState, or None when it could not be read
    notices: tuple
    gpus: tuple                        # GpuRow (empty until a snapshot is taken)
    snapshot: object                   # the GPU snapshot the rows and a write placed from use, or None
    inventory: object                  # the GPU inventory, or None
    live: str | None                   # what the telemetry misses, in one line
    monitor: dict
    worker: dict | None                # None: not looked at this time
    warnings: tuple                    # the ledger read's warnings
    error: str | None                  # the ledger could not be read: why
    ledger_id: tuple | None            # the committed file's identity at the read
    shared: bool = False               # a shared server's ledger (through the broker)
    usable: frozenset = frozenset()    # others' bookings shared with the caller (bk e ID --with)
    activity: dict = field(default_factory=dict)   # booking id -> the monitor's activity row (issue 25)

    def to_json(self) -> dict:
        return {"now": iso(self.now), "error": self.error, "live": self.live, "monitor": dict(self.monitor),
                "worker": self.worker, "gpus": [g.to_json() for g in self.gpus],
                "notices": [notice_json(n) for n in self.notices]}


def _ledger_id(service):
    try:
        st = os.stat(service.store.paths.ledger)
    except (OSError, AttributeError):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _serve_screen(service, req: ScreenRequest, call) -> ScreenResult:
    from bk.service.views import current_notices

    prev = req.previous
    snap = inv = None
    if req.live or prev is None:
        tel = call.telemetry
        try:
            if hasattr(tel, "refresh"):
                tel.refresh()
            snap, inv = tel.snapshot(), tel.inventory()
        except BkError:
            snap = inv = None
    else:
        snap, inv = prev.snapshot, prev.inventory
    ident = _ledger_id(service)
    if prev is not None and prev.state is not None and ident is not None and ident == prev.ledger_id:
        state, warnings, error = prev.state, prev.warnings, None
    else:
        seen = len(call.warnings)
        try:
            state, error = service.ledger(call=call), None
        except BkError as e:
            state, error, ident = None, e.message + (f" ({e.hint})" if e.hint else ""), None
        warnings = tuple(call.warnings[seen:])
    worker = None
    if req.worker:
        from bk.service import jobs

        try:
            worker = jobs._worker_status(service)
        except (BkError, OSError):
            worker = {"state": "absent"}
    call.warn(*warnings)
    now = call.now
    gpus = tuple(gpu_rows(state, snap, call.policy, now)) if state is not None and snap is not None else ()
    live = snap.describe() if snap is not None else "live: unknown (reading the GPUs)"
    usable: frozenset = frozenset()
    activity: dict = {}
    if state is not None:
        from bk.service.activity import rows
        from bk.service.fairview import shared_with_me

        usable = frozenset(r.id for r in shared_with_me(state, call))
        activity = rows(service.settings, [r for r in state.reservations if r.cancelled_at is None], now)
    return ScreenResult(now, state, tuple(current_notices(state, call)) if state is not None else (), gpus, snap,
                        inv, live, monitor_json(call.telemetry), worker, warnings, error, ident, service.shared,
                        usable, activity)
