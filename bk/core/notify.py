"""Notifications, the pure part: which events a user's bookings give, when,
what each says, and what a person may choose.

The facts:

* Every event follows from state others already publish: the committed
  ledger (a booking's times, who cancelled or edited it, the maintenance
  windows), the monitor's snapshot (whose processes run on which GPU) and,
  for idle nudges, the monitor's per-booking activity.  So an event is a
  function of that state and ``now``; nothing has to be told "send this".
* A booking is edited, extended, cancelled at any time.  An event computed
  from the state as it is now cannot be for a window that no longer exists:
  the deliverer asks again before it sends.
* A deliverer can die between two instants (SIGKILL, a reboot).  Each event
  therefore has a ``key`` that the same state always gives again, built
  from the booking, the event and its due time (``BOOKING:EVENT:DUE``, with
  a qualifier where one booking has several of a kind: the minutes of an
  end warning, the GPU and user of an intrusion).  A delivery log keyed by
  it (``bk.notify.dlog``) is what makes a restart send nothing twice.
* An event has a window, ``[due, expires)``.  A deliverer that was down at
  the due time sends it late only while it still means something: "ends in
  30 min" until the 15-minute warning is due, "starts in 10 min" until the
  start.  After that it is dropped, never sent stale.

Event names and the JSON shape (``gpubk.event.v1``) are part of the
contract (docs/JSON.md).  Nothing here reads a clock, a file or a socket:
the zone and ``now`` are arguments.
"""

from __future__ import annotations

from bk.core.lazyre import Pattern
from bk.core.models import ADVANCED, iso
from bk.core.record import dataclass, field

SCHEMA = "gpubk.event.v1"

STARTS_SOON = "starts_soon"              # your booking starts in N minutes
STARTED = "started"                      # it starts now
ENDS_SOON = "ends_soon"                  # it ends in N minutes (30, 15, 5), with the extend command when it fits
ENDED = "ended"                          # it ended
CHANGED = "changed"                      # cancelled or edited by an administrator, or a maintenance window
MOVED_EARLIER = "moved_earlier"          # moved to an earlier start by someone else (bk's advance)
CAN_START_EARLIER = "can_start_earlier"  # a queued booking fits earlier now: a GPU freed
GPU_USED = "gpu_used_by_other"           # someone else's process runs on a GPU you booked
IDLE_NUDGE = "idle_nudge"                # your booking's GPUs have been idle for N minutes
TEST = "test"                            # bk notify test
EVENTS = (STARTS_SOON, STARTED, ENDS_SOON, ENDED, CHANGED, MOVED_EARLIER, CAN_START_EARLIER, GPU_USED,
          IDLE_NUDGE)
ALL_EVENTS = (*EVENTS, TEST)

TERMINAL, DESKTOP, EMAIL, WEBHOOK = "terminal", "desktop", "email", "webhook"
CHANNELS = (TERMINAL, DESKTOP, EMAIL, WEBHOOK)
LOCAL_CHANNELS = (TERMINAL, DESKTOP)      # written by the deliverer itself, at once
QUIET_HELD = (DESKTOP, EMAIL, WEBHOOK)    # what quiet hours hold back (a terminal line rings nothing)

PRESETS = ("json", "slack", "matrix", "ntfy")
DESKTOP_MODES = ("auto", "osc9", "osc777", "off")

DEFAULT_START_MINUTES = (10,)
DEFAULT_END_MINUTES = (30, 15, 5)
DEFAULT_IDLE_MINUTES = (30, 45)           # issue 25's nudges; the monitor's activity says how long
STARTED_LATE_S = 15 * 60                  # "it starts now" is news for this long
ENDED_LATE_S = 30 * 60
CHANGE_LATE_S = 24 * 3600                 # an administrator's change is told within a day
EXTEND_BY_S = 3600                        # the extension the end warnings offer: bk e ID -d +1h
MAX_MINUTES = 24 * 60


@dataclass(frozen=True)
class Event:
    """One notification: its name, its stable ``key``, the window it may be
    sent in, the booking it is about and its event-specific fields (already
    JSON values).  ``text`` is the line people read, made by ``render``."""

    name: str
    key: str
    due: int
    expires: int
    uid: int
    user: str
    booking: object = None               # Reservation, or None (bk notify test)
    fields: dict = field(default_factory=dict)

    def with_fields(self, **more) -> Event:
        return Event(self.name, self.key, self.due, self.expires, self.uid, self.user, self.booking,
                     {**self.fields, **more})


def key_of(rid: str, name: str, due: int, qualifier: str = "") -> str:
    return f"{rid}:{name}{'-' + qualifier if qualifier else ''}:{due}"


@dataclass(frozen=True)
class Timing:
    """When the timed events fall: minutes before the start, before the end."""

    start_minutes: tuple[int, ...] = DEFAULT_START_MINUTES
    end_minutes: tuple[int, ...] = DEFAULT_END_MINUTES


# ------------------------------------------------------------ the rules

def _mine(reservations, uid: int):
    return [r for r in reservations if r.uid == uid]


def timed(reservations, uid: int, timing: Timing, now: int) -> list[Event]:
    """The clock's events of ``uid``'s bookings that are not cancelled:
    starts in N minutes, started, ends in N minutes, ended; every one whose
    window has not closed at ``now`` (due ones and future ones)."""
    out: list[Event] = []
    for r in _mine(reservations, uid):
        if r.cancelled_at is not None or r.end + ENDED_LATE_S <= now:
            continue
        for m in sorted(set(timing.start_minutes), reverse=True):
            _timed(out, r, now, STARTS_SOON, r.start - m * 60, r.start, str(m), minutes=m)
        if r.created < r.start:
            _timed(out, r, now, STARTED, r.start, min(r.end, r.start + STARTED_LATE_S))
        leads = sorted(set(timing.end_minutes), reverse=True)
        for i, m in enumerate(leads):
            due = r.end - m * 60
            nxt = r.end - leads[i + 1] * 60 if i + 1 < len(leads) else r.end
            if due >= r.start:
                _timed(out, r, now, ENDS_SOON, due, nxt, str(m), minutes=m)
        _timed(out, r, now, ENDED, r.end, r.end + ENDED_LATE_S)
    return out


def _timed(out: list, r, now: int, name: str, due: int, expires: int, qualifier: str = "", **fields) -> None:
    # Only what is still ahead of the booking's creation: booking at 10:02
    # for 10:05 gives no "starts in 10 min" (due 9:55), and booking now
    # gives no "it starts now".
    if due >= r.created and expires > now and expires > due:
        out.append(Event(name, key_of(r.id, name, due, qualifier), due, expires, r.uid, r.user, r, fields))


RELEASED = "released: idle"        # bk.service.follow.release_reason's first words


def changes(reservations, uid: int, now: int, *, blackouts=(), notices=()) -> list[Event]:
    """What others did to ``uid``'s bookings: an administrator's (or a
    maintenance window's) cancellation, another account's edit, a move to
    an earlier start, a maintenance window kept over a live booking."""
    out = []
    announced = {n.id: n.at for n in notices}
    for r in _mine(reservations, uid):
        def add(name, due, qualifier="", r=r, **fields):
            if due + CHANGE_LATE_S > now:
                out.append(Event(name, key_of(r.id, name, due, qualifier), due, due + CHANGE_LATE_S,
                                 r.uid, r.user, r, fields))
        # The owner's worker ends a booking idle past its release time (issue 25)
        # as the owner, so the owner is told of it as of another's cancel.
        released = r.cancelled_by == r.uid and (r.cancel_reason or "").startswith(RELEASED)
        if r.cancelled_at is not None and r.cancelled_by is not None and (r.cancelled_by != r.uid or released):
            add(CHANGED, r.cancelled_at, "cancelled",
                change={"kind": "cancelled", "by_uid": r.cancelled_by, "reason": r.cancel_reason})
        for e in r.edits:
            # bk's advance (issue 27) is news even when the owner's own
            # write made the room: the edit names that write's actor.
            advanced = (e.extra or {}).get("cause") == ADVANCED
            if e.actor_uid == r.uid and not advanced:
                continue
            before, after = e.before or {}, e.after or {}
            if isinstance(before.get("start"), int) and isinstance(after.get("start"), int) \
                    and after["start"] < before["start"]:
                add(MOVED_EARLIER, e.at, moved={"from": iso(before["start"]), "to": iso(after["start"]),
                                                "by_uid": e.actor_uid, "by": e.actor, "advanced": advanced})
            else:
                add(CHANGED, e.at, "edited",
                    change={"kind": "edited", "by_uid": e.actor_uid, "by": e.actor,
                            "before": _times(before), "after": _times(after)})
        if r.cancelled_at is None and r.end > now:
            for b in blackouts:
                if b.start < r.end and r.start < b.end and b.end > now:
                    due = announced.get((b.extra or {}).get("notice"), b.start)
                    add(CHANGED, due, f"maintenance.{b.id[:8]}",
                        change={"kind": "maintenance", "by_uid": b.created_by, "reason": b.reason,
                                "window": {"id": b.id, "start": iso(b.start), "end": iso(b.end)}})
    return out


def _times(d: dict) -> dict:
    return {k: iso(v) if k in ("start", "end") and isinstance(v, int) else v for k, v in d.items()}


def intrusions(snapshot, reservations, uid: int, now: int) -> list[Event]:
    """Someone else's processes on a GPU of one of ``uid``'s bookings that
    runs now: not entitled to it by a booking of their own there (for an
    exclusive booking: anyone's).  One event per booking, GPU and other
    user, keyed by the booking's start, so each is told once per booking."""
    from bk.core.telemetry import intruders

    if snapshot is None:
        return []
    by_gpu = snapshot.by_index()
    out = []
    for r in _mine(reservations, uid):
        if r.cancelled_at is not None or not r.start <= now < r.end:
            continue
        for x in intruders(snapshot, reservations, booking=r, now=now):
            g = by_gpu.get(x.gpu)
            procs = [p for p in (g.processes or ()) if p.pid in x.pids and p.uid != uid] if g else []
            groups: dict = {}
            for p in procs:
                groups.setdefault(p.uid, []).append(p)
            for other, ps in sorted(groups.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
                who = "unknown" if other is None else str(other)
                rows = [{"gpu": x.gpu, "pid": p.pid, "uid": p.uid, "user": p.user, "label": p.label,
                         "mem_mib": p.mem_mib, "since": iso(p.since)} for p in sorted(ps, key=lambda p: p.pid)]
                out.append(Event(GPU_USED, key_of(r.id, GPU_USED, r.start, f"{x.gpu}.{who}"), now, r.end,
                                 r.uid, r.user, r, {"gpu": x.gpu, "processes": rows}))
    return out


def idle_nudges(reservations, uid: int, activity: dict, now: int,
                minutes: tuple[int, ...] = DEFAULT_IDLE_MINUTES) -> list[Event]:
    """Issue 25's nudges: ``activity`` maps a booking id to the monitor's
    record of it (``{"state": "idle-held" | "empty" | "active" | "unknown",
    "idle_since": epoch seconds or None, "nudges": [minutes reached]}``,
    ``nudges`` optional).  A booking idle since ``t``
    gives one nudge at ``t + m`` minutes for each ``m``, each until the
    next is due (the last until the booking ends); a booking that became
    active again starts over with a new ``idle_since``, so new keys."""
    out = []
    leads = sorted(set(minutes))
    for r in _mine(reservations, uid):
        a = activity.get(r.id) if isinstance(activity, dict) else None
        if r.cancelled_at is not None or not r.start <= now < r.end or not isinstance(a, dict):
            continue
        since = a.get("idle_since")
        state = a.get("state")
        # Only a booking the monitor saw idle (idle-held or empty) is nudged:
        # "unknown" pauses the idle clock and never counts as idle.
        if state not in ("idle-held", "empty") or not isinstance(since, int) or isinstance(since, bool):
            continue
        reached = a.get("nudges")
        for i, m in enumerate(leads):
            if isinstance(reached, list) and m not in reached:
                continue        # the monitor's idle clock (which skips gaps) has not reached it yet
            due = since + m * 60
            nxt = since + leads[i + 1] * 60 if i + 1 < len(leads) else r.end
            if due < r.end and nxt > now:
                out.append(Event(IDLE_NUDGE, key_of(r.id, IDLE_NUDGE, due, str(m)), due, min(nxt, r.end),
                                 r.uid, r.user, r, {"idle": {"minutes": m, "since": iso(since), "state": state}}))
    return out


def earlier(r, start: int, gpus, command: str, now: int) -> Event:
    """A queued booking ``r`` fits from ``start`` (earlier than its own): a
    GPU freed.  Keyed by the start it has, so it is told once per start."""
    return Event(CAN_START_EARLIER, key_of(r.id, CAN_START_EARLIER, r.start), now, r.start, r.uid, r.user, r,
                 {"earlier": {"start": iso(start), "gpus": sorted(gpus), "command": command}})


def test_event(uid: int, user: str, now: int, nonce: str) -> Event:
    return Event(TEST, f"test:{TEST}-{nonce}:{now}", now, now + 3600, uid, user, None, {})


# ------------------------------------------------------------ what it says

def _gpus(r) -> str:
    return ("GPU " if len(r.gpus) == 1 else "GPUs ") + ",".join(map(str, r.gpus))


def render(ev: Event, tz, now: int) -> str:
    """The one line a person reads, in local time.  Text that others wrote
    (a reason, a user or process name) passes ``safe``."""
    from bk.core import timegrid
    from bk.core.safetext import safe

    r = ev.booking
    f = ev.fields

    def at(t: int) -> str:
        return timegrid.format_local_short(t, tz, now)
    if ev.name == TEST:
        return "test notification from bk: this channel works"
    rid = r.short_id
    if ev.name == STARTS_SOON:
        return f"booking {rid} starts in {f['minutes']} min ({at(r.start)}) on {_gpus(r)}"
    if ev.name == STARTED:
        return f"booking {rid} has started on {_gpus(r)} (until {at(r.end)})"
    if ev.name == ENDS_SOON:
        text = f"booking {rid} ends in {f['minutes']} min ({at(r.end)}) on {_gpus(r)}: save your work"
        ext = f.get("extend") or {}
        if ext.get("possible"):
            text += f"; extend: {ext['command']}"
        elif ext.get("possible") is False:
            text += "; it cannot be extended (the GPUs are booked after it)"
        return text
    if ev.name == ENDED:
        return f"booking {rid} on {_gpus(r)} has ended"
    if ev.name == CHANGED:
        c = f["change"]
        why = f": {safe(c['reason'])}" if c.get("reason") else ""
        if c["kind"] == "cancelled" and c.get("by_uid") == r.uid:
            return f"booking {rid} ({_gpus(r)}) was ended by your worker{why}"
        if c["kind"] == "cancelled":
            return f"booking {rid} ({at(r.start)}, {_gpus(r)}) was cancelled by the administrator{why}"
        if c["kind"] == "maintenance":
            w = c["window"]
            return (f"maintenance from {_at_iso(w['start'], tz, now)} to {_at_iso(w['end'], tz, now)} "
                    f"overlaps booking {rid} ({_gpus(r)}){why}")
        return (f"booking {rid} was changed by {safe(c.get('by') or 'the administrator')}: now "
                f"{timegrid.format_span(r.start, r.end, tz, now)} on {_gpus(r)}")
    if ev.name == MOVED_EARLIER:
        m = f["moved"]
        return (f"booking {rid} moved earlier: it now starts {_at_iso(m['to'], tz, now)} "
                f"(was {_at_iso(m['from'], tz, now)}) on {_gpus(r)}")
    if ev.name == CAN_START_EARLIER:
        e = f["earlier"]
        return (f"booking {rid} can start earlier, at {_at_iso(e['start'], tz, now)} (a GPU freed; "
                f"it starts {at(r.start)}): {e['command']}")
    if ev.name == GPU_USED:
        parts = []
        for p in f["processes"][:5]:
            who = safe(p["user"] or (f"uid {p['uid']}" if p["uid"] is not None else "an unknown user"))
            parts.append(f"{who}'s {safe(p['label'] or 'process')} (pid {p['pid']}"
                         + (f", {p['mem_mib']} MiB" if p.get("mem_mib") else "") + ")")
        more = len(f["processes"]) - len(parts)
        return (f"GPU {f['gpu']} of your booking {rid} is in use by " + ", ".join(parts)
                + (f" and {more} more" if more > 0 else "") + " without a booking there")
    if ev.name == IDLE_NUDGE:
        i = f["idle"]
        held = " (memory held, no compute)" if i.get("state") == "idle-held" else ""
        return (f"booking {rid} on {_gpus(r)} has been idle for {i['minutes']} min{held}; "
                f"if you are done: bk d {rid}")
    raise ValueError(f"unknown event {ev.name!r}")


def _at_iso(text: str, tz, now: int) -> str:
    from bk.core import timegrid
    from bk.core.models import parse_iso

    return timegrid.format_local_short(parse_iso(text), tz, now)


def title(ev: Event) -> str:
    """A short heading for pop-ups, mail subjects and chat messages."""
    return {STARTS_SOON: "booking starts soon", STARTED: "booking started", ENDS_SOON: "booking ends soon",
            ENDED: "booking ended", CHANGED: "booking changed", MOVED_EARLIER: "booking moved earlier",
            CAN_START_EARLIER: "booking can start earlier", GPU_USED: "someone uses your GPU",
            IDLE_NUDGE: "booking idle", TEST: "test"}.get(ev.name, ev.name)


def to_json(ev: Event, text: str, *, host: str | None = None, sent_at: int | None = None) -> dict:
    """The ``gpubk.event.v1`` document: the webhook's body (preset json),
    an email's attachment, ``bk notify log --json``."""
    r = ev.booking
    doc = {"schema": SCHEMA, "id": ev.key, "event": ev.name, "title": title(ev), "text": text,
           "due": iso(ev.due), "sent_at": iso(sent_at), "host": host, "uid": ev.uid, "user": ev.user,
           "booking": None if r is None else {
               "id": r.id, "short_id": r.short_id, "gpus": list(r.gpus), "mode": r.mode,
               "start": iso(r.start), "end": iso(r.end)}}
    doc.update(ev.fields)
    return doc


def webhook_body(preset: str, doc: dict, topic: str | None = None) -> dict:
    """The JSON a webhook preset posts: the event itself (json), Slack's and
    a Matrix hook's ``text`` message, or ntfy's JSON publish (to the
    server's root, with the topic from the URL's path)."""
    line = f"bk: {doc['text']}"
    if preset == "json":
        return doc
    if preset == "slack":
        return {"text": line}
    if preset == "matrix":
        return {"text": line, "msgtype": "m.notice", "username": "bk"}
    if preset == "ntfy":
        urgent = doc["event"] in (ENDS_SOON, CHANGED, GPU_USED)
        return {"topic": topic, "title": f"bk: {doc['title']}", "message": doc["text"],
                "priority": 4 if urgent else 3, "tags": ["bk", doc["event"]]}
    raise ValueError(f"unknown preset {preset!r}")


# ------------------------------------------------------------ choices

_EMAIL = Pattern(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                 r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
_QUIET = Pattern(r"([01]?\d|2[0-3]):([0-5]\d)-([01]?\d|2[0-3]):([0-5]\d)")
HOST_NAME = Pattern(r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}"
                    r"[A-Za-z0-9])?)*\.?")


class Invalid(ValueError):
    """A choice that cannot be used; ``str()`` says why, ``hint`` how to fix it."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


def check_names(values, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    """A list of event or channel names, each known; duplicates dropped, order kept."""
    if isinstance(values, str) or not isinstance(values, (list, tuple)):
        raise Invalid(f"{what}s must be a list of names", hint="one of: " + ", ".join(allowed))
    out = []
    for v in values:
        if not isinstance(v, str) or v not in allowed:
            import difflib

            close = difflib.get_close_matches(str(v), allowed, n=1)
            raise Invalid(f"unknown {what} {str(v)[:40]!r}",
                          hint=(f"did you mean {close[0]}? " if close else "") + "known: " + ", ".join(allowed))
        if v not in out:
            out.append(v)
    return tuple(out)


def check_minutes(values, what: str) -> tuple[int, ...]:
    if isinstance(values, (str, bool)) or not isinstance(values, (list, tuple)) or not values:
        raise Invalid(f"{what} must be a list of minutes, e.g. 30,15,5")
    out = set()
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_MINUTES:
            raise Invalid(f"{v!r} is not a whole number of minutes from 1 to {MAX_MINUTES}")
        out.add(v)
    return tuple(sorted(out, reverse=True))


def parse_quiet(text) -> tuple[int, int] | None:
    """``"22:00-07:00"`` -> (start, end) minutes of the local day; ``"off"`` -> None."""
    if text is None or text == "off":
        return None
    m = _QUIET.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise Invalid(f"quiet hours {str(text)[:40]!r} are not HH:MM-HH:MM", hint="e.g. 22:00-07:00, or off")
    a, b = int(m[1]) * 60 + int(m[2]), int(m[3]) * 60 + int(m[4])
    if a == b:
        raise Invalid("quiet hours that start and end at the same minute are empty", hint="e.g. 22:00-07:00")
    return a, b


def is_quiet(quiet: tuple[int, int] | None, t: int, tz) -> bool:
    """Whether local time ``t`` falls in the quiet hours (which may wrap midnight)."""
    if quiet is None:
        return False
    from datetime import datetime

    dt = datetime.fromtimestamp(t, tz)
    m = dt.hour * 60 + dt.minute
    a, b = quiet
    return a <= m < b if a < b else (m >= a or m < b)


def check_email(text) -> str:
    if not isinstance(text, str) or len(text) > 254 or not _EMAIL.fullmatch(text):
        from bk.core.safetext import safe

        raise Invalid(f"{safe(str(text)[:60])!r} is not an email address bk can send to",
                      hint="write it as name@example.org (no spaces, no display name)")
    return text


def is_ip(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def address_allowed(addr: str, allow_private: bool) -> str | None:
    """Why a webhook may not connect to ``addr`` (an IP address as text),
    or None when it may.  Only globally routable unicast addresses are
    allowed unless the administrator allows private ones; an IPv4 address
    mapped into IPv6 is judged as the IPv4 address it is."""
    import ipaddress

    try:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return f"{addr}, not an IP address"
    if getattr(ip, "ipv4_mapped", None) is not None:
        ip = ip.ipv4_mapped
    if ip.is_multicast or ip.is_unspecified:
        return f"{ip}, a multicast or unspecified address"
    if allow_private:
        return None
    if ip.is_loopback:
        return f"{ip}, a loopback address (this machine)"
    if ip.is_link_local:
        return f"{ip}, a link-local address"
    if not ip.is_global:
        return f"{ip}, a private or reserved address"
    return None


def topic_of(path: str) -> str:
    """ntfy: the topic is the URL's path (``/mytopic``)."""
    topic = path.split("?", 1)[0].strip("/")
    if not topic or "/" in topic:
        raise Invalid("an ntfy URL names one topic: https://ntfy.sh/TOPIC")
    return topic
