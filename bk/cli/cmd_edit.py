"""``bk e ID|N`` (``edit``): change a booking with flags, or guided without.

Before a booking starts everything may change; once it runs only its end
may move (the service enforces both).  ``-d`` carries both meanings a user
reaches for: a plain duration (``2h``) is the new total length, and the
end forms (``+30m``, ``-15m``, ``20:00``, ``total 2h``) move the end.
"""

from __future__ import annotations

import argparse
import importlib.util

from bk.cli import common
from bk.cli.render import Output, wrap
from bk.core import timegrid
from bk.core.errors import InvalidInput, UsageError
from bk.core.models import EXCLUSIVE, SHARED
from bk.service.requests import EditRequest

CHANGE_FLAGS = ("duration", "at", "start", "gpu", "exclude", "mem", "share", "mode", "note")
FLAGS_HINT = ("give what to change: -d 2h (new length), -d +30m / -15m / 20:00 (new end), "
              "-t TIME, -g LIST, -e LIST, -m MEM, -s N, --mode shared|exclusive, --note TEXT")

EPILOG = """Examples:
  bk e 1 -d 2h             booking number 1 now lasts two hours in total
  bk e 1 -d +30m           extend by 30 minutes (also while it runs)
  bk e 1 -d -15m           end 15 minutes earlier
  bk e 1 -d 20:00          end at 20:00
  bk e a1b2 -t 21:00       move an upcoming booking to 21:00 (exact)
  bk e a1b2 -t 21:00 --queue   ... or the earliest fit after 21:00
  bk e 2 -g 2,3 -m 20g     other GPUs and memory (before it starts)
  bk e 1                   guided, one question at a time (at a terminal)
"""


def register(sub) -> None:
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
    p.add_argument("-q", "--quiet", action="store_true", help="print only the booking ID")
    common.add_write_flags(p)
    p.set_defaults(handler=run, command="edit")


def run(args, ctx) -> Output:
    if not any(getattr(args, f) is not None for f in CHANGE_FLAGS):
        return _guided(args, ctx)
    app = ctx.app()
    old = app.resolve(args.ref)
    now, slot, tz = app.now(), app.policy.slot_minutes, common.local_tz()
    duration = end = None
    if args.duration is not None:
        duration, end = _length_or_end(args.duration, old, now, tz, slot)
    start, spec = common.resolve_start(args, now, slot)
    if spec is not None and spec.is_now:
        start = spec.t      # "-t now" moves an upcoming booking to the current slice
    mem, clear_mem = None, False
    if args.mem is not None:
        if args.mem.strip().lower() in ("auto", "none", "default"):
            clear_mem = True
        else:
            mem = timegrid.parse_memory(args.mem)
    req = EditRequest(
        ref=old.id, duration=duration, start=start, end=end, mode=args.mode, share=args.share,
        mem_mib=mem, clear_mem=clear_mem, pinned=common.parse_gpu_list(args.gpu, "-g"),
        excluded=common.parse_gpu_list(args.exclude, "-e"), queue=args.queue, note=args.note,
        op_id=args.op_id, dry_run=args.dry_run)
    result = app.edit(req)
    new = result.reservation
    mem_of = common.gpu_mem(app)
    data = {"status": result.status, "reservation": common.res_json(app, new, now=now, mem=mem_of),
            "before": common.res_json(app, old, now=now, mem=mem_of),
            "placement": result.placement, "dry_run": result.dry_run}
    capacity = app.policy.max_shared_users

    def human(term) -> str:
        if args.quiet:
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
        return "\n".join(out)

    return Output("edit", data, human, warnings=list(result.warnings))


def _length_or_end(text: str, old, now: int, tz, slot: int) -> tuple[int | None, int | None]:
    """``-d`` -> (new total length, or None; new end, or None)."""
    word = " ".join(text.split()).lower()
    relative = word.startswith(("+", "-", "total"))
    if not relative:
        try:
            return timegrid.parse_duration(word, slot), None
        except InvalidInput:
            pass            # not a length: maybe a clock time for the new end
    new_end = timegrid.parse_end_change(text, old.start, old.end, now, tz, slot)
    if relative and old.status(now) == "upcoming":
        # Relative forms keep their meaning when -t also moves the start:
        # "+30m" is 30 minutes longer, wherever the booking goes.
        return new_end - old.start, None
    return None, new_end


def _guided(args, ctx) -> Output:
    """No change flags: the guided edit at a terminal, else say which flags exist."""
    if ctx.interactive and importlib.util.find_spec("bk.cli.guided") is not None:
        from bk.cli import guided

        flow = getattr(guided, "edit_flow", None)
        if flow is not None:
            return flow(args, ctx)
    raise UsageError(f"nothing to change in booking {args.ref}", hint=FLAGS_HINT)
