"""``bk j`` (``jobs``): your scheduled commands; ``bk w`` (``worker``): the
per-user worker that starts them."""

from __future__ import annotations

import argparse

from bk.cli import common
from bk.cli.render import Output, safe, table, wrap
from bk.core import timegrid
from bk.core.errors import UsageError

JOBS_EPILOG = """Examples:
  bk j                       your jobs: state, why one waits, how it ended
  bk j log 1                 the output of the job of booking 1 (the last 64 KiB)
  bk j log a1b2 --all        all of it (two rotated segments at most)
  bk j retry a1b2 --accept-duplicate-risk    run an uncertain job again

Job states: pending (waiting for its start, or for its GPUs to clear: the
reason says), running, succeeded, failed, cancelled, missed (the booking ended
before it could start), timed-out (stopped at the booking's end), uncertain
(its worker died while it ran: it may have finished, or be running still).
"""

WORKER_EPILOG = """Examples:
  bk w                       is your worker running?
  bk w start                 run the worker in this terminal (Ctrl-C stops it and its jobs)
  bk w once                  start the jobs due now, wait for them, exit

As a user service (install/bk-worker.service), kept after you log out:
  systemctl --user enable --now bk-worker
  loginctl enable-linger $USER

One worker per user and state directory. It starts your jobs as you, without a
shell, in their own process group, with the booked GPUs in CUDA_VISIBLE_DEVICES.
bk w start also delivers your notifications (bk notify), in a thread of its own.
"""


def register(sub) -> None:
    j = sub.add_parser("jobs", aliases=["j"], help="your scheduled commands (bk run N DUR -- CMD)",
                       description="List your jobs (commands attached to bookings) in the order of bk l "
                       "(current and upcoming ones by list number, then ended ones newest first), show "
                       "one's output, or retry one.", epilog=JOBS_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    j.add_argument("action", nargs="?", choices=("list", "log", "retry"), default="list",
                   help="list (default), log ID, retry ID")
    j.add_argument("ref", nargs="?", metavar="ID", help="the job: its booking's list number or ID prefix, "
                   "or the job's own ID prefix")
    j.add_argument("-a", "--all", action="store_true", help="log: the whole log, not the last 64 KiB")
    j.add_argument("--accept-duplicate-risk", action="store_true",
                   help="retry: run an uncertain job again although it may have run already")
    j.add_argument("-n", "--limit", type=common.positive_int, metavar="N", help="list: at most N jobs")
    j.set_defaults(handler=run_jobs, command="jobs")
    w = sub.add_parser("worker", aliases=["w"], help="the per-user worker that starts your jobs",
                       description="Show whether your worker runs (default), run it in the foreground "
                       "(start), or run the jobs due now and exit (once).", epilog=WORKER_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    w.add_argument("action", nargs="?", choices=("status", "start", "once"), default="status",
                   help="status (default, read-only), start, once")
    w.set_defaults(handler=run_worker, command="worker")


# ------------------------------------------------------------------ bk j

def run_jobs(args, ctx) -> Output:
    from bk.service import JobLogRequest, JobRetryRequest, WorkerHintRequest

    app, call = ctx.app(), ctx.call()
    if args.action == "list":
        if args.ref:
            raise UsageError("bk j lists all your jobs; for one: bk j log ID")
        return _list(app, call, args.limit, env=None if ctx.json else ctx.env)
    if not args.ref:
        raise UsageError(f"bk j {args.action} needs the job's ID", hint=f"e.g. bk j {args.action} 1 (see bk j)")
    if args.action == "log":
        got = app.run("job_log", JobLogRequest(args.ref, all=args.all), call=call)
        res, data, cut = got.reservation, got.log, got.truncated
        text = data.decode("utf-8", "replace")

        def human(term) -> str:
            if not data:
                why = _never_started(got, call)
                return wrap(why, term.width, "", "  ") if why else f"(no output from the job of {res.short_id})"
            head = "(older output left out: bk j log ID --all)\n" if cut else ""
            # Output is the user's own program's: shown as written, but never
            # able to drive the terminal with escape sequences.
            return head + "\n".join(safe(line) for line in text.splitlines())
        return Output("jobs", got.to_json(), human)
    result = app.run("job_retry", JobRetryRequest(args.ref, args.accept_duplicate_risk), call=call)
    r = result.reservation
    out = Output("jobs", result.to_json(), f"job of {r.short_id} requeued: pending; your worker starts it "
                 "when its GPUs are clear", done=f"requeued the job of {r.short_id}")
    hint = app.run("worker_hint", WorkerHintRequest(ctx.env, again=True), call=call).line
    if hint:
        out.warnings.append(hint)
    return out


def _never_started(got, call) -> str | None:
    """Why a job has no output because it never ran, or None when it ran
    (its state, or an exit status recorded, says so)."""
    from bk.service import NO_WORKER

    res = got.reservation
    job = res.job
    x = job.extra
    ran = x.get("started") or x.get("exit_code") is not None
    if job.status not in ("pending", "missed", "failed", "cancelled") or (ran and job.status != "pending"):
        return None
    reason = safe(x.get("reason") or "")
    if job.status != "pending":
        reason = reason.removeprefix("not started: ")
        return f"the job of {res.short_id} never started ({job.status}): {reason or 'no reason was recorded'}"
    if reason:
        return f"the job of {res.short_id} has not started yet: {reason}"
    if res.start > call.now:
        when = timegrid.format_local_short(res.start, call.tz, call.now)
        return f"the job of {res.short_id} has not started yet: its booking starts {when}"
    if got.worker["state"] != "running":
        return f"the job of {res.short_id} has not started yet: {NO_WORKER}"
    return f"the job of {res.short_id} has not started yet: your worker starts it at its next tick"


def _list(app, call, limit, *, env: dict | None = None) -> Output:
    from bk.service import JobsRequest, WorkerHintRequest

    got = app.run("jobs", JobsRequest(limit), call=call)
    rows, numbers, worker = got.jobs, got.numbers, got.worker
    nag = None
    if env is not None and worker["state"] != "running" and any(r.job.status == "pending" for r in rows):
        nag = app.run("worker_hint", WorkerHintRequest(env), call=call).line

    def human(term) -> str:
        if not rows:
            return "no jobs (attach a command to a booking: bk run 1 1h -- CMD)"
        body = []
        for r in rows:
            reason = r.job.extra.get("reason") or ""
            code = r.job.extra.get("exit_code")
            state = r.job.status + (f" ({code})" if code is not None and r.job.status != "running" else "")
            body.append([str(numbers.get(r.id) or ""), r.short_id, (r.job.extra.get("id") or "")[:8],
                         safe(r.job.summary or ""), common.gpus_text(r.gpus),
                         timegrid.format_span(r.start, r.end, call.tz, call.now), state, safe(reason)])
        text = table(body, ["#", "BOOKING", "JOB", "COMMAND", "GPUS", "WHEN", "STATE", "REASON"], term,
                     shrink=[7, 3], fold=True)
        if nag:
            text += "\n" + nag
        return text
    return Output("jobs", got.to_json(), human)


# ------------------------------------------------------------------ bk w

def run_worker(args, ctx) -> Output:
    from bk.service import Empty, WorkerHintRequest, WorkerRunRequest

    app, call = ctx.app(), ctx.call()
    if args.action == "status":
        got = app.run("worker_status", Empty(), call=call)
        st, counts = got.worker, got.jobs
        nag = None
        if st["state"] != "running" and not ctx.json:
            nag = app.run("worker_hint", WorkerHintRequest(ctx.env), call=call).line

        def human(term) -> str:
            if st["state"] == "running":
                since = timegrid.format_local_short(_epoch(st["since"]), call.tz, call.now) if st["since"] else "?"
                head = f"worker running: pid {st['pid']}, since {since}"
            else:
                head = "no worker is running for you"
            text = f"{head}; jobs: {counts['pending']} pending, {counts['running']} running"
            if nag:
                text += "\n" + nag
            return text
        return Output("worker", got.to_json(), human)

    # The worker logs as every daemon does (bk.daemon): on stderr, with its
    # priority when the journal reads it.
    done = app.run("worker", WorkerRunRequest(ctx.env, once=args.action == "once"), call=call)
    started = done.started
    return Output("worker", done.to_json(),
                  f"worker {'stopped' if args.action == 'start' else 'done'}: started {started} job(s)"
                  if args.action == "once" else "worker stopped")


def _epoch(text: str) -> int:
    from bk.core.models import parse_iso

    return parse_iso(text)
