"""The archive, built once per test session.

build.py is reproducible (the same tree gives the same bytes), so every test
that runs ``bk.pyz`` can share one build: ``archive()`` builds it on first use
into a world-readable directory (non-root users run it too), and ``copy_to``
gives a test its own copy where it may replace or break it.  Each build costs
seconds of wall time on a loaded machine; the suite used to make a dozen.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_built: list[Path] = []


def archive() -> Path:
    """The session's ``bk.pyz`` (mode 0644 in a root-owned 0755 directory): read it, never change it."""
    if not _built:
        d = Path(tempfile.mkdtemp(prefix="bkpyz_", dir="/tmp"))
        atexit.register(shutil.rmtree, d, True)
        os.chmod(d, 0o755)
        out = d / "bk.pyz"
        subprocess.run([sys.executable, str(ROOT / "build.py"), "--output", str(out)], check=True,
                       capture_output=True, timeout=300, cwd=ROOT)
        os.chmod(out, 0o644)
        _built.append(out)
    return _built[0]


def copy_to(dest: Path, mode: int = 0o644) -> Path:
    """A private copy of the session's archive at ``dest``."""
    shutil.copyfile(archive(), dest)
    os.chmod(dest, mode)
    return dest
