"""``bk tutorial``: a read-only walkthrough, written for this server's rules.

The numbers in it (slice length, share slots, horizon, GPU count) come from
the active policy, so what the tutorial promises is what ``bk`` will do
here.  It books nothing.
"""

from __future__ import annotations

import argparse

from bk.cli.render import Output, wrap
from bk.core.timegrid import counted


def register(sub) -> None:
    p = sub.add_parser(
        "tutorial", help="a walkthrough of bk on this server (read-only)",
        description="Walk through booking, listing, editing and cancelling GPUs, with this "
        "server's rules and real commands. Nothing is booked.",
        epilog="Examples:\n  bk tutorial\n  bk tutorial | less\n  bk tutorial --tui       the guided tour of bk t",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tui", action="store_true",
                   help="the guided tour of the full-screen timeline (bk t); as text without a terminal")
    p.set_defaults(handler=run, command="tutorial")


def steps(pol: dict) -> list[dict]:
    slot, cap, n = pol["slot_minutes"], pol["max_shared_users"], pol["gpu_count"]
    many = min(2, n)
    mem_note = (" This server requires the memory per GPU for shared bookings, so always add "
                "it (12g below)." if pol["require_shared_memory"] else
                " The memory per GPU is optional; without it a booking counts as its share of "
                "the GPU's memory.")
    mem = " 12g" if pol["require_shared_memory"] else ""
    return [
        {"title": "Look around",
         "text": f"This server has {counted(n, 'GPU')}. The status shows each GPU's "
                 "load, who holds it now and when it is next fully free; the timeline shows the "
                 "hours ahead.",
         "commands": ["bk st", "bk tl"]},
        {"title": "Book a GPU",
         "text": f"Time comes in {slot}-minute slices: bookings start and last whole slices. "
                 f"A shared booking takes one of the {counted(cap, 'share slot')} of each GPU it uses; "
                 "an exclusive one (x) takes the whole GPU. A bare booking starts now; if "
                 "nothing is free it is queued to the earliest start that fits, and bk says so."
                 + mem_note,
         "commands": [f"bk 1 30m{mem}", f"bk {many} 1h30m 12g", "bk x 1 2h"]},
        {"title": "Book later",
         "text": "-t takes a time: an exact start, or an error if it is taken (add --queue for "
                 "the earliest start after it). bk slots shows options without booking and "
                 f"prints the command for each. Bookings must end within "
                 f"{counted(pol['booking_horizon_days'], 'day')} and last at most "
                 f"{counted(pol['max_booking_hours'], 'hour')}.",
         "commands": [f"bk 1 2h{mem} -t 20:00", f"bk slots {many} 1h", f"bk 1 1h{mem} -t 'tomorrow 09:00' --queue"]},
        {"title": "Use your GPUs",
         "text": "bk g shows the GPUs of your running booking and the line that points CUDA at "
                 "them; without one it suggests free GPUs.",
         "commands": ["bk g", "bk g 4" if n >= 4 else f"bk g {n}"]},
        {"title": "List, change, cancel",
         "text": "bk l numbers your bookings; every command takes the number or an ID prefix. "
                 "Before a booking starts anything may change; once it runs only its end may "
                 "move.",
         "commands": ["bk l", "bk e 1 -d +30m", "bk e 1 -d 20:00", "bk d 1"]},
        {"title": "Keep track",
         "text": "Notices from the administrator, one booking's history, your own log, and "
                 "whom to ask.",
         "commands": ["bk n", "bk history 1", "bk lg", "bk info"]},
        {"title": "For scripts",
         "text": "--json prints one envelope on stdout; --dry-run shows a write without making "
                 "it; --op-id KEY makes a retry safe.",
         "commands": ["bk --json l", "bk 1 30m --dry-run", "bk 1 30m --op-id nightly-42"]},
    ]


def run(args, ctx) -> Output:
    if getattr(args, "tui", False):
        from bk.cli.cmd_tui import tour

        return tour(ctx, args)
    from bk.service import Empty

    pol = ctx.app().run("info", Empty(), call=ctx.call())["policy"]
    data = {"policy": pol, "steps": steps(pol)}

    def human(term) -> str:
        out = []
        for i, s in enumerate(data["steps"], 1):
            out.append(term.style(f"{i}. {s['title']}", "bold"))
            out.append(wrap(s["text"], term.width, "   "))
            out.extend(f"     $ {c}" for c in s["commands"])
            out.append("")
        out.append(wrap("More: bk help COMMAND, or bk -h. Nothing was booked by this tutorial.",
                        term.width))
        return "\n".join(out)

    return Output("tutorial", data, human)
