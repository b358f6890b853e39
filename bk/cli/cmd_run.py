"""``bk run``: a command on your booked GPUs, now or at the booking's start.

``bk run -- CMD`` runs it now, on this terminal, on one of your active
bookings; ``bk run N DUR [MEM] -- CMD`` (like ``bk N DUR -- CMD``) books
and attaches it, and your worker starts it at the booking's start; ``bk
run`` alone shows your current GPUs and the environment a command gets.
"""

from __future__ import annotations

import argparse
import os
import sys

from bk.cli import common
from bk.cli.render import Output, safe, wrap
from bk.core import timegrid
from bk.core.errors import UsageError
from bk.core.models import EXCLUSIVE, SHARED

EPILOG = """Examples:
  bk run                         your current GPUs and the environment a command gets
  bk run -- python3 train.py     run now on your active booking (the first in bk l)
  bk run -r 2 -- nvidia-smi      run now on booking 2
  bk run 2 4h 20g -- ./train.sh  book two GPUs for 4 hours and run it at the start
  bk run 1 8h -t 22:00 -- ./train.sh   book for tonight; your worker starts it at 22:00
  bk run 1 4h --keep -- ./prep.sh   keep the GPU to the end after prep.sh exits

The command gets CUDA_VISIBLE_DEVICES (GPU UUIDs on real GPUs, indices in a
simulation), CUDA_DEVICE_ORDER=PCI_BUS_ID, BK_RESERVATION_ID and
BK_RESERVED_GPUS. It runs without a shell (write one yourself: -- bash -c '...').
It gets SIGTERM worker_termination_grace_seconds (default 5) before the booking
ends and SIGKILL at the end, to its whole process group. A booking that bk run
N DUR (or bk N DUR -- CMD) made for the command ends within seconds after the
command exits, freeing the rest of its window for others (bk j shows "ended
early: the command finished at 14:02 (exit 0)"); --keep keeps it to its end.

Now (bk run -- CMD): the command keeps this terminal (REPLs and editors work);
Ctrl-C goes to it. bk exits with the command's status, 124 when the booking
ended, 130 after Ctrl-C. With --json, stdout holds only bk's envelope (the
exit status, whether bk stopped it): the command's own stdout goes to stderr. Later (bk run N DUR -- CMD): the command line is kept
in a private file under your state directory, never in the shared ledger; a
worker must run for you (bk w; systemctl --user enable --now bk-worker, and
loginctl enable-linger so it survives logout). See bk j for your jobs and
bk j log ID for their output.
"""


def register(sub) -> None:
    p = sub.add_parser(
        "run", help="run a command on your booked GPUs, now or at a booking's start",
        description="Run a command on your booked GPUs. With -- CMD and no N DUR: now, in the "
        "foreground, on your active booking. With N DUR [MEM] -- CMD: book and schedule it. "
        "Alone: show your current GPUs and the environment a command gets.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("words", nargs="*", metavar="N DUR [MEM]",
                   help="book this many GPUs for this long (else: run on a booking you have)")
    p.add_argument("-r", "--reservation", metavar="ID",
                   help="run on this booking (list number or ID prefix); default: your first active one")
    p.add_argument("-x", "--exclusive", action="store_true", help="book whole GPUs (with N DUR)")
    p.add_argument("-d", "--duration", metavar="DUR", help="the duration, instead of the DUR word")
    common.add_placement_flags(p)
    common.add_start_flags(p)
    p.add_argument("--queue", action="store_true",
                   help="with -t/--start: take the earliest start at or after it")
    p.add_argument("--note", metavar="TEXT", help="a note others see in the lists")
    p.add_argument("--again", action="store_true", help="book even if you just made the same booking")
    p.add_argument("--keep", action="store_true",
                   help="with N DUR: keep the booking to its end after the command exits (default: it "
                   "ends then, freeing the rest of its window)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the booking ID (with N DUR)")
    p.add_argument("-v", "--verbose", action="store_true", help="show why each GPU was chosen")
    p.add_argument("-y", "--yes", action="store_true", help="never ask (accepted for scripts)")
    common.add_write_flags(p)
    p.set_defaults(handler=run, command="run", takes_command=True, attached=None)


def run(args, ctx) -> Output:
    words, cmd = list(args.words), args.attached
    app, call = ctx.app(), ctx.call()
    if words or args.duration:
        if cmd is None:
            raise UsageError("bk run N DUR needs the command after --",
                             hint="e.g. bk run 1 2h -- python3 train.py; to just book: bk 1 2h")
        if args.reservation:
            raise UsageError("-r runs on a booking you have; N DUR books a new one: give one of them")
        req, spec = common.book_request(call, args, mode=EXCLUSIVE if args.exclusive else SHARED,
                                        count=common.parse_count(words[0]) if words else 1,
                                        words=words[1:])
        return book_command(app, call, ctx, req, spec, cmd, command="run", quiet=args.quiet,
                            verbose=args.verbose, keep=args.keep)
    if args.keep:
        raise UsageError("--keep is for a booking bk run makes (N DUR); a booking you already have "
                         "lasts to its end anyway", hint="e.g. bk run 1 2h --keep -- ./prep.sh")
    if cmd is None:
        return show(app, call, args.reservation)
    if not cmd:
        raise UsageError("no command after --", hint="e.g. bk run -- python3 train.py")
    return foreground(app, call, ctx, args.reservation, cmd)


def book_command(app, call, ctx, req, spec, cmd: list[str], *, command: str, quiet: bool = False,
                 verbose: bool = False, keep: bool = False) -> Output:
    """``bk N DUR -- CMD`` and ``bk run N DUR -- CMD``: book with the
    command attached, shown like any booking plus the job's line."""
    from bk.cli.cmd_book import book_output
    from bk.service import BookJobRequest

    result = app.run("book_job", BookJobRequest(req, tuple(cmd), _cwd(), ctx.env, keep=keep), call=call)
    out = book_output(result, call, req=req, spec=spec, command=command, quiet=quiet, verbose=verbose)
    if quiet or result.dry_run:
        return out
    base = out.human
    job = result.reservation.job

    def human(term) -> str:
        text = base(term) if callable(base) else (base or "")
        if job is None:
            return text
        when = "at the booking's start" if result.reservation.start > call.now else "now"
        line = f"job {safe(job.summary or '')}: {job.status}; your worker starts it {when} (bk j to follow)"
        if not keep:
            line += "; the booking ends when it exits"
        return text + "\n" + wrap(line, term.width, "", "  ")
    out.human = human
    return out


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:
        raise UsageError("the current directory no longer exists",
                         hint="cd to an existing directory and run the command again") from None


def _stderr_fd() -> int:
    try:
        os.fstat(2)
    except OSError:               # stderr closed: the output goes nowhere, not into the envelope
        import subprocess

        return subprocess.DEVNULL
    sys.stdout.flush()
    return 2


def show(app, call, ref: str | None) -> Output:
    """``bk run`` alone: the booking a command would run on, and its environment."""
    from bk.service import RunTargetRequest

    target = app.run("run_target", RunTargetRequest(ref), call=call)
    res, active, env, view = target.reservation, target.active, target.env, target.view

    def human(term) -> str:
        capacity = call.policy.max_shared_users
        lines = ["runs on " + common.summary_line(res, capacity=capacity, tz=call.tz, now=call.now)
                 + f", {common.status_text(res, now=call.now)}"]
        lines += [f"  {k}={v}" for k, v in env.items()]
        if len(active) > 1:
            others = ", ".join(f"{view.numbers.get(r.id)} [{r.short_id}]" for r in active if r.id != res.id)
            lines.append(f"other active bookings: {others} (choose with: bk run -r N -- CMD)")
        lines.append("run a command: bk run -- CMD")
        return "\n".join(lines)
    return Output("run", target.to_json(), human)


def foreground(app, call, ctx, ref: str | None, cmd: list[str]) -> Output:
    """``bk run -- CMD``: run now, on this terminal, until it exits or the booking ends."""
    from bk.service import RunNowRequest, RunTargetRequest

    target = app.run("run_target", RunTargetRequest(ref), call=call)
    res, active, numbers = target.reservation, target.active, target.view.numbers
    if len(active) > 1 and ref is None and not ctx.json:
        # Say which one before the command takes the terminal.
        sys.stderr.write(f"bk: running on booking {numbers.get(res.id)} [{res.short_id}], GPUs "
                         f"{common.gpus_text(res.gpus)} (you have {len(active)} active; choose with -r N)\n")
        sys.stderr.flush()
    # With --json stdout is the envelope's alone (docs/JSON.md): the
    # command writes its own standard output to our stderr.
    done = app.run("run_now", RunNowRequest(res.id, tuple(cmd), _cwd(), ctx.env,
                                            stdout=_stderr_fd() if ctx.json else None), call=call)
    outcome = done.outcome
    out = Output("run", done.to_json(), "", exit_code=outcome.exit_code)
    if outcome.stopped == "end":
        out.warnings.append(f"booking {res.short_id} ended at {timegrid.format_local_short(res.end, call.tz, call.now)}; "
                            "the command was stopped (exit 124)")
    return out
