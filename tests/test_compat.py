"""The archive on the oldest and newest supported Pythons: a whole booking
lifecycle, not only --version (those interpreters ignore the archive's
bytecode and run the sources, so every module is really compiled there)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers_build import copy_to

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PYENV = {"3.10": "3.10.13", "3.13": "3.13.0"}


@pytest.fixture(scope="module")
def pyz(tmp_path_factory) -> Path:
    return copy_to(tmp_path_factory.mktemp("compat") / "bk.pyz")


@pytest.mark.parametrize("which", sorted(PYENV))
def test_booking_lifecycle(which, pyz, tmp_path):
    exe = shutil.which(f"python{which}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update(PYENV_VERSION=PYENV[which], BK_DATA_DIR=str(tmp_path / "d"), BK_GPU_COUNT="4",
               BK_NOW="2026-07-13T10:41:30Z", TZ="Europe/Berlin", HOME=str(tmp_path))
    if exe is None or subprocess.run([exe, "-c", "pass"], env=env, capture_output=True).returncode:
        pytest.skip(f"python{which} is not available here")

    def bk(*argv):
        p = subprocess.run([exe, str(pyz), "--json", *argv], env=env, capture_output=True, text=True,
                           timeout=60)
        assert "Traceback" not in p.stderr, p.stderr
        return p.returncode, json.loads(p.stdout)

    rc, env_book = bk("2", "1h30m", "12g", "-t", "tomorrow 09:00")
    assert rc == 0 and env_book["data"]["status"] == "created", env_book
    assert env_book["data"]["reservation"]["start"] == "2026-07-14T07:00:00Z"   # 09:00 in Berlin (CEST)
    rc, listed = bk("l")
    assert [r["short_id"] for r in listed["data"]["reservations"]] == \
        [env_book["data"]["reservation"]["short_id"]]
    rc, edited = bk("e", "1", "-d", "2h")
    assert rc == 0 and edited["data"]["reservation"]["end"] == "2026-07-14T09:00:00Z"
    assert bk("st")[0] == 0 and bk("tl")[0] == 0 and bk("slots", "1", "1h")[0] == 0
    rc, cancelled = bk("d", "1")
    assert rc == 0 and cancelled["data"]["reservation"]["status"] == "cancelled"
    rc, err = bk("1", "7m")
    assert rc == 2 and err["ok"] is False and err["error"]["code"] == "invalid_input"
