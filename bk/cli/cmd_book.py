"""``bk N DUR [MEM]`` (``book``, ``s``) and ``bk x N DUR [MEM]`` (``exclusive``)."""

from __future__ import annotations

from bk.cli import common
from bk.cli.render import Output, wrap
from bk.core import timegrid
from bk.core.errors import UsageError
from bk.core.models import EXCLUSIVE, SHARED

EXAMPLES = {
    SHARED: """Examples:
  bk 1 30m                   one GPU, shared, now (queued if full)
  bk 2 1h30m 12g             two GPUs, 90 minutes, 12 GiB per GPU
  bk 1 2h -t 20:00           at 20:00 exactly (tomorrow if today's has passed)
  bk 1 2h -t 20:00 --queue   at 20:00 or the earliest start after it
  bk 2 1h -g 0,1 --dry-run   show where it would go, book nothing
  bk 2 8h --idle-release 60m end it after an hour seen idle
  bk 2 8h -t 20:00 -- ./train.sh   and run ./train.sh at 20:00 (bk run)
  bk 4 8h --advance          if queued, move earlier on its own when GPUs free
  bk 2 1d --with alice,@nlp  alice and group nlp may use it too (bk run -r)
""",
    EXCLUSIVE: """Examples:
  bk x 1 2h                  one whole GPU for two hours, now
  bk x 2 1d -t 'tomorrow 09:00'
""",
}


# The rule lives in bk.service.booking.repeat_of; this is its wording for
# bk(1).  The window is the service's (the CLI imports no service module to
# register its flags: that keeps ``bk --help`` cheap).
REPEAT_MINUTES = 5
REPEAT_RULE = f"""
The same booking twice:
  The same booking made again within {REPEAT_MINUTES} minutes is not a second booking:
  bk answers 'exists' with the first booking's ID (exit 0). "The same" means
  the same mode, GPU count, share, memory, note and length, the pinned GPUs
  if -g is given, and the same start: where this one would start if the
  first had not been made (a bare booking a slice later still counts). The
  GPUs each would get are not compared. Add --again to book another on
  purpose. Bookings with --op-id follow the op-id rule alone (the same key
  and request answer 'exists'; a new key books), and --dry-run never repeats.
"""


def register(sub) -> None:
    import argparse  # the parser only: bk.cli.fast runs the everyday words without it

    for name, aliases, mode, what in (
            ("book", ["s"], SHARED, "book N GPUs, shared (bk N DUR [MEM])"),
            ("exclusive", ["x"], EXCLUSIVE, "book N whole GPUs (bk x N DUR [MEM])")):
        p = sub.add_parser(
            name, aliases=aliases, help=what,
            description=what[0].upper() + what[1:] + ". A bare booking starts now (the current "
            "slice); if that is full it is queued to the earliest start that fits. An explicit "
            "-t/--start is exact: a conflict is an error unless --queue.",
            epilog=EXAMPLES[mode] + REPEAT_RULE, formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("count", metavar="N", help="number of GPUs")
        p.add_argument("words", nargs="*", metavar="DUR [MEM]",
                       help="duration (30m, 2h, 1h30m, 1d) and optional VRAM per GPU (12g)")
        p.add_argument("-d", "--duration", metavar="DUR", help="the duration, instead of the DUR word")
        common.add_placement_flags(p)
        common.add_start_flags(p)
        p.add_argument("--queue", action="store_true",
                       help="with -t/--start: take the earliest start at or after it")
        p.add_argument("--note", metavar="TEXT", help="a note others see in the lists")
        p.add_argument("--idle-release", metavar="DUR", help=common.IDLE_RELEASE_HELP)
        p.add_argument("-y", "--yes", action="store_true", help="never ask (booking does not ask; "
                       "accepted so scripts can pass it to every write)")
        p.add_argument("-q", "--quiet", action="store_true", help="print only the booking ID")
        p.add_argument("--again", action="store_true",
                       help="book a second one even if you made the same booking in the last "
                       f"{REPEAT_MINUTES} minutes (without it that answers 'exists' with the first)")
        p.add_argument("-v", "--verbose", action="store_true", help="show why each GPU was or was not chosen")
        common.add_fair_flags(p)
        common.add_write_flags(p)
        p.set_defaults(handler=run, command=name, mode=mode, takes_command=True, attached=None)


def run(args, ctx) -> Output:
    app, call = ctx.app(), ctx.call()
    req, spec = common.book_request(call, args, mode=args.mode, count=common.parse_count(args.count),
                                    words=args.words)
    if args.attached is not None:         # bk N DUR [MEM] -- CMD ARGS...
        from bk.cli.cmd_run import book_command

        return book_command(app, call, ctx, req, spec, args.attached, command=args.command,
                            quiet=args.quiet, verbose=args.verbose)
    return book_and_show(app, call, ctx, req, spec, command=args.command, quiet=args.quiet,
                         verbose=args.verbose)


def refuse_attached_command(ctx) -> None:
    """``bk p NAME -- CMD``: a preset does not carry a command (yet)."""
    if "--" in ctx.argv:
        raise UsageError("a preset cannot run a command (bk p NAME -- CMD)",
                         hint="book with a command: bk run N DUR -- CMD")


def book_and_show(app, call, ctx, req, spec=None, *, command: str, quiet: bool = False,
                  verbose: bool = False) -> Output:
    """Book ``req`` and show the result as ``bk N DUR`` does, with its
    "save it as a preset" hint.  ``spec``: the StartSpec of a ``-t`` word."""
    result = app.run("book", req, call=call)
    suggestion = None
    if not (ctx.json or quiet or result.dry_run) and result.status in ("created", "queued"):
        # Learned defaults: the third booking of one shape suggests a preset.
        from bk.service import PresetHintRequest

        suggestion = app.run("preset_hint", PresetHintRequest(result.reservation, result.same_shape),
                             call=call).suggestion
    return book_output(result, call, req=req, spec=spec, command=command, quiet=quiet, verbose=verbose,
                       suggestion=suggestion)


def book_output(result, call, *, req, spec=None, command: str = "book", quiet: bool = False,
                verbose: bool = False, suggestion: dict | None = None) -> Output:
    """What a booking shows, from its typed result: the same lines as
    ``bk N DUR`` (``cmd_book.run``), the JSON from ``result.to_json()``."""
    r = result.reservation
    now, tz, capacity = call.now, call.tz, call.policy.max_shared_users

    def human(term) -> str:
        if quiet:
            return r.short_id
        why = "same --op-id" if req.op_id else "the same booking, made moments ago"
        verb = f"already booked ({why})" if result.status == "exists" else "booked"
        if result.dry_run:
            verb = "would book"
        # A dry run's ID names nothing that exists, so it is not shown.
        head = f"{verb} " + common.summary_line(r, capacity=capacity, tz=tz, now=now,
                                                show_id=not result.dry_run)
        if spec is not None and spec.rolled_to_tomorrow:
            head += " (tomorrow)"
        lines = [wrap(head, term.width, "", "  ")]
        if r.start < now and result.status != "exists":
            # The span starts before the clock does: say why, or "10:40" at
            # 10:41 reads as a booking in the past.
            slot = call.policy.slot_minutes
            lines.append(wrap(f"starts now: from {timegrid.format_local_short(r.start, tz, now)}, the "
                              f"current {slot}-minute slice", term.width, "", "  "))
        if result.status == "queued":
            asked = "now" if req.start is None else timegrid.format_local_short(req.start, tz, now)
            lines.append(wrap(f"queued: starts at {timegrid.format_local_short(r.start, tz, now)}, the "
                              f"earliest start that fits (asked for {asked})", term.width, "", "  "))
        lines += [wrap(line, term.width, "", "  ") for line in common.fair_lines(r, tz=tz, now=now)]
        if verbose and result.placement:
            for g, why in result.placement.get("gpus", {}).items():
                lines.append(wrap(f"GPU {g}: {why}", term.width, "  ", "      "))
        if suggestion:
            lines.append(wrap(f"hint: {suggestion['hint']}", term.width, "", "  "))
        return "\n".join(lines)

    done = None if result.dry_run else f"booked {r.short_id}"
    return Output(command, result.to_json(), human, done=done)
