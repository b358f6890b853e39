"""Helpers for the install, update and login-hook tests: a staging root,
the built archive run as a user would, and a hash of a whole tree."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

NOBODY = 65534
PYTHON = "/usr/bin/python3"
# A trial server (these machines have no GPUs): four GPUs simulated on
# purpose, so bk update's verification (bk doctor --strict) can pass.
BASE = ["--service-user", "nobody", "--simulated-gpus", "4", "--python", PYTHON]


def _accounts() -> tuple[list[str], list[str]]:
    """/etc/passwd and /etc/group, less the throwaway accounts other tests
    (helpers_broker.Accounts: bkt*, bkg*) may add or remove meanwhile."""
    def lines(path: str) -> list[str]:
        return [ln for ln in Path(path).read_text().splitlines() if "bkt" not in ln and "bkg" not in ln]
    return lines("/etc/passwd"), lines("/etc/group")


@pytest.fixture(name="root")
def staging_root():
    """A root-owned 0755 directory under /tmp, removed afterwards; the accounts unchanged."""
    d = Path(tempfile.mkdtemp(prefix="bkinst_", dir="/tmp"))
    os.chmod(d, 0o755)
    accounts = _accounts()
    yield d
    assert _accounts() == accounts              # the installer creates no accounts or groups
    shutil.rmtree(d, ignore_errors=True)


def bk(pyz: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([PYTHON, str(pyz), *args], capture_output=True, text=True, timeout=300,
                       env={"PATH": "/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"})
    if check:
        assert p.returncode == 0, p.stdout + p.stderr
    return p


def install(pyz: Path, root: Path, *extra: str, check: bool = True):
    p = bk(pyz, "--json", "admin", "install", "--root", str(root), "--yes", "--no-start", *BASE, *extra,
           check=check)
    return p.returncode, json.loads(p.stdout)


def tree(root: Path) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                what = "link:" + os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                what = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            else:
                what = "dir"
            out[os.path.relpath(path, root)] = (what, st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))
    return out


def owner_mode(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)
