"""Live views (issue 12 item 5): ``bk st``, ``bk st -v``, ``bk g`` and
placement on a simulated server whose processes cover every attribution
state, in-process and through the built ``bk.pyz`` with a real process read
from the real /proc."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers_cli import BOB, NOW, SLICE, bk_fixture

from bk.service.context import Actor
from bk.service.requests import BookRequest

CAROL = Actor(3000, "carol")
HEX = "3f2a9c1b12ab" + "0" * 52
SINCE = "2026-07-13T09:11:00Z"         # 1h30m before the tests' clock (10:41:30)

WORLD = {"gpus": [
    # GPU 0: ada's own job (ada books GPU 0 below)
    {"name": "H100", "mem_total_mib": 81559, "mem_used_mib": 4096, "util": 37, "temperature": 40,
     "processes": [{"pid": 4242, "uid": 1000, "user": "ada", "label": "python3 train.py", "mem_mib": 4000,
                    "sm": 30},
                   {"pid": 77, "uid": 0, "user": "root", "label": "Xorg", "mem_mib": 96}]},
    # GPU 1: a root container (ada books GPU 1 too: it is credited to her)
    {"name": "H100", "mem_total_mib": 81559, "mem_used_mib": 8192, "util": 60, "temperature": 41,
     "processes": [{"pid": 6001, "uid": 0, "user": "root", "label": "python serve.py", "mem_mib": 8000,
                    "container": f"docker:{HEX[:12]}", "since": SINCE}]},
    # GPU 2: bob without a booking, for 1h30m
    {"name": "H100", "mem_total_mib": 81559, "mem_used_mib": 2048, "util": 10, "temperature": 42,
     "processes": [{"pid": 5151, "uid": 2000, "user": "bob", "label": "python3 hog.py", "mem_mib": 2048,
                    "since": SINCE}]},
    # GPU 3: idle
    {"name": "H100", "mem_total_mib": 81559, "mem_used_mib": 0, "util": 0, "temperature": 30, "processes": []},
]}


@pytest.fixture
def bk(monkeypatch, capsys):
    yield from bk_fixture(monkeypatch, capsys)


def procs_of(data) -> dict:
    return {p["pid"]: p for g in data["gpus"] for p in (g["processes"] or ())}


def test_status_json_states_identities_and_processes(bk):
    bk.sim(WORLD)
    bk.ok("2", "1h", "-g", "0,1")
    d = bk.data("st", "-v")
    assert [g["state"] for g in d["gpus"]] == ["busy", "busy", "unreserved-use", "idle"]
    p = procs_of(d)
    assert {k: p[4242][k] for k in ("uid", "user", "label", "mem_mib", "sm", "state", "identity", "since",
                                    "container")} == {
        "uid": 1000, "user": "ada", "label": "python3 train.py", "mem_mib": 4000, "sm": 30, "state": "ok",
        "identity": "verified", "since": None, "container": None}
    assert (p[77]["state"], p[77]["sm"]) == ("system", None)
    # The root container on ada's GPU is hers, and says it is an inference.
    assert (p[6001]["uid"], p[6001]["user"], p[6001]["state"], p[6001]["identity"], p[6001]["container"]) == \
        (1000, "ada", "ok", "inferred", "docker:3f2a9c1b12ab")
    assert (p[5151]["state"], p[5151]["identity"], p[5151]["since"]) == ("unreserved", "verified", SINCE)
    t = d["telemetry"]
    assert t["source"] == "sim-file" and t["simulated"] and t["gaps"] == [] and "processes" in t["capabilities"]


def test_ambiguous_container_and_a_gpu_that_cannot_list_processes(bk):
    world = json.loads(json.dumps(WORLD))
    del world["gpus"][3]["processes"]                  # cannot tell, not "none"
    bk.sim(world)
    bk.ok("1", "1h", "-g", "1")
    bk.service(BOB).run("book", BookRequest(count=1, duration=3600, pinned=(1,)))
    d = bk.data("st")
    p = procs_of(d)[6001]
    assert (p["uid"], p["user"], p["state"], p["identity"]) == (None, None, "unknown", "ambiguous")
    assert d["gpus"][3]["processes"] is None and d["gpus"][3]["state"] == "idle"
    assert d["telemetry"]["gaps"] == ["processes"]
    out = bk.ok("st", "-v").out
    assert "telemetry: sim-file; no process list" in out
    assert "one of several bookers (ambiguous)" in out


def test_human_status_and_verbose_processes(bk):
    bk.sim(WORLD)
    bk.ok("1", "1h", "-g", "1")
    out = bk.ok("st", "-v", COLUMNS="120").out
    head = out.splitlines()[0].split()
    assert head[:7] == ["GPU", "MODEL", "UTIL", "VRAM", "AVAIL", "PROCS", "STATE"]
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:5]}
    assert rows["2"][2:7] == ["10%", "2.0/79.6G", "77.6G", "1", "unreserved-use"]
    assert rows["3"][6] == "idle"
    assert "telemetry:" not in out                     # nothing missing: no line
    lines = [x.strip() for x in out.split("processes:\n")[1].split("\n\n")[0].splitlines()]
    assert "GPU 2: pid 5151 bob python3 hog.py, 2.0G, running 1h30m [unreserved]" in lines
    assert "GPU 1: pid 6001 ada (inferred) python serve.py, 7.8G, in docker:3f2a9c1b12ab [ok]" in lines
    assert "GPU 0: pid 4242 ada python3 train.py, 3.9G, SM 30% [wrong-gpu]" in lines


def test_count_simulation_says_what_it_cannot_see(bk):
    out = bk.ok("st").out
    assert "telemetry: sim-count; no utilisation, memory readings, process list, temperature" in out
    d = bk.data("st")
    assert all(g["processes"] is None and g["state"] == "unknown" for g in d["gpus"])
    assert set(d["telemetry"]["gaps"]) == {"utilisation", "memory", "processes", "temperature"}


def test_bk_g_and_placement_avoid_a_gpu_used_without_a_booking(bk):
    world = json.loads(json.dumps(WORLD))
    world["gpus"] = world["gpus"][1:3]                 # GPU 0: root container; GPU 1: bob, unbooked
    world["gpus"][0]["util"] = 95                      # busier than bob's GPU...
    bk.sim(world)
    bk.service(CAROL).run("book", BookRequest(count=1, duration=3600, pinned=(0,)))   # ...but carol booked it
    g = bk.data("g")
    assert [o["gpus"] for o in g["options"]] == [[0], [1]]
    assert {x["index"]: x["state"] for x in g["live"]} == {0: "busy", 1: "unreserved-use"}
    assert g["live"][1] == {"index": 1, "state": "unreserved-use", "util": 10, "mem_free_mib": 79511,
                            "processes": 1}
    out = bk.ok("g").out
    assert "GPU 1: unreserved-use, util 10%, 77.6G VRAM free, 1 process" in out
    assert bk.data("1", "1h", "--dry-run")["reservation"]["gpus"] == [0]
    # bob himself books: his own unbooked process is why, so his GPU is not held against him
    bob = bk.service(BOB).run("book", BookRequest(count=1, duration=3600))
    assert bob.reservation.gpus == (1,)


def test_usage_line_for_a_running_booking(bk):
    from bk.core.usage import MinuteRecord, Use
    from bk.store.usage import UsageStore

    bk.sim(WORLD)
    rid = bk.data("2", "1h", "-g", "2,3")["reservation"]["id"]
    assert "idle" not in bk.ok("st").out.split("your bookings:")[1]      # no history: no line, never invented
    assert bk.data("st")["usage"] == []
    recs = [MinuteRecord(SLICE + 60 * i, gpu, samples=30, covered_s=60,
                         uses=(Use(1000, rid, "shared", booked_s=60, active_s=60 if gpu == 2 and i == 0 else 0),))
            for i in range(5) for gpu in (2, 3)]
    UsageStore(str(bk.data_dir / "usage")).append(recs, now=NOW)
    d = bk.data("st")
    assert d["usage"] == [{"reservation": rid, "booked_s": 600, "active_s": 60, "idle_fraction": 0.9}]
    assert "#1: booked 10m of GPU time so far, GPUs idle 90% of it" in bk.ok("st").out


# ------------------------------------------------------------- the built pyz

SCRIPT = "import sys, time\nsys.stdout.write('up\\n'); sys.stdout.flush()\ntime.sleep(120)\n"


def test_pyz_shows_a_real_process_read_from_proc(pyz, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen(["/usr/bin/python3", str(script), "--token", "hunter2"], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout.readline() == b"up\n"
        sim = tmp_path / "sim.json"
        sim.write_text(json.dumps({"proc": True, "gpus": [
            {"name": "H100", "mem_total_mib": 81559, "mem_used_mib": 1024, "util": 12,
             "processes": [{"pid": proc.pid, "mem_mib": 1000}]},
            {"name": "H100", "mem_total_mib": 81559, "mem_used_mib": 0, "util": 0, "processes": []}]}))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
        env.update(BK_DATA_DIR=str(tmp_path / "data"), BK_GPU_SIM_FILE=str(sim), TZ="UTC", HOME=str(tmp_path),
                   COLUMNS="100", NO_COLOR="1")

        def bk(*argv):
            p = subprocess.run([sys.executable, str(pyz), *argv], env=env, capture_output=True, text=True,
                               timeout=60, stdin=subprocess.DEVNULL)
            assert p.returncode == 0 and "Traceback" not in p.stderr, (p.stdout, p.stderr)
            return p.stdout
        d = json.loads(bk("st", "--json"))["data"]
        (p,) = d["gpus"][0]["processes"]
        assert (p["pid"], p["uid"], p["label"], p["state"], p["identity"]) == \
            (proc.pid, os.getuid(), "python3 train.py", "unreserved", "verified")
        assert p["since"] is not None and p["since"].endswith("Z")
        assert d["gpus"][0]["state"] == "unreserved-use" and d["gpus"][1]["processes"] == []
        out = bk("st", "-v")
        assert f"GPU 0: pid {proc.pid}" in out and "python3 train.py" in out and "[unreserved]" in out
        assert "hunter2" not in out
    finally:
        proc.kill()
        proc.wait()
