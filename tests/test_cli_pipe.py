"""Piping bk into a reader that goes away (``bk l | head``) must never print
a traceback or "Exception ignored" noise, whatever the command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv", [["l"], ["l", "--json"], ["st"], ["help"], ["tl"], ["--version"],
                                  ["tutorial"]], ids=" ".join)
def test_a_closed_pipe_is_quiet(pyz, tmp_path, argv):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update(BK_DATA_DIR=str(tmp_path / "d"), BK_GPU_COUNT="4", HOME=str(tmp_path))
    subprocess.run([sys.executable, str(pyz), "1", "30m"], env=env, check=True, capture_output=True)
    # The read end is closed before bk writes a byte: its first write fails with EPIPE.
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, str(pyz), *argv], env=env, stdout=w,
                           stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(w)
    assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr
    assert p.returncode in (0, 141), (p.returncode, p.stderr)
