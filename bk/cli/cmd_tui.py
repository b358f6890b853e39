"""``bk t`` (``tui``): the full-screen timeline, or the text one where it cannot run.

The screen itself is ``bk.tui``; this module decides whether it can start
(a terminal on both ends, a ``TERM`` curses knows, at least 60x16) and,
when it cannot, says why on stderr and prints ``bk tl`` instead, exit 0:
a script or a dumb terminal that asks for the timeline still gets one.
``--json`` never starts the screen: it is the text timeline's envelope
with ``tui.started`` false.
"""

from __future__ import annotations

import argparse
import signal

from bk.cli.render import Output

EPILOG = """Examples:
  bk t                     the timeline of every GPU; press ? for the keys, q to quit
  bk t --theme light       for a light terminal background (T switches)
  bk t --ascii             plain ASCII lines and blocks
  BK_DATA_DIR=/tmp/gpubk-demo BK_GPU_COUNT=4 bk t

Keys: a add, e edit, d cancel, Left/Right time, +/- zoom, Tab table, t tour, q quit.
"""


def register(sub) -> None:
    p = sub.add_parser(
        "t", aliases=["tui"], help="full-screen timeline: see, add, edit and cancel bookings",
        description="Show every GPU over time in the terminal and book, edit and cancel with the "
        "keyboard. Without a terminal (a pipe, TERM=dumb) or below 60x16 it says why and prints "
        "the text timeline (bk tl) instead. Respects NO_COLOR; the theme follows COLORFGBG.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--theme", choices=("auto", "dark", "light"), default="auto",
                   help="colours for a dark or light background (default auto: COLORFGBG, else dark)")
    p.add_argument("--ascii", action="store_true",
                   help="draw with plain ASCII even under a UTF-8 locale")
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                   help="seconds between refreshes of the bookings (default 1, at least 0.2)")
    p.add_argument("--tour", action="store_true", help="start with the guided tour")
    p.set_defaults(handler=run, command="tui")


def run(args, ctx) -> Output:
    from bk.tui.driver import why_not

    reason = "--json asks for one envelope, not a screen" if ctx.json else why_not(ctx.env)
    if reason is not None:
        return fallback(ctx, reason)
    from bk.tui.driver import run as run_screen

    done = run_screen(ctx.app(), ctx.env, theme_name=args.theme, ascii_only=args.ascii,
                      interval=max(0.2, args.interval), tour=True if args.tour else None)
    words = [f"{what} {', '.join(i[:8] for i in ids)}" for what, ids in
             (("booked", done["booked"]), ("changed", done["changed"]), ("cancelled", done["cancelled"])) if ids]
    sig = done.get("signal")
    data = {"tui": {"started": True, "reason": None, "signal": sig},
            **{k: list(done[k]) for k in ("booked", "changed", "cancelled")}}
    # Ended by SIGTERM or SIGHUP: the shell's convention, 128 + the signal.
    code = 128 + int(signal.Signals[sig]) if sig else 0
    return Output("tui", data, "bk t: " + "; ".join(words) if words else None, exit_code=code)


def fallback(ctx, reason: str) -> Output:
    from bk.cli import cmd_timeline

    out = cmd_timeline.run(argparse.Namespace(window_word=None, frm=None, window=None, step="auto", gpu=None),
                           ctx)
    out.command = "tui"
    out.data = {**out.data, "tui": {"started": False, "reason": reason}}
    if not ctx.json:
        out.warnings.append(f"bk t cannot open the full screen: {reason}; here is the text timeline "
                            "(bk tl)")
    return out


def tour(ctx, args) -> Output:
    """``bk tutorial --tui``: the screen opened on its guided tour; where no
    screen can start, the tour's pages as text."""
    from bk.tui.text import TOUR

    pages = [{"title": t, "text": words} for t, words in TOUR]
    from bk.tui.driver import why_not

    reason = "--json asks for one envelope, not a screen" if ctx.json else why_not(ctx.env)
    if reason is None:
        from bk.tui.driver import run as run_screen

        run_screen(ctx.app(), ctx.env, tour=True)
        return Output("tutorial", {"tui": {"started": True, "reason": None}, "tour": pages})

    def human(term) -> str:
        from bk.cli.render import wrap

        out = []
        for i, p in enumerate(pages, 1):
            out.append(term.style(f"{i}. {p['title']}", "bold"))
            out.append(wrap(p["text"], term.width, "   "))
            out.append("")
        return "\n".join(out)

    out = Output("tutorial", {"tui": {"started": False, "reason": reason}, "tour": pages}, human)
    if not ctx.json:
        out.warnings.append(f"the tour of bk t needs its full screen: {reason}; here are its pages")
    return out
