"""``bk st`` (``status``): the GPUs, your bookings, notices."""

from __future__ import annotations

import argparse

from bk.cli import common
from bk.cli.render import Output, safe, table, wrap
from bk.core.timegrid import format_local_short
from bk.service.status import status_view


def register(sub) -> None:
    p = sub.add_parser(
        "status", aliases=["st"], help="GPUs, your bookings and notices",
        description="Show every GPU (model, utilisation, VRAM, processes, live state, share "
        "slots in use, when it is next fully free), your bookings and notices.",
        epilog="Examples:\n  bk st\n  bk st -v     also processes and everyone's bookings",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true", help="add processes and others' bookings")
    p.set_defaults(handler=run, command="status")


def run(args, ctx) -> Output:
    return status_output(ctx, verbose=args.verbose)


def status_output(ctx, *, verbose: bool) -> Output:
    app, call = ctx.app(), ctx.call()
    st = status_view(app, verbose, call=call)
    now, tz = call.now, call.tz

    def human(term) -> str:
        parts = [gpu_table(st.gpus, term, tz=tz, now=now)]
        if verbose:
            procs = process_lines(st.gpus, term)
            if procs:
                parts.append("processes:\n" + procs)
        title = "bookings (everyone's):" if verbose else "your bookings:"
        if st.reservations:
            parts.append(title + "\n" + common.reservations_table(st.reservations, st.view, term, tz=tz,
                                                                  show_user=verbose))
        else:
            parts.append("no current or upcoming bookings" if verbose else
                         "you have no current or upcoming bookings (book one: bk 1 30m)")
        if st.notices:
            parts.append("notices:\n" + notice_lines(st.notices, term, tz=tz, now=now))
        return "\n\n".join(parts)

    return Output("status", st.to_json(), human)


def _mem(mib: int | None) -> str:
    return "?" if mib is None else f"{mib / 1024:.1f}"


def gpu_table(gpus, term, *, tz, now: int) -> str:
    body = []
    for g in gpus:
        util = "?" if g.util is None else f"{g.util}%"
        if g.mem_total_mib is None and g.mem_used_mib is None:
            vram = "?"
        else:
            vram = f"{_mem(g.mem_used_mib)}/{_mem(g.mem_total_mib)}G"
        procs = "?" if g.processes is None else str(len(g.processes))
        if g.next_free is None:
            free = "never"
        else:
            free = "now" if g.next_free <= now else format_local_short(g.next_free, tz, now)
        body.append([str(g.index), safe(g.name or "?"), util, vram, procs, g.state,
                     f"{g.share_used}/{g.capacity}", free])
    return table(body, ["GPU", "MODEL", "UTIL", "VRAM", "PROCS", "STATE", "SHARE", "NEXT FREE"],
                 term, shrink=1)


def process_lines(gpus, term) -> str:
    lines = []
    for g in gpus:
        for p in g.processes or ():
            who = safe(p.user) if p.user else (f"uid {p.uid}" if p.uid is not None else "unknown user")
            mem = f", {_mem(p.mem_mib)}G" if p.mem_mib is not None else ""
            lines.append(wrap(f"GPU {g.index}: pid {p.pid} {who} {safe(p.label or '?')}{mem} "
                              f"[{safe(p.state)}]", term.width, "  ", "    "))
    return "\n".join(lines)


def notice_lines(notices, term, *, tz, now: int, ids: bool = False) -> str:
    """One line per notice (typed ``Notice`` records); with ``ids`` also its
    short ID and whether it was archived (what an administrator needs to
    withdraw one)."""
    lines = []
    for n in notices:
        when = format_local_short(n.at, tz, now)
        level = "" if n.level == "info" else f"{safe(n.level.upper())}: "
        tag = ""
        if ids:
            tag = f"[{n.id[:8]}{', archived' if n.archived else ''}] "
        lines.append(wrap(f"{when}  {tag}{level}{safe(n.text)}", term.width, "  ", "    "))
    return "\n".join(lines)
