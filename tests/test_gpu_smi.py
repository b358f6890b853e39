"""The nvidia-smi fallback against a fake ``nvidia-smi`` on PATH: a shell
script that answers as the real tool does (or fails, hangs, prints
garbage), chosen by FAKE_SMI_MODE, and records the arguments it was given.
Real subprocesses, real timeouts (short ones), no mocks."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bk.gpu import open_backend
from bk.gpu.smi import QUERY, SmiBackend, SmiError, parse, run_query

NORMAL = """0, GPU-aaaaaaaa-0000-0000-0000-000000000000, NVIDIA H100 80GB HBM3, 81559, 10240, 37, 45
1, GPU-bbbbbbbb-0000-0000-0000-000000000001, NVIDIA A100-SXM4-40GB, 40960, 0, 0, 30
"""
NA = """0, GPU-aaaaaaaa-0000-0000-0000-000000000000, NVIDIA H100 80GB HBM3, 81559, [N/A], [Not Supported], [N/A]
1, [N/A], Tesla K80, 11441, 11, 3, N/A
"""

FAKE = """#!/bin/sh
echo "$@" >> "$FAKE_SMI_LOG"
case "$FAKE_SMI_MODE" in
  normal) cat <<'EOF'
{normal}EOF
  ;;
  na) cat <<'EOF'
{na}EOF
  ;;
  fail) echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." ; exit 9 ;;
  hang) exec sleep 30 ;;
  garbage) echo "Segmentation fault? <html>"; echo "x, y" ;;
  flood) yes "0, GPU-a, name, 1, 1, 1, 1" ;;
  empty) ;;
esac
"""


@pytest.fixture
def smi(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "nvidia-smi"
    exe.write_text(FAKE.format(normal=NORMAL, na=NA))
    exe.chmod(0o755)
    log = tmp_path / "argv.log"
    monkeypatch.setenv("FAKE_SMI_LOG", str(log))
    monkeypatch.setenv("FAKE_SMI_MODE", "normal")

    class Smi:
        path = str(exe)
        bin = str(bindir)
        argv_log = log

        def mode(self, m):
            monkeypatch.setenv("FAKE_SMI_MODE", m)
    return Smi()


def test_normal_readings(smi):
    b = SmiBackend(exe=smi.path)
    s = b.snapshot(100)
    assert s.source == "nvidia-smi" and not s.simulated
    assert [(g.index, g.uuid, g.name, g.mem_total_mib, g.mem_used_mib, g.util, g.temperature) for g in s.gpus] == [
        (0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", "NVIDIA H100 80GB HBM3", 81559, 10240, 37, 45),
        (1, "GPU-bbbbbbbb-0000-0000-0000-000000000001", "NVIDIA A100-SXM4-40GB", 40960, 0, 0, 30)]
    # No process list in this form: a gap and None, never "no processes".
    assert all(g.processes is None for g in s.gpus)
    assert s.gaps == ("processes",)
    assert "processes" not in s.capabilities and "utilisation" in s.capabilities
    assert s.describe() == "telemetry: nvidia-smi; no process list"
    assert smi.argv_log.read_text().split() == [f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"]
    inv = b.inventory()
    assert inv.count == 2 and inv.reason is None and not inv.simulated


def test_na_and_not_supported_are_unknown(smi):
    smi.mode("na")
    s = SmiBackend(exe=smi.path).snapshot(0)
    g0, g1 = s.gpus
    assert (g0.mem_total_mib, g0.mem_used_mib, g0.util, g0.temperature) == (81559, None, None, None)
    assert g1.uuid == "smi-index-1" and g1.temperature is None and g1.util == 3
    assert set(s.gaps) == {"processes", "memory", "utilisation", "temperature", "uuid"}


@pytest.mark.parametrize("mode,why", [("fail", "exit status 9"), ("garbage", "expected 7 fields"),
                                      ("empty", "no GPUs listed"), ("flood", "bytes of output")])
def test_a_failing_tool_is_a_reported_simulation(smi, mode, why):
    smi.mode(mode)
    b = SmiBackend(3, exe=smi.path)
    s = b.snapshot(0)
    assert s.simulated and s.source == "sim-count" and len(s.gpus) == 3
    assert s.reason.startswith("nvidia-smi did not answer") and why in s.reason
    assert b.reason == s.reason and b.name == "sim-count"


def test_a_hung_tool_is_killed_at_the_timeout(smi):
    smi.mode("hang")
    t0 = time.monotonic()
    with pytest.raises(SmiError, match="no answer within 0.3 s"):
        run_query(smi.path, timeout_s=0.3)
    assert time.monotonic() - t0 < 10      # generous: it is killed, not waited for (30 s)


def test_back_off_after_a_failure_then_recover(smi):
    clock = [0.0]
    b = SmiBackend(2, exe=smi.path, clock=lambda: clock[0], retry_s=5)
    smi.mode("fail")
    assert b.snapshot(0).simulated
    smi.mode("normal")
    calls = len(smi.argv_log.read_text().splitlines())
    assert b.snapshot(1).simulated                       # within the back-off: not run again
    assert len(smi.argv_log.read_text().splitlines()) == calls
    clock[0] = 6
    s = b.snapshot(2)
    assert not s.simulated and s.source == "nvidia-smi" and b.reason is None
    # Known GPUs, then the tool fails: the GPUs stay, their readings become unknown.
    smi.mode("fail")
    clock[0] = 20
    s = b.snapshot(3)
    assert s.source == "nvidia-smi" and len(s.gpus) == 2 and all(g.util is None for g in s.gpus)
    assert "utilisation" in s.gaps


def test_parse_keeps_a_name_with_a_comma():
    (g,) = parse("0, GPU-x, Weird, GPU, 100, 1, 2, 3\n")
    assert g.name == "Weird, GPU" and g.mem_total_mib == 100 and g.temperature == 3


def test_not_on_path_is_an_error(tmp_path):
    with pytest.raises(SmiError):
        run_query(str(tmp_path / "missing"))


# -- the choice of backend ----------------------------------------------------

def driver_tree(root: Path) -> Path:
    (root / "driver/nvidia").mkdir(parents=True)
    (root / "driver/nvidia/version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  999.1\n")
    (root / "sys/kernel/random").mkdir(parents=True)
    (root / "sys/kernel/random/boot_id").write_text("0b0e0c0d-0000-0000-0000-000000000000\n")
    return root


def test_chain_without_pynvml_takes_nvidia_smi(smi, tmp_path, monkeypatch):
    import bk.gpu as gpu

    monkeypatch.setattr(gpu, "_pynvml_installed", lambda: False)
    proc = driver_tree(tmp_path / "proc")
    b = open_backend({"PATH": smi.bin}, proc_root=str(proc))
    assert isinstance(b, SmiBackend) and b.reason == "pynvml is not installed"
    s = b.snapshot(0)
    assert s.source == "nvidia-smi" and s.reason == "pynvml is not installed"
    assert b.fingerprint().startswith("smi:")
    # No driver loaded: the tool cannot answer, so it is not even run.
    b = open_backend({"PATH": smi.bin}, proc_root=str(tmp_path / "none"))
    assert b.name == "sim-count" and b.reason == gpu.NO_DRIVER_LOADED
    assert not smi.argv_log.exists() or len(smi.argv_log.read_text().splitlines()) == 1
    # A driver, but neither pynvml nor the tool: the simulation says why.
    b = open_backend({"PATH": str(tmp_path / "empty")}, proc_root=str(proc))
    assert b.name == "sim-count" and "pynvml is not installed and nvidia-smi is not on PATH" in b.reason


def test_chain_nvml_that_does_not_answer_falls_back_to_nvidia_smi(smi, tmp_path, monkeypatch):
    """A driver version file and pynvml, but no libnvidia-ml that answers
    (LD_LIBRARY_PATH points nowhere useful on this machine): NVML fails at
    the first question and nvidia-smi stands in, with both reasons said."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    import ctypes.util

    if ctypes.util.find_library("nvidia-ml") or os.path.exists("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"):
        pytest.skip("a real libnvidia-ml is installed here")
    from bk.gpu.nvml import NO_DRIVER, NvmlBackend

    proc = driver_tree(tmp_path / "proc")
    b = open_backend({"PATH": smi.bin}, proc_root=str(proc))
    assert isinstance(b, NvmlBackend)
    s = b.snapshot(0)
    assert s.source == "nvidia-smi" and not s.simulated and s.reason == NO_DRIVER
    assert b.name == "nvidia-smi" and b.reason == NO_DRIVER
    smi.mode("fail")
    b = open_backend({"PATH": smi.bin}, proc_root=str(proc))
    s = b.snapshot(0)
    assert s.simulated and s.reason.startswith(NO_DRIVER + "; nvidia-smi did not answer")
    # Without nvidia-smi on PATH: the simulation, with NVML's reason alone.
    s = open_backend({"PATH": str(tmp_path / "empty")}, proc_root=str(proc)).snapshot(0)
    assert s.simulated and s.reason == NO_DRIVER
