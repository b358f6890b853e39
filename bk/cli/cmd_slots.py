"""``bk slots N DUR [MEM]`` and ``bk g [N]`` (``gpu``): read-only advice.

Both ask the service for options and book nothing; the typed results and
their JSON (each option with the command that books it) are
the ``recommend`` and ``gpu`` rows'.  ``bk g`` also shows the live state of the GPUs it
recommends now (the snapshot placement ranked them by: idle before busy,
GPUs used without a booking last), and says what the telemetry misses.
"""

from __future__ import annotations

from bk.cli import common
from bk.cli.render import Output, fit, safe, wrap
from bk.core import timegrid
from bk.core.errors import Conflict
from bk.core.models import EXCLUSIVE, SHARED
from bk.service import builders

DEFAULT_ALTERNATIVES = 3


def register(sub) -> None:
    import argparse  # the parser only: bk.cli.fast runs the everyday words without it

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
        "for them; without a running booking (or with N), recommend GPUs free now, idle ones "
        "first and GPUs someone uses without a booking last, with their live state "
        "(utilisation, free VRAM, processes).",
        epilog="Examples:\n  bk g          your GPUs now, or one free GPU for an hour\n"
               "  bk g 4        four GPUs free now, together\n  bk g 2 -d 3h -m 20g",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("count", nargs="?", metavar="N", help="number of GPUs to look for (default 1)")
    g.add_argument("-d", "--duration", metavar="DUR", default=common.DEFAULT_DURATION,
                   help=f"for how long (default {common.DEFAULT_DURATION})")
    common.add_placement_flags(g)
    g.add_argument("--mode", choices=(SHARED, EXCLUSIVE), default=SHARED, help="default: shared")
    g.set_defaults(handler=run_gpu, command="gpu")


def _option_lines(rec, term, tz, now: int, *, local: bool = False) -> list[str]:
    lines = []
    for i, p in enumerate(rec.options, 1):
        when = timegrid.format_span(p.start, p.end, tz, now)
        if p.start <= now:
            when += " (now)"
        lines.append(fit(f"{i}. {when}  GPU {common.gpus_text(p.gpus)}", term.width))
        lines.append("   " + rec.command(p, tz if local else None))
    return lines


def run_slots(args, ctx) -> Output:
    call = ctx.call()
    req, _ = common.book_request(call, args, mode=args.mode, count=common.parse_count(args.count),
                                 words=args.words, write=False)
    rec = ctx.app().run("recommend", builders.recommend_request(req, args.limit), call=call)
    if not rec.options:
        raise Conflict(f"no option for {rec.describe()}", hint="ask for fewer GPUs or a shorter time")
    data = rec.to_json()

    def human(term) -> str:
        return "\n".join([fit(f"options for {rec.describe()}:", term.width),
                          *_option_lines(rec, term, call.tz, call.now)])

    return Output("slots", data, human)


def run_gpu(args, ctx) -> Output:
    call = ctx.call()
    now, tz = call.now, call.tz
    count = common.parse_count(args.count) if args.count is not None else 1
    req, _ = common.book_request(call, args, mode=args.mode, count=count, words=[], write=False)
    found = ctx.app().run("gpu", builders.gpu_request(req, count_given=args.count is not None), call=call)
    if found.request is None:            # your running bookings' GPUs
        def human_current(term) -> str:
            lines = [wrap(f"yours now: {common.summary_line(r, capacity=call.policy.max_shared_users, tz=tz, now=now)}"
                          f", {timegrid.format_duration(r.end - now)} left", term.width, "", "  ")
                     for r in found.current]
            return "\n".join([*lines, *([found.export] if found.export else [])])
        return Output("gpu", found.to_json(), human_current)
    rec = found.options
    if not found.free_now:
        def human_later(term) -> str:
            first = rec.options[0]
            head = (f"nothing free now for {rec.describe()}; the earliest is "
                    f"{timegrid.format_local_short(first.start, tz, now)}:")
            return "\n".join([wrap(head, term.width, "", "  "), *_option_lines(rec, term, tz, now, local=True)])
        return Output("gpu", found.to_json(), human_later)
    live, missing = found.live, found.missing

    def human(term) -> str:
        head = f"free now for {rec.describe()}:"
        lines = [fit(head, term.width)]
        options = _option_lines(rec, term, tz, now)
        for i, p in enumerate(rec.options):
            lines.extend(options[2 * i:2 * i + 2])
            lines.extend(fit("   " + live_line(live[g]), term.width) for g in p.gpus if g in live)
        if missing:
            lines.append(wrap(safe(missing), term.width, "", "  "))
        return "\n".join(lines)

    return Output("gpu", found.to_json(), human)


def live_line(g) -> str:
    """``GPU 2: idle, util 0%, 79.6G VRAM free, no processes``."""
    parts = [f"GPU {g.index}: {g.state}"]
    parts.append("util ?" if g.util is None else f"util {g.util}%")
    if g.mem_free_mib is not None:
        parts.append(f"{g.mem_free_mib / 1024:.1f}G VRAM free")
    if g.processes is not None:
        parts.append("no processes" if not g.processes else timegrid.counted(g.processes, "process", "processes"))
    return ", ".join(parts)
