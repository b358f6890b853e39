"""Helpers for the install, update and login-hook tests: a staging root,
the built archive run as a user would, and a hash of a whole tree."""

from __future__ import annotations

import contextlib
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
BASE = ["--service-user", "nobody", "--gpu-count", "4", "--python", PYTHON]


# The accounts an install could make or change: the service account and group
# the tests install with, and the name the documentation suggests.
INSTALL_ACCOUNTS = ("nobody", "nogroup", "gpubk")


def _accounts(root: Path) -> dict[tuple[str, str], str]:
    """The /etc/passwd and /etc/group entries an install into ``root`` could
    have made or changed: those named like the accounts above, and any that
    mention the staging root.  Every other account is none of this test's
    business: other tests and other people on a shared machine add and remove
    theirs meanwhile."""
    out = {}
    for path in ("/etc/passwd", "/etc/group"):
        for ln in Path(path).read_text().splitlines():
            name = ln.split(":", 1)[0]
            if name.startswith(INSTALL_ACCOUNTS) or str(root) in ln:
                out[(path, name)] = ln
    return out


@contextlib.contextmanager
def staged_root():
    """A root-owned 0755 directory under /tmp, removed afterwards; on leaving,
    the accounts an install could touch are as they were."""
    d = Path(tempfile.mkdtemp(prefix="bkinst_", dir="/tmp"))
    try:
        os.chmod(d, 0o755)
        accounts = _accounts(d)
        yield d
        assert _accounts(d) == accounts, "the installer creates no accounts or groups"
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(name="root")
def staging_root():
    """A root-owned 0755 directory under /tmp, removed afterwards; the accounts unchanged."""
    with staged_root() as d:
        yield d


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
