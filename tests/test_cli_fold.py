"""Reasons shown off a terminal are folded, never cut (issue 30): ``bk j``'s
REASON, ``bk c``'s PROBLEM and ``bk u verify``'s DETAIL, through the built
``bk.pyz`` writing to a pipe (no terminal) at 80 columns, as ``bk doctor``
already did; and ``bk j log`` for a job that never started says why."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WIDTH = 80


def squeeze(text: str) -> str:
    return "".join(text.split())


@pytest.fixture
def env(tmp_path):
    cfg = tmp_path / "cfg" / "bk"
    cfg.mkdir(parents=True)
    (cfg / "config.json").write_text(json.dumps({"slot_minutes": 1}))
    return {"BK_DATA_DIR": str(tmp_path / "data"), "BK_GPU_COUNT": "4", "HOME": str(tmp_path),
            "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TZ": "UTC", "COLUMNS": str(WIDTH),
            "NO_COLOR": "1"}


def run(pyz, env, *words, code=0, cwd=None) -> str:
    p = subprocess.run([sys.executable, str(pyz), *words], env=env, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=60, cwd=cwd or env["HOME"])
    assert p.returncode == code, (words, p.returncode, p.stdout, p.stderr)
    return p.stdout


def folded(out: str, whole: str) -> None:
    """Every character of ``whole`` is in ``out`` (spaces aside), nothing is
    cut with an ellipsis, and no line is wider than the width (but ``bk j``'s
    closing notice, one paragraph the terminal folds)."""
    assert "…" not in out and "..." not in out, out
    assert squeeze(whole) in squeeze(out), (whole, out)
    lines = [line for line in out.splitlines() if not line.startswith("no bk worker is running")]
    assert all(len(line) <= WIDTH for line in lines), out


def test_bk_j_folds_the_reason_and_j_log_says_why_the_job_never_started(pyz, env, tmp_path):
    where = tmp_path / ("a-project-directory-with-a-rather-long-name-" + "x" * 30)
    where.mkdir()
    failed = json.loads(run(pyz, env, "--json", "1", "30m", "--", "true", cwd=where))["data"]["reservation"]
    where.rmdir()                                    # gone before the worker gets to it
    run(pyz, env, "w", "once")
    waiting = json.loads(run(pyz, env, "--json", "1", "30m", "--", "true"))["data"]["reservation"]
    jobs = {j["reservation"]: j for j in json.loads(run(pyz, env, "--json", "j"))["data"]["jobs"]}
    reason = jobs[failed["id"]]["reason"]
    assert jobs[failed["id"]]["status"] == "failed" and str(where) in reason
    folded(run(pyz, env, "j"), reason)

    said = run(pyz, env, "j", "log", failed["short_id"])
    assert said.startswith(f"the job of {failed['short_id']} never started (failed):"), said
    folded(said, f"the working directory {where} does not exist")
    said = run(pyz, env, "j", "log", waiting["short_id"])
    assert said.startswith(f"the job of {waiting['short_id']} has not started yet:"), said
    folded(said, "no bk worker is running for you")


def _tampered_usage_day(data_dir: Path) -> None:
    """A sealed day of usage history whose file was changed afterwards."""
    from bk.core.models import GpuInfo, GpuProcess
    from bk.core.telemetry import Snapshot
    from bk.core.usage import DAY, Folder
    from bk.store.usage import UsageStore

    now = 1_783_939_290                              # 2026-07-13 10:41:30 UTC
    yesterday = now - now % DAY - DAY
    folder = Folder(60, 10)
    recs = []
    for t in range(yesterday + 3600, yesterday + 7200, 10):
        gpus = [GpuInfo(0, "GPU-0", "sim", 81920, 700, 10, None, [GpuProcess(300, 700, 10, 4242)])]
        recs += folder.add(t, Snapshot(t, "sim", tuple(gpus)), None, [])
    recs += folder.flush()
    usage = data_dir / "usage"
    store = UsageStore(str(usage))
    store.append(recs, now=now)
    store.maintain(now)
    (day,) = [p for p in (usage / "raw").iterdir() if p.suffix == ".jsonl"]
    day.write_bytes(day.read_bytes() + b"\n")


def test_bk_u_verify_folds_the_detail(pyz, env):
    data = Path(env["BK_DATA_DIR"])
    data.mkdir(mode=0o700)
    _tampered_usage_day(data)
    doc = json.loads(run(pyz, env, "--json", "u", "verify", code=1))["data"]
    (bad,) = [p for p in doc["partitions"] if p["state"] == "tampered"]
    assert len(bad["detail"]) > WIDTH - 40
    folded(run(pyz, env, "u", "verify", code=1), bad["detail"])


@pytest.mark.skipif(os.geteuid() != 0, reason="the catalog must be root's")
def test_bk_c_rec_folds_a_nodes_problem(pyz, env, tmp_path):
    os.chmod(tmp_path, 0o755)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    said = "ssh: connect to host gpu-far.lab port 22: No route to host (the VPN of the lab is down again)"
    (bindir / "ssh").write_text(f"#!/bin/sh\necho '{said}' >&2\nexit 255\n")
    os.chmod(bindir / "ssh", 0o755)
    catalog = tmp_path / "cluster.json"
    catalog.write_text(json.dumps({"nodes": {"far": {"id": "d-" + "f" * 24, "target": "gpu-far.lab"}}}))
    os.chmod(catalog, 0o644)
    cenv = {**env, "BK_CLUSTER_FILE": str(catalog), "PATH": f"{bindir}:{env['PATH']}"}
    assert shutil.which("ssh", path=cenv["PATH"]) == str(bindir / "ssh")
    doc = json.loads(run(pyz, cenv, "--json", "c", "rec", "1", "30m", code=1))
    (node,) = doc["data"]["nodes"]
    assert node["state"] == "unreachable" and "No route to host" in node["problem"], node
    folded(run(pyz, cenv, "c", "rec", "1", "30m", code=1), node["problem"])
    doc = json.loads(run(pyz, cenv, "--json", "c", code=1))            # the overview's STATE too
    message = doc["data"]["nodes"][0]["error"]["message"]
    folded(run(pyz, cenv, "c", code=1), message)
