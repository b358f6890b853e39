"""``bk l`` (``ls``, ``list``): bookings, numbered as every command accepts them."""

from __future__ import annotations

from bk.cli import common
from bk.cli.render import Output
from bk.core.errors import InvalidInput

DEFAULT_LIMIT = 20


def register(sub) -> None:
    import argparse  # the parser only: bk.cli.fast runs the everyday words without it

    p = sub.add_parser(
        "list", aliases=["l", "ls"], help="list your current and upcoming bookings",
        description="List your current and upcoming bookings, numbered. The numbers are the "
        "same in every command: bk d 1 cancels number 1, bk e 2 -d 2h edits number 2.",
        epilog="Examples:\n  bk l\n  bk l --all             everyone's current and upcoming bookings\n"
               "  bk l --all -n 0        all of them, however many\n"
               "  bk l --history -n 5    your last five ended or cancelled bookings",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--all", action="store_true", help="everyone's bookings")
    scope.add_argument("--history", action="store_true", help="your ended and cancelled bookings, newest first")
    p.add_argument("-n", "--limit", type=_limit, default=DEFAULT_LIMIT, metavar="N",
                   help=f"show at most N (default {DEFAULT_LIMIT}; 0: all); a cut list says how many "
                        "there are, and the JSON's total counts them all")
    p.set_defaults(handler=run, command="list")


def run(args, ctx) -> Output:
    from bk.service import ListRequest

    call = ctx.call()
    scope = "all" if args.all else "history" if args.history else "mine"
    listed = ctx.app().run("list", ListRequest(scope, args.limit or None), call=call)
    items, total, view = listed.reservations, listed.total, listed.view

    def human(term) -> str:
        if not items:
            return {"mine": "no current or upcoming bookings (book one: bk 1 30m)",
                    "all": "nobody has a current or upcoming booking",
                    "history": "no ended or cancelled bookings in the history"}[scope]
        table = common.reservations_table(items, view, term, tz=call.tz, show_user=scope == "all")
        if len(items) < total:   # a cut list says so: the rest exists
            table += f"\nshowing {len(items)} of {total} (bk l{_flag(scope)} -n 0 for all)"
        return table + common.fair_table_lines(items, view) + common.job_lines(items, view, call.actor.uid)

    return Output("list", listed.to_json(), human)


def _limit(text: str) -> int:
    """argparse ``type`` of -n: a whole number, 0 meaning no limit."""
    try:
        n = int(text)
    except ValueError:
        raise InvalidInput(f"expected a whole number, got {text!r}") from None
    if n < 0:
        raise InvalidInput(f"expected 0 (all) or a positive number, got {n}")
    return n


def _flag(scope: str) -> str:
    return {"mine": "", "all": " --all", "history": " --history"}[scope]
