"""Helpers for the install, update and login-hook tests: a staging root,
the built archive run as a user would, a hash of a whole tree, another
archive made from the built one, and a conversation on a pty."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pty
import re
import select
import shutil
import stat
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

NOBODY = 65534
PYTHON = "/usr/bin/python3"
# A trial server (these machines have no GPUs): four GPUs simulated on
# purpose, so bk update's verification (bk doctor --strict) can pass.
BASE = ["--service-user", "nobody", "--simulated-gpus", "4", "--python", PYTHON]


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


def variant(pyz: Path, out: Path, *, version: str | None = None, broken: bool = False,
            failing: bool = False) -> Path:
    """Another archive: a new version number, one whose doctor cannot run,
    or one whose doctor runs and fails a check of its own."""
    with zipfile.ZipFile(pyz) as z:
        entries = {n: z.read(n) for n in z.namelist() if not n.endswith((".pyc", "/"))}
    if version:
        init = entries["bk/__init__.py"].decode()
        entries["bk/__init__.py"] = re.sub(r'__version__ = "[^"]*"', f'__version__ = "{version}"', init).encode()
        info = json.loads(entries["bk/_build.json"])
        info["version"] = version
        entries["bk/_build.json"] = json.dumps(info).encode()
    if broken:
        entries["bk/cli/cmd_doctor.py"] += b"\nraise ImportError('broken on purpose')\n"
    if failing:
        entries["bk/service/doctor.py"] += (
            b"\n\ndef _selftest(app, call):\n"
            b"    return _check('selftest', False, 'failed on purpose ' + 'x' * 3000, fix='use the other archive')\n"
            b"\n\nCHECKS = CHECKS + (('selftest', _selftest),)\n")
    buf = io.BytesIO()
    buf.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name in sorted(entries):
            z.writestr(name, entries[name])
    out.write_bytes(buf.getvalue())
    return out


def converse(argv: list[str], env: dict, answers: list[tuple[str, bytes]]) -> tuple[int, str]:
    """Run ``argv`` on a pty; when the text so far shows the next prompt, type its answer."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(argv[0], argv, env)
    answers = list(answers)
    seen = b""
    mark = 0                       # answers look for their prompt after the previous one
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if answers:
            at = seen.find(answers[0][0].encode(), mark)
            if at >= 0:
                mark = at + 1
                os.write(fd, answers.pop(0)[1])
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    text = seen.decode(errors="replace").replace("\r\n", "\n")
    assert not answers, f"never asked {answers[0][0]!r}:\n{text[-3000:]}"
    return os.waitstatus_to_exitcode(status), text
