"""Table tests for the time and unit grammar (bk.core.timegrid) and the clock seam.

Every accepted form and every error path of SPEC section 3 and the end edits
of section 4, with a fixed ``now`` and explicit zones.  The reference instant
is 2026-07-13 12:41:30 in Berlin (CEST, +02:00).
"""

from __future__ import annotations

import os
import shutil
import time
from datetime import datetime, timezone

import pytest

from bk import clock
from bk.core import timegrid as tg
from bk.core.errors import InvalidInput
from bk.core.models import parse_iso

try:
    from zoneinfo import ZoneInfo
    ZoneInfo("Europe/Berlin")
except Exception:   # no tz database on this machine
    pytest.skip("needs the IANA tz database", allow_module_level=True)

BER = ZoneInfo("Europe/Berlin")
NYC = ZoneInfo("America/New_York")
SHA = ZoneInfo("Asia/Shanghai")
LHI = ZoneInfo("Australia/Lord_Howe")
KTM = ZoneInfo("Asia/Kathmandu")
IND = ZoneInfo("Asia/Kolkata")
ZONES = {"BER": BER, "NYC": NYC, "SHA": SHA, "LHI": LHI, "KTM": KTM, "IND": IND, "UTC": timezone.utc}

NOW = parse_iso("2026-07-13T10:41:30Z")       # 12:41:30 CEST


def local(zone: str, text: str, fold: int = 0) -> int:
    """``2026-07-13 20:00`` read in ``zone`` -> epoch seconds."""
    dt = datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=ZONES[zone], fold=fold)
    return int(dt.timestamp())


def expect_error(fn, *args, message: str = "", hint: str = ""):
    with pytest.raises(InvalidInput) as info:
        fn(*args)
    err = info.value
    assert err.code == "invalid_input" and err.exit_code == 2
    assert message.lower() in err.message.lower(), err.message
    assert hint.lower() in (err.hint or "").lower(), err.hint
    assert err.hint, "every grammar error carries a hint with an example"
    return err


# ---------------------------------------------------------------- the grid

@pytest.mark.parametrize("t, slot, floor, ceil", [
    (0, 5, 0, 0),
    (299, 5, 0, 300),
    (300, 5, 300, 300),
    (NOW, 5, parse_iso("2026-07-13T10:40:00Z"), parse_iso("2026-07-13T10:45:00Z")),
    (NOW, 60, parse_iso("2026-07-13T10:00:00Z"), parse_iso("2026-07-13T11:00:00Z")),
    (NOW, 1, parse_iso("2026-07-13T10:41:00Z"), parse_iso("2026-07-13T10:42:00Z")),
    (-1, 5, -300, 0),
])
def test_floor_and_ceil_slice(t, slot, floor, ceil):
    assert tg.floor_slice(t, slot) == floor
    assert tg.ceil_slice(t, slot) == ceil
    assert tg.is_aligned(floor, slot)


@pytest.mark.parametrize("slot", [0, -5, 7, 45, 120, True, 5.0, "5"])
def test_slot_minutes_must_divide_an_hour(slot):
    with pytest.raises(ValueError):
        tg.slot_seconds(slot)


@pytest.mark.parametrize("slot", [1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60])
def test_every_divisor_of_sixty_is_a_slot(slot):
    assert tg.slot_seconds(slot) == slot * 60


# ---------------------------------------------------------------- durations

@pytest.mark.parametrize("text, slot, seconds", [
    ("30m", 5, 1800),
    ("2h", 5, 7200),
    ("1h30m", 5, 5400),
    ("90m", 5, 5400),
    ("1d", 5, 86400),
    ("1d12h", 5, 129600),
    ("1d2h30m", 5, 95400),
    (" 1H30M ", 5, 5400),
    ("1h 30m", 5, 5400),
    ("0h30m", 5, 1800),
    ("1d0h", 60, 86400),
    ("3m", 1, 180),
    ("3m", 3, 180),
    ("15m", 15, 900),
    ("1h", 60, 3600),
    ("3650d", 5, 3650 * 86400),
])
def test_parse_duration(text, slot, seconds):
    assert tg.parse_duration(text, slot) == seconds


@pytest.mark.parametrize("text, slot, message, hint", [
    ("7m", 5, "not a whole number of 5-minute slices; try 5m or 10m", "30m"),
    ("3m", 5, "try 5m", "multiples of 5m"),
    ("1h10m", 60, "try 1h or 2h", "multiples of 60m"),
    ("1h29m", 15, "try 1h15m or 1h30m", "1h30m"),
    ("0m", 5, "is zero", "5m"),
    ("0d0h0m", 5, "is zero", "1h"),
    ("30", 5, "has no unit", "30m"),
    ("-30m", 5, "negative", "30m"),
    ("1.5h", 5, "fraction", "1h30m"),
    ("1,5h", 5, "fraction", "1h30m"),
    ("30m1h", 5, "in the order d, h, m", "1h30m"),
    ("1h1h", 5, "once", "1d12h"),
    ("3s", 5, "unknown unit 's'", "30m"),
    ("2w", 5, "unknown unit 'w'", "1d12h"),
    ("1min", 5, "unknown unit 'min'", "30m"),
    ("", 5, "got nothing", "30m"),
    ("   ", 5, "got nothing", "30m"),
    ("h", 5, "cannot read", "30m"),
    ("3651d", 5, "longer than 3650 days", "30m"),
    ("9999999999h", 5, "cannot read", "30m"),
])
def test_parse_duration_errors(text, slot, message, hint):
    expect_error(tg.parse_duration, text, slot, message=message, hint=hint)


def test_parse_duration_wants_text():
    expect_error(tg.parse_duration, None, 5, message="as text")


@pytest.mark.parametrize("seconds, text", [
    (1800, "30m"), (2700, "45m"), (3600, "1h"), (5400, "1h30m"), (86400, "1d"),
    (129600, "1d12h"), (90060, "1d1h1m"), (0, "0m"), (59, "0m"), (119, "1m"),
])
def test_format_duration(seconds, text):
    assert tg.format_duration(seconds) == text


def test_format_duration_refuses_negative():
    with pytest.raises(ValueError):
        tg.format_duration(-60)


# ---------------------------------------------------------------- memory

@pytest.mark.parametrize("text, mib", [
    ("12g", 12288), ("12gb", 12288), ("12gib", 12288), ("12G", 12288), ("12GB", 12288),
    ("12GiB", 12288), (" 12 g ", 12288), ("512m", 512), ("512mb", 512), ("512MiB", 512),
    ("1.5g", 1536), ("0.5g", 512), (".5g", 512), ("1.25g", 1280), ("1m", 1), ("80g", 81920),
    ("1.0m", 1), ("007g", 7168),
])
def test_parse_memory(text, mib):
    assert tg.parse_memory(text) == mib


@pytest.mark.parametrize("text, message, hint", [
    ("0.3g", "not a whole number of MiB; try 307m or 308m", "12g"),
    ("1.5m", "try 1m or 2m", "512m"),
    ("0.0001m", "try 1m", "1.5g"),
    ("0g", "is zero", "12g"),
    ("0m", "is zero", "12g"),
    ("12", "has no unit", "12g"),
    ("1.5", "has no unit", "1.5g"),
    ("12t", "cannot read", "12g"),
    ("12k", "cannot read", "512m"),
    ("g", "cannot read", "12g"),
    ("-1g", "cannot read", "12g"),
    ("12gi", "cannot read", "12g"),
    ("", "cannot read", "12g"),
])
def test_parse_memory_errors(text, message, hint):
    expect_error(tg.parse_memory, text, message=message, hint=hint)


@pytest.mark.parametrize("mib, text", [
    (12288, "12g"), (1024, "1g"), (1536, "1.5g"), (2560, "2.5g"), (512, "512m"),
    (1, "1m"), (1280, "1280m"), (1025, "1025m"),
])
def test_format_memory(mib, text):
    assert tg.format_memory(mib) == text
    assert tg.parse_memory(text) == mib


@pytest.mark.parametrize("mib", [0, -1])
def test_format_memory_refuses_non_positive(mib):
    with pytest.raises(ValueError):
        tg.format_memory(mib)


# ---------------------------------------------------------------- start times

# (text, zone, now, slot, expected local time in zone, rolled, source, ambiguous)
START_OK = [
    ("now", "BER", NOW, 5, "2026-07-13 12:40", False, "now", False),
    ("NOW", "BER", NOW, 5, "2026-07-13 12:40", False, "now", False),
    ("+30m", "BER", NOW, 5, "2026-07-13 13:10", False, "relative", False),
    ("+1h30m", "BER", NOW, 5, "2026-07-13 14:10", False, "relative", False),
    ("+ 1d", "BER", NOW, 5, "2026-07-14 12:40", False, "relative", False),
    ("+1h", "BER", NOW, 60, "2026-07-13 13:00", False, "relative", False),
    ("20:00", "BER", NOW, 5, "2026-07-13 20:00", False, "time", False),
    ("21:30", "BER", NOW, 5, "2026-07-13 21:30", False, "time", False),
    ("12:40", "BER", NOW, 5, "2026-07-13 12:40", False, "time", False),   # the current slice
    ("12:35", "BER", NOW, 5, "2026-07-14 12:35", True, "time", False),
    ("9", "BER", NOW, 5, "2026-07-14 09:00", True, "time", False),
    ("21", "BER", NOW, 5, "2026-07-13 21:00", False, "time", False),
    ("9am", "BER", NOW, 5, "2026-07-14 09:00", True, "time", False),
    ("9 AM", "BER", NOW, 5, "2026-07-14 09:00", True, "time", False),
    ("9:30pm", "BER", NOW, 5, "2026-07-13 21:30", False, "time", False),
    ("12am", "BER", NOW, 5, "2026-07-14 00:00", True, "time", False),
    ("12pm", "BER", NOW, 5, "2026-07-14 12:00", True, "time", False),
    ("12:45pm", "BER", NOW, 5, "2026-07-13 12:45", False, "time", False),
    ("00:00", "BER", NOW, 5, "2026-07-14 00:00", True, "time", False),
    ("20:00:00", "BER", NOW, 5, "2026-07-13 20:00", False, "time", False),
    ("today 20:00", "BER", NOW, 5, "2026-07-13 20:00", False, "today", False),
    ("Today  9pm", "BER", NOW, 5, "2026-07-13 21:00", False, "today", False),
    ("tomorrow 09:00", "BER", NOW, 5, "2026-07-14 09:00", False, "tomorrow", False),
    ("tom 9", "BER", NOW, 5, "2026-07-14 09:00", False, "tomorrow", False),
    ("tmr 9:30am", "BER", NOW, 5, "2026-07-14 09:30", False, "tomorrow", False),
    ("07-13 20:00", "BER", NOW, 5, "2026-07-13 20:00", False, "month-day", False),
    ("7-14 9pm", "BER", NOW, 5, "2026-07-14 21:00", False, "month-day", False),
    ("12-31 23:55", "BER", NOW, 5, "2026-12-31 23:55", False, "month-day", False),
    ("2026-07-13 20:00", "BER", NOW, 5, "2026-07-13 20:00", False, "date", False),
    ("2026-07-13T20:00", "BER", NOW, 5, "2026-07-13 20:00", False, "date", False),
    ("2026-07-13t20:00:00", "BER", NOW, 5, "2026-07-13 20:00", False, "date", False),
    ("2027-01-02 08:15", "BER", NOW, 5, "2027-01-02 08:15", False, "date", False),
    ("2026-07-13T18:00Z", "BER", NOW, 5, "2026-07-13 20:00", False, "iso", False),
    ("2026-07-13T18:00:00z", "BER", NOW, 5, "2026-07-13 20:00", False, "iso", False),
    ("2026-07-13T20:00+02:00", "BER", NOW, 5, "2026-07-13 20:00", False, "iso", False),
    ("2026-07-13 14:00-0400", "BER", NOW, 5, "2026-07-13 20:00", False, "iso", False),
    ("2026-07-13T23:45+05:45", "KTM", NOW, 5, "2026-07-13 23:45", False, "iso", False),
    # Other zones: the same instant of now is 06:41 in New York, 18:41 in Shanghai.
    ("20:00", "NYC", NOW, 5, "2026-07-13 20:00", False, "time", False),
    ("6:30", "NYC", NOW, 5, "2026-07-14 06:30", True, "time", False),
    ("18:40", "SHA", NOW, 5, "2026-07-13 18:40", False, "time", False),
    ("18:35", "SHA", NOW, 5, "2026-07-14 18:35", True, "time", False),
    ("tomorrow 8:45", "LHI", NOW, 5, "2026-07-14 08:45", False, "tomorrow", False),
    # +05:45 and +05:30 are multiples of 5 minutes: the 5-minute grid lines up.
    ("20:05", "KTM", NOW, 5, "2026-07-13 20:05", False, "time", False),
    ("20:15", "KTM", NOW, 30, "2026-07-13 20:15", False, "time", False),
    ("20:30", "IND", NOW, 60, "2026-07-13 20:30", False, "time", False),
    # Spring forward in Berlin (2026-03-29 02:00 -> 03:00): times around the gap.
    ("tomorrow 01:55", "BER", parse_iso("2026-03-28T12:00:00Z"), 5, "2026-03-29 01:55", False, "tomorrow", False),
    ("tomorrow 03:00", "BER", parse_iso("2026-03-28T12:00:00Z"), 5, "2026-03-29 03:00", False, "tomorrow", False),
    # Today's 02:30 fell in the gap, but it has passed; tomorrow's exists.
    ("02:30", "BER", parse_iso("2026-03-29T08:00:00Z"), 5, "2026-03-30 02:30", True, "time", False),
    # Fall back in Berlin (2026-10-25 03:00 CEST -> 02:00 CET): the first occurrence.
    ("tomorrow 02:30", "BER", parse_iso("2026-10-24T12:00:00Z"), 5, "2026-10-25 02:30", False, "tomorrow", True),
    ("2026-10-25 02:00", "BER", parse_iso("2026-10-24T12:00:00Z"), 5, "2026-10-25 02:00", False, "date", True),
    ("tomorrow 03:00", "BER", parse_iso("2026-10-24T12:00:00Z"), 5, "2026-10-25 03:00", False, "tomorrow", False),
    # Spring forward in New York (2026-03-08 02:00 -> 03:00), fall back 2026-11-01 02:00 -> 01:00.
    ("tomorrow 3:00", "NYC", parse_iso("2026-03-07T17:00:00Z"), 5, "2026-03-08 03:00", False, "tomorrow", False),
    ("1:30am", "NYC", parse_iso("2026-10-31T17:00:00Z"), 5, "2026-11-01 01:30", True, "time", True),
    # Lord Howe moves by 30 minutes: 02:00 -> 02:30 in October, 02:00 -> 01:30 in April.
    ("tomorrow 02:30", "LHI", parse_iso("2026-10-03T00:00:00Z"), 5, "2026-10-04 02:30", False, "tomorrow", False),
    ("tomorrow 01:45", "LHI", parse_iso("2026-04-04T00:00:00Z"), 5, "2026-04-05 01:45", False, "tomorrow", True),
    ("tomorrow 01:25", "LHI", parse_iso("2026-04-04T00:00:00Z"), 5, "2026-04-05 01:25", False, "tomorrow", False),
]


@pytest.mark.parametrize("text, zone, now, slot, expected, rolled, source, ambiguous", START_OK)
def test_parse_start(text, zone, now, slot, expected, rolled, source, ambiguous):
    spec = tg.parse_start(text, now, ZONES[zone], slot)
    assert tg.format_local(spec.t, ZONES[zone]) == expected
    assert spec.t == local(zone, expected) or spec.ambiguous
    assert (spec.rolled_to_tomorrow, spec.source, spec.ambiguous) == (rolled, source, ambiguous)
    assert spec.is_now == (source == "now")
    assert spec.t % (slot * 60) == 0 and spec.t >= tg.floor_slice(now, slot)


def test_fold_takes_the_second_occurrence_once_the_first_has_passed():
    # 2026-10-25 02:10 CET: the second pass through 02:xx in Berlin.
    now = parse_iso("2026-10-25T01:10:00Z")
    spec = tg.parse_start("02:30", now, BER, 5)
    assert spec.t == parse_iso("2026-10-25T01:30:00Z")
    assert (spec.rolled_to_tomorrow, spec.ambiguous) == (False, True)
    # During the first pass (02:10 CEST) the first occurrence is still ahead.
    spec = tg.parse_start("02:30", parse_iso("2026-10-25T00:10:00Z"), BER, 5)
    assert spec.t == parse_iso("2026-10-25T00:30:00Z")


def test_start_is_exact_for_every_form():
    assert tg.parse_start("2026-07-13T18:00Z", NOW, BER, 5).t == parse_iso("2026-07-13T18:00:00Z")
    assert tg.parse_start("+30m", NOW, BER, 5).t == parse_iso("2026-07-13T11:10:00Z")
    assert tg.parse_start("now", NOW, BER, 5).t == parse_iso("2026-07-13T10:40:00Z")


BERLIN_SPRING = parse_iso("2026-03-28T12:00:00Z")

# (text, zone, now, slot, in the message, in the hint)
START_ERR = [
    ("20:03", "BER", NOW, 5, "'20:03' is not on a 5-minute boundary; try 20:00 or 20:05", "20:05"),
    ("12:42", "BER", NOW, 5, "try 12:40 or 12:45", "12:45"),   # 12:40 is the current slice: valid
    ("20:03", "BER", parse_iso("2026-07-13T18:04:00Z"), 5, "try 20:00 or 20:05", "20:05"),
    ("tomorrow 09:07", "BER", NOW, 5, "try 07-14 09:05 or 07-14 09:10", "09:10"),
    ("20:10", "BER", NOW, 15, "15-minute boundary; try 20:00 or 20:15", "20:15"),
    ("+7m", "BER", NOW, 5, "try 5m or 10m", "multiples of 5m"),
    ("+0m", "BER", NOW, 5, "is zero", "5m"),
    ("-15m", "BER", NOW, 5, "in the past", "now"),
    ("today 08:00", "BER", NOW, 5, "in the past: it is now 12:41", "now (12:40), then 12:45"),
    ("today 12:35", "BER", NOW, 5, "in the past", "12:45"),
    ("07-12 20:00", "BER", NOW, 5, "in the past", "2027-07-12 20:00"),
    ("2026-07-13 12:35", "BER", NOW, 5, "in the past", "12:40"),
    ("2025-01-01T00:00Z", "BER", NOW, 5, "in the past", "2026-07-13T10:40:00Z"),
    ("2026-07-13T20:03:00+02:00", "BER", NOW, 5, "try 2026-07-13T18:00:00Z or 2026-07-13T18:05:00Z", "18:05"),
    ("2026-07-13 20:00:30", "BER", NOW, 5, "not on a 5-minute boundary", "20:05"),
    ("20:00", "KTM", NOW, 30, "30-minute boundary; try 19:45 or 20:15", "20:15"),
    ("20:00", "IND", NOW, 60, "try 19:30 or 20:30", "20:30"),
    ("foo", "BER", NOW, 5, "cannot read 'foo' as a time", "tomorrow 09:00"),
    ("", "BER", NOW, 5, "cannot read", "now"),
    ("tomorrow", "BER", NOW, 5, "has a day but no time", "tomorrow 09:00"),
    ("07-14", "BER", NOW, 5, "has a day but no time", "07-14 09:00"),
    ("2026-07-14", "BER", NOW, 5, "has a day but no time", "2026-07-14 09:00"),
    ("yesterday 9", "BER", NOW, 5, "cannot read", "+30m"),
    ("25:00", "BER", NOW, 5, "not a clock time", "20:00"),
    ("24:00", "BER", NOW, 5, "not a clock time", "00:00"),
    ("20:60", "BER", NOW, 5, "not a clock time", "09:30"),
    ("13pm", "BER", NOW, 5, "hour is 1 to 12", "9am"),
    ("0am", "BER", NOW, 5, "hour is 1 to 12", "12pm"),
    ("930", "BER", NOW, 5, "cannot read", "20:00"),
    ("9:5", "BER", NOW, 5, "cannot read", "20:00"),
    ("02-30 10:00", "BER", NOW, 5, "no such date", "07-13"),
    ("2026-13-01 10:00", "BER", NOW, 5, "no such date", "YYYY-MM-DD"),
    ("20:00+02:00", "BER", NOW, 5, "offset needs a full date", "2026-07-13T20:00+02:00"),
    ("today 20:00Z", "BER", NOW, 5, "offset needs a full date", "+02:00"),
    ("2026-07-13T20:00+25:00", "BER", NOW, 5, "bad UTC offset", "+02:00"),
    # Spring-forward gaps are named, with the real jump.
    ("tomorrow 02:30", "BER", BERLIN_SPRING, 5, "does not exist in Europe/Berlin: on 2026-03-29 the clocks "
     "jump from 02:00 to 03:00", "03:00"),
    ("2026-03-29 02:00", "BER", BERLIN_SPRING, 5, "from 02:00 to 03:00", "03:00"),
    ("03-29 02:55", "BER", BERLIN_SPRING, 5, "does not exist", "03:00"),
    # Today's 02:30 has passed (it is 23:00), tomorrow's is in the gap.
    ("02:30", "BER", parse_iso("2026-03-28T22:00:00Z"), 5, "does not exist", "03:00"),
    ("tomorrow 2:15am", "NYC", parse_iso("2026-03-07T17:00:00Z"), 5, "America/New_York: on 2026-03-08 the "
     "clocks jump from 02:00 to 03:00", "03:00"),
    ("tomorrow 02:10", "LHI", parse_iso("2026-10-03T00:00:00Z"), 5, "from 02:00 to 02:30", "02:30"),
]


@pytest.mark.parametrize("text, zone, now, slot, message, hint", START_ERR)
def test_parse_start_errors(text, zone, now, slot, message, hint):
    expect_error(tg.parse_start, text, now, ZONES[zone], slot, message=message, hint=hint)


def test_a_gap_today_is_an_error_while_it_is_still_ahead():
    err = expect_error(tg.parse_start, "02:30", parse_iso("2026-03-28T23:30:00Z"), BER, 5,
                       message="does not exist")
    assert "2026-03-29" in err.message


def test_start_wants_text():
    expect_error(tg.parse_start, 2000, NOW, BER, 5, message="as text")


# ---------------------------------------------------------------- --start ISO

@pytest.mark.parametrize("text, expected", [
    ("2026-07-13T18:00:00Z", "2026-07-13T18:00:00Z"),
    ("2026-07-13T18:00Z", "2026-07-13T18:00:00Z"),
    ("2026-07-13 18:00:00+00:00", "2026-07-13T18:00:00Z"),
    ("2026-07-13T20:00:00+02:00", "2026-07-13T18:00:00Z"),
    ("2026-07-13T13:00:00-0500", "2026-07-13T18:00:00Z"),
    ("2026-07-13t18:00:00z", "2026-07-13T18:00:00Z"),
    (" 2026-07-13T10:40:00Z ", "2026-07-13T10:40:00Z"),   # the current slice
])
def test_parse_iso_start(text, expected):
    assert tg.parse_iso_start(text, NOW, 5) == parse_iso(expected)


@pytest.mark.parametrize("text, slot, message, hint", [
    ("2026-07-13T18:03:00Z", 5, "try 2026-07-13T18:00:00Z or 2026-07-13T18:05:00Z", "2026-07-13T18:05:00Z"),
    ("2026-07-13T18:00:30Z", 5, "not on a 5-minute boundary", "18:05"),
    ("2026-07-13T18:30:00Z", 60, "60-minute boundary", "19:00"),
    ("2026-07-13T10:35:00Z", 5, "in the past; it is now 2026-07-13T10:41:30Z", "2026-07-13T10:40:00Z"),
    ("2026-07-13T18:00:00", 5, "with a Z or an offset", "2026-07-13T18:00:00Z"),
    ("2026-07-13", 5, "with a Z or an offset", "Z"),
    ("tomorrow 09:00", 5, "with a Z or an offset", "Z"),
    ("2026-02-30T18:00:00Z", 5, "no such date", "YYYY-MM-DD"),
    ("2026-07-13T24:00:00Z", 5, "not a clock time", "00:00"),
    ("2026-07-13T18:00:00+24:00", 5, "bad UTC offset", "+02:00"),
])
def test_parse_iso_start_errors(text, slot, message, hint):
    expect_error(tg.parse_iso_start, text, NOW, slot, message=message, hint=hint)


# ---------------------------------------------------------------- end changes

ACTIVE = (local("BER", "2026-07-13 11:00"), local("BER", "2026-07-13 15:00"))     # running since 11:00
UPCOMING = (local("BER", "2026-07-14 21:00"), local("BER", "2026-07-14 23:00"))
LONG = (local("BER", "2026-07-11 21:00"), local("BER", "2026-07-15 21:00"))       # started two days ago

# (text, booking, slot, expected local end)
END_OK = [
    ("+30m", ACTIVE, 5, "2026-07-13 15:30"),
    ("+1d", ACTIVE, 5, "2026-07-14 15:00"),
    ("-15m", ACTIVE, 5, "2026-07-13 14:45"),
    ("-2h15m", ACTIVE, 5, "2026-07-13 12:45"),    # the end of the current slice: "stop now"
    ("20:00", ACTIVE, 5, "2026-07-13 20:00"),
    ("12:45", ACTIVE, 5, "2026-07-13 12:45"),
    ("8pm", ACTIVE, 5, "2026-07-13 20:00"),
    ("10:00", ACTIVE, 5, "2026-07-14 10:00"),     # the first 10:00 after the start
    ("total 2h", ACTIVE, 5, "2026-07-13 13:00"),
    ("TOTAL=3h", ACTIVE, 5, "2026-07-13 14:00"),
    ("tomorrow 09:00", ACTIVE, 5, "2026-07-14 09:00"),
    ("07-13 16:00", ACTIVE, 5, "2026-07-13 16:00"),
    ("2026-07-13T18:00Z", ACTIVE, 5, "2026-07-13 20:00"),
    ("+1h", ACTIVE, 60, "2026-07-13 16:00"),
    ("22:00", UPCOMING, 5, "2026-07-14 22:00"),
    ("20:00", UPCOMING, 5, "2026-07-15 20:00"),   # the first 20:00 after a 21:00 start
    ("-1h", UPCOMING, 5, "2026-07-14 22:00"),
    ("total 30m", UPCOMING, 5, "2026-07-14 21:30"),
    ("20:00", LONG, 5, "2026-07-13 20:00"),       # today's, not the first after the start
    ("-2d", LONG, 5, "2026-07-13 21:00"),
]


@pytest.mark.parametrize("text, booking, slot, expected", END_OK)
def test_parse_end_change(text, booking, slot, expected):
    new = tg.parse_end_change(text, *booking, NOW, BER, slot)
    assert new == local("BER", expected)


# (text, booking, slot, in the message, in the hint)
END_ERR = [
    ("-3h", ACTIVE, 5, "new end 12:00 would be in the past; the earliest end is 12:45", "end at 12:45"),
    ("12:40", ACTIVE, 5, "in the past", "12:45"),
    ("total 1h", ACTIVE, 5, "in the past", "cancel"),
    ("07-13 10:00", ACTIVE, 5, "before the booking starts", "12:45"),
    ("-2h", UPCOMING, 5, "before the booking starts; the earliest end is 07-14 21:05", "21:05"),
    ("10:00", LONG, 5, "in the past", "12:45"),      # today's 10:00 is gone: no silent jump to tomorrow
    ("12:42", ACTIVE, 5, "not on a 5-minute boundary; try 12:45", "12:45"),
    ("20:10", ACTIVE, 15, "try 20:00 or 20:15", "20:15"),
    ("+7m", ACTIVE, 5, "try 5m or 10m", "5m"),
    ("total 0m", ACTIVE, 5, "is zero", "5m"),
    ("2h", ACTIVE, 5, "ambiguous", "+2h"),
    ("1h30m", ACTIVE, 5, "ambiguous", "total 1h30m"),
    ("foo", ACTIVE, 5, "cannot read", "total 2h"),
    ("", ACTIVE, 5, "cannot read", "+30m"),
    ("tomorrow", ACTIVE, 5, "has a day but no time", "tomorrow 09:00"),
    ("25:00", ACTIVE, 5, "not a clock time", "20:00"),
    ("20:00+02:00", ACTIVE, 5, "offset needs a full date", "2026-07-13T20:00+02:00"),
]


@pytest.mark.parametrize("text, booking, slot, message, hint", END_ERR)
def test_parse_end_change_errors(text, booking, slot, message, hint):
    expect_error(tg.parse_end_change, text, *booking, NOW, BER, slot, message=message, hint=hint)


def test_end_change_in_a_gap_is_named():
    start, end = parse_iso("2026-03-28T20:00:00Z"), parse_iso("2026-03-28T22:00:00Z")
    expect_error(tg.parse_end_change, "02:30", start, end, parse_iso("2026-03-28T20:30:00Z"), BER, 5,
                 message="from 02:00 to 03:00", hint="03:00")


# ---------------------------------------------------------------- rendering

T = local("BER", "2026-07-13 20:00")


@pytest.mark.parametrize("t, zone, now, compact, text", [
    (T, "BER", None, False, "2026-07-13 20:00"),
    (T, "BER", None, True, "07-13 20:00"),
    (T, "BER", NOW, True, "07-13 20:00"),
    (T, "BER", NOW - 365 * 86400, True, "2026-07-13 20:00"),   # another year: keep the year
    (T, "BER", NOW - 365 * 86400, False, "2026-07-13 20:00"),
    (T, "NYC", None, False, "2026-07-13 14:00"),
    (T, "SHA", None, True, "07-14 02:00"),
    (T, "LHI", None, False, "2026-07-14 04:30"),
    (T, "KTM", None, False, "2026-07-13 23:45"),
    (T + 59, "BER", None, False, "2026-07-13 20:00"),
    (parse_iso("2026-10-25T00:30:00Z"), "BER", None, False, "2026-10-25 02:30"),
    (parse_iso("2026-10-25T01:30:00Z"), "BER", None, False, "2026-10-25 02:30"),
])
def test_format_local(t, zone, now, compact, text):
    assert tg.format_local(t, ZONES[zone], now=now, compact=compact) == text


@pytest.mark.parametrize("t, text", [
    (T, "20:00"),
    (local("BER", "2026-07-13 00:00"), "00:00"),
    (local("BER", "2026-07-14 00:00"), "07-14 00:00"),
    (local("BER", "2026-07-12 23:55"), "07-12 23:55"),
    (local("BER", "2027-01-01 09:00"), "2027-01-01 09:00"),
])
def test_format_local_short(t, text):
    assert tg.format_local_short(t, BER, NOW) == text


@pytest.mark.parametrize("start, end, now, text", [
    ("2026-07-13 20:00", "2026-07-13 21:30", NOW, "07-13 20:00–21:30"),
    ("2026-07-13 22:00", "2026-07-14 02:00", NOW, "07-13 22:00–07-14 02:00"),
    ("2026-07-13 22:00", "2026-07-14 00:00", NOW, "07-13 22:00–07-14 00:00"),
    ("2026-12-31 22:00", "2027-01-01 02:00", NOW, "12-31 22:00–2027-01-01 02:00"),
    ("2026-07-13 20:00", "2026-07-13 21:30", NOW + 365 * 86400, "2026-07-13 20:00–21:30"),
])
def test_format_span(start, end, now, text):
    assert tg.format_span(local("BER", start), local("BER", end), BER, now) == text


# ---------------------------------------------------------------- the clock seam

@pytest.fixture
def env(monkeypatch):
    """Set or clear TZ / BK_NOW; restores libc's zone and the tz cache afterwards."""
    def set_var(name, value):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
        clock.local_tz.cache_clear()
    yield set_var
    monkeypatch.undo()
    time.tzset()
    clock.local_tz.cache_clear()


@pytest.mark.parametrize("value, expected", [
    ("1783939290", 1783939290),
    ("1783939290.9", 1783939290),
    (" 1783939290 ", 1783939290),
    ("2026-07-13T10:41:30Z", 1783939290),
    ("2026-07-13T12:41:30+02:00", 1783939290),
])
def test_bk_now_fixes_the_clock(env, value, expected):
    env("BK_NOW", value)
    assert clock.now() == expected


@pytest.mark.parametrize("value", ["yesterday", "2026-07-13T10:41:30", "-5", "12:00"])
def test_bk_now_must_be_readable(env, value):
    env("BK_NOW", value)
    err = expect_error(clock.now, message="BK_NOW", hint="tests")
    assert "2026-07-13T10:41:00Z" in err.hint


def test_real_clock_without_bk_now(env):
    env("BK_NOW", None)
    before = int(time.time())
    assert before <= clock.now() <= int(time.time())
    assert isinstance(clock.now(), int)
    a = clock.monotonic()
    assert clock.monotonic() >= a


@pytest.mark.parametrize("value, key", [
    ("Europe/Berlin", "Europe/Berlin"),
    (":Europe/Berlin", "Europe/Berlin"),
    ("America/New_York", "America/New_York"),
    ("/usr/share/zoneinfo/Asia/Shanghai", "Asia/Shanghai"),
    (":/usr/share/zoneinfo/Australia/Lord_Howe", "Australia/Lord_Howe"),
])
def test_tz_names_and_files(env, value, key):
    if value.lstrip(":").startswith("/") and not os.path.exists(value.lstrip(":")):
        pytest.skip("no system tz database at /usr/share/zoneinfo")
    env("TZ", value)
    zone = clock.local_tz()
    assert str(zone) == key
    assert datetime.fromtimestamp(NOW, zone).utcoffset() == datetime.fromtimestamp(NOW, ZoneInfo(key)).utcoffset()


@pytest.mark.parametrize("value", ["", ":", "UTC0"])
def test_tz_empty_or_utc_rule_is_utc(env, value):
    env("TZ", value)
    assert clock.local_tz().utcoffset(None) == timezone.utc.utcoffset(None)
    assert datetime.fromtimestamp(NOW, clock.local_tz()).utcoffset().total_seconds() == 0


def test_tz_posix_rule_uses_libc_with_dst(env):
    env("TZ", "CET-1CEST,M3.5.0,M10.5.0/3")
    zone = clock.local_tz()
    assert isinstance(zone, clock.SystemLocalTime)
    assert tg.format_local(NOW, zone) == "2026-07-13 12:41"
    assert tg.format_local(parse_iso("2026-01-13T10:41:30Z"), zone) == "2026-01-13 11:41"
    assert datetime.fromtimestamp(NOW, zone).tzname() == "CEST"
    assert datetime.fromtimestamp(NOW, zone).dst().total_seconds() == 3600
    expect_error(tg.parse_start, "tomorrow 02:30", BERLIN_SPRING, zone, 5, message="from 02:00 to 03:00")


def test_local_tz_is_cached(env):
    env("TZ", "Europe/Berlin")
    first = clock.local_tz()
    os.environ["TZ"] = "Asia/Shanghai"   # the fixture's monkeypatch restores it
    assert clock.local_tz() is first
    clock.local_tz.cache_clear()
    assert str(clock.local_tz()) == "Asia/Shanghai"


def test_etc_localtime_symlink(env, tmp_path, monkeypatch):
    target = "/usr/share/zoneinfo/Asia/Shanghai"
    if not os.path.exists(target):
        pytest.skip("no system tz database")
    link = tmp_path / "localtime"
    link.symlink_to(target)
    monkeypatch.setattr(clock, "ETC_LOCALTIME", str(link))
    env("TZ", None)
    assert str(clock.local_tz()) == "Asia/Shanghai"


def test_etc_localtime_plain_file(env, tmp_path, monkeypatch):
    source = "/usr/share/zoneinfo/America/New_York"
    if not os.path.exists(source):
        pytest.skip("no system tz database")
    copy = tmp_path / "localtime"
    shutil.copyfile(source, copy)
    monkeypatch.setattr(clock, "ETC_LOCALTIME", str(copy))
    env("TZ", None)
    zone = clock.local_tz()
    assert tg.format_local(NOW, zone) == "2026-07-13 06:41"


def test_etc_localtime_missing_falls_back_to_libc(env, tmp_path, monkeypatch):
    monkeypatch.setattr(clock, "ETC_LOCALTIME", str(tmp_path / "missing"))
    env("TZ", None)
    zone = clock.local_tz()
    # Whatever libc thinks local time is, the fallback agrees with it.
    assert datetime.fromtimestamp(NOW, zone).utcoffset().total_seconds() == time.localtime(NOW).tm_gmtoff


def test_unknown_zone_name_falls_back_to_libc(env):
    env("TZ", "Nowhere/Atlantis")
    zone = clock.local_tz()
    assert datetime.fromtimestamp(NOW, zone).utcoffset().total_seconds() == time.localtime(NOW).tm_gmtoff
