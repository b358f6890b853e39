"""Helpers for the CLI tests: run ``bk`` in-process on a private, simulated
4-GPU server with a fixed clock, and look at what it printed.

The clock is ``BK_NOW`` (2026-07-13 10:41:30 UTC), the zone ``TZ=UTC`` and
the user a fake ``ada`` (uid 1000), so outputs are exact whoever runs the
tests (root in CI).  The data directory lives in /dev/shm when there is one:
every booking is a real store transaction, and fsync there is cheap.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bk import clock
from bk.cli import app as cli_app
from bk.core.envelope import is_envelope
from bk.core.models import parse_iso
from bk.service.requests import Actor

NOW_ISO = "2026-07-13T10:41:30Z"
NOW = parse_iso(NOW_ISO)
SLICE = NOW - NOW % 300           # 10:40, the current 5-minute slice
ME = Actor(1000, "ada")
BOB = Actor(2000, "bob")
ROOT = Actor(0, "root")
TMP_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

SIM_GPUS = {"gpus": [
    {"name": "NVIDIA H100 80GB HBM3", "mem_total_mib": 81559, "mem_used_mib": 4096, "util": 37,
     "processes": [{"pid": 4242, "uid": 1000, "user": "ada", "label": "python", "mem_mib": 4000},
                   {"pid": 77, "uid": 0, "user": "root", "label": "Xorg", "mem_mib": 96}]},
    {"name": "NVIDIA H100 80GB HBM3", "mem_total_mib": 81559, "mem_used_mib": 0, "util": 0,
     "processes": []},
    {"name": "NVIDIA H100 80GB HBM3", "mem_total_mib": 81559, "mem_used_mib": 2048, "util": 90,
     "processes": [{"pid": 5151, "uid": 2000, "user": "bob", "label": "train.py", "mem_mib": 2048}]},
    {"name": "NVIDIA H100 80GB HBM3", "mem_total_mib": 81559},
]}


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def envelope(self) -> dict:
        lines = self.out.splitlines()
        assert len(lines) == 1, f"expected one JSON line on stdout, got {len(lines)}:\n{self.out}"
        env = json.loads(lines[0])
        assert is_envelope(env), env
        return env

    @property
    def data(self) -> dict:
        env = self.envelope
        assert env["ok"], env
        return env["data"]

    @property
    def error(self) -> dict:
        env = self.envelope
        assert not env["ok"], env
        return env["error"]


def as_me(env: dict):
    """The service as ``ada`` (uid 1000), whoever runs the tests."""
    from bk.service import open_app

    return open_app(env, actor=ME)


class Bk:
    """``bk(...)`` runs one command in-process and returns its Result."""

    def __init__(self, root: Path, monkeypatch, capsys):
        self.root, self.mp, self.capsys = root, monkeypatch, capsys
        self.data_dir = root / "data"
        self.config_file = root / "config" / "bk" / "config.json"

    def __call__(self, *argv: str, **env: str) -> Result:
        self.capsys.readouterr()
        full = dict(os.environ)
        full.update(env)
        code = cli_app.run(list(argv), full, opener=as_me)
        out, err = self.capsys.readouterr()
        return Result(code, out, err)

    def json(self, *argv: str, **env: str) -> Result:
        return self(*argv, "--json", **env)

    def ok(self, *argv: str, **env: str) -> Result:
        r = self(*argv, **env)
        assert r.code == 0, (r.code, r.out, r.err)
        return r

    def data(self, *argv: str, **env: str) -> dict:
        r = self.json(*argv, **env)
        assert r.code == 0, (r.code, r.out, r.err)
        return r.data

    def config(self, **values) -> None:
        """Write the user's configuration file (private mode reads it)."""
        self.config_file.parent.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(json.dumps(values))

    def sim(self, doc: dict = SIM_GPUS) -> Path:
        """GPUs with names, memory and processes instead of BK_GPU_COUNT."""
        path = self.root / "sim.json"
        path.write_text(json.dumps(doc))
        self.mp.setenv("BK_GPU_SIM_FILE", str(path))
        self.mp.delenv("BK_GPU_COUNT", raising=False)
        return path

    def service(self, actor: Actor = BOB):
        """The service layer as another user, to make their bookings."""
        from bk.service import open_app

        return open_app(dict(os.environ), actor=actor)

    def stdin_tty(self, answer: str | None) -> None:
        """Pretend a person is at the terminal and will type ``answer``."""
        self.mp.setattr(cli_app, "_stdin_is_tty", lambda: True)
        self.mp.setattr("builtins.input", lambda *a: answer)


def bk_fixture(monkeypatch, capsys):
    """The body of each test file's ``bk`` fixture: ``yield from bk_fixture(...)``."""
    root = Path(tempfile.mkdtemp(prefix="bk-cli-", dir=TMP_ROOT))
    for var in ("BK_GPU_SIM_FILE", "BK_CONFIG_FILE", "NO_COLOR", "BK_DEBUG", "COLUMNS",
                "BK_TEST_CRASH_AT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("BK_DATA_DIR", str(root / "data"))
    monkeypatch.setenv("BK_GPU_COUNT", "4")
    monkeypatch.setenv("BK_NOW", NOW_ISO)
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("HOME", str(root))
    for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_STATE_HOME", "state"),
                     ("XDG_DATA_HOME", "share")):
        monkeypatch.setenv(var, str(root / sub))
    # Never a question on a real tty (the user is injected: see as_me).
    monkeypatch.setattr(cli_app, "_stdin_is_tty", lambda: False)
    clock.local_tz.cache_clear()
    try:
        yield Bk(root, monkeypatch, capsys)
    finally:
        clock.local_tz.cache_clear()
        shutil.rmtree(root, ignore_errors=True)
