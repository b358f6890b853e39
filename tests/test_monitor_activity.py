"""The monitor's activity states: the CPU of process trees from /proc (a
fake /proc tree, then real processes), the ``activity`` object of the
snapshot, the idle clocks kept in ``activity.json`` across a restart (and
not believed from a file anyone could have written), and ``bk m`` from the
built archive judging a real process: idle while it sleeps holding its
memory, active while its child burns a CPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers_broker import poll
from test_monitor import FakeBackend, Ledger, booking, make

from bk.core.activity import Tracker
from bk.core.models import GpuProcess
from bk.gpu.procinfo import CpuTrees
from bk.store import activity as kept
from bk.store import snapshot as sf

HZ = os.sysconf("SC_CLK_TCK")


def put(root: Path, pid: int, ppid: int, ticks: int, *, start: int = 777, cutime: int = 0) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    rest = ["S", str(ppid)] + ["0"] * 9 + [str(ticks), "0", str(cutime), "0", "20", "0", "1", "0", str(start)]
    (d / "stat").write_text(f"{pid} (py) thon) {' '.join(rest + ['0'] * 20)}\n")


class Mono:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_cpu_trees_from_a_fake_proc(tmp_path):
    root = tmp_path / "proc"
    put(root, 10, 1, 100)
    put(root, 11, 10, 50)              # a data loader worker
    put(root, 12, 11, 5)               # its child
    put(root, 20, 1, 1000)             # someone else's
    clock = Mono()
    trees = CpuTrees(str(root), rescan_s=30, clock=clock)
    assert trees.advance({"b": [10]}) == {"b": 0.0}           # the first look only learns where they are
    put(root, 10, 1, 100 + HZ)
    put(root, 11, 10, 50 + 2 * HZ)
    put(root, 12, 11, 5 + HZ)
    put(root, 20, 1, 9000)
    assert trees.advance({"b": [10]}) == {"b": 4.0}
    # two roots of one booking (a parent and its child on the GPU): the child counts once
    put(root, 11, 10, 50 + 3 * HZ)
    assert trees.advance({"b": [10, 11]}) == {"b": 1.0}
    # a new child appears between scans: not seen until the next scan, and then from its second reading
    put(root, 13, 10, 10 * HZ)
    assert trees.advance({"b": [10]}) == {"b": 0.0}
    clock.t = 31
    assert trees.advance({"b": [10]}) == {"b": 0.0}
    put(root, 13, 10, 11 * HZ)
    assert trees.advance({"b": [10]}) == {"b": 1.0}
    # the worker exits and is reaped: its time moves to the parent's waited-for children
    import shutil

    shutil.rmtree(root / "11")
    shutil.rmtree(root / "12")
    put(root, 10, 1, 100 + HZ, cutime=3 * HZ + HZ)
    clock.t = 62
    assert trees.advance({"b": [10]}) == {"b": 4.0}
    # PID reuse: 13 is now another process (another start): no jump
    put(root, 13, 10, 500 * HZ, start=999)
    assert trees.advance({"b": [10]}) == {"b": 0.0}
    assert trees.advance({}) == {}


BUSY = """
import os, signal, sys, time
def burn(*_):
    if os.fork() == 0:
        end = time.monotonic() + 120
        while time.monotonic() < end:
            pass
        os._exit(0)
signal.signal(signal.SIGUSR1, burn)
print("ready", flush=True)
while True:
    time.sleep(1)
"""


@pytest.fixture
def gpu_program():
    """A real process standing in for a program that holds a GPU: it
    sleeps; SIGUSR1 makes it start a child that burns a CPU (a data loader)."""
    p = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert p.stdout.readline().strip() == "ready"
    yield p
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(10)


def test_cpu_trees_of_real_processes(gpu_program):
    trees = CpuTrees(rescan_s=0)
    trees.advance({"b": [gpu_program.pid]})
    time.sleep(0.3)                      # real time passing, not synchronisation: a sleeping tree uses nothing
    assert trees.advance({"b": [gpu_program.pid]})["b"] < 0.05
    gpu_program.send_signal(signal.SIGUSR1)
    used = [0.0]

    def seen() -> bool:
        used[0] += trees.advance({"b": [gpu_program.pid]})["b"]
        return used[0] > 0.05
    poll(seen, 30, "the child's CPU in the tree")


# ------------------------------------------------------------- the monitor

class FakeTrees:
    def __init__(self):
        self.seconds = 0.0
        self.asked = []

    def advance(self, groups):
        self.asked.append(groups)
        return {k: self.seconds for k in groups}


def monitor(tmp_path, procs, reservations, **kw):
    be = FakeBackend(procs=procs)
    trees = FakeTrees()
    m, clock = make(tmp_path, be, Ledger(reservations, policy={"max_shared_users": 2}),
                    tracker=Tracker(2.0, policy_release_minutes=1), cpu_trees=trees, keep_activity=True, **kw)
    return m, clock, trees


def test_snapshot_publishes_each_running_booking(tmp_path):
    holder = [GpuProcess(7, mem_mib=8000, sm=0, uid=1000, user="ada", label="python")]
    m, clock, trees = monitor(tmp_path, {0: holder}, [booking(), booking(uid=1001, gpus=(1,), rid="r2")])
    for _ in range(40):
        m.step()
        clock.t += 2
    assert trees.asked[-1] == {"r1": [7]}          # only the booking with processes has a tree to measure
    got = sf.read_snapshot_file(m.directory, clock.t - 2)
    rows = {r["reservation"]: r for r in got.activity["bookings"]}
    assert rows["r1"]["state"] == "idle-held" and rows["r1"]["reason"] == "memory-held"
    assert rows["r1"]["idle_s"] == 78 and rows["r1"]["release_due"] is True and rows["r1"]["release_after_s"] == 60
    assert rows["r1"]["evidence"]["mem_mib"] == 8000 and rows["r1"]["gpus"] == [0]
    assert rows["r2"]["state"] == "empty" and rows["r2"]["reason"] == "no-process"
    # the data loader starts: active, and the clock is back to 0
    trees.seconds = 1.0
    m.step()
    rows = {r["reservation"]: r for r in m.activity_doc["bookings"]}
    assert (rows["r1"]["state"], rows["r1"]["reason"], rows["r1"]["idle_s"]) == ("active", "cpu", 0)
    assert rows["r1"]["release_due"] is False


def test_a_failing_judgement_costs_neither_the_history_nor_the_snapshot(tmp_path):
    m, clock, trees = monitor(tmp_path, {}, [booking()])

    def broken(groups):
        raise ZeroDivisionError("a bug")
    trees.advance = broken
    m.tracker.roots = lambda *a: {"r1": [7]}
    s = m.step()
    assert s.status == "degraded" and "the activity state failed (a bug): ZeroDivisionError" in s.detail
    got = sf.read_snapshot_file(m.directory, clock.t)
    assert got is not None and got.activity is None
    clock.t += 60
    m.step()
    assert m.usage.records                        # the minute was still folded and written


def test_an_older_reader_and_an_older_snapshot(tmp_path):
    """The activity object rides in the same schema: a reader that does
    not know it reads the snapshot as before, and a snapshot without one
    (an older monitor) reads with ``activity`` None."""
    m, clock, _ = monitor(tmp_path, {}, [booking()])
    m.step()
    doc = json.loads((Path(m.directory) / sf.SNAPSHOT_FILE).read_text())
    assert doc["schema"] == "gpubk.snapshot.v1" and doc["activity"]["v"] == 1
    assert {"power_mw", "power_limit_mw", "energy_mj"} <= set(doc["gpus"][0])
    del doc["activity"]
    assert sf.parse_snapshot(doc).activity is None
    doc["activity"] = {"bookings": "nonsense"}
    assert sf.parse_snapshot(doc).activity is None


def test_idle_clocks_survive_a_restart(tmp_path):
    holder = [GpuProcess(7, mem_mib=8000, sm=0, uid=1000, user="ada", label="python")]
    m, clock, _ = monitor(tmp_path, {0: holder}, [booking()])
    for _ in range(31):
        m.step()
        clock.t += 2
    m.finish()                                   # a clean stop keeps them
    doc = json.loads((Path(m.directory) / kept.FILE).read_text())
    assert doc["schema"] == kept.SCHEMA and doc["bookings"]["r1"]["idle_s"] == 60
    again = Tracker(2.0, policy_release_minutes=1)
    again.load(kept.read(m.directory))
    m2, clock2, _ = monitor(tmp_path, {0: holder}, [booking()])
    m2.tracker = again
    clock2.t = clock.t                          # 2 s after the last sample
    m2.step()
    assert again.bookings["r1"].idle_s == 62


def test_activity_is_kept_once_a_minute_not_every_sample(tmp_path):
    m, clock, _ = monitor(tmp_path, {}, [booking()])
    path = Path(m.directory) / kept.FILE
    clock.t -= clock.t % 60
    m.step()
    first = path.stat().st_mtime_ns
    for _ in range(10):
        clock.t += 2
        m.step()
    assert json.loads(path.read_text())["updated_at"] == clock.t - 20 and path.stat().st_mtime_ns == first
    clock.t += 60
    m.step()
    assert json.loads(path.read_text())["updated_at"] == clock.t


def test_a_file_others_could_write_is_not_believed(tmp_path):
    d = tmp_path / "monitor"
    kept.write(str(d), {"bookings": {"r1": {"uid": 1000, "idle_s": 99999, "state": "empty"}}}, 5)
    assert kept.read(str(d))["bookings"]["r1"]["idle_s"] == 99999
    (d / kept.FILE).chmod(0o666)
    assert kept.read(str(d)) == {}
    (d / kept.FILE).unlink()
    planted = tmp_path / "planted.json"
    planted.write_text(json.dumps({"schema": kept.SCHEMA, "bookings": {"r1": {"uid": 1000, "idle_s": 9}}}))
    (d / kept.FILE).symlink_to(planted)
    assert kept.read(str(d)) == {}
    (d / kept.FILE).unlink()
    (d / kept.FILE).write_text("{not json")
    assert kept.read(str(d)) == {}


# ------------------------------------------------------------- the built archive

def test_bk_m_judges_a_real_process(pyz, tmp_path, gpu_program):
    """``bk m`` from the archive, a simulated GPU whose one process is a
    real one of this user (``proc: true``), and a booking of that GPU: the
    snapshot says idle-held while the program sleeps holding its memory,
    then active (cpu) once its child burns a CPU: the /proc tree is read
    for real."""
    sim = tmp_path / "sim.json"
    sim.write_text(json.dumps({"proc": True, "gpus": [
        {"name": "H100", "mem_total_mib": 81559, "mem_used_mib": 8500, "util": 0, "power_mw": 71000,
         "power_limit_mw": 700000, "energy_mj": 5000000,
         "processes": [{"pid": gpu_program.pid, "mem_mib": 8192, "sm": 0}]},
        {"name": "H100", "mem_total_mib": 81559, "util": 0, "processes": []}]}))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "TZ": "UTC",
           "BK_DATA_DIR": str(tmp_path / "data"), "BK_GPU_SIM_FILE": str(sim),
           "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    b = subprocess.run([sys.executable, str(pyz), "--json", "1", "1h", "-g", "0"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert b.returncode == 0, b.stdout + b.stderr
    rid = json.loads(b.stdout)["data"]["reservation"]["id"]
    mon = subprocess.Popen([sys.executable, str(pyz), "m", "--interval", "0.5"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def row(state):
            def check():
                if mon.poll() is not None:
                    raise AssertionError(f"bk m exited: {mon.stderr.read()}")
                got = sf.read_snapshot_file(str(tmp_path / "data" / "monitor"), int(time.time()))
                for r in (got.activity or {}).get("bookings", []) if got else ():
                    if r["reservation"] == rid and r["state"] == state:
                        return r
                return None
            return check
        idle = poll(row("idle-held"), 60, "the booking judged idle-held")
        assert idle["reason"] == "memory-held" and idle["evidence"]["processes"] == 1
        assert idle["evidence"]["mem_mib"] == 8192
        gpu_program.send_signal(signal.SIGUSR1)
        busy = poll(row("active"), 60, "the booking judged active by its tree's CPU")
        assert busy["reason"] == "cpu" and busy["evidence"]["cpu_pct"] >= 2
    finally:
        mon.send_signal(signal.SIGTERM)
        assert mon.wait(30) == 0
    state = json.loads((tmp_path / "data" / "monitor" / kept.FILE).read_text())
    assert state["bookings"][rid]["uid"] == os.getuid()
