"""Pieces several command modules share: the booking flags, the words a
request is built from, and how a reservation looks to a human.

Every word a user types about time or memory goes through
``bk.core.timegrid`` here, with the service's clock and the local zone, so
``bk 2 1h``, ``bk slots 2 1h`` and ``bk e 1 -d 2h`` read their words the same
way.  Nothing here prints; commands return ``Output`` and ``bk.cli.render``
prints it.
"""

from __future__ import annotations

from bk.core import timegrid
from bk.core.errors import InvalidInput, UsageError
from bk.core.models import Reservation

DEFAULT_DURATION = "1h"


# ------------------------------------------------------------------ flags

def add_placement_flags(p, *, share: bool = True) -> None:
    """-g, -e, -m, -s: where a booking may go and how much of a GPU it takes."""
    p.add_argument("-g", "--gpu", metavar="LIST", help="pin these GPUs, e.g. 0,1 or 0-3 (all or nothing)")
    p.add_argument("-e", "--exclude", metavar="LIST", help="never use these GPUs, e.g. 2,3")
    p.add_argument("-m", "--mem", metavar="MEM", help="expected VRAM per GPU, e.g. 12g or 512m")
    if share:
        p.add_argument("-s", "--share", metavar="N", type=positive_int,
                       help="share slots to take on each GPU (default 1)")


def add_fair_flags(p, *, edit: bool = False) -> None:
    """--advance, --no-advance, --with (issue 27: bk.core.advance, bk.core.sharing)."""
    p.add_argument("--advance", action="store_true",
                   help=("from now on, move to an earlier start on its own when GPUs free up"
                         if edit else "if queued, move to an earlier start on its own when GPUs free "
                         "up (never later; the owner is notified)"))
    p.add_argument("--no-advance", action="store_true",
                   help="stop moving on its own" if edit else
                   "never move on its own (overrides the server's advance_default)")
    p.add_argument("--with", dest="shared_with", metavar="LIST",
                   help="users and @groups who may also use it (bk run -r), e.g. alice,@nlp; "
                        "only you edit or cancel it" + ("; --with none: nobody" if edit else ""))


def add_start_flags(p) -> None:
    p.add_argument("-t", "--at", metavar="TIME",
                   help="start time: now, +30m, 20:00, 9pm, tomorrow 09:00, 07-13 20:00 (default: now)")
    p.add_argument("--start", metavar="ISO", help="exact start, ISO-8601: 2026-07-13T18:00:00Z")


IDLE_RELEASE_HELP = ("end the booking once the monitor saw it idle this long (no compute and no CPU "
                     "work by its processes; bk u samples shows the evidence), e.g. 60m; default: "
                     "only nudges, unless the administrator set idle_release_minutes")


def add_write_flags(p) -> None:
    """--op-id and --dry-run: every write has both."""
    p.add_argument("--op-id", metavar="KEY",
                   help="idempotency key: repeating the same request with it changes nothing")
    p.add_argument("--dry-run", action="store_true", help="show what would happen; change nothing")


def positive_int(text: str) -> int:
    """argparse ``type`` for counts and limits (a BkError, so the message is ours)."""
    try:
        n = int(text)
    except ValueError:
        raise InvalidInput(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise InvalidInput(f"expected a number of at least 1, got {n}")
    return n


def simulated_gpu_count(gpu_count: int | None, simulated: int | None) -> tuple[int | None, bool]:
    """``--gpu-count`` and ``--simulated-gpus`` of the set-up commands as
    (gpu_count, simulated_gpus): the second says the count and that it is simulated."""
    if simulated is None:
        return gpu_count, False
    if gpu_count is not None and gpu_count != simulated:
        raise UsageError(f"--gpu-count {gpu_count} and --simulated-gpus {simulated} disagree",
                         hint="--simulated-gpus N alone sets the count too")
    return simulated, True


# ------------------------------------------------------------------ words

def time_ahead(word: str, flag: str, now: int, tz) -> int:
    """A time ahead for an option that is not a start (a notice's
    ``--until``): the start grammar (+2h, 18:30, tomorrow 09:00), refused in
    the option's own words, since a refusal about "start" names an option
    that was never typed."""
    text = " ".join(word.split())
    try:
        t = timegrid.parse_start(text, now, tz, 1).t
    except InvalidInput as e:
        message, hint = e.message, e.hint or ""
        if message.startswith("start "):
            message = f"{flag} {message[len('start '):]}"
        message = message.replace("a start is now or later", f"{flag} takes a time ahead")
        if flag not in message:
            message = f"{flag}: {message}"
        if hint.startswith("e.g. now or "):
            hint = f"e.g. {flag} +2h or {flag} 18:30"
        hint = hint.replace("the earliest start is", "the earliest is")
        raise InvalidInput(message, hint or f"e.g. {flag} +2h or {flag} 18:30") from None
    if t <= now:
        raise UsageError(f"{flag} {text} is not in the future", hint=f"e.g. {flag} +2h")
    return t


def parse_gpu_list(text: str | None, flag: str) -> tuple[int, ...] | None:
    from bk.service import builders

    return builders.gpu_list(text, flag)


def parse_count(text: str) -> int:
    from bk.service import builders

    return builders.count(text)


def split_words(words: list[str], duration_flag: str | None, mem_flag: str | None) -> tuple[str, str | None]:
    """``DUR [MEM]`` after the count; ``-d`` may replace DUR and ``-m`` MEM."""
    from bk.service.builders import MAX_WORD

    for w in (*words, duration_flag, mem_flag):
        if w is not None and len(w) > MAX_WORD:
            raise UsageError(f"the word {w[:20]!r}... is too long ({len(w)} characters)",
                             hint="the form is: N DUR [MEM], e.g. bk 2 1h30m 12g")
    words = list(words)
    dur = duration_flag
    if dur is None:
        if not words:
            raise UsageError("missing the duration", hint="e.g. bk 1 30m, or -d 30m")
        dur = words.pop(0)
    if len(words) > 1:
        raise UsageError(f"unexpected words: {' '.join(words[1:])}",
                         hint="the form is: N DUR [MEM], e.g. bk 2 1h30m 12g")
    mem = words[0] if words else None
    if mem is not None and mem_flag is not None and mem != mem_flag:
        raise UsageError(f"memory given twice ({mem} and -m {mem_flag})", hint="give it once")
    return dur, mem if mem is not None else mem_flag


def book_request(call, args, *, mode: str, count: int, words: list[str],
                 default_duration: str | None = None, write: bool = True):
    """The typed request for ``bk N DUR [MEM]`` and its read-only cousins
    (``bk slots``, ``bk g``) from argparse's namespace: the words go to
    ``bk.service.builders``.  Returns (BookRequest, StartSpec or None)."""
    dflag = getattr(args, "duration", None)
    if not words and dflag is None and default_duration is not None:
        dflag = default_duration
    from bk.service import builders

    dur_text, mem_text = split_words(words, dflag, getattr(args, "mem", None))
    return builders.book_request(
        count_=count, duration_=dur_text, mem=mem_text, mode=mode, share=getattr(args, "share", None),
        at=getattr(args, "at", None), start_iso=getattr(args, "start", None),
        queue=bool(getattr(args, "queue", False)), gpus=getattr(args, "gpu", None),
        exclude=getattr(args, "exclude", None),
        note=getattr(args, "note", None) if write else None,
        op_id=getattr(args, "op_id", None) if write else None,
        dry_run=bool(getattr(args, "dry_run", False)) if write else False,
        again=bool(getattr(args, "again", False)) if write else False,
        advance=bool(getattr(args, "advance", False)) if write else False,
        no_advance=bool(getattr(args, "no_advance", False)) if write else False,
        shared_with=getattr(args, "shared_with", None) if write else None,
        idle_release_=getattr(args, "idle_release", None) if write else None,
        policy=call.policy, now=call.now, tz=call.tz)


# ------------------------------------------------------------ reservations

# How a booking reads (one module for the CLI and the TUI: bk.core.timegrid).
gpus_text, mode_text, summary_line = timegrid.gpus_text, timegrid.mode_text, timegrid.summary_line


def status_text(r: Reservation, *, now: int) -> str:
    """``1h20m left`` (active), ``in 2h05m`` (upcoming within a day), ``upcoming``, ``ended``."""
    return timegrid.status_text(r, now)


def reservations_table(items, view, term, *, tz, show_user: bool) -> str:
    """The aligned list every command prints (``bk l``, ``bk st``, ``bk login``),
    drawn from the typed reservations with the call's ``View`` (list
    numbers, capacity), the same facts the JSON rows carry."""
    from bk.cli.render import safe, table

    now, capacity = view.now, view.policy.max_shared_users
    headers = ["#", "ID", *(["USER"] if show_user else []), "GPUS", "MODE", "MEM", "WHEN", "STATUS", "NOTE"]
    body = []
    for r in items:
        body.append([str(view.numbers.get(r.id) or ""), r.short_id, *([safe(r.user)] if show_user else []),
                     gpus_text(r.gpus), mode_text(r, capacity), timegrid.mem_text(r.mem_mib),
                     timegrid.when_text(r.start, r.end, tz, now), _with_activity(timegrid.status_text(r, now), view, r),
                     safe(r.note or "")])
    if not any(r.note for r in items):
        headers.pop()
        body = [b[:-1] for b in body]
    # When the terminal is narrow, cut the note first, then the status words,
    # then user names; IDs and times are never cut.
    order = [len(headers) - 1, headers.index("STATUS"), *([2] if show_user else [])]
    return table(body, headers, term, shrink=list(dict.fromkeys(order)))


def fair_lines(r, *, tz, now: int, position: int | None = None, theirs: bool = False) -> list[str]:
    """What issue 27 adds to a booking's picture: it advances (its place in
    line, the latest start it keeps), and who shares it."""
    from bk.cli.render import safe

    out = []
    if r.advance is not None and r.cancelled_at is None and r.start > now:
        where = f" (position {position} in line)" if position else ""
        out.append(f"advancing{where}: moves earlier on its own if GPUs free up; "
                   f"starts {timegrid.format_local_short(r.start, tz, now)} at the latest")
    if theirs:
        out.append(f"{safe(r.user)}'s, shared with you: run on it with bk run -r {r.short_id} -- CMD")
    elif r.shared_with:
        # Only for a shared booking: bk l loads nothing more otherwise.
        from bk.core import sharing

        out.append(f"shared with {safe(sharing.describe(r.shared_with))}: they may run on it "
                   f"(bk run -r {r.short_id} -- CMD); only you edit or cancel it")
    return out


def fair_table_lines(items, view) -> str:
    """``fair_lines`` for a list's bookings, each after its number or ID."""
    lines = []
    for r in items:
        num = view.numbers.get(r.id)
        head = f"{num} [{r.short_id}]" if num else r.short_id
        for line in fair_lines(r, tz=view.tz, now=view.now, position=view.positions.get(r.id),
                               theirs=r.id in view.usable):
            lines.append(f"{head} {line}")
    return "".join("\n" + line for line in lines)


def _with_activity(words: str, view, r: Reservation) -> str:
    """``1h20m left · idle 35m``: the monitor's state of a running booking."""
    text = view.activity_text(r) if hasattr(view, "activity_text") else None
    return f"{words} · {text}" if text else words


def job_lines(items, view, uid: int) -> str:
    """Each booking's attached command: its state, and for your own its
    summary and why it waits (bk j has the rest)."""
    from bk.cli.render import safe

    lines = []
    for r in items:
        if r.job is None:
            continue
        num = view.numbers.get(r.id)
        head = f"job of {num} [{r.short_id}]" if num else f"job of {r.short_id}"
        text = f"{head}: {safe(r.job.status)}"
        if r.uid == uid:
            text += f" ({safe(r.job.summary or '')})"
            reason = r.job.extra.get("reason")
            if reason and r.job.status in ("pending", "failed", "uncertain"):
                text += f": {safe(reason)}"
        lines.append(text)
    return "".join("\n" + line for line in lines)


def need_root(what: str) -> None:
    """``bk admin WHAT`` refuses a caller who is not root (exit 5) before it reads anything."""
    import os

    if os.geteuid() != 0:
        from bk.core.errors import PermissionDenied

        raise PermissionDenied(f"bk admin {what} is for the administrator (root)",
                               hint=f"sudo bk admin {what} ...")


def when_short(t: int, call) -> str:
    """An instant in the call's zone, as compact as its distance from now allows."""
    return timegrid.format_local(t, call.tz, now=call.now, compact=True)
