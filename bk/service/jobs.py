"""Scheduled commands in the service layer (SPEC 9): attaching a command to
a booking, the ``job_state`` operation, the job list and logs, ``bk run --
CMD`` in the foreground, and the worker's host: the operations its loop
(``bk.jobs.worker.serve``) calls.

The shared ledger sees only ``Reservation.job`` (state, safe summary, the
private spec's id and digest); the command line goes to the private spec
store (``bk.jobs.specs``) before the booking is made, and is removed again
if the booking fails.  The worker changes job states with the one
``job_state`` row of ``bk.service.ops``: owner only, so through the broker
a user's worker can change its own jobs and nothing else.

This module is imported by the operation table, so its top level stays
light: the spec store, the launcher and the worker load when used.
"""

from __future__ import annotations

import os

from bk.core.errors import InvalidInput, NotFound, PermissionDenied
from bk.core.models import Job, Reservation, iso
from bk.core.record import dataclass, field, replace
from bk.service.results import _Rendered, _reservation
from bk.service.views import View

# bk.core.jobs names these too; repeated so that loading the table stays cheap.
PENDING, RUNNING = "pending", "running"
TERMINAL = ("succeeded", "failed", "cancelled", "missed", "timed-out", "uncertain")
MAX_REASON = 500

NO_WORKER = ("no bk worker is running for you, so the command will not start on its own: "
             "start one with: systemctl --user enable --now bk-worker "
             "(and: loginctl enable-linger $USER, so it keeps running after you log out), "
             "or run bk w start in a terminal that stays open")
NO_WORKER_AGAIN = "no bk worker is running for you: the command starts once one runs (bk w says how)"
NO_WORKER_NOTE = "worker-hint"          # in the state directory: the session it was last said in


def session_key(env: dict, proc: str = "/proc") -> str:
    """This login session: logind's (``XDG_SESSION_ID``, every terminal of
    one login), else this terminal's: its session ID (the login shell's,
    ``getsid``) and that leader's start time; with the boot, so that an ID
    reused after a logout or a reboot is another session."""
    def read(path: str, pick) -> str:
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                return pick(f.read())
        except (OSError, IndexError):
            return "?"
    boot = read(f"{proc}/sys/kernel/random/boot_id", lambda t: t.strip())
    logind = env.get("XDG_SESSION_ID")
    if logind:
        return f"{boot}:logind:{logind}"
    sid = os.getsid(0)
    return f"{boot}:{sid}:{read(f'{proc}/{sid}/stat', lambda t: t.rsplit(')', 1)[1].split()[19])}"


def no_worker_warning(app, env: dict, *, again: bool = False) -> str | None:
    """The long "no worker" advice the first time a session hears it; after
    that nothing, or with ``again`` (a new job that will not start) one
    short line.  Said after every ``bk j`` and ``bk w``, the same paragraph
    had become noise."""
    from bk.store.presets import said_this_session

    if not said_this_session(app.settings.locations.state_dir, NO_WORKER_NOTE, session_key(env)):
        return NO_WORKER
    return NO_WORKER_AGAIN if again else None


@dataclass(frozen=True)
class JobResult(_Rendered):
    status: str                        # updated | unchanged
    reservation: Reservation
    json: dict | None = field(default=None, compare=False)

    def rendered(self, view: View) -> JobResult:
        return replace(self, json={"status": self.status, "reservation": view.reservation(self.reservation),
                                   "job": job_json(self.reservation)})

    def to_wire(self) -> dict:
        return {**self.to_json(), "record": self.reservation.to_dict()}

    @classmethod
    def from_wire(cls, data: dict) -> JobResult:
        return cls(str(data.get("status", "updated")), _reservation(data),
                   {k: v for k, v in data.items() if k != "record"})


def job_json(r: Reservation) -> dict | None:
    """One job as ``bk j`` shows it: what the ledger knows, never the command."""
    if r.job is None:
        return None
    x = r.job.extra
    return {"id": x.get("id"), "short_id": (x.get("id") or "")[:8], "status": r.job.status,
            "summary": r.job.summary, "reason": x.get("reason"), "exit_code": x.get("exit_code"),
            "updated": x.get("updated"), "reservation": r.id, "reservation_short_id": r.short_id,
            "gpus": list(r.gpus), "start": iso(r.start), "end": iso(r.end)}


def _not_retryable(short: str, state: str) -> str:
    """Why a job in ``state`` cannot be retried: a retry is for a job that
    stopped without finishing its work, which a succeeded one did."""
    from bk.core import jobs as J

    which = "a job that failed, timed out, was cancelled or is uncertain can be retried"
    if state == J.SUCCEEDED:
        return f"the job of {short} succeeded: there is nothing to retry; only {which}"
    if state in (J.PENDING, J.RUNNING):
        return f"the job of {short} is still {state}; only {which}"
    if state == J.MISSED:
        return f"the job of {short} missed its booking (it ended before the job could start); only {which}"
    return f"the job of {short} is {state}; only {which}"


def apply_job_state(state, req, call):
    """The ``job_state`` row: the owner's job of one booking changes state
    along ``bk.core.jobs.NEXT`` (a retry: an ended job back to pending
    while its booking lasts)."""
    from bk.core import jobs as J
    from bk.core.models import AuditEntry, Mutation

    res = state.find(req.ref)
    if res is None:
        raise NotFound(f"no reservation {req.ref[:8]}", hint="list your jobs with: bk j")
    if res.uid != call.actor.uid:
        raise PermissionDenied(f"the job of reservation {res.short_id} belongs to {res.user}; only its "
                               "owner's worker may change it")
    if res.job is None or res.job.extra.get("id") != req.job_id:
        raise NotFound(f"reservation {res.short_id} has no job {req.job_id[:8]}", hint="list your jobs with: bk j")
    old = res.job.status
    if req.retry:
        if req.status != J.PENDING or old not in J.RETRYABLE:
            raise InvalidInput(_not_retryable(res.short_id, old),
                               hint=None if old in (J.PENDING, J.RUNNING) else
                               "to run the command once more, book it again: bk run N DUR -- CMD")
        if not res.is_live(call.now):
            raise InvalidInput(f"the booking {res.short_id} has {res.status(call.now)}; a job runs only "
                               "while its booking lasts", hint="book again: bk run N DUR -- CMD")
    elif req.status not in J.NEXT.get(old, ()):
        raise InvalidInput(f"the job of {res.short_id} is already {old}; it cannot become {req.status}")
    extra = dict(res.job.extra)
    reason = req.reason[:MAX_REASON] if req.reason else None
    if old == req.status and extra.get("reason") == reason and not req.retry:
        return Mutation(False, [], JobResult("unchanged", res))
    extra.update(reason=reason, exit_code=req.exit_code, updated=iso(call.now))
    if req.status == J.RUNNING:
        extra["started"] = iso(call.now)
    new = res.replace(job=Job(req.status, res.job.summary, extra))
    state.reservations[state.reservations.index(res)] = new
    # The audit record says which state followed which, never the command.
    return Mutation(True, [AuditEntry("job", req.status, res.id, None, {"job": old},
                                      {"job": req.status}, res.uid, None)], JobResult("updated", new))


# ------------------------------------------------------------------ paths

def _jobs_path(app) -> str:
    from bk.jobs.specs import jobs_dir

    return jobs_dir(app.settings.locations.state_dir)


def _worker_status(app) -> dict:
    """``bk.jobs.worker.worker_status`` for this user's state directory."""
    from bk.jobs.worker import worker_status as status

    return status(app.settings.locations.state_dir)


# ------------------------------------------------------ attaching a command

def check_command(argv: list[str], cwd: str, path: str | None) -> None:
    """Refuse what could never start: no command, a missing working
    directory, a program that is not found or not executable."""
    if not argv or not argv[0]:
        raise InvalidInput("no command after --", hint="e.g. bk run 1 2h -- python3 train.py")
    if not os.path.isdir(cwd):
        raise InvalidInput(f"the working directory {cwd} does not exist", hint="cd to an existing directory")
    prog = argv[0]
    if "/" in prog:
        full = prog if os.path.isabs(prog) else os.path.join(cwd, prog)
        if not os.path.isfile(full):
            raise InvalidInput(f"{prog}: no such file", hint="check the path of the command")
        if not os.access(full, os.X_OK):
            raise InvalidInput(f"{prog} is not executable", hint=f"chmod +x {prog}, or run it with "
                               "its interpreter: bash script.sh")
        return
    for d in (path or "").split(os.pathsep):
        full = os.path.join(d or ".", prog)
        if not os.path.isabs(full):
            full = os.path.join(cwd, full)
        if os.path.isfile(full) and os.access(full, os.X_OK):
            return
    raise InvalidInput(f"{prog}: command not found in PATH", hint="give its full path, or check PATH")


def _attach_command(app, call, req, argv: list[str], *, cwd: str, env: dict, keep: bool = False):
    """Book ``req`` with ``argv`` attached: validate, write the private
    spec, book with its digest; the spec is removed when the booking fails
    or names an earlier booking (an op-id retry).  ``keep``: the booking
    lasts to its end after the command exits (by default the worker ends it
    then).  Returns the BookResult."""
    from bk.core.jobs import summary_of

    path = env.get("PATH")
    check_command(argv, cwd, path)
    if req.dry_run:
        return app.run("book", req, call=call)
    from bk.jobs import specs

    jid = os.urandom(16).hex()
    where = _jobs_path(app)
    digest = specs.write_spec(where, jid, argv, cwd, path, call.now, keep=keep)
    try:
        result = app.run("book", replace(req, job_id=jid, job_digest=digest, job_summary=summary_of(argv)),
                         call=call)
    except BaseException:
        specs.remove(where, jid)
        raise
    if (result.reservation.job or Job("")).extra.get("id") != jid:
        specs.remove(where, jid)
    if _worker_status(app)["state"] != "running":
        call.warn(no_worker_warning(app, env, again=True))
    return result


# ----------------------------------------------------------------- reads

def _my_jobs(app, call) -> list[Reservation]:
    """The caller's bookings that carry a job, in the hot ledger, in the
    order ``bk l`` shows them: current and upcoming ones in list order (so
    the numbers count down the page), then ended ones newest first, as
    ``bk l --history``."""
    from bk.core.ledgerdoc import DocKeep

    state = app.ledger(call=call, keep=DocKeep(uid=call.actor.uid))     # yours are all it looks at
    mine = [r for r in state.reservations if r.uid == call.actor.uid and r.job is not None]
    live = [r for r in mine if r.is_live(call.now)]
    return (sorted(live, key=lambda r: (r.start, r.created))
            + sorted((r for r in mine if not r.is_live(call.now)), key=lambda r: (r.start, r.created),
                     reverse=True))


def _resolve_job(app, call, ref: str) -> Reservation:
    """A job by its booking (list number or ID prefix) or by its own ID
    prefix.  Only the caller's own: another user's job lives in that user's
    state directory, so its log here would be an empty file that is not
    theirs, shown as "no output"; it is refused as a retry is (exit 5)."""
    ref = ref.strip().lower()
    mine = _my_jobs(app, call)
    if len(ref) >= 4 and not ref.isdigit():
        hits = [r for r in mine if (r.job.extra.get("id") or "").startswith(ref)]
        if len(hits) == 1:
            return hits[0]
    try:
        res = _resolve(app, ref, call)
    except NotFound as e:
        if ref.isdigit() and any(r.job.status in TERMINAL for r in mine):
            # A number names a current or upcoming booking, and a booking
            # made for a command ends with it.
            e.hint = "a booking made for a command ends when it exits; name its job by the ID bk j shows"
        raise
    if res.uid != call.actor.uid:
        raise PermissionDenied(f"booking {res.short_id} is {res.user}'s: its job's output and state are "
                               "for its owner only", hint="list your own jobs with: bk j")
    if res.job is None:
        raise NotFound(f"booking {res.short_id} has no command attached", hint="list your jobs with: bk j")
    return res


def _retry(app, call, ref: str, *, accept_duplicate_risk: bool) -> JobResult:
    from bk.service.requests import JobStateRequest

    res = _resolve_job(app, call, ref)
    if res.job.status == "uncertain" and not accept_duplicate_risk:
        raise InvalidInput(f"the job of {res.short_id} is uncertain: it may have run, or be running "
                           "still, somewhere bk cannot see; running it again may duplicate its work",
                           hint=f"if that is acceptable: bk j retry {res.short_id} --accept-duplicate-risk")
    return app.run("job_state", JobStateRequest(res.id, res.job.extra["id"], PENDING, "retried", retry=True),
                   call=call)


# --------------------------------------------------------- bk run -- CMD

def _resolve(app, ref: str, call) -> Reservation:
    from bk.service.booking import resolve

    return resolve(app.ledger(call=call), ref, call)


def _active_bookings(app, call) -> list[Reservation]:
    from bk.service.views import own_current

    return [r for r in own_current(app.ledger(call=call), call) if r.status(call.now) == "active"]


def _run_target(app, call, ref: str | None) -> tuple[Reservation, list[Reservation]]:
    """The booking ``bk run -- CMD`` runs on: ``ref``, or the caller's
    first active booking in list order (the lowest list number).  Returns it
    and all the caller's active bookings."""
    active = _active_bookings(app, call)
    if ref is not None:
        res = _resolve(app, ref, call)
        from bk.service.fairview import may_use

        if not may_use(res, call):
            raise PermissionDenied(f"booking {res.short_id} is {res.user}'s, not yours",
                                   hint=f"{res.user} can share it with you: bk e {res.short_id} --with "
                                        f"{call.actor.user}")
        if res.status(call.now) != "active":
            raise InvalidInput(f"booking {res.short_id} is {res.status(call.now)}, not active now",
                               hint="bk run -- CMD runs on a booking that has started; "
                               "to run later: bk run N DUR -t TIME -- CMD")
        return res, active
    if not active:
        raise NotFound("you have no active booking to run on",
                       hint="book GPUs and run at once: bk run 1 1h -- CMD, or book first: bk 1 30m")
    return active[0], active


def _devices(app) -> tuple[dict[int, str], bool]:
    inv = app.telemetry.inventory()
    return {g.index: g.uuid for g in inv.gpus}, bool(inv.simulated)


def _env_for(app, res: Reservation, base: dict, *, path: str | None = None, job_id: str | None = None) -> dict:
    from bk.core.jobs import job_env

    uuids, simulated = _devices(app)
    return job_env(base, reservation_id=res.id, gpus=res.gpus, uuids=uuids, simulated=simulated,
                   path=path, job_id=job_id)


def bk_vars(env: dict) -> dict:
    from bk.core.jobs import BK_VARS

    return {k: env[k] for k in BK_VARS if k in env}


@dataclass(frozen=True)
class RunOutcome:
    reservation: Reservation
    returncode: int        # as subprocess reports it (negative: a signal)
    stopped: str | None    # "end": bk stopped it at the booking's end; "signal": bk forwarded one
    exit_code: int         # what bk exits with: the command's, 124 at the end, 130 on Ctrl-C


def _run_now(app, call, res: Reservation, argv: list[str], *, cwd: str, env: dict,
            stdout: int | None = None) -> RunOutcome:
    """Run ``argv`` in the foreground on ``res`` (this terminal), TERM at
    the end minus the grace, KILL at the end; ``stdout``: a descriptor for
    its standard output instead of ours."""
    import signal

    from bk.core.jobs import shell_status, stop_times
    from bk.jobs.launcher import run_foreground

    check_command(argv, cwd, env.get("PATH"))
    grace = int(app.settings["worker_termination_grace_seconds"])
    term_at, kill_at = stop_times(res.end, grace, call.now)
    rc, stopped = run_foreground(argv, cwd=cwd, env=_env_for(app, res, env), term_in=term_at - call.now,
                                 kill_in=kill_at - call.now, stdout=stdout)
    if stopped == "end":
        code = 124
    elif rc == -signal.SIGINT:
        code = 130
    else:
        code = shell_status(rc)
    return RunOutcome(res, rc, stopped, code)


# ------------------------------------------------------------ the worker

class Host:
    """What the worker (``bk.jobs.worker``: its loop and its lease) needs
    from bk, the operations it calls: this user's jobs from the committed
    ledger (re-read only when the file changed), state writes through the
    operation table, the live guard, each job's environment, the bookings
    to end early."""

    def __init__(self, app, env: dict, *, clock_fn=None):
        from bk import clock
        from bk.core.jobs import worker_base_env

        self.app = app
        self.uid = app.actor.uid
        self.data_dir = app.settings.data_dir
        self.jobs_path = _jobs_path(app)
        self.grace = int(app.settings["worker_termination_grace_seconds"])
        self.base_env = worker_base_env(env)
        self._clock = clock_fn or clock.now
        self._key = None
        self._state = None
        self._jobs: list[Reservation] = []

    def now(self) -> int:
        return self._clock()

    def _call(self):
        call = self.app.call()
        return replace(call, now=self.now()) if call.now != self.now() else call

    def _identity(self):
        try:
            st = os.stat(self.app.store.paths.ledger)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def jobs(self) -> list[Reservation]:
        key = self._identity()
        if key is None or key != self._key:
            self._state = self.app.ledger(call=self._call())
            self._key = key
            self._jobs = [r for r in self._state.reservations
                          if r.uid == self.uid and r.job is not None and r.job.extra.get("id")]
        return self._jobs

    def set_state(self, res: Reservation, status: str, reason: str | None = None,
                  exit_code: int | None = None) -> None:
        from bk.service.requests import JobStateRequest

        code = exit_code if exit_code is None or 0 <= exit_code <= 255 else 255
        self.app.run("job_state", JobStateRequest(res.id, res.job.extra["id"], status,
                                                  _printable(reason), code), call=self._call())
        self._key = None

    def blocker(self, res: Reservation) -> str | None:
        from bk.core.jobs import launch_blocker

        telemetry = self.app.telemetry
        if hasattr(telemetry, "refresh"):
            telemetry.refresh()
        return launch_blocker(telemetry.snapshot(), self._state.reservations if self._state else [res],
                              res, self.now())

    def env_for(self, res: Reservation, spec) -> dict:
        return _env_for(self.app, res, self.base_env, path=spec.path, job_id=spec.id)

    def ended_early(self, at: int, exit_code: int) -> str:
        """What the owner reads when a booking ends with its command:
        ``ended early: the command finished at 14:02 (exit 0)`` (local time)."""
        from bk.core.timegrid import format_local_short

        call = self._call()
        return f"ended early: the command finished at {format_local_short(at, call.tz, call.now)} (exit {exit_code})"

    def end_booking(self, res: Reservation, reason: str) -> None:
        """End the rest of ``res`` now, as its owner, through the ``cancel``
        row (audited, with ``reason``): the GPUs are free for the others at
        once.  Raises what the row raises (``InvalidInput`` once it ended)."""
        from bk.service.requests import CancelRequest

        self.app.run("cancel", CancelRequest(res.id, reason=_printable(reason)), call=self._call())
        self._key = None


    def follow_ups(self, now: int) -> dict:
        """Bookings of this user to end now because their work ended
        (issue 25, ``bk.service.follow``): key -> (reservation, reason).
        An adopted process that exited (checked by its exact identity in
        /proc), or a booking the monitor judged idle past its release time,
        checked again here against the ledger just read.  Costs nothing
        while none of the user's running bookings could end so."""
        from bk.service import follow

        if self._state is None:
            return {}
        policy = self.app.settings["idle_release_minutes"]
        mine = [r for r in self._state.reservations
                if r.uid == self.uid and r.cancelled_at is None and r.start <= now < r.end]
        out = {}
        adopted = [r for r in mine if follow.adopted(r)]
        if adopted:
            from bk.gpu.procinfo import alive

            for r in adopted:
                why = follow.adopt_reason(r, now, alive)
                if why is not None:
                    out["follow:" + r.id] = (r, why)
        idle = [r for r in mine if ("follow:" + r.id) not in out and
                (policy is not None or follow.release_minutes(r) is not None)]
        if idle:
            rows = self._activity_rows(idle, now)
            for r in idle:
                why = follow.release_reason(rows.get(r.id) or {}, r, now, policy)
                if why is not None:
                    out["follow:" + r.id] = (r, why)
        return out

    def _activity_rows(self, reservations, now: int) -> dict:
        """The monitor's activity rows, re-read only when its snapshot changed."""
        from bk.service.activity import rows
        from bk.store import snapshot as files

        try:
            st = os.stat(os.path.join(files.monitor_dir(self.app.settings), files.SNAPSHOT_FILE))
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            return {}
        if getattr(self, "_act_stamp", None) != stamp:
            self._act_stamp, self._act_rows = stamp, rows(self.app.settings, reservations, now)
        return self._act_rows


def _printable(text: str | None) -> str | None:
    """A reason for the ledger: one line, no control characters, bounded."""
    if text is None:
        return None
    from bk.core.safetext import safe

    return safe(" ".join(text.split())[:MAX_REASON], mark="?")


# ------------------------------------------------------------ the rows
#
# What front ends run (bk j, bk w, bk run, bk N DUR -- CMD, the agent's
# create with a command and job_log).  The ones that take a process's
# environment or run a program are in-process rows: no field spec, never
# sent anywhere (``Operation.fields`` is None).

@dataclass(frozen=True)
class JobsRequest:
    limit: int | None = None


@dataclass(frozen=True)
class JobsResult:
    """``bk j``: the caller's jobs (bookings that carry one, newest start
    first), how many in all, and the worker's state."""

    jobs: tuple                        # Reservations
    total: int
    worker: dict
    numbers: dict                      # list numbers of the caller's current bookings

    def to_json(self) -> dict:
        return {"jobs": [job_json(r) for r in self.jobs], "total": self.total, "worker": dict(self.worker)}


def _serve_jobs(app, req: JobsRequest, call) -> JobsResult:
    from bk.service.views import numbers_of

    mine = _my_jobs(app, call)
    shown = mine[:req.limit] if req.limit else mine
    return JobsResult(tuple(shown), len(mine), _worker_status(app), numbers_of(app.ledger(call=call), call))


DEFAULT_LOG_BYTES = 64 * 1024          # bk.jobs.logs.TAIL_BYTES


@dataclass(frozen=True)
class JobLogRequest:
    ref: str                           # the booking (list number, ID prefix) or the job's own ID prefix
    max_bytes: int = DEFAULT_LOG_BYTES  # the last this many bytes of output
    all: bool = False                  # all of it (two rotated segments at most)


@dataclass(frozen=True)
class JobLogResult:
    reservation: Reservation
    log: bytes
    truncated: bool
    worker: dict                       # the worker's state: why a job has not started

    def to_json(self) -> dict:
        return {"job": job_json(self.reservation), "log": self.log.decode("utf-8", "replace"),
                "truncated": self.truncated}

    @staticmethod
    def json_schema() -> dict:
        from bk.service.views import obj, typed

        return obj({"job": typed("object", null=True), "log": typed("string"),
                    "truncated": typed("boolean", description="older output left out")})


def _serve_job_log(app, req: JobLogRequest, call) -> JobLogResult:
    from bk.jobs import logs

    res = _resolve_job(app, call, req.ref)
    data, cut = logs.read(_jobs_path(app), res.job.extra.get("id") or "", None if req.all else req.max_bytes)
    return JobLogResult(res, data, cut, _worker_status(app))


@dataclass(frozen=True)
class JobRetryRequest:
    ref: str
    accept_duplicate_risk: bool = False


def _serve_job_retry(app, req: JobRetryRequest, call) -> JobResult:
    # Whether a worker will start it is the caller's to say (the
    # ``worker_hint`` row: once a session, with this process's environment).
    return _retry(app, call, req.ref, accept_duplicate_risk=req.accept_duplicate_risk)


@dataclass(frozen=True)
class WorkerHintRequest:
    """After ``bk j``, ``bk w`` or a retry: the "no worker" advice for this
    login session (``env``: this process's, which names the session)."""

    env: dict
    again: bool = False                # a job that will not start: the short line after the first


@dataclass(frozen=True)
class WorkerHint:
    line: str | None                   # None: a worker runs, or the session heard it already

    def to_json(self) -> dict:
        return {"hint": self.line}


def _serve_worker_hint(app, req: WorkerHintRequest, call) -> WorkerHint:
    if _worker_status(app)["state"] == "running":
        return WorkerHint(None)
    return WorkerHint(no_worker_warning(app, req.env, again=req.again))


@dataclass(frozen=True)
class WorkerStatusResult:
    """``bk w``: is the caller's worker running, how many jobs wait or run,
    and where their private specs and logs are."""

    worker: dict
    jobs: dict                         # pending, running: counts
    jobs_dir: str

    def to_json(self) -> dict:
        return {"worker": dict(self.worker), "jobs": dict(self.jobs), "jobs_dir": self.jobs_dir}


def _serve_worker_status(app, req, call) -> WorkerStatusResult:
    mine = _my_jobs(app, call)
    counts = {s: sum(1 for r in mine if r.job.status == s) for s in (PENDING, RUNNING)}
    return WorkerStatusResult(_worker_status(app), counts, _jobs_path(app))


@dataclass(frozen=True)
class WorkerRunRequest:
    """``bk w start`` (until SIGTERM or SIGINT) and ``bk w once`` in this process."""

    env: dict
    once: bool = False
    log: object = None                 # (line) -> None; None: stderr, as every daemon logs (bk.daemon)


@dataclass(frozen=True)
class WorkerRunResult:
    started: int
    once: bool

    def to_json(self) -> dict:
        return {"action": "once" if self.once else "start", "started": self.started}


def _serve_worker_run(app, req: WorkerRunRequest, call) -> WorkerRunResult:
    """The worker's loop is ``bk.jobs.worker.serve``; this row gives it its
    host and, for ``bk w start``, the user's notifications, which come from
    this process too, in a thread of their own (``bk.service.notifier``
    says why here)."""
    from bk.jobs.worker import serve

    def notifications(say):
        from bk.service import notifier

        return notifier.start(req.env, say=say)

    started = serve(Host(app, req.env), once=req.once, log=req.log, companion=None if req.once else notifications)
    return WorkerRunResult(started, req.once)


@dataclass(frozen=True)
class BookJobRequest:
    """``bk N DUR -- CMD``: book with a command attached (its private spec
    written first, removed again when the booking fails)."""

    book: object                       # the BookRequest
    argv: tuple
    cwd: str
    env: dict
    keep: bool = False                 # the booking lasts to its end after the command exits


def _serve_book_job(app, req: BookJobRequest, call):
    return _attach_command(app, call, req.book, list(req.argv), cwd=req.cwd, env=req.env, keep=req.keep)


@dataclass(frozen=True)
class RunTargetRequest:
    ref: str | None = None             # None: the caller's first active booking


@dataclass(frozen=True)
class RunTarget:
    """The booking ``bk run -- CMD`` runs on, the caller's active bookings,
    and the bk variables a command gets there."""

    reservation: Reservation
    active: tuple
    env: dict
    view: object                       # numbered

    def to_json(self) -> dict:
        return {"reservation": self.view.reservation(self.reservation), "env": dict(self.env),
                "active": [self.view.reservation(r) for r in self.active]}


def _serve_run_target(app, req: RunTargetRequest, call) -> RunTarget:
    from bk.service.views import View, numbers_of

    res, active = _run_target(app, call, req.ref)
    return RunTarget(res, tuple(active), bk_vars(_env_for(app, res, {})),
                     View.of(call, numbers_of(app.ledger(call=call), call)))


@dataclass(frozen=True)
class RunNowRequest:
    """``bk run -- CMD`` in the foreground, on this terminal."""

    ref: str | None
    argv: tuple
    cwd: str
    env: dict
    stdout: int | None = None          # a descriptor for the command's standard output instead of ours


@dataclass(frozen=True)
class RunNowResult:
    outcome: RunOutcome
    view: object

    def to_json(self) -> dict:
        o = self.outcome
        return {"reservation": self.view.reservation(o.reservation), "exit_code": o.exit_code,
                "returncode": o.returncode, "stopped": o.stopped}


def _serve_run_now(app, req: RunNowRequest, call) -> RunNowResult:
    from bk.service.views import View, numbers_of

    res, _active = _run_target(app, call, req.ref)
    outcome = _run_now(app, call, res, list(req.argv), cwd=req.cwd, env=req.env, stdout=req.stdout)
    return RunNowResult(outcome, View.of(call, numbers_of(app.ledger(call=call), call)))
