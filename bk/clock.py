"""The clock seam: the one place outside tests that reads the time and the zone.

Everything in ``bk.core`` takes ``now`` (int epoch seconds, UTC) and ``tz`` as
arguments; front ends and daemons get them here, so a test or a demo can fix
the clock with one environment variable.

``BK_NOW`` (for tests and demos only): when set, ``now()`` returns that fixed
instant, written as epoch seconds (``1783939290``) or ISO-8601 with ``Z`` or an
offset (``2026-07-13T10:41:30Z``).  ``monotonic()`` ignores it: timeouts and
lock waits must still run in real time.

Finding the local zone.  The C library decides local time from ``TZ`` when it
is set (a zone name, optionally after ``:``, an absolute path to a TZif file,
or a POSIX rule such as ``CET-1CEST,M3.5.0,M10.5.0/3``), else from
``/etc/localtime``, usually a symlink into ``/usr/share/zoneinfo``.  We follow
the same order with ``zoneinfo`` so that names and transitions come from the
tz database.  A POSIX rule string or a missing database leaves zoneinfo
unable to help; then ``SystemLocalTime`` asks the C library itself through
``time.localtime``, which honours all of the above and stays DST-correct.
"""

from __future__ import annotations

import functools
import os
import re
import time
from datetime import datetime, timedelta, timezone, tzinfo

from bk.core.errors import InvalidInput
from bk.core.models import parse_iso

# Module attribute so tests can point it at a fixture.
ETC_LOCALTIME = "/etc/localtime"

_EPOCH_NAIVE = datetime(1970, 1, 1)
_SECOND = timedelta(seconds=1)
_DAY_S = 86400
_EPOCH_NUMBER = re.compile(r"\d+(?:\.\d*)?")


def now() -> int:
    """Current time, whole epoch seconds UTC (floored); ``BK_NOW`` fixes it."""
    fake = os.environ.get("BK_NOW")
    if fake:
        return _fake_now(fake)
    return int(time.time())   # time.time() is positive, so int() floors


def monotonic() -> float:
    """Seconds on a clock that never jumps; for timeouts, never for the ledger."""
    return time.monotonic()


@functools.lru_cache(maxsize=4)
def _fake_now(text: str) -> int:
    s = text.strip()
    if _EPOCH_NUMBER.fullmatch(s):
        return int(float(s)) if "." in s else int(s)
    try:
        return parse_iso(s)
    except ValueError:
        raise InvalidInput(f"BK_NOW={text!r} is neither epoch seconds nor ISO-8601 with an offset",
                           "BK_NOW fixes the clock for tests and demos, e.g. BK_NOW=2026-07-13T10:41:00Z; "
                           "unset it for the real time") from None


@functools.lru_cache(maxsize=1)
def local_tz() -> tzinfo:
    """The local time zone (cached for the process; ``local_tz.cache_clear()`` in tests)."""
    return find_local_tz(os.environ.get("TZ"), ETC_LOCALTIME)


def find_local_tz(tz_env: str | None, etc_localtime: str) -> tzinfo:
    """The uncached lookup behind ``local_tz``: ``TZ``, then ``/etc/localtime``, then libc, then UTC."""
    if tz_env is not None:
        name = tz_env[1:] if tz_env.startswith(":") else tz_env
        if not name:
            return timezone.utc   # POSIX: TZ set but empty means UTC
        zone = _zone_from_file(name) if name.startswith("/") else _zone_named(name)
        return zone or _libc_zone()
    try:
        target = os.readlink(etc_localtime)
    except OSError:   # not a symlink, or missing
        target = None
    if target:
        key = _key_of(target)
        zone = _zone_named(key) if key else None
        if zone:
            return zone
    return _zone_from_file(etc_localtime) or _libc_zone()


def _key_of(path: str) -> str | None:
    """``/usr/share/zoneinfo/Europe/Berlin`` -> ``Europe/Berlin``."""
    marker = "zoneinfo/"
    i = path.rfind(marker)
    return path[i + len(marker):] if i >= 0 else None


def _zone_named(key: str) -> tzinfo | None:
    # Imported here: only commands that show local time pay for it.
    import zoneinfo
    try:
        return zoneinfo.ZoneInfo(key)
    except (ValueError, OSError, zoneinfo.ZoneInfoNotFoundError):
        return None


def _zone_from_file(path: str) -> tzinfo | None:
    import zoneinfo
    try:
        with open(path, "rb") as f:
            return zoneinfo.ZoneInfo.from_file(f, key=_key_of(os.path.realpath(path)))
    except (ValueError, OSError):
        return None


def _libc_zone() -> tzinfo:
    # time.localtime reads TZ only at tzset(); an environment changed since
    # start-up (a test, a caller that set TZ) must be seen.
    time.tzset()
    if time.timezone == 0 and not time.daylight:
        return timezone.utc
    return SystemLocalTime()


class SystemLocalTime(tzinfo):
    """Local time as the C library computes it (``time.localtime``), with PEP 495 folds.

    ``time.localtime`` maps an instant to a wall clock; the reverse has 0, 1 or
    2 answers.  The offsets in force a day before and a day after a wall time
    are the only candidates, provided the zone changes offset at most once in
    any two days (true for every zone in the tz database in living memory).
    Each candidate that maps back to the wall time is an answer.
    """

    def _offset_at(self, u: int) -> int:
        return time.localtime(u).tm_gmtoff

    def _around(self, wall: int) -> tuple[int, int]:
        """(offset before, offset after) near wall-clock seconds ``wall``."""
        return self._offset_at(wall - _DAY_S), self._offset_at(wall + _DAY_S)

    def _instants(self, wall: int) -> list[int]:
        return sorted({wall - o for o in self._around(wall) if self._offset_at(wall - o) == o})

    @staticmethod
    def _seconds(dt: datetime) -> int:
        return (dt.replace(tzinfo=None) - _EPOCH_NAIVE) // _SECOND

    def utcoffset(self, dt: datetime | None) -> timedelta:
        if dt is None:
            return timedelta(seconds=-time.timezone)
        wall = self._seconds(dt)
        found = self._instants(wall)
        if not found:
            # A gap.  PEP 495: fold=0 applies the offset from before the jump.
            before, after = self._around(wall)
            return timedelta(seconds=after if dt.fold else before)
        u = found[-1] if dt.fold else found[0]
        return timedelta(seconds=wall - u)

    def dst(self, dt: datetime | None) -> timedelta:
        if dt is None:
            return timedelta(0)
        u = self._seconds(dt) - self.utcoffset(dt) // _SECOND
        tm = time.localtime(u)
        return timedelta(seconds=tm.tm_gmtoff + time.timezone) if tm.tm_isdst > 0 else timedelta(0)

    def tzname(self, dt: datetime | None) -> str:
        if dt is None:
            return time.tzname[0]
        return time.localtime(self._seconds(dt) - self.utcoffset(dt) // _SECOND).tm_zone

    def fromutc(self, dt: datetime) -> datetime:
        u = self._seconds(dt)
        wall = u + self._offset_at(u)
        local = (_EPOCH_NAIVE + timedelta(seconds=wall)).replace(microsecond=dt.microsecond, tzinfo=self)
        found = self._instants(wall)
        return local.replace(fold=1 if len(found) == 2 and u == found[1] else 0)

    def __repr__(self) -> str:
        return "SystemLocalTime()"
