"""Start-up stays cheap: ``bk --version`` loads no argparse, and an everyday
read (``bk l``) loads no curses, no socket servers, no NVML and none of the
long-running parts (TUI, broker, monitor, worker, MCP).  Each check runs in
a fresh interpreter and looks at ``sys.modules`` after ``main()``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import contextlib, io, json, sys
from bk.cli.main import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules), "out": out.getvalue()}))
"""


def loaded(tmp_path, *argv) -> tuple[int, set[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update({"HOME": str(tmp_path), "BK_DATA_DIR": str(tmp_path / "data"), "BK_GPU_COUNT": "2",
                "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
                "PYTHONPATH": str(ROOT)})
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout.splitlines()[-1])
    return doc["code"], set(doc["modules"]), doc["out"]


def test_version_imports_no_argparse(tmp_path):
    code, modules, out = loaded(tmp_path, "--version")
    assert code == 0 and out.startswith("bk ")
    assert "argparse" not in modules
    assert not {m for m in modules if m.startswith(("bk.service", "bk.store", "bk.core.scheduler"))}


def test_list_imports_nothing_heavy(tmp_path):
    code, modules, _ = loaded(tmp_path, "l")
    assert code == 0
    # dataclasses would pull in inspect, ast and tokenize: bk.core.record
    # stands in for it so that every command starts faster.
    banned = {"curses", "_curses", "socketserver", "pynvml", "readline", "dataclasses", "inspect",
              "uuid", "hashlib"}
    heavy = ("bk.tui", "bk.broker", "bk.monitor", "bk.worker", "bk.mcp", "bk.admin", "bk.gpu.nvml")
    found = sorted((modules & banned) | {m for m in modules if m.startswith(heavy)})
    assert not found, f"bk l imported {found}"
