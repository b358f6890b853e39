"""Notifications (issue 26): the event rules, the deliverer's timing and log,
the channels' guards, the settings' checks.  In-process with a fake clock;
the terminals, SMTP relay and webhook are real (a pty, a socketserver
relay, an http.server) where the test is about them.  The whole path
through bk.pyz with real users is tests/test_notify_e2e.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers_broker import poll
from helpers_notify import HookCapture, SmtpSink

from bk.core import notify as N
from bk.core.errors import InvalidInput
from bk.core.models import Blackout, Edit, GpuInfo, GpuProcess, Reservation
from bk.core.telemetry import Snapshot
from bk.service.context import Actor

T0 = 1_800_000_000 - 1_800_000_000 % 3600        # an hour boundary, UTC
ADA, BOB = Actor(1000, "ada"), Actor(2000, "bob")
ROOT = Path(__file__).resolve().parent.parent


def hm(t: int) -> str:
    from bk import clock
    from bk.core.timegrid import format_local_short

    return format_local_short(t, clock.local_tz(), t)


def res(rid="a" * 8, uid=1000, start=T0 + 3600, end=T0 + 7200, created=T0, gpus=(0,), **kw) -> Reservation:
    rid = rid + "-0000-4000-8000-" + "0" * 12 if len(rid) == 8 else rid
    return Reservation(rid, uid, {1000: "ada", 2000: "bob"}.get(uid, "x"), kw.pop("mode", "shared"), gpus, 1,
                       start, end, created, **kw)


# ------------------------------------------------------------ the rules (pure)

def test_a_booking_gives_its_clock_events_with_keys_a_restart_computes_again():
    r = res()
    evs = N.timed([r], 1000, N.Timing(), T0)
    got = {(e.name, e.fields.get("minutes"), e.due - r.start if e.name in ("starts_soon", "started")
            else e.due - r.end) for e in evs}
    assert got == {("starts_soon", 10, -600), ("started", None, 0), ("ends_soon", 30, -1800),
                   ("ends_soon", 15, -900), ("ends_soon", 5, -300), ("ended", None, 0)}
    again = {e.key for e in N.timed([r], 1000, N.Timing(), T0 + 5)}
    assert again == {e.key for e in evs}
    fifteen = next(e for e in evs if e.fields.get("minutes") == 15)
    assert fifteen.key == f"{r.id}:ends_soon-15:{r.end - 900}"
    assert fifteen.expires == r.end - 300              # stale once the 5-minute warning is due
    assert N.timed([r], 2000, N.Timing(), T0) == []     # someone else's booking: nothing for bob


def test_no_event_for_a_window_cancelled_or_edited_away():
    r = res()
    assert N.timed([r.replace(cancelled_at=T0 + 10, cancelled_by=1000)], 1000, N.Timing(), T0 + 20) == []
    before = {e.key for e in N.timed([r], 1000, N.Timing(), T0)}
    longer = {e.key for e in N.timed([r.replace(end=r.end + 1800)], 1000, N.Timing(), T0)}
    moved = before - longer
    assert {k.split(":")[1] for k in moved} == {"ends_soon-30", "ends_soon-15", "ends_soon-5", "ended"}
    # A booking made when it starts: no "starts in 10 min", no "it has started".
    now_made = res(start=T0, created=T0 + 30)
    assert {e.name for e in N.timed([now_made], 1000, N.Timing(), T0 + 30)} == {"ends_soon", "ended"}
    # A short booking gets only the warnings that fall inside it.
    short = res(end=T0 + 3600 + 1200)
    assert sorted(e.fields["minutes"] for e in N.timed([short], 1000, N.Timing(), T0)
                  if e.name == "ends_soon") == [5, 15]


def test_what_others_did_to_a_booking():
    cancelled = res("c" * 8, cancelled_at=T0 + 100, cancelled_by=0, cancel_reason="disk swap")
    edited = res("e" * 8, edits=[Edit(T0 + 50, 0, "root", {"end": T0 + 7200}, {"end": T0 + 5400})])
    moved = res("m" * 8, edits=[Edit(T0 + 60, 0, "root", {"start": T0 + 7200}, {"start": T0 + 3600})])
    mine = res("f" * 8, edits=[Edit(T0 + 70, 1000, "ada", {"end": T0 + 7200}, {"end": T0 + 9000})])
    kept = res("k" * 8)
    window = Blackout("b" * 8 + "-0000-4000-8000-" + "0" * 12, T0 + 5000, T0 + 9000, "power work", 0)
    evs = N.changes([cancelled, edited, moved, mine, kept], 1000, T0 + 200, blackouts=[window])
    kinds = {(e.booking.short_id, e.name, e.fields.get("change", {}).get("kind")) for e in evs}
    assert ("cccccccc", "changed", "cancelled") in kinds
    assert ("eeeeeeee", "changed", "edited") in kinds
    assert ("mmmmmmmm", "moved_earlier", None) in kinds
    assert not any(k[0] == "ffffffff" and k[2] == "edited" for k in kinds)    # my own edit: not news
    assert ("kkkkkkkk", "changed", "maintenance") in kinds
    # A day later the change is no longer told.
    assert not any(e.booking.short_id == "cccccccc" for e in N.changes([cancelled], 1000, T0 + 100 + 86400))


def _snap(procs_by_gpu: dict) -> Snapshot:
    return Snapshot(T0 + 4000, "sim", tuple(GpuInfo(g, f"GPU-{g}", "sim", 1000, 0, 0, None, list(ps))
                                            for g, ps in procs_by_gpu.items()))


def test_someone_elses_process_on_my_gpu_is_told_once_with_owner_and_label():
    mine = res(start=T0, end=T0 + 7200, gpus=(0,))
    snap = _snap({0: [GpuProcess(4242, 900, 50, 2000, "bob", "train\x1b[2J.py", T0 + 3000),
                      GpuProcess(11, 100, 10, 1000, "ada", "python", T0)],
                  1: [GpuProcess(77, 100, 10, 2000, "bob", "python", T0)]})
    evs = N.intrusions(snap, [mine], 1000, T0 + 4000)
    assert len(evs) == 1 and evs[0].fields["gpu"] == 0
    p = evs[0].fields["processes"]
    assert [(x["pid"], x["uid"], x["user"]) for x in p] == [(4242, 2000, "bob")]
    text = N.render(evs[0], __import__("datetime").timezone.utc, T0 + 4000)
    assert "bob's train\\x1b[2J.py (pid 4242, 900 MiB)" in text and "\x1b" not in text
    assert N.intrusions(snap, [mine], 1000, T0 + 4100)[0].key == evs[0].key
    # Bob booked GPU 0 too (shared): his process is entitled to be there.
    bobs = res("b" * 8, uid=2000, start=T0, end=T0 + 7200, gpus=(0,))
    assert N.intrusions(snap, [mine, bobs], 1000, T0 + 4000) == []


def test_idle_nudges_follow_the_monitors_activity():
    r = res(start=T0, end=T0 + 4 * 3600)
    act = {r.id: {"state": "idle-held", "idle_since": T0 + 600}}
    evs = N.idle_nudges([r], 1000, act, T0 + 600 + 31 * 60)
    assert [(e.fields["idle"]["minutes"], e.due) for e in evs] == [(30, T0 + 600 + 1800), (45, T0 + 600 + 2700)]
    assert N.idle_nudges([r], 1000, {r.id: {"state": "active", "idle_since": None}}, T0 + 4000) == []


def test_idle_nudges_read_the_monitors_snapshot_activity_as_it_publishes_it():
    """The snapshot's ``activity`` is the monitor's ``Tracker.doc`` (a list of
    bookings, ISO times, the thresholds its idle clock reached): the deliverer
    reads that shape, and an ``unknown`` booking is never nudged."""
    from bk.core.models import iso
    from bk.service.notifier import activity_by_booking

    r = res(start=T0, end=T0 + 4 * 3600)
    row = {"reservation": r.id, "uid": 1000, "gpus": [0], "state": "idle-held", "reason": "memory, no compute",
           "idle_s": 1850, "idle_since": iso(T0 + 600), "nudges": [30], "release_after_s": None,
           "release_due": False, "evidence": {}}
    doc = {"v": 1, "interval_s": 2.0, "bookings": [row], "gpus": []}
    act = activity_by_booking(doc)
    assert act == {r.id: {"state": "idle-held", "idle_since": T0 + 600, "nudges": [30]}}
    evs = N.idle_nudges([r], 1000, act, T0 + 600 + 31 * 60)
    # Only the threshold the monitor's clock reached, not the 45 the wall clock would give later.
    assert [(e.fields["idle"]["minutes"], e.due) for e in evs] == [(30, T0 + 600 + 1800)]
    unknown = activity_by_booking({**doc, "bookings": [{**row, "state": "unknown"}]})
    assert N.idle_nudges([r], 1000, unknown, T0 + 600 + 31 * 60) == []
    assert activity_by_booking(None) == {} and activity_by_booking({"bookings": "x"}) == {}


def test_quiet_hours_and_choices():
    from datetime import timezone

    q = N.parse_quiet("22:00-07:00")
    day = T0 - T0 % 86400
    assert N.is_quiet(q, day + 23 * 3600, timezone.utc) and N.is_quiet(q, day + 3 * 3600, timezone.utc)
    assert not N.is_quiet(q, day + 12 * 3600, timezone.utc)
    for bad in ("22-7", "25:00-01:00", "10:00-10:00"):
        with pytest.raises(N.Invalid):
            N.parse_quiet(bad)
    with pytest.raises(N.Invalid, match="unknown event 'endd'") as e:
        N.check_names(["endd"], N.EVENTS, "event")
    assert e.value.hint.startswith("did you mean ended?")
    for bad in ("ada", "ada@", "a b@x.org", "ada@x.org\r\nBcc: eve@x.org"):
        with pytest.raises(N.Invalid):
            N.check_email(bad)


@pytest.mark.parametrize("addr,ok", [("93.184.216.34", True), ("2606:2800:220:1::1", True),
                                     ("127.0.0.1", False), ("::1", False), ("169.254.169.254", False),
                                     ("10.1.2.3", False), ("192.168.0.1", False), ("100.64.0.1", False),
                                     ("::ffff:127.0.0.1", False), ("fe80::1", False), ("fd00::1", False),
                                     ("0.0.0.0", False), ("224.0.0.1", False)])
def test_which_addresses_a_webhook_may_reach(addr, ok):
    assert (N.address_allowed(addr, False) is None) == ok
    if addr not in ("0.0.0.0", "224.0.0.1"):
        assert N.address_allowed(addr, True) is None        # the administrator allowed private ones


def test_every_event_renders_and_has_a_json_shape():
    from datetime import timezone

    r = res()
    evs = N.timed([r], 1000, N.Timing(), T0) + N.changes(
        [res(cancelled_at=T0, cancelled_by=0, cancel_reason="x")], 1000, T0)
    evs.append(N.earlier(r, T0 + 600, (1,), "bk e aaaaaaaa -t now", T0))
    for ev in evs:
        doc = N.to_json(ev, N.render(ev, timezone.utc, T0), host="h", sent_at=T0)
        assert doc["schema"] == N.SCHEMA and doc["event"] == ev.name and doc["id"] == ev.key
        json.dumps(doc)
        for preset in N.PRESETS:
            assert N.webhook_body(preset, doc, "t")


# ------------------------------------------------------------ the deliverer (in-process)

class World:
    """A private server in a temporary directory, the clock in a list, the
    service as ada or bob, and ada's deliverer with a recorded terminal."""

    def __init__(self, tmp: Path, gpus: int = 2, config: dict | None = None):
        self.tmp = tmp
        self.t = [T0]
        self.env = {"HOME": str(tmp), "BK_DATA_DIR": str(tmp / "data"), "BK_GPU_COUNT": str(gpus),
                    "XDG_CACHE_HOME": str(tmp / "cache"), "TZ": "UTC", "PATH": "/usr/bin:/bin"}
        if config:
            cfg = tmp / "config.json"
            cfg.write_text(json.dumps(config))
            self.env["BK_CONFIG_FILE"] = str(cfg)
        self.lines: list = []
        self.sent: dict = {"email": [], "webhook": []}

    def clock(self) -> int:
        return self.t[0]

    def app(self, actor=ADA):
        from bk.service import open_app

        env = dict(self.env)
        env.pop("BK_CONFIG_FILE", None)
        if "BK_CONFIG_FILE" in self.env:          # private mode reads the user's config file
            os.makedirs(self.tmp / "xdg" / "bk", exist_ok=True)
            (self.tmp / "xdg" / "bk" / "config.json").write_text(Path(self.env["BK_CONFIG_FILE"]).read_text())
            env["XDG_CONFIG_HOME"] = str(self.tmp / "xdg")
        return open_app(env, actor=actor, clock_fn=self.clock)

    def book(self, actor=ADA, **kw):
        from bk.service.requests import BookRequest

        a = self.app(actor)
        return a.run("book", BookRequest(**kw)).reservation

    def local(self, uid, text, title, **kw):
        from bk.notify.terminals import Outcome

        self.lines.append((self.t[0], text, kw["want_line"], kw["want_desktop"]))
        return [Outcome("/dev/pts/test", "sent")]

    def deliverer(self, actor=ADA, senders=None):
        from bk.notify.deliverer import Deliverer
        from bk.notify.files import DeliveryLog
        from bk.service import notifier, notify

        app = self.app(actor)
        host = notifier.Host(app, clock_fn=self.clock)
        d = Deliverer(host, DeliveryLog(notify.log_dir(app.settings)), local=self.local,
                      senders=senders or notify.senders(app.settings))
        d.resume()
        return d

    def at(self, t: int, d) -> list:
        self.t[0] = t
        before = len(self.lines)
        d.tick()
        return [x[1] for x in self.lines[before:]]


@pytest.fixture
def world(tmp_path):
    return World(tmp_path)


def test_each_event_is_delivered_at_its_instant_and_once(world):
    r = world.book(count=1, duration=3600, start=T0 + 3600)
    d = world.deliverer()
    assert world.at(r.start - 601, d) == []
    assert world.at(r.start - 600, d) == [f"booking {r.short_id} starts in 10 min ({hm(r.start)}) on GPU 0"]
    assert world.at(r.start - 599, d) == []                         # told once
    d2 = world.deliverer()                                          # a restart: the log remembers
    assert world.at(r.start - 300, d2) == []
    assert "has started" in world.at(r.start, d2)[0]
    line = world.at(r.end - 1800, d2)[0]
    assert "ends in 30 min" in line and f"extend: bk e {r.short_id} -d +1h" in line


def test_a_deliverer_down_at_the_due_time_tells_late_once_or_not_at_all(world):
    r = world.book(count=1, duration=3600, start=T0 + 3600)
    d = world.deliverer()
    world.at(r.end - 16 * 60, d)          # down from T-16 ...
    d = world.deliverer()
    out = world.at(r.end - 14 * 60, d)    # ... to T-14: the 15-minute warning, late, once
    assert [x for x in out if "ends in" in x] == [f"booking {r.short_id} ends in 15 min ({hm(r.end)}) on GPU 0: "
                                                  f"save your work; extend: bk e {r.short_id} -d +1h"]
    d = world.deliverer()
    assert world.at(r.end - 4 * 60, d)[0].startswith(f"booking {r.short_id} ends in 5 min")
    d = world.deliverer()                 # down past the end by more than half an hour: no stale "ended"
    assert world.at(r.end + 31 * 60, d) == []


def test_nothing_for_a_cancelled_or_moved_window(world):
    from bk.service.requests import CancelRequest, EditRequest

    r = world.book(count=1, duration=3600, start=T0 + 3600)
    d = world.deliverer()
    world.at(T0 + 60, d)
    app = world.app()
    app.run("edit", EditRequest(r.id, start=T0 + 7200))
    assert world.at(r.start - 600, d) == []                         # the old window's warning: gone
    assert f"starts in 10 min ({hm(T0 + 7200)})" in world.at(T0 + 7200 - 600, d)[0]
    app.run("cancel", CancelRequest(r.id))
    assert world.at(T0 + 7200, d) == []


def test_the_extend_command_is_offered_only_when_the_calendar_allows_it(tmp_path):
    w = World(tmp_path, gpus=1)
    r = w.book(count=1, duration=3600, start=T0 + 3600)
    w.book(BOB, count=1, duration=3600, start=T0 + 7200, mode="exclusive")   # right after, on the one GPU
    d = w.deliverer()
    w.at(r.start, d)
    line = w.at(r.end - 1800, d)[0]
    assert "cannot be extended" in line and "bk e" not in line


def test_a_queued_booking_hears_when_it_can_start_earlier_with_the_command_that_does_it(tmp_path):
    from bk.cli.app import run as cli
    from bk.service.requests import CancelRequest

    w = World(tmp_path, gpus=1)
    first = w.book(BOB, count=1, duration=3600, mode="exclusive")
    mine = w.book(count=1, duration=3600)                           # queued after bob's
    assert mine.start == first.end and mine.extra.get("queued_from")
    d = w.deliverer()
    assert not any("earlier" in x for x in w.at(T0 + 60, d))
    bob = w.app(BOB)
    bob.run("cancel", CancelRequest(first.id))
    line = next(x for x in w.at(T0 + 120, d) if "can start earlier" in x)
    cmd = line.rsplit(": ", 1)[1]
    assert cmd == f"bk e {mine.short_id} -t now"
    assert not any("earlier" in x for x in w.at(T0 + 180, d))      # told once
    # The command works as printed.
    import shlex

    env = {**w.env, "BK_NOW": str(T0 + 180)}
    assert cli(shlex.split(cmd)[1:], env, opener=lambda e: w.app()) == 0
    assert w.app().ledger().find(mine.id).start == T0


def test_email_and_webhook_retry_with_backoff_then_fail_and_doctor_says_so(world):
    from bk.notify.deliverer import BACKOFF_S, MAX_TRIES
    from bk.notify.mail import ChannelError
    from bk.service import notify

    calls = []

    def failing(doc, prefs):
        calls.append(world.t[0])
        raise ChannelError("HTTP 503 from the hook")
    (world.tmp / "data" / "state").mkdir(parents=True, exist_ok=True)
    app = world.app()
    from bk.notify.files import write_prefs

    write_prefs(notify.prefs_path(app.settings), {"channels": ["terminal", "webhook"],
                                                   "webhook": {"url": "https://hooks.example.org/x",
                                                               "preset": "json"}})
    r = world.book(count=1, duration=7200, start=T0 + 3600)
    d = world.deliverer(senders={"webhook": failing, "email": failing})
    d.start_threads()
    world.at(r.start - 600, d)
    poll(lambda: len(calls) == 1, 10, "the first try")
    t = r.start - 600
    for i in range(MAX_TRIES - 1):
        t += BACKOFF_S[min(i, len(BACKOFF_S) - 1)]
        world.at(t - 1, d)
        time.sleep(0.05)
        assert len(calls) == i + 1, "retried before its time"
        world.at(t, d)
        poll(lambda n=i + 2: len(calls) == n, 10, f"try {i + 2}")
    world.at(t + 100, d)
    time.sleep(0.05)
    assert len(calls) == MAX_TRIES                                   # bounded
    d.stop()
    log = json.loads((world.tmp / "data" / "state" / "notify" / "deliveries.json").read_text())
    st = next(e for e in log["entries"].values() if e["event"] == "starts_soon")["channels"]["webhook"]
    assert st["state"] == "failed" and st["tries"] == MAX_TRIES
    check = notify.doctor_check(app, app.call())
    assert check["status"] == "fail" and "webhook failed" in check["detail"] and "HTTP 503" in check["detail"]


def test_a_hanging_webhook_delays_neither_the_terminal_nor_a_booking(tmp_path):
    from bk.notify.files import write_prefs
    from bk.service import notify

    hook = HookCapture(hang=True)
    try:
        w = World(tmp_path, config={"notify_webhook_allow_private": True, "notify_timeout_seconds": 30})
        app = w.app()
        write_prefs(notify.prefs_path(app.settings), {"channels": ["terminal", "webhook"],
                                                       "webhook": {"url": hook.url, "preset": "json"}})
        r = w.book(count=1, duration=3600, start=T0 + 3600)
        d = w.deliverer()
        d.start_threads()
        w.at(r.start - 600, d)
        poll(lambda: hook.connected == 1, 10, "the webhook to be called and hang")
        assert [x[1] for x in w.lines] == [f"booking {r.short_id} starts in 10 min ({hm(r.start)}) on GPU 0"]
        # While the webhook hangs: the next event reaches the terminal, and a booking commits.
        assert "has started" in w.at(r.start, d)[0]
        other = w.book(BOB, count=1, duration=1800)
        assert w.app().ledger().find(other.id) is not None
        assert hook.connected >= 1, "the webhook stopped hanging before the booking: proves nothing"
        hook.release()
        poll(lambda: len(hook.hits) >= 2 and hook.connected == 0, 20, "both webhook posts")
        d.stop()
    finally:
        hook.close()


# ------------------------------------------------------------ webhooks

def test_a_webhook_to_loopback_is_refused_unless_the_administrator_allows_it(tmp_path):
    from bk.notify import webhook
    from bk.notify.mail import ChannelError

    hook = HookCapture()
    try:
        with pytest.raises(ChannelError, match="loopback"):
            webhook.post(hook.url, {"x": 1}, allow_private=False, timeout=5, event_id="k")
        with pytest.raises(ChannelError, match="loopback"):
            webhook.post(f"http://localhost:{hook.port}/hook", {"x": 1}, allow_private=False, timeout=5,
                         event_id="k")
        assert hook.hits == []
        assert webhook.post(hook.url, {"x": 1}, allow_private=True, timeout=5, event_id="k1") == "HTTP 200"
        path, headers, body = hook.hits[0]
        assert path == "/hook" and body == {"x": 1} and headers["X-Bk-Event-Id"] == "k1"
    finally:
        hook.close()


def test_dns_rebinding_is_caught_at_the_address_connected_to(monkeypatch):
    """The name resolves to a public address when the URL is set, and to
    this machine when the post is made: the post checks what it connects to."""
    import socket

    from bk.notify import webhook
    from bk.notify.mail import ChannelError

    hook = HookCapture()
    answers = [[("93.184.216.34", 80)], [("127.0.0.1", hook.port)]]

    def resolver(host, port, type=0):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", a) for a in answers.pop(0)]
    try:
        assert webhook.check("http://rebind.example/hook", allow_private=False, resolver=resolver).host \
            == "rebind.example"
        with pytest.raises(ChannelError, match="loopback"):
            webhook.post("http://rebind.example/hook", {"x": 1}, allow_private=False, timeout=5,
                         event_id="k", resolver=resolver)
        assert hook.hits == []
        # A name with one public and one private address is not trusted for either.
        mixed = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", 80)),
                 (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.5", 80))]
        with pytest.raises(ChannelError, match="private"):
            webhook.check("http://mixed.example/", allow_private=False, resolver=lambda *a, **k: mixed)
    finally:
        hook.close()


@pytest.mark.parametrize("url", ["ftp://x.org/", "https://user:pw@x.org/", "https:///x", "https://x.org/a b",
                                 "https://exa\x00mple.org/", "javascript:alert(1)"])
def test_malformed_webhook_urls_are_refused(url):
    from bk.notify import webhook

    with pytest.raises(N.Invalid):
        webhook.split_url(url)


def test_presets_post_what_slack_matrix_and_ntfy_take(tmp_path):
    from bk.notify.files import write_prefs
    from bk.service import notify

    hook = HookCapture()
    try:
        w = World(tmp_path, config={"notify_webhook_allow_private": True})
        app = w.app()
        ev = N.test_event(1000, "ada", T0, "n")
        doc = N.to_json(ev, "hello", host="h", sent_at=T0)
        send = notify.senders(app.settings)["webhook"]
        for preset, url in (("slack", hook.url), ("matrix", hook.url),
                            ("ntfy", f"http://127.0.0.1:{hook.port}/lab-gpus"), ("json", hook.url)):
            write_prefs(notify.prefs_path(app.settings), {"webhook": {"url": url, "preset": preset}})
            send(doc, notify.load(app)[1])
        bodies = [(p, b) for p, _, b in hook.hits]
        assert bodies[0] == ("/hook", {"text": "bk: hello"})
        assert bodies[1][1]["text"] == "bk: hello" and bodies[1][1]["msgtype"] == "m.notice"
        assert bodies[2][0] == "/" and bodies[2][1]["topic"] == "lab-gpus" and bodies[2][1]["message"] == "hello"
        assert bodies[3][1]["schema"] == N.SCHEMA and bodies[3][1]["id"] == ev.key
    finally:
        hook.close()


# ------------------------------------------------------------ email and settings

def test_email_goes_through_the_relay_with_one_message_id_per_event(tmp_path):
    from bk.notify import mail
    from bk.service import notify

    sink = SmtpSink()
    try:
        relay = mail.Relay("127.0.0.1", sink.port, False, "bk@lab.example", 5)
        doc = N.to_json(N.test_event(1000, "ada", T0, "n"), "hello", host="h", sent_at=T0)
        for _ in range(2):                      # a retry of the same event
            mail.send(relay, "ada@lab.example", doc, notify.message_id(doc["id"]))
        a, b = sink.messages
        assert a["Message-ID"] == b["Message-ID"] and a["To"] == "ada@lab.example"
        assert a["Subject"] == "bk: test" and a["Auto-Submitted"] == "auto-generated"
        part = next(p for p in a.walk() if p.get_content_type() == "application/json")
        assert json.loads(part.get_payload(decode=True))["id"] == doc["id"]
    finally:
        sink.close()


def test_bad_settings_are_refused_when_set_with_the_reason(tmp_path):
    from bk.service import notify
    from bk.service.notify import NotifySetRequest as S

    sink = SmtpSink(refuse=("nobody@lab.example",))
    try:
        w = World(tmp_path, config={"notify_smtp_host": "127.0.0.1", "notify_smtp_port": sink.port})
        app = w.app()
        call = app.call()

        def refused(req, match):
            with pytest.raises(InvalidInput, match=match):
                app.run("notify_set", req, call=call)
        refused(S(events="ends_soon,endd"), "unknown event 'endd'")
        refused(S(channels="pager"), "unknown channel")
        refused(S(email="ada at lab"), "not an email address")
        refused(S(email="nobody@lab.example"), "refuses mail for nobody@lab.example: 550")
        refused(S(webhook="http://127.0.0.1:9/x"), "loopback")
        refused(S(webhook="https://user:secret@hooks.example.org/"), "user name or password")
        refused(S(quiet="late"), "not HH:MM-HH:MM")
        refused(S(end_minutes="30,0"), "from 1 to 1440")
        refused(S(channels="terminal,webhook"), "webhook needs a URL")
        refused(S(), "nothing to set")
        assert not os.path.exists(notify.prefs_path(app.settings))          # nothing kept
        assert sink.messages == []                                           # checking sends nothing
        got = app.run("notify_set", S(email="ada@lab.example", channels="terminal,email", end_minutes="15,5"),
                      call=call).to_json()
        assert got["settings"]["channels"] == ["terminal", "email"] and got["settings"]["end_minutes"] == [15, 5]
        assert sink.rcpt_checks[-1] == "ada@lab.example" and sink.messages == []
        path = notify.prefs_path(app.settings)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        # Private: the address is nowhere in the shared data.
        for p in (tmp_path / "data").rglob("*"):
            if p.is_file() and "state" not in p.parts:
                assert b"ada@lab.example" not in p.read_bytes(), p
        # A file edited by hand into something bk would not write is refused, naming it.
        Path(path).write_text(json.dumps({"schema": "gpubk.notify-prefs.v1", "events": ["nope"]}))
        with pytest.raises(Exception, match="unknown event"):
            app.run("notify_show", __import__("bk.service.requests", fromlist=["Empty"]).Empty(), call=call)
    finally:
        sink.close()


def test_the_administrators_defaults_apply_until_a_user_chooses(tmp_path):
    from bk.service.notify import NotifySetRequest as S
    from bk.service.requests import Empty

    w = World(tmp_path, config={"notify_end_minutes": [10], "notify_channels": ["terminal"],
                                "notify_quiet_hours": "23:00-06:00"})
    app = w.app()
    s = app.run("notify_show", Empty()).to_json()["settings"]
    assert s["end_minutes"] == [10] and s["channels"] == ["terminal"] and s["quiet"] == "23:00-06:00"
    assert s["source"]["end_minutes"] == "administrator"
    app.run("notify_set", S(end_minutes="20", quiet="off"))
    s = app.run("notify_show", Empty()).to_json()["settings"]
    assert s["end_minutes"] == [20] and s["quiet"] is None and s["source"]["end_minutes"] == "you"
    app.run("notify_set", S(end_minutes="default"))
    assert app.run("notify_show", Empty()).to_json()["settings"]["end_minutes"] == [10]


def test_the_configuration_knows_the_same_names_and_defaults_as_the_rules():
    from bk.store import config

    assert config.NOTIFY_EVENTS == N.EVENTS and config.NOTIFY_CHANNELS == N.CHANNELS
    assert tuple(config.KEYS["notify_start_minutes"].default) == N.DEFAULT_START_MINUTES
    assert tuple(config.KEYS["notify_end_minutes"].default) == N.DEFAULT_END_MINUTES


def test_config_refuses_bad_notify_keys():
    from bk.core.errors import ConfigError
    from bk.store.config import parse_document

    for doc, match in (({"notify_events": ["ends_son"]}, "did you mean ends_soon"),
                       ({"notify_channels": "terminal"}, "list"), ({"notify_end_minutes": [0]}, "1 to 1440"),
                       ({"notify_quiet_hours": "night"}, "HH:MM"), ({"notify_mail_from": "bk"}, "email")):
        with pytest.raises(ConfigError) as e:
            parse_document(doc, "cfg", allow_security=False)
        assert match in f"{e.value.message} {e.value.hint}", (e.value.message, e.value.hint)


def test_quiet_hours_hold_back_pop_ups_mail_and_webhooks_not_the_terminal(tmp_path):
    from bk.notify.files import write_prefs
    from bk.service import notify

    w = World(tmp_path)
    app = w.app()
    write_prefs(notify.prefs_path(app.settings), {"channels": ["terminal", "desktop", "webhook"],
                                                   "quiet": "00:00-23:59",
                                                   "webhook": {"url": "https://h.example/", "preset": "json"}})
    posted = []
    r = w.book(count=1, duration=3600, start=T0 + 3600)
    d = w.deliverer(senders={"webhook": lambda doc, p: posted.append(doc), "email": None})
    d.start_threads()
    w.at(r.start - 600, d)
    assert w.lines[-1][2:] == (True, False)           # the line, no pop-up
    d.stop()
    assert posted == []
    log = json.loads((tmp_path / "data" / "state" / "notify" / "deliveries.json").read_text())
    (entry,) = log["entries"].values()
    assert entry["channels"]["webhook"]["state"] == "quiet" and entry["channels"]["desktop"]["state"] == "quiet"


# ------------------------------------------------------------ crashes (the deliverer killed at each step)

DRIVER = r"""
import json, sys
sys.path.insert(0, {root!r})
from bk.service import open_app, notifier, notify
from bk.service.context import Actor
from bk.notify.deliverer import Deliverer
from bk.notify.files import DeliveryLog
from bk.notify.terminals import Outcome
env, t, out = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
app = open_app(env, actor=Actor(1000, "ada"), clock_fn=lambda: t)
def local(uid, text, title, **kw):
    with open(out, "a") as f:
        f.write(text + "\n")
    return [Outcome("/dev/pts/x", "sent")]
def mail(doc, prefs):
    with open(out + ".mail", "a") as f:
        f.write(doc["id"] + "\n")
    return "250 ok"
d = Deliverer(notifier.Host(app, clock_fn=lambda: t), DeliveryLog(notify.log_dir(app.settings)), local=local,
              senders={{"email": mail, "webhook": mail}})
d.resume(); d.start_threads(); d.tick(); d.stop(5)
"""


@pytest.mark.parametrize("step,lines,mails", [("claimed", 0, 1), ("sent", 1, 1), (None, 1, 1)])
def test_killed_at_each_step_terminal_at_most_once_email_at_least_once(tmp_path, step, lines, mails):
    from bk.notify.files import write_prefs
    from bk.service import notify

    w = World(tmp_path, config={"notify_smtp_host": "127.0.0.1"})
    app = w.app()
    write_prefs(notify.prefs_path(app.settings), {"channels": ["terminal", "email"], "email": "ada@lab.example"})
    r = w.book(count=1, duration=3600, start=T0 + 3600)
    out = tmp_path / "out.txt"
    env = {k: v for k, v in w.env.items() if k != "BK_CONFIG_FILE"}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    script = DRIVER.format(root=str(ROOT))

    def run(t, crash):
        e = {**os.environ, "PYTHONPATH": str(ROOT)}
        e.pop("BK_TEST_NOTIFY_CRASH", None)
        if crash:
            e["BK_TEST_NOTIFY_CRASH"] = crash
        return subprocess.run([sys.executable, "-c", script, json.dumps(env), str(t), str(out)], env=e,
                              capture_output=True, text=True, timeout=60)
    p = run(r.end - 15 * 60, step)
    assert (p.returncode == -9) == (step is not None), p.stderr
    p = run(r.end - 14 * 60, None)                  # the restart, a minute later
    assert p.returncode == 0, p.stderr
    told = [x for x in (out.read_text().splitlines() if out.exists() else []) if "ends in 15 min" in x]
    mailed = [x for x in (Path(str(out) + ".mail").read_text().splitlines()
                          if Path(str(out) + ".mail").exists() else []) if ":ends_soon-15:" in x]
    assert (len(told), len(mailed)) == (lines, mails)
