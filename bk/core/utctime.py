"""UTC instants <-> ``YYYY-MM-DDTHH:MM:SSZ``, fast.

Every ledger read parses every booking's times, so ``datetime`` (a few
microseconds per call) would dominate reading 10,000 bookings.  Plain integer
calendar arithmetic plus a bounded memo (slice-aligned times repeat) does the
fixed form; any other ISO-8601 form with a zone falls back to ``datetime``.
"""

from __future__ import annotations

# datetime's classes, from CPython's C module when it has one: ``import
# datetime`` on 3.10 and 3.11 first runs the whole pure-Python
# implementation (about 1 ms, with ``math``) only to replace its classes
# with these same ones from ``_datetime``.  The modules of bk that need them
# (the time grammar, the clock, the scheduler) take them from here.
try:
    from _datetime import date, datetime, timedelta, timezone, tzinfo  # noqa: F401 (shared)
except ImportError:                       # another Python: the standard module
    from datetime import date, datetime, timedelta, timezone, tzinfo  # noqa: F401 (shared)


def parse_iso_general(text: str) -> int:
    """Any ISO-8601 time with ``Z`` or an offset -> epoch seconds."""
    if not isinstance(text, str):
        raise ValueError(f"expected an ISO-8601 string, got {type(text).__name__}")
    s = text.strip()
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    dt = datetime.fromisoformat(s)
    if dt.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone (add Z or an offset)")
    return int(dt.timestamp())


# --- time ------------------------------------------------------------------
# Days since 1970-01-01 <-> proleptic Gregorian (year, month, day), after
# Howard Hinnant's "chrono-compatible low-level date algorithms": years are
# counted from March so that the leap day falls at the end of the year.

def days_from_civil(y: int, m: int, d: int) -> int:
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m - 3 if m > 2 else m + 9) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def civil_from_days(z: int) -> tuple[int, int, int]:
    z += 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (m <= 2), m, d


def _month_days(y: int, m: int) -> int:
    if m == 2:
        return 29 if (y % 4 == 0 and y % 100 != 0) or y % 400 == 0 else 28
    return 30 if m in (4, 6, 9, 11) else 31


# Both memos are bounded: cleared when full.  Slot-aligned starts and ends
# repeat across bookings, and decoding records every string it parsed so
# that re-encoding an unchanged ledger formats nothing.
_MEMO_MAX = 1 << 17
_parsed: dict[str, int] = {}
_formatted: dict[int, str] = {}


def format_utc(t: int) -> str:
    """Epoch seconds -> ``2026-07-13T18:00:00Z`` (years 0000-9999)."""
    s = _formatted.get(t) if type(t) is int else None
    if s is not None:
        return s
    if type(t) is not int:
        raise ValueError(f"expected integer epoch seconds, got {type(t).__name__}")
    days, secs = divmod(t, 86400)
    y, m, d = civil_from_days(days)
    if not 0 <= y <= 9999:
        raise ValueError(f"{t} is outside years 0000-9999")
    hh, rem = divmod(secs, 3600)
    mm, ss = divmod(rem, 60)
    s = f"{y:04d}-{m:02d}-{d:02d}T{hh:02d}:{mm:02d}:{ss:02d}Z"
    if len(_formatted) >= _MEMO_MAX:
        _formatted.clear()
    _formatted[t] = s
    return s


def parse_utc(s: str) -> int:
    """``YYYY-MM-DDTHH:MM:SSZ`` -> epoch seconds; other ISO-8601 forms with a
    zone go through ``parse_iso_general``.  Raises ValueError."""
    if type(s) is not str:
        raise ValueError(f"expected an ISO-8601 string, got {type(s).__name__}")
    t = _parsed.get(s)
    if t is not None:
        return t
    if not (len(s) == 20 and s[19] == "Z" and s[10] == "T" and s[4] == "-" and s[7] == "-"
            and s[13] == ":" and s[16] == ":" and s.isascii()):
        return parse_iso_general(s)
    digits = s[0:4] + s[5:7] + s[8:10] + s[11:13] + s[14:16] + s[17:19]
    if not digits.isdigit():
        raise ValueError(f"{s!r} is not a valid UTC time")
    y, mo, d = int(s[0:4]), int(s[5:7]), int(s[8:10])
    hh, mi, ss = int(s[11:13]), int(s[14:16]), int(s[17:19])
    if not (1 <= mo <= 12 and 1 <= d <= _month_days(y, mo) and hh < 24 and mi < 60 and ss < 60):
        raise ValueError(f"{s!r} is not a valid UTC time")
    t = days_from_civil(y, mo, d) * 86400 + hh * 3600 + mi * 60 + ss
    if len(_parsed) >= _MEMO_MAX:
        _parsed.clear()
        _formatted.clear()
    _parsed[s] = t
    _formatted[t] = s
    return t
