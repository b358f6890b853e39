"""Usage views: what the history says, as typed results that own their JSON.

Every front end (``bk u`` and its sub-commands, the agent's ``usage``)
runs the rows here (``usage``, ``usage_users``, ``usage_samples``,
``usage_events``, ``usage_verify``).  The history is read straight from ``<data_dir>/usage`` (world-readable
on a shared server, like the committed ledger), never through the broker:
a read needs no one's authority and must not queue behind writes.

Times in JSON are ISO-8601 UTC; durations are whole seconds (``*_s``);
memory is MiB; SM and utilisation are percent.  docs/TELEMETRY.md documents
every field.
"""

from __future__ import annotations

from bk.core import usage as core
from bk.core.models import iso
from bk.core.record import dataclass, field

DASH_DAYS, DASH_WEEKS = 7, 4
RECENT_BOOKINGS = 8


class _Guarded:
    """The store, with "may not read" said as a permission: on a shared
    server whose access is limited to a group the data directory is 0750,
    and a non-member's read fails with EACCES, which is not a broken disk."""

    def __init__(self, store, svc):
        self._store, self._svc = store, svc

    def __getattr__(self, name):
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def guarded(*a, **kw):
            import errno

            from bk.core.errors import IOFailure, PermissionDenied

            try:
                return attr(*a, **kw)
            except IOFailure as e:
                if e.details.get("errno") in (errno.EACCES, errno.EPERM):
                    from bk.ipc.client import group_hint

                    raise PermissionDenied(f"you may not read the usage history in {self._store.dir}",
                                           hint=group_hint(self._svc.settings["group"])) from None
                raise
        return guarded


def _store_of(svc):
    from bk.store.usage import UsageStore

    return _Guarded(UsageStore.for_settings(svc.settings), svc)


def totals_json(t: core.Totals, prices: Prices | None = None) -> dict:
    d = t.to_dict()
    d["first"], d["last"] = iso(d["first"]), iso(d["last"])
    d.update((prices or NO_PRICES).of(t.energy_mj))
    return d


@dataclass(frozen=True)
class Prices:
    """The administrator's ``price_per_kwh``, ``gco2_per_kwh`` and ``pue``
    (gpubk-config(5)), applied to a known energy; an unknown energy (no
    counter, a reset, N/A) stays unknown: None, never 0."""

    price_per_kwh: float | None = None
    gco2_per_kwh: float | None = None
    pue: float = 1.0

    @classmethod
    def of_settings(cls, settings) -> Prices:
        return cls(settings["price_per_kwh"], settings["gco2_per_kwh"], settings["pue"] or 1.0)

    def of(self, energy_mj: int | None) -> dict:
        kwh = None if energy_mj is None else energy_mj / 3.6e9
        out = {"energy_kwh": None if kwh is None else round(kwh, 6)}
        if self.price_per_kwh is not None:
            out["cost"] = None if kwh is None else round(kwh * self.pue * self.price_per_kwh, 4)
        if self.gco2_per_kwh is not None:
            out["co2e_kg"] = None if kwh is None else round(kwh * self.pue * self.gco2_per_kwh / 1000, 4)
        return out


NO_PRICES = Prices()


def _user_name(uid: int) -> str:
    from bk.service.app import user_name

    return user_name(uid)


def _names(svc, call, uids) -> dict[int, str]:
    """User names for uids: the name their bookings in the ledger carry
    (what ``bk l`` shows), else the account database, else the number."""
    from bk.core.errors import BkError

    try:
        known = {r.uid: r.user for r in svc.ledger(call=call).reservations}
    except BkError:
        known = {}
    return {uid: known.get(uid) or _user_name(uid) for uid in uids}


def _warn_problems(call, store) -> None:
    call.warn(*(f"usage history: {p}" for p in store.problems[:10]))


MONITOR_HINT = ("usage is recorded by the monitor: start it with 'bk m' (private mode), or ask the "
                "administrator to enable gpubk-monitor.service (shared server)")


# ------------------------------------------------------------ the dashboard

@dataclass(frozen=True)
class Bin:
    start: int
    end: int
    totals: core.Totals
    prices: Prices = NO_PRICES

    def to_json(self) -> dict:
        return {"start": iso(self.start), "end": iso(self.end), **totals_json(self.totals, self.prices)}


@dataclass(frozen=True)
class BookingUse:
    reservation: str
    gpus: tuple[int, ...]
    start: int | None              # the booking's span, from the ledger (None: no longer there)
    end: int | None
    status: str | None
    totals: core.Totals
    prices: Prices = NO_PRICES

    def to_json(self) -> dict:
        return {"reservation": self.reservation, "gpus": list(self.gpus), "start": iso(self.start),
                "end": iso(self.end), "status": self.status, **totals_json(self.totals, self.prices)}


@dataclass(frozen=True)
class Dashboard:
    uid: int
    user: str
    now: int
    history: bool                   # False: nothing recorded yet (no monitor has run)
    span: tuple[int, int] | None
    today: core.Totals
    week: core.Totals
    four_weeks: core.Totals
    days: tuple[Bin, ...] = ()
    weeks: tuple[Bin, ...] = ()
    bookings: tuple[BookingUse, ...] = ()
    hint: str | None = None
    prices: Prices = NO_PRICES

    def to_json(self) -> dict:
        return {"uid": self.uid, "user": self.user, "at": iso(self.now), "history": self.history,
                "span": None if self.span is None else {"first": iso(self.span[0]), "last": iso(self.span[1])},
                "totals": {"today": totals_json(self.today, self.prices),
                           "7d": totals_json(self.week, self.prices),
                           "28d": totals_json(self.four_weeks, self.prices)},
                "days": [b.to_json() for b in self.days], "weeks": [b.to_json() for b in self.weeks],
                "bookings": [b.to_json() for b in self.bookings], "hint": self.hint}


def _bin(summaries, uid: int) -> core.Totals:
    t = core.Totals()
    for s in summaries:
        got = s.by_uid.get(uid)
        if got is not None:
            t.merge(got)
    return t


def _dashboard(svc, *, call, uid: int | None = None) -> Dashboard:
    """The caller's own totals (today, 7 days, 4 weeks), the last 7 local
    days and 4 weeks as bins, and their recent bookings."""
    uid = call.actor.uid if uid is None else uid
    user = call.actor.user if uid == call.actor.uid else _user_name(uid)
    store = _store_of(svc)
    now, tz = call.now, call.tz
    span = store.span()
    empty = core.Totals()
    if span is None:
        return Dashboard(uid, user, now, False, None, empty, empty, empty, hint=MONITOR_HINT,
                         prices=Prices.of_settings(svc.settings))
    days = core.local_days(now, tz, DASH_DAYS * DASH_WEEKS)
    lo = days[0][0]
    # One read of the caller's records for the whole window (lines without
    # their uid are skipped before parsing), then bins in local time.
    recs = store.records(lo, now + 1, uid=uid)
    _warn_problems(call, store)
    day_bins = [[a, b, core.Summary()] for a, b in days]
    i = 0
    for r in recs:
        while i < len(day_bins) - 1 and r.t >= day_bins[i][1]:
            i += 1
        if day_bins[i][0] <= r.t < day_bins[i][1]:
            day_bins[i][2].add(r)
    prices = Prices.of_settings(svc.settings)
    per_day = [Bin(a, b, _bin([s], uid), prices) for a, b, s in day_bins]
    weeks = tuple(Bin(per_day[k].start, per_day[k + 6].end, _merged(per_day[k:k + 7]), prices)
                  for k in range(0, len(per_day), 7))
    last7 = tuple(per_day[-DASH_DAYS:])
    today = per_day[-1].totals
    week = _merged(last7)
    four = _merged(per_day)
    # Recent bookings: the newest ones the records mention.
    summ = core.summarise(recs)
    mine = {rid: t for rid, t in summ.by_reservation.items() if summ.owners.get(rid) == uid}
    ledger = {r.id: r for r in _own_reservations(svc, call, uid)}
    order = sorted(mine, key=lambda rid: (mine[rid].last or 0, rid), reverse=True)[:RECENT_BOOKINGS]
    bookings = []
    for rid in order:
        r = ledger.get(rid)
        bookings.append(BookingUse(rid, tuple(sorted(summ.booking_gpus.get(rid, ()))),
                                   r.start if r else None, r.end if r else None,
                                   r.status(now) if r else None, mine[rid], prices))
    return Dashboard(uid, user, now, True, span, today, week, four, last7, weeks, tuple(bookings), prices=prices)


def _merged(bins) -> core.Totals:
    t = core.Totals()
    for b in bins:
        t.merge(b.totals)
    return t


def _own_reservations(svc, call, uid: int):
    """The user's bookings in the hot ledger and the archive (for spans);
    an unreadable ledger only costs the spans."""
    from bk.core.errors import BkError

    try:
        state = svc.ledger(call=call)
        hot = [r for r in state.reservations if r.uid == uid]
    except BkError:
        return []
    try:
        archived = list(svc.reader.archived(uid=uid))
    except BkError:
        archived = []
    return [*archived, *hot]


# ------------------------------------------------------------ per user

@dataclass(frozen=True)
class UserRow:
    uid: int
    user: str
    totals: core.Totals
    decayed_s: float = 0.0          # fair share: decayed GPU-seconds now (bk.core.fairshare)
    share: float | None = None      # their part of everyone's decayed usage
    prices: Prices = NO_PRICES

    def to_json(self) -> dict:
        return {"uid": self.uid, "user": self.user, **totals_json(self.totals, self.prices),
                "fair_share": {"share": None if self.share is None else round(self.share, 4),
                               "decayed_gpu_hours": round(self.decayed_s / 3600, 3)}}


@dataclass(frozen=True)
class UsersReport:
    since: int
    until: int
    rows: tuple[UserRow, ...]
    gpus: dict = field(default_factory=dict)        # gpu -> Totals
    history: bool = True
    hint: str | None = None
    prices: Prices = NO_PRICES
    half_life_days: float | None = None             # fair share's half-life, as configured (the SHARE column)

    def to_json(self) -> dict:
        return {"since": iso(self.since), "until": iso(self.until), "history": self.history,
                "users": [r.to_json() for r in self.rows],
                "gpus": [{"gpu": g, **totals_json(t, self.prices)} for g, t in sorted(self.gpus.items())],
                "hint": self.hint}


def _users(svc, *, call, since: int, until: int) -> UsersReport:
    store = _store_of(svc)
    if store.span() is None:
        return UsersReport(since, until, (), {}, False, MONITOR_HINT)
    s = store.summary(since, until)
    _warn_problems(call, store)
    # Each user's current fair share (issue 27): decayed usage, whatever the span shown.
    from bk.core.fairshare import shares
    from bk.service.advancing import decayed_usage

    half = int(svc.settings["fair_share_half_life_days"] * 86400)
    decayed = decayed_usage(svc, call.now, half)
    part = shares(decayed)
    names = _names(svc, call, set(s.by_uid) | set(decayed))
    prices = Prices.of_settings(svc.settings)
    rows = [UserRow(uid, names[uid], s.by_uid.get(uid) or core.Totals(), decayed.get(uid, 0.0), part.get(uid),
                    prices)
            for uid in sorted(set(s.by_uid) | {u for u, v in decayed.items() if v})]
    rows.sort(key=lambda r: (-r.totals.booked_s, -r.totals.unreserved_s, r.user))
    return UsersReport(since, until, tuple(rows), dict(s.by_gpu), prices=prices,
                       half_life_days=svc.settings["fair_share_half_life_days"])


# ------------------------------------------------------------ samples

def record_json(r: core.MinuteRecord) -> dict:
    d = r.to_dict()
    d.pop("t")
    d.pop("v")
    return {"start": iso(r.t), "end": iso(r.end), **d}


@dataclass(frozen=True)
class SamplesReport:
    since: int
    until: int
    records: tuple[core.MinuteRecord, ...]
    total: int                       # how many matched before the limit
    history: bool = True
    hint: str | None = None

    def to_json(self) -> dict:
        return {"since": iso(self.since), "until": iso(self.until), "history": self.history,
                "total": self.total, "records": [record_json(r) for r in self.records], "hint": self.hint}


def _samples(svc, *, call, since: int, until: int, gpus=None, limit: int | None = None,
            reservation: str | None = None) -> SamplesReport:
    """The stored records of the period; ``reservation`` (a full ID or a
    prefix): only those that credit that booking (its evidence: when it was
    seen active or idle, its SM, memory and energy)."""
    store = _store_of(svc)
    if store.span() is None:
        return SamplesReport(since, until, (), 0, False, MONITOR_HINT)
    recs = store.records(since, until, gpus=gpus)
    if reservation:
        recs = [r for r in recs if any((u.reservation or "").startswith(reservation) for u in r.uses)]
    _warn_problems(call, store)
    total = len(recs)
    if limit is not None:
        recs = recs[-limit:]
    return SamplesReport(since, until, tuple(recs), total)


# ------------------------------------------------------------ events

@dataclass(frozen=True)
class EventsReport:
    since: int
    until: int
    events: tuple[core.Event, ...]
    names: dict = field(default_factory=dict)       # uid -> user name
    min_idle_s: int = 1800
    history: bool = True
    hint: str | None = None

    def to_json(self) -> dict:
        return {"since": iso(self.since), "until": iso(self.until), "history": self.history,
                "min_idle_s": self.min_idle_s,
                "events": [{"kind": e.kind, "uid": e.uid, "user": self.names.get(e.uid, str(e.uid)),
                            "gpu": e.gpu, "start": iso(e.start), "end": iso(e.end),
                            "seconds": e.seconds, "reservation": e.reservation,
                            "mem_peak_mib": e.mem_peak_mib, "sm_avg": e.sm_avg} for e in self.events],
                "hint": self.hint}


def _events(svc, *, call, since: int, until: int, min_idle_s: int = 1800) -> EventsReport:
    store = _store_of(svc)
    if store.span() is None:
        return EventsReport(since, until, (), {}, min_idle_s, False, MONITOR_HINT)
    evs = core.events(store.records(since, until), min_idle_s=min_idle_s)
    _warn_problems(call, store)
    names = _names(svc, call, {e.uid for e in evs})
    return EventsReport(since, until, tuple(evs), names, min_idle_s)


# ------------------------------------------------------------ verify

@dataclass(frozen=True)
class VerifyReport:
    checks: tuple = ()

    @property
    def ok(self) -> bool:
        return all(c.state in ("ok", "unsealed") for c in self.checks)

    def to_json(self) -> dict:
        return {"ok": self.ok, "partitions": [c.to_json() for c in self.checks]}


def _verify(svc, *, call) -> VerifyReport:
    store = _store_of(svc)
    checks = store.verify()
    _warn_problems(call, store)
    return VerifyReport(tuple(checks))


# ------------------------------------------------------------ the rows

@dataclass(frozen=True)
class UsageRequest:
    """The caller's dashboard (with ``since``: also their totals over
    [since, until)), or one booking's booked and active seconds."""

    reservation: str | None = None
    since: int | None = None
    until: int | None = None          # default now


@dataclass(frozen=True)
class UsageResult:
    dashboard: Dashboard | None = None
    period: tuple | None = None       # (since, until, Totals) of the caller
    booking: dict | None = None       # one booking's: reservation, booked_s, active_s, idle_s

    def to_json(self) -> dict:
        if self.booking is not None:
            return dict(self.booking)
        out = self.dashboard.to_json()
        if self.period is not None:
            since, until, totals = self.period
            out["period"] = {"since": iso(since), "until": iso(until), "totals": totals_json(totals)}
        return out

    @staticmethod
    def json_schema() -> dict:
        from bk.service.views import obj, typed

        i = typed("integer")
        booking = obj({"reservation": typed("string"), "booked_s": i, "active_s": i, "idle_s": i},
                      description="one booking's GPU seconds")
        dashboard = obj({"uid": i, "user": typed("string"), "at": typed("string"), "history": typed("boolean"),
                         "span": typed("object", null=True), "totals": typed("object"),
                         "days": typed("array"), "weeks": typed("array"), "bookings": typed("array"),
                         "hint": typed("string", null=True), "period": typed("object")},
                        required=("uid", "user", "at", "history", "totals"),
                        description="your dashboard (docs/TELEMETRY.md); period with since")
        return {"anyOf": [dashboard, booking]}


def _serve_usage(svc, req: UsageRequest, call) -> UsageResult:
    from bk.core.errors import InvalidInput

    if req.reservation is not None:
        booked, active = _store_of(svc).booking_usage(req.reservation)
        return UsageResult(booking={"reservation": req.reservation, "booked_s": booked, "active_s": active,
                                    "idle_s": max(booked - active, 0)})
    period = None
    if req.since is not None:
        # bk u --since 10d, as people write it: the dashboard, and their own
        # totals over that period (the row of bk u users that is theirs).
        until = call.now if req.until is None else req.until
        if until <= req.since:
            raise InvalidInput("until must be after since", "e.g. bk u --since 2026-11-01 --until 2026-12-01")
        rows = _users(svc, call=call, since=req.since, until=until).rows
        mine = next((r.totals for r in rows if r.uid == call.actor.uid), core.Totals())
        period = (req.since, until, mine)
    elif req.until is not None:
        raise InvalidInput("until goes with since", hint="e.g. bk u --since 2026-11-01 --until 2026-12-01")
    return UsageResult(_dashboard(svc, call=call), period)


@dataclass(frozen=True)
class SpanRequest:
    """Everyone's history over [since, until): ``usage_users``."""

    since: int
    until: int


@dataclass(frozen=True)
class SamplesRequest:
    since: int
    until: int
    gpus: tuple[int, ...] | None = None
    limit: int | None = None          # the last this many records
    reservation: str | None = None    # a booking's ID or prefix: only the records that credit it


@dataclass(frozen=True)
class EventsRequest:
    since: int
    until: int
    min_idle_s: int = 1800


def _serve_users(svc, req: SpanRequest, call) -> UsersReport:
    return _users(svc, call=call, since=req.since, until=req.until)


def _serve_samples(svc, req: SamplesRequest, call) -> SamplesReport:
    return _samples(svc, call=call, since=req.since, until=req.until, gpus=req.gpus, limit=req.limit,
                    reservation=req.reservation)


def _serve_events(svc, req: EventsRequest, call) -> EventsReport:
    return _events(svc, call=call, since=req.since, until=req.until, min_idle_s=req.min_idle_s)


def _serve_verify(svc, req, call) -> VerifyReport:
    return _verify(svc, call=call)
