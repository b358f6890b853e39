"""The per-user worker with real processes: a private data directory with
``slot_minutes=1``, the worker driven tick by tick on a fake clock
(``Worker.tick``; the jobs are real child processes that take real time),
and, for crash recovery, a real ``bk w start`` killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bk.core.errors import Busy, Conflict, InvalidInput
from bk.service import BookJobRequest, Empty, JobLogRequest, JobRetryRequest, jobs, open_app
from bk.service.requests import BookRequest, CancelRequest
from tests.helpers_broker import poll

ROOT = Path(__file__).resolve().parent.parent
# The trap is set before the env file appears: the tests send TERM as soon as
# they see that file, and a TERM that came before the trap would kill the shell
# (the default action) and never be recorded; on a loaded machine the shell
# can wait many milliseconds between its `mv` and its next line.
SCRIPT = """#!/bin/sh
out="$1"
trap 'echo TERM >> "$out/signals"' TERM
env > "$out/env.$$"
mv "$out/env.$$" "$out/env"
echo "started $$"
while :; do sleep 0.05; done
"""


def jobs_dir(app) -> str:
    """Where the private specs and the logs are (what bk w says)."""
    return app.run("worker_status", Empty()).jobs_dir


class Clock:
    def __init__(self, t: int):
        self.t = t

    def __call__(self) -> int:
        return self.t


class World:
    """A private bk with one-minute slots, a fake clock, and a worker."""

    def __init__(self, root: Path, *, sim: dict | None = None):
        self.root = root
        self.out = root / "out"
        self.out.mkdir()
        cfg = root / "cfg" / "bk"
        cfg.mkdir(parents=True)
        (cfg / "config.json").write_text(json.dumps({"slot_minutes": 1, "worker_termination_grace_seconds": 2}))
        self.env = {"BK_DATA_DIR": str(root / "data"), "HOME": str(root), "XDG_CONFIG_HOME": str(root / "cfg"),
                    "XDG_CACHE_HOME": str(root / "cache"), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "TZ": "UTC"}
        if sim is not None:
            self.sim = root / "sim.json"
            self.sim.write_text(json.dumps(sim))
            self.env["BK_GPU_SIM_FILE"] = str(self.sim)
        else:
            self.env["BK_GPU_COUNT"] = "4"
        now = int(time.time())
        self.clock = Clock(now - now % 60 + 30)          # half way through a one-minute slice
        self.app = open_app(self.env, clock_fn=self.clock)
        self.script = root / "job.sh"
        self.script.write_text(SCRIPT)
        self.script.chmod(0o755)
        from bk.jobs.worker import Worker

        self.worker = Worker(jobs.Host(self.app, self.env, clock_fn=self.clock))

    def book(self, argv=None, *, start: int | None = None, minutes: int = 2, **kw):
        call = self.app.call()
        req = BookRequest(count=1, duration=minutes * 60, start=start, **kw)
        argv = argv or [str(self.script), str(self.out)]
        return self.app.run("book_job", BookJobRequest(req, tuple(argv), str(self.root), self.env),
                            call=call).reservation

    def job(self, res):
        return next(r for r in self.app.ledger().reservations if r.id == res.id).job

    def kill_children(self):
        for ch in self.worker.children.values():
            try:
                os.killpg(ch.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            ch.proc.wait()


@pytest.fixture
def world(tmp_path):
    w = World(tmp_path)
    yield w
    w.kill_children()


def test_a_booked_command_starts_at_its_start_minute_on_its_gpus(world):
    start = world.clock.t - world.clock.t % 60 + 60
    res = world.book(start=start, pinned=(2,))
    assert world.job(res).status == "pending"
    world.worker.tick()
    assert world.worker.children == {} and not (world.out / "env").exists()      # not yet
    world.clock.t = start
    world.worker.tick()
    assert world.job(res).status == "running"
    env = dict(line.split("=", 1) for line in poll(lambda: (world.out / "env").exists() and
                                                  (world.out / "env").read_text()).splitlines() if "=" in line)
    assert env["CUDA_VISIBLE_DEVICES"] == "2"             # a simulation: indices
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["BK_RESERVATION_ID"] == res.id and env["BK_RESERVED_GPUS"] == "2"
    assert env["BK_JOB_MARKER"] == "gpubk-job:" + res.job.extra["id"]
    assert env["PATH"] == world.env["PATH"] and env["PWD"] == str(world.root)


def test_term_before_the_end_then_kill_at_the_end(world):
    res = world.book(minutes=1)                      # now: the current slice, 30 s left
    world.worker.tick()
    ch = next(iter(world.worker.children.values()))
    poll(lambda: (world.out / "env").exists(), what="the job to start")
    world.clock.t = res.end - 3
    world.worker.tick()
    assert not (world.out / "signals").exists()
    world.clock.t = res.end - 2                      # grace 2 s: TERM now
    world.worker.tick()
    poll(lambda: (world.out / "signals").exists(), what="TERM")
    assert ch.proc.poll() is None                    # it traps TERM and goes on
    world.clock.t = res.end
    world.worker.tick()                              # KILL
    poll(lambda: ch.proc.poll() is not None, what="KILL")
    world.worker.tick()
    job = world.job(res)
    assert job.status == "timed-out" and job.extra["exit_code"] == 128 + signal.SIGKILL
    assert (world.out / "signals").read_text() == "TERM\n"


def test_a_cancelled_booking_stops_its_job(world):
    res = world.book()
    world.worker.tick()
    ch = next(iter(world.worker.children.values()))
    poll(lambda: (world.out / "env").exists(), what="the job to start")
    world.app.run("cancel", CancelRequest(res.id))
    world.worker.tick()                              # TERM now, KILL after the grace
    poll(lambda: (world.out / "signals").exists(), what="TERM")
    world.clock.t += 2
    world.worker.tick()
    poll(lambda: ch.proc.poll() is not None, what="the job to stop")
    world.worker.tick()
    assert world.job(res).status == "cancelled"


def test_a_pending_job_of_a_cancelled_booking_never_starts(world):
    res = world.book(start=world.clock.t - world.clock.t % 60 + 60)
    world.app.run("cancel", CancelRequest(res.id))
    assert world.job(res).status == "cancelled"
    world.clock.t = res.start
    world.worker.tick()
    assert world.worker.children == {}


def test_busy_gpus_keep_the_job_pending_with_a_reason(tmp_path):
    sim = {"gpus": [{"name": "H100", "mem_total_mib": 81559, "mem_used_mib": 2048,
                     "processes": [{"pid": 5151, "uid": 2000, "user": "bob", "label": "train.py",
                                    "mem_mib": 2048}]},
                    {"name": "H100", "mem_total_mib": 81559, "processes": []}]}
    w = World(tmp_path, sim=sim)
    try:
        res = w.book(pinned=(0,))
        w.worker.tick()
        job = w.job(res)
        assert job.status == "pending" and w.worker.children == {}
        assert "GPU 0 is used by bob" in job.extra["reason"]
        assert "bob" in jobs.job_json(next(r for r in w.app.ledger().reservations if r.id == res.id))["reason"]
        sim["gpus"][0]["processes"] = []
        w.sim.write_text(json.dumps(sim))
        w.worker.tick()
        assert w.job(res).status == "running"
        poll(lambda: (w.out / "env").exists(), what="the job to start once the GPU cleared")
    finally:
        w.kill_children()


def test_a_job_that_never_got_its_gpus_is_missed(world):
    res = world.book(minutes=1)
    world.clock.t = res.end
    world.worker.tick()
    assert world.job(res).status == "missed" and world.worker.children == {}


def test_exit_status_is_recorded(world):
    res = world.book(["/bin/sh", "-c", "echo out; echo err >&2; exit 3"])
    world.worker.tick()
    ch = next(iter(world.worker.children.values()))
    poll(lambda: ch.proc.poll() is not None, what="the job to exit")
    world.worker.tick()
    job = world.job(res)
    assert job.status == "failed" and job.extra["exit_code"] == 3
    assert world.app.run("job_log", JobLogRequest(res.short_id)).log == b"out\nerr\n"


def booking_now(world, res):
    return next(r for r in world.app.ledger().reservations if r.id == res.id)


def test_a_booking_ends_when_its_command_exits(world):
    """Issue 25: a booking made for a command kept its GPUs to the end after
    the command was done.  The tick that sees the exit ends the booking (the
    owner's own cancel, audited), so the rest of the window is free at once;
    the job and the booking say why."""
    res = world.book(["/bin/sh", "-c", "exit 3"], minutes=10)
    world.worker.tick()
    ch = next(iter(world.worker.children.values()))
    poll(lambda: ch.proc.poll() is not None, what="the job to exit")
    world.clock.t += 1
    world.worker.tick()
    from datetime import datetime, timezone

    at = datetime.fromtimestamp(world.clock.t, timezone.utc).strftime("%H:%M")
    why = f"ended early: the command finished at {at} (exit 3)"
    job = world.job(res)
    assert job.status == "failed" and job.extra["exit_code"] == 3 and job.extra["reason"] == why
    done = booking_now(world, res)
    assert done.cancelled_at == world.clock.t and done.cancel_reason == why and done.cancelled_by == os.getuid()
    audit = [json.loads(line) for line in (Path(world.env["BK_DATA_DIR"]) / "audit.jsonl").read_text().splitlines()]
    last = audit[-1]
    assert (last["action"], last["reservation"], last["uid"], last["reason"]) == ("cancel", res.id, os.getuid(), why)
    # the GPU is free for the rest of the window: the same GPU books at once
    again = world.app.run("book", BookRequest(count=1, duration=300, pinned=tuple(res.gpus)))
    assert again.reservation.gpus == res.gpus
    world.worker.tick()                                   # nothing more to do
    assert world.worker.ending == {} and booking_now(world, res).cancelled_at == done.cancelled_at


def test_keep_leaves_the_booking_to_its_end(world):
    res = world.app.run("book_job", BookJobRequest(BookRequest(count=1, duration=600), ("/bin/true",),
                                                   str(world.root), world.env, keep=True)).reservation
    world.worker.tick()
    ch = next(iter(world.worker.children.values()))
    poll(lambda: ch.proc.poll() is not None, what="the job to exit")
    world.worker.tick()
    assert world.job(res).status == "succeeded" and world.job(res).extra["reason"] is None
    assert booking_now(world, res).cancelled_at is None


def test_a_command_bk_stopped_leaves_its_booking_alone(world):
    res = world.book(minutes=1)
    world.worker.tick()
    ch = next(iter(world.worker.children.values()))
    poll(lambda: (world.out / "env").exists(), what="the job to start")
    world.clock.t = res.end
    world.worker.tick()                                   # TERM and KILL: the booking's end
    poll(lambda: ch.proc.poll() is not None, what="KILL")
    world.worker.tick()
    assert world.job(res).status == "timed-out" and booking_now(world, res).cancelled_at is None


def test_ending_the_booking_is_retried_when_the_ledger_is_busy(world, monkeypatch):
    res = world.book(["/bin/true"], minutes=10)
    host = world.worker.host
    real, calls = host.end_booking, []

    def busy_once(r, reason):
        calls.append(reason)
        if len(calls) == 1:
            raise Busy("the ledger is locked by another writer")
        real(r, reason)
    monkeypatch.setattr(host, "end_booking", busy_once)
    world.worker.tick()
    ch = next(iter(world.worker.children.values()))
    poll(lambda: ch.proc.poll() is not None, what="the job to exit")
    world.worker.tick()
    assert world.job(res).status == "succeeded" and booking_now(world, res).cancelled_at is None
    assert list(world.worker.ending) == [res.job.extra["id"]]
    world.clock.t += 1
    world.worker.tick()
    assert len(calls) == 2 and calls[0] == calls[1] and booking_now(world, res).cancel_reason == calls[0]
    assert world.worker.ending == {}


def test_a_tampered_spec_is_refused_and_never_run(world):
    res = world.book(["/bin/sh", "-c", f"touch {world.out}/ran"])
    path = Path(jobs_dir(world.app)) / "specs" / f"{res.job.extra['id']}.json"
    path.write_bytes(path.read_bytes().replace(b"/ran", b"/pwn"))
    world.worker.tick()
    job = world.job(res)
    assert job.status == "failed" and "digest" in job.extra["reason"]
    assert world.worker.children == {}
    time.sleep(0.2)
    assert not list(world.out.iterdir())


def test_bad_input_leaves_nothing_half_made(world):
    specs_dir = Path(jobs_dir(world.app)) / "specs"
    with pytest.raises(InvalidInput, match="not executable"):
        (world.root / "plain.sh").write_text("echo hi\n")
        world.book(["./plain.sh"])
    with pytest.raises(InvalidInput, match="not found"):
        world.book(["no-such-program-bk"])
    call = world.app.call()
    with pytest.raises(InvalidInput, match="working directory"):
        world.app.run("book_job", BookJobRequest(BookRequest(1, 60), ("true",), str(world.root / "gone"),
                                                 world.env), call=call)
    assert not specs_dir.exists() or not list(specs_dir.iterdir())
    world.book(["true"], pinned=(0,), mode="exclusive")
    start = world.clock.t - world.clock.t % 60
    with pytest.raises(Conflict):                      # the booking fails after the spec was written
        world.book(["true"], pinned=(0,), start=start)
    assert len(list(specs_dir.iterdir())) == 1
    assert len([r for r in world.app.ledger().reservations if r.job]) == 1


def test_the_worker_may_change_only_its_owners_jobs(world):
    from bk.core.errors import PermissionDenied
    from bk.service.context import Actor
    from bk.service.requests import JobStateRequest

    res = world.book()
    other = open_app(world.env, clock_fn=world.clock, actor=Actor(os.getuid() + 4242, "mallory"))
    req = JobStateRequest(res.id, res.job.extra["id"], "failed", "forged")
    with pytest.raises(PermissionDenied):
        other.run("job_state", req)
    with pytest.raises(InvalidInput, match="cannot become"):
        world.app.run("job_state", JobStateRequest(res.id, res.job.extra["id"], "succeeded"))
    assert world.job(res).status == "pending"


def test_one_worker_per_user(world):
    from bk.jobs.worker import Lease, worker_status

    state_dir = world.app.settings.locations.state_dir
    assert worker_status(state_dir)["state"] == "absent"
    with Lease(jobs_dir(world.app), data_dir="d", now=5):
        st = worker_status(state_dir)
        assert st["state"] == "running" and st["pid"] == os.getpid()
        with pytest.raises(Busy, match="already running"):
            Lease(jobs_dir(world.app), data_dir="d", now=5).__enter__()
    assert worker_status(state_dir)["state"] == "absent"


# ------------------------------------------------------------- crash recovery

@pytest.mark.slow
def test_a_new_worker_stops_the_orphan_of_a_killed_one_and_marks_it_uncertain(tmp_path):
    w = World(tmp_path)
    w.app = open_app(w.env)                                        # real time: a real worker runs
    res = w.book(start=None)
    env = {**w.env, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "bk", "w", "start"], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        text = poll(lambda: (w.out / "env").exists() and (w.out / "env").read_text(), 20, "the job to start")
        assert "BK_JOB_MARKER=gpubk-job:" + res.job.extra["id"] in text
        poll(lambda: w.job(res).status == "running", 10, "the job to be running in the ledger")
        # The job's shell, not the 50 ms sleeps it keeps starting: one of those
        # can exit between this list and the check below, killed worker or not.
        orphans = [p for p in jobs_processes(res.job.extra["id"]) if not _cmdline(p).startswith(b"sleep\0")]
        assert orphans
        proc.kill()                                                # kill -9 the worker
        proc.wait()
        assert all(alive(p) for p in orphans)                       # its job runs on, orphaned
        assert w.app.run("worker_status", Empty()).worker["state"] == "absent"
        from bk.jobs.worker import Worker

        new = Worker(jobs.Host(w.app, w.env))
        assert new.recover() == [res.job.extra["id"]]
        poll(lambda: not any(alive(p) for p in orphans), 10, "the orphan to stop")
        job = w.job(res)
        assert job.status == "uncertain" and "stopped processes" in job.extra["reason"]
        # A retry needs the acknowledgement that it may run twice.
        with pytest.raises(InvalidInput, match="duplicate its work") as refused:
            w.app.run("job_retry", JobRetryRequest(res.short_id))
        assert "--accept-duplicate-risk" in refused.value.hint
        w.app.run("job_retry", JobRetryRequest(res.short_id, accept_duplicate_risk=True))
        assert w.job(res).status == "pending"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in jobs_processes(res.job.extra["id"]):
            os.kill(p, signal.SIGKILL)


def jobs_processes(job_id: str) -> list[int]:
    from bk.jobs.launcher import find_marked

    return find_marked(os.getuid(), [job_id]).get(job_id, [])


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def alive(pid: int) -> bool:
    from bk.jobs.launcher import alive as up

    return up(pid)


def test_through_the_broker_a_user_changes_only_their_own_jobs(world):
    """The broker's decoder and the owner rule of the job_state row, with
    the caller's identity as the kernel would give it (SO_PEERCRED)."""
    from bk.broker.handlers import Dispatcher, Peer

    res = world.book()
    d = Dispatcher(world.app)
    fields = {"ref": res.id, "job_id": res.job.extra["id"], "status": "running"}
    other = d.dispatch({"op": "job_state", "fields": fields}, Peer(1, os.getuid() + 4242, 0))
    assert not other["ok"] and other["error"]["code"] == "permission_denied"
    bad = d.dispatch({"op": "job_state", "fields": {**fields, "status": "done"}}, Peer(1, os.getuid(), 0))
    assert not bad["ok"] and bad["error"]["code"] == "invalid_input"
    mine = d.dispatch({"op": "job_state", "fields": fields}, Peer(1, os.getuid(), 0))
    assert mine["ok"] and mine["data"]["job"]["status"] == "running"
    assert world.job(res).status == "running"
