"""The pure rules of scheduled commands (bk.core.jobs): the ledger's safe
summary, the environment a job gets, the launch guard, the stop times."""

from __future__ import annotations

from bk.core import jobs as J
from bk.core.models import EXCLUSIVE, SHARED, GpuInfo, GpuProcess, Reservation
from bk.core.telemetry import Snapshot

T = 1_800_000_000


def res(mode=SHARED, gpus=(0,), uid=1000, mem=None, start=T, end=T + 3600, rid="r1"):
    return Reservation(id=rid, uid=uid, user=f"u{uid}", mode=mode, gpus=tuple(gpus), share=1,
                       start=start, end=end, created=T - 60, mem_mib=mem)


def snap(*gpus):
    return Snapshot(T, "test", tuple(gpus))


def test_summary_never_holds_arguments():
    assert J.summary_of(["/opt/venv/bin/python3", "train.py", "--token", "s3cr3t"]) == "python3 +3 args"
    assert J.summary_of(["./run.sh"]) == "run.sh"
    assert J.summary_of(["a b\x1b[2J"]) == "a_b__2J"       # nothing that can steer a terminal
    assert J.summary_of(["x" * 100, "y"]) == "x" * 32 + " +1 arg"


def test_env_uses_uuids_on_real_gpus_and_indices_in_simulation():
    uuids = {0: "GPU-aaa", 1: "GPU-bbb", 2: "GPU-ccc"}
    base = {"HOME": "/h", "CUDA_VISIBLE_DEVICES": "7", "BK_JOB_MARKER": "forged", "PATH": "/old"}
    real = J.job_env(base, reservation_id="rid", gpus=(2, 0), uuids=uuids, simulated=False,
                     path="/usr/bin:/bin", job_id="ab" * 16)
    assert real["CUDA_VISIBLE_DEVICES"] == "GPU-ccc,GPU-aaa"
    assert real["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert real["BK_RESERVATION_ID"] == "rid" and real["BK_RESERVED_GPUS"] == "2,0"
    assert real["PATH"] == "/usr/bin:/bin" and real["HOME"] == "/h"
    assert real["BK_JOB_MARKER"] == "gpubk-job:" + "ab" * 16
    sim = J.job_env(base, reservation_id="rid", gpus=(1,), uuids=uuids, simulated=True)
    assert sim["CUDA_VISIBLE_DEVICES"] == "1" and "BK_JOB_MARKER" not in sim and sim["PATH"] == "/old"
    assert J.marker_entry("ab" * 16) == b"BK_JOB_MARKER=gpubk-job:" + b"ab" * 16


def test_worker_passes_on_only_a_known_environment():
    env = {"HOME": "/h", "LC_ALL": "C", "AWS_SECRET_ACCESS_KEY": "x", "BK_DATA_DIR": "/d", "PS1": "$"}
    assert J.worker_base_env(env) == {"HOME": "/h", "LC_ALL": "C", "BK_DATA_DIR": "/d"}


def test_stop_times():
    assert J.stop_times(T + 3600, 5) == (T + 3595, T + 3600)
    assert J.stop_times(T + 3, 5, start=T) == (T, T + 3)        # never TERM before the start


def test_guard_exclusive_waits_for_anyone_else():
    others = GpuProcess(pid=9, uid=2000, user="bob", label="python", mem_mib=100)
    mine = GpuProcess(pid=8, uid=1000, user="u1000", label="python")
    xorg = GpuProcess(pid=7, uid=0, user="root", label="Xorg")
    r = res(EXCLUSIVE)
    bob_booked = res(uid=2000, rid="r2")
    why = J.launch_blocker(snap(GpuInfo(0, "u", "g", processes=[others, xorg])), [r, bob_booked], r, T)
    assert why and "GPU 0" in why and "bob" in why
    assert J.launch_blocker(snap(GpuInfo(0, "u", "g", processes=[mine, xorg])), [r], r, T) is None


def test_guard_shared_waits_for_unreserved_use_or_missing_memory():
    bob = GpuProcess(pid=9, uid=2000, user="bob", label="python", mem_mib=100)
    r = res(SHARED, mem=8000)
    free = GpuInfo(0, "u", "g", mem_total_mib=81559, mem_used_mib=1000, processes=[])
    assert J.launch_blocker(snap(free), [r], r, T) is None
    assert "bob" in J.launch_blocker(snap(GpuInfo(0, "u", "g", processes=[bob])), [r], r, T)
    # bob shares the GPU with a booking of his own: that is what sharing means
    assert J.launch_blocker(snap(GpuInfo(0, "u", "g", processes=[bob])), [r, res(uid=2000, rid="b")], r, T) is None
    full = GpuInfo(0, "u", "g", mem_total_mib=10000, mem_used_mib=5000, processes=[])
    assert "5000 MiB free" in J.launch_blocker(snap(full), [r], r, T)
    # A source that cannot list processes blocks nothing (it cannot see)
    assert J.launch_blocker(snap(GpuInfo(0, "u", "g")), [r], r, T) is None


def test_end_states_and_transitions():
    assert J.exit_state(0, stopped_for=None) == J.SUCCEEDED
    assert J.exit_state(3, stopped_for=None) == J.FAILED
    assert J.exit_state(-15, stopped_for="end") == J.TIMED_OUT
    assert J.exit_state(-15, stopped_for="cancel") == J.CANCELLED
    assert J.shell_status(-9) == 137 and J.shell_status(4) == 4
    assert set(J.STATES) == set(J.NEXT) | J.TERMINAL
    for old, new in J.NEXT.items():
        assert new <= set(J.STATES), old
    assert J.RUNNING not in J.NEXT[J.RUNNING]                     # a job starts once
