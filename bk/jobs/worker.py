"""The per-user worker: launches the user's due jobs, stops them at the end.

One loop, one tick at a time (``Worker.tick``; ``serve`` holds the lease,
stops on SIGTERM or SIGINT through the daemons' frame ``bk.daemon``, and
runs the ticks), driven by a host that the
service layer provides (``bk.service.jobs.Host``): it reads the user's jobs
from the committed ledger, writes their state through the ``job_state``
operation (the broker in shared mode: only the caller's own jobs), asks the
live GPUs (the launch guard) and builds each job's environment.  The worker
itself does only processes and files, so a test drives ``tick`` with a fake
clock and real child processes.

What a tick does, per job of the user:

  pending, booking not started     sleep until its start
  pending, booking started         guard clear: read and verify the spec, start it, ``running``;
                                   guard busy: stay ``pending`` with the reason (written once)
  pending, booking over            ``missed``
  running, started by us           at end - grace: TERM its group; at end: KILL;
                                   booking cancelled: TERM now, KILL after the grace;
                                   it exited: ``succeeded``/``failed``/``timed-out``/``cancelled``;
                                   exited on its own: the booking ends now too, freeing
                                   the rest of its window (not with ``bk run --keep``)
  running, not ours                its worker died: stop what carries its marker, ``uncertain``

A write that fails (the broker is restarting, the ledger busy) is kept and
tried again next tick; a job never starts twice, because what was started
is remembered here, not only in the ledger.

The wait between ticks is until the next due instant (a start, a TERM, a
KILL), at most ``POLL_S``: each idle tick is one ``stat`` of the ledger
(the host re-reads it only when it changed), which keeps an idle worker far
under 0.1% of a core (benchmarks/worker.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable

from bk.core import jobs as J
from bk.core import journal
from bk.core.errors import BkError, Busy, InvalidInput, NotFound, PermissionDenied
from bk.core.record import dataclass, field
from bk.jobs import launcher, logs, specs
from bk.store.fsutil import open_file, replace_file
from bk.store.lock import holder

POLL_S = 1.0
PUMP_WAIT_S = 5.0            # after a job exits, how long its log pump may take to write the rest
PUMP_FIRST_WAIT_S = 1.0      # of which the tick that sees the exit waits at once
CLEAN_EVERY_S = 60
SPEC_GRACE_S = 600           # an unreferenced spec younger than this may belong to a booking being made
LOCK_FILE = "worker.lock"
STATE_FILE = "worker.json"


@dataclass
class Child:
    proc: object                 # subprocess.Popen
    res_id: str
    job_id: str
    started: int
    stopping: str | None = None  # "end" | "cancel" | "worker"
    kill_at: int | None = None
    killed: bool = False
    pump: object = None          # subprocess.Popen of its log pump (bk.jobs.logpump)
    exited_at: float | None = None
    keep: bool = False           # bk run --keep: its exit leaves the booking as it is


@dataclass
class Worker:
    host: object
    proc_root: str = "/proc"
    log: Callable[[str], None] = lambda line: None
    time_fn: Callable[[], float] = time.time
    children: dict = field(default_factory=dict)       # job id -> Child
    unsent: dict = field(default_factory=dict)         # job id -> (res, status, reason, exit code)
    reasons: dict = field(default_factory=dict)        # job id -> the pending reason last written
    pumps: list = field(default_factory=list)          # log pumps still writing for jobs that ended
    ending: dict = field(default_factory=dict)         # job id (or follow:ID) -> (res, reason): bookings to end early
    last_clean: float = 0.0

    # -- writes ------------------------------------------------------------

    def _set(self, res, status: str, reason: str | None = None, exit_code: int | None = None) -> bool:
        jid = res.job.extra["id"]
        try:
            self.host.set_state(res, status, reason, exit_code)
        except (NotFound, PermissionDenied, InvalidInput) as e:
            # Retrying cannot help: the booking left the ledger, or the job
            # changed meanwhile (a retry, a cancel).  Said once, then dropped.
            self.unsent.pop(jid, None)
            self.log(journal.warning(f"job {jid[:8]}: not recorded as {status}: {e.message}"))
            return False
        except BkError as e:             # busy, the broker restarting, a full disk: next tick
            self.unsent[jid] = (res, status, reason, exit_code)
            self.log(journal.warning(f"could not record job {jid[:8]} as {status} yet ({e.message}); will retry"))
            return False
        self.unsent.pop(jid, None)
        return True

    def _flush(self, jobs: dict) -> None:
        for jid, (res, status, reason, code) in list(self.unsent.items()):
            current = jobs.get(jid)
            if current is not None and current.job.status == status:
                self.unsent.pop(jid)
                continue
            self._set(current or res, status, reason, code)
        for jid, (res, reason) in list(self.ending.items()):
            self._end(jobs.get(jid) or res, jid, reason)

    def _end(self, res, jid: str, reason: str) -> None:
        """End the booking of a job whose command finished (the owner's own
        cancel, audited with ``reason``); a write that fails for now is tried
        again next tick."""
        if res.cancelled_at is not None:
            self.ending.pop(jid, None)
            return
        try:
            self.host.end_booking(res, reason)
        except (NotFound, PermissionDenied, InvalidInput) as e:
            # It ended, or was cancelled or changed meanwhile: nothing left to give back.
            self.ending.pop(jid, None)
            self.log(f"{_whose(jid)}: booking {res.short_id} not ended early: {e.message}")
            return
        except BkError as e:
            self.ending[jid] = (res, reason)
            self.log(f"could not end booking {res.short_id} yet ({e.message}); will retry")
            return
        self.ending.pop(jid, None)
        self.log(f"{_whose(jid)}: booking {res.short_id} {reason}")

    # -- the loop ----------------------------------------------------------

    def jobs(self) -> dict:
        return {r.job.extra["id"]: r for r in self.host.jobs()}

    def recover(self) -> list[str]:
        """After a crash: stop every process that carries the marker of one of
        the user's jobs but is not a child of this worker, and mark jobs that
        the ledger says are running (or that had such processes) ``uncertain``."""
        jobs = {j: r for j, r in self.jobs().items() if j not in self.children}
        found = launcher.find_marked(self.host.uid, jobs, self.proc_root)
        for jid, pids in found.items():
            self.log(journal.warning(f"job {jid[:8]}: found orphaned processes {pids} of a previous worker; "
                                     "stopping them"))
            launcher.stop_orphans(pids, grace=min(self.host.grace, 5), proc_root=self.proc_root)
        marked = []
        for jid, res in jobs.items():
            if res.job.status == J.RUNNING or (jid in found and res.job.status == J.PENDING):
                why = (f"its worker stopped while it ran; the next worker stopped processes "
                       f"{', '.join(map(str, found[jid]))}" if jid in found
                       else "its worker stopped while it ran; it was no longer running")
                self._set(res, J.UNCERTAIN, why + " (retry: bk j retry ID --accept-duplicate-risk)")
                marked.append(jid)
        return marked

    def tick(self) -> float:
        """One pass; returns how long to sleep before the next."""
        now = self.host.now()
        jobs = self.jobs()
        self._flush(jobs)
        due = now + POLL_S
        grace = self.host.grace
        self.pumps = [p for p in self.pumps if p.poll() is None]
        for jid, ch in list(self.children.items()):
            res = jobs.get(jid)
            rc = ch.proc.poll()
            if rc is not None:
                if not self._pumped(ch):
                    due = now                            # look again shortly
                    continue
                del self.children[jid]
                state = J.exit_state(rc, stopped_for=ch.stopping if ch.stopping != "worker" else None)
                code = J.shell_status(rc)
                why = {J.TIMED_OUT: "stopped at the booking's end", J.CANCELLED: "stopped: the booking "
                       "was cancelled", J.FAILED: f"exited with status {code}"}.get(state)
                early = res is not None and J.ends_booking(
                    stopped_for=ch.stopping, keep=ch.keep, cancelled=res.cancelled_at is not None, now=now,
                    end=res.end)
                if early:
                    why = self.host.ended_early(now, code)
                self.log(f"job {jid[:8]} ended: {state} (status {code})")
                self._set(res if res is not None else _stub(ch), state, why, code)
                if early:
                    self._end(res, jid, why)
                continue
            if res is not None and res.job.status == J.PENDING and jid not in self.unsent:
                self._set(res, J.RUNNING)                  # a write that failed at launch
            term_at, kill_at = J.stop_times(res.end, grace, res.start) if res is not None else (now, now)
            if ch.stopping is None:
                if res is None or res.cancelled_at is not None:
                    ch.stopping, ch.kill_at = "cancel", now + grace
                    self.log(f"job {jid[:8]}: booking cancelled; TERM to process group {ch.proc.pid}")
                    launcher.signal_group(ch.proc.pid, signal.SIGTERM)
                elif now >= term_at:
                    ch.stopping, ch.kill_at = "end", kill_at
                    self.log(f"job {jid[:8]}: booking ends; TERM to process group {ch.proc.pid}")
                    launcher.signal_group(ch.proc.pid, signal.SIGTERM)
                else:
                    due = min(due, term_at)
            if ch.stopping is not None and not ch.killed:
                if now >= ch.kill_at:
                    ch.killed = True
                    self.log(journal.warning(f"job {jid[:8]}: KILL to process group {ch.proc.pid}"))
                    launcher.signal_group(ch.proc.pid, signal.SIGKILL)
                else:
                    due = min(due, ch.kill_at)
        if any(r.job.status == J.RUNNING and j not in self.children and j not in self.unsent
               for j, r in jobs.items()):
            self.recover()                       # a previous worker's jobs: it died
        for jid, res in jobs.items():
            if jid in self.children or jid in self.unsent:
                continue
            status = res.job.status
            if status != J.PENDING:
                continue
            if res.cancelled_at is not None:
                self._set(res, J.CANCELLED, "the booking was cancelled")
            elif now >= res.end:
                last = self.reasons.get(jid) or res.job.extra.get("reason")
                self._set(res, J.MISSED, "the booking ended before it could start"
                          + (f" ({last})" if last else ""))
            elif now >= res.start:
                self._start(res, now)
            else:
                due = min(due, res.start)
        follow = getattr(self.host, "follow_ups", None)
        for key, (res, why) in (follow(now) if follow is not None else {}).items():
            if key not in self.ending:
                self._end(res, key, why)
        if self.time_fn() - self.last_clean >= CLEAN_EVERY_S:
            self.clean(jobs, now)
        return float(max(0, due - now))

    def _pumped(self, ch: Child) -> bool:
        """Whether the log of a job that exited is complete: its pump has
        written everything and ended, or ``PUMP_WAIT_S`` passed (something
        the job started still holds its output; the pump goes on alone)."""
        if ch.pump is None or ch.pump.poll() is not None:
            return True
        t = self.time_fn()
        if ch.exited_at is None:
            # The usual case: the job's exit closed the pipe, and the pump
            # writes what is left in it (64 KiB at most) and ends within
            # milliseconds.  Waiting that long here keeps "the job exited,
            # the next tick records it" true; only a pipe held open by
            # something the job left running costs more, and is polled.
            ch.exited_at = t
            try:
                ch.pump.wait(PUMP_FIRST_WAIT_S)
                return True
            except subprocess.TimeoutExpired:
                pass
        if t - ch.exited_at < PUMP_WAIT_S:
            return False
        self.pumps.append(ch.pump)
        return True

    def _start(self, res, now: int) -> None:
        jid = res.job.extra["id"]
        blocked = self.host.blocker(res)
        if blocked:
            reason = "waiting for the GPUs: " + blocked
            if self.reasons.get(jid) != reason:
                self.log(f"job {jid[:8]}: {reason}")
                if self._set(res, J.PENDING, reason):
                    self.reasons[jid] = reason
            return
        try:
            spec = specs.read_spec(self.host.jobs_path, jid, res.job.extra.get("digest"))
            if not os.path.isdir(spec.cwd):
                raise FileNotFoundError(f"the working directory {spec.cwd} does not exist")
            env = self.host.env_for(res, spec)
            fd, pump = logs.start_pump(self.host.jobs_path, jid)
            try:
                proc = launcher.launch(spec.argv, cwd=spec.cwd, env=env, log_fd=fd)
            except BaseException:
                os.close(fd)
                pump.wait()                  # the pipe's only writer is gone: it ends at once
                raise
            os.close(fd)
        except BkError as e:
            self.log(journal.warning(f"job {jid[:8]}: not started: {e.message}"))
            self._set(res, J.FAILED, f"not started: {e.message}")
            return
        except OSError as e:
            why = e.strerror or str(e)
            if e.filename and e.filename not in why:
                why = f"{e.filename}: {why}"
            self.log(journal.warning(f"job {jid[:8]}: not started: {why}"))
            self._set(res, J.FAILED, f"not started: {why}")
            return
        self.children[jid] = Child(proc, res.id, jid, now, pump=pump, keep=spec.keep)
        self.reasons.pop(jid, None)
        self.log(f"job {jid[:8]} started on GPUs {','.join(map(str, res.gpus))}: pid {proc.pid} "
                 f"(booking {res.short_id})")
        self._set(res, J.RUNNING)

    def clean(self, jobs: dict, now: int) -> None:
        self.last_clean = self.time_fn()
        keep = {j for j, r in jobs.items() if r.is_live(now) or r.job.status in (J.PENDING, J.RUNNING)}
        keep |= set(self.children)
        try:
            specs.clean(self.host.jobs_path, keep=keep, now=self.time_fn(), grace_s=SPEC_GRACE_S)
            logs.clean(self.host.jobs_path, running=set(self.children), now=self.time_fn())
        except BkError as e:
            self.log(journal.warning(f"cleaning job files failed: {e.message}"))

    def stop_all(self, grace: float) -> None:
        """The worker is told to stop: TERM every job's group, KILL after ``grace``."""
        for ch in self.children.values():
            ch.stopping = "worker"
            launcher.signal_group(ch.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(ch.proc.poll() is None for ch in self.children.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        jobs = self.jobs()
        for jid, ch in list(self.children.items()):
            if ch.proc.poll() is None:
                launcher.signal_group(ch.proc.pid, signal.SIGKILL)
                ch.proc.wait()
            if ch.pump is not None:
                try:
                    ch.pump.wait(max(0.0, deadline + PUMP_WAIT_S - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass                 # something the job started holds its output: the pump goes on
            res = jobs.get(jid) or _stub(ch)
            self._set(res, J.FAILED, "stopped: its worker was stopped (a logout without "
                      "loginctl enable-linger, or systemctl --user stop bk-worker)",
                      J.shell_status(ch.proc.returncode))
        self.children.clear()

    def run(self, should_stop: Callable[[], bool], sleep: Callable[[float], None] = time.sleep) -> None:
        self.recover()
        while not should_stop():
            delay = self.tick()
            # The ledger's clock is whole seconds: sleep to the boundary of the
            # real second on which the next start or stop is due.
            wait = delay - self.time_fn() % 1.0 if delay >= 1 else 0.05
            sleep(min(POLL_S, max(0.01, wait)))


def serve(host, *, once: bool = False, log: Callable[[str], None] | None = None, companion=None) -> int:
    """``bk w start`` (until SIGTERM or SIGINT) and ``bk w once`` (start what
    is due, stay until what it started has ended, then return).  Holds the
    one-worker lease; ``Busy`` (exit 75) when another worker holds it.
    ``companion(log)``, for ``bk w start``, starts what runs beside the
    loop (the user's notifications: something with ``stop()``, or None).
    Returns how many jobs this run started."""
    from bk import daemon

    log = log or daemon.stderr_log("bk worker")
    with daemon.Stop() as stop, Lease(host.jobs_path, data_dir=host.data_dir, now=host.now(), log=log):
        worker = Worker(host, log=log)
        beside = None
        if not once:
            # Only now, with the lease held: a second worker is refused
            # ("already running") before it could say it started.
            daemon.ready(log, f"started (pid {os.getpid()}); jobs in {host.jobs_path}")
            beside = companion(log) if companion is not None else None
        started = 0
        with stop.signals():
            try:
                if once:
                    worker.recover()
                    while True:
                        before = set(worker.children)
                        worker.tick()
                        started += len(set(worker.children) - before)
                        if stop.is_set() or not worker.children:
                            break
                        stop.wait(0.2)
                else:
                    worker.run(stop.is_set, sleep=stop.wait)
                    daemon.stopping()
            finally:
                if beside is not None:
                    beside.stop()
                if worker.children:
                    worker.stop_all(host.grace)
        return started


def _whose(key: str) -> str:
    """A key of ``Worker.ending``: a job id, or ``follow:`` and a booking id
    (a booking that ends because its work did: bk.service.follow)."""
    return "idle or adopted" if key.startswith("follow:") else f"job {key[:8]}"


def _stub(ch: Child):
    """A reservation-shaped record for a job whose booking left the ledger."""
    from bk.core.models import Job, Reservation

    return Reservation(id=ch.res_id, uid=0, user="", mode="shared", gpus=(), share=1, start=0, end=0,
                       created=0, job=Job(J.RUNNING, None, {"id": ch.job_id}))


# ---------------------------------------------------------------- the lease

class Lease:
    """The one-worker-per-user lock (``jobs/worker.lock``, an flock the
    kernel drops when the worker dies) and the state file beside it."""

    def __init__(self, jobs_path: str, *, data_dir: str, now: int, log: Callable[[str], None] | None = None):
        self.jobs_path, self.data_dir, self.now, self.log = jobs_path, data_dir, now, log
        self._dir = None
        self._lock: int | None = None

    def __enter__(self) -> Lease:
        from bk import daemon

        self._dir = specs.JobsDir(self.jobs_path, create=True).__enter__()
        path = os.path.join(self.jobs_path, LOCK_FILE)

        def busy(pid):
            by = f" (process {pid})" if pid else ""
            return Busy(f"a bk worker is already running for you{by}", hint="see it with: bk w; "
                        "stop it with: systemctl --user stop bk-worker, or kill " + (str(pid) if pid else "PID"),
                        details={"path": path, "holder_pid": pid})
        try:
            self._lock = daemon.instance_lock(self.jobs_path, LOCK_FILE, what="the worker's lock", busy=busy,
                                              log=self.log, uid=self._dir.safety.uid, dirfd=self._dir.fd)
            doc = {"pid": os.getpid(), "since": self.now, "data_dir": self.data_dir}
            replace_file(self._dir.fd, STATE_FILE, self.jobs_path, json.dumps(doc).encode() + b"\n",
                         specs.FILE_MODE)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self._lock is not None:
            os.close(self._lock)            # closing it lets go of the lock
            self._lock = None
        if self._dir is not None:
            self._dir.__exit__()
            self._dir = None


def worker_status(state_dir: str, proc_locks: str = "/proc/locks") -> dict:
    """Whether this user's worker runs: ``{"state": "running" | "absent",
    "pid": int | None, "since": ISO or None, "data_dir": str | None}``.
    Read-only: it never takes the lock (that could turn a worker starting
    at this instant away); the holder comes from ``/proc/locks``."""
    from bk.core.models import iso

    jobs_path = specs.jobs_dir(state_dir)
    out = {"state": "absent", "pid": None, "since": None, "data_dir": None}
    try:
        with specs.JobsDir(jobs_path, create=False) as d:
            if d.fd is None:
                return out
            fd = open_file(d.fd, LOCK_FILE, os.path.join(jobs_path, LOCK_FILE), d.safety)
            if fd is None:
                return out
            try:
                pid = holder(fd, proc_locks)
            finally:
                os.close(fd)
            if pid is None:
                return out
            out.update(state="running", pid=pid)
            sfd = open_file(d.fd, STATE_FILE, os.path.join(jobs_path, STATE_FILE), d.safety)
            if sfd is not None:
                try:
                    doc = json.loads(os.pread(sfd, 4096, 0) or b"{}")
                finally:
                    os.close(sfd)
                if isinstance(doc, dict) and doc.get("pid") == pid:
                    since = doc.get("since")
                    out.update(since=iso(since) if isinstance(since, int) else None,
                               data_dir=doc.get("data_dir"))
    except (BkError, OSError, ValueError):
        return out
    return out
