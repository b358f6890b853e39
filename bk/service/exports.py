"""The ``export`` row: what bk shows to Prometheus, calendars and the web
page of the week, as one typed record (``bk.export.model.Export``).

``assemble`` is the one place that turns bk's own records (the ledger's
bookings, blackouts and notices, a GPU snapshot with the monitor's
activity judgements, the heartbeat, today's usage totals) into that
record; it is pure.  Two callers feed it:

* the row (``serve_export``, ``bk export prom|ics|html``): it reads the
  committed ledger (and, for a calendar or the week's page, the archive
  since the period began), the monitor's fresh snapshot file for the
  activity states, the live look this call has (the monitor's, or one it
  takes itself), the heartbeat and, for the metrics, today's usage history;
* the monitor, every minute, with what it already holds in memory
  (``bk.monitor.exporter``): no file is read again for it.

Which bookings each export holds: the metrics need the live ones (running
or ahead); a calendar also the last ``ICS_PAST_DAYS`` days (ended, and
cancelled ones so that subscribers see the cancellation); the page the
whole local week it shows.  A booking cancelled after it started ran until
then: it is kept, with ``cancelled_at`` as its real end.
"""

from __future__ import annotations

from bk.core.record import dataclass, field
from bk.export.model import Announcement, Booking, Export, Gpu, Monitor, Use, Window
from bk.service.fields import Field

KINDS = ("prom", "ics", "html")
SCOPES = ("all", "mine")
ICS_PAST_DAYS = 14
DAY = 86400


@dataclass(frozen=True)
class ExportRequest:
    kind: str = "prom"
    scope: str = "all"
    gpu: int | None = None


EXPORT_FIELDS = (
    Field("kind", "choice", choices=KINDS,
          help="prom: the live bookings and today's use; ics: also the last 14 days; html: the local week"),
    Field("scope", "choice", choices=SCOPES, help="all: everyone's bookings (default); mine: yours only"),
    Field("gpu", "int", lo=0, hi=63, help="only the bookings on this GPU"),
)


def check_export(req: ExportRequest) -> None:
    """The field spec's choices and bounds, for a request made in this
    process as for one decoded from JSON."""
    from bk.service.fields import check

    check(req, EXPORT_FIELDS)


@dataclass(frozen=True)
class ExportResult:
    request: ExportRequest
    data: Export
    since: int                                   # the earliest end a booking in it may have
    json: dict | None = field(default=None, compare=False)

    def rendered(self, view) -> ExportResult:
        return self                              # its JSON needs no view: to_json() makes it

    def to_json(self) -> dict:
        from bk.core.models import iso

        d = self.data
        return {"kind": self.request.kind, "scope": self.request.scope, "gpu": self.request.gpu,
                "now": iso(d.now), "since": iso(self.since), "host": d.host,
                "bookings": len(d.bookings), "gpus": len(d.gpus), "windows": len(d.windows),
                "announcements": len(d.announcements), "monitor": d.monitor.state,
                "live_at": iso(d.live_at), "history": d.history}


# ------------------------------------------------------------- assembly

def sequence(r) -> int:
    """How many times the booking changed since it was made: each recorded
    edit, and its cancellation (the calendar's SEQUENCE)."""
    return len(r.edits) + (1 if r.cancelled_at is not None else 0)


def updated(r) -> int:
    times = [r.created] + [e.at for e in r.edits] + ([r.cancelled_at] if r.cancelled_at is not None else [])
    return max(times)


def _status(r, now: int) -> str:
    if r.cancelled_at is not None:
        return "cancelled"
    return "ended" if now >= r.end else "active" if now >= r.start else "upcoming"


def wanted(r, since: int, now: int) -> bool:
    """Does an export of the period from ``since`` hold ``r``?"""
    if r.cancelled_at is not None:
        return r.cancelled_at >= since and (r.cancelled_at > r.start or since < now)
    return r.end > since


def assemble(*, now: int, host: str, policy, reservations, blackouts=(), notices=(), gpus=(),
             live_at: int | None = None, live_source: str | None = None, attributions=None,
             activity: dict | None = None, heartbeat=None, summary=None, since: int | None = None,
             user_of=None) -> Export:
    """The record every export renders (module docstring).  ``gpus``:
    ``GpuInfo`` of the live look (``live_at`` set) or of the inventory;
    ``attributions``: ``bk.core.telemetry.attribute_all`` of that look;
    ``activity``: the snapshot's ``activity`` object; ``heartbeat``: a
    ``bk.store.snapshot.Heartbeat``; ``summary``: today's usage totals
    (``bk.core.usage.Summary``) or None; ``user_of``: uid -> name for the
    per-user totals (the bookings' names first)."""
    since = now if since is None else since
    judged = {}
    for row in (activity or {}).get("bookings") or ():
        if isinstance(row, dict) and isinstance(row.get("reservation"), str):
            judged[row["reservation"]] = row
    by_res = (summary.by_reservation if summary is not None else {}) or {}
    cap = policy.max_shared_users
    bookings = []
    names: dict[int, str] = {}
    for r in reservations:
        names.setdefault(r.uid, r.user)
        if not wanted(r, since, now):
            continue
        j = judged.get(r.id) if _status(r, now) == "active" else None
        t = by_res.get(r.id)
        bookings.append(Booking(
            r.id, r.uid, r.user, r.mode, tuple(r.gpus), cap if r.mode == "exclusive" else r.share,
            r.start, r.end, r.created, updated(r), sequence(r), _status(r, now), r.cancelled_at, r.note,
            j.get("state") if j else None, j.get("idle_s") if j else None,
            _joules(t.energy_mj) if t is not None else None))
    bookings.sort(key=lambda b: (b.start, b.created, b.id))
    out_gpus = []
    for g in gpus:
        unreserved = []
        for p in g.processes or ():
            a = (attributions or {}).get((g.index, p.pid))
            if a is not None and a.state in ("unreserved", "wrong-gpu"):
                uid = a.uid if a.uid is not None else p.uid
                unreserved.append(p.user or (names.get(uid) if uid is not None else None) or f"uid {uid}")
        out_gpus.append(Gpu(g.index, g.uuid, g.name, g.index in policy.disabled_gpus,
                            g.live_state() if live_at is not None else "unknown",
                            g.util, g.mem_used_mib, g.mem_total_mib, g.power_mw,
                            (len(g.processes) if g.processes is not None else None) if live_at is not None
                            else None, tuple(sorted(set(unreserved)))))
    windows = tuple(Window(b.id, b.start, b.end, b.reason, *_window_change(b)) for b in blackouts
                    if b.end > since)
    shown = [n for n in notices if n.uid is None and not n.archived and n.at <= now
             and (n.until is None or n.until > now)]
    announcements = tuple(Announcement(n.id, n.at, n.level, n.text, n.until)
                          for n in sorted(shown, key=lambda n: n.at, reverse=True))
    gpu_use, user_use = {}, {}
    if summary is not None:
        for i, t in summary.by_gpu.items():
            gpu_use[i] = Use(t.booked_s, t.active_s, t.unreserved_s, _joules(t.energy_mj))
        for uid, t in summary.by_uid.items():
            name = names.get(uid) or (user_of(uid) if user_of is not None else None) or str(uid)
            prev = user_use.get(name)
            use = Use(t.booked_s, t.active_s, t.unreserved_s, _joules(t.energy_mj))
            user_use[name] = use if prev is None else Use(
                prev.booked_s + use.booked_s, prev.active_s + use.active_s, prev.unreserved_s + use.unreserved_s,
                None if prev.energy_j is None and use.energy_j is None else (prev.energy_j or 0) + (use.energy_j or 0))
    hb = heartbeat
    monitor = Monitor() if hb is None else Monitor(hb.state, hb.age_s, hb.samples, hb.interval_s, hb.started_at,
                                                     hb.updated_at)
    return Export(now, host, cap, policy.slot_minutes, tuple(out_gpus), tuple(bookings), windows, announcements,
                  monitor, live_at, live_source, now - now % DAY, gpu_use, user_use, summary is not None)


def _window_change(b) -> tuple[int, int | None]:
    """A window's change counter and time (``bk.service.maintenance`` keeps
    them in its extra fields when it ends one early)."""
    from bk.core.models import parse_iso

    n = b.extra.get("sequence")
    at = b.extra.get("changed_at")
    try:
        t = parse_iso(at) if isinstance(at, str) else None
    except ValueError:
        t = None
    return (n if type(n) is int and n >= 0 else 0), t


def _joules(mj: int | None) -> float | None:
    return None if mj is None else mj / 1000


def only(data: Export, *, uid: int | None = None, gpu: int | None = None) -> Export:
    """``data`` with only ``uid``'s bookings, or those on ``gpu``."""
    from bk.core.record import replace

    keep = tuple(b for b in data.bookings if (uid is None or b.uid == uid) and (gpu is None or gpu in b.gpus))
    return replace(data, bookings=keep)


def period_start(kind: str, now: int, tz) -> int:
    """The earliest end a booking of this export may have."""
    if kind == "ics":
        return now - ICS_PAST_DAYS * DAY
    if kind == "html":
        return week_start(now, tz)
    return now


def week_start(now: int, tz) -> int:
    """Monday 00:00 (local) of the week ``now`` is in."""
    from datetime import datetime, timedelta

    local = datetime.fromtimestamp(now, tz)
    return local_midnight(local.date() - timedelta(days=local.weekday()), tz)


def local_midnight(day, tz) -> int:
    """The instant of local midnight of ``day`` (a date), the first one when
    a zone's midnight happens twice."""
    from datetime import datetime

    return int(datetime(day.year, day.month, day.day, tzinfo=tz).timestamp())


def write_page(directory: str, page: bytes, name: str = "index.html") -> str:
    """``bk export html DIR``: the page into ``DIR`` (yours), atomically."""
    import os

    from bk.store.publish import publish

    publish(directory, name, page)
    return os.path.join(directory, name)


@dataclass(frozen=True)
class PageRequest:
    """``bk export html DIR``: a rendered page, to be written into ``DIR``."""

    directory: str
    page: bytes
    name: str = "index.html"


@dataclass(frozen=True)
class PageWritten:
    path: str
    bytes: int

    def to_json(self) -> dict:
        return {"path": self.path, "bytes": self.bytes}


def serve_page(app, req: PageRequest, call) -> PageWritten:
    """The ``export_page`` row: a directory of the caller's own, so this
    process writes it (the monitor publishes its own pages itself)."""
    return PageWritten(write_page(req.directory, req.page, req.name), len(req.page))


def account_name(uid: int) -> str | None:
    from bk.users import user_name

    return user_name(uid)


def host_name() -> str:
    import socket

    try:
        return socket.gethostname() or "localhost"
    except OSError:
        return "localhost"


# ------------------------------------------------------------- the row

def serve_export(app, req: ExportRequest, call) -> ExportResult:
    """``bk export``: one ledger read, the archive for the period, the live
    look and the monitor's judgements, today's history for the metrics."""
    from bk.core.errors import BkError
    from bk.core.telemetry import attribute_all

    now = call.now
    since = period_start(req.kind, now, call.tz)
    state = app.ledger(call=call)
    reservations = list(state.reservations)
    if since < now:
        hot = {r.id for r in reservations}
        try:
            reservations += [r for r in app.store.archived(since=since) if r.id not in hot]
        except BkError as e:
            call.warn(f"the archive could not be read ({e.message}); older bookings are left out")
    snap = None
    try:
        snap = call.telemetry.snapshot()
    except BkError as e:
        call.warn(f"no live look at the GPUs: {e.message}")
    activity = _monitor_activity(app, now, snap)
    gpus = snap.gpus if snap is not None else call.telemetry.inventory().gpus
    heartbeat = call.telemetry.heartbeat() if hasattr(call.telemetry, "heartbeat") else None
    summary = None
    if req.kind == "prom":
        summary = _today(app, now, call)
    data = assemble(now=now, host=host_name(), policy=call.policy, reservations=reservations,
                    blackouts=state.blackouts, notices=state.notices, gpus=gpus,
                    live_at=snap.taken_at if snap is not None else None,
                    live_source=snap.source if snap is not None else None,
                    attributions=attribute_all(snap, state.reservations, now) if snap is not None else None,
                    activity=activity, heartbeat=heartbeat, summary=summary, since=since, user_of=account_name)
    data = only(data, uid=call.actor.uid if req.scope == "mine" else None, gpu=req.gpu)
    return ExportResult(req, data, since)


def _monitor_activity(app, now: int, snap) -> dict | None:
    """The activity object of the monitor's snapshot, while it is fresh and
    the look this call uses is that snapshot."""
    from bk.store.snapshot import monitor_dir, monitor_owner, read_snapshot_file

    got = read_snapshot_file(monitor_dir(app.settings), now, owner=monitor_owner(app.settings))
    if got is None or snap is None or got.snapshot.taken_at != snap.taken_at:
        return None
    return got.activity


def _today(app, now: int, call):
    """Today's (UTC) usage totals, or None when there is no history."""
    from bk.core.errors import BkError
    from bk.store.usage import UsageStore

    store = UsageStore.for_settings(app.settings)
    try:
        if store.span() is None:
            return None
        got = store.summary(now - now % DAY, now + 60)
    except BkError as e:
        call.warn(f"the usage history could not be read ({e.message}); the use counters are left out")
        return None
    call.warn(*store.problems[:3])
    return got
