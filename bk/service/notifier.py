"""The deliverer's host: what ``bk.notify.deliverer.Deliverer`` needs from bk.

Who delivers what, and why (docs/ARCHITECTURE.md says the same): every
event goes to a user from that user's own deliverer, a thread of the
user's worker (``bk w``), running as the user.  Only a process of the user
may write to the user's terminals without privilege (they are 0620, the
group ``tty``), and only the user's own process may read the private
preferences (email address, webhook URL).  The daemons that see the whole
server deliver nothing: the broker commits the ledger (cancellations,
edits, maintenance windows, with who did them), the monitor publishes
the snapshot (whose process runs where) and, with issue 25, each booking's
activity; all of it is world-readable, so each user's deliverer derives its
own events from it (``bk.core.notify``).  A system-wide deliverer would
need root to reach every terminal and would have to hold every user's
addresses; this one needs nothing but the user's own rights.

Each call re-reads only what changed: a ``stat`` of the ledger, the
preferences and (only while a booking of the user runs) the monitor's
snapshot.  The scheduler's questions (can this booking be extended by an
hour? can this queued one start earlier?) are asked of the same
``apply_edit`` a real ``bk e`` runs, as a dry run on the committed ledger
in this process: no broker request, no lock, nothing that could slow
anybody's booking.
"""

from __future__ import annotations

import os
import shlex
import socket
import threading
import time

from bk.core import notify as N
from bk.core.errors import BkError, Busy, Conflict, InvalidInput, PolicyRefused
from bk.core.record import replace
from bk.service.notify import effective, load, log_dir, prefs_path, relay_of, senders


class Host:
    def __init__(self, app, *, clock_fn=None, time_fn=None, say=lambda line: None):
        self.app = app
        self.uid, self.user = app.actor.uid, app.actor.user
        self.settings = app.settings
        # The service's clock and zone: those of the environment it was
        # opened with (a deliverer in the worker keeps the worker's).
        self._clock = clock_fn or app.now_fn
        if time_fn is None:
            time_fn = (lambda: float(self._clock())) if clock_fn is not None else time.time
        self.time = time_fn
        self.tz = app.zone()
        self.say = say
        self.hostname = socket.gethostname()
        self.path = prefs_path(app.settings)
        self._prefs = effective({}, app.settings, self.user)
        self._prefs_stamp: object = ()
        self._ledger_stamp: object = ()
        self._state = None
        self._snap_stamp: object = ()
        self._snap = None                # (Snapshot, interval_s) as last read
        self._activity: dict = {}
        self._earlier: list = []
        self._base: tuple = (None, [])
        self._generation = 0             # grows when the ledger or the choices were read again
        key = app.settings.values.get("idle_nudge_minutes")       # issue 25's key, when it lands
        self.idle_minutes = tuple(key) if isinstance(key, list) and key else N.DEFAULT_IDLE_MINUTES

    # -- the clock and the settings -----------------------------------------

    def now(self) -> int:
        return self._clock()

    def clock_text(self, now: int) -> str:
        from bk.core.timegrid import format_local_short

        return format_local_short(now, self.tz, now)

    def prefs(self):
        return self._prefs

    def relay_set(self) -> bool:
        return relay_of(self.settings) is not None

    def _call(self, now: int):
        call = self.app.call()
        return replace(call, now=now) if call.now != now else call

    # -- what changed ---------------------------------------------------------

    def refresh(self) -> None:
        from bk.notify.files import prefs_stamp

        now = self.now()
        stamp = prefs_stamp(self.path)
        if stamp != self._prefs_stamp:
            self._prefs_stamp = stamp
            self._generation += 1
            try:
                self._prefs = load(self.app)[1]
            except BkError as e:
                self.say(f"notifications: {e.message}; using the defaults until it is fixed")
                self._prefs = effective({}, self.settings, self.user)
        stamp = _stat(self.app.store.paths.ledger)
        if stamp is None or stamp != self._ledger_stamp or self._state is None:
            self._state = self.app.ledger(call=self._call(now))
            self._ledger_stamp = stamp
            self._generation += 1
            self._earlier = self._earlier_events(now)
        self._read_snapshot(now)

    def _read_snapshot(self, now: int) -> None:
        from bk.store import snapshot as files

        if not any(r.uid == self.uid and r.cancelled_at is None and r.start <= now < r.end
                   for r in self._state.reservations):
            self._snap, self._activity = None, {}
            return
        directory = files.monitor_dir(self.settings)
        stamp = _stat(os.path.join(directory, files.SNAPSHOT_FILE))
        if stamp != self._snap_stamp:
            self._snap_stamp = stamp
            self._snap, self._activity = None, {}
            doc = files.read_snapshot_doc(directory, owner=files.monitor_owner(self.settings))
            if doc is not None:
                try:
                    got = files.parse_snapshot(doc)
                except (ValueError, TypeError, KeyError, AttributeError):
                    return
                self._snap = (got.snapshot, got.interval_s)
                self._activity = activity_by_booking(got.activity)
        if self._snap is not None and not files.fresh(self._snap[0].taken_at, now, self._snap[1]):
            self._snap, self._activity = None, {}

    # -- the events -----------------------------------------------------------

    def events(self, now: int) -> list:
        if self._state is None:
            return []
        rs = self._state.reservations
        # The ledger's events change only with the ledger or the choices:
        # computed once per change, then only filtered by the clock (every
        # rule keeps an event exactly while ``now < expires``).
        key = self._generation
        if self._base[0] != key:
            base = N.timed(rs, self.uid, self._prefs.timing(), now)
            base += N.changes(rs, self.uid, now, blackouts=self._state.blackouts, notices=self._state.notices)
            self._base = (key, base)
        out = [e for e in self._base[1] if e.expires > now]
        if self._snap is not None:
            out += N.intrusions(self._snap[0], rs, self.uid, now)
        if self._activity:
            out += N.idle_nudges(rs, self.uid, self._activity, now, self.idle_minutes)
        out += [e for e in self._earlier if e.expires > now]
        return out

    def confirm(self, ev, now: int):
        """The event as the state is now, or None when it no longer holds (a
        cancelled or edited booking has other keys, or none)."""
        self.refresh()
        cur = next((e for e in self.events(now) if e.key == ev.key), None)
        if cur is None:
            return None
        if cur.name == N.ENDS_SOON:
            cur = cur.with_fields(extend=self._extension(cur.booking, now))
        return cur

    def render(self, ev, now: int) -> str:
        return N.render(ev, self.tz, now)

    def doc(self, ev, text: str, now: int) -> dict:
        return N.to_json(ev, text, host=self.hostname, sent_at=now)

    # -- the scheduler's answers ---------------------------------------------

    def _extension(self, r, now: int) -> dict:
        """Whether ``bk e ID -d +1h`` would be accepted now: the edit itself,
        as a dry run on the committed ledger."""
        from bk.service.booking import apply_edit
        from bk.service.requests import EditRequest

        command = f"bk e {r.short_id} -d +1h"
        try:
            apply_edit(self._state.copy(), EditRequest(r.id, end=r.end + N.EXTEND_BY_S, dry_run=True),
                       self._call(now))
        except (Conflict, PolicyRefused, InvalidInput) as e:
            return {"possible": False, "command": command, "why": e.message}
        except BkError as e:
            return {"possible": None, "command": command, "why": e.message}
        return {"possible": True, "command": command}

    def _earlier_events(self, now: int) -> list:
        """Queued bookings of the user (placed later than asked: the booking
        records ``queued_from``) that the ledger now lets start earlier."""
        from bk.core.timegrid import floor_slice, format_local, format_local_short
        from bk.service.booking import apply_edit
        from bk.service.requests import EditRequest

        out = []
        slot = self.app.policy.slot_minutes
        for r in self._state.reservations:
            if r.uid != self.uid or r.cancelled_at is not None or r.start <= now or "queued_from" not in r.extra:
                continue
            # Never earlier than it asked for: a booking asked for 09:00 and
            # queued to 10:00 is told when 09:00 frees, not that 08:00 was free.
            asked = _epoch(r.extra["queued_from"])
            start = floor_slice(now, slot)
            start = max(start, asked - asked % (slot * 60)) if asked is not None else start
            try:
                m = apply_edit(self._state.copy(), EditRequest(r.id, start=start, queue=True, excluded=(),
                                                               dry_run=True), self._call(now))
            except BkError:
                continue
            new = m.result.reservation
            if new.start >= r.start:
                continue
            if new.start == floor_slice(now, slot):
                when = "now"
            elif format_local_short(new.start, self.tz, now) == format_local_short(new.start, self.tz, new.start):
                when = format_local_short(new.start, self.tz, now, mark_fold=False)
            else:
                when = format_local(new.start, self.tz)
            cmd = f"bk e {r.short_id} -t {shlex.quote(when)}"
            if sorted(new.gpus) != sorted(r.gpus):
                cmd += " -g " + ",".join(map(str, sorted(new.gpus)))
            out.append(N.earlier(r, new.start, new.gpus, cmd, now))
        return out


def _stat(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _epoch(text) -> int | None:
    from bk.core.models import parse_iso

    try:
        return parse_iso(text) if isinstance(text, str) else None
    except ValueError:
        return None


def activity_by_booking(act: dict | None) -> dict:
    """The snapshot's ``activity`` (``bk.core.activity.Tracker.doc``: a
    list of bookings, each with its id, state and idle streak) by booking id."""
    rows = act.get("bookings") if isinstance(act, dict) else None
    out = {}
    for row in rows if isinstance(rows, list) else ():
        if isinstance(row, dict) and isinstance(row.get("reservation"), str):
            got = _activity(row)
            if got is not None:
                out[row["reservation"]] = got
    return out


def _activity(v) -> dict | None:
    """One booking's activity as the monitor publishes it (issue 25): a
    state and the instant it became idle, ISO or epoch seconds."""
    if not isinstance(v, dict):
        return None
    since = v.get("idle_since")
    if isinstance(since, str):
        from bk.core.models import parse_iso

        try:
            since = parse_iso(since)
        except ValueError:
            since = None
    got = {"state": v.get("state"), "idle_since": since if isinstance(since, int) else None}
    nudges = v.get("nudges")
    if isinstance(nudges, list):
        # The thresholds the monitor has judged reached (its idle clock, not the wall's).
        got["nudges"] = [m for m in nudges if isinstance(m, int) and not isinstance(m, bool)]
    return got


# ------------------------------------------------------------ running it

class Running:
    """A deliverer thread with its lease; ``stop()`` ends both."""

    def __init__(self, deliverer, thread: threading.Thread, lease):
        self.deliverer, self.thread, self.lease = deliverer, thread, lease

    def stop(self, grace: float = 2.0) -> None:
        self.deliverer.stop(grace)
        self.thread.join(grace)
        self.lease.__exit__()


def start(env: dict, *, say, clock_fn=None, app=None) -> Running | None:
    """Start the user's deliverer in a thread of this process (the worker),
    with its own service (nothing shared with the worker's loop).  None
    when another deliverer already runs for the user (said once)."""
    from bk.notify.deliverer import Deliverer
    from bk.notify.files import DeliveryLog, Lease
    from bk.service import open_app

    app = app or open_app(env, clock_fn=clock_fn)
    if clock_fn is None and env.get("BK_NOW"):      # a fixed clock: its seconds, not the system's
        clock_fn = app.now_fn
    host = Host(app, clock_fn=clock_fn, say=say)
    lease = Lease(log_dir(app.settings), now=host.now(), owner="worker")
    try:
        lease.__enter__()
    except Busy as e:
        say(f"notifications: {e.message}; this worker delivers none")
        return None
    d = Deliverer(host, DeliveryLog(log_dir(app.settings)), senders=senders(app.settings), say=say)
    t = threading.Thread(target=d.run, name="bk-notify", daemon=True)
    t.start()
    say(f"notifications: delivering to you (settings: {host.path})")
    return Running(d, t, lease)
