"""Request builders: what a person typed or picked, to a typed request.

Pure functions of plain values (words or already typed numbers) plus the
policy, the instant and the zone of the call.  argparse handlers, the guided
flows, presets, and later the TUI forms and MCP tools all call these, so
``2h``, ``+30m``, ``-t now``, ``0-3`` and a list number mean one thing
everywhere, and nobody turns typed values back into words to re-parse them.

Two builders read JSON that programs send rather than words: ``worded``
(the fields a person may write as words) and ``resolved`` (an edit's or a
cancellation's ``ref``, which runs the ``resolve`` row to name the booking);
the agent surface and a cluster node (``bk c node --row``) share them, so an
agent's edit and a cluster client's edit are read alike.
"""

from __future__ import annotations

from bk.core import timegrid
from bk.core.errors import InvalidInput, UsageError
from bk.core.models import EXCLUSIVE, SHARED, Reservation
from bk.service import fields, fieldspecs
from bk.service.fields import MAX_GPUS
from bk.service.requests import BookRequest, EditRequest

CLEAR_MEM_WORDS = ("auto", "none", "default")


# Every size a person types is checked against its limit before anything
# is built from it: ``-g 0-99999999`` is refused by looking at its two
# ends, never by expanding the range (which once took 47 s and 12 GB).
MAX_WORD = 200            # no count, duration, size or GPU list is longer than this


def _no_gpu(what: str, gpu_count: int | None) -> InvalidInput:
    if gpu_count:
        have = "GPU 0" if gpu_count == 1 else f"GPUs 0-{gpu_count - 1}"
        return InvalidInput(f"no GPU {what}: this server has {have}", hint="list the GPUs with: bk st")
    return InvalidInput(f"no GPU {what}: GPU indices are 0-{MAX_GPUS - 1}", hint="list the GPUs with: bk st")


def gpu_list(value, flag: str, gpu_count: int | None = None) -> tuple[int, ...] | None:
    """``0,1``, ``0-3``, ``2`` (or already a sequence of ints) -> GPU indices,
    sorted, unique, each below ``gpu_count`` (the policy's; at most
    ``MAX_GPUS`` when the caller does not know it)."""
    if value is None:
        return None
    limit = gpu_count or MAX_GPUS
    if not isinstance(value, str):
        out = set()
        for g in value:
            if type(g) is not int or not 0 <= g < limit:
                raise _no_gpu(str(g)[:20], gpu_count)
            out.add(g)
        if not out:
            raise InvalidInput(f"{flag} names no GPU", hint="e.g. -g 0,1")
        return tuple(sorted(out))
    text = value
    if len(text) > MAX_WORD:
        raise InvalidInput(f"{flag} is too long ({len(text)} characters)", hint="e.g. -g 0,1 or -g 0-3")
    out = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not (lo.isascii() and lo.isdigit()) or (sep and not (hi.isascii() and hi.isdigit())):
            raise InvalidInput(f"{flag} wants GPU indices like 0,1 or 0-3, got {text!r}",
                               hint="list the GPUs with: bk st")
        # Bounds first, on the digits: a 5,000-digit index is simply too big.
        a = int(lo) if len(lo) <= 6 else limit
        b = (int(hi) if len(hi) <= 6 else limit) if sep else a
        if sep and b < a:
            raise InvalidInput(f"{flag}: the range {part} runs backwards", hint=f"write {hi}-{lo}")
        if b >= limit:
            first, last = (lo if a >= limit else str(limit)), (hi if sep else lo)
            raise _no_gpu(first if first == last else f"{first}-{last}", gpu_count)
        out.update(range(a, b + 1))
    if not out:
        raise InvalidInput(f"{flag} names no GPU", hint="e.g. -g 0,1")
    return tuple(sorted(out))


def count(value) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if not 1 <= value <= MAX_GPUS:
            raise InvalidInput(f"the GPU count must be 1-{MAX_GPUS}, got {value}")
        return value
    text = str(value)
    if not (text.isascii() and text.isdigit()) or int(text[:6]) < 1:
        raise InvalidInput(f"the GPU count must be a whole number of at least 1, got {text[:40]!r}",
                           hint="e.g. bk 2 1h books two GPUs for an hour")
    if len(text) > 6 or int(text) > MAX_GPUS:
        raise InvalidInput(f"the GPU count must be 1-{MAX_GPUS}, got {text[:40]}",
                           hint="e.g. bk 2 1h books two GPUs for an hour")
    return int(text)


def _text(value, flag: str, field_name: str, spec) -> str | None:
    """``value`` checked by the field spec's own rule (``fields.check_text``),
    named by its flag, before any request is built."""
    if value is None:
        return None
    f = next(f for f in spec if f.name == field_name)
    return fields.check_text(value, flag, max_len=f.max_len, min_len=f.min_len, pattern=f.pattern,
                             help=fieldspecs.OP_ID_HELP if field_name == "op_id" else f.help)


def note_text(value, flag: str = "--note") -> str | None:
    return _text(value, flag, "note", fieldspecs.BOOK_FIELDS)


def op_id_text(value, flag: str = "--op-id") -> str | None:
    return _text(value, flag, "op_id", fieldspecs.BOOK_FIELDS)


def duration(value, slot_minutes: int) -> int:
    """Seconds from ``1h30m`` (or seconds already)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise InvalidInput("duration must be positive", hint="example: bk 1 30m")
        return value
    return timegrid.parse_duration(str(value), slot_minutes)


def memory(value) -> int | None:
    """MiB from ``12g`` (or MiB already); None stays None."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return timegrid.parse_memory(str(value))


def start(at: str | None, exact: str | None, *, now: int, tz, slot_minutes: int):
    """``-t TIME`` or ``--start ISO`` -> (epoch seconds or None for now, StartSpec or None)."""
    if at is not None and exact is not None:
        raise UsageError("give either -t/--at or --start, not both",
                         hint="-t takes human forms (20:00, +30m); --start the ISO form")
    if exact is not None:
        return timegrid.parse_iso_start(exact, now, slot_minutes), None
    if at is not None:
        # Any explicit -t is exact, "-t now" included (SPEC 3): only a bare
        # booking, with no -t at all, may be queued to a later start.
        spec = timegrid.parse_start(at, now, tz, slot_minutes)
        return spec.t, spec
    return None, None


def check_share(mode: str, share: int | None) -> None:
    """``-s`` with ``-x``: refused wherever a booking's words are read."""
    if mode == EXCLUSIVE and share is not None:
        raise UsageError("--share applies to shared bookings; an exclusive booking takes the whole GPU",
                         hint="drop -s, or book shared: bk N DUR -s 2")


def book_request(*, count_: int | str, duration_: int | str, policy, now: int, tz, mem=None,
                 mode: str = SHARED, share: int | None = None, at: str | None = None,
                 start_iso: str | None = None, start_at: int | None = None, queue: bool = False,
                 gpus=None, exclude=None, note: str | None = None, op_id: str | None = None,
                 dry_run: bool = False, again: bool = False, advance: bool = False,
                 no_advance: bool = False, shared_with: str | None = None, idle_release_=None):
    """The typed request for ``bk N DUR [MEM]`` and its read-only cousins
    (``bk slots``, ``bk g``).  ``start_at`` is an already resolved start
    (a form's); ``at``/``start_iso`` the typed words; ``again`` books even
    a repeat of a booking just made.  Returns (BookRequest, StartSpec or None)."""
    slot = policy.slot_minutes
    note, op_id = note_text(note), op_id_text(op_id)
    n_gpus = policy.gpu_count
    check_share(mode, share)
    when, spec = start(at, start_iso, now=now, tz=tz, slot_minutes=slot)
    if start_at is not None:
        if when is not None:
            raise UsageError("the start is given twice", hint="give one start")
        when = start_at
    req = BookRequest(
        count=count(count_), duration=duration(duration_, slot), mode=mode, share=share or 1,
        mem_mib=memory(mem), start=when, queue=bool(queue), pinned=gpu_list(gpus, "-g", n_gpus),
        excluded=gpu_list(exclude, "-e", n_gpus) or (), note=note, op_id=op_id, dry_run=bool(dry_run),
        again=bool(again), advance=bool(advance), no_advance=bool(no_advance),
        shared_with=with_text(shared_with), idle_release_minutes=idle_release(idle_release_) or None)
    return req, spec


def with_text(value) -> str | None:
    """``--with``: checked by the field's rule, then by ``bk.core.sharing``
    (the apply parses it again: the broker takes it from the wire)."""
    if value is None:
        return None
    text = _text(value, "--with", "shared_with", fieldspecs.BOOK_FIELDS)
    from bk.core.sharing import parse

    parse(text)
    return text


OFF_WORDS = ("off", "none", "no", "never")


def idle_release(value, flag: str = "--idle-release") -> int | None:
    """``60m``, ``2h`` (or minutes as an int) -> minutes; ``off`` -> 0 (an
    edit's "no opt-in"); None stays None."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        minutes = value
    elif str(value).strip().lower() in OFF_WORDS:
        return 0
    else:
        minutes = timegrid.parse_duration(str(value), 1) // 60
    if not 5 <= minutes <= 10080:
        raise InvalidInput(f"{flag} must be 5 minutes to 7 days (or off), got {timegrid.counted(minutes, 'minute')}",
                           hint=f"e.g. {flag} 60m")
    return minutes


def keep_for(value, now: int, flag: str = "--keep-for") -> int | None:
    """``4h`` -> the epoch second the keep ends (now + 4h); ``off`` -> 0."""
    if value is None:
        return None
    if str(value).strip().lower() in OFF_WORDS:
        return 0
    return now + timegrid.parse_duration(str(value), 1)


def length_or_end(text, old: Reservation, *, now: int, tz, slot_minutes: int) -> tuple[int | None, int | None]:
    """``-d`` of an edit -> (new total length, or None; new end, or None).

    A plain duration (``2h``) is the new total length; the end forms
    (``+30m``, ``-15m``, ``20:00``, ``total 2h``) move the end."""
    if isinstance(text, int) and not isinstance(text, bool):
        return duration(text, slot_minutes), None
    word = " ".join(str(text).split()).lower()
    relative = word.startswith(("+", "-", "total"))
    if not relative:
        try:
            return timegrid.parse_duration(word, slot_minutes), None
        except InvalidInput:
            pass            # not a length: maybe a clock time for the new end
    new_end = timegrid.parse_end_change(str(text), old.start, old.end, now, tz, slot_minutes)
    if relative and old.status(now) == "upcoming":
        # Relative forms keep their meaning when -t also moves the start:
        # "+30m" is 30 minutes longer, wherever the booking goes.
        return new_end - old.start, None
    return None, new_end


def edit_request(old: Reservation, *, policy, now: int, tz, length=None, end: int | None = None,
                 at: str | None = None, start_iso: str | None = None, start_at: int | None = None,
                 gpus=None, exclude=None, mem=None, share: int | None = None, mode: str | None = None,
                 queue: bool = False, note: str | None = None, op_id: str | None = None,
                 dry_run: bool = False, clear_mem: bool = False, advance: bool = False,
                 no_advance: bool = False, shared_with: str | None = None, idle_release_=None,
                 keep_for_=None) -> EditRequest:
    """The typed change of booking ``old``.  ``length`` is ``-d``'s word (or
    seconds of total length); ``end`` an already resolved new end; ``mem``
    a size (or the word ``auto``), ``clear_mem`` forgets the figure."""
    slot = policy.slot_minutes
    note, op_id = note_text(note), op_id_text(op_id)
    new_length = new_end = None
    if length is not None:
        new_length, new_end = length_or_end(length, old, now=now, tz=tz, slot_minutes=slot)
    if end is not None:
        new_end = end
    when, spec = start(at, start_iso, now=now, tz=tz, slot_minutes=slot)
    if spec is not None and spec.is_now:
        when = spec.t      # "-t now" moves an upcoming booking to the current slice
    if start_at is not None:
        when = start_at
    mem_mib = None
    if isinstance(mem, str) and mem.strip().lower() in CLEAR_MEM_WORDS:
        clear_mem = True
    elif not clear_mem:
        mem_mib = memory(mem)
    return EditRequest(ref=old.id, duration=new_length, start=when, end=new_end, mode=mode, share=share,
                       mem_mib=mem_mib, clear_mem=clear_mem, pinned=gpu_list(gpus, "-g", policy.gpu_count),
                       excluded=gpu_list(exclude, "-e", policy.gpu_count), queue=bool(queue), note=note, op_id=op_id,
                       dry_run=bool(dry_run), advance=bool(advance), no_advance=bool(no_advance),
                       shared_with=with_text(shared_with), idle_release_minutes=idle_release(idle_release_),
                       keep_until=keep_for(keep_for_, now))



def recommend_request(book: BookRequest, limit: int = 3):
    """``bk slots``' typed question from the booking it is about."""
    from bk.service.advice import RecommendRequest

    return RecommendRequest(book.count, book.duration, mode=book.mode, share=book.share, mem_mib=book.mem_mib,
                            start=book.start, pinned=book.pinned, excluded=book.excluded, limit=limit)


def gpu_request(book: BookRequest, *, count_given: bool):
    """``bk g [N]``'s typed question: ``count_given`` False asks for the
    caller's running booking's GPUs first."""
    from bk.service.advice import GpuRequest

    return GpuRequest(book.count if count_given else None, book.duration, mode=book.mode, share=book.share,
                      mem_mib=book.mem_mib, pinned=book.pinned, excluded=book.excluded)


def policy_change(*, gpu_count: int, disable: str | None = None, enable: str | None = None,
                  priority: str | None = None, horizon_days: int | None = None, max_hours: int | None = None,
                  require_memory: bool | None = None, reserve_mb: int | None = None, limits=(), tiers=(),
                  exempt: str | None = None, advance_default: str | None = None, fair_share: str | None = None,
                  half_life_days: float | None = None):
    """``bk admin gpu-policy``'s flags as the typed change (``--disable 3``,
    ``--priority 3=1,2=5``, ``--limit '*:gpus=2'``, ``--tier students=@students``,
    ``--advance-default on``)."""
    from bk.service import policyedit

    return policyedit.PolicyChange(
        disable=policyedit.parse_gpus(disable, gpu_count) if disable else (),
        enable=policyedit.parse_gpus(enable, gpu_count) if enable else (),
        priority=policyedit.parse_priority(priority, gpu_count) if priority else (),
        horizon_days=horizon_days, max_hours=max_hours, require_memory=require_memory, reserve_mb=reserve_mb,
        limits=tuple(policyedit.parse_limit(t) for t in limits),
        tiers=tuple(policyedit.parse_tier(t) for t in tiers),
        exempt=tuple(w.strip() for w in exempt.split(",") if w.strip()) if exempt is not None else None,
        advance_default=None if advance_default is None else advance_default == "on",
        fair_share=None if fair_share is None else fair_share == "on",
        half_life_days=half_life_days)


def worded(op, wire: dict, call, old=None) -> dict:
    """``wire`` with the words a person writes (``"30m"``, ``"tomorrow 09:00"``)
    in the fields that take them turned into the numbers the row's spec
    takes, with the CLI's grammar and its refusals (``bk.service.builders``,
    ``bk.core.timegrid``), on this call's clock, zone and slices.  ``old``:
    the booking an edit changes (its ``-d`` forms move its end).  The agent
    surface (``bk mcp``, ``bk agent``) and a cluster node (``bk c node --row``) read
    their callers' fields with it."""
    human = {f.name: f.human for f in op.fields if f.human}
    out = dict(wire)
    slot, now, tz = call.policy.slot_minutes, call.now, call.tz
    for name, value in wire.items():
        kind = human.get(name)
        if kind is None or not isinstance(value, str):
            continue
        if kind == "duration":
            out[name] = duration(value, slot)
        elif kind == "start":
            out[name] = start(value, None, now=now, tz=tz, slot_minutes=slot)[0]
        elif kind == "memory":
            out[name] = memory(value)
        elif kind == "since":
            from bk.core.usage import parse_since

            out[name] = parse_since(value, now, tz)
        elif kind in ("length", "end") and old is not None:
            if kind == "end":
                from bk.core.timegrid import parse_end_change

                out[name] = parse_end_change(value, old.start, old.end, now, tz, slot)
                continue
            length, end = length_or_end(value, old, now=now, tz=tz, slot_minutes=slot)
            del out[name]
            if length is not None:
                out[name] = length
            elif isinstance(wire.get("end"), (int, str)):
                raise InvalidInput(f"{name} {value!r} moves the end, and so does end: give the new end once",
                                   hint='e.g. {"duration": "+30m"} or {"end": "20:00"}')
            else:
                out["end"] = end
    return out


# A command attached to a booking, as JSON carries it (the agent's create, a
# cluster client's book_job row): no shell, the program and its arguments.
MAX_ARGV, MAX_ARG = 256, 4096


def command(value, label: str) -> tuple[str, ...]:
    """``value`` as a command's argv, or refused in ``label``'s name
    (``argument 'command'``, ``field 'command'``).  Any text but NUL (no
    argv holds one) and lone surrogates (no UTF-8 encoder writes one)."""
    def fits(a) -> bool:
        if not isinstance(a, str) or len(a) > MAX_ARG or "\0" in a:
            return False
        try:
            a.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_ARGV or not all(fits(a) for a in value):
        raise InvalidInput(f"{label} must be a list of 1-{MAX_ARGV} strings (the program and its "
                           f"arguments, at most {MAX_ARG} characters each, no NUL)",
                           hint='e.g. ["python3", "train.py", "--lr", "3e-4"]')
    return tuple(value)


def resolved(app, op, wire: dict, call, decode=None):
    """The typed ``edit``/``cancel`` request (``op``) for ``wire``, whose
    ``ref`` may be a list number or an ID prefix: the ``resolve`` row names
    the booking (an op-id that already did this names the booking it did it
    to, whatever "1" means by now), and the person's words in ``wire``
    (``"+30m"``) are read against it.  ``decode(op, wire)`` is how the
    caller's refusals are worded (the agent names its arguments); default
    the row's own ``decode``."""
    from bk import service

    decode = decode or (lambda o, w: o.decode(w))
    ref = wire.get("ref")
    if not isinstance(ref, str):
        return decode(op, wire)        # the decode says what is wrong
    # The resolve row's own spec checks the reference (and the op-id) as
    # every front end's request is checked.
    op_id = wire.get("op_id")
    which = decode(service.get("resolve"), {"ref": ref, "action": op.name,
                                            **({"op_id": op_id} if isinstance(op_id, str) else {})})
    earlier = app.run("resolve", which, call=call).reservation
    return decode(op, worded(op, {**wire, "ref": earlier.id}, call, old=earlier))
