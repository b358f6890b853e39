"""``bk n`` (``notices``): announcements, and notices addressed to you."""

from __future__ import annotations

from bk.cli.cmd_status import notice_lines
from bk.cli.render import Output


def register(sub) -> None:
    import argparse  # the parser only: bk.cli.fast runs the everyday words without it

    p = sub.add_parser(
        "notices", aliases=["n"], help="announcements and notices for you",
        description="Show the administrator's announcements and the notices addressed to you "
        "(for example, that the administrator cancelled one of your bookings, and why).",
        epilog="Examples:\n  bk n\n  bk n --all      include archived and expired ones, with their IDs",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--all", action="store_true", help="include archived and expired notices")
    p.set_defaults(handler=run, command="notices")


def run(args, ctx) -> Output:
    from bk.service import NoticesRequest

    call = ctx.call()
    got = ctx.app().run("notices", NoticesRequest(all=args.all), call=call)
    notices = got.notices

    def human(term) -> str:
        if not notices:
            return "no notices"
        return notice_lines(notices, term, tz=call.tz, now=call.now, ids=args.all)

    return Output("notices", got.to_json(), human)
