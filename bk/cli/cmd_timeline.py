"""``bk tl [WINDOW]`` (``timeline``): GPUs by time, as text.

One character per GPU and time step.  Your bookings are letters (``a``,
``b``, ... in the legend; upper case where the GPU is full), others' show
how many share slots they hold (``1``, ``2``; ``█`` when full or exclusive),
``&`` two or more of yours in one cell (so none is hidden behind another's
letter), ``#`` is a blackout, ``x`` a disabled GPU, ``·`` free.  A ``▼``
line marks now.  Where the terminal cannot show those (``LC_ALL=C``), ``@``,
``.`` and ``v`` stand in, and the legend says so (``█`` would otherwise fall
back to ``#``, the blackout's glyph).
"""

from __future__ import annotations

import argparse
from string import ascii_lowercase

from bk.cli import common
from bk.cli.render import Output, fit, wrap
from bk.core import timegrid
from bk.core.errors import InvalidInput, UsageError
from bk.core.models import parse_iso
from bk.core.timegrid import time_labels
from bk.core.utctime import datetime

# Label spacing candidates, in minutes: the first that is a multiple of the
# step and leaves room for a 5-character label is used.

# (full or exclusive, free, now, legend separator): Unicode, then ASCII.
GLYPHS = ("█", "·", "▼", " · ")
ASCII_GLYPHS = ("@", ".", "v", "; ")

EPILOG = """Examples:
  bk tl                    fits the terminal, starting just before now
  bk tl 24h                the next 24 hours
  bk tl --from -2h --window 6h --step 10m
  bk tl -g 0,1 --from 'tomorrow 08:00'
"""


def register(sub) -> None:
    p = sub.add_parser(
        "timeline", aliases=["tl"], help="text timeline of every GPU",
        description="Draw bookings on every GPU over time. Your bookings are letters (upper "
        "case where the GPU is full), others' show the share slots they hold (█ when full or "
        "exclusive), & is two or more of yours in one cell, # is a blackout, · free.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("window_word", nargs="?", metavar="WINDOW", help="how much time to show (12h, 2d)")
    p.add_argument("--from", dest="frm", metavar="TIME",
                   help="first time shown: now, -2h, +1h, 20:00, tomorrow 09:00, ISO (default: just before now)")
    p.add_argument("--window", metavar="DUR", help="how much time to show (default: what fits the terminal)")
    p.add_argument("--step", default="auto", metavar="DUR|auto",
                   help="time per column (default auto: the finest that fits)")
    p.add_argument("-g", "--gpu", metavar="LIST", help="only these GPUs, e.g. 0,1 or 0-3")
    p.set_defaults(handler=run, command="timeline")


def _from_time(text: str, now: int, tz, slot: int) -> int:
    """``--from``: any start form, but the past is allowed (``-2h``, ISO,
    and clock times read from the start of today: ``09:00`` is this
    morning's, not tomorrow's)."""
    word = " ".join(text.split()).lower()
    if word == "now":
        return now
    if word[:1] in "+-":
        d = timegrid.parse_duration(word[1:], slot)
        return now + d if word[0] == "+" else now - d
    if "t" in word and word[:4].isdigit():
        try:
            return parse_iso(text)
        except ValueError:
            pass
    midnight = int(datetime.fromtimestamp(now, tz).replace(hour=0, minute=0, second=0).timestamp())
    try:
        return timegrid.parse_start(text, midnight, tz, slot).t
    except InvalidInput as e:
        if "past" not in e.message:
            raise
        raise InvalidInput(f"--from {text!r} is before today; earlier days take a relative or "
                           "ISO form", hint="e.g. --from -1d or --from 2026-07-12T09:00Z") from None


def run(args, ctx) -> Output:
    from bk.service import TimelineRequest

    call = ctx.call()
    now, slot, tz = call.now, call.policy.slot_minutes, call.tz
    if args.window_word and args.window:
        raise UsageError("give the window once (WINDOW or --window)", hint="e.g. bk tl 12h")
    wtext = args.window or args.window_word
    window = timegrid.parse_duration(wtext, slot) if wtext else None
    step = None if args.step == "auto" else timegrid.parse_duration(args.step, slot)
    frm = _from_time(args.frm, now, tz, slot) if args.frm else None
    gpus = common.parse_gpu_list(args.gpu, "-g")
    tv = ctx.app().run("timeline", TimelineRequest(ctx.term.width, frm, window, step, gpus, fit=not ctx.json),
                       call=call)

    def human(term) -> str:
        return render(tv, term, tz=tz, now=now, label_w=tv.label_w)

    return Output("timeline", tv.to_json(), human)


def _labels(frm: int, n: int, step: int, tz) -> str:
    return time_labels(frm, n, step, tz).rstrip()


def render(tv, term, *, tz, now: int, label_w: int) -> str:
    grid = tv.grid
    frm, to, step = grid.frm, grid.to, grid.step
    n = (to - frm) // step
    cap = grid.capacity
    mine = [r for r in tv.reservations if r.uid == tv.view.actor_uid]
    letter = {r.short_id: (ascii_lowercase[i] if i < 26 else "*") for i, r in enumerate(mine)}
    full, free, mark, sep = GLYPHS if term.unicode else ASCII_GLYPHS
    pad = " " * (label_w + 1)
    out = [fit(f"{timegrid.format_span(frm, to, tz, now)}, one column = {timegrid.format_duration(step)}",
               term.width),
           pad + _labels(frm, n, step, tz)]
    if frm <= now < to:
        col = (now - frm) // step
        out.append(fit(pad + " " * col + f"{mark} now", term.width))
    several = False
    for lane in grid.lanes:
        cells = []
        for c in lane.cells:
            style: tuple[str, ...] = ()
            if lane.disabled:
                ch = "x"
            elif c.blackout:
                ch, style = "#", ("yellow",)
            elif len(c.mine) > 1:
                # Two of yours in one cell: a letter would hide the other.
                ch, style = "&", ("green", "bold")
                several = True
            elif c.mine:
                ch = letter.get(c.mine[0], "*")
                ch, style = (ch.upper() if c.full_mine else ch), ("green", "bold")
            elif c.used == 0:
                ch, style = free, ("dim",)
            elif c.used >= cap:
                ch, style = full, ("red",)
            else:
                ch, style = (str(c.used) if c.used < 10 else "+"), ("cyan",)
            cells.append(term.style(ch, *style))
        out.append(f"GPU {lane.index}".ljust(label_w) + " " + "".join(cells))
    out.append("")
    for r in mine:
        span = timegrid.format_span(r.start, r.end, tz, now)
        out.append(fit(f"{letter[r.short_id]}  yours: {r.short_id} {span} "
                       f"GPU {common.gpus_text(r.gpus)} {r.mode}", term.width))
    digits = "1" if cap <= 2 else f"1-{min(cap - 1, 9)}"
    out.append(wrap(sep.join([f"{digits}: share slots held by others (of {cap})", f"{full} full or exclusive",
                              "# blackout", "x disabled", f"{free} free",
                              *(["upper case: your booking on a full GPU"] if mine else []),
                              *(["&: two or more of yours"] if several else [])]),
                    term.width))
    return "\n".join(out)
