"""Times that read right (issue 10, item 6): a time in a DST fold is shown
with its zone, an unknown ``TZ`` is a warning rather than silent UTC, and
``bk info`` names the zone in use.  Pure formatting first, then the clock's
zone lookup, then the CLI in-process and through the built ``bk.pyz``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from helpers_cli import ME, bk_fixture
from hypothesis import given, settings
from hypothesis import strategies as st

from bk import clock
from bk.core import timegrid as tg
from bk.core.models import parse_iso

try:
    from zoneinfo import ZoneInfo

    BER, NYC = ZoneInfo("Europe/Berlin"), ZoneInfo("America/New_York")
except Exception:   # no tz database on this machine
    pytest.skip("needs the IANA tz database", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
U = parse_iso
H = 3600
# A week before the 2026 fall-backs: Berlin 10-25 03:00 CEST -> 02:00 CET
# (01:00Z), New York 11-01 02:00 EDT -> 01:00 EST (06:00Z).
BEFORE_BER = U("2026-10-20T12:00:00Z")
BEFORE_NYC = U("2026-10-28T12:00:00Z")
UNKNOWN = "Mars/Olympus"


# ------------------------------------------------------------ formatting

@pytest.mark.parametrize("zone, start, end, now, text", [
    # One hour across the fold: the same wall reading at both ends.
    (BER, "2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z", BEFORE_BER, "10-25 02:30 CEST–02:30 CET"),
    (NYC, "2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z", BEFORE_NYC, "11-01 01:30 EDT–01:30 EST"),
    # Entirely inside the repeated hour, first and second time round: one label for both.
    (BER, "2026-10-25T00:10:00Z", "2026-10-25T00:40:00Z", BEFORE_BER, "10-25 02:10–02:40 CEST"),
    (BER, "2026-10-25T01:10:00Z", "2026-10-25T01:40:00Z", BEFORE_BER, "10-25 02:10–02:40 CET"),
    (NYC, "2026-11-01T05:10:00Z", "2026-11-01T05:40:00Z", BEFORE_NYC, "11-01 01:10–01:40 EDT"),
    (NYC, "2026-11-01T06:10:00Z", "2026-11-01T06:40:00Z", BEFORE_NYC, "11-01 01:10–01:40 EST"),
    # The whole repeated hour, transition to transition.
    (BER, "2026-10-25T00:00:00Z", "2026-10-25T01:00:00Z", BEFORE_BER, "10-25 02:00 CEST–02:00 CET"),
    # Only one end in the fold: only that end is marked.
    (BER, "2026-10-24T23:00:00Z", "2026-10-25T00:30:00Z", BEFORE_BER, "10-25 01:00–02:30 CEST"),
    (BER, "2026-10-25T01:30:00Z", "2026-10-25T03:00:00Z", BEFORE_BER, "10-25 02:30 CET–04:00"),
    # ... unless the span crosses the change: then both ends say their zone.
    (BER, "2026-10-24T20:00:00Z", "2026-10-25T01:30:00Z", BEFORE_BER, "10-24 22:00 CEST–10-25 02:30 CET"),
    # Across the fold with neither end in it: three hours that read as two name both zones.
    (BER, "2026-10-24T23:00:00Z", "2026-10-25T02:00:00Z", BEFORE_BER, "10-25 01:00 CEST–03:00 CET"),
    (NYC, "2026-11-01T04:00:00Z", "2026-11-01T08:00:00Z", BEFORE_NYC, "11-01 00:00 EDT–03:00 EST"),
    # Across the spring-forward gap: one hour that reads as two (issue 30, item 20).
    (BER, "2026-03-29T00:30:00Z", "2026-03-29T01:30:00Z", U("2026-03-20T12:00:00Z"), "03-29 01:30 CET–03:30 CEST"),
    (NYC, "2026-03-08T06:30:00Z", "2026-03-08T07:30:00Z", U("2026-03-01T12:00:00Z"), "03-08 01:30 EST–03:30 EDT"),
])
def test_fold_spans_name_their_zone(zone, start, end, now, text):
    assert tg.format_span(U(start), U(end), zone, now) == text


@pytest.mark.parametrize("zone, start, end, now, text", [
    # Spring-forward day, after the gap: one offset, nothing to mark.
    (BER, "2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z", U("2026-03-20T12:00:00Z"), "03-29 03:00–04:00"),
    (BER, "2026-03-28T22:00:00Z", "2026-03-29T00:30:00Z", U("2026-03-20T12:00:00Z"), "03-28 23:00–03-29 01:30"),
    # Ordinary times, the exact text every other test relies on.
    (BER, "2026-07-13T18:00:00Z", "2026-07-13T19:30:00Z", U("2026-07-13T10:41:30Z"), "07-13 20:00–21:30"),
    (BER, "2026-07-13T20:00:00Z", "2026-07-14T00:00:00Z", U("2026-07-13T10:41:30Z"), "07-13 22:00–07-14 02:00"),
    (NYC, "2026-10-25T05:30:00Z", "2026-10-25T06:30:00Z", BEFORE_NYC, "10-25 01:30–02:30"),   # NY's fold is a week later
    (timezone.utc, "2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z", BEFORE_BER, "10-25 00:30–01:30"),
])
def test_gaps_and_ordinary_spans_are_unchanged(zone, start, end, now, text):
    assert tg.format_span(U(start), U(end), zone, now) == text


def test_single_times_in_a_fold():
    first, second = U("2026-10-25T00:30:00Z"), U("2026-10-25T01:30:00Z")
    on_the_day = U("2026-10-24T23:00:00Z")
    assert tg.format_local_short(first, BER, on_the_day) == "02:30 CEST"
    assert tg.format_local_short(second, BER, on_the_day) == "02:30 CET"
    assert tg.format_local_short(second, BER, BEFORE_BER) == "10-25 02:30 CET"
    assert tg.format_local_short(second, BER, on_the_day, mark_fold=False) == "02:30"
    assert tg.format_local_short(U("2026-10-25T03:00:00Z"), BER, on_the_day) == "04:00"
    # format_local stays the plain form that parse_start reads back, unless asked.
    assert tg.format_local(second, BER) == "2026-10-25 02:30"
    assert tg.format_local(second, BER, mark_fold=True) == "2026-10-25 02:30 CET"
    assert tg.format_local(second, BER, now=BEFORE_BER, compact=True, mark_fold=True) == "10-25 02:30 CET"
    assert tg.fold_label(U("2026-07-13T10:00:00Z"), BER) is None


def test_fold_label_falls_back_to_the_offset(monkeypatch):
    """A zone whose two readings share an abbreviation is told apart by offset."""
    monkeypatch.setenv("TZ", "XXX-1XXX-2,M3.5.0,M10.5.0/3")
    try:
        zone = clock.find_local_tz(os.environ["TZ"], "/nonexistent")
        assert isinstance(zone, clock.SystemLocalTime)
        assert tg.format_span(U("2026-10-25T00:30:00Z"), U("2026-10-25T01:30:00Z"), zone, BEFORE_BER) \
            == "10-25 02:30 +02:00–02:30 +01:00"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_errors_suggest_times_you_can_type():
    """Suggestions in a parse error stay plain inside a fold: '02:30 CEST' would not parse."""
    with pytest.raises(Exception) as e:
        tg.parse_start("02:33", U("2026-10-25T00:00:00Z"), BER, 5)
    assert "try 02:30 or 02:35" in str(e.value) and "CEST" not in str(e.value)


_LABEL = re.compile(r" (?:[A-Z]{3,5}|[+-]\d\d(?::?\d\d)?)(?=–|$)")


@pytest.mark.slow
@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.sampled_from([("Europe/Berlin", U("2026-10-25T01:00:00Z")), ("America/New_York", U("2026-11-01T06:00:00Z")),
                        ("Europe/Berlin", U("2026-03-29T01:00:00Z")), ("Australia/Lord_Howe", U("2026-04-04T15:00:00Z"))]),
       st.integers(-48, 48), st.integers(1, 96))
def test_spans_differ_from_the_plain_text_only_by_fold_labels(zone_at, k, slices):
    """Near every kind of transition: a label appears exactly when an end is
    in a fold or the span crosses the change (its ends' offsets differ), and
    without its labels the span is the text bk always showed."""
    key, at = zone_at
    zone = ZoneInfo(key)
    start = at + k * 300
    end = start + slices * 300
    text = tg.format_span(start, end, zone, at - 7 * 86400)
    a, b = datetime.fromtimestamp(start, zone), datetime.fromtimestamp(end, zone)
    tail = f"{b:%H:%M}" if a.date() == b.date() else f"{b:%m-%d %H:%M}"
    assert _LABEL.sub("", text) == f"{a:%m-%d %H:%M}–{tail}"
    folded = [tg.fold_label(t, zone) for t in (start, end)]
    crosses = a.utcoffset() != b.utcoffset()
    assert bool(_LABEL.search(text)) == (any(folded) or crosses)
    if crosses:                 # each end its own zone
        assert len(_LABEL.findall(text)) == 2
    for t, label in zip((start, end), folded, strict=True):
        if label:   # the label names this instant's reading, not its twin's
            assert label == datetime.fromtimestamp(t, zone).tzname()


# ------------------------------------------------------------ the zone in use

@pytest.fixture
def fresh_zone(monkeypatch):
    clock.local_tz.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    time.tzset()
    clock.local_tz.cache_clear()


@pytest.mark.parametrize("tz_env, name, source", [
    ("Europe/Berlin", "Europe/Berlin", "TZ"),
    (":America/New_York", "America/New_York", "TZ"),
    ("", "UTC", "TZ"),
    ("UTC0", "UTC0", "TZ"),
    ("CET-1CEST,M3.5.0,M10.5.0/3", "CET-1CEST,M3.5.0,M10.5.0/3", "TZ"),
])
def test_known_zones_do_not_warn(fresh_zone, tz_env, name, source):
    zone = clock.find_local_zone(tz_env, "/nonexistent")
    assert (zone.name, zone.source, zone.warnings) == (name, source, ())


@pytest.mark.parametrize("tz_env", [UNKNOWN, "Nowhere", "/nonexistent/zone", ":Mars/Olympus"])
def test_unknown_tz_warns_and_says_utc(fresh_zone, tz_env):
    zone = clock.find_local_zone(tz_env, "/nonexistent")
    assert zone.to_json() == {"name": "UTC", "source": "UTC fallback"}
    assert datetime.fromtimestamp(BEFORE_BER, zone.tz).utcoffset() == timedelta(0)
    (warning,) = zone.warnings
    assert repr(tz_env) in warning and "UTC" in warning and "unset" in warning


def test_etc_localtime_is_a_source(fresh_zone, tmp_path):
    target = "/usr/share/zoneinfo/Asia/Shanghai"
    if not os.path.exists(target):
        pytest.skip("no system tz database")
    link = tmp_path / "localtime"
    link.symlink_to(target)
    zone = clock.find_local_zone(None, str(link))
    assert (zone.name, zone.source, zone.warnings) == ("Asia/Shanghai", str(link), ())


def test_broken_etc_localtime_warns_and_missing_does_not(fresh_zone, tmp_path):
    fresh_zone.setattr(clock, "_libc_zone", lambda: None)   # the C library sees plain UTC
    junk = tmp_path / "localtime"
    junk.write_bytes(b"not a zone file")
    broken = clock.find_local_zone(None, str(junk))
    assert broken.source == "UTC fallback" and str(junk) in broken.warnings[0]
    missing = clock.find_local_zone(None, str(tmp_path / "missing"))
    assert (missing.source, missing.warnings) == ("UTC fallback", ())


def test_only_the_processs_own_call_carries_the_warning(fresh_zone, tmp_path):
    fresh_zone.setenv("TZ", UNKNOWN)
    fresh_zone.setenv("BK_DATA_DIR", str(tmp_path))
    fresh_zone.setenv("BK_GPU_COUNT", "2")
    clock.local_tz.cache_clear()
    from bk.service import open_app

    app = open_app(dict(os.environ), actor=ME)
    (warning,) = app.call().warnings
    assert UNKNOWN in warning
    # The broker's call for a peer: the peer's zone is not this process's.
    assert app.call(ME).warnings == []
    # A zone the caller chose is described as such, and never warned about.
    assert clock.zone_warnings(timezone.utc) == ()
    assert clock.describe_zone(BER) == {"name": "Europe/Berlin", "source": "given"}


def test_open_app_reads_the_clock_and_zone_of_its_env_not_the_processs(fresh_zone, tmp_path):
    # The process says one time and zone; the environment the command was
    # given says another.  The command's wins, as it would in its own process.
    fresh_zone.setenv("TZ", "America/New_York")
    fresh_zone.setenv("BK_NOW", "2026-07-13T10:41:00Z")
    clock.local_tz.cache_clear()
    from bk.service import open_app

    env = {**os.environ, "BK_DATA_DIR": str(tmp_path), "BK_GPU_COUNT": "2",
           "TZ": "Asia/Tokyo", "BK_NOW": "2026-01-02T03:04:05Z"}
    call = open_app(env, actor=ME).call()
    assert call.now == U("2026-01-02T03:04:05Z")
    assert getattr(call.tz, "key", None) == "Asia/Tokyo"
    assert clock.describe_zone(call.tz) == {"name": "Asia/Tokyo", "source": "TZ"}
    assert call.warnings == []
    # An unknown zone in the command's environment is the command's warning,
    # though the process's own zone is fine.
    call = open_app({**env, "TZ": UNKNOWN}, actor=ME).call()
    (warning,) = call.warnings
    assert UNKNOWN in warning
    # No BK_NOW in the command's environment: the real time, not the process's fixed one.
    before = int(time.time())
    env.pop("BK_NOW")
    assert open_app(env, actor=ME).call().now >= before


# ------------------------------------------------------------ the CLI, in-process

@pytest.fixture
def bk(monkeypatch, capsys):
    yield from bk_fixture(monkeypatch, capsys)


def _zone(bk, tz: str | None) -> None:
    if tz is None:
        bk.mp.delenv("TZ", raising=False)
    else:
        bk.mp.setenv("TZ", tz)
    clock.local_tz.cache_clear()


def test_cli_unknown_tz_warns_on_stderr_and_in_json(bk):
    _zone(bk, UNKNOWN)
    r = bk.ok("l")
    assert f"warning: TZ='{UNKNOWN}' is not a time zone bk knows" in r.err
    j = bk.json("l")
    assert j.err == "" and any(UNKNOWN in w for w in j.envelope["warnings"])
    # It reaches a failing command too.
    bad = bk.json("1", "7m")
    assert bad.code == 2 and any(UNKNOWN in w for w in bad.envelope["warnings"])
    _zone(bk, "Europe/Berlin")
    assert bk.ok("l").err == "" and bk.json("l").envelope["warnings"] == []


def test_cli_info_names_the_zone(bk):
    _zone(bk, "Europe/Berlin")
    assert bk.data("info")["timezone"] == {"name": "Europe/Berlin", "source": "TZ"}
    assert re.search(r"^time zone +Europe/Berlin \(from TZ\)$", bk.ok("info").out, re.M)
    _zone(bk, UNKNOWN)
    r = bk.json("info")
    assert r.data["timezone"] == {"name": "UTC", "source": "UTC fallback"} and r.envelope["warnings"]
    assert re.search(r"^time zone +UTC \(fallback: no zone found\)$", bk.ok("info").out, re.M)


def test_cli_info_etc_localtime(bk, tmp_path):
    target = "/usr/share/zoneinfo/America/New_York"
    if not os.path.exists(target):
        pytest.skip("no system tz database")
    link = tmp_path / "localtime"
    link.symlink_to(target)
    bk.mp.setattr(clock, "ETC_LOCALTIME", str(link))
    _zone(bk, None)
    assert bk.data("info")["timezone"] == {"name": "America/New_York", "source": str(link)}


def test_cli_booking_across_the_berlin_fold(bk):
    _zone(bk, "Europe/Berlin")
    now = {"BK_NOW": "2026-10-24T22:00:00Z"}    # 10-25 00:00 in Berlin, the day of the change
    bk.mp.setenv("BK_NOW", now["BK_NOW"])
    out = bk.ok("1", "1h", "--start", "2026-10-25T00:30:00Z").out
    assert out.startswith("booked 1 GPU (0) shared 10-25 02:30 CEST–02:30 CET")
    bk.ok("1", "30m", "--start", "2026-10-25T01:10:00Z", "-g", "1")
    bk.ok("1", "1h", "--start", "2026-10-25T10:00:00Z", "-g", "2")
    listing = bk.ok("l").out
    assert "10-25 02:30 CEST–02:30 CET" in listing
    assert "10-25 02:10–02:40 CET" in listing
    assert "10-25 11:00–12:00" in listing   # CET by then: UTC+1
    # JSON stays ISO-8601 UTC.
    spans = {(r["start"], r["end"]) for r in bk.data("l")["reservations"]}
    assert ("2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z") in spans


# ------------------------------------------------------------ the built archive

def _pyz(pyz: Path, tmp_path: Path, tz: str, *argv: str, now: str = "2026-10-24T22:00:00Z"):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update(BK_DATA_DIR=str(tmp_path / "data"), BK_GPU_COUNT="4", BK_NOW=now, TZ=tz,
               HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "config"),
               XDG_CACHE_HOME=str(tmp_path / "cache"), XDG_STATE_HOME=str(tmp_path / "state"),
               COLUMNS="100", NO_COLOR="1")
    p = subprocess.run([sys.executable, str(pyz), *argv], env=env, capture_output=True,
                       stdin=subprocess.DEVNULL, text=True, timeout=60)
    assert p.returncode == 0 and "Traceback" not in p.stderr, (argv, p.returncode, p.stdout, p.stderr)
    return p


@pytest.mark.slow
def test_pyz_unknown_tz_and_info(pyz, tmp_path):
    human = _pyz(pyz, tmp_path, UNKNOWN, "info")
    assert f"warning: TZ='{UNKNOWN}' is not a time zone bk knows; showing times in UTC" in human.stderr
    assert re.search(r"^time zone +UTC \(fallback: no zone found\)$", human.stdout, re.M)
    env = json.loads(_pyz(pyz, tmp_path, UNKNOWN, "--json", "info").stdout)
    assert env["data"]["timezone"] == {"name": "UTC", "source": "UTC fallback"}
    assert any(UNKNOWN in w for w in env["warnings"])
    listing = _pyz(pyz, tmp_path, UNKNOWN, "--json", "l")
    assert listing.stderr == "" and any(UNKNOWN in w for w in json.loads(listing.stdout)["warnings"])
    berlin = json.loads(_pyz(pyz, tmp_path, "Europe/Berlin", "--json", "info").stdout)
    assert berlin["data"]["timezone"] == {"name": "Europe/Berlin", "source": "TZ"} and berlin["warnings"] == []


@pytest.mark.slow
def test_pyz_fold_booking_reads_right(pyz, tmp_path):
    booked = _pyz(pyz, tmp_path, "Europe/Berlin", "1", "1h", "--start", "2026-10-25T00:30:00Z")
    assert booked.stdout.startswith("booked 1 GPU (0) shared 10-25 02:30 CEST–02:30 CET")
    # The same booking seen from New York is in no fold there: shown as always.
    assert "10-24 20:30–21:30 " in _pyz(pyz, tmp_path, "America/New_York", "l").stdout
    ny = _pyz(pyz, tmp_path, "America/New_York", "1", "1h", "--start", "2026-11-01T05:30:00Z",
              now="2026-10-31T12:00:00Z")
    assert ny.stdout.startswith("booked 1 GPU (0) shared 11-01 01:30 EDT–01:30 EST")


def test_pyz_a_booking_across_the_spring_gap_names_both_zones(pyz, tmp_path):
    """Issue 30, item 20: 01:30-03:30 on Berlin's spring-forward night is one
    hour; without the zones it read as two."""
    now = "2026-03-20T12:00:00Z"
    booked = _pyz(pyz, tmp_path, "Europe/Berlin", "1", "1h", "-t", "03-29 01:30", now=now)
    assert booked.stdout.startswith("booked 1 GPU (0) shared 03-29 01:30 CET–03:30 CEST"), booked.stdout
    assert "03-29 01:30 CET–03:30 CEST" in _pyz(pyz, tmp_path, "Europe/Berlin", "l", now=now).stdout
    # After the gap, one offset: nothing to mark.
    later = _pyz(pyz, tmp_path, "Europe/Berlin", "1", "1h", "-t", "03-29 04:00", now=now)
    assert later.stdout.startswith("booked 1 GPU (0) shared 03-29 04:00–05:00 ["), later.stdout
