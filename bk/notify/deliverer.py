"""The deliverer: one per user, inside the user's worker, running as the user.

It wakes for the next due event (a timer to that instant, never a minute
tick), or at most every ``POLL_S`` to notice what changed (a ``stat`` of
the ledger, the preferences and, while a booking of the user runs, the
monitor's snapshot).  Which events exist, and whether one still holds, the
host says (``bk.service.notify.Host``): this module does the timing, the
delivery log and the channels.

The delivery protocol, per event (the names are the crash-test steps of
``BK_TEST_NOTIFY_CRASH``):

  1. ``claimed``  the event's entry, every chosen channel ``claimed``, is
                  written to the delivery log (atomic replace, fsync): from
                  here the event is taken, and no restart delivers it anew.
  2. ``sent``     the terminal line and the pop-up are written, and their
                  outcome recorded.
  3.              email and webhook are handed to their own threads, which
                  send with a timeout and record ``sent``, ``retry`` (with
                  the time of the next try) or ``failed``.

After a crash, what the log says decides:

* terminal, desktop: **at most once**.  An entry still ``claimed`` means the
  crash came between 1 and the end of 2; the line may or may not have been
  written, and writing it again could show it twice, so it is recorded as
  ``unknown`` and not repeated.  The window is the few microseconds of the
  ``write(2)`` calls.
* email, webhook: **at least once**.  An entry ``claimed`` or ``retry`` is
  sent (again) after a restart: the relay or the server may have accepted
  it just before the crash.  Every try of one event carries the same id
  (``Message-ID``, ``X-Bk-Event-Id``/``Idempotency-Key``), so a receiver can
  drop the duplicate.

Tries of email and webhook are bounded: at most ``MAX_TRIES``, after
``BACKOFF_S`` seconds each, and never once the event's window closed.  A
channel that hangs delays only its own thread, never the terminal line,
another channel or anybody's booking (bookings are made by other
processes, and no booking waits for a notification).
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections.abc import Callable

from bk.core import notify as N
from bk.core.errors import BkError
from bk.notify import terminals
from bk.notify.mail import ChannelError

POLL_S = 1.0
MAX_TRIES = 4
BACKOFF_S = (10, 60, 300)
REMOTE = (N.EMAIL, N.WEBHOOK)
CRASH_ENV = "BK_TEST_NOTIFY_CRASH"


def _crash_at(step: str) -> None:
    if os.environ.get(CRASH_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


class Deliverer:
    """``host`` (``bk.service.notify.Host``) gives the events and the
    preferences; ``log`` is the user's ``DeliveryLog``; ``senders`` maps
    email and webhook to ``(entry doc, prefs) -> detail`` that raise
    ``ChannelError``; ``local`` writes the terminals."""

    def __init__(self, host, log, *, senders: dict, local: Callable | None = None,
                 say: Callable[[str], None] = lambda line: None, poll_s: float = POLL_S):
        self.host, self.dlog, self.senders = host, log, senders
        self.local = local or terminals.deliver
        self.say = say
        self.poll_s = poll_s
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._doc = {"entries": {}, "health": {}}
        self._queues: dict[str, queue.Queue] = {}
        self._queued: set = set()                 # (key, channel) handed to a thread, not yet done
        self._threads: list[threading.Thread] = []
        self.delivered = 0                        # events taken (for tests and benchmarks)

    # -- the log -------------------------------------------------------------

    def _update(self, change) -> None:
        with self._lock:
            self._doc = self.dlog.update(change, now=self.host.now())

    def _entry(self, key: str) -> dict | None:
        with self._lock:
            e = self._doc["entries"].get(key)
            return None if e is None else {**e, "channels": dict(e["channels"])}

    def resume(self) -> None:
        """After a start: local channels a crash left ``claimed`` become
        ``unknown``; remote ones are sent (again) by their threads."""
        with self._lock:
            self._doc = self.dlog.read()

        def settle(doc):
            for e in doc["entries"].values():
                for ch, st in e["channels"].items():
                    if ch in N.LOCAL_CHANNELS and st.get("state") == "claimed":
                        st.update(state="unknown", detail="the deliverer stopped while writing it")
        if any(st.get("state") == "claimed" for e in self._doc["entries"].values()
               for ch, st in e["channels"].items() if ch in N.LOCAL_CHANNELS):
            self._update(settle)

    # -- the loop ------------------------------------------------------------

    def start_threads(self) -> None:
        for ch in REMOTE:
            q: queue.Queue = queue.Queue()
            self._queues[ch] = q
            t = threading.Thread(target=self._remote_loop, args=(ch, q), name=f"bk-notify-{ch}", daemon=True)
            t.start()
            self._threads.append(t)

    def tick(self) -> float:
        """Deliver what is due; returns the seconds until the next due instant
        (at most ``poll_s``)."""
        host = self.host
        host.refresh()
        now = host.now()
        prefs = host.prefs()
        nxt = now + self.poll_s
        with self._lock:
            known = set(self._doc["entries"])
        for ev in host.events(now):
            if ev.key in known or ev.name not in prefs.events:
                continue
            if ev.due > now:
                nxt = min(nxt, ev.due)
                continue
            if now < ev.expires:
                self.deliver(ev, now)
        nxt = min(nxt, self._requeue(now))
        return max(0.0, nxt - host.time())

    def run(self) -> None:
        self.resume()
        self.start_threads()
        while not self.stopping.is_set():
            try:
                delay = self.tick()
            except BkError as e:                     # a ledger being replaced, a full disk: next time
                self.say(f"notifications: {e.message}; trying again")
                delay = self.poll_s
            except Exception as e:                   # a bug: said, and the loop goes on
                self.say(f"notifications: {type(e).__name__}: {e}; trying again")
                delay = self.poll_s
            self.stopping.wait(min(self.poll_s, max(0.01, delay)))

    def stop(self, grace: float = 2.0) -> None:
        self.stopping.set()
        for q in self._queues.values():
            q.put(None)
        deadline = time.monotonic() + grace
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    # -- one event -----------------------------------------------------------

    def deliver(self, ev: N.Event, now: int) -> bool:
        """Send one due event on every chosen channel; False when it no
        longer holds (the booking was cancelled or edited meanwhile)."""
        host = self.host
        ev = host.confirm(ev, now)
        if ev is None:
            return False
        prefs = host.prefs()
        text = host.render(ev, now)
        doc = host.doc(ev, text, now)
        quiet = N.is_quiet(prefs.quiet, now, host.tz)
        chans = {}
        for ch in prefs.channels:
            if quiet and ch in N.QUIET_HELD:
                chans[ch] = {"state": "quiet", "at": now}
            elif ch == N.EMAIL and not prefs.email:
                chans[ch] = {"state": "skipped", "detail": "no email address (bk notify set --email ADDR)"}
            elif ch == N.EMAIL and not host.relay_set():
                chans[ch] = {"state": "skipped", "detail": "the administrator has set no mail relay"}
            elif ch == N.WEBHOOK and not prefs.webhook:
                chans[ch] = {"state": "skipped", "detail": "no webhook URL (bk notify set --webhook URL)"}
            else:
                chans[ch] = {"state": "claimed", "tries": 0}
        entry = {"event": ev.name, "due": ev.due, "expires": ev.expires, "created": now,
                 "booking": ev.booking.id if ev.booking is not None else None, "doc": doc, "channels": chans}

        def claim(d):
            d["entries"][ev.key] = entry
        self._update(claim)
        self.delivered += 1
        _crash_at("claimed")
        want_line = chans.get(N.TERMINAL, {}).get("state") == "claimed"
        want_pop = chans.get(N.DESKTOP, {}).get("state") == "claimed"
        if want_line or want_pop:
            outcomes = self.local(host.uid, text, doc["title"], host=doc.get("host") or "",
                                  when=host.clock_text(now), desktop_mode=prefs.desktop,
                                  want_line=want_line, want_desktop=want_pop)
            states = _local_states(outcomes, want_line, want_pop)

            def record(d):
                e = d["entries"].get(ev.key)
                if e is not None:
                    for ch, st in states.items():
                        e["channels"][ch] = {**st, "at": now}
            self._update(record)
            if want_line:
                self.say(f"notified {ev.name} ({ev.key}): {states[N.TERMINAL]['detail']}")
        _crash_at("sent")
        for ch in REMOTE:
            if chans.get(ch, {}).get("state") == "claimed":
                self._hand(ev.key, ch)
        return True

    # -- email and webhook ---------------------------------------------------

    def _hand(self, key: str, ch: str) -> None:
        q = self._queues.get(ch)
        if q is None or (key, ch) in self._queued:
            return
        self._queued.add((key, ch))
        q.put(key)

    def _requeue(self, now: int) -> int:
        """Hand every remote delivery that is due (claimed after a restart,
        or a retry whose time came) to its thread; returns the next retry time."""
        nxt = now + 3600
        with self._lock:
            entries = list(self._doc["entries"].items())
        for key, e in entries:
            for ch in REMOTE:
                st = e["channels"].get(ch)
                if st is None or st.get("state") not in ("claimed", "retry"):
                    continue
                at = st.get("next") or 0
                if at <= now:
                    self._hand(key, ch)
                else:
                    nxt = min(nxt, at)
        return nxt

    def _remote_loop(self, ch: str, q: queue.Queue) -> None:
        while True:
            key = q.get()
            if key is None:
                return
            try:
                self._remote_once(ch, key)
            except Exception as e:       # a bug in one delivery must not end the channel
                self.say(f"notifications: {ch} delivery of {key} failed: {type(e).__name__}: {e}")
            finally:
                self._queued.discard((key, ch))

    def _remote_once(self, ch: str, key: str) -> None:
        e = self._entry(key)
        if e is None:
            return
        st = e["channels"].get(ch) or {}
        if st.get("state") not in ("claimed", "retry"):
            return
        now = self.host.now()
        tries = int(st.get("tries") or 0)
        if now >= max(e["expires"], e["due"] + 600):
            self._set(key, ch, {"state": "expired", "tries": tries, "at": now,
                                "detail": "its time passed before it could be sent"}, ok=None)
            return
        try:
            detail = self.senders[ch](e["doc"], self.host.prefs())
        except ChannelError as err:
            tries += 1
            final = err.permanent or tries >= MAX_TRIES
            later = now + BACKOFF_S[min(tries - 1, len(BACKOFF_S) - 1)]
            if not final and later >= max(e["expires"], e["due"] + 600):
                final = True
            new = {"state": "failed" if final else "retry", "tries": tries, "at": now, "detail": str(err)}
            if not final:
                new["next"] = later
            self.say(f"notifications: {ch} for {key}: {err}" + ("" if final else f"; retry in {later - now} s"))
            self._set(key, ch, new, ok=False, error=str(err))
            return
        self._set(key, ch, {"state": "sent", "tries": tries + 1, "at": now, "detail": detail}, ok=True)

    def _set(self, key: str, ch: str, st: dict, *, ok: bool | None, error: str | None = None) -> None:
        now = self.host.now()

        def change(d):
            e = d["entries"].get(key)
            if e is not None:
                e["channels"][ch] = st
            if ok is not None:
                record_health(d, ch, ok, now, error)
        self._update(change)


def record_health(doc: dict, ch: str, ok: bool, now: int, error: str | None = None) -> None:
    """A channel's health in the log: the last success, the last failure and
    how many deliveries in a row failed (``bk doctor`` reads it)."""
    h = doc.setdefault("health", {}).setdefault(ch, {})
    if ok:
        h.update(last_ok=now, failures=0)
    else:
        h.update(last_failure=now, failures=int(h.get("failures") or 0) + 1, error=(error or "")[:300])


def _local_states(outcomes: list, want_line: bool, want_pop: bool) -> dict:
    """What the terminal writes came to, per local channel."""
    sent = [o for o in outcomes if o.status == "sent"]
    skipped = sorted({f"{o.path}: {o.status}" for o in outcomes if o.status != "sent"})
    out = {}
    if want_line:
        if sent:
            detail = f"written to {', '.join(o.path for o in sent)}"
        else:
            detail = "no terminal of yours takes messages" if outcomes else "you have no terminal open"
        if skipped:
            detail += "; not to " + ", ".join(skipped)
        out[N.TERMINAL] = {"state": "sent" if sent else "none", "detail": detail,
                           "terminals": [o.path for o in sent]}
    if want_pop:
        pops = [o for o in sent if o.desktop]
        out[N.DESKTOP] = {"state": "sent" if pops else "none",
                          "detail": (f"shown through {', '.join(f'{o.path} ({o.desktop})' for o in pops)}"
                                     if pops else "no terminal known to show pop-ups")}
    return out
