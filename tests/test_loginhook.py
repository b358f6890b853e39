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


# ------------------------------------------------------------- words (issue 30, item 20)

def test_uninstall_of_a_foreign_hook_leaves_it_and_refuses_nothing(pyz, root):
    """A hook bk never installed is not bk's to remove: no refusal (not
    even for a staging root without an installed bk), the file untouched."""
    hook = root / "etc/profile.d/gpubk.sh"
    hook.parent.mkdir(parents=True)
    hook.write_text("echo the site's own\n")
    p = bk(pyz, "admin", "login-hook", "uninstall", "--root", str(root))
    assert "not bk's login hook" in p.stdout and "nothing to remove" in p.stdout
    assert hook.read_text() == "echo the site's own\n"
    got = json.loads(bk(pyz, "--json", "admin", "login-hook", "uninstall", "--root", str(root)).stdout)
    assert got["data"]["status"] == "unchanged" and got["data"]["hook"]["status"] == "foreign"
    install(pyz, root)                                   # an installed server: the same answer
    assert "left in place" in bk(pyz, "admin", "login-hook", "uninstall", "--root", str(root)).stdout
    assert hook.read_text() == "echo the site's own\n"
    bk(pyz, "admin", "uninstall", "--root", str(root), "--yes", "--purge-data")
    hook.unlink()


def test_a_hand_edited_hook_is_refused_in_the_hook_commands_own_words(pyz, root):
    install(pyz, root, "--login-hook")
    hook = root / "etc/profile.d/gpubk.sh"
    hook.write_text(hook.read_text() + "# edited\n")
    p = bk(pyz, "admin", "login-hook", "uninstall", "--root", str(root), check=False)
    assert p.returncode == 78 and "bk admin login-hook uninstall refuses" in p.stderr
    assert "systemctl edit" not in p.stderr and "drop-in" not in p.stderr      # a hook is not a unit
    # A hand-edited unit is what names a drop-in, and names that unit.
    unit = root / "etc/systemd/system/gpubk-monitor.service"
    unit.write_text(unit.read_text() + "# edited\n")
    p = bk(pyz, "admin", "install", "--root", str(root), "--dry-run", check=False)
    assert p.returncode == 78 and "sudo systemctl edit gpubk-monitor.service" in p.stderr
    # ... and the hook commands answer for the hook alone: the unit's edit is install's business.
    hook.write_text(hook.read_text().replace("# edited\n", ""))
    assert "would:" in bk(pyz, "admin", "login-hook", "uninstall", "--root", str(root), "--dry-run").stdout
    unit.write_text(unit.read_text().replace("# edited\n", ""))
    bk(pyz, "admin", "uninstall", "--root", str(root), "--yes", "--purge-data")


def test_services_install_and_login_hook_dry_runs_are_headed_by_their_own_command(pyz, root):
    install(pyz, root)
    p = bk(pyz, "admin", "services", "install", "--root", str(root), "--dry-run")
    assert p.stdout.startswith("bk admin services install would:"), p.stdout
    assert "bk admin install would:" not in p.stdout
    p = bk(pyz, "admin", "login-hook", "install", "--root", str(root), "--dry-run")
    assert p.stdout.startswith("bk admin login-hook install would:"), p.stdout
    bk(pyz, "admin", "uninstall", "--root", str(root), "--yes", "--purge-data")
