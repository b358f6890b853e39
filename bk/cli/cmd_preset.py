"""``bk p`` (``preset``): private presets, a booking saved under a name.

``bk p save NAME N DUR [MEM] [flags]`` saves, ``bk p NAME`` books it (short
for ``bk p use NAME``), ``bk p`` lists, ``show`` and ``delete`` do what they
say.  Presets live in the user's own state directory, through
the ``presets`` rows; booking one sends the preset's typed request (from
``bk.service.builders``, as ``bk N DUR`` builds its own) to the ordinary
``book`` row and shows the result as ``bk N DUR`` does, so it obeys and reports
exactly like a typed booking.
"""

from __future__ import annotations

import argparse

from bk.cli import common
from bk.cli.render import Output, safe, table
from bk.core import timegrid
from bk.core.models import EXCLUSIVE, SHARED
from bk.service import builders

ACTIONS = ("save", "list", "ls", "show", "delete", "del", "rm", "use")

EPILOG = """Examples:
  bk p save train 2 1h30m 12g     save a preset named train
  bk p save big 4 8h -x -g 0-3    exclusive, pinned to GPUs 0-3
  bk p train                      book it now (short for: bk p use train)
  bk p train -t 20:00 --dry-run   show where it would go at 20:00
  bk p                            list your presets
  bk p delete train

Presets are private: they are kept in your state directory
($XDG_STATE_HOME/bk, default ~/.local/state/bk; $BK_DATA_DIR/state for a
trial run with BK_DATA_DIR), not in the shared ledger."""


def register(sub) -> None:
    p = sub.add_parser("preset", aliases=["p"], help="private presets: save a booking, book it by name",
                       description="Save bookings you make often under a name and book them with "
                       "bk p NAME. Without an action, list your presets.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(handler=run_list, command="preset")
    actions = p.add_subparsers(dest="preset_action", metavar="ACTION", parser_class=type(p))

    save = actions.add_parser("save", help="save a preset: NAME N DUR [MEM] [flags]",
                              description="Save a booking under NAME (replacing a preset of that name).",
                              epilog="Examples:\n  bk p save train 2 1h 12g\n  bk p save solo 1 4h -x",
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    save.add_argument("name", metavar="NAME", help="the preset's name: a letter, then letters, digits, . _ -")
    save.add_argument("count", metavar="N", help="number of GPUs")
    save.add_argument("words", nargs="*", metavar="DUR [MEM]",
                      help="duration (30m, 2h, 1h30m, 1d) and optional VRAM per GPU (12g)")
    save.add_argument("-x", "--exclusive", action="store_true", help="whole GPUs (default: shared)")
    save.add_argument("-d", "--duration", metavar="DUR", help="the duration, instead of the DUR word")
    common.add_placement_flags(save)
    save.add_argument("--note", metavar="TEXT", help="a note the bookings will carry")
    save.add_argument("--dry-run", action="store_true", help="say what would be saved; change nothing")
    save.set_defaults(handler=run_save)

    ls = actions.add_parser("list", aliases=["ls"], help="list your presets",
                            description="List your presets (the same as bk p alone).")
    ls.set_defaults(handler=run_list)

    show = actions.add_parser("show", help="show one preset and the booking it makes",
                              description="Show one preset and the command it stands for.")
    show.add_argument("name", metavar="NAME", help="the preset")
    show.set_defaults(handler=run_show)

    delete = actions.add_parser("delete", aliases=["del", "rm"], help="delete a preset",
                                description="Delete a preset. A missing preset exits 4.")
    delete.add_argument("name", metavar="NAME", help="the preset")
    delete.add_argument("--dry-run", action="store_true", help="say what would be deleted; change nothing")
    delete.set_defaults(handler=run_delete)

    use = actions.add_parser("use", help="book a preset (bk p NAME is short for this)",
                             description="Book what the preset says, now or at -t TIME.",
                             epilog="Examples:\n  bk p use train\n  bk p train -t tomorrow 09:00 --queue",
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    use.add_argument("name", metavar="NAME", help="the preset")
    common.add_start_flags(use)
    use.add_argument("--queue", action="store_true",
                     help="with -t/--start: take the earliest start at or after it")
    use.add_argument("-y", "--yes", action="store_true", help="never ask (booking does not ask)")
    use.add_argument("-q", "--quiet", action="store_true", help="print only the booking ID")
    use.add_argument("-v", "--verbose", action="store_true", help="show why each GPU was or was not chosen")
    common.add_write_flags(use)
    use.set_defaults(handler=run_use)
    _accept_bare_names(p)


def _accept_bare_names(p) -> None:
    """``bk p NAME ...`` means ``bk p use NAME ...``.

    argparse has no "any other word" sub-command, and the rewrite cannot
    happen before parsing (only this parser knows its actions), so it
    happens where argparse hands this parser its words: the sub-parsers
    action calls ``parse_known_args`` of the chosen parser."""
    parse = p.parse_known_args

    def parse_known_args(args=None, namespace=None):
        if args and not args[0].startswith("-") and args[0] not in ACTIONS:
            args = ["use", *args]
        return parse(args, namespace)
    p.parse_known_args = parse_known_args


# ------------------------------------------------------------------ handlers

def run_list(args, ctx) -> Output:
    from bk.service import Empty

    got = ctx.app().run("presets", Empty(), call=ctx.call())
    presets = got.presets

    def human(term) -> str:
        if not presets:
            return "no presets yet; save one with: bk p save NAME N DUR [MEM], e.g. bk p save train 2 1h"
        rows = [[safe(x.name), safe(" ".join(x.words())), safe(x.note or "")] for x in presets]
        headers = ["NAME", "BOOKS", "NOTE"]
        if not any(x.note for x in presets):
            headers.pop()
            rows = [r[:-1] for r in rows]
        return table(rows, headers, term, shrink=[len(headers) - 1]) + "\nbook one with: bk p NAME"
    return Output("preset", got.to_json(), human)


def run_show(args, ctx) -> Output:
    from bk.service import PresetRequest

    got = ctx.app().run("preset", PresetRequest(args.name), call=ctx.call())
    x = got.preset
    mem = timegrid.format_memory(x.mem_mib) if x.mem_mib else "not given"
    name = safe(x.name)
    lines = [f"preset {name}: {timegrid.counted(x.count, 'GPU')}, {x.mode}, "
             f"{timegrid.format_duration(x.duration)}, memory per GPU {mem}"]
    if x.share != 1:
        lines.append(f"  share slots: {x.share}")
    if x.pinned:
        lines.append(f"  GPUs: {common.gpus_text(x.pinned)}")
    if x.excluded:
        lines.append(f"  never GPUs: {common.gpus_text(x.excluded)}")
    if x.note:
        lines.append(f"  note: {safe(x.note)}")
    lines.append(f"  the same as: {safe(x.book_command())}")
    lines.append(f"  book it: bk p {name}")
    return Output("preset", got.to_json(), "\n".join(lines))


def run_save(args, ctx) -> Output:
    from bk.service import Preset, PresetSaveRequest

    app, call = ctx.app(), ctx.call()
    Preset.check_name(args.name)
    dur_text, mem_text = common.split_words(args.words, args.duration, args.mem)
    preset = Preset(
        name=args.name, count=builders.count(args.count),
        duration=builders.duration(dur_text, call.policy.slot_minutes),
        mode=EXCLUSIVE if args.exclusive else SHARED, share=args.share or 1,
        mem_mib=builders.memory(mem_text), pinned=builders.gpu_list(args.gpu, "-g"),
        excluded=builders.gpu_list(args.exclude, "-e") or (), note=args.note)
    done = app.run("preset_save", PresetSaveRequest(preset, args.dry_run), call=call)
    status, saved = done.status, done.preset
    verb = {"created": "saved", "replaced": "replaced", "unchanged": "unchanged:"}[status]
    if args.dry_run:
        verb = f"would be {status}:"
    name = safe(saved.name)
    text = f"{verb} preset {name} ({safe(saved.book_command())})\nbook it with: bk p {name}"
    said = None if args.dry_run or status == "unchanged" else f"saved preset {name}"
    return Output("preset", done.to_json(), text, done=said)


def run_delete(args, ctx) -> Output:
    from bk.service import PresetDeleteRequest

    done = ctx.app().run("preset_delete", PresetDeleteRequest(args.name, args.dry_run), call=ctx.call())
    gone = done.preset
    verb = "would delete" if args.dry_run else "deleted"
    return Output("preset", done.to_json(),
                  f"{verb} preset {safe(gone.name)} ({safe(gone.book_command())})",
                  done=None if args.dry_run else f"deleted preset {safe(gone.name)}")


def run_use(args, ctx) -> Output:
    from bk.cli.cmd_book import book_and_show, refuse_attached_command
    from bk.service import PresetRequest

    app, call = ctx.app(), ctx.call()
    x = app.run("preset", PresetRequest(args.name), call=call).preset
    refuse_attached_command(ctx)
    req, spec = x.request(call=call, at=args.at, start_iso=args.start, queue=args.queue,
                          op_id=args.op_id, dry_run=args.dry_run)
    out = book_and_show(app, call, ctx, req, spec, command="preset", quiet=args.quiet,
                        verbose=args.verbose)
    out.data = {**out.data, "preset": x.name}
    return out
