"""Lab policy limits per user, group and tier, and refusals that say what would pass.

The facts.  A lab's first rules are about people, not GPUs: "nobody holds
more than two GPUs at a time", "at most 24 GPU-hours booked ahead", "students
book at most four hours".  The administrator writes them in the trusted
configuration (``limits``, ``limit_tiers``, ``limit_exempt``: gpubk-config(5)),
each rule naming who it is for:

* ``"*"``: everyone;
* ``"@nlp"``: every member of the Unix group ``nlp``;
* a tier from ``limit_tiers``, a named set of users and ``@groups``;
* anything else: one user, by login name.

These are the lab's policy, apart from the anti-abuse caps on how much of the
ledger one account may fill (``bk.core.ledgerlimits``, ``ledger_*`` keys):
those protect the server, these share the GPUs.

The rules.  For each limit (``FIELDS``) the most specific rule that sets it
decides: the user's own, then a tier's, then a group's, then everyone's.
Several rules at the same level (two groups): the most generous wins, so a
group rule grants, it never takes away what another group grants.  A value
of ``null`` is "no limit" and so beats every number.  Root (the
administrator) and the users and groups of ``limit_exempt`` have none.

What each limit measures, for one user, counting every live booking of
theirs (not cancelled, not ended):

* ``gpus``: the distinct GPUs they hold at any instant from now on.  Two
  shared bookings on one GPU hold one GPU.
* ``gpu_hours``: GPUs times hours still ahead, ``len(gpus) * (end -
  max(start, now))``, summed; a new booking counts its whole length.  Shared
  or exclusive, a GPU-hour is a GPU-hour.
* ``booking_hours``: one booking's length.
* ``ahead_hours``: how far ahead a booking may start (``start - now``).
* ``shared_vram_gib``: the VRAM per GPU a shared booking counts (its ``-m``,
  or its default share of the GPU's usable memory).

When they are checked.  Those that depend on the request alone (length,
GPU-hours, an explicit ``-m``) before the placement search, so that a
request no waiting could help is refused at once; those that depend on
where and when it lands (``ahead_hours``, ``gpus``, the default VRAM share)
on the placement.  An edit, or a booking moved earlier by its advance
(``bk.core.advance``), is refused only by a limit whose measure it makes
both too large and larger than before: a booking made before a limit was
tightened may still be shortened, moved or given a note.

Refusals.  Each is a ``PolicyRefused`` whose ``details`` carry the rule
(``limit_gpus`` ...), the limit, who set it (``source``: the config path,
``limits.students.booking_hours``), the numbers, and ``fits``: the smallest
change that passes (a shorter length, fewer GPUs, less memory, an earlier
end) and the earliest time that would (a later start, or the time from
which the same booking can be made because the user's bookings will have
used enough).  The service turns ``fits`` into the commands to run.  Every
suggestion is checked against the same rule here (and by brute force in
``tests/reference_scheduler.py``), so what bk suggests does pass.

Pure: the user's groups, ``now`` and the zone are arguments.
"""

from __future__ import annotations

from bk.core.errors import PolicyRefused
from bk.core.record import dataclass, field
from bk.core.timegrid import counted, format_duration, format_local_short

TYPE_CHECKING = False
if TYPE_CHECKING:   # annotations only: collections.abc would import collections
    from collections.abc import Iterable, Sequence

FIELDS = ("gpus", "gpu_hours", "booking_hours", "ahead_hours", "shared_vram_gib")
RULES = {"booking_hours": "limit_booking_hours", "shared_vram_gib": "limit_shared_vram",
         "gpu_hours": "limit_gpu_hours", "ahead_hours": "limit_ahead", "gpus": "limit_gpus"}
# The documented order: the request's own limits, then the placement's.
REQUEST_ORDER = ("booking_hours", "shared_vram_gib", "gpu_hours")
PLACED_ORDER = ("ahead_hours", "gpus", "shared_vram_gib")
EVERYONE = "*"
# Upper bounds a value may take (the same as the policy keys they refine).
_BOUNDS = {"gpus": (1, 64, int), "gpu_hours": (0.0, 1e6, float), "booking_hours": (0.0, 8784, float),
           "ahead_hours": (0.0, 8784, float), "shared_vram_gib": (0.0, 16384, float)}
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-$")
_LEVELS = ("user", "tier", "group", "everyone")
HOUR, GIB = 3600, 1024


def valid_name(name: object) -> bool:
    """A login, group or tier name as bk accepts it (POSIX portable names,
    plus ``$`` at the end for machine accounts)."""
    return (isinstance(name, str) and 0 < len(name) <= 64 and set(name) <= _NAME_CHARS
            and name[0] not in "-." and "$" not in name[:-1])


def _number(fname: str, v: object, where: str):
    lo, hi, kind = _BOUNDS[fname]
    if v is None:
        return None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool)
    if kind is int:
        ok = ok and isinstance(v, int)
    in_range = ok and (lo < v <= hi if kind is float else lo <= v <= hi)
    if not in_range:
        what = "a whole number" if kind is int else "a positive number"
        raise ValueError(f"{where}.{fname} must be {what} up to {hi:g}, or null (no limit), "
                         f"not {v!r}")
    return v


def parse_rules(doc: object) -> tuple:
    """``limits`` from the configuration: ``{WHO: {FIELD: VALUE}}`` to the
    tuple form ``((who, ((field, value), ...)), ...)``.  Raises ValueError."""
    if not isinstance(doc, dict):
        raise ValueError('limits must be an object: {"*": {"gpus": 2}}')
    out = []
    for who, spec in doc.items():
        bare = who[1:] if isinstance(who, str) and who.startswith("@") else who
        if who != EVERYONE and not valid_name(bare):
            raise ValueError(f"limits: {who!r} is not \"*\", a user, a tier or an @group")
        if not isinstance(spec, dict) or not spec:
            raise ValueError(f"limits.{who} must be an object of limits, e.g. {{\"gpus\": 2}}")
        fields_ = []
        for fname, v in spec.items():
            if fname not in FIELDS:
                raise ValueError(f"limits.{who}: unknown limit {fname!r} (known: {', '.join(FIELDS)})")
            fields_.append((fname, _number(fname, v, f"limits.{who}")))
        out.append((who, tuple(sorted(fields_))))
    return tuple(sorted(out))


def parse_tiers(doc: object) -> tuple:
    """``limit_tiers``: ``{TIER: [user, @group, ...]}``.  Raises ValueError."""
    if not isinstance(doc, dict):
        raise ValueError('limit_tiers must be an object: {"students": ["@students", "dave"]}')
    out = []
    for tier, members in doc.items():
        if not valid_name(tier):
            raise ValueError(f"limit_tiers: {tier!r} is not a valid tier name (letters, digits, . _ -)")
        out.append((tier, parse_members(members, f"limit_tiers.{tier}")))
    return tuple(sorted(out))


def parse_members(v: object, where: str) -> tuple[str, ...]:
    """A list of users and ``@groups``, sorted and without repeats."""
    if not isinstance(v, list) or not all(isinstance(x, str) and valid_name(x.removeprefix("@")) for x in v):
        raise ValueError(f"{where} must be a list of user names and @groups, e.g. [\"alice\", \"@nlp\"]")
    return tuple(sorted(set(v)))


@dataclass(frozen=True)
class LimitRules:
    """The configuration's rules, as parsed (``parse_rules`` and friends)."""

    rules: tuple = ()           # ((who, ((field, value), ...)), ...)
    tiers: tuple = ()           # ((tier, (member, ...)), ...)
    exempt: tuple = ()          # (user or @group, ...)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def uses_groups(self) -> bool:
        """Whether anyone's limits depend on Unix groups (a lookup per call)."""
        names = [w for w, _ in self.rules] + list(self.exempt) + [m for _, ms in self.tiers for m in ms]
        return any(n.startswith("@") for n in names)

    def to_json(self) -> dict:
        return {"limits": {w: dict(f) for w, f in self.rules}, "limit_tiers": {t: list(m) for t, m in self.tiers},
                "limit_exempt": list(self.exempt)}


@dataclass(frozen=True)
class Bound:
    """One limit that applies to a user: its value and the rule that set it."""

    name: str               # a FIELDS entry
    value: float
    who: str                # the rule's key: "*", "@nlp", "students", "alice"
    level: str              # user | tier | group | everyone

    @property
    def source(self) -> str:
        return f"limits.{self.who}.{self.name}"

    def whose(self) -> str:
        """``of everyone``, ``of group nlp``, ``of the students tier``, ``set for you``."""
        return {"everyone": "for everyone", "group": f"for group {self.who[1:]}",
                "tier": f"of the {self.who} tier", "user": "set for you"}[self.level]

    def to_json(self) -> dict:
        return {"limit": self.name, "value": self.value, "who": self.who, "level": self.level,
                "source": self.source}


@dataclass(frozen=True)
class Bounds:
    """The limits of one user: ``values`` maps a field to its ``Bound``
    (absent: no limit).  ``exempt``: none at all, and why."""

    user: str
    values: dict = field(default_factory=dict)
    exempt: str | None = None

    def __bool__(self) -> bool:
        return bool(self.values)

    def to_json(self) -> dict:
        return {"user": self.user, "exempt": self.exempt,
                "limits": {k: b.to_json() for k, b in sorted(self.values.items())}}


def bounds_for(rules: LimitRules | None, user: str, groups: Iterable[str] = (), *,
               admin: bool = False) -> Bounds:
    """Which limits apply to ``user``, a member of ``groups`` (names)."""
    if admin:
        return Bounds(user, {}, "the administrator (root)")
    if not rules:
        return Bounds(user)
    groups = frozenset(groups)

    def member(entries) -> str | None:
        for m in entries:
            if m == user or (m.startswith("@") and m[1:] in groups):
                return m
        return None

    why = member(rules.exempt)
    if why is not None:
        return Bounds(user, {}, f"limit_exempt names {why}")
    tiers = {t for t, ms in rules.tiers if member(ms) is not None}
    tier_names = {t for t, _ in rules.tiers}
    levels: dict[str, list] = {lv: [] for lv in _LEVELS}
    for who, spec in rules.rules:
        if who == EVERYONE:
            levels["everyone"].append((who, spec))
        elif who.startswith("@"):
            if who[1:] in groups:
                levels["group"].append((who, spec))
        elif who in tier_names:
            if who in tiers:
                levels["tier"].append((who, spec))
        elif who == user:
            levels["user"].append((who, spec))
    out = {}
    for fname in FIELDS:
        for lv in _LEVELS:
            found = [(who, dict(spec)[fname]) for who, spec in levels[lv] if fname in dict(spec)]
            if not found:
                continue
            if any(v is None for _, v in found):
                break                       # "no limit" is the most generous
            who, v = max(found, key=lambda wv: (wv[1], wv[0]))
            out[fname] = Bound(fname, v, who, lv)
            break
    return Bounds(user, out)


# ------------------------------------------------------------ measures

@dataclass(frozen=True)
class Held:
    """A booking as the limits see it: its window, GPUs and counted VRAM per
    GPU (shared bookings only; None: exclusive, or not known)."""

    id: str | None
    start: int
    end: int
    gpus: tuple
    vram_mib: int | None = None


def future_s(h: Held, now: int) -> int:
    """GPU-seconds of ``h`` still ahead of ``now``."""
    return len(h.gpus) * max(0, h.end - max(h.start, now))


def held_future_s(held: Sequence[Held], now: int) -> int:
    return sum(future_s(h, now) for h in held)


def _edges(held: Sequence[Held], lo: int, hi: int) -> list[int]:
    """The instants in ``[lo, hi)`` where the set of held GPUs may change."""
    ts = {lo}
    for h in held:
        for t in (h.start, h.end):
            if lo < t < hi:
                ts.add(t)
    return sorted(ts)


def _at(held: Sequence[Held], t: int) -> list[Held]:
    return [h for h in held if h.start <= t < h.end]


def gpus_peak(new: Held, held: Sequence[Held], now: int) -> tuple[int, int | None]:
    """The most distinct GPUs held at once over ``new``'s window from
    ``now`` on (``held`` plus ``new``), and the first instant of that peak."""
    lo = max(new.start, now)
    best, when = 0, None
    for t in _edges(held, lo, new.end) if lo < new.end else ():
        n = len(set(new.gpus).union(*(h.gpus for h in _at(held, t))))
        if n > best:
            best, when = n, t
    return best, when


def measure(fname: str, new: Held, held: Sequence[Held], now: int) -> float:
    """What limit ``fname`` measures for ``new`` among ``held`` (seconds,
    GPU-seconds, GPUs or MiB: ``Bound.value`` times ``scale(fname)``)."""
    if fname == "booking_hours":
        return new.end - new.start
    if fname == "ahead_hours":
        return max(0, new.start - now)
    if fname == "shared_vram_gib":
        return new.vram_mib or 0
    if fname == "gpu_hours":
        return held_future_s(held, now) + future_s(new, now)
    return gpus_peak(new, held, now)[0]


def scale(fname: str) -> int:
    return {"gpus": 1, "gpu_hours": HOUR, "booking_hours": HOUR, "ahead_hours": HOUR,
            "shared_vram_gib": GIB}[fname]


def limit_of(b: Bound) -> float:
    """The bound in the measure's unit."""
    return b.value * scale(b.name)


def breaks(b: Bound, new: Held, held: Sequence[Held], now: int, before: Held | None = None) -> bool:
    """Whether ``new`` breaks ``b``: over the limit and, for a change of
    ``before``, more than it was."""
    q = measure(b.name, new, held, now)
    if q <= limit_of(b):
        return False
    return before is None or q > measure(b.name, before, held, now)


# ------------------------------------------------------------ the checks

def check_request(bounds: Bounds, new: Held, held: Sequence[Held], *, now: int, slot_seconds: int,
                  tz, before: Held | None = None, vram_explicit: bool = True) -> None:
    """The limits a request breaks before it is placed (``REQUEST_ORDER``):
    raise the first one's refusal.  ``new`` starts at the requested start
    (``now`` for a bare booking): its length and GPU-hours are known; its
    VRAM only when the user gave ``-m`` (``vram_explicit``)."""
    for fname in REQUEST_ORDER:
        if fname == "shared_vram_gib" and not vram_explicit:
            continue
        _check(bounds, fname, new, held, now, slot_seconds, tz, before)


def check_placed(bounds: Bounds, new: Held, held: Sequence[Held], *, now: int, slot_seconds: int,
                 tz, before: Held | None = None, vram_explicit: bool = True) -> None:
    """The limits a placement breaks (``PLACED_ORDER``; the default VRAM
    share only when no ``-m`` was given, the explicit one was checked)."""
    for fname in PLACED_ORDER:
        if fname == "shared_vram_gib" and vram_explicit:
            continue
        _check(bounds, fname, new, held, now, slot_seconds, tz, before)


def check_all(bounds: Bounds, new: Held, held: Sequence[Held], *, now: int, slot_seconds: int, tz,
              before: Held | None = None) -> None:
    """Every limit on a booking whose window and GPUs are known (an edit,
    an advance): the request's order, then the placement's."""
    for fname in REQUEST_ORDER + PLACED_ORDER[:2]:
        _check(bounds, fname, new, held, now, slot_seconds, tz, before)


def first_broken(bounds: Bounds, new: Held, held: Sequence[Held], now: int,
                 before: Held | None = None) -> str | None:
    """The first limit (request order, then placement order) that ``new``
    breaks, or None: the rule without the words, for advances and tests."""
    for fname in REQUEST_ORDER + PLACED_ORDER[:2]:
        b = bounds.values.get(fname)
        if b is not None and breaks(b, new, held, now, before):
            return fname
    return None


def _check(bounds, fname, new, held, now, q, tz, before) -> None:
    b = bounds.values.get(fname)
    if b is None or not breaks(b, new, held, now, before):
        return
    raise refusal(b, new, held, now=now, slot_seconds=q, tz=tz)


# ------------------------------------------------------------ what would pass

def _floor(t: int, q: int) -> int:
    return t - t % q


def _ceil(t: int, q: int) -> int:
    return -(-t // q) * q


def _hours(x: float) -> str:
    return f"{x:g} h"


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(x, 2)


def fits(b: Bound, new: Held, held: Sequence[Held], *, now: int, slot_seconds: int) -> dict:
    """The smallest changes to ``new`` that pass ``b``, and the earliest
    times that would; each key only when such a change exists:

    * ``duration``: the longest length that passes (the same start);
    * ``end``: the latest end that passes (``gpus``: before the first
      instant over the limit);
    * ``count``: the most GPUs that pass;
    * ``mem_mib``: the most VRAM per GPU;
    * ``start``: the earliest later start that passes (``gpus``), or the
      latest start that does (``ahead_hours``: ``latest_start``);
    * ``book_from``: the earliest time from which the same request passes
      when made then (``gpu_hours``: the user's bookings will have used
      enough; ``ahead_hours``: the start is near enough).
    """
    q, lim = slot_seconds, limit_of(b)
    out: dict = {}
    if b.name == "booking_hours":
        dur = _floor(int(lim), q)
        if dur >= q:
            out["duration"] = dur
    elif b.name == "shared_vram_gib":
        out["mem_mib"] = int(lim)
    elif b.name == "ahead_hours":
        latest = _floor(int(now + lim), q)
        if latest >= _floor(now, q):
            out["latest_start"] = latest
        out["book_from"] = _ceil(new.start - int(lim), 60)
    elif b.name == "gpu_hours":
        room = lim - held_future_s(held, now)
        live = max(0, new.end - max(new.start, now))      # the part still ahead counts
        n = len(new.gpus)
        if room > 0:
            # The latest end whose part still ahead fits the room left.
            end = _floor(max(new.start, now) + int(room // n), q)
            if max(new.start, _floor(now, q)) < end < new.end:
                out["duration"] = end - new.start
            c = int(room // live) if live else n
            if 1 <= c < n:
                out["count"] = c
        t = _book_from(held, future_s(new, now), lim, now)
        if t is not None and t > now:
            out["book_from"] = _ceil(t, 60)
    elif b.name == "gpus":
        lo = max(new.start, now)
        peak_held = max((len(set().union(*(h.gpus for h in _at(held, t))))
                         for t in _edges(held, lo, new.end)), default=0) if lo < new.end else 0
        c = int(lim) - peak_held
        if 1 <= c < len(new.gpus):
            out["count"] = c
        first = _first_over(b, new, held, now)
        if first is not None:
            end = _floor(first, q)
            if end > max(new.start, _floor(now, q)) and end < new.end:
                out["end"] = end
        s = _later_start(new, held, int(lim), now, q)
        if s is not None:
            out["start"] = s
    return out


def _first_over(b: Bound, new: Held, held, now: int) -> int | None:
    lo = max(new.start, now)
    for t in _edges(held, lo, new.end) if lo < new.end else ():
        if len(set(new.gpus).union(*(h.gpus for h in _at(held, t)))) > limit_of(b):
            return t
    return None


def _later_start(new: Held, held, lim: int, now: int, q: int) -> int | None:
    """The earliest aligned start after ``new.start`` at which the same
    length fits ``lim`` GPUs however the GPUs are chosen (the held ones
    plus ``len(new.gpus)`` more at every instant)."""
    d, n = new.end - new.start, len(new.gpus)
    if n > lim:
        return None
    cands = sorted({_ceil(h.end, q) for h in held if h.end > new.start} | {new.start})
    for s in cands:
        if s <= new.start:
            continue
        lo = max(s, now)
        if all(len(set().union(*(h.gpus for h in _at(held, t)))) + n <= lim for t in _edges(held, lo, s + d)):
            return s
    return None


def _book_from(held: Sequence[Held], need: int, lim: float, now: int) -> float | None:
    """The earliest ``t >= now`` with ``held_future_s(held, t) + need <= lim``
    (the held bookings run down as time passes), or None when never."""
    if need > lim:
        return None
    if held_future_s(held, now) + need <= lim:
        return now
    # held(t) is piecewise linear, falling; its breaks are the starts and ends.
    ts = sorted({now} | {t for h in held for t in (h.start, h.end) if t > now})
    prev = now
    for t in ts[1:]:
        if held_future_s(held, t) + need <= lim:
            # Within (prev, t] it falls by the GPUs running then.
            rate = sum(len(h.gpus) for h in held if h.start <= prev and h.end > prev)
            over = held_future_s(held, prev) + need - lim
            return prev + over / rate if rate else t
        prev = t
    return None


# ------------------------------------------------------------ the refusal

def refusal(b: Bound, new: Held, held: Sequence[Held], *, now: int, slot_seconds: int, tz) -> PolicyRefused:
    """The refusal of ``new`` by ``b``: the rule, the numbers, what passes."""
    def clock(t: int) -> str:
        return format_local_short(t, tz, now)

    q = slot_seconds
    f = fits(b, new, held, now=now, slot_seconds=q)
    d = new.end - new.start
    facts: dict = {}
    if b.name == "booking_hours":
        head = (f"a booking may last at most {_hours(b.value)} (limit booking_hours {b.whose()}); "
                f"this one lasts {format_duration(d)}")
        facts = {"length_s": d}
    elif b.name == "shared_vram_gib":
        head = (f"a shared booking may count at most {b.value:g} GiB per GPU (limit shared_vram_gib "
                f"{b.whose()}); this one counts {_num(new.vram_mib / GIB)} GiB")
        facts = {"vram_mib": new.vram_mib}
    elif b.name == "ahead_hours":
        head = (f"a booking may start at most {_hours(b.value)} ahead (limit ahead_hours {b.whose()}); "
                f"this one starts {clock(new.start)}, {format_duration(new.start - now)} from now")
        facts = {"ahead_s": new.start - now}
    elif b.name == "gpu_hours":
        has, needs = held_future_s(held, now) / HOUR, future_s(new, now) / HOUR
        head = (f"you hold {_num(has)} of {b.value:g} future GPU-hours (limit gpu_hours {b.whose()}); "
                f"this needs {_num(needs)}")
        facts = {"held_gpu_hours": _num(has), "needs_gpu_hours": _num(needs)}
    else:
        peak, when = gpus_peak(new, held, now)
        there = _at(held, when) if when is not None else []
        mine = sorted(set().union(*(h.gpus for h in there))) if there else []
        until = min((h.end for h in there), default=new.end)
        head = (f"you may hold at most {counted(int(b.value), 'GPU')} at once (limit gpus {b.whose()}); "
                f"from {clock(when)} to {clock(until)} you hold {len(mine)}"
                + (f" (GPU {', '.join(map(str, mine))})" if mine else "")
                + f" and this adds {len(set(new.gpus) - set(mine))}")
        facts = {"peak_gpus": peak, "held_gpus": mine, "from": _iso(when), "until": _iso(until),
                 "holding": sorted(h.id for h in there if h.id)}
    ways = []
    if "duration" in f:
        ways.append(f"it ends {format_duration(d - f['duration'])} earlier "
                    f"({format_duration(f['duration'])} in all)")
    if "end" in f:
        ways.append(f"it ends by {clock(f['end'])}")
    if "count" in f:
        ways.append(f"it has {counted(f['count'], 'GPU')}")
    if "mem_mib" in f:
        ways.append(f"it counts at most {_num(f['mem_mib'] / GIB)} GiB per GPU (-m)")
    if "latest_start" in f:
        ways.append(f"it starts by {clock(f['latest_start'])}")
    if "start" in f:
        ways.append(f"it starts from {clock(f['start'])}")
    if "book_from" in f:
        when = clock(f["book_from"])
        ways.append(f"you book it at {when} or later" if b.name == "ahead_hours"
                    else f"you book it at {when} or later, once your bookings have used enough")
    msg = head + ("; it fits if " + _join(ways) if ways else "")
    details = {"rule": RULES[b.name], **b.to_json(), **facts,
               "fits": {k: (_iso(v) if k in ("end", "start", "latest_start", "book_from") else v)
                        for k, v in f.items()}}
    return PolicyRefused(msg, None, details=details)


def _join(parts: list[str]) -> str:
    """``a``, ``a, or b``, ``a, or b, or c``: each is enough on its own."""
    return ", or ".join(parts)


def _iso(t) -> str | None:
    from bk.core.utctime import format_utc

    return None if t is None else format_utc(int(t))


# ------------------------------------------------------------ a booking's walk

def own_held(reservations, uid: int, now: int, ignore_id: str | None = None) -> list[Held]:
    """``uid``'s live bookings (but ``ignore_id``) as the limits see them."""
    return [Held(r.id, r.start, r.end, tuple(r.gpus)) for r in reservations
            if r.uid == uid and r.cancelled_at is None and r.end > now and r.id != ignore_id]


def place_booking(req, bounds: Bounds | None, uid: int, *, reservations, blackouts, policy, gpus, now: int,
                  load=None, tz=None):
    """``scheduler.place`` with ``uid``'s limits: the request's own limits
    first, then the scheduler's rules, then the placement's limits (the
    module essay's order).  Returns the Placement or raises the first rule
    that refuses."""
    from datetime import timezone

    from bk.core.models import EXCLUSIVE
    from bk.core.scheduler import effective_mem, place

    tz = tz or timezone.utc
    q = policy.slot_seconds
    if bounds:
        from bk.core.scheduler import _validate

        # Malformed input is refused as input first, whatever the limits.
        _validate(req, policy, now, False)
        held = own_held(reservations, uid, now, req.ignore_id)
        # A new booking counts its whole length (it starts now at the earliest).
        start = max(req.start, now) if req.start is not None else now
        vram = req.mem_mib if req.mode != EXCLUSIVE else None
        check_request(bounds, Held(None, start, start + req.duration, tuple(range(req.count)), vram), held,
                      now=now, slot_seconds=q, tz=tz, vram_explicit=vram is not None)
    p = place(req, reservations=reservations, blackouts=blackouts, policy=policy, gpus=gpus, now=now,
              load=load, tz=tz)
    if bounds:
        vram = None
        if req.mode != EXCLUSIVE:
            totals = {g.index: g.mem_total_mib for g in gpus or ()}
            known = [t for t in (totals.get(g) for g in p.gpus) if t]
            vram = req.mem_mib if req.mem_mib is not None else (
                effective_mem(req, policy, min(known)) if known else None)
        check_placed(bounds, Held(None, p.start, p.end, tuple(p.gpus), vram), held, now=now, slot_seconds=q,
                     tz=tz, vram_explicit=req.mem_mib is not None or req.mode == EXCLUSIVE)
    return p


# ------------------------------------------------------------ a change of the rules

def violations(bounds: Bounds, bookings: Sequence[Held], now: int) -> list[tuple[str, str]]:
    """The bookings of one user (``bookings``, in the order they were
    made) that break ``bounds`` now: ``[(id, why)]``, for ``bk admin
    gpu-policy`` to list before it changes the rules.  A limit on the sum
    (GPU-hours, GPUs at once) names the bookings that take the user over,
    the later ones, as if they were made again in order."""
    out: list[tuple[str, str]] = []
    earlier: list[Held] = []
    for h in bookings:
        for fname in REQUEST_ORDER + PLACED_ORDER[:2]:
            b = bounds.values.get(fname)
            if b is None or (fname == "ahead_hours" and h.start <= now):
                continue
            if breaks(b, h, earlier, now):
                q = measure(fname, h, earlier, now)
                what = {"booking_hours": f"lasts {format_duration(int(q))}",
                        "ahead_hours": f"starts {format_duration(int(q))} ahead",
                        "shared_vram_gib": f"counts {_num(q / GIB)} GiB per GPU",
                        "gpu_hours": f"takes its owner to {_num(q / HOUR)} future GPU-hours",
                        "gpus": f"takes its owner to {counted(int(q), 'GPU')} at once"}[fname]
                out.append((h.id, f"{what}, over the limit {fname} {b.value:g} ({b.source})"))
                break
        earlier.append(h)
    return out
