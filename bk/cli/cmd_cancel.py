"""``bk d ID|N`` (``cancel``, ``del``, ``rm``): cancel one of your bookings.

Cancelling a running booking stops it now and frees its GPUs for others;
at a terminal that is confirmed first.  A script (stdin not a terminal),
``--json`` or ``--yes`` never gets a question: the booking is the user's
own, and a prompt nobody can answer would hang the script.
"""

from __future__ import annotations

from bk.cli import common
from bk.cli.render import Output, wrap
from bk.core.errors import EXIT_PARTIAL
from bk.service import CancelRequest, ResolveRequest


def register(sub) -> None:
    import argparse  # the parser only: bk.cli.fast runs the everyday words without it

    p = sub.add_parser(
        "cancel", aliases=["d", "del", "rm"], help="cancel one of your bookings",
        description="Cancel one of your bookings, named by its list number (bk l) or ID prefix. "
        "A running booking stops now and its GPUs become free; at a terminal you are asked "
        "first (-y skips the question).",
        epilog="Examples:\n  bk d 1\n  bk d a1b2c3d4 --dry-run\n  bk d 2 -y --op-id retry-7",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ref", metavar="ID|N", help="list number or ID prefix (4+ characters)")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask, even for a running booking")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    common.add_write_flags(p)
    p.set_defaults(handler=run, command="cancel")


def run(args, ctx) -> Output:
    app, call = ctx.app(), ctx.call()
    # An op-id used before names its booking, whatever "1" means by now.
    found = app.run("resolve", ResolveRequest(args.ref, args.op_id, "cancel"), call=call)
    res = found.reservation
    now, tz = call.now, call.tz
    capacity = call.policy.max_shared_users
    line = common.summary_line(res, capacity=capacity, tz=tz, now=now)
    if (res.status(now) == "active" and ctx.interactive and not args.yes and not args.dry_run
            and not ctx.confirm(f"{line} is running; stop it now and free its GPUs?")):
        data = {"status": "kept", "reservation": found.to_json()["reservation"], "dry_run": False}
        return Output("cancel", data, f"kept {line}", exit_code=EXIT_PARTIAL)
    result = app.run("cancel", CancelRequest(ref=res.id, op_id=args.op_id, dry_run=args.dry_run), call=call)
    data = result.to_json()

    def human(term) -> str:
        if args.quiet:
            return ""
        verb = "would cancel" if result.dry_run else \
            "already cancelled (same --op-id)" if result.status == "exists" else "cancelled"
        return wrap(f"{verb} {line}", term.width, "", "  ")

    return Output("cancel", data, human, done=None if result.dry_run else f"cancelled {res.short_id}")
