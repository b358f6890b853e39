"""``bk st`` (``status``): the GPUs, your bookings, notices."""

from __future__ import annotations

from bk.cli import common
from bk.cli.render import Output, safe, table, wrap
from bk.core import timegrid
from bk.core.timegrid import format_duration, format_local_short


def register(sub) -> None:
    import argparse  # the parser only: bk.cli.fast runs the everyday words without it

    p = sub.add_parser(
        "status", aliases=["st"], help="GPUs, your bookings and notices",
        description="Show every GPU (model, utilisation, VRAM used and free, processes, live state: "
        "idle, busy, unreserved-use when someone runs there without a booking, or unknown; share "
        "slots in use, when it is next fully free), your bookings with how much of each running one "
        "was used so far (when the monitor records usage), and notices. A line says what the GPU "
        "telemetry cannot see (e.g. nvidia-smi lists no processes).",
        epilog="Examples:\n  bk st\n  bk st -v     also processes (owner, label, memory, attribution) "
               "and everyone's bookings\n  bk st --json | jq '.data.gpus[].processes'",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true",
                   help="add processes (owner, label, memory, attribution, how long unreserved ones "
                   "have run) and others' bookings")
    p.set_defaults(handler=run, command="status")


def run(args, ctx) -> Output:
    return status_output(ctx, verbose=args.verbose)


def status_output(ctx, *, verbose: bool) -> Output:
    from bk.service import StatusRequest

    call = ctx.call()
    st = ctx.app().run("status", StatusRequest(verbose), call=call)
    now, tz = call.now, call.tz

    def human(term) -> str:
        parts = [gpu_table(st.gpus, term, tz=tz, now=now)]
        if st.describe:
            parts[0] += "\n" + wrap(safe(st.describe), term.width, "", "  ")
        if verbose:
            procs = process_lines(st.gpus, term, now=now)
            if procs:
                parts.append("processes:\n" + procs)
        title = "bookings (everyone's):" if verbose else "your bookings:"
        if st.reservations:
            block = title + "\n" + common.reservations_table(st.reservations, st.view, term, tz=tz,
                                                             show_user=verbose)
            used = usage_lines(st, term)
            block += common.job_lines(st.reservations, st.view, call.actor.uid)
            parts.append(block + ("\n" + used if used else ""))
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
        avail = ("?" if g.mem_total_mib is None or g.mem_used_mib is None
                 else f"{_mem(max(0, g.mem_total_mib - g.mem_used_mib))}G")
        procs = "?" if g.processes is None else str(len(g.processes))
        if g.next_free is None:
            free = "never"
        else:
            free = "now" if g.next_free <= now else format_local_short(g.next_free, tz, now)
        state = term.style(g.state, "bold") if g.state == "unreserved-use" else g.state
        body.append([str(g.index), safe(g.name or "?"), util, vram, avail, procs, state,
                     timegrid.share_text(g.share_used, g.capacity), free])
    return table(body, ["GPU", "MODEL", "UTIL", "VRAM", "AVAIL", "PROCS", "STATE", "SHARE", "NEXT FREE"],
                 term, shrink=1)


_LOOSE = ("unreserved", "wrong-gpu")


def process_lines(gpus, term, *, now: int) -> str:
    """One line per process: owner (and how sure bk is of it), label,
    memory, SM, container, attribution; for one running without a booking,
    how long it has run."""
    lines = []
    for g in gpus:
        if g.processes is None:
            continue
        for p in g.processes:
            who = safe(p.user) if p.user else (f"uid {p.uid}" if p.uid is not None else "unknown user")
            if p.identity == "inferred":
                who += " (inferred)"
            elif p.identity == "ambiguous":
                who = "one of several bookers (ambiguous)"
            extra = []
            if p.mem_mib is not None:
                extra.append(f"{_mem(p.mem_mib)}G")
            if p.sm is not None:
                extra.append(f"SM {p.sm}%")
            if p.container:
                extra.append(f"in {safe(p.container)}")
            if p.state in _LOOSE and p.since is not None and p.since <= now:
                extra.append(f"running {format_duration(now - p.since)}")
            tail = (", " + ", ".join(extra)) if extra else ""
            state = term.style(p.state, "bold") if p.state in _LOOSE else p.state
            lines.append(wrap(f"GPU {g.index}: pid {p.pid} {who} {safe(p.label or '?')}{tail} [{state}]",
                              term.width, "  ", "    "))
    return "\n".join(lines)


def usage_lines(st, term) -> str:
    """``#1: booked 2h10m so far, GPUs idle 94% of it`` for each running
    booking the usage history knows."""
    numbers = {r.id: st.view.numbers.get(r.id) for r in st.reservations}
    gpus = {r.id: len(r.gpus) for r in st.reservations}
    lines = []
    for u in st.usage:
        if u.reservation not in numbers:
            continue
        n = numbers[u.reservation]
        tag = f"#{n}" if n is not None else u.reservation[:8]
        gpu_time = " of GPU time" if gpus[u.reservation] > 1 else ""
        lines.append(wrap(f"{tag}: booked {format_duration(u.booked_s)}{gpu_time} so far, GPUs idle "
                          f"{round(u.idle_fraction * 100)}% of it", term.width, "  ", "    "))
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
