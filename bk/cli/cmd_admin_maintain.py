"""``bk admin maintain``: maintenance windows (blackouts), opened with a
guided dialog or flags, listed, and ended early.

Registered into the ``bk admin`` group by ``bk.cli.cmd_admin``.  Root only
(exit 5) before anything is read; the writes are rows of the operation
table, so on a shared server they travel through the broker.
"""

from __future__ import annotations

import argparse

from bk.cli.common import need_root, when_short
from bk.cli.render import Output, safe, wrap
from bk.core.errors import EXIT_PARTIAL, UsageError
from bk.core.timegrid import counted

RAW = argparse.RawDescriptionHelpFormatter


def _window(args, call) -> tuple[int, int]:
    from bk.core import timegrid

    slot = call.policy.slot_minutes
    start = timegrid.parse_start(args.start or "now", call.now, call.tz, slot).t
    return start, start + timegrid.parse_duration(args.duration or "2h", slot)


# ------------------------------------------------------------- registration


def register_maintain(actions, parser_class) -> None:
    m = actions.add_parser(
        "maintain", help="a maintenance window: announce it and block new bookings in it",
        description="Open a maintenance window: an announcement every user sees (bk n, at login) and, "
        "unless --no-block, a blackout that refuses new bookings in the window. Running processes are "
        "never stopped. Bookings already in the window are listed with their owners; keep them "
        "(--keep) or cancel them (--cancel-overlapping: the owners are told the reason). Without "
        "flags at a terminal it asks, one question at a time. Defaults: now, 2 h, level warning.",
        epilog="Examples:\n  sudo bk admin maintain                                   guided\n"
               "  sudo bk admin maintain --reason 'driver update' -d 3h -t 18:00 --keep --yes\n"
               "  sudo bk admin maintain --reason reboot --cancel-overlapping --yes --json\n"
               "  sudo bk admin maintain list\n  sudo bk admin maintain end 3f2a9c1b",
        formatter_class=RAW)
    m.add_argument("words", nargs="*", metavar="list|end ID", help="list the windows, or end one now")
    m.add_argument("-t", "--at", dest="start", metavar="TIME",
                   help="when it begins: now, 18:00, +1h, tomorrow 09:00 (default now)")
    m.add_argument("--start", dest="start", metavar="TIME", help="the same as -t")
    m.add_argument("-d", "--duration", metavar="DUR", help="how long: 2h, 90m, 1d (default 2h)")
    m.add_argument("--reason", metavar="TEXT", help="why; every user reads it")
    m.add_argument("--level", choices=("info", "warning", "critical"), default=None,
                   help="how loud the announcement is (default warning)")
    m.add_argument("--no-block", action="store_true", help="announce only; new bookings are not refused")
    g = m.add_mutually_exclusive_group()
    g.add_argument("--keep", action="store_true", help="bookings already in the window run on")
    g.add_argument("--cancel-overlapping", action="store_true",
                   help="cancel the bookings already in the window (their owners are told the reason)")
    m.add_argument("--all", action="store_true", help="list: past windows too")
    m.add_argument("-y", "--yes", action="store_true", help="do not ask")
    m.add_argument("--dry-run", action="store_true", help="show the window and what it overlaps; change nothing")
    m.set_defaults(handler=run_maintain, command="admin maintain")


def _res_line(r, call) -> str:
    return f"{r.short_id} {safe(r.user)} GPU {','.join(map(str, r.gpus))} {when_short(r.start, call)}-{when_short(r.end, call)}"


def run_maintain(args, ctx) -> Output:
    need_root("maintain")
    words = list(args.words)
    if words and words[0] in ("list", "ls"):
        return _maintain_list(args, ctx)
    if words and words[0] == "end":
        if len(words) != 2:
            raise UsageError("which window?", hint="bk admin maintain end ID (IDs: bk admin maintain list)")
        return _maintain_end(words[1], args, ctx)
    if words:
        raise UsageError(f"unknown action {words[0]!r}", hint="bk admin maintain [list | end ID]")
    from bk.service import MaintainRequest

    app, call = ctx.app(), ctx.call()
    guided = ctx.interactive and not args.yes and args.reason is None
    if guided:
        args = _maintain_dialog(args, ctx, call)
    if not args.reason or not args.reason.strip():
        raise UsageError("say why with --reason; every user reads it", hint="--reason 'driver update'")
    start, end = _window(args, call)
    level = args.level or "warning"
    base = MaintainRequest(start, end, args.reason.strip(), level=level, block=not args.no_block,
                           overlapping="keep", dry_run=True)
    preview = app.run("blackout_add", base, call=call)
    over = preview.overlapping
    choice = "keep" if args.keep else "cancel" if args.cancel_overlapping else None
    if over and choice is None:
        listing = "\n".join("  " + _res_line(r, call) for r in over)
        if not ctx.interactive:
            raise UsageError(f"{counted(len(over), 'booking')} already in the window:\n{listing}",
                             hint="choose --keep (they run on) or --cancel-overlapping (their owners are told)")
        print(f"Bookings already in the window:\n{listing}")
        choice = "cancel" if ctx.confirm("Cancel them (their owners are told the reason)? "
                                         "No keeps them running") else "keep"
    choice = choice or "keep"
    req = MaintainRequest(start, end, args.reason.strip(), level=level, block=not args.no_block,
                          overlapping=choice, seen=",".join(r.id for r in over) or None, dry_run=args.dry_run)
    what = (f"{'block new bookings and announce' if not args.no_block else 'announce'} maintenance "
            f"{when_short(start, call)} to {when_short(end, call)} ({level}): {safe(args.reason.strip())}")
    if over:
        what += f"; {'cancel' if choice == 'cancel' else 'keep'} {counted(len(over), 'booking')}"
    if not args.yes and not args.dry_run:
        if not ctx.interactive:
            raise UsageError(f"confirm with --yes: {what}", hint="or look first with --dry-run")
        if not ctx.confirm(f"{what}?"):
            return Output("admin maintain", {**preview.to_json(), "status": "declined"}, "nothing changed",
                          exit_code=EXIT_PARTIAL)
    result = app.run("blackout_add", req, call=ctx.fresh_call() if guided else call)

    def human(term) -> str:
        verb = "would" if result.dry_run else "did"
        lines = [wrap(f"{verb}: {what}", term.width, "", "  ")]
        if result.blackout is not None:
            lines.append(f"  window {result.blackout.id[:8]} (end it early: sudo bk admin maintain end "
                         f"{result.blackout.id[:8]})")
        for r in over:
            lines.append(f"  {'cancelled' if r.id in result.cancelled else 'kept'}: {_res_line(r, call)}")
        return "\n".join(lines)

    done = None
    if not result.dry_run:
        # The window's ID is the one `maintain end` takes; the notice is
        # how users hear of it.
        done = (f"added maintenance window {result.blackout.id[:8]} (notice {result.notice.id[:8]})"
                if result.blackout is not None else f"published maintenance notice {result.notice.id[:8]}")
        if result.cancelled:
            done += f", {counted(len(result.cancelled), 'booking')} cancelled"
    return Output("admin maintain", result.to_json(), human, done=done)


def _maintain_dialog(args, ctx, call):
    from bk.cli.guided import Cancelled, Dialog, Question
    from bk.core import timegrid
    from bk.core.errors import InvalidInput

    slot = call.policy.slot_minutes

    def text(v: str) -> str:
        if not v.strip():
            raise InvalidInput("say why; every user reads it")
        return v.strip()

    def start(v: str) -> str:
        timegrid.parse_start(v, call.now, call.tz, slot)
        return v

    def dur(v: str) -> str:
        timegrid.parse_duration(v, slot)
        return v

    def level(v: str) -> str:
        if v not in ("info", "warning", "critical"):
            raise InvalidInput("info, warning or critical")
        return v

    def yes(v: str) -> bool:
        return v.lower() in ("y", "yes")

    qs = [Question("reason", "Why (every user reads it)?", text),
          Question("start", "Starts", start, "now"),
          Question("duration", "Lasts", dur, args.duration or "2h"),
          Question("level", "Level (info, warning, critical)", level, args.level or "warning"),
          Question("block", "Refuse new bookings in the window?", yes, "y", shown="Y/n")]
    try:
        got = Dialog.terminal().run(qs)
    except Cancelled:
        raise UsageError("cancelled, nothing changed") from None
    return argparse.Namespace(**{**vars(args), "reason": got["reason"], "start": got["start"],
                                 "duration": got["duration"], "level": got["level"],
                                 "no_block": not got["block"]})


def _maintain_list(args, ctx) -> Output:
    from bk.service import BlackoutsRequest

    call = ctx.call()
    got = ctx.app().run("blackouts", BlackoutsRequest(args.all), call=call)
    rows = got.windows

    def human(term) -> str:
        if not rows:
            return "no maintenance windows" + ("" if args.all else " now or ahead (--all: past ones too)")
        return "\n".join(f"{b.id[:8]}  {when_short(b.start, call)} to {when_short(b.end, call)}  {safe(b.reason)}"
                         for b in rows)

    return Output("admin maintain list", got.to_json(), human)


def _maintain_end(ref: str, args, ctx) -> Output:
    from bk.service import BlackoutEndRequest

    app, call = ctx.app(), ctx.call()
    result = app.run("blackout_end", BlackoutEndRequest(ref, dry_run=args.dry_run), call=call)
    b = result.blackout
    verb = {"ended": "ended", "dry_run": "would end", "unchanged": "already over:"}[result.status]

    def human(term) -> str:
        return wrap(f"{verb} maintenance window {b.id[:8]} ({when_short(b.start, call)} to {when_short(b.end, call)}): "
                    f"{safe(b.reason)}", term.width, "", "  ")

    done = f"ended window {b.id[:8]}" if result.status == "ended" else None
    return Output("admin maintain end", result.to_json(), human, done=done)
