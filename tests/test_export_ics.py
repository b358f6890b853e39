"""iCalendar feeds: every golden feed parses with a real RFC 5545 library
(``icalendar``), lines are CRLF and folded at 75 octets without splitting a
UTF-8 sequence (hypothesis), times are right across the clock changes of
Europe/Berlin and America/New_York (booked as a person types local times,
through the built bk.pyz), and edits and cancellations reach a subscriber
as a new SEQUENCE, a moved end, STATUS:CANCELLED."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from helpers_export import H, booking, rich, rid, world
from hypothesis import given, settings
from hypothesis import strategies as st

from bk.core.models import Blackout, parse_iso
from bk.core.safetext import safe
from bk.export import ics

icalendar = pytest.importorskip("icalendar", reason="the dev extra's icalendar parses the feeds")

GOLDEN = Path(__file__).parent / "golden_ics"
NOW = parse_iso("2026-07-13T10:41:30Z")
BERLIN, NEW_YORK = ZoneInfo("Europe/Berlin"), ZoneInfo("America/New_York")


def _physical_lines(feed: bytes) -> list[bytes]:
    assert feed.endswith(b"\r\n")
    lines = feed[:-2].split(b"\r\n")
    assert b"\n" not in b"".join(lines) and b"\r" not in b"".join(lines), "a bare CR or LF"
    return lines


def check_wire(feed: bytes) -> None:
    """CRLF only, at most 75 octets a line, each line whole UTF-8."""
    for line in _physical_lines(feed):
        assert len(line) <= 75, line
        line.decode("utf-8")                 # a fold inside a sequence would fail here


def events(feed: bytes) -> dict:
    cal = icalendar.Calendar.from_ical(feed)
    return {str(e["UID"]): e for e in cal.walk("VEVENT")}


# ------------------------------------------------------------- golden feeds

def _scenarios():
    dst = [booking(1, start=parse_iso("2026-10-25T00:30:00Z"), end=parse_iso("2026-10-25T01:30:00Z"),
                   created=parse_iso("2026-10-01T08:00:00Z")),
           booking(2, start=parse_iso("2026-03-29T00:30:00Z"), end=parse_iso("2026-03-29T01:30:00Z"),
                   created=parse_iso("2026-03-01T08:00:00Z")),
           booking(3, user="bob", uid=1001, start=parse_iso("2026-11-01T05:30:00Z"),
                   end=parse_iso("2026-11-01T06:30:00Z"), created=parse_iso("2026-10-01T08:00:00Z")),
           booking(4, user="bob", uid=1001, start=parse_iso("2026-03-08T06:30:00Z"),
                   end=parse_iso("2026-03-08T07:30:00Z"), created=parse_iso("2026-03-01T08:00:00Z"))]
    long_note = "Fine-tuning 🤖 模型 " * 8 + "; with, commas\\ and a backslash"
    return {
        "rich": (rich(NOW), {}),
        "dst": (world(parse_iso("2026-01-01T00:00:00Z"), reservations=dst,
                      since=parse_iso("2026-01-01T00:00:00Z")), {}),
        "edits_and_cancellations": (world(NOW, reservations=[
            booking(10, start=NOW + H, end=NOW + 3 * H, edits=3, note=long_note),
            booking(11, start=NOW + 2 * H, end=NOW + 4 * H, cancelled_at=NOW - 60),
            booking(12, uid=1001, user="bob", start=NOW - 2 * H, end=NOW + 2 * H, cancelled_at=NOW - H),
        ], blackouts=[Blackout("bbbbbbbb-0000-4000-8000-000000000001", NOW + 5 * H, NOW + 6 * H,
                               "BIOS; firmware, too")], since=NOW - 14 * 86400), {"busy": True}),
        "empty": (world(NOW), {}),
    }


SCENARIOS = _scenarios()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden_feeds_parse_and_match(name):
    data, kw = SCENARIOS[name]
    feed = ics.render(data, name=f"GPU bookings on {data.host}", **kw)
    path = GOLDEN / f"{name}.ics"
    if os.environ.get("BK_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(feed)
    assert feed == path.read_bytes(), f"{path} differs (BK_UPDATE_GOLDEN=1 writes it anew)"
    check_wire(feed)
    cal = icalendar.Calendar.from_ical(path.read_bytes())
    assert str(cal["VERSION"]) == "2.0" and str(cal["PRODID"]) == ics.PRODID
    evs = cal.walk("VEVENT")
    assert len(evs) == len(data.bookings) + len(data.windows)
    for e in evs:
        for prop in ("UID", "DTSTAMP", "DTSTART", "DTEND", "SUMMARY", "STATUS"):
            assert prop in e, (name, prop)
        assert e.decoded("DTSTART").tzinfo is not None and e.decoded("DTSTART").utcoffset() == timedelta(0)
        assert e.decoded("DTEND") > e.decoded("DTSTART")


def test_text_survives_the_escapes():
    data, kw = SCENARIOS["edits_and_cancellations"]
    evs = events(ics.render(data, name="x", **kw))
    e = evs[f"{rid(10)}@gpubk"]
    assert "Fine-tuning 🤖 模型" in str(e["DESCRIPTION"])
    assert "; with, commas\\ and a backslash" in str(e["DESCRIPTION"])
    assert "BIOS; firmware, too" in str(evs["bbbbbbbb-0000-4000-8000-000000000001@gpubk-maintenance"]["DESCRIPTION"])


def test_control_and_format_characters_are_shown_not_obeyed():
    r = booking(1, start=NOW + H, end=NOW + 2 * H, note="a\x1b]52;c;bad\x07 \u202eevil\u202c\r\nline")
    feed = ics.render(world(NOW, reservations=[r]), name="x")
    assert b"\x1b" not in feed and "\u202e".encode() not in feed and b"\x07" not in feed
    desc = str(events(feed)[f"{rid(1)}@gpubk"]["DESCRIPTION"])
    assert "\\x1b]52" in desc and "\\u202e" in desc and "line" in desc


def test_sequence_and_status():
    data, kw = SCENARIOS["edits_and_cancellations"]
    evs = events(ics.render(data, name="x", **kw))
    edited, cancelled, released = (evs[f"{rid(n)}@gpubk"] for n in (10, 11, 12))
    assert int(edited["SEQUENCE"]) == 3 and str(edited["STATUS"]) == "CONFIRMED"
    assert int(cancelled["SEQUENCE"]) == 1 and str(cancelled["STATUS"]) == "CANCELLED"
    # Cancelled while it ran: it did run, until then.
    assert str(released["STATUS"]) == "CONFIRMED" and int(released["SEQUENCE"]) == 1
    assert released.decoded("DTEND") == datetime.fromtimestamp(NOW - H, timezone.utc)
    assert "Released early" in str(released["DESCRIPTION"])
    assert str(edited["TRANSP"]) == "OPAQUE"


# ------------------------------------------------------------- folding

@settings(max_examples=300, deadline=None)
# A content line never holds a line break: escape_text makes each one "\\n"
# before the line is folded (test_text_survives_the_escapes).
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=400),
       st.sampled_from(["SUMMARY:", "DESCRIPTION:", "X-LONG-PROPERTY-NAME;PARAM=1:"]))
def test_fold_keeps_every_line_short_and_whole(text, prop):
    line = prop + text
    out = ics.fold(line)
    assert out.endswith(b"\r\n")
    parts = out[:-2].split(b"\r\n")
    for i, p in enumerate(parts):
        assert len(p) <= 75
        assert i == 0 or p.startswith(b" ")
        p.decode("utf-8")
    # Unfolding (RFC 5545 3.1: remove each CRLF followed by one space) gives the line back.
    assert out[:-2].replace(b"\r\n ", b"").decode("utf-8") == line


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Cf", "Zl", "Zp", "Co", "Cn")),
               min_size=1, max_size=300))
def test_escaped_text_round_trips_through_a_parser(note):
    r = booking(1, start=NOW + H, end=NOW + 2 * H, note=note)
    feed = ics.render(world(NOW, reservations=[r]), name=note)
    check_wire(feed)
    cal = icalendar.Calendar.from_ical(feed)
    # The parser takes NAME and X-WR-CALNAME as unknown properties (raw):
    # undo RFC 5545's TEXT escapes by hand.
    shown = safe(note, multiline=True)          # the text policy's rendering (invisible letters escaped)
    raw = str(cal["X-WR-CALNAME"])
    assert re.sub(r"\\([\\;,nN])", lambda m: "\n" if m.group(1) in "nN" else m.group(1), raw) == shown
    assert f"Note: {shown}" in str(cal.walk("VEVENT")[0]["DESCRIPTION"])


# ------------------------------------------------------------- through bk.pyz

def _bk(pyz: Path, env: dict, *args: str, now: str) -> subprocess.CompletedProcess:
    got = subprocess.run([sys.executable, str(pyz), *args], env={**env, "BK_NOW": now}, capture_output=True,
                         timeout=120)
    assert got.returncode == 0, (args, got.stderr.decode())
    return got


@pytest.fixture
def server(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "BK_DATA_DIR": str(tmp_path / "d"),
           "BK_GPU_COUNT": "2", "XDG_CACHE_HOME": str(tmp_path / "c")}
    return env


@pytest.mark.slow
@pytest.mark.parametrize(("zone", "day", "wall", "start_local", "end_local"), [
    # Berlin falls back on 2026-10-25 (03:00 CEST -> 02:00 CET): 02:30 happens twice, bk takes the first.
    ("Europe/Berlin", "2026-10-24T12:00:00Z", "2026-10-25 02:30", ("02:30", "+0200"), ("02:30", "+0100")),
    # ... and springs forward on 2026-03-29 (02:00 CET -> 03:00 CEST): one hour from 01:30 ends at 03:30.
    ("Europe/Berlin", "2026-03-28T12:00:00Z", "2026-03-29 01:30", ("01:30", "+0100"), ("03:30", "+0200")),
    ("America/New_York", "2026-10-31T12:00:00Z", "2026-11-01 01:30", ("01:30", "-0400"), ("01:30", "-0500")),
    ("America/New_York", "2026-03-07T12:00:00Z", "2026-03-08 01:30", ("01:30", "-0500"), ("03:30", "-0400")),
])
def test_local_times_across_the_clock_change_reach_the_feed_exactly(pyz, server, zone, day, wall, start_local,
                                                                     end_local):
    env = {**server, "TZ": zone}
    _bk(pyz, env, "1", "1h", "-t", wall, now=day)
    feed = _bk(pyz, env, "export", "ics", "--mine", now=day).stdout
    check_wire(feed)
    (e,) = events(feed).values()
    start, end = e.decoded("DTSTART"), e.decoded("DTEND")
    assert end - start == timedelta(hours=1)                  # real elapsed time, whatever the wall clock did
    tz = ZoneInfo(zone)
    assert (start.astimezone(tz).strftime("%H:%M"), start.astimezone(tz).strftime("%z")) == start_local
    assert (end.astimezone(tz).strftime("%H:%M"), end.astimezone(tz).strftime("%z")) == end_local


@pytest.mark.slow
def test_edits_and_cancellations_reach_a_subscriber(pyz, server):
    t0 = "2026-07-13T10:41:30Z"
    env = {**server, "TZ": "Europe/Berlin"}
    _bk(pyz, env, "1", "2h", "-t", "+2h", "--note", "eval; run 2", now=t0)
    first = events(_bk(pyz, env, "export", "ics", "--mine", now=t0).stdout)
    (uid,) = first
    assert int(first[uid]["SEQUENCE"]) == 0 and str(first[uid]["STATUS"]) == "CONFIRMED"
    # The same feed, a minute later and nothing changed: the same bytes.
    again = _bk(pyz, env, "export", "ics", "--mine", now="2026-07-13T10:42:30Z").stdout
    assert again == _bk(pyz, env, "export", "ics", "--mine", now=t0).stdout
    t1 = "2026-07-13T10:50:00Z"
    _bk(pyz, env, "e", "1", "-d", "+30m", now=t1)
    edited = events(_bk(pyz, env, "export", "ics", "--mine", now=t1).stdout)
    assert set(edited) == {uid}                               # the same event, changed
    assert int(edited[uid]["SEQUENCE"]) == 1
    assert edited[uid].decoded("DTEND") - first[uid].decoded("DTEND") == timedelta(minutes=30)
    assert edited[uid].decoded("DTSTAMP") == datetime.fromtimestamp(parse_iso(t1), timezone.utc)
    t2 = "2026-07-13T11:00:00Z"
    _bk(pyz, env, "d", "1", now=t2)
    gone = events(_bk(pyz, env, "export", "ics", "--mine", now=t2).stdout)
    assert str(gone[uid]["STATUS"]) == "CANCELLED" and int(gone[uid]["SEQUENCE"]) == 2
    # A running booking released early keeps the time it ran.
    _bk(pyz, env, "1", "1h", now=t2)
    _bk(pyz, env, "d", "1", now="2026-07-13T11:20:00Z")
    feed = _bk(pyz, env, "export", "ics", "--all", now="2026-07-13T11:21:00Z").stdout
    ran = [e for u, e in events(feed).items() if u != uid]
    assert len(ran) == 1 and str(ran[0]["STATUS"]) == "CONFIRMED"
    assert ran[0].decoded("DTEND") == datetime(2026, 7, 13, 11, 20, tzinfo=timezone.utc)
    # --gpu keeps only that GPU's bookings.
    on = {int(str(e["SUMMARY"]).split("GPU ")[1].split(" ")[0]) for e in events(feed).values()}
    for g in (0, 1):
        only = events(_bk(pyz, env, "export", "ics", "--gpu", str(g), now="2026-07-13T11:21:00Z").stdout)
        assert bool(only) == (g in on)
