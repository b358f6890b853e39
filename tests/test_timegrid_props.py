"""Property tests for the time grammar: round trips, the grid, and DST.

Hypothesis runs derandomized (a fixed seed derived from each test), without an
example database, so every run explores the same cases and a failure
reproduces exactly; the falsifying example is printed on failure.
"""

from __future__ import annotations

import os
import re
import time
from contextlib import contextmanager
from datetime import date, datetime, timedelta, timezone
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from bk import clock
from bk.core import timegrid as tg
from bk.core.errors import InvalidInput

pytestmark = pytest.mark.slow

try:
    from zoneinfo import ZoneInfo
    ZoneInfo("Australia/Lord_Howe")
except Exception:   # no tz database on this machine
    pytest.skip("needs the IANA tz database", allow_module_level=True)

KEYS = ("Europe/Berlin", "America/New_York", "Asia/Shanghai", "Australia/Lord_Howe")
ZONES = {k: ZoneInfo(k) for k in KEYS}
# Every offset of these zones (+10:30 and +11 included) is a multiple of 30
# minutes, so with these slices the grid falls on local wall-clock minutes.
LOCAL_SLOTS = (1, 5, 10, 15, 30)
ALL_SLOTS = (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60)

LO = int(datetime(2024, 1, 1, tzinfo=timezone.utc).timestamp())
HI = int(datetime(2029, 1, 1, tzinfo=timezone.utc).timestamp())


def fast(n: int):
    return settings(max_examples=n, derandomize=True, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def offset(u: int, tz) -> int:
    return datetime.fromtimestamp(u, tz).utcoffset() // timedelta(seconds=1)


def transitions(tz) -> list[int]:
    """Every instant in [LO, HI) at which ``tz`` changes offset (a daily scan, then bisection)."""
    out = []
    for day in range(LO, HI, 86400):
        if offset(day, tz) != offset(day + 86400, tz):
            lo, hi = day, day + 86400
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if offset(mid, tz) == offset(lo, tz) else (lo, mid)
            out.append(hi)
    return out


TRANSITIONS = {k: transitions(z) for k, z in ZONES.items()}


def test_the_zones_have_the_transitions_we_expect():
    assert not TRANSITIONS["Asia/Shanghai"]
    for key in ("Europe/Berlin", "America/New_York", "Australia/Lord_Howe"):
        assert len(TRANSITIONS[key]) == 10, key   # two a year for five years
    shifts = {abs(offset(t, ZONES["Australia/Lord_Howe"]) - offset(t - 1, ZONES["Australia/Lord_Howe"]))
              for t in TRANSITIONS["Australia/Lord_Howe"]}
    assert shifts == {1800}


@st.composite
def zone_and_now(draw):
    """A zone and a ``now``, half the time within two days of one of its transitions."""
    key = draw(st.sampled_from(KEYS))
    if TRANSITIONS[key] and draw(st.booleans()):
        now = draw(st.sampled_from(TRANSITIONS[key])) + draw(st.integers(-2 * 86400, 2 * 86400))
    else:
        now = draw(st.integers(LO + 3 * 86400, HI - 3 * 86400))
    return key, ZONES[key], now


def wall_exists(day: date, h: int, m: int, tz) -> bool:
    """Oracle, independent of timegrid: some instant shows ``day h:m`` on the local clock."""
    wall = datetime(day.year, day.month, day.day, h, m)
    guess = int(wall.replace(tzinfo=timezone.utc).timestamp())
    offsets = {offset(guess + d, tz) for d in range(-2 * 86400, 2 * 86400 + 1, 3600)}
    return any(datetime.fromtimestamp(guess - o, tz).replace(tzinfo=None) == wall for o in offsets)


# ---------------------------------------------------------------- durations and memory

@fast(300)
@given(st.sampled_from(ALL_SLOTS), st.integers(1, 10**6))
def test_duration_round_trip(slot, k):
    seconds = k * slot * 60
    if seconds > tg.MAX_DURATION_DAYS * 86400:
        return
    text = tg.format_duration(seconds)
    assert re.fullmatch(r"(\d+d)?(\d+h)?(\d+m)?", text)
    assert tg.parse_duration(text, slot) == seconds


@fast(300)
@given(st.text(alphabet="0123456789dhmDHMs .-+", max_size=12), st.sampled_from(ALL_SLOTS))
def test_duration_accepts_or_explains(text, slot):
    try:
        seconds = tg.parse_duration(text, slot)
    except InvalidInput as err:
        assert err.hint
        return
    assert seconds > 0 and seconds % (slot * 60) == 0


@fast(300)
@given(st.integers(1, 10**9))
def test_memory_round_trip(mib):
    assert tg.parse_memory(tg.format_memory(mib)) == mib


@fast(300)
@given(st.integers(0, 10**6), st.text(alphabet="0123456789", max_size=4), st.sampled_from(["g", "gb", "GiB", "m", "MB"]))
def test_memory_is_exact(whole, frac, unit):
    text = f"{whole}.{frac}{unit}" if frac else f"{whole}{unit}"
    exact = Fraction(f"{whole}.{frac or 0}") * (1024 if unit[0] in "gG" else 1)
    try:
        mib = tg.parse_memory(text)
    except InvalidInput:
        assert exact == 0 or exact.denominator != 1
        return
    assert mib == exact


# ---------------------------------------------------------------- start times

def render_start(kind: str, now: int, tz, h: int, m: int, delta_days: int) -> str:
    day = datetime.fromtimestamp(now, tz).date() + timedelta(days=delta_days)
    if kind == "clock":
        return f"{h:02d}:{m:02d}"
    if kind == "today":
        return f"today {h:02d}:{m:02d}"
    if kind == "tomorrow":
        return f"tomorrow {h}:{m:02d}"
    if kind == "date":
        return f"{day.isoformat()} {h:02d}:{m:02d}"
    if kind == "month-day":
        return f"{day.month:02d}-{day.day:02d} {h:02d}:{m:02d}"
    return f"{day.isoformat()}T{h:02d}:{m:02d}Z"


@fast(500)
@given(zone_and_now(), st.sampled_from(ALL_SLOTS),
       st.sampled_from(["clock", "today", "tomorrow", "date", "month-day", "iso", "relative", "now"]),
       st.integers(0, 23), st.integers(0, 59), st.integers(-1, 3), st.integers(0, 3000))
def test_every_accepted_start_is_on_the_grid_and_not_past(zn, slot, kind, h, m, delta_days, minutes):
    _, tz, now = zn
    text = "now" if kind == "now" else f"+{minutes}m" if kind == "relative" \
        else render_start(kind, now, tz, h, m, delta_days)
    try:
        spec = tg.parse_start(text, now, tz, slot)
    except InvalidInput as err:
        assert err.hint
        assert kind != "now"
        if kind == "relative":
            assert minutes == 0 or minutes % slot
        return
    cur = tg.floor_slice(now, slot)
    assert spec.t % (slot * 60) == 0
    assert spec.t >= cur
    if kind == "relative":
        assert spec.t == cur + minutes * 60
    if kind == "now":
        assert spec.is_now and spec.t == cur


@st.composite
def clock_near_transition(draw):
    """(zone, now, h, m): often a wall time in or next to a gap or a fold, asked within a day and a half."""
    key, tz, now = draw(zone_and_now())
    if TRANSITIONS[key] and draw(st.booleans()):
        t = draw(st.sampled_from(TRANSITIONS[key]))
        # Read with the offset from before the transition, so spring-forward
        # gaps (wall times no instant shows) are drawn too.
        u = t + draw(st.integers(-5400, 5400))
        wall = datetime(1970, 1, 1) + timedelta(seconds=u + offset(t - 1, tz))
        now = t + draw(st.integers(-36 * 3600, 36 * 3600))
        return tz, now, wall.hour, wall.minute
    return tz, now, draw(st.integers(0, 23)), draw(st.integers(0, 59))


@fast(400)
@given(clock_near_transition(), st.sampled_from(LOCAL_SLOTS))
def test_clock_time_is_its_next_occurrence(zn, slot):
    tz, now, h, m = zn
    m -= m % slot
    text = f"{h:02d}:{m:02d}"
    today = datetime.fromtimestamp(now, tz).date()
    cur = tg.floor_slice(now, slot)
    try:
        spec = tg.parse_start(text, now, tz, slot)
    except InvalidInput as err:
        event("gap")
        assert "does not exist" in err.message, err.message
        day = date.fromisoformat(re.search(r"on (\d{4}-\d\d-\d\d)", err.message)[1])
        assert day in (today, today + timedelta(days=1))
        assert not wall_exists(day, h, m, tz)
        return
    event(f"rolled={spec.rolled_to_tomorrow} ambiguous={spec.ambiguous}")
    shown = datetime.fromtimestamp(spec.t, tz)
    assert (shown.hour, shown.minute) == (h, m)
    assert shown.date() == today + timedelta(days=int(spec.rolled_to_tomorrow))
    assert cur <= spec.t < cur + 2 * 86400
    # The next occurrence: no slice between the current one and it shows h:m.
    for u in range(cur, spec.t, 60 * slot):
        d = datetime.fromtimestamp(u, tz)
        assert (d.hour, d.minute) != (h, m), u


@fast(400)
@given(st.sampled_from(KEYS), st.sampled_from(LOCAL_SLOTS), st.integers(LO, HI),
       st.sampled_from(["clock", "today", "date", "month-day"]))
def test_local_rendering_parses_back_to_the_instant(key, slot, x, kind):
    """parse_start(format_local(x), now=x) == x, folds included: at x the
    first reading of a fold, if x is the second, has passed."""
    tz = ZONES[key]
    x = tg.floor_slice(x, slot)
    d = datetime.fromtimestamp(x, tz)
    text = render_start(kind, x, tz, d.hour, d.minute, 0)
    spec = tg.parse_start(text, x, tz, slot)
    assert spec.t == x
    assert tg.format_local(spec.t, tz).endswith(f"{d.hour:02d}:{d.minute:02d}")


@fast(300)
@given(st.data(), st.sampled_from(("Europe/Berlin", "America/New_York", "Australia/Lord_Howe")),
       st.integers(-600, 600), st.integers(1, 20 * 3600))
def test_round_trip_around_transitions(data, key, k, lead):
    """Every slice within two days of a transition renders and parses back;
    the second reading of a fold parses to the first while both are ahead."""
    tz = ZONES[key]
    x = data.draw(st.sampled_from(TRANSITIONS[key])) + k * 300
    rendered = tg.format_local(x, tz)
    spec = tg.parse_start(rendered, x - lead, tz, 5)
    assert tg.format_local(spec.t, tz) == rendered
    event(f"ambiguous={spec.ambiguous} second={spec.t != x}")
    if spec.t != x:
        shift = abs(offset(x, tz) - offset(x - 86400, tz))
        assert spec.ambiguous and spec.t == x - shift
        assert datetime.fromtimestamp(x, tz).fold == 1


@fast(300)
@given(st.sampled_from(("Europe/Berlin", "America/New_York", "Australia/Lord_Howe")), st.data())
def test_gap_times_never_parse(key, data):
    tz = ZONES[key]
    t = data.draw(st.sampled_from(TRANSITIONS[key]))
    before, after = offset(t - 1, tz), offset(t, tz)
    if after <= before:
        return   # a fold, not a gap
    wall = datetime.fromtimestamp(t - 1, tz) + timedelta(seconds=1)   # the first wall time skipped
    step = data.draw(st.integers(0, (after - before) // 300 - 1))
    skipped = wall + timedelta(minutes=5 * step)
    text = f"{skipped:%Y-%m-%d %H:%M}"
    with pytest.raises(InvalidInput, match="does not exist"):
        tg.parse_start(text, t - 86400, tz, 5)


# ---------------------------------------------------------------- end changes

@fast(400)
@given(zone_and_now(), st.sampled_from(ALL_SLOTS), st.integers(-50, 50), st.integers(1, 100),
       st.sampled_from(["+", "-", "total ", "clock"]), st.integers(0, 3000), st.integers(0, 23),
       st.integers(0, 59))
def test_every_accepted_end_is_on_the_grid_and_ahead(zn, slot, start_k, length_k, kind, minutes, h, m):
    _, tz, now = zn
    step = slot * 60
    start = tg.floor_slice(now, slot) + start_k * step
    end = start + length_k * step
    text = f"{h:02d}:{m:02d}" if kind == "clock" else f"{kind}{minutes}m"
    try:
        new = tg.parse_end_change(text, start, end, now, tz, slot)
    except InvalidInput as err:
        assert err.hint
        return
    assert new % step == 0
    assert new > max(start, tg.floor_slice(now, slot))
    if kind == "+":
        assert new == end + minutes * 60
    elif kind == "total ":
        assert new == start + minutes * 60


# ---------------------------------------------------------------- the libc fallback zone

POSIX_RULES = {
    "Europe/Berlin": "CET-1CEST,M3.5.0,M10.5.0/3",
    "America/New_York": "EST5EDT,M3.2.0,M11.1.0",
    "Australia/Lord_Howe": "<+1030>-10:30<+11>-11,M10.1.0,M4.1.0",
    "Asia/Shanghai": "CST-8",
}


@contextmanager
def libc_tz(rule: str):
    saved = os.environ.get("TZ")
    os.environ["TZ"] = rule
    time.tzset()
    try:
        yield clock.find_local_tz(rule, "/nonexistent")
    finally:
        if saved is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = saved
        time.tzset()
        clock.local_tz.cache_clear()


@pytest.mark.parametrize("key", KEYS)
def test_libc_fallback_matches_zoneinfo(key):
    ref = ZONES[key]
    with libc_tz(POSIX_RULES[key]) as tz:
        assert isinstance(tz, clock.SystemLocalTime)

        @fast(150)
        @given(st.one_of(st.integers(LO, HI),
                         st.builds(lambda t, d: t + d, st.sampled_from(TRANSITIONS[key] or [LO]),
                                   st.integers(-4 * 3600, 4 * 3600))))
        def check(u):
            a, b = datetime.fromtimestamp(u, tz), datetime.fromtimestamp(u, ref)
            assert (a.replace(tzinfo=None), a.fold, a.utcoffset()) == (b.replace(tzinfo=None), b.fold, b.utcoffset())
            assert a.dst() == b.dst()
            wall = b.replace(tzinfo=None)
            for fold in (0, 1):
                assert wall.replace(tzinfo=tz, fold=fold).utcoffset() == wall.replace(tzinfo=ref, fold=fold).utcoffset()
            # The grammar gives the same answers through either zone.
            for text in (f"{wall:%H:%M}", f"tomorrow {wall:%H}:00", f"{wall:%Y-%m-%d %H}:30"):
                assert outcome(text, u, tz) == outcome(text, u, ref)

        check()


def outcome(text, now, tz):
    try:
        return tg.parse_start(text, now, tz, 5)
    except InvalidInput as err:
        key = getattr(tz, "key", None)
        return err.message.replace(key, "local time") if key else err.message
