"""Every everyday command through the built ``bk.pyz``, as a real process
(STYLE 13): the archive is built once per session, then the seed README's
"Everyday use" runs in order on a simulated 4-GPU server, followed by each
other command of this group once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOW_ISO = "2026-07-13T10:41:30Z"


@pytest.fixture
def run(pyz, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update(BK_DATA_DIR=str(tmp_path / "data"), BK_GPU_COUNT="4", BK_NOW=NOW_ISO, TZ="UTC",
               HOME=str(tmp_path), COLUMNS="80", NO_COLOR="1")
    env.pop("BK_GPU_SIM_FILE", None)

    def bk(*argv: str, code: int = 0, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
        p = subprocess.run([sys.executable, str(pyz), *argv], env=env, stdout=stdout,
                           stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, timeout=60)
        assert p.returncode == code, (argv, p.returncode, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr
        return p
    return bk


@pytest.mark.slow
def test_readme_everyday_use_then_every_command(run):
    # The seed README, in order (bk a, bk run, bk t and bk u belong to other commands).
    assert run("1", "30m").stdout.startswith("booked 1 GPU (0) shared 07-13 10:40–11:10")
    assert "12g" in run("2", "1h30m", "12g").stdout
    assert "exclusive" in run("x", "1", "2h").stdout
    listing = run("l").stdout.splitlines()
    assert listing[0].split()[:3] == ["#", "ID", "GPUS"] and len(listing) == 4
    assert "export CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=" in run("g").stdout
    four = run("g", "4")                         # GPU 3 is held exclusively until 12:40
    assert "nothing free now" in four.stdout and "12:40" in four.stdout and "bk 4 1h" in four.stdout

    # Every other command of the group, once each.
    assert "NEXT FREE" in run("st").stdout
    assert "▼ now" in run("tl").stdout
    assert "bk 2 1h -g" in run("slots", "2", "1h").stdout
    assert run("e", "1", "-d", "+30m").stdout.startswith("updated")
    hist = run("history", "1").stdout
    assert "booked by" in hist and "edited by" in hist
    assert run("d", "2", "-y").stdout.startswith("cancelled")
    assert run("n").stdout.strip() == "no notices"
    assert "cancelled by" in run("lg").stdout
    assert "administrator" in run("info").stdout
    assert "within the hour" in run("login").stdout
    assert "slot_minutes" in run("config").stdout
    assert "all checks passed" in run("doctor", "--strict").stdout
    assert "5-minute slices" in run("tutorial").stdout
    assert "COMMAND" in run("help").stdout
    assert "NEXT FREE" in run().stdout                   # bare bk without a terminal: status

    env = json.loads(run("--json", "l").stdout)
    assert env["ok"] and env["command"] == "list" and len(env["data"]["reservations"]) == 2
    bad = run("--json", "1", code=2)
    assert json.loads(bad.stdout)["error"]["code"] == "invalid_input" and bad.stderr == ""


def test_closed_pipe_is_quiet(run):
    # The reader is gone before bk writes (`bk tutorial | true`): the first
    # write fails with EPIPE; bk must exit without a traceback.
    r, w = os.pipe()
    os.close(r)
    try:
        p = run("tutorial", stdout=w)
    finally:
        os.close(w)
    assert p.stderr == ""
