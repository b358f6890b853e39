"""The NVML backend through the real ``nvidia-ml-py`` bindings, against a
small fake ``libnvidia-ml.so.1`` built here with the C compiler and found
through LD_LIBRARY_PATH in a subprocess, so that the bindings' own ctypes
calls are exercised.  The fake lib reads FAKE_NVML_MODE on every call, so a
test can lose a GPU mid-run and bring it back; ``fake_init_calls`` counts
``nvmlInitWithFlags``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bk import gpu
from bk.gpu import open_backend

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
CC = shutil.which("cc") or shutil.which("gcc")

FAKE = r"""
#include <stdlib.h>
#include <string.h>
typedef struct { unsigned long long total, free, used; } mem_t;
typedef struct { unsigned gpu, memory; } util_t;
typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } proc_t;
typedef struct { unsigned pid; unsigned long long ts; unsigned sm, mem, enc, dec; } sample_t;
#define MIB (1024ULL * 1024ULL)
static int devs[2];
static int inits = 0;
int fake_init_calls(void) { return inits; }
static const char *mode(void) { const char *m = getenv("FAKE_NVML_MODE"); return m ? m : ""; }
static int has(const char *w) { return strstr(mode(), w) != NULL; }
static int idx(void *h) { return (int *)h - devs; }
/* GPU 1 is lost in mode "lost" */
static int bad(void *h) { return has("lost") && idx(h) == 1; }
int nvmlInitWithFlags(unsigned f) { inits++; return has("noinit") ? 9 : 0; }
int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { return "fake error"; }
int nvmlSystemGetDriverVersion(char *b, unsigned n) { strncpy(b, "999.1", n); return 0; }
int nvmlDeviceGetCount_v2(unsigned *c) { *c = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) { if (i > 1) return 2; *h = &devs[i]; return 0; }
int nvmlDeviceGetUUID(void *h, char *b, unsigned n) {
  if (bad(h)) return 15;
  if (has("nouuid") && idx(h) == 1) return 3;
  strncpy(b, idx(h) ? "GPU-bbbbbbbb-0000-0000-0000-000000000001" : "GPU-aaaaaaaa-0000-0000-0000-000000000000", n);
  return 0;
}
int nvmlDeviceGetName(void *h, char *b, unsigned n) {
  if (bad(h)) return 15;
  strncpy(b, idx(h) ? "NVIDIA A100-SXM4-40GB" : "NVIDIA H100 80GB HBM3", n); return 0;
}
int nvmlDeviceGetMemoryInfo(void *h, mem_t *m) {
  if (bad(h)) return 15;
  m->total = (idx(h) ? 40960ULL : 81559ULL) * MIB; m->used = (idx(h) ? 0ULL : 10240ULL) * MIB;
  m->free = m->total - m->used; return 0;
}
int nvmlDeviceGetUtilizationRates(void *h, util_t *u) {
  if (bad(h)) return 15;
  u->gpu = idx(h) ? 0 : 37; u->memory = 5; return 0;
}
int nvmlDeviceGetTemperature(void *h, int s, unsigned *t) {
  if (bad(h)) return 15;
  if (has("notemp")) return 3;
  *t = idx(h) ? 30 : 45; return 0;
}
static int procs(void *h, unsigned *c, proc_t *p, const proc_t *src, unsigned n) {
  if (bad(h)) return 15;
  if (idx(h) == 1) n = 0;
  if (n == 0) { *c = 0; return 0; }
  if (p == NULL || *c < n) { *c = n; return 7; }
  memcpy(p, src, n * sizeof(proc_t)); *c = n; return 0;
}
int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned *c, proc_t *p) {
  static const proc_t src[] = {{1001, 4096 * MIB, 0, 0}, {1002, 2048 * MIB, 0, 0}};
  return procs(h, c, p, src, 2);
}
int nvmlDeviceGetGraphicsRunningProcesses_v3(void *h, unsigned *c, proc_t *p) {
  if (has("nographics")) return 3;
  static const proc_t src[] = {{1001, 4096 * MIB, 0, 0}, {1003, 512 * MIB, 0, 0}};
  return procs(h, c, p, src, 2);
}
int nvmlDeviceGetProcessUtilization(void *h, sample_t *s, unsigned *c, unsigned long long since) {
  static const sample_t src[] = {{1001, 100, 10, 0, 0, 0}, {1001, 200, 30, 0, 0, 0}, {1002, 150, 5, 0, 0, 0}};
  if (bad(h)) return 15;
  if (has("nosm")) return 3;
  if (idx(h) == 1) return 6;
  unsigned n = 0, i;
  for (i = 0; i < 3; i++) if (src[i].ts > since) n++;
  if (n == 0) return 6;
  if (s == NULL || *c < n) { *c = n; return 7; }
  for (i = 0, n = 0; i < 3; i++) if (src[i].ts > since) s[n++] = src[i];
  *c = n; return 0;
}
int nvmlDeviceGetMigMode(void *h, unsigned *cur, unsigned *pend) {
  if (bad(h)) return 15;
  if (idx(h) == 0) return 3;
  *cur = 1; *pend = 1; return 0;
}
"""


@pytest.fixture(scope="module")
def libdir(tmp_path_factory):
    if CC is None:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("fakenvml")
    (d / "fake.c").write_text(FAKE)
    subprocess.run([CC, "-shared", "-fPIC", "-O1", "-Wl,-soname,libnvidia-ml.so.1", "-o",
                    str(d / "libnvidia-ml.so.1"), str(d / "fake.c")], check=True, capture_output=True)
    return d


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
