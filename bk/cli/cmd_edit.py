"""``bk e ID|N`` (``edit``): change a booking with flags, or guided without.

Before a booking starts everything may change; once it runs only its end
may move (the service enforces both).  ``-d`` carries both meanings a user
reaches for: a plain duration (``2h``) is the new total length, and the
end forms (``+30m``, ``-15m``, ``20:00``, ``total 2h``) move the end.
"""

from __future__ import annotations

from bk.cli import common
from bk.cli.render import Output, wrap
from bk.core.errors import UsageError
from bk.core.models import EXCLUSIVE, SHARED
from bk.service import builders

CHANGE_FLAGS = ("duration", "at", "start", "gpu", "exclude", "mem", "share", "mode", "note", "shared_with",
                "idle_release", "keep_for")
FLAGS_HINT = ("give what to change: -d 2h (new length), -d +30m / -15m / 20:00 (new end), "
              "-t TIME, -g LIST, -e LIST, -m MEM, -s N, --mode shared|exclusive, --note TEXT, "
              "--with LIST, --advance, --no-advance, --idle-release DUR|off, --keep-for DUR|off")

EPILOG = """Examples:
  bk e 1 -d 2h             booking number 1 now lasts two hours in total
  bk e 1 -d +30m           extend by 30 minutes (also while it runs)
  bk e 1 -d -15m           end 15 minutes earlier
  bk e 1 -d 20:00          end at 20:00
  bk e a1b2 -t 21:00       move an upcoming booking to 21:00 (exact)
  bk e a1b2 -t 21:00 --queue   ... or the earliest fit after 21:00
  bk e 2 -g 2,3 -m 20g     other GPUs and memory (before it starts)
  bk e 1 --with alice,@nlp   alice and group nlp may use it too (bk run -r)
  bk e 1 --advance         move earlier on its own when GPUs free up
  bk e 1 --idle-release 45m   end it once seen idle 45 minutes (off: never)
  bk e 1 --keep-for 4h     keep it 4 hours: no idle nudge, no idle release
  bk e 1                   guided, one question at a time (at a terminal)
"""


def register(sub) -> None:
    import argparse  # the parser only: bk.cli.fast runs the everyday words without it

    p = sub.add_parser(
        "edit", aliases=["e"], help="change a booking (flags, or guided without)",
        description="Change one of your bookings, named by its list number (bk l) or ID prefix. "
        "Before it starts anything may change; once it runs only its end may move.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ref", metavar="ID|N", help="list number or ID prefix (4+ characters)")
    p.add_argument("-d", "--duration", metavar="DUR",
                   help="new total length (2h), or a new end: +30m, -15m, 20:00, 'total 2h'")
    common.add_start_flags(p)
    common.add_placement_flags(p)
    p.add_argument("--mode", choices=(SHARED, EXCLUSIVE), help="switch between shared and exclusive")
    p.add_argument("--queue", action="store_true",
                   help="if the new time is taken, move to the earliest start at or after it")
    p.add_argument("--note", metavar="TEXT", help="replace the note ('' clears it)")
    p.add_argument("--idle-release", metavar="DUR|off", help=common.IDLE_RELEASE_HELP + "; off: no opt-in")
    p.add_argument("--keep-for", metavar="DUR|off",
                   help="keep it: no idle nudge and no idle release for DUR (e.g. 4h, at most to its "
                   "end); off: stop keeping")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the booking ID")
    common.add_fair_flags(p, edit=True)
    common.add_write_flags(p)
    p.set_defaults(handler=run, command="edit")


def run(args, ctx) -> Output:
    if not any(getattr(args, f) is not None for f in CHANGE_FLAGS) and not (args.advance or args.no_advance):
        return _guided(args, ctx)
    app, call = ctx.app(), ctx.call()
    # An op-id used before names its booking as that edit found it, so the
    # retry builds the same request (and gets "exists"), whatever "1" means now.
    from bk.service import ResolveRequest

    old = app.run("resolve", ResolveRequest(args.ref, args.op_id, "edit"), call=call).reservation
    req = builders.edit_request(
        old, length=args.duration, at=args.at, start_iso=args.start, gpus=args.gpu, exclude=args.exclude,
        mem=args.mem, share=args.share, mode=args.mode, queue=args.queue, note=args.note,
        op_id=args.op_id, dry_run=args.dry_run, advance=args.advance, no_advance=args.no_advance,
        shared_with=args.shared_with, policy=call.policy, now=call.now, tz=call.tz,
        idle_release_=args.idle_release, keep_for_=args.keep_for)
    result = app.run("edit", req, call=call)
    return edit_output(result, call, quiet=args.quiet)


def edit_output(result, call, *, quiet: bool = False) -> Output:
    """What an edit shows, from its typed result (flags and guided alike)."""
    new, old = result.reservation, result.before
    now, tz, capacity = call.now, call.tz, call.policy.max_shared_users

    def human(term) -> str:
        if quiet:
            return new.short_id
        line = common.summary_line(new, capacity=capacity, tz=tz, now=now)
        if result.status == "unchanged":
            return f"nothing to change: {line}"
        verb = "would update" if result.dry_run else \
            "already updated (same --op-id)" if result.status == "exists" else "updated"
        out = [wrap(f"{verb} {line}", term.width, "", "  ")]
        if result.status != "exists":
            out.append(wrap("was " + common.summary_line(old, capacity=capacity, tz=tz, now=now),
                            term.width, "", "  "))
        out += [wrap(line, term.width, "", "  ") for line in common.fair_lines(new, tz=tz, now=now)]
        return "\n".join(out)

    done = None if result.dry_run or result.status == "unchanged" else f"updated {new.short_id}"
    return Output("edit", result.to_json(), human, done=done)


def _guided(args, ctx) -> Output:
    """No change flags: the guided edit at a terminal, else say which flags exist."""
    if ctx.interactive and _importable("bk.cli.guided"):
        from bk.cli import guided

        flow = getattr(guided, "edit_flow", None)
        if flow is not None:
            return flow(args, ctx)
    raise UsageError(f"nothing to change in booking {args.ref}", hint=FLAGS_HINT)


def _importable(name: str) -> bool:
    import importlib.util  # only at a terminal, with no change flags

    return importlib.util.find_spec(name) is not None
