"""The clock seam: the one place outside tests that reads the time and the zone.

Everything in ``bk.core`` takes ``now`` (int epoch seconds, UTC) and ``tz`` as
arguments; front ends and daemons get them here, so a test or a demo can fix
the clock with one environment variable.

``BK_NOW`` (for tests and demos only): when set, ``now()`` returns that fixed
instant, written as epoch seconds (``1783939290``) or ISO-8601 with ``Z`` or an
offset (``2026-07-13T10:41:30Z``).  ``BK_NOW=@FILE`` reads the instant from
FILE at every call instead, so a test can move the clock of running daemons
(the broker, the monitor, a worker and its deliverer) by rewriting one file.
``monotonic()`` ignores it: timeouts and lock waits must still run in real time.

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

import os
import time

from bk.core.errors import InvalidInput
from bk.core.models import parse_iso
from bk.core.utctime import datetime, timedelta, timezone, tzinfo

TYPE_CHECKING = False
if TYPE_CHECKING:   # annotations only: collections.abc would import collections
    from collections.abc import Callable

# Module attribute so tests can point it at a fixture.
ETC_LOCALTIME = "/etc/localtime"

_EPOCH_NAIVE = datetime(1970, 1, 1)
_SECOND = timedelta(seconds=1)
_DAY_S = 86400


def now() -> int:
    """Current time, whole epoch seconds UTC (floored); ``BK_NOW`` fixes it."""
    return _now_from(os.environ.get("BK_NOW"))


def clock_of(env) -> Callable[[], int]:
    """``now`` for a command whose environment is ``env`` (``open_app``'s):
    its ``BK_NOW``, read at every call, not this process's.  An in-process
    front end or a test that passes an environment gets that environment's
    clock, as the same command run as a process would."""
    if env is os.environ:
        return now
    return lambda: _now_from(env.get("BK_NOW"))


def _now_from(fake: str | None) -> int:
    if fake:
        if fake.startswith("@"):
            return _file_now(fake[1:])
        return _fake_now(fake)
    return int(time.time())   # time.time() is positive, so int() floors


def monotonic() -> float:
    """Seconds on a clock that never jumps; for timeouts, never for the ledger."""
    return time.monotonic()


def _once(fn):
    """``functools.lru_cache(maxsize=1)`` of a function without arguments
    (``cache_clear`` and ``__wrapped__`` included), without importing
    functools, which imports collections: 1 ms of a command's start."""
    held: list = []

    def cached():
        if not held:
            held.append(fn())
        return held[0]
    cached.cache_clear, cached.__wrapped__ = held.clear, fn
    cached.__name__, cached.__qualname__, cached.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    return cached


_FAKE_NOW: dict[str, int] = {}     # BK_NOW's readings, a few at most (tests change it)


def _fake_now(text: str) -> int:
    t = _FAKE_NOW.get(text)
    if t is None:
        if len(_FAKE_NOW) >= 4:
            _FAKE_NOW.clear()
        t = _FAKE_NOW[text] = _read_fake_now(text)
    return t


def _read_fake_now(text: str) -> int:
    s = text.strip()
    whole, dot, fraction = s.partition(".")
    if whole.isdecimal() and (not fraction or fraction.isdecimal()):     # \d+(?:\.\d*)?
        return int(float(s)) if dot else int(s)
    try:
        return parse_iso(s)
    except ValueError:
        raise InvalidInput(f"BK_NOW={text!r} is neither epoch seconds nor ISO-8601 with an offset",
                           "BK_NOW fixes the clock for tests and demos, e.g. BK_NOW=2026-07-13T10:41:00Z; "
                           "unset it for the real time") from None


def _file_now(path: str) -> int:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(200)
    except OSError as e:
        raise InvalidInput(f"BK_NOW=@{path}: cannot read the clock file: {e.strerror}",
                           "BK_NOW=@FILE is for tests: FILE holds epoch seconds or ISO-8601") from None
    # A writer that truncates before it writes can be read in between: an
    # empty read is retried once, a file rewritten with os.replace never is.
    if not text.strip():
        with open(path, encoding="utf-8") as f:
            text = f.read(200)
    return _read_fake_now(text)


class LocalZone:
    """The zone this process shows local time in, and how it was found.

    ``source`` is ``"TZ"``, the path of ``/etc/localtime``, ``"C library"``
    (neither named a zone bk reads, but libc has one) or ``"UTC fallback"``;
    ``warnings`` say when that fallback hides a mistake (an unknown ``TZ``).
    """

    __slots__ = ("tz", "name", "source", "warnings")

    def __init__(self, tz: tzinfo, name: str, source: str, warnings: tuple[str, ...] = ()):
        self.tz, self.name, self.source, self.warnings = tz, name, source, warnings

    def to_json(self) -> dict:
        return {"name": self.name, "source": self.source}

    def __repr__(self) -> str:
        return f"LocalZone({self.name!r}, {self.source!r})"


@_once
def local_zone() -> LocalZone:
    """The local zone and its provenance (cached for the process)."""
    return find_local_zone(os.environ.get("TZ"), ETC_LOCALTIME)


def local_tz() -> tzinfo:
    """The local time zone (cached for the process; ``local_tz.cache_clear()`` in tests)."""
    return local_zone().tz


# One cache: clearing it through either name (tests do ``local_tz.cache_clear()``) resets both.
local_tz.cache_clear = local_zone.cache_clear


# The zones of environments other than this process's (``zone_of``), by
# (TZ, /etc/localtime path): found once, and known again by identity below.
_OTHER_ZONES: dict[tuple[str | None, str], LocalZone] = {}


def zone_of(env) -> LocalZone:
    """The local zone of a command whose environment is ``env``: its ``TZ``,
    not this process's.  The same ``TZ`` is the process's cached zone.  Another
    one cannot ask the C library, which only knows this process's ``TZ``: a
    POSIX rule there that zoneinfo cannot read is shown in UTC."""
    tz_env = env.get("TZ")
    if tz_env == os.environ.get("TZ"):
        return local_zone()
    key = (tz_env, ETC_LOCALTIME)
    zone = _OTHER_ZONES.get(key)
    if zone is None:
        zone = _OTHER_ZONES[key] = find_local_zone(tz_env, ETC_LOCALTIME, ask_libc=False)
    return zone


def _known_zone(tz: object) -> LocalZone | None:
    zone = local_zone()
    if tz is zone.tz:
        return zone
    return next((z for z in _OTHER_ZONES.values() if z.tz is tz), None)


def zone_warnings(tz: object) -> tuple[str, ...]:
    """What the user should hear about ``tz`` when it is a command's local
    zone (an unknown ``TZ`` read as UTC); nothing for a zone given otherwise."""
    zone = _known_zone(tz)
    return zone.warnings if zone is not None else ()


def describe_zone(tz: object) -> dict:
    """``{"name", "source"}`` of ``tz``: a local zone's provenance, or
    ``"given"`` for a zone the caller chose (a test, a broker peer)."""
    zone = _known_zone(tz)
    if zone is not None:
        return zone.to_json()
    return {"name": getattr(tz, "key", None) or str(tz), "source": "given"}


def find_local_tz(tz_env: str | None, etc_localtime: str) -> tzinfo:
    """The uncached lookup behind ``local_tz``: ``TZ``, then ``/etc/localtime``, then libc, then UTC."""
    return find_local_zone(tz_env, etc_localtime).tz


def find_local_zone(tz_env: str | None, etc_localtime: str, *, ask_libc: bool = True) -> LocalZone:
    """``find_local_tz`` with the zone's name, where it came from and any warning.

    When nothing bk or the C library can read names a zone, glibc quietly
    uses UTC: ``TZ=Mars/Olympus`` shows every time an hour or more off with no
    word said.  So a ``TZ`` that is neither a zone bk finds nor a POSIX rule
    warns, as does an ``/etc/localtime`` that exists but is no zone file.  A
    missing ``/etc/localtime`` does not: UTC is what such a system (most
    containers) means.  ``ask_libc=False``: ``tz_env`` is not this process's
    ``TZ``, so the C library's answer would be about another zone.
    """
    libc_zone = _libc_zone if ask_libc else (lambda: None)
    if tz_env is not None:
        name = tz_env[1:] if tz_env.startswith(":") else tz_env
        if not name:
            return LocalZone(_utc(), "UTC", "TZ")   # POSIX: TZ set but empty means UTC
        zone = _zone_from_file(name) if name.startswith("/") else _zone_named(name)
        if zone is not None:
            return LocalZone(zone, _name_of(zone, name), "TZ")
        libc = libc_zone()
        if libc is not None or _posix_rule().fullmatch(name):
            return LocalZone(libc or _utc(), name, "TZ")
        return LocalZone(_utc(), "UTC", "UTC fallback", (
            f"TZ={tz_env!r} is not a time zone bk knows; showing times in UTC "
            "(set TZ to a zone name such as Europe/Berlin, or unset it)",))
    try:
        target = os.readlink(etc_localtime)
    except OSError:   # not a symlink, or missing
        target = None
    if target:
        key = _key_of(target)
        zone = _zone_named(key) if key else None
        if zone:
            return LocalZone(zone, key, etc_localtime)
    zone = _zone_from_file(etc_localtime)
    if zone is not None:
        return LocalZone(zone, _name_of(zone, etc_localtime), etc_localtime)
    libc = libc_zone()
    if libc is not None:
        return LocalZone(libc, time.tzname[0], "C library")
    warnings = ()
    if os.path.lexists(etc_localtime):
        warnings = (f"{etc_localtime} is not a time zone bk can read; showing times in UTC "
                    "(link it to a file in /usr/share/zoneinfo, or set TZ)",)
    return LocalZone(_utc(), "UTC", "UTC fallback", warnings)


# A POSIX TZ rule (``CET-1CEST,M3.5.0,M10.5.0/3``, ``UTC0``, ``<+0330>-3:30``):
# standard name and offset, then optionally a DST name, offset and the two dates.
_TZ_NAME = r"(?:[A-Za-z]{3,}|<[A-Za-z0-9+-]{3,}>)"
_TZ_OFFSET = r"[+-]?\d{1,3}(?::\d{1,2}(?::\d{1,2})?)?"
_TZ_DATE = rf"(?:J\d{{1,3}}|\d{{1,3}}|M\d{{1,2}}\.\d\.\d)(?:/{_TZ_OFFSET})?"
_POSIX_RULE_TEXT = rf"{_TZ_NAME}{_TZ_OFFSET}(?:{_TZ_NAME}(?:{_TZ_OFFSET})?(?:,{_TZ_DATE},{_TZ_DATE})?)?"


@_once
def _posix_rule():
    # Compiled only when a TZ value is not a zone we found: most commands
    # never need it, and the pattern (and re) costs a few milliseconds.
    import re

    return re.compile(_POSIX_RULE_TEXT)


def _utc() -> tzinfo:
    # Not the ``timezone.utc`` singleton: ``zone_warnings`` tells the local
    # zone by identity, and a caller's own UTC must not inherit its warning.
    return timezone(timedelta(0), "UTC")


def _name_of(zone: tzinfo, fallback: str) -> str:
    return getattr(zone, "key", None) or fallback


def _key_of(path: str) -> str | None:
    """``/usr/share/zoneinfo/Europe/Berlin`` -> ``Europe/Berlin``."""
    marker = "zoneinfo/"
    i = path.rfind(marker)
    return path[i + len(marker):] if i >= 0 else None


# The tz database's own name for UTC, the zone of most servers.  It needs no
# zoneinfo: importing that (and sysconfig, for its search path) costs more than
# most commands' work (benchmarks/cli.py), and UTC has no rules to read.
_UTC_KEYS = ("UTC", "Etc/UTC")
_ZERO = timedelta(0)


class NamedUTC(tzinfo):
    """UTC under its tz database name: what ``ZoneInfo(key)`` would be for
    ``key`` in ``_UTC_KEYS`` (offset 0, no DST, ``tzname`` "UTC", ``key``)."""

    __slots__ = ("key",)

    def __init__(self, key: str):
        self.key = key

    def __getinitargs__(self) -> tuple[str]:     # how tzinfo pickles and copies it
        return (self.key,)

    def utcoffset(self, dt: datetime | None) -> timedelta:
        return _ZERO

    def dst(self, dt: datetime | None) -> timedelta:
        return _ZERO

    def tzname(self, dt: datetime | None) -> str:
        return "UTC"

    def __str__(self) -> str:
        return self.key

    def __repr__(self) -> str:
        return f"NamedUTC({self.key!r})"


def _zone_named(key: str) -> tzinfo | None:
    if key in _UTC_KEYS:
        return NamedUTC(key)
    # Imported here: only commands that show local time pay for it.
    import zoneinfo
    try:
        return zoneinfo.ZoneInfo(key)
    except (ValueError, OSError, zoneinfo.ZoneInfoNotFoundError):
        return None


def _zone_from_file(path: str) -> tzinfo | None:
    real = os.path.realpath(path)
    key = _key_of(real)
    if key in _UTC_KEYS and os.path.isfile(real):
        return NamedUTC(key)
    import zoneinfo
    try:
        with open(path, "rb") as f:
            return zoneinfo.ZoneInfo.from_file(f, key=key)
    except (ValueError, OSError):
        return None


def _libc_zone() -> tzinfo | None:
    """The C library's local time, or None when it is plain UTC (which is also
    what glibc falls back to for a ``TZ`` it cannot read)."""
    # time.localtime reads TZ only at tzset(); an environment changed since
    # start-up (a test, a caller that set TZ) must be seen.
    time.tzset()
    if time.timezone == 0 and not time.daylight:
        return None
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
