"""Helpers for the administrator's day-to-day tests (no tests here).

``Private`` runs the built ``bk.pyz`` as a fresh process on a private,
simulated 4-GPU server with a fixed clock (root runs the tests, so the
admin commands are allowed); ``as_nobody`` runs it as uid 65534 to see the
refusals.  The shared-server tests use ``helpers_broker.site``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NOW_ISO = "2026-07-13T10:41:30Z"
SYSTEM_PYTHON = "/usr/bin/python3"


class Private:
    def __init__(self, pyz: Path, root: Path):
        self.pyz, self.root = pyz, root
        self.data = root / "data"
        self.config = root / "cfg" / "bk" / "config.json"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
        self.env.update(BK_DATA_DIR=str(self.data), BK_GPU_COUNT="4", BK_NOW=NOW_ISO, TZ="UTC",
                        HOME=str(root), XDG_CONFIG_HOME=str(root / "cfg"), COLUMNS="100", NO_COLOR="1")

    def run(self, *argv: str, code: int | None = 0, now: str | None = None,
            python: str = sys.executable, **popen) -> subprocess.CompletedProcess:
        env = dict(self.env, **({"BK_NOW": now} if now else {}))
        p = subprocess.run([python, str(self.pyz), *argv], env=env, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=60, cwd=self.root, **popen)
        assert "Traceback" not in p.stderr, p.stderr
        if code is not None:
            assert p.returncode == code, (argv, p.returncode, p.stdout, p.stderr)
        return p

    def json(self, *argv: str, code: int | None = 0, **kw) -> dict:
        p = self.run("--json", *argv, code=code, **kw)
        env = json.loads(p.stdout)
        assert env["schema"] == "gpubk.v1", env
        return env

    def data_of(self, *argv: str, **kw) -> dict:
        env = self.json(*argv, **kw)
        assert env["ok"], env
        return env["data"]

    def ledger(self) -> dict:
        return json.loads((self.data / "ledger.json").read_text())

    def digest(self) -> str:
        return hashlib.sha256((self.data / "ledger.json").read_bytes()).hexdigest()

    def book(self, *argv: str, **kw) -> dict:
        return self.data_of(*argv, **kw)["reservation"]


def private(pyz: Path):
    """A fixture body: ``yield from private(pyz)``."""
    root = Path(tempfile.mkdtemp(prefix="bk-admin-"))
    try:
        yield Private(pyz, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def as_nobody(pyz: Path, *argv: str) -> subprocess.CompletedProcess:
    """``bk ARGV --json`` as uid 65534 (no data directory of its own needed:
    the refusal comes first)."""
    base = Path(tempfile.mkdtemp(prefix="bk-nobody-"))
    try:
        os.chmod(base, 0o755)
        copy = base / "bk.pyz"
        shutil.copy(pyz, copy)
        os.chmod(copy, 0o644)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(base), "TZ": "UTC", "LANG": "C.UTF-8",
               "BK_DATA_DIR": str(base / "data"), "BK_GPU_COUNT": "4"}
        return subprocess.run([SYSTEM_PYTHON, str(copy), "--json", *argv], env=env, capture_output=True,
                              text=True, timeout=60, cwd=base, user=65534, group=65534, extra_groups=[])
    finally:
        shutil.rmtree(base, ignore_errors=True)
