"""Fixtures every test file may use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def pyz(tmp_path_factory) -> Path:
    """The archive built once from this tree, for tests that run ``bk.pyz``
    as a user would (a fresh process, the zipapp's own imports)."""
    out = tmp_path_factory.mktemp("pyz") / "bk.pyz"
    subprocess.run([sys.executable, str(ROOT / "build.py"), "--output", str(out)], check=True,
                   capture_output=True, timeout=120)
    return out
