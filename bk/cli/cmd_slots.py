"""``bk slots N DUR [MEM]`` and ``bk g [N]`` (``gpu``): read-only advice.

Both ask the scheduler for options and book nothing.  Each option carries
the exact command that books it, so advice turns into a booking by
copy-paste (or, for a program, by running ``command`` from the JSON).  A
start in the current slice is written without ``--start`` (a bare booking
starts now); a later one with ``--start ISO``, which is exact: if someone
takes it first, the booking fails with exit 3 instead of landing elsewhere.
"""

from __future__ import annotations

import argparse
import shlex

from bk.cli import common
from bk.cli.render import Output, fit, wrap
from bk.core import timegrid
from bk.core.errors import Conflict
from bk.core.models import EXCLUSIVE, SHARED, iso, parse_iso

DEFAULT_ALTERNATIVES = 3


def register(sub) -> None:
    p = sub.add_parser(
        "slots", help="when and where N GPUs are free (read-only)",
        description="Find the earliest options for a booking without making one. Each option "
        "comes with the command that books it.",
        epilog="Examples:\n  bk slots 2 1h\n  bk slots 4 2h 20g -n 5 -t 'tomorrow 09:00'\n"
               "  bk slots 1 30m --mode exclusive",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("count", metavar="N", help="number of GPUs")
    p.add_argument("words", nargs="*", metavar="DUR [MEM]", help="duration and optional VRAM per GPU")
    p.add_argument("-d", "--duration", metavar="DUR", help="the duration, instead of the DUR word")
    common.add_placement_flags(p)
    common.add_start_flags(p)
    p.add_argument("--mode", choices=(SHARED, EXCLUSIVE), default=SHARED, help="default: shared")
    p.add_argument("-n", "--limit", type=common.positive_int, default=DEFAULT_ALTERNATIVES, metavar="N",
                   help=f"how many options (default {DEFAULT_ALTERNATIVES})")
    p.set_defaults(handler=run_slots, command="slots")

    g = sub.add_parser(
        "gpu", aliases=["g"], help="which GPU can I use now?",
        description="Show the GPUs of your running booking and the CUDA_VISIBLE_DEVICES line "
        "for them; without a running booking (or with N), recommend GPUs free now.",
        epilog="Examples:\n  bk g          your GPUs now, or one free GPU for an hour\n"
               "  bk g 4        four GPUs free now, together\n  bk g 2 -d 3h -m 20g",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("count", nargs="?", metavar="N", help="number of GPUs to look for (default 1)")
    g.add_argument("-d", "--duration", metavar="DUR", default=common.DEFAULT_DURATION,
                   help=f"for how long (default {common.DEFAULT_DURATION})")
    common.add_placement_flags(g)
    g.add_argument("--mode", choices=(SHARED, EXCLUSIVE), default=SHARED, help="default: shared")
    g.set_defaults(handler=run_gpu, command="gpu")


def booking_command(req, p, now: int, slot_minutes: int) -> str:
    """The exact ``bk`` command that books option ``p`` of request ``req``."""
    words = ["bk"] + (["x"] if req.mode == EXCLUSIVE else [])
    words += [str(req.count), timegrid.format_duration(req.duration)]
    if req.mem_mib:
        words.append(timegrid.format_memory(req.mem_mib))
    if req.mode != EXCLUSIVE and req.share > 1:
        words += ["-s", str(req.share)]
    words += ["-g", ",".join(map(str, p.gpus))]
    if p.start > timegrid.floor_slice(now, slot_minutes):
        words += ["--start", iso(p.start)]
    return shlex.join(words)


def option_json(req, p, now: int, slot_minutes: int) -> dict:
    return {"gpus": list(p.gpus), "start": iso(p.start), "end": iso(p.end),
            "command": booking_command(req, p, now, slot_minutes), "queued": p.queued,
            "mem_mib_effective": p.mem_mib_effective,
            "reasons": {str(g): why for g, why in sorted(p.reasons.items())}}


def _what(req) -> str:
    n = req.count
    mem = f", {timegrid.format_memory(req.mem_mib)} per GPU" if req.mem_mib else ""
    return f"{n} GPU{'s' if n != 1 else ''}, {req.mode}{mem}, {timegrid.format_duration(req.duration)}"


def _option_lines(options: list[dict], term, tz, now: int) -> list[str]:
    lines = []
    for i, o in enumerate(options, 1):
        a, b = parse_iso(o["start"]), parse_iso(o["end"])
        when = timegrid.format_span(a, b, tz, now)
        if a <= now:
            when += " (now)"
        lines.append(fit(f"{i}. {when}  GPU {common.gpus_text(o['gpus'])}", term.width))
        lines.append("   " + o["command"])
    return lines


def run_slots(args, ctx) -> Output:
    app = ctx.app()
    req, _ = common.book_request(app, args, mode=args.mode, count=common.parse_count(args.count),
                                 words=args.words, write=False)
    now, slot = app.now(), app.policy.slot_minutes
    found = app.recommend(req, alternatives=args.limit)
    if not found:
        raise Conflict(f"no option for {_what(req)}", hint="ask for fewer GPUs or a shorter time")
    options = [option_json(req, p, now, slot) for p in found]
    tz = common.local_tz()

    def human(term) -> str:
        return "\n".join([fit(f"options for {_what(req)}:", term.width),
                          *_option_lines(options, term, tz, now)])

    return Output("slots", {"request": _request_json(req), "options": options}, human)


def _request_json(req) -> dict:
    return {"count": req.count, "duration": req.duration, "mode": req.mode, "share": req.share,
            "mem_mib": req.mem_mib, "start": iso(req.start) if req.start is not None else None,
            "pinned": list(req.pinned) if req.pinned is not None else None,
            "excluded": list(req.excluded)}


def run_gpu(args, ctx) -> Output:
    app = ctx.app()
    now, slot, tz = app.now(), app.policy.slot_minutes, common.local_tz()
    state = app.ledger()      # one read serves both the current bookings and the recommendation
    mine = app.own_current(state, now=now)
    numbers = {r.id: i for i, r in enumerate(mine, 1)}
    active = [r for r in mine if r.status(now) == "active"]
    mem = common.gpu_mem(app)
    current = [common.res_json(app, r, now=now, numbers=numbers, mem=mem) for r in active]
    if args.count is None and active:
        gpus = sorted({g for r in active for g in r.gpus})
        # nvidia-smi numbers GPUs in PCI bus order, CUDA by default fastest
        # first; PCI_BUS_ID makes CUDA's numbering match the one we book by.
        export = f"export CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={','.join(map(str, gpus))}"
        data = {"current": current, "options": [], "export": export}

        def human_current(term) -> str:
            lines = [wrap(f"yours now: {common.summary_line(r, capacity=app.policy.max_shared_users, tz=tz, now=now)}"
                          f", {timegrid.format_duration(r.end - now)} left", term.width, "", "  ")
                     for r in active]
            return "\n".join([*lines, export])
        return Output("gpu", data, human_current)

    count = common.parse_count(args.count) if args.count is not None else 1
    req, _ = common.book_request(app, args, mode=args.mode, count=count, words=[], write=False)
    found = app.recommend(req, alternatives=DEFAULT_ALTERNATIVES, state=state)
    ready = [p for p in found if not p.queued]
    if not ready:
        if found:
            first = found[0]
            raise Conflict(f"no {_what(req)} free now",
                           hint=f"the earliest is {timegrid.format_local_short(first.start, tz, now)}: "
                                f"{booking_command(req, first, now, slot)}")
        raise Conflict(f"no {_what(req)} free now", hint="see: bk slots")
    options = [option_json(req, p, now, slot) for p in ready]
    data = {"current": current, "options": options, "export": None}

    def human(term) -> str:
        head = f"free now for {_what(req)}:"
        return "\n".join([fit(head, term.width), *_option_lines(options, term, tz, now)])

    return Output("gpu", data, human)
