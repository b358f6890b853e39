"""The monitor's snapshot and heartbeat files (bk.store.snapshot): what is
written, what a reader believes, and the heartbeat's states on a fake clock."""

from __future__ import annotations

import json
import os
import stat

import pytest

from bk.core.models import GpuInfo, GpuProcess
from bk.core.record import fields
from bk.core.telemetry import Snapshot
from bk.store import snapshot as sf

T = 1_800_000_000


def snap(t: int = T, n: int = 2) -> Snapshot:
    gpus = []
    for i in range(n):
        procs = [GpuProcess(100 + i, mem_mib=512, sm=40, uid=1000, user="ada", label="python",
                            since=t - 60, container="docker:3f2a9c1b12ab", identity="verified")]
        gpus.append(GpuInfo(i, f"GPU-{i}", "H100", mem_total_mib=81559, mem_used_mib=600, util=33,
                            temperature=51, processes=procs))
    gpus.append(GpuInfo(n, f"GPU-{n}", "H100", mem_total_mib=81559))      # no process list
    return Snapshot(t, "sim-file", tuple(gpus), ("processes",), True)


@pytest.fixture
def d(tmp_path):
    return str(tmp_path / "monitor")


def test_round_trip_keeps_every_field(d):
    s = snap()
    sf.write_snapshot(d, s, interval_s=2.0, inventory_fingerprint="fp-1")
    got = sf.read_snapshot_file(d, T + 1)
    assert got is not None and got.fingerprint == "fp-1" and got.interval_s == 2.0
    assert got.pid == os.getpid()
    assert got.snapshot == s
    assert got.snapshot.gpus[2].processes is None          # "cannot tell" stays "cannot tell"
    assert sf.read_snapshot(d, T + 1) == s


def test_the_file_is_versioned_json_0644_with_every_process_field(d):
    sf.write_snapshot(d, snap(), interval_s=2.0, inventory_fingerprint="fp-1",
                      attributions={(0, 100): "ok"})
    path = os.path.join(d, sf.SNAPSHOT_FILE)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o755
    doc = json.loads(open(path).read())
    assert doc["schema"] == "gpubk.snapshot.v1"
    for key in ("taken_at", "source", "gaps", "simulated", "fingerprint", "interval_s"):
        assert key in doc
    proc = doc["gpus"][0]["processes"][0]
    assert {f.name for f in fields(GpuProcess)} <= set(proc)
    assert proc["container"] == "docker:3f2a9c1b12ab" and proc["since"] == T - 60
    assert proc["attribution"]["state"] == "ok"
    assert [n for n in os.listdir(d) if n.startswith(".")] == []    # no temp file left


def test_unknown_fields_from_a_newer_writer_are_ignored(d):
    sf.write_snapshot(d, snap(), interval_s=2.0, inventory_fingerprint=None)
    path = os.path.join(d, sf.SNAPSHOT_FILE)
    doc = json.loads(open(path).read())
    doc["gpus"][0]["fan_speed"] = 40
    doc["gpus"][0]["processes"][0]["cgroup"] = "x"
    doc["future"] = {"a": 1}
    open(path, "w").write(json.dumps(doc))
    assert sf.read_snapshot(d, T + 1) == snap()


@pytest.mark.parametrize("age, fresh", [(0, True), (5, True), (6, False), (60, False), (-5, False)])
def test_fresh_means_younger_than_three_intervals(d, age, fresh):
    sf.write_snapshot(d, snap(), interval_s=2.0, inventory_fingerprint=None)
    assert (sf.read_snapshot(d, T + age) is not None) is fresh
    assert sf.read_snapshot(d, T + age, max_age_s=100) is not None or age < 0


@pytest.mark.parametrize("content", [b"", b"{", b"[]", b'{"schema":"gpubk.snapshot.v1"}',
                                     b'{"schema":"other","gpus":[]}', b"\xff\xfe",
                                     b'{"schema":"gpubk.snapshot.v1","taken_at":"x","interval_s":2,'
                                     b'"source":"s","gpus":[]}',
                                     b'{"schema":"gpubk.snapshot.v1","taken_at":1,"interval_s":0,'
                                     b'"source":"s","gpus":[]}',
                                     b'{"schema":"gpubk.snapshot.v1","taken_at":1,"interval_s":2,'
                                     b'"source":"s","gpus":[{"index":"0","uuid":"u","name":"n"}]}'])
def test_damaged_files_are_a_miss_never_an_error(d, content):
    sf.write_snapshot(d, snap(), interval_s=2.0, inventory_fingerprint=None)
    open(os.path.join(d, sf.SNAPSHOT_FILE), "wb").write(content)
    assert sf.read_snapshot(d, T + 1) is None
    open(os.path.join(d, sf.HEARTBEAT_FILE), "wb").write(content)
    assert sf.read_heartbeat(d, T).state == "damaged"           # there, but not believed


def test_missing_directory_or_file(tmp_path):
    assert sf.read_snapshot(str(tmp_path / "nope"), T) is None
    assert sf.read_heartbeat(str(tmp_path / "nope"), T) == sf.ABSENT_HEARTBEAT
    os.mkdir(tmp_path / "empty")
    assert sf.read_snapshot(str(tmp_path / "empty"), T) is None


def test_a_link_or_a_writable_file_is_not_believed(d, tmp_path):
    sf.write_snapshot(d, snap(), interval_s=2.0, inventory_fingerprint=None)
    path = os.path.join(d, sf.SNAPSHOT_FILE)
    os.chmod(path, 0o666)
    assert sf.read_snapshot(d, T + 1) is None
    os.chmod(path, 0o644)
    os.rename(path, tmp_path / "elsewhere.json")
    os.symlink(tmp_path / "elsewhere.json", path)
    assert sf.read_snapshot(d, T + 1) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_snapshot_of_another_account_is_not_believed(d):
    sf.write_snapshot(d, snap(), interval_s=2.0, inventory_fingerprint=None)
    path = os.path.join(d, sf.SNAPSHOT_FILE)
    assert sf.read_snapshot(d, T + 1, owner=0) is not None
    os.chown(path, 4242, 4242)
    assert sf.read_snapshot(d, T + 1, owner=0) is None
    assert sf.read_snapshot(d, T + 1, owner=4242) is None        # the directory is still root's


# ------------------------------------------------------------- heartbeat states

def beat(status="running", updated=T, interval=2.0, detail=None, pid=4321):
    return sf.heartbeat_doc(status=status, pid=pid, started_at=T - 100, updated_at=updated,
                            interval_s=interval, detail=detail, samples=7)


@pytest.mark.parametrize("doc, now, alive, want", [
    (None, T, None, "absent"),
    (beat(), T, True, "running"),
    (beat(), T + 5, True, "running"),
    (beat(), T + 6, True, "stale"),           # no update for three intervals
    (beat(), T, False, "stale"),              # its process is gone
    (beat(), T, None, "running"),             # cannot tell: the clock decides
    (beat(), T - 10, True, "stale"),          # from the future: the clock stepped
    (beat("degraded", detail="nvml lost"), T + 1, True, "degraded"),
    (beat("degraded"), T + 100, True, "stale"),
    (beat("topology-mismatch"), T + 1, True, "topology-mismatch"),
    (beat("stopped"), T + 10**6, False, "stopped"),
])
def test_heartbeat_state(doc, now, alive, want):
    assert sf.heartbeat_state(doc, now, alive=alive) == want


def test_a_monitor_cannot_record_stale_or_absent():
    for s in ("stale", "absent", "busy"):
        with pytest.raises(ValueError):
            beat(s)


def test_read_heartbeat_reports_age_detail_and_json(d):
    sf.write_heartbeat(d, beat("degraded", detail="the driver failed during this look"))
    hb = sf.read_heartbeat(d, T + 3, alive=lambda pid: True)
    assert (hb.state, hb.pid, hb.age_s, hb.samples) == ("degraded", 4321, 3, 7)
    j = hb.to_json()
    assert j == {"state": "degraded", "pid": 4321, "updated_at": "2027-01-15T08:00:00Z",
                 "started_at": "2027-01-15T07:58:20Z", "interval_s": 2.0, "age_s": 3,
                 "detail": "the driver failed during this look", "samples": 7}
    gone = sf.read_heartbeat(d, T + 3, alive=lambda pid: False)
    assert gone.state == "stale" and "process 4321 is gone" in gone.detail
    late = sf.read_heartbeat(d, T + 60, alive=lambda pid: True)
    assert late.state == "stale" and "no update for 60 s" in late.detail
    assert stat.S_IMODE(os.stat(os.path.join(d, sf.HEARTBEAT_FILE)).st_mode) == 0o644


def test_pid_alive():
    assert sf.pid_alive(os.getpid()) is True
    assert sf.pid_alive(2**22 + 12345) is False       # above pid_max's ceiling: never a process
