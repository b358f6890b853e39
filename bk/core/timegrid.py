"""The time and unit grammar (SPEC section 3) and how times, and the
bookings that hold them, are shown to people.

The last part of this module is the one place where a booking's words are
made for a person: its GPUs, mode and share, memory, time window and
status (``summary_line``, ``mode_text``, ``status_text``, ``when_text``,
``gpus_text``, ``mem_text``, ``share_text``).  The CLI's tables and lines
and the TUI's table call these same functions, so a booking reads the same
on the command line and on the screen.  Text someone else wrote (a note, a
user name) is not made here: it passes ``bk.core.safetext.safe``.

The facts that shape this module:

* Bookings live on a grid of slices of ``slot_minutes`` (a divisor of 60).
  The grid is aligned to the Unix epoch, so it is the same on every host and
  needs no time zone to compute.  A local wall clock is the epoch plus the UTC
  offset, so the grid also falls on local minute boundaries whenever the
  offset is a multiple of the slice: every whole-hour zone, India (+05:30),
  Nepal (+05:45) and Lord Howe (+10:30, with a 30-minute DST shift) all line
  up with 5-minute slices because 30 and 45 are multiples of 5.  Where they do
  not (Nepal with 30- or 60-minute slices, historical offsets with seconds),
  the slices start at odd-looking local times (19:45, 20:15 in Nepal with
  30-minute slices); nothing breaks, and the error for an unaligned time names
  the nearest valid local times, so users learn the grid from the tool.
* Local time is not a function of the wall clock: on a spring-forward day some
  readings never happen (a gap), on a fall-back day some happen twice (a
  fold).  PEP 495's ``fold`` picks between the two readings of a fold
  (``fold=0`` is the earlier instant) and, inside a gap, which offset to apply.
  We ask the tzinfo for both readings and compare: equal means an ordinary
  time, different and round-tripping means a fold, not round-tripping means a
  gap.  This works for any PEP 495 tzinfo, not only ``zoneinfo``.
* The caller owns the clock and the zone: ``now`` (epoch seconds, UTC) and
  ``tz`` are arguments, so this module stays pure and every test is exact.

The decisions:

* ``now`` and relative starts (``+30m``) count from the start of the current
  slice: at 12:41 ``now`` is 12:40 and ``+30m`` is 13:10, so a relative start
  is always on the grid.
* A bare clock time (``20:00``) is its next occurrence: today unless today's
  is before the current slice, then tomorrow (``rolled_to_tomorrow``).  A
  clock time in the current slice (``20:00`` at 20:03) is today's.
* A gap time is an error naming the gap.  A fold time takes its first
  occurrence, or the second when the first has already gone by.
* Every explicit start must be on the grid and not before the current slice;
  errors name the nearest valid times in local time.
"""

from __future__ import annotations

from bk.core.errors import InvalidInput
from bk.core.lazyre import Pattern
from bk.core.models import EXCLUSIVE, iso
from bk.core.record import dataclass
from bk.core.utctime import date, datetime, timedelta, tzinfo

_SECOND = timedelta(seconds=1)
_DAY_S = 86400
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()

# A sanity bound, not a policy (the administrator's max_booking_hours is
# smaller): it keeps a typo like ``+99999999d`` from reaching date arithmetic.
MAX_DURATION_DAYS = 3650

DURATION_EXAMPLES = "30m, 2h, 1h30m, 1d12h"
MEMORY_EXAMPLES = "12g, 512m, 1.5g"
START_EXAMPLES = "now, +30m, 20:00, 9pm, tomorrow 09:00, 07-13 20:00, 2026-07-13 20:00, 2026-07-13T18:00Z"
END_EXAMPLES = "+30m, -15m, 20:00, total 2h"


# The two words every booking and edit types, a duration and a memory size,
# are read by the scanners below (``_duration_parts``, ``_memory_parts``):
# importing ``re`` costs more than the rest of ``bk 1 30m``'s parsing.  Each
# takes exactly what its pattern in tests/test_timegrid_scanners.py takes,
# which checks the two against each other.  The rarer forms are patterns,
# compiled on first use (bk.core.lazyre).
_WORDS = Pattern(r"[a-z]+")
_CLOCK = r"(?P<h>\d{1,2})(?::(?P<mi>\d{2}))?(?::(?P<s>\d{2}))?\s*(?P<ampm>am|pm)?"
_START = Pattern(
    r"(?:(?P<word>today|tomorrow|tom|tmr)\s+"
    r"|(?P<mo>\d{1,2})-(?P<md>\d{1,2})\s+"
    r"|(?P<y>\d{4})-(?P<ym>\d{1,2})-(?P<yd>\d{1,2})(?:\s+|t))?"
    + _CLOCK
    + r"\s*(?P<off>z|[+-]\d{2}(?::?\d{2})?)?"
)
_DATE_ONLY = Pattern(r"(?:\d{4}-)?\d{1,2}-\d{1,2}|today|tomorrow|tom|tmr")
_ISO = Pattern(r"(\d{4})-(\d{2})-(\d{2})[t ](\d{2}):(\d{2})(?::(\d{2}))?(z|[+-]\d{2}:?\d{2})")


def _digits_end(s: str, i: int) -> int:
    """Where the run of decimal digits (what ``\\d`` matches: any Unicode
    decimal digit, as ``int`` reads them) that starts at ``i`` ends."""
    n = len(s)
    while i < n and s[i].isdecimal():
        i += 1
    return i


def _spaces_end(s: str, i: int) -> int:
    n = len(s)
    while i < n and s[i].isspace():
        i += 1
    return i


def _duration_parts(s: str) -> tuple[str | None, str | None, str | None] | None:
    """The days, hours and minutes of ``s`` as written (None where absent),
    or None when ``s`` is not of the form ``[Nd] [Nh] [Nm]``: up to nine
    digits a part, each unit at most once and in that order, spaces between
    a number and its unit and between parts, and before the first part
    unless it is days (``+ 30m`` is read as ``+30m``, ``+ 1d`` is not:
    the form's pattern, ``(?:(\\d{1,9})\\s*d)?\\s*(?:(\\d{1,9})\\s*h)?\\s*(?:(\\d{1,9})\\s*m)?``).
    All three absent (``""``, ``" "``) comes back as three Nones."""
    parts: list[str | None] = [None, None, None]
    i, n = 0, len(s)
    for k, unit in enumerate("dhm"):
        if k:
            i = _spaces_end(s, i)
        j = _digits_end(s, i)
        if not 1 <= j - i <= 9:
            continue
        u = _spaces_end(s, j)
        if u < n and s[u] == unit:
            parts[k], i = s[i:j], u + 1
    return tuple(parts) if i == n else None


def _memory_parts(s: str) -> tuple[str, str | None, str] | None:
    """``(whole, fraction or None, "g" or "m")`` as written, or None: up to
    15 digits (maybe none), a point and one to nine more, spaces, ``g`` or
    ``m``, then ``b`` or ``ib`` (``(\\d{0,15})(?:\\.(\\d{1,9}))?\\s*([gm])(?:i?b)?``)."""
    i = _digits_end(s, 0)
    if i > 15:
        return None
    whole, frac = s[:i], None
    if s[i:i + 1] == ".":
        j = _digits_end(s, i + 1)
        if not 1 <= j - i - 1 <= 9:
            return None
        frac, i = s[i + 1:j], j
    i = _spaces_end(s, i)
    unit = s[i:i + 1]
    if unit not in ("g", "m") or s[i + 1:] not in ("", "b", "ib"):
        return None
    return whole, frac, unit


# ---------------------------------------------------------------- the grid

def slot_seconds(slot_minutes: int) -> int:
    """Seconds in one slice; ``slot_minutes`` must divide 60 (ValueError otherwise)."""
    if isinstance(slot_minutes, bool) or not isinstance(slot_minutes, int) \
            or slot_minutes <= 0 or 60 % slot_minutes:
        raise ValueError(f"slot_minutes must be a divisor of 60, got {slot_minutes!r}")
    return slot_minutes * 60


def floor_slice(t: int, slot_minutes: int) -> int:
    """Start of the slice containing ``t`` (grid aligned to the UTC epoch)."""
    return t - t % slot_seconds(slot_minutes)


def ceil_slice(t: int, slot_minutes: int) -> int:
    """The first slice boundary at or after ``t``."""
    return -floor_slice(-t, slot_minutes)


def is_aligned(t: int, slot_minutes: int) -> bool:
    return t % slot_seconds(slot_minutes) == 0


# ----------------------------------------------------------- durations

def parse_duration(text: str, slot_minutes: int) -> int:
    """``30m``, ``2h``, ``1h30m``, ``1d12h`` -> seconds, a positive whole number of slices."""
    step = slot_seconds(slot_minutes)
    s = _norm(text, "a duration", DURATION_EXAMPLES)
    parts = _duration_parts(s)
    if parts is None or parts == (None, None, None):
        raise _duration_error(s)
    d, h, mi = (int(g) if g else 0 for g in parts)
    seconds = ((d * 24 + h) * 60 + mi) * 60
    if seconds == 0:
        raise InvalidInput(f"duration {s!r} is zero; it must be at least one {slot_minutes}-minute slice",
                           f"e.g. {format_duration(step)} or 1h")
    if seconds > MAX_DURATION_DAYS * _DAY_S:
        raise InvalidInput(f"duration {s!r} is longer than {MAX_DURATION_DAYS} days",
                           f"examples: {DURATION_EXAMPLES}")
    if seconds % step:
        lo = seconds - seconds % step
        near = " or ".join(format_duration(x) for x in (lo, lo + step) if x > 0)
        raise InvalidInput(f"{s!r} is not a whole number of {slot_minutes}-minute slices; try {near}",
                           f"durations here are multiples of {slot_minutes}m, e.g. {DURATION_EXAMPLES}")
    return seconds


def _duration_error(s: str) -> InvalidInput:
    """Say precisely why ``s`` is not a duration; this is the most-typed word in bk."""
    hint = f"examples: {DURATION_EXAMPLES} (units d, h, m)"
    if not s:
        return InvalidInput("expected a duration, got nothing", hint)
    if s.isdigit():
        return InvalidInput(f"duration {s!r} has no unit", f"add one: {s}m for minutes, {s}h for hours")
    if s.startswith("-"):
        return InvalidInput(f"duration {s!r} is negative; a duration must be positive", hint)
    if "." in s or "," in s:
        return InvalidInput(f"duration {s!r} has a fraction; durations take whole numbers",
                            "write 1h30m instead of 1.5h")
    units = _WORDS.findall(s)
    unknown = [u for u in units if u not in ("d", "h", "m")]
    if unknown:
        return InvalidInput(f"duration {s!r}: unknown unit {unknown[0]!r}; use d (days), h (hours) or m (minutes)",
                            hint)
    if units and len(set(units)) < len(units) or units != sorted(units, key="dhm".index):
        return InvalidInput(f"duration {s!r}: each unit may appear once, in the order d, h, m", hint)
    return InvalidInput(f"cannot read {s!r} as a duration", hint)


def format_duration(seconds: int) -> str:
    """Seconds -> ``1d12h``, ``1h30m``, ``45m`` (whole minutes, rounded down; 0 -> ``0m``)."""
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative: {seconds}")
    d, rest = divmod(seconds // 60, 1440)
    h, m = divmod(rest, 60)
    out = (f"{d}d" if d else "") + (f"{h}h" if h else "") + (f"{m}m" if m else "")
    return out or "0m"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """A count with its noun in the right number, for every sentence that
    counts: ``1 second``, ``2 seconds``, ``0 GPUs``, ``1 minute``.
    ``plural`` for a noun English does not pluralise with an s
    (``counted(n, "process", "processes")``)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


# ------------------------------------------------------------- memory

def parse_memory(text: str) -> int:
    """``12g``, ``12gb``, ``12gib``, ``512m``, ``1.5g`` -> MiB (GiB = 1024 MiB), a positive whole number."""
    s = _norm(text, "a memory size", MEMORY_EXAMPLES)
    hint = f"examples: {MEMORY_EXAMPLES} (g = GiB, m = MiB, per GPU)"
    parts = _memory_parts(s)
    if parts is None or not (parts[0] or parts[1]):
        if s.replace(".", "", 1).isdigit():
            raise InvalidInput(f"memory {s!r} has no unit", f"add one: {s}g for GiB, {s}m for MiB")
        raise InvalidInput(f"cannot read {s!r} as a memory size", hint)
    whole, frac, unit = parts
    frac = frac or ""
    scale = 10 ** len(frac)
    # Exact integer arithmetic: 1.5g is 1536 MiB, not 1535.9999.
    num = (int(whole or 0) * scale + int(frac or 0)) * (1024 if unit == "g" else 1)
    if num == 0:
        raise InvalidInput(f"memory {s!r} is zero; it must be positive", hint)
    if num % scale:
        lo = num // scale
        near = " or ".join(format_memory(x) for x in (lo, lo + 1) if x > 0)
        raise InvalidInput(f"{s!r} is not a whole number of MiB; try {near}", hint)
    return num // scale


def format_memory(mib: int) -> str:
    """MiB -> ``12g``, ``1.5g`` or ``512m``; ``parse_memory`` reads it back exactly."""
    if mib <= 0:
        raise ValueError(f"memory must be positive: {mib}")
    if mib % 1024 == 0:
        return f"{mib // 1024}g"
    if mib > 1024 and mib % 512 == 0:
        return f"{mib // 1024}.5g"
    return f"{mib}m"


# -------------------------------------------------------- start times

@dataclass(frozen=True)
class StartSpec:
    """A resolved start: ``t`` epoch seconds on the grid.

    ``source`` names the form the user wrote: ``now``, ``relative``, ``time``
    (bare clock time), ``today``, ``tomorrow``, ``month-day``, ``date`` (local
    full date) or ``iso`` (with an offset).  ``ambiguous`` is set when the local
    time occurs twice (DST fall-back) so a front end can say which it took.
    """

    t: int
    is_now: bool
    rolled_to_tomorrow: bool
    source: str
    ambiguous: bool = False


def parse_start(text: str, now: int, tz: tzinfo, slot_minutes: int) -> StartSpec:
    """Any start form of SPEC section 3 (see docs/TIME.md) -> a StartSpec."""
    step = slot_seconds(slot_minutes)
    s = _norm(text, "a start time", START_EXAMPLES)
    shown = " ".join(text.split())   # quoted in messages as typed (2026-07-13T18:00Z)
    cur = now - now % step
    if s == "now":
        return StartSpec(cur, True, False, "now")
    if s.startswith("+"):
        return StartSpec(cur + parse_duration(s[1:], slot_minutes), False, False, "relative")
    if s.startswith("-"):
        raise InvalidInput(f"start {shown!r} is in the past; a start is now or later",
                           f"e.g. now or +{format_duration(step)}")
    m = _match_when(s, shown)
    today = _local_date(now, tz)
    day, hms, off, source = _when_fields(m, shown, today)
    render = _short_renderer(tz, now)
    rolled = ambiguous = False
    if off is not None:
        t = _wall_seconds(day, hms) - off
        render = iso
    else:
        if day is None:
            t, ambiguous = _pick_local(shown, today, hms, tz, cur, rolling=True)
            if t < cur:
                rolled = True
                t, ambiguous = _pick_local(shown, today + timedelta(days=1), hms, tz, cur)
        else:
            t, ambiguous = _pick_local(shown, day, hms, tz, cur)
    if t < cur:
        hint = f"the earliest start is now ({render(cur)}), then {render(cur + step)}"
        if source == "month-day":
            hint += f"; for next year write {day.year + 1}-{day.month:02d}-{day.day:02d} {_hm(hms)}"
        raise InvalidInput(f"start {shown!r} is in the past: it is now {render(now)}", hint)
    _check_aligned(shown, t, step, slot_minutes, cur, render)
    return StartSpec(t, False, rolled, source, ambiguous)


def parse_iso_start(text: str, now: int, slot_minutes: int) -> int:
    """The exact machine form ``--start 2026-07-13T18:00:00Z`` (or with an offset) -> epoch seconds."""
    step = slot_seconds(slot_minutes)
    s = _norm(text, "an ISO-8601 start", "2026-07-13T18:00:00Z")
    shown = text.strip()
    m = _ISO.fullmatch(s)
    if not m:
        raise InvalidInput(f"--start wants ISO-8601 with a Z or an offset, got {shown!r}",
                           "e.g. 2026-07-13T18:00:00Z or 2026-07-13T20:00+02:00")
    y, mo, d, h, mi, sec = (int(g) if g else 0 for g in m.groups()[:6])
    day = _date(y, mo, d, shown)
    _check_clock(h, mi, sec, shown)
    t = _wall_seconds(day, (h, mi, sec)) - _offset_seconds(m[7], shown)
    cur = now - now % step
    if t < cur:
        raise InvalidInput(f"start {iso(t)} is in the past; it is now {iso(now)}",
                           f"the earliest start is the current slice, {iso(cur)}")
    _check_aligned(shown, t, step, slot_minutes, cur, iso)
    return t


def parse_end_change(text: str, start: int, end: int, now: int, tz: tzinfo, slot_minutes: int) -> int:
    """A new end for a booking: ``+30m``, ``-15m``, ``20:00``, ``total 2h``, or any dated start form.

    A bare clock time is its first occurrence after ``start`` on or after the
    local date of ``max(start, current slice)``; if that is already past, it
    is an error rather than a silent jump to tomorrow (a shrink the user asked
    for must never become a one-day extension).
    """
    step = slot_seconds(slot_minutes)
    s = _norm(text, "a new end", END_EXAMPLES)
    shown = " ".join(text.split())
    cur = now - now % step
    lower = max(start, cur)
    render = _short_renderer(tz, now)
    if s.startswith(("+", "-")):
        delta = parse_duration(s[1:], slot_minutes)
        new = end + delta if s[0] == "+" else end - delta
    elif s.startswith("total"):
        new = start + parse_duration(s[5:].lstrip(" ="), slot_minutes)
    elif _duration_parts(s) not in (None, (None, None, None)):
        raise InvalidInput(f"{s!r} is ambiguous as a new end",
                           f"write +{s} to extend, -{s} to shorten, or 'total {s}' for the whole length")
    else:
        m = _match_when(s, shown, END_EXAMPLES)
        day, hms, off, _ = _when_fields(m, shown, _local_date(now, tz))
        if off is not None:
            new = _wall_seconds(day, hms) - off
        elif day is not None:
            new, _ = _pick_local(shown, day, hms, tz, cur)
        else:
            base = _local_date(lower, tz)
            new, _ = _pick_local(shown, base, hms, tz, cur)
            if new <= start:
                new, _ = _pick_local(shown, base + timedelta(days=1), hms, tz, cur)
    if new <= lower:
        why = "before the booking starts" if new <= start else "in the past"
        raise InvalidInput(f"the new end {render(new)} would be {why}; the earliest end is {render(lower + step)}",
                           f"end at {render(lower + step)} to stop soon, or cancel the booking")
    _check_aligned(shown, new, step, slot_minutes, lower + step, render)
    return new


# --------------------------------------------------------- rendering

def format_local(t: int, tz: tzinfo, *, now: int | None = None, compact: bool = False,
                 mark_fold: bool = False) -> str:
    """``2026-07-13 20:00``, or compact ``07-13 20:00`` (with the year when ``now`` is another year).

    The plain form is what ``parse_start`` reads back.  With ``mark_fold`` a
    reading that happens twice (a DST fold) gets its zone: ``2026-10-25 02:30 CET``.
    """
    dt = datetime.fromtimestamp(t, tz)
    if compact and (now is None or datetime.fromtimestamp(now, tz).year == dt.year):
        text = f"{dt.month:02d}-{dt.day:02d} {dt.hour:02d}:{dt.minute:02d}"
    else:
        text = f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d} {dt.hour:02d}:{dt.minute:02d}"
    label = fold_label(t, tz) if mark_fold else None
    return f"{text} {label}" if label else text


def format_local_short(t: int, tz: tzinfo, now: int, *, mark_fold: bool = True) -> str:
    """``20:00`` on the local day of ``now``, else as ``format_local(compact=True)``;
    a time in a DST fold with its zone (``02:30 CEST``) unless ``mark_fold`` is false."""
    dt = datetime.fromtimestamp(t, tz)
    if dt.date() != _local_date(now, tz):
        return format_local(t, tz, now=now, compact=True, mark_fold=mark_fold)
    label = fold_label(t, tz) if mark_fold else None
    text = f"{dt.hour:02d}:{dt.minute:02d}"
    return f"{text} {label}" if label else text


def format_span(start: int, end: int, tz: tzinfo, now: int) -> str:
    """``07-13 20:00–21:30`` on one local day, ``07-13 22:00–07-14 02:00`` across days.

    An end that reads as a DST fold gets its zone, and so does a start that
    does, once for both when they share it: ``10-25 02:30 CEST–02:30 CET``
    (an hour across Berlin's fall-back), ``10-25 02:10–02:40 CET`` (inside
    the repeated hour).  A span across a change of the clock (its ends'
    UTC offsets differ) names the zone at both ends, because its readings
    alone mislead about its length: ``03-29 01:30 CET–03:30 CEST`` is one
    hour across the spring-forward gap, ``10-25 01:00 CEST–03:00 CET``
    three across the fall-back.  Every other span is unchanged.
    """
    a = datetime.fromtimestamp(start, tz)
    b = datetime.fromtimestamp(end, tz)
    head = format_local(start, tz, now=now, compact=True)
    tail = f"{b.hour:02d}:{b.minute:02d}" if a.date() == b.date() \
        else format_local(end, tz, now=now, compact=True)
    first, last = fold_label(start, tz), fold_label(end, tz)
    if a.utcoffset() != b.utcoffset():
        names = a.tzname(), b.tzname()
        if all(names) and names[0] != names[1]:
            first, last = first or names[0], last or names[1]
        else:
            first, last = first or _offset_text(a), last or _offset_text(b)
    if first and first == last:
        return f"{head}–{tail} {last}"
    return f"{head}{' ' + first if first else ''}–{tail}{' ' + last if last else ''}"


def _offset_text(dt: datetime) -> str:
    """``+01:00``: a reading's UTC offset, which tells two zones apart when
    their abbreviations do not."""
    offset = dt.utcoffset() or timedelta(0)
    sign, rest = ("-", -offset) if offset < timedelta(0) else ("+", offset)
    minutes = rest // timedelta(minutes=1)
    return f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"


def fold_label(t: int, tz: tzinfo) -> str | None:
    """What tells instant ``t`` from its twin when its local reading happens
    twice (a DST fold), else None.

    The zone abbreviation (``CEST``, ``CET``) when the two readings have
    different ones, else the UTC offset (``+01:00``), which always differs.
    A reading is in a fold when the other value of PEP 495's ``fold`` gives it
    another offset: ``t`` came from ``fromtimestamp``, so its reading exists,
    and a reading that exists with two offsets names two instants.
    """
    dt = datetime.fromtimestamp(t, tz)
    twin = dt.replace(fold=1 - dt.fold)
    offset = dt.utcoffset()
    if offset is None or twin.utcoffset() == offset:
        return None
    name, other = dt.tzname(), twin.tzname()
    if name and other and name != other:
        return name
    return _offset_text(dt)


# ----------------------------------------------------------- helpers

def _norm(text: str, what: str, examples: str) -> str:
    if not isinstance(text, str):
        raise InvalidInput(f"expected {what} as text, got {type(text).__name__}", f"examples: {examples}")
    return " ".join(text.split()).lower()


def _match_when(s: str, shown: str, examples: str = START_EXAMPLES):
    # Before _START: "07-14" would otherwise read as 07:00 at UTC offset -14.
    if _DATE_ONLY.fullmatch(s):
        raise InvalidInput(f"{shown!r} has a day but no time", f"add a clock time, e.g. {shown} 09:00")
    m = _START.fullmatch(s)
    if m:
        return m
    raise InvalidInput(f"cannot read {shown!r} as a time", f"examples: {examples}")


def _when_fields(m, s: str, today: date):
    """-> (date or None for a bare clock time, (h, m, s), offset seconds or None, form name)."""
    h, mi, sec = int(m["h"]), int(m["mi"] or 0), int(m["s"] or 0)
    if m["ampm"]:
        if not 1 <= h <= 12:
            raise InvalidInput(f"{s!r}: with am/pm the hour is 1 to 12", "e.g. 9am, 9:30pm, 12pm (noon)")
        h = h % 12 + (12 if m["ampm"] == "pm" else 0)
    _check_clock(h, mi, sec, s)
    if m["word"]:
        source = "today" if m["word"] == "today" else "tomorrow"
        day = today + timedelta(days=0 if source == "today" else 1)
    elif m["mo"]:
        day, source = _date(today.year, int(m["mo"]), int(m["md"]), s), "month-day"
    elif m["y"]:
        day, source = _date(int(m["y"]), int(m["ym"]), int(m["yd"]), s), "date"
    else:
        day, source = None, "time"
    off = None
    if m["off"]:
        if not m["y"]:
            raise InvalidInput(f"{s!r}: a UTC offset needs a full date", "e.g. 2026-07-13T20:00+02:00")
        off, source = _offset_seconds(m["off"], s), "iso"
    return day, (h, mi, sec), off, source


def _check_clock(h: int, mi: int, sec: int, s: str) -> None:
    if h > 23 or mi > 59 or sec > 59:
        raise InvalidInput(f"{s!r} is not a clock time (hours 0-23, minutes 0-59)",
                           "e.g. 20:00, 09:30, 9pm; midnight is 00:00 of the next day")


def _date(y: int, mo: int, d: int, s: str) -> date:
    try:
        return date(y, mo, d)
    except ValueError:
        raise InvalidInput(f"{s!r}: there is no such date", "dates are YYYY-MM-DD or MM-DD, e.g. 07-13") from None


def _offset_seconds(text: str, s: str) -> int:
    if text == "z":
        return 0
    sign = -1 if text[0] == "-" else 1
    digits = text[1:].replace(":", "")
    h, mi = int(digits[:2]), int(digits[2:] or 0)
    if h > 23 or mi > 59:
        raise InvalidInput(f"{s!r}: bad UTC offset {text!r}", "e.g. Z, +02:00, -05:00")
    return sign * (h * 3600 + mi * 60)


def _wall_seconds(day: date, hms: tuple[int, int, int]) -> int:
    """The wall-clock reading as if it were UTC, in epoch seconds."""
    h, mi, sec = hms
    return (day.toordinal() - _EPOCH_ORDINAL) * _DAY_S + h * 3600 + mi * 60 + sec


def _local_date(t: int, tz: tzinfo) -> date:
    return datetime.fromtimestamp(t, tz).date()


def _hm(hms: tuple[int, int, int]) -> str:
    return f"{hms[0]:02d}:{hms[1]:02d}"


def _short_renderer(tz: tzinfo, now: int):
    # Errors suggest times to type, so the plain form that parses back.
    return lambda t: format_local_short(t, tz, now, mark_fold=False)


def _pick_local(s: str, day: date, hms: tuple[int, int, int], tz: tzinfo, cur: int,
                rolling: bool = False) -> tuple[int, bool]:
    """The instant of local ``day`` + ``hms`` in ``tz`` -> (t, ambiguous).

    A fold gives its first occurrence unless that is before ``cur`` and the
    second is not.  A gap raises, except when ``rolling`` and the gap is
    already behind ``cur``: then it returns the instant after the gap (before
    ``cur``) and the caller moves on to tomorrow; a gap earlier today is no
    reason to refuse tomorrow's time.
    """
    wall = datetime(day.year, day.month, day.day, *hms)
    secs = _wall_seconds(day, hms)
    try:
        t0 = secs - wall.replace(tzinfo=tz).utcoffset() // _SECOND
        t1 = secs - wall.replace(tzinfo=tz, fold=1).utcoffset() // _SECOND
        exists = datetime.fromtimestamp(t0, tz).replace(tzinfo=None) == wall
    except (OverflowError, OSError, ValueError):
        raise InvalidInput(f"{s!r} is out of range", f"examples: {START_EXAMPLES}") from None
    if not exists:
        if rolling and t0 < cur:
            return t0, False
        raise _gap_error(s, day, t1, t0, tz)
    if t0 != t1:
        return (t1 if t0 < cur <= t1 else t0), True
    return t0, False


def _gap_error(s: str, day: date, before: int, after: int, tz: tzinfo) -> InvalidInput:
    """Name the spring-forward gap that swallowed ``s``.

    ``before`` and ``after`` bracket the transition instant (the gap time read
    with the offset after and before it); bisect for the exact second so the
    message shows the real jump, e.g. 02:00 to 03:00 or Lord Howe's 02:00 to 02:30.
    """
    def offset(u: int) -> int:
        return datetime.fromtimestamp(u, tz).utcoffset() // _SECOND

    first = offset(before)
    lo, hi = before, after
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if offset(mid) == first:
            lo = mid
        else:
            hi = mid
    jump_from = datetime.fromtimestamp(hi, tz) - timedelta(seconds=offset(hi) - first)
    jump_to = datetime.fromtimestamp(hi, tz)
    zone = getattr(tz, "key", None) or "local time"
    return InvalidInput(
        f"{s!r} does not exist in {zone}: on {day.isoformat()} the clocks jump from "
        f"{jump_from:%H:%M} to {jump_to:%H:%M}",
        f"pick a time outside the gap, e.g. {jump_to:%H:%M}")


def _check_aligned(s: str, t: int, step: int, slot_minutes: int, earliest: int, render) -> None:
    if t % step == 0:
        return
    lo = t - t % step
    near = [render(x) for x in (lo, lo + step) if x >= earliest] or [render(lo + step)]
    raise InvalidInput(f"{s!r} is not on a {slot_minutes}-minute boundary; try {' or '.join(near)}",
                       f"bookings start and end on the {slot_minutes}-minute grid, e.g. {near[-1]}")


# The time ruler above a timeline's columns, shared by ``bk tl`` and ``bk t``:
# a label (HH:MM, or MM-DD at midnight and for day-wide steps) every so many
# minutes of local wall time, the first interval that leaves room for labels.
LABEL_EVERY_MIN = (15, 30, 60, 120, 180, 240, 360, 720, 1440, 2880, 10080)
LABEL_W = 5


def time_labels(frm: int, n: int, step: int, tz) -> str:
    """``n`` characters of labels for columns ``step`` seconds wide from ``frm``."""
    every = next((m * 60 for m in LABEL_EVERY_MIN if (m * 60) % step == 0 and m * 60 // step > LABEL_W),
                 None)
    line = [" "] * n
    last_end = -1
    for i in range(n):
        t = frm + i * step
        dt = datetime.fromtimestamp(t, tz)
        wall = t + int(dt.utcoffset().total_seconds())
        due = (wall % every == 0) if every else (i % (LABEL_W + 1) == 0)
        if not due or i <= last_end or i + LABEL_W > n:
            continue
        label = dt.strftime("%m-%d") if (dt.hour, dt.minute) == (0, 0) or (every or 0) >= 86400 \
            else dt.strftime("%H:%M")
        line[i:i + LABEL_W] = label
        last_end = i + LABEL_W
    return "".join(line)


# ---------------------------------------------------------------- how a booking reads
#
# The CLI (bk l, st, login, d, e, history, run, slots...) and the TUI's table
# read a booking in these words.  They were two copies once that disagreed
# (the TUI said "shared 1/2", "auto" and "in 1d2h" where the CLI said
# "shared", "-" and "upcoming"); the CLI's words won: the default share is
# not worth a fraction, a missing figure is a dash in every column, and a
# start more than a day away is read from the WHEN column.

def gpus_text(gpus) -> str:
    """``0,1,2,3,6`` -> ``0-3,6``: GPU lists stay short in narrow tables."""
    out, run = [], []
    for g in sorted(gpus):
        if run and g == run[-1] + 1:
            run.append(g)
            continue
        if run:
            out.append(_run_text(run))
        run = [g]
    if run:
        out.append(_run_text(run))
    return ",".join(out)


def _run_text(run: list[int]) -> str:
    if len(run) >= 3:
        return f"{run[0]}-{run[-1]}"
    return ",".join(map(str, run))


def mode_text(r, capacity: int) -> str:
    """``exclusive``, ``shared`` (one share slot), ``shared 2/4`` (more)."""
    if r.mode == EXCLUSIVE:
        return "exclusive"
    return "shared" if r.share == 1 else f"shared {r.share}/{capacity}"


def share_text(used: int, capacity: int) -> str:
    """A GPU's share slots in use: ``1/2``."""
    return f"{used}/{capacity}"


def mem_text(mib: int | None) -> str:
    """The memory figure a booking states, or ``-``."""
    return format_memory(mib) if mib else "-"


def when_text(start: int, end: int, tz: tzinfo, now: int, *, dash: str = "–") -> str:
    """A booking's window (``format_span``), with ``dash`` between its ends
    where the output cannot show an en dash."""
    text = format_span(start, end, tz, now)
    return text if dash == "–" else text.replace("–", dash)


def status_text(r, now: int) -> str:
    """``1h20m left`` (active), ``in 2h05m`` (upcoming within a day), ``upcoming``, ``ended``, ``cancelled``."""
    status = r.status(now)
    if status == "active":
        return f"{format_duration(r.end - now)} left"
    if status == "upcoming" and r.start - now < _DAY_S:
        return f"in {format_duration(r.start - now)}"
    return status


def summary_line(r, *, capacity: int, tz: tzinfo, now: int, show_id: bool = True) -> str:
    """``2 GPUs (0,1) shared 12g 07-13 20:00–21:30 [a1b2c3d4]``"""
    n = len(r.gpus)
    mem = f" {format_memory(r.mem_mib)}" if r.mem_mib else ""
    return (f"{counted(n, 'GPU')} ({gpus_text(r.gpus)}) {mode_text(r, capacity)}{mem} "
            f"{format_span(r.start, r.end, tz, now)}" + (f" [{r.short_id}]" if show_id else ""))
