"""A trial run (``BK_DATA_DIR=/tmp/gpubk-demo bk ...``, private mode) keeps
its presets and prompt history beside its data, in ``$BK_DATA_DIR/state``:
the user's real ``~/.local/state/bk`` (or ``$XDG_STATE_HOME/bk``) is never
touched.  Through the built archive, as real processes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from bk.store.paths import locate

ROOT = Path(__file__).resolve().parents[1]


def test_locate_puts_the_state_inside_bk_data_dir():
    env = {"HOME": "/home/ada", "BK_DATA_DIR": "/tmp/gpubk-demo", "XDG_STATE_HOME": "/home/ada/st"}
    assert locate(env).state_dir == "/tmp/gpubk-demo/state"
    del env["BK_DATA_DIR"]
    assert locate(env).state_dir == "/home/ada/st/bk"          # the real one, without a trial


@pytest.mark.slow
@pytest.mark.parametrize("xdg", [False, True])
def test_a_demo_leaves_the_real_presets_alone(pyz, tmp_path, xdg):
    home = tmp_path / "home"
    real = home / ".local" / "state" / "bk"
    real.mkdir(parents=True)
    (real / "presets.json").write_text('{"schema": "gpubk.presets.v1", "presets": {}}\n')
    before = sorted(os.listdir(real))
    demo = tmp_path / "gpubk-demo"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update(HOME=str(home), BK_DATA_DIR=str(demo), BK_GPU_COUNT="4", TZ="UTC", NO_COLOR="1",
               BK_NOW="2026-07-13T10:41:30Z")
    if xdg:
        env["XDG_STATE_HOME"] = str(home / ".local" / "state")

    def bk(*argv):
        p = subprocess.run([sys.executable, str(pyz), "--json", *argv], env=env, capture_output=True,
                           text=True, stdin=subprocess.DEVNULL, timeout=60,
                           preexec_fn=lambda: os.umask(0o002))      # a lax umask, too
        assert p.returncode == 0, (argv, p.stdout, p.stderr)
        return json.loads(p.stdout)
    # The first command of the demo saves a preset: it creates the data directory.
    bk("p", "save", "demo", "1", "30m")
    assert stat.S_IMODE(os.stat(demo).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(demo / "state").st_mode) == 0o700
    assert "demo" in json.loads((demo / "state" / "presets.json").read_text())["presets"]
    assert bk("p", "demo")["ok"]                           # the ledger accepts that directory
    assert [p["name"] for p in bk("p")["data"]["presets"]] == ["demo"]
    assert sorted(os.listdir(real)) == before
    assert json.loads((real / "presets.json").read_text())["presets"] == {}
