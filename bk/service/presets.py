"""Private booking presets, learned defaults and the prompt history.

A preset is a named booking request (``bk p save train 2 1h 12g``, then
``bk p train``).  Presets are the user's own: they live in the per-user
state directory through ``bk.store.presets``, never in the shared ledger,
and booking one is an ordinary ``book`` through the service: its typed
fields go to ``bk.service.builders`` as they are, the request any typed
booking of the same shape would make.

What the user has booked before also teaches two things without any
setting: the defaults the guided ``bk a`` offers (``learned_defaults``) and
the moment to suggest saving a preset (``suggest_preset``).  Both look only
at the user's own recent bookings.
"""

from __future__ import annotations

from bk.core import timegrid
from bk.core.errors import InvalidInput, IOFailure, NotFound
from bk.core.lazyre import Pattern
from bk.core.models import EXCLUSIVE, MODES, SHARED, Reservation
from bk.core.record import dataclass, field, replace
from bk.service import builders
from bk.service.requests import check_request

# Words that follow `bk p` as sub-commands; a preset may not be called so.
RESERVED_NAMES = ("save", "list", "ls", "show", "delete", "del", "rm", "use", "help")
_NAME = Pattern(r"[A-Za-z][A-Za-z0-9_.-]{0,31}")
SUGGEST_AFTER = 3          # matching bookings before a preset is suggested
RECENT = 20                # how many of the user's latest bookings teach defaults
FALLBACK = {"count": 1, "duration": 3600, "mode": SHARED, "mem_mib": None}


@dataclass(frozen=True)
class Preset:
    name: str
    count: int
    duration: int                         # seconds
    mode: str = SHARED
    share: int = 1
    mem_mib: int | None = None
    pinned: tuple[int, ...] | None = None
    excluded: tuple[int, ...] = ()
    note: str | None = None
    created: int | None = None
    extra: dict = field(default_factory=dict, compare=False)

    def request(self, *, call, at: str | None = None, start_iso: str | None = None,
                start_at: int | None = None, queue: bool = False, op_id: str | None = None,
                dry_run: bool = False):
        """The booking this preset stands for, at ``-t``/``--start`` (words)
        or ``start_at`` (a resolved epoch), else now.  Returns (BookRequest,
        StartSpec or None) from the one request builder.  Empty values
        (no memory, no note, share 1) are left out, as ``words()`` leaves
        them out of the command the preset stands for."""
        return builders.book_request(
            count_=self.count, duration_=self.duration, mem=self.mem_mib or None, mode=self.mode,
            share=self.share if self.share != 1 else None, at=at, start_iso=start_iso, start_at=start_at,
            queue=queue, gpus=self.pinned or None, exclude=self.excluded or None, note=self.note or None,
            op_id=op_id, dry_run=dry_run, policy=call.policy, now=call.now, tz=call.tz)

    def _words(self) -> list[str]:
        out = [str(self.count), timegrid.format_duration(self.duration)]
        if self.mem_mib:
            out.append(timegrid.format_memory(self.mem_mib))
        if self.share != 1:
            out += ["-s", str(self.share)]
        if self.pinned:
            out += ["-g", ",".join(map(str, self.pinned))]
        if self.excluded:
            out += ["-e", ",".join(map(str, self.excluded))]
        if self.note:
            out += ["--note", self.note]
        return out

    def words(self) -> list[str]:
        """The booking words and flags that recreate this preset: ``x 2 1h`` or ``2 1h 12g -s 2``."""
        return ([] if self.mode == SHARED else ["x"]) + self._words()

    def to_json(self) -> dict:
        return preset_json(self)

    @staticmethod
    def check_name(name: str) -> str:
        """A name a preset may have (not a sub-command of ``bk p``), or InvalidInput."""
        return check_name(name)

    def book_command(self) -> str:
        import shlex

        return shlex.join(["bk", *self.words()])

    def save_command(self, name: str | None = None) -> str:
        flags = ["-x"] if self.mode == EXCLUSIVE else []
        import shlex

        return shlex.join(["bk", "p", "save", name or self.name, *self._words(), *flags])

    def to_dict(self) -> dict:
        d = dict(self.extra)
        d.update({"count": self.count, "duration": self.duration, "mode": self.mode,
                  "share": self.share, "mem_mib": self.mem_mib,
                  "pinned": list(self.pinned) if self.pinned else None,
                  "excluded": list(self.excluded), "note": self.note, "created": self.created})
        return d

    @classmethod
    def from_dict(cls, name: str, d: dict, where: str) -> Preset:
        def bad(what: str) -> IOFailure:
            return IOFailure(f"{where}: preset {name!r} is damaged ({what})",
                             hint=f"delete it with: bk p delete {name}, or fix {where}")
        ints = {"count": d.get("count"), "duration": d.get("duration"), "share": d.get("share", 1)}
        for k, v in ints.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise bad(f"{k} must be a positive whole number")
        for k in ("mem_mib", "created"):
            v = d.get(k)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise bad(f"{k} must be a whole number or null")
        if d.get("mode", SHARED) not in MODES:
            raise bad("mode must be shared or exclusive")
        lists = {}
        for k in ("pinned", "excluded"):
            v = d.get(k)
            if v is not None and not (isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                                                  and 0 <= x < 64 for x in v)):
                raise bad(f"{k} must be a list of GPU indices")
            lists[k] = tuple(v) if v else None
        note = d.get("note")
        if note is not None and not isinstance(note, str):
            raise bad("note must be text")
        known = {"count", "duration", "mode", "share", "mem_mib", "pinned", "excluded", "note", "created"}
        return cls(name=name, count=ints["count"], duration=ints["duration"], mode=d.get("mode", SHARED),
                   share=ints["share"], mem_mib=d.get("mem_mib"), pinned=lists["pinned"],
                   excluded=lists["excluded"] or (), note=note, created=d.get("created"),
                   extra={k: v for k, v in d.items() if k not in known})


def preset_json(p: Preset) -> dict:
    """A preset in JSON output (``bk p --json``); the request fields are
    named and typed as in ``bk slots``' ``request`` (duration in seconds)."""
    from bk.core.models import iso

    return {"name": p.name, "count": p.count, "duration": p.duration,
            "duration_text": timegrid.format_duration(p.duration), "mode": p.mode, "share": p.share,
            "mem_mib": p.mem_mib, "pinned": list(p.pinned) if p.pinned else None,
            "excluded": list(p.excluded), "note": p.note, "created": iso(p.created),
            "command": p.book_command()}


# ---------------------------------------------------------------- storage

def _state_dir(app) -> str:
    return app.settings.locations.state_dir


def _file(app):
    from bk.store.presets import PresetFile

    return PresetFile(_state_dir(app))


def check_name(name: str) -> str:
    if name.lower() in RESERVED_NAMES:
        raise InvalidInput(f"{name!r} is a sub-command of bk p and cannot name a preset",
                           hint="pick another name, e.g. train or " + name + "1")
    if not _NAME.fullmatch(name):
        raise InvalidInput(f"preset name {name!r} is not allowed: use a letter, then up to 31 letters, "
                           "digits, '.', '_' or '-'", hint="e.g. bk p save train 2 1h")
    return name


def _list_presets(app) -> list[Preset]:
    f = _file(app)
    return [Preset.from_dict(name, d, f.path) for name, d in sorted(f.read().items())]


def _get_preset(app, name: str) -> Preset:
    f = _file(app)
    presets = f.read()
    if name not in presets:
        raise _not_found(name, presets)
    return Preset.from_dict(name, presets[name], f.path)


def _not_found(name: str, presets: dict) -> NotFound:
    # Imported only for a name that is not there: every booking would pay ~1 ms.
    import difflib

    close = difflib.get_close_matches(name, list(presets), n=1)
    if close:
        hint = f"did you mean {close[0]!r}?"
    elif presets:
        hint = "your presets: " + ", ".join(sorted(presets))
    else:
        hint = "save one with: bk p save NAME N DUR, e.g. bk p save train 2 1h"
    return NotFound(f"no preset named {name!r}", hint=hint)


def _validate(app, p: Preset, *, call) -> Preset:
    """The checks a booking would make that do not depend on the ledger, made
    at save time so that a preset cannot be saved that could never book."""
    check_name(p.name)
    # The shape checks of any booking, on the request the preset makes.  An
    # exclusive preset's share is judged below, after the policy's checks,
    # so it is left out here (the builder would refuse it first).
    check_request((replace(p, share=1) if p.mode == EXCLUSIVE else p).request(call=call)[0])
    policy = call.policy
    if p.duration % policy.slot_seconds:
        raise InvalidInput(f"the duration is not a whole number of {policy.slot_minutes}-minute slices")
    if p.count > policy.gpu_count:
        raise InvalidInput(f"this server has {timegrid.counted(policy.gpu_count, 'GPU')}; a preset of {p.count} could never book")
    for flag, gpus in (("-g", p.pinned or ()), ("-e", p.excluded)):
        wrong = [g for g in gpus if g >= policy.gpu_count]
        if wrong:
            raise InvalidInput(f"{flag}: no GPU {wrong[0]} here (GPUs are 0-{policy.gpu_count - 1})")
    if p.pinned and len(p.pinned) != p.count:
        raise InvalidInput(f"-g names {timegrid.counted(len(p.pinned), 'GPU')} but the preset books {p.count}",
                           hint="give as many GPUs as the count")
    if p.mode == EXCLUSIVE and p.share != 1:
        raise InvalidInput("--share applies to shared bookings; an exclusive one takes the whole GPU")
    if p.mode == SHARED and p.mem_mib is None and policy.require_shared_memory:
        raise InvalidInput("this server requires the memory per GPU for shared bookings",
                           hint=f"add it: bk p save {p.name} {p.count} "
                                f"{timegrid.format_duration(p.duration)} 12g")
    return p


def _save_preset(app, p: Preset, *, call, dry_run: bool = False) -> tuple[str, Preset]:
    """Save or replace; returns (``created``|``replaced``|``unchanged``, preset).
    With ``dry_run`` the same answer, and nothing written."""
    p = _validate(app, replace(p, created=p.created or call.now), call=call)
    f = _file(app)

    def change(presets: dict) -> str:
        old = presets.get(p.name)
        if old is not None:
            old_p = Preset.from_dict(p.name, old, f.path)
            if replace(old_p, created=None) == replace(p, created=None):
                return "unchanged"
        presets[p.name] = p.to_dict()
        return "replaced" if old is not None else "created"
    if dry_run:
        return change(f.read()), p
    return f.update(change), p


def _delete_preset(app, name: str, *, dry_run: bool = False) -> Preset:
    f = _file(app)

    def change(presets: dict) -> Preset:
        if name not in presets:
            raise _not_found(name, presets)
        return Preset.from_dict(name, presets.pop(name), f.path)
    if dry_run:
        return change(f.read())
    return f.update(change)


# -------------------------------------------------------------- learning

def _recent_own(app, *, call, limit: int = RECENT) -> list[Reservation]:
    """The user's latest bookings, newest first (current and ended; not cancelled)."""
    from bk.service.views import ListRequest

    seen: dict[str, Reservation] = {}
    mine = app.run("list", ListRequest("mine"), call=call).reservations
    for r in [*mine, *app.run("list", ListRequest("history", limit), call=call).reservations]:
        if r.cancelled_at is None:
            seen[r.id] = r
    return sorted(seen.values(), key=lambda r: (r.created, r.id), reverse=True)[:limit]


def _most_common(values: list):
    """The most frequent value; ties go to the most recent (values come newest first)."""
    if not values:
        return None
    counts: dict = {}
    for v in values:              # collections.Counter's count, without importing collections
        counts[v] = counts.get(v, 0) + 1
    best = max(counts.values())
    return next(v for v in values if counts[v] == best)


def _learned_defaults(app, *, call) -> dict:
    """Defaults for the guided booking: the user's most frequent count,
    duration, mode and memory among their recent bookings.  ``learned`` is
    how many bookings taught them (0: the built-in defaults)."""
    recent = _recent_own(app, call=call)
    if not recent:
        return {**FALLBACK, "learned": 0}
    mode = _most_common([r.mode for r in recent])
    same_mode = [r for r in recent if r.mode == mode]
    return {"count": _most_common([len(r.gpus) for r in recent]),
            "duration": _most_common([r.end - r.start for r in recent]),
            "mode": mode,
            "mem_mib": _most_common([r.mem_mib for r in same_mode]) if mode == SHARED else None,
            "learned": len(recent)}


def _suggest_preset(app, booked: Reservation | None = None, *, call, times: int | None = None) -> dict | None:
    """After a booking, a suggestion to save it as a preset, or None.

    It fires when the booking just made (``booked``, else the user's latest)
    is the ``SUGGEST_AFTER``-th of the same shape (count, duration, mode,
    memory, share) among the user's recent bookings, and no preset has that
    shape already.  Exactly the third, not every later one, so it is said
    once rather than after every booking.  Returns ``{"times", "command",
    "hint"}``.

    It sits on the booking path and looks only at the hot ledger (live
    bookings and those ended within ``archive_after_hours``), never at the
    archive.  ``times``: the count the booking's own transaction made
    (``BookResult.same_shape``); then the ledger is not read again.
    """
    from bk.service.booking import same_shape_count, shape_of

    if times is None or booked is None:
        state = app.ledger(call=call)
        uid = call.actor.uid
        if booked is None:
            mine = [r for r in state.reservations if r.uid == uid and r.cancelled_at is None]
            if not mine:
                return None
            booked = max(mine, key=lambda r: (r.created, r.id))
        times = same_shape_count(state.reservations, uid, booked, RECENT)
    shape = shape_of(booked)
    if times != SUGGEST_AFTER:
        return None
    try:
        saved = _list_presets(app)
    except IOFailure:
        saved = []
    count, duration, mode, mem, share = shape
    if any((p.count, p.duration, p.mode, p.mem_mib, 1 if p.mode == EXCLUSIVE else p.share) == shape
           for p in saved):
        return None
    command = Preset("NAME", count, duration, mode, share, mem).save_command()
    return {"times": times, "command": command,
            "hint": f"you booked this {times} times; save it: {command}"}


# --------------------------------------------------------- prompt history

def _load_history(app) -> list[str]:
    """The interactive prompt's previous lines, oldest first (empty when unreadable)."""
    from bk.store.presets import HistoryFile

    return HistoryFile(_state_dir(app)).read()


def _save_history(app, lines: list[str]) -> None:
    from bk.store.presets import HistoryFile

    HistoryFile(_state_dir(app)).write(lines)


# ------------------------------------------------------------ the rows

@dataclass(frozen=True)
class PresetsResult:
    presets: tuple

    def to_json(self) -> dict:
        return {"presets": [preset_json(x) for x in self.presets]}


def _serve_presets(app, req, call) -> PresetsResult:
    return PresetsResult(tuple(_list_presets(app)))


@dataclass(frozen=True)
class PresetRequest:
    name: str


@dataclass(frozen=True)
class PresetResult:
    preset: Preset

    def to_json(self) -> dict:
        return {"preset": preset_json(self.preset)}


def _serve_preset(app, req: PresetRequest, call) -> PresetResult:
    return PresetResult(_get_preset(app, req.name))


@dataclass(frozen=True)
class PresetSaveRequest:
    preset: Preset
    dry_run: bool = False


@dataclass(frozen=True)
class PresetSaveResult:
    status: str                        # created | replaced | unchanged (or, dry run, what it would be)
    preset: Preset
    dry_run: bool = False

    def to_json(self) -> dict:
        return {"status": self.status, "preset": preset_json(self.preset), "dry_run": self.dry_run}


def _serve_preset_save(app, req: PresetSaveRequest, call) -> PresetSaveResult:
    status, saved = _save_preset(app, req.preset, call=call, dry_run=req.dry_run)
    return PresetSaveResult(status, saved, req.dry_run)


@dataclass(frozen=True)
class PresetDeleteRequest:
    name: str
    dry_run: bool = False


@dataclass(frozen=True)
class PresetDeleteResult:
    preset: Preset
    dry_run: bool = False

    def to_json(self) -> dict:
        return {"status": "deleted", "preset": preset_json(self.preset), "dry_run": self.dry_run}


def _serve_preset_delete(app, req: PresetDeleteRequest, call) -> PresetDeleteResult:
    return PresetDeleteResult(_delete_preset(app, req.name, dry_run=req.dry_run), req.dry_run)


@dataclass(frozen=True)
class DefaultsResult:
    """The guided booking's defaults, learned from the caller's recent bookings."""

    count: int
    duration: int
    mode: str
    mem_mib: int | None
    learned: int                       # how many bookings taught them (0: the built-in ones)

    def to_json(self) -> dict:
        return {"count": self.count, "duration": self.duration, "mode": self.mode, "mem_mib": self.mem_mib,
                "learned": self.learned}


def _serve_defaults(app, req, call) -> DefaultsResult:
    return DefaultsResult(**_learned_defaults(app, call=call))


@dataclass(frozen=True)
class PresetHintRequest:
    """After a booking (``reservation``; None: the caller's latest), whether
    to suggest saving it as a preset; ``times``: the same-shape count the
    booking's own transaction made (``BookResult.same_shape``)."""

    reservation: Reservation | None = None
    times: int | None = None


@dataclass(frozen=True)
class PresetHint:
    suggestion: dict | None            # {"times", "command", "hint"}, or None

    def to_json(self) -> dict:
        return {"suggestion": self.suggestion}


def _serve_preset_hint(app, req: PresetHintRequest, call) -> PresetHint:
    return PresetHint(_suggest_preset(app, req.reservation, call=call, times=req.times))


@dataclass(frozen=True)
class PromptHistory:
    """The interactive prompt's previous lines, oldest first."""

    lines: tuple

    def to_json(self) -> dict:
        return {"lines": list(self.lines)}


@dataclass(frozen=True)
class PromptHistoryRequest:
    lines: tuple


def _serve_prompt_history(app, req, call) -> PromptHistory:
    return PromptHistory(tuple(_load_history(app)))


def _serve_prompt_history_save(app, req: PromptHistoryRequest, call) -> PromptHistory:
    _save_history(app, list(req.lines))
    return PromptHistory(tuple(req.lines))
