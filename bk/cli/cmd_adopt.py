"""``bk adopt PID | --gpu N [--until T]``: book the GPUs a running job holds, now."""

from __future__ import annotations

import argparse

from bk.cli import common
from bk.cli.render import Output
from bk.core.errors import UsageError

EPILOG = """Examples:
  bk adopt 4242                 book what process 4242 (and its children) holds, now
  bk adopt 4242 --until 18:00   until 18:00 at the latest
  bk adopt --gpu 1              your processes on GPU 1
  sudo bk adopt 4242            the administrator: for the process's owner (audited)

The booking takes exactly the GPUs where the driver lists the process or one
of its children: exclusive when it holds more than one share's part of a
GPU's memory, else shared with the memory it holds. It ends within seconds
after the process (all of them, with --gpu) exits, freeing the rest of the
window; your worker (bk w) ends it, as it ends a booking made for a command.
The process is known by its PID and start time, so a PID the kernel hands to
another process later is never taken for it. Without --until the window is as
long as the policy allows (at most 24 hours), cut to the start of a later
booking of those GPUs; with --until a collision is refused with the longest
window that fits.
"""


def register(sub) -> None:
    p = sub.add_parser(
        "adopt", help="book the GPUs a running process holds, now (bk adopt PID)",
        description="Put a job that runs without a booking under one: book, from now, exactly the "
        "GPUs the process tree holds; the booking ends when the process exits.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pid", nargs="?", type=common.positive_int, metavar="PID",
                   help="the process (its children count too)")
    p.add_argument("-g", "--gpu", type=int, metavar="N", help="instead of a PID: your processes on GPU N")
    p.add_argument("--until", metavar="TIME",
                   help="end at the latest then: 18:00, +4h, tomorrow 09:00 (default: as long as allowed, "
                   "at most 24h)")
    p.add_argument("--idle-release", metavar="DUR", help=common.IDLE_RELEASE_HELP)
    p.add_argument("--note", metavar="TEXT", help="a note others see in the lists")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the booking ID")
    common.add_write_flags(p)
    p.set_defaults(handler=run, command="adopt")


def run(args, ctx) -> Output:
    if (args.pid is None) == (args.gpu is None):
        raise UsageError("name a process or a GPU", hint="bk adopt PID, or bk adopt --gpu N")
    from bk.service import AdoptRequest, Empty, builders

    app, call = ctx.app(), ctx.call()
    until = common.time_ahead(args.until, "--until", call.now, call.tz) if args.until else None
    planned = app.run("adopt", AdoptRequest(pid=args.pid, gpu=args.gpu, until=until,
                                            note=builders.note_text(args.note),
                                            idle_release_minutes=builders.idle_release(args.idle_release) or None,
                                            op_id=builders.op_id_text(args.op_id), dry_run=args.dry_run),
                      call=call)
    req = planned.request
    if planned.cut:
        call.warn(planned.cut)
    from bk.cli.cmd_book import book_output

    result = app.run("book", req, call=call)
    out = book_output(result, call, req=req, command="adopt", quiet=args.quiet)
    if args.quiet or result.dry_run:
        return out
    base = out.human
    pids = ", ".join(p.split(":")[0] for p in (req.adopt or "").split(","))
    running = app.run("worker_status", Empty(), call=call).worker["state"] == "running"

    def human(term) -> str:
        line = f"it ends when process {pids} exits" + ("" if running else
                                                        ": your worker ends it, and none runs (bk w start)")
        return base(term) + "\n" + line
    out.human = human
    return out
