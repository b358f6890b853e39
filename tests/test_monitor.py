"""The monitor daemon (bk.monitor.daemon): its steps on a fake clock with
fake backends, and clients that read its snapshot instead of the GPUs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers_cli import ME

from bk.core.models import GpuInfo, GpuProcess, Reservation
from bk.core.telemetry import Inventory, Snapshot
from bk.monitor import daemon
from bk.store import snapshot as sf

T = 1_800_000_000


class FakeBackend:
    """GPUs whose look can be made to fail; counts every question."""

    name = "fake"
    simulated = False
    reason = None

    def __init__(self, n: int = 2, *, procs=None, fingerprint: str | None = "fake:1"):
        self.n, self.procs, self.print_ = n, procs or {}, fingerprint
        self.fail = False
        self.lost = False
        self.calls = {"snapshot": 0, "inventory": 0, "fingerprint": 0}

    def fingerprint(self):
        self.calls["fingerprint"] += 1
        return self.print_

    def static_inventory(self):
        return None

    def _gpus(self, live: bool):
        return tuple(GpuInfo(i, f"GPU-{i}", "Fake", mem_total_mib=1000,
                             mem_used_mib=100 if live else None, util=10 if live else None,
                             processes=list(self.procs.get(i, [])) if live else None)
                     for i in range(self.n))

    def inventory(self):
        self.calls["inventory"] += 1
        return Inventory("fake", self._gpus(False), False)

    def snapshot(self, now):
        self.calls["snapshot"] += 1
        if self.fail:
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        return Snapshot(now, "fake", self._gpus(True), ("nvml",) if self.lost else (), False)


class Clock:
    def __init__(self, t=T):
        self.t = t

    def __call__(self):
        return self.t


class FakeUsage:
    def __init__(self):
        self.records, self.fail = [], False

    def append(self, records):
        if self.fail:
            raise OSError(28, "No space left on device")
        self.records.extend(records)


def booking(uid=1000, gpus=(0,), start=T - 600, end=T + 3600, rid="r1"):
    return Reservation(id=rid, uid=uid, user="ada", gpus=tuple(gpus), start=start, end=end,
                       mode="shared", share=1, created=start)


class Ledger:
    def __init__(self, reservations=(), policy=None):
        self.reservations, self.policy = list(reservations), policy
        self.fail = None

    def __call__(self):
        if self.fail:
            raise self.fail
        return self


def make(tmp_path, backend=None, ledger=None, **kw):
    from bk.core.usage import Folder

    clock = Clock()
    m = daemon.Monitor(backend or FakeBackend(), ledger or Ledger(), str(tmp_path / "monitor"), clock=clock,
                       interval_s=2.0, folder=Folder(60, interval_s=2), usage=FakeUsage(),
                       log=lambda line: None, pid=os.getpid(), **kw)
    return m, clock


def state(m, now, alive=True):
    return sf.read_heartbeat(m.directory, now, alive=lambda pid: alive)


# ------------------------------------------------------------- heartbeat transitions

def test_running_then_degraded_then_stale(tmp_path):
    be = FakeBackend(procs={0: [GpuProcess(7, mem_mib=10, uid=1000, user="ada", label="python")]})
    m, clock = make(tmp_path, be, Ledger([booking()]))
    m.step()
    hb = state(m, clock.t)
    assert (hb.state, hb.detail, hb.samples) == ("running", None, 1)
    got = sf.read_snapshot_file(m.directory, clock.t)
    assert got.fingerprint == "fake:1" and got.snapshot.gpus[0].processes[0].pid == 7
    doc = json.loads((tmp_path / "monitor" / sf.SNAPSHOT_FILE).read_text())
    assert doc["gpus"][0]["processes"][0]["attribution"]["state"] == "ok"

    clock.t += 2
    be.lost = True                    # NVML reports the GPU lost: readings, with a gap
    m.step()
    hb = state(m, clock.t)
    assert hb.state == "degraded" and "driver failed" in hb.detail

    clock.t += 2
    be.fail = True                    # the look itself raises: the daemon lives on
    m.step()
    hb = state(m, clock.t)
    assert hb.state == "degraded" and "NVML_ERROR_UNKNOWN" in hb.detail
    blind = sf.read_snapshot(m.directory, clock.t)
    assert blind is not None and all(g.processes is None and g.util is None for g in blind.gpus)

    assert state(m, clock.t + 5).state == "degraded"
    assert state(m, clock.t + 6).state == "stale"

    clock.t += 2
    be.fail = be.lost = False
    m.step()
    assert state(m, clock.t).state == "running"


def test_a_failed_first_look_publishes_no_snapshot(tmp_path):
    be = FakeBackend()
    be.fail = True
    m, clock = make(tmp_path, be)
    m.step()
    assert state(m, clock.t).state == "degraded"
    assert not (tmp_path / "monitor" / sf.SNAPSHOT_FILE).exists()    # never "no GPUs"


def test_topology_mismatch_against_the_ledger_and_the_config(tmp_path):
    m, clock = make(tmp_path, FakeBackend(2), Ledger(policy={"gpu_count": 4}))
    m.step()
    hb = state(m, clock.t)
    assert hb.state == "topology-mismatch" and "(2, from fake)" in hb.detail and "4" in hb.detail
    m2, clock2 = make(tmp_path / "b", FakeBackend(2), Ledger(), gpu_count=3)
    m2.step()
    assert state(m2, clock2.t).state == "topology-mismatch"
    m3, clock3 = make(tmp_path / "c", FakeBackend(2), Ledger(policy={"gpu_count": 2}), gpu_count=None)
    m3.step()
    assert state(m3, clock3.t).state == "running"


def test_an_unreadable_ledger_degrades_and_keeps_the_last_bookings(tmp_path):
    from bk.core.errors import IOFailure

    be = FakeBackend(procs={0: [GpuProcess(7, uid=1000, user="ada", label="python")]})
    led = Ledger([booking()])
    m, clock = make(tmp_path, be, led)
    m.step()
    led.fail = IOFailure("the ledger is unreadable")
    clock.t += 2
    s = m.step()
    assert state(m, clock.t).state == "degraded" and "cannot read the ledger" in state(m, clock.t).detail
    assert s.attributions[(0, 7)].state == "ok"        # judged against the bookings last read


def test_usage_is_folded_per_minute_and_flushed_on_stop(tmp_path):
    be = FakeBackend(procs={0: [GpuProcess(7, mem_mib=10, sm=50, uid=1000, user="ada", label="python")]})
    m, clock = make(tmp_path, be, Ledger([booking()]))
    clock.t = T - T % 60                       # the start of a minute
    for _ in range(30):                        # one whole minute, 2 s apart
        m.step()
        clock.t += 2
    m.step()                                   # the first sample of the next minute closes the first
    whole = list(m.usage.records)
    assert {r.gpu for r in whole} == {0, 1} and all(r.covered_s == 60 for r in whole)
    flushed = m.finish()
    assert flushed == 2
    tail = m.usage.records[len(whole):]
    assert {r.gpu for r in tail} == {0, 1} and all(r.covered_s == 2 for r in tail)
    hb = state(m, clock.t + 10**6, alive=False)
    assert hb.state == "stopped" and "31 samples" in hb.detail


def test_history_that_cannot_be_written_is_kept_and_retried(tmp_path):
    m, clock = make(tmp_path)
    clock.t = T - T % 60
    m.usage.fail = True
    for _ in range(31):
        m.step()
        clock.t += 2
    assert state(m, clock.t - 2).state == "degraded"
    assert "cannot write usage history" in state(m, clock.t - 2).detail
    assert m.usage.records == [] and len(m._pending) == 2
    m.usage.fail = False
    m.step()
    assert len(m.usage.records) == 2 and m._pending == []
    assert state(m, clock.t).state == "running"


# ------------------------------------------------------------- clients

@pytest.fixture
def private(tmp_path, monkeypatch):
    data = tmp_path / "data"
    for var in ("BK_GPU_SIM_FILE", "BK_GPU_COUNT", "BK_CONFIG_FILE", "BK_NOW"):
        monkeypatch.delenv(var, raising=False)
    env = {"BK_DATA_DIR": str(data), "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "PATH": os.environ.get("PATH", ""), "TZ": "UTC"}
    return env, data / "monitor"


def _app(env, be, now=T):
    from bk.service import open_app

    return open_app(env, actor=ME, backend=be, clock_fn=lambda: now)


def _status(env, be, now=T):
    from bk.service import StatusRequest

    return _app(env, be, now).run("status", StatusRequest(verbose=True))


def _publish(directory: Path, be: FakeBackend, taken_at: int, fingerprint="fake:1"):
    live = FakeBackend(be.n, procs={0: [GpuProcess(99, mem_mib=5, uid=2000, user="bob", label="train")]})
    sf.write_snapshot(str(directory), live.snapshot(taken_at), interval_s=2.0,
                      inventory_fingerprint=fingerprint)


def test_a_fresh_snapshot_means_no_backend_call(private):
    env, mdir = private
    be = FakeBackend()
    _publish(mdir, be, T - 1)
    st = _status(env, be)
    # The first command of a boot learns the inventory the snapshot is
    # checked against (once, then cached); it takes no live look.
    assert be.calls["snapshot"] == 0 and be.calls["inventory"] == 1
    assert [p.pid for p in st.gpus[0].processes] == [99]
    assert st.to_json()["monitor"]["state"] == "absent"        # a snapshot but no heartbeat yet
    be2 = FakeBackend()
    st = _status(env, be2)
    assert be2.calls == {"snapshot": 0, "inventory": 0, "fingerprint": be2.calls["fingerprint"]}
    assert [p.pid for p in st.gpus[0].processes] == [99]


def _doc(mdir: Path) -> dict:
    return json.loads((mdir / sf.SNAPSHOT_FILE).read_text())


@pytest.mark.parametrize("where, value", [
    ("util", 10 ** 9), ("mem_used_mib", 10 ** 30), ("mem_total_mib", 0), ("temperature", 10 ** 6),
    ("index", -1), ("uuid", ""), ("util", True), ("pid", -1), ("pid", 0), ("pid", 1 << 40),
    ("mem_mib", -5), ("sm", 101), ("uid", -1), ("uid", 1 << 40), ("identity", "trust-me"),
    ("interval_s", 1e9), ("taken_at", -1), ("processes", "none"),
])
def test_a_snapshot_with_a_reading_out_of_range_is_not_believed(private, where, value):
    env, mdir = private
    be = FakeBackend()
    _publish(mdir, be, T - 1)
    doc = _doc(mdir)
    if where in ("pid", "mem_mib", "sm", "uid", "identity"):
        doc["gpus"][0]["processes"][0][where] = value
    elif where in ("interval_s", "taken_at"):
        doc[where] = value
    else:
        doc["gpus"][0][where] = value
    (mdir / sf.SNAPSHOT_FILE).write_text(json.dumps(doc))
    assert sf.read_snapshot_file(str(mdir), T) is None
    st = _status(env, be)
    assert be.calls["snapshot"] == 1                    # the client looked itself
    assert st.gpus[0].util == 10 and st.gpus[0].processes == ()


def test_a_heartbeat_out_of_range_is_not_believed(tmp_path):
    d = tmp_path / "monitor"
    asked = []
    doc = sf.heartbeat_doc(status="running", pid=-1, started_at=T, updated_at=T, interval_s=2.0,
                           detail=None, samples=1)
    sf.write_heartbeat(str(d), doc)
    hb = sf.read_heartbeat(str(d), T, alive=lambda pid: asked.append(pid) or True)
    assert hb.state != "running" and asked == []        # kill(-1, 0) would ask about every process
    sf.write_heartbeat(str(d), {**doc, "pid": 7, "interval_s": 1e12})
    assert sf.read_heartbeat(str(d), T, alive=lambda pid: True).state != "running"


@pytest.mark.parametrize("change", ["drop two", "other uuid", "swap", "renumber"])
def test_a_snapshot_of_other_gpus_is_not_used_in_part(private, change):
    env, mdir = private
    be = FakeBackend(4)
    _status(env, be)                                    # the inventory of four GPUs is known
    _publish(mdir, be, T - 1)
    doc = _doc(mdir)
    if change == "drop two":
        doc["gpus"] = doc["gpus"][:2]
    elif change == "other uuid":
        doc["gpus"][3]["uuid"] = "GPU-elsewhere"
    elif change == "swap":
        doc["gpus"][0]["uuid"], doc["gpus"][1]["uuid"] = doc["gpus"][1]["uuid"], doc["gpus"][0]["uuid"]
    else:
        doc["gpus"][3]["index"] = 5
    (mdir / sf.SNAPSHOT_FILE).write_text(json.dumps(doc))
    be2 = FakeBackend(4)
    st = _status(env, be2)
    assert be2.calls["snapshot"] == 1 and len(st.gpus) == 4
    assert all(g.processes == () for g in st.gpus)      # the backend's own look, not pid 99


def test_the_inventory_is_never_learnt_from_a_partial_snapshot(private):
    """No cached inventory yet: the check asks the backend, and the
    monitor's two GPUs do not become this machine's inventory."""
    env, mdir = private
    be = FakeBackend(4)
    _publish(mdir, FakeBackend(2), T - 1)
    st = _status(env, be)
    assert len(st.gpus) == 4 and be.calls["snapshot"] == 1
    assert _app(env, FakeBackend(4)).telemetry.inventory().count == 4


class StandIn(FakeBackend):
    """A driver this account cannot open: the inventory is a stand-in
    simulation (``reason`` set) while the monitor's account sees the GPUs."""

    def inventory(self):
        self.calls["inventory"] += 1
        from bk.core.models import GpuInfo

        return Inventory("sim", tuple(GpuInfo(i, f"SIM-{i}", "Simulated GPU") for i in range(self.n)), True,
                         "NVML: insufficient permissions; simulating")


def test_a_stand_in_inventory_defers_to_the_monitor_but_not_against_the_configured_count(private, tmp_path):
    env, mdir = private
    _publish(mdir, FakeBackend(4), T - 1)
    st = _status(env, StandIn(4))
    assert [p.pid for p in st.gpus[0].processes] == [99]     # the monitor sees more than this account
    cfg = tmp_path / "bk.json"
    cfg.write_text(json.dumps({"gpu_count": 4}))
    os.chmod(cfg, 0o644)
    env = {**env, "BK_CONFIG_FILE": str(cfg)}
    assert [p.pid for p in _status(env, StandIn(4)).gpus[0].processes] == [99]
    _publish(mdir, FakeBackend(2), T - 1)                    # two of the four configured GPUs
    be = StandIn(4)
    st = _status(env, be)
    assert be.calls["snapshot"] == 1 and len(st.gpus) == 4 and st.gpus[0].processes == ()


def test_stale_foreign_or_damaged_snapshots_send_the_client_to_the_backend(private):
    env, mdir = private
    be = FakeBackend()
    _publish(mdir, be, T - 6)                          # three intervals old
    _status(env, be)
    assert be.calls["snapshot"] == 1
    be2 = FakeBackend()
    _publish(mdir, be2, T - 1, fingerprint="other-gpus")
    _status(env, be2)
    assert be2.calls["snapshot"] == 1
    be3 = FakeBackend()
    (mdir / sf.SNAPSHOT_FILE).write_bytes(b'{"schema": "gpubk.snapshot.v1", "gpus": [')
    st = _status(env, be3)
    assert be3.calls["snapshot"] == 1 and tuple(st.gpus[0].processes) == ()


def test_a_simulation_of_as_many_gpus_takes_the_monitors_snapshot(private):
    from bk.gpu.sim import CountBackend

    env, mdir = private
    _publish(mdir, FakeBackend(2), T - 1, fingerprint="nvml:driver")
    st = _status(env, CountBackend(2))
    assert [p.pid for p in st.gpus[0].processes] == [99]
    st4 = _status(env, CountBackend(4))
    assert st4.gpus[0].processes is None               # four simulated GPUs: not that snapshot


def test_the_broker_refresher_reads_the_snapshot(private):
    from bk.broker.handlers import Latest
    from bk.service.telemetry import Telemetry

    env, mdir = private
    be = FakeBackend()
    clock = Clock(T)
    tel = Telemetry(lambda: be, clock=clock, monitor=(str(mdir), os.geteuid()))
    latest = Latest(tel)
    _publish(mdir, be, T - 1)
    latest.refresh()
    assert be.calls["snapshot"] == 0 and latest.current().snapshot().gpus[0].processes[0].pid == 99
    clock.t += 30                                   # the monitor stopped publishing
    latest.refresh()
    assert be.calls["snapshot"] == 1


def test_status_json_reports_the_heartbeat(private):
    env, mdir = private
    be = FakeBackend()
    m = daemon.Monitor(be, Ledger(), str(mdir), clock=Clock(T - 1), log=lambda line: None)
    m.step()
    mon = _status(env, be).to_json()["monitor"]
    assert mon["state"] == "running" and mon["pid"] == os.getpid() and mon["age_s"] == 1
    assert mon["interval_s"] == 2.0 and mon["updated_at"] == "2027-01-15T07:59:59Z"
    assert be.calls["snapshot"] == 1                # the monitor's one look; the status took none
    assert _status(env, be, now=T + 60).to_json()["monitor"]["state"] == "stale"


# ------------------------------------------------------------- bk m --once / status in-process

def test_once_writes_nothing(private, monkeypatch, capsys):
    from bk.cli import app as cli_app

    env, mdir = private
    sim = Path(env["HOME"]) / "sim.json"
    sim.write_text(json.dumps({"gpus": [{"name": "H100", "mem_total_mib": 81559, "util": 3, "processes": [
        {"pid": 4242, "uid": 1000, "user": "ada", "label": "python", "mem_mib": 4000}]}]}))
    env = {**env, "BK_GPU_SIM_FILE": str(sim)}
    code = cli_app.run(["m", "--once", "--json"], env)
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ok"] and out["command"] == "monitor"
    data = out["data"]
    assert data["status"] == "running" and data["source"] == "sim-file"
    proc = data["gpus"][0]["processes"][0]
    assert proc["pid"] == 4242 and proc["attribution"]["state"] == "unreserved"
    assert not Path(env["BK_DATA_DIR"]).exists()
    assert cli_app.run(["m", "--once"], env) == 0
    text = capsys.readouterr().out
    assert "4242" in text and "unreserved" in text and "H100" in text
    assert cli_app.run(["m", "status", "--json"], env) == 0
    assert json.loads(capsys.readouterr().out)["data"]["state"] == "absent"


def test_a_bug_in_a_step_is_recorded_and_the_next_step_runs(tmp_path):
    m, clock = make(tmp_path)
    real = m.ledger
    m.ledger = lambda: 1 / 0                   # not a BkError: a surprise
    assert m.safe_step() is None
    hb = state(m, clock.t)
    assert hb.state == "degraded" and "ZeroDivisionError" in hb.detail
    m.ledger = real
    clock.t += 2
    assert m.safe_step() is not None and state(m, clock.t).state == "running"


# ------------------------------------------------------------- the built archive

def test_pyz_status_ignores_a_damaged_or_partial_snapshot(pyz, tmp_path):
    """Issue 30, item 14, as a user meets it: a monitor file whose readings
    are out of range, or that names 2 of the 4 GPUs, is not shown."""
    import subprocess
    import sys

    from bk.core.models import parse_iso
    from bk.gpu.sim import FileBackend

    sim = tmp_path / "sim.json"
    sim.write_text(json.dumps({"gpus": [{"name": "H100", "mem_total_mib": 81559, "mem_used_mib": 1024,
                                         "util": 7, "processes": []} for _ in range(4)]}))
    now_iso = "2026-07-13T10:41:30Z"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update(BK_DATA_DIR=str(tmp_path / "data"), BK_GPU_SIM_FILE=str(sim), BK_NOW=now_iso, TZ="UTC",
               HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"), NO_COLOR="1")

    def status() -> dict:
        p = subprocess.run([sys.executable, str(pyz), "st", "--json"], env=env, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["data"]

    be = FileBackend(str(sim))
    mdir = tmp_path / "data" / "monitor"
    (tmp_path / "data").mkdir(mode=0o700)
    full = be.snapshot(parse_iso(now_iso) - 1)
    full.gpus[0].util = 55                                   # what the monitor saw: believed
    sf.write_snapshot(str(mdir), full, interval_s=2.0, inventory_fingerprint=be.fingerprint())
    assert [g["util"] for g in status()["gpus"]] == [55, 7, 7, 7]
    for damage in ("util", "mem", "pid", "two of four"):
        snap = be.snapshot(parse_iso(now_iso) - 1)
        gpus = list(snap.gpus)
        if damage == "util":
            gpus[0].util = 10 ** 9
        elif damage == "mem":
            gpus[1].mem_used_mib = 10 ** 30
        elif damage == "pid":
            gpus[2].processes = [GpuProcess(-1, mem_mib=5, uid=4321, user="mallory")]
        else:
            gpus = gpus[:2]
            gpus[0].util = 55
        sf.write_snapshot(str(mdir), Snapshot(snap.taken_at, snap.source, tuple(gpus), snap.gaps, snap.simulated),
                          interval_s=2.0, inventory_fingerprint=be.fingerprint())
        got = status()
        assert [(g["index"], g["util"], g["mem_used_mib"], g["processes"]) for g in got["gpus"]] == [
            (i, 7, 1024, []) for i in range(4)], damage


def test_a_cached_inventory_that_is_out_of_date_is_looked_at_once_again(private):
    """The cache says four GPUs, the backend and the monitor now see two (a
    GPU gone within the boot): one look settles it, and the cache learns."""
    env, mdir = private
    _status(env, FakeBackend(4))                          # cached: four
    _publish(mdir, FakeBackend(2), T - 1)
    be = FakeBackend(2)
    st = _status(env, be)
    assert be.calls["inventory"] == 1 and be.calls["snapshot"] == 0
    assert [p.pid for p in st.gpus[0].processes] == [99]
    be2 = FakeBackend(2)
    assert _app(env, be2).telemetry.inventory().count == 2     # the cache learnt it
    _status(env, be2)
    assert be2.calls["inventory"] == 0 and be2.calls["snapshot"] == 0
