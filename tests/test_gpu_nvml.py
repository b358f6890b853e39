"""The NVML backend through the real ``nvidia-ml-py`` bindings, against a
small fake ``libnvidia-ml.so.1`` (tests/helpers_nvml.py) built with the C
compiler and found through LD_LIBRARY_PATH in a subprocess, so that the
bindings' own ctypes calls are exercised.  The fake lib reads FAKE_NVML_MODE
on every call, so a test can lose a GPU mid-run and bring it back;
``fake_init_calls`` counts ``nvmlInitWithFlags``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import helpers_nvml
import pytest

from bk import gpu
from bk.gpu import open_backend

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
CC = helpers_nvml.CC


@pytest.fixture(scope="module")
def libdir(tmp_path_factory):
    if CC is None:
        pytest.skip("no C compiler")
    return helpers_nvml.build(tmp_path_factory.mktemp("fakenvml"))


@pytest.fixture
def proc_root(tmp_path):
    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/random").mkdir(parents=True)
    (tmp_path / "proc/driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  999.1  Fake\nGCC version: x\n")
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text("1234-boot\n")
    return tmp_path / "proc"


HEAD = """
import ctypes, json, os, sys
from bk.gpu import open_backend
from bk.gpu.nvml import NvmlBackend
t = [1000.0]
def snap(b):
    s = b.snapshot(7)
    return {"source": s.source, "gaps": list(s.gaps), "simulated": s.simulated,
            "gpus": [{"uuid": g.uuid, "name": g.name, "total": g.mem_total_mib, "used": g.mem_used_mib,
                      "util": g.util, "temp": g.temperature,
                      "procs": None if g.processes is None else [[p.pid, p.mem_mib, p.sm] for p in g.processes]}
                     for g in s.gpus]}
def inits():
    return ctypes.CDLL("libnvidia-ml.so.1").fake_init_calls()
out = {}
"""


def run(libdir, script: str, mode: str = "") -> dict:
    env = dict(os.environ, LD_LIBRARY_PATH=str(libdir), FAKE_NVML_MODE=mode, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", HEAD + script + "\nprint(json.dumps(out))"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_normal_readings(libdir):
    out = run(libdir, """
b = NvmlBackend(clock=lambda: t[0])
b.fingerprint()
out["fp_inits"] = inits()
out["inv"] = b.inventory().to_dict()
out["s1"] = snap(b)
out["s2"] = snap(b)
out["inits"] = inits()
out["name"] = [b.name, b.simulated, b.reason]
""")
    assert out["fp_inits"] == 0
    assert out["inv"]["source"] == "nvml" and out["inv"]["simulated"] is False
    assert [g["mem_total_mib"] for g in out["inv"]["gpus"]] == [81559, 40960]
    s = out["s1"]
    assert s["source"] == "nvml" and not s["simulated"]
    g0, g1 = s["gpus"]
    assert g0["uuid"].startswith("GPU-aaaa") and g0["name"] == "NVIDIA H100 80GB HBM3"
    assert (g0["used"], g0["util"], g0["temp"]) == (10240, 37, 45)
    # compute and graphics merged by pid, memory counted once; the latest SM sample wins
    assert g0["procs"] == [[1001, 4096, 30], [1002, 2048, 5], [1003, 512, None]]
    # MIG is said in the name and as a gap; no processes is an empty list, not unknown
    assert g1["name"] == "NVIDIA A100-SXM4-40GB (MIG)" and g1["procs"] == [] and g1["util"] == 0
    assert s["gaps"] == ["mig"]
    # the next look asks only for samples since the last one: none yet, SM unknown but no gap
    assert out["s2"]["gpus"][0]["procs"] == [[1001, 4096, None], [1002, 2048, None], [1003, 512, None]]
    assert out["s2"]["gaps"] == ["mig"]
    assert out["inits"] == 1 and out["name"] == ["nvml", False, None]


def test_unsupported_calls_are_gaps(libdir):
    out = run(libdir, "b = NvmlBackend(clock=lambda: t[0])\nout['s'] = snap(b)\nout['inits'] = inits()",
              mode="nosm,notemp,nographics,nouuid")
    s = out["s"]
    assert set(s["gaps"]) == {"process_sm", "temperature", "uuid", "mig"}
    g0, g1 = s["gpus"]
    assert g0["temp"] is None and g0["util"] == 37
    assert g0["procs"] == [[1001, 4096, None], [1002, 2048, None]]   # compute only, SM unknown
    assert g1["uuid"] == "nvml-index-1"
    assert out["inits"] == 1        # an unsupported call is no reason to rebuild


def test_gpu_lost_mid_run_backs_off_and_recovers(libdir):
    out = run(libdir, """
b = NvmlBackend(clock=lambda: t[0], retry_s=5)
out["ok"] = snap(b)
os.environ["FAKE_NVML_MODE"] = "lost"
t[0] += 10
out["lost"] = snap(b)          # GPU 1 lost during this look
t[0] += 1
out["soon"] = snap(b)          # within the back-off: no rebuild yet
out["inits_soon"] = inits()
os.environ["FAKE_NVML_MODE"] = ""
t[0] += 5
out["back"] = snap(b)          # due: shutdown, init, handles rebuilt
out["inits_back"] = inits()
out["inv"] = b.inventory().count
""")
    assert out["ok"]["gaps"] == ["mig"]
    lost = out["lost"]
    assert "nvml" in lost["gaps"] and "processes" in lost["gaps"]
    assert lost["gpus"][0]["util"] == 37                      # the other GPU still read
    assert lost["gpus"][1]["util"] is None and lost["gpus"][1]["procs"] is None
    assert lost["gpus"][1]["uuid"].startswith("GPU-bbbb")     # still the same GPU
    assert out["inits_soon"] == 1 and out["soon"]["gpus"][1]["util"] is None
    assert out["inits_back"] == 2
    assert out["back"]["gaps"] == ["mig"] and out["back"]["gpus"][1]["procs"] == []
    assert out["inv"] == 2


def test_driver_that_fails_to_initialise(libdir):
    out = run(libdir, """
b = NvmlBackend(3, clock=lambda: t[0], retry_s=5)
out["inv"] = b.inventory().to_dict()
out["s"] = snap(b)
out["name"] = [b.name, b.simulated, b.reason]
out["inits"] = inits()
os.environ["FAKE_NVML_MODE"] = ""
t[0] += 6
out["later"] = snap(b)
out["later_name"] = [b.name, b.simulated]
""", mode="noinit")
    assert out["inv"]["source"] == "sim-count" and len(out["inv"]["gpus"]) == 3
    assert out["inv"]["reason"] == "no NVML driver answered"
    assert out["s"]["simulated"] and "processes" in out["s"]["gaps"]
    assert out["name"] == ["sim-count", True, "no NVML driver answered"]
    assert out["inits"] == 1        # the inventory and the snapshot did not each retry
    assert out["later"]["source"] == "nvml" and out["later_name"] == ["nvml", False]


def test_open_backend_chooses_nvml_only_with_a_driver(libdir, proc_root, tmp_path):
    out = run(libdir, f"""
b = open_backend({{"PATH": {str(tmp_path)!r}}}, proc_root={str(proc_root)!r})
out["type"] = type(b).__name__
out["fp"] = b.fingerprint()
out["pynvml_before"] = "pynvml" in sys.modules
out["inits_before"] = inits()
out["src"] = b.inventory().source
none = open_backend({{"PATH": {str(tmp_path)!r}}}, proc_root={str(tmp_path / "nothing")!r})
out["none"] = [none.name, none.reason]
out["count"] = open_backend({{"BK_GPU_COUNT": "2"}}, proc_root={str(proc_root)!r}).name
""")
    assert out["type"] == "NvmlBackend"
    assert out["fp"] == "nvml:1234-boot:NVRM version: NVIDIA UNIX x86_64 Kernel Module 999.1 Fake"
    assert out["pynvml_before"] is False and out["inits_before"] == 0   # opening and fingerprint: no NVML
    assert out["src"] == "nvml"
    assert out["none"] == ["sim-count", gpu.NO_DRIVER_LOADED]
    assert out["count"] == "sim-count"


def test_fingerprint_none_without_driver(tmp_path):
    from bk.gpu.nvml import NvmlBackend

    assert NvmlBackend(proc_root=str(tmp_path)).fingerprint() is None
    # no driver and no nvidia-smi on PATH
    assert open_backend({"PATH": str(tmp_path)}, proc_root=str(tmp_path)).name == "sim-count"


def test_processes_are_filled_from_proc(libdir, proc_root):
    """Each NVML process gets its owner, label, start and container from
    /proc under the backend's root; one /proc cannot read stays unknown."""
    from test_attribution import BTIME, HEX, fake_proc

    fake_proc(proc_root, 1001, uid=0, argv=("python3", "serve.py", "--key", "k"),
              cgroup=f"0::/system.slice/docker-{HEX}.scope\n", start_ticks=100 * os.sysconf("SC_CLK_TCK"))
    fake_proc(proc_root, 1003, uid=os.getuid(), argv=("Xorg", ":0"), comm="Xorg")
    out = run(libdir, f"""
b = NvmlBackend(proc_root={str(proc_root)!r})
s = b.snapshot(7)
out["procs"] = [[p.pid, p.uid, p.label, p.since, p.container] for p in s.gpus[0].processes]
out["caps"] = list(s.capabilities)
""")
    assert out["procs"] == [[1001, 0, "python3 serve.py", BTIME + 100, "docker:3f2a9c1b12ab"],
                            [1002, None, None, None, None],
                            [1003, os.getuid(), "Xorg", BTIME + 500, None]]
    assert "processes" in out["caps"] and "process_owner" in out["caps"]


POWER = """
def power(b):
    return [[g.power_mw, g.power_limit_mw, g.energy_mj] for g in b.snapshot(7).gpus]
"""


def test_power_limit_and_energy_counter(libdir):
    """Power draw, the enforced limit and the total-energy counter are read
    per look through the one gateway; a device that cannot say has None
    (GPU 1 has no power reading nor counter), which is not a gap."""
    out = run(libdir, POWER + """
b = NvmlBackend(clock=lambda: t[0])
out["first"] = power(b)
os.environ["FAKE_NVML_ENERGY"] = "123500000"
out["second"] = power(b)
out["gaps"] = list(b.snapshot(8).gaps)
out["inits"] = inits()
""")
    assert out["first"] == [[71500, 700000, 123456789], [None, 400000, None]]
    assert out["second"][0][2] == 123500000          # read again at every look
    assert out["gaps"] == ["mig"] and out["inits"] == 1


def test_power_unsupported_everywhere_is_none_not_a_rebuild(libdir):
    out = run(libdir, POWER + "b = NvmlBackend(clock=lambda: t[0])\nout['p'] = power(b)\nout['i'] = inits()",
              mode="nopower,noenergy")
    assert out["p"] == [[None, None, None], [None, None, None]] and out["i"] == 1


def test_state_file_world_and_highest_sm_between_looks(libdir, tmp_path):
    """The fake's file-driven world (the one the activity traces replay):
    processes, per-process SM samples since the last look (none: None), and
    the readings, changed between two looks."""
    state = tmp_path / "nvml.state"
    state.write_text(helpers_nvml.state_text(
        [{"util": 90, "mem_total": 81559, "mem_used": 9000, "temp": 50, "power": 350000, "limit": 700000,
          "energy": 1000, "ts": 10}, {"util": 0, "mem_total": 81559, "mem_used": 0, "power": 70000,
                                      "limit": 700000, "energy": 5000, "ts": 10}],
        [(0, 4242, 8000, 97), (0, 4243, 1000, -1)]))
    out = run(libdir, f"""
os.environ["FAKE_NVML_STATE"] = {str(state)!r}
b = NvmlBackend(clock=lambda: t[0])
out["a"] = snap(b)
out["pa"] = [[g.power_mw, g.power_limit_mw, g.energy_mj] for g in b.snapshot(8).gpus]
open({str(state)!r}, "w").write({helpers_nvml.state_text(
        [{"util": 0, "mem_total": 81559, "mem_used": 9000, "power": 72000, "limit": 700000, "energy": 2000,
          "ts": 20}, {"util": 0, "mem_total": 81559, "mem_used": 0, "ts": 20}], [(0, 4242, 8000, 0)])!r})
out["b"] = snap(b)
""")
    a = out["a"]
    assert [g["procs"] for g in a["gpus"]] == [[[4242, 8000, 97], [4243, 1000, None]], []]
    assert a["gpus"][0]["temp"] == 50 and a["gpus"][1]["temp"] is None and "temperature" in a["gaps"]
    assert out["pa"] == [[350000, 700000, 1000], [70000, 700000, 5000]]
    # the second look: the sample since the last look says 0 %; the other process is gone
    assert [g["procs"] for g in out["b"]["gpus"]] == [[[4242, 8000, 0]], []]


def test_the_monitor_records_energy_from_the_counter(libdir, tmp_path):
    """Through the real bindings: the minute record's energy is the
    counter's difference, all of it to the exclusive booking, nothing for
    the first look (no earlier reading) and nothing across a reset."""
    out = run(libdir, f"MON = {str(tmp_path / 'mon')!r}\n" + """
from bk.core.models import Reservation
from bk.core.usage import Folder
from bk.monitor.daemon import Monitor
class L:
    policy = {"max_shared_users": 2}
    reservations = [Reservation(id="x1", uid=1000, user="ada", gpus=(0,), start=0, end=10**10, mode="exclusive",
                                share=2, created=0)]
recs = []
class U:
    def append(self, rs): recs.extend(rs)
now = [6000]
m = Monitor(NvmlBackend(clock=lambda: t[0]), lambda: L(), MON, clock=lambda: now[0], interval_s=2.0,
            folder=Folder(60, 2), usage=U(), log=lambda s: None)
for e in (1000000, 1140000, 1280000, 500, 140500):      # 70 W for 2 s = 140 J; then a reset
    os.environ["FAKE_NVML_ENERGY"] = str(e)
    m.step()
    now[0] += 2
m.finish()
r = [x for x in recs if x.gpu == 0][0]
out["rec"] = [r.energy_mj, r.energy_s, r.energy_other_mj, [(u.reservation, u.energy_mj) for u in r.uses]]
out["gpu1"] = [(x.energy_mj, x.energy_s) for x in recs if x.gpu == 1]
""")
    assert out["rec"] == [140000 * 3, 6, 0, [["x1", 420000]]]
    assert out["gpu1"] == [[None, 0]]                      # no counter on that device: unknown, not 0
