"""The login hook in a real ``bash -l`` under a pseudo-terminal.

Root only.  The staged hook is sourced from the test's ``~/.bash_profile``
(``bash -l`` reads the machine's own /etc/profile, which must not be
changed by a test).  A nested login shell must stay quiet: the notice is
shown once per login.
"""

from __future__ import annotations

import json
import os
import pty
import select
import time
from pathlib import Path

import pytest

from tests.helpers_install import bk, install, staging_root  # noqa: F401 - the root fixture

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root"), pytest.mark.root]


def login_session(home: Path, typed: bytes) -> str:
    """What a terminal shows for ``bash -l`` fed ``typed``."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "TERM": "dumb", "LANG": "C.UTF-8",
           "PS1": "$ "}
    pid, fd = pty.fork()
    if pid == 0:                                  # the child: a login shell on the pty
        os.execve("/bin/bash", ["bash", "-l"], env)
    os.write(fd, typed)
    out = b""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:                           # EIO: the shell has exited
            break
        if not chunk:
            break
        out += chunk
    os.close(fd)
    os.waitpid(pid, 0)
    return out.decode(errors="replace")


def profile(root: Path, tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bash_profile").write_text(f". {root}/etc/profile.d/gpubk.sh\n")
    return home


def test_hook_prints_a_notice_once_and_nothing_when_quiet(pyz, root, tmp_path):
    install(pyz, root, "--login-hook")
    hook = root / "etc/profile.d/gpubk.sh"
    assert f"timeout -k 1 1 {root}/opt/gpubk/bin/bk login" in hook.read_text()
    home = profile(root, tmp_path)
    quiet = login_session(home, b"echo MARK-$((6*7))\nexit\n")
    assert "MARK-42" in quiet
    assert "bk" not in quiet.replace(str(root), "") and "error" not in quiet.lower()

    from bk.admin.services import TemporaryService

    with TemporaryService(str(root / "etc/systemd/system/gpubk-broker.service"), f"{root}/run/gpubk/broker.sock"):
        p = subprocess_run([str(root / "opt/gpubk/bin/bk"), "--json", "admin", "notice", "publish",
                            "Reboot at 18:00", "--level", "warning"])
        assert p.returncode == 0, p.stdout + p.stderr
    shown = login_session(home, b"bash -l\necho NESTED-$((6*7))\nexit\nexit\n")
    assert "NESTED-42" in shown
    assert shown.count("Reboot at 18:00") == 1, shown


def test_hook_is_silent_when_bk_fails(pyz, root, tmp_path):
    install(pyz, root, "--login-hook")
    (root / "etc/gpubk/config.json").chmod(0o666)          # untrusted: every bk refuses it
    home = profile(root, tmp_path)
    out = login_session(home, b"echo MARK-$((6*7))\nexit\n")
    assert "MARK-42" in out and "error" not in out.lower() and "untrusted" not in out
    (root / "etc/gpubk/config.json").chmod(0o644)


def test_login_hook_commands(pyz, root):
    install(pyz, root)
    st = json.loads(bk(pyz, "--json", "admin", "login-hook", "status", "--root", str(root)).stdout)["data"]
    assert st["status"] == "absent"
    bk(pyz, "admin", "login-hook", "install", "--root", str(root))
    st = json.loads(bk(pyz, "--json", "admin", "login-hook", "status", "--root", str(root)).stdout)["data"]
    assert st["status"] == "installed" and (root / "etc/profile.d/gpubk.sh").exists()
    bk(pyz, "admin", "login-hook", "uninstall", "--root", str(root))
    assert not (root / "etc/profile.d/gpubk.sh").exists()
    bk(pyz, "admin", "uninstall", "--root", str(root), "--yes", "--purge-data")
    assert os.listdir(root) == []


def subprocess_run(argv):
    import subprocess

    return subprocess.run(argv, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/"})
