"""What a reconcile of ``bk admin install`` may change on an installed
server, and a staged install used as it is.

* GUIDE 5.6: ``bk admin install --access group --group G`` on a server
  installed for all users rewrites the configuration, the units
  (``Group=``, ``RuntimeDirectoryMode=``) and the directories' group and
  mode, after which a member books and a non-member is refused, reads
  included; ``--access all`` switches back.  Refused (nothing changed)
  while the services run without systemd, since the running broker keeps
  the old rule until it restarts.  No Python ``None`` in any message.
* A staged install (``--root``), run through its own launcher: ``bk
  update``, ``bk admin services status`` and ``bk admin login-hook`` act
  on the staged root without ``--root``, and ``BK_DATA_DIR`` (a private
  trial) works through the staged command as it does on a real server.

Root only: real accounts, processes started as them, stopped by pid.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
from pathlib import Path

import pytest
from helpers_broker import Accounts, make_base, needs_root, ping, poll

from tests.helpers_install import BASE, bk, install, staging_root, tree  # noqa: F401

pytestmark = [pytest.mark.root, pytest.mark.slow, needs_root]


def settled(root: Path) -> dict:
    """The tree, less what the running monitor rewrites every sample."""
    return {k: v for k, v in tree(root).items() if not k.startswith(("var/lib/gpubk/monitor/",
                                                                      "var/lib/gpubk/usage"))}


def owner_mode(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


@pytest.fixture
def accounts():
    base = make_base()
    acc = Accounts(base)
    acc.base_dir = base
    try:
        yield acc
    finally:
        acc.cleanup()
        shutil.rmtree(base, ignore_errors=True)


def as_user(root: Path, account, *args: str, env: dict | None = None) -> tuple[int, dict]:
    p = subprocess.run([str(root / "usr/local/bin/bk"), "--json", *args], capture_output=True, text=True,
                       timeout=60, cwd=account.home, user=account.uid, group=account.gid,
                       extra_groups=sorted(set(os.getgrouplist(account.name, account.gid)) - {account.gid}),
                       env=env or {"PATH": "/usr/bin:/bin", "HOME": account.home, "LANG": "C.UTF-8"})
    try:
        return p.returncode, json.loads(p.stdout)
    except ValueError:
        raise AssertionError(f"bk {' '.join(args)}: rc {p.returncode}: {p.stdout!r} {p.stderr!r}") from None


def launcher(root: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The staged install's own launcher, as root, with no --root and no BK_* of ours."""
    return subprocess.run([str(root / "opt/gpubk/bin/bk"), *args], capture_output=True, text=True, timeout=300,
                          env=env or {"PATH": "/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"})


class Services:
    """``bk admin services run`` of a staged install, stopped by its pid."""

    def __init__(self, root: Path, log: Path):
        self.root, self.socket = root, root / "run/gpubk/broker.sock"
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([str(root / "opt/gpubk/bin/bk"), "admin", "services", "run"],
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={"PATH": "/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"})
        self.log = log
        poll(lambda: self.socket.exists() and ping(self.socket) is not None or self.proc.poll() is not None,
             90, "the broker to answer")
        assert self.proc.poll() is None, log.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(120)
        assert self.proc.returncode == 0, self.log.read_text()


def test_switching_an_installed_server_to_group_access_and_back(pyz, root, accounts):
    svc = accounts.user()
    group, gid = accounts.group()
    ada = accounts.user(groups=(group,))
    bob = accounts.user()
    r = str(root)
    rc, env = install(pyz, root, "--service-user", svc.name)
    data, run = root / "var/lib/gpubk", root / "run/gpubk"
    assert owner_mode(data)[2] == 0o755
    services = Services(root, accounts.base_dir / "run1.log")
    try:
        assert as_user(root, bob, "1", "30m")[0] == 0             # everyone may book
        # While the services run (no systemd to restart them), the switch is
        # refused before anything changes: the broker would keep serving all.
        before = settled(root)
        p = launcher(root, "admin", "install", "--yes", "--no-start", "--access", "group", "--group", group)
        assert p.returncode == 75   # busy: stop them, then rerun, p.stdout + p.stderr
        assert "the configuration they read at start-up would change" in p.stderr
        assert "access" in p.stderr and "None" not in p.stdout + p.stderr
        assert settled(root) == before
    finally:
        services.stop()

    # The documented path (GUIDE 5.6), through the installed launcher.
    p = launcher(root, "admin", "install", "--yes", "--no-start", "--access", "group", "--group", group)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "None" not in p.stdout + p.stderr
    assert f'rewrite      {r}/etc/gpubk/config.json' in p.stdout and f'"{group}"' in p.stdout
    cfg = json.loads((root / "etc/gpubk/config.json").read_text())
    assert cfg["access"] == "group" and cfg["group"] == group and cfg["simulated_gpus"] is True
    assert owner_mode(data) == (svc.uid, gid, 0o750)
    assert owner_mode(run) == (svc.uid, gid, 0o2750)
    for name in ("gpubk-broker.service", "gpubk-monitor.service"):
        unit = (root / "etc/systemd/system" / name).read_text()
        assert f"\nGroup={group}\n" in unit and "\nRuntimeDirectoryMode=2750\n" in unit
    services = Services(root, accounts.base_dir / "run2.log")
    try:
        rc, env = as_user(root, ada, "1", "30m")
        assert rc == 0, env
        rc, env = as_user(root, bob, "1", "30m")
        assert rc == 5 and env["error"]["code"] == "permission_denied", env
        rc, env = as_user(root, bob, "l")
        assert rc == 5, env
        assert "mode 0660" in json.dumps(as_user(root, ada, "doctor", "--probe")[1])
    finally:
        services.stop()

    # And back: the group goes from the config, the directories are everyone's again.
    p = launcher(root, "--json", "admin", "install", "--yes", "--no-start", "--access", "all")
    assert p.returncode == 0, p.stdout + p.stderr
    cfg = json.loads((root / "etc/gpubk/config.json").read_text())
    assert cfg["access"] == "all" and "group" not in cfg
    assert owner_mode(data) == (svc.uid, svc.gid, 0o755)
    services = Services(root, accounts.base_dir / "run3.log")
    try:
        assert as_user(root, bob, "l")[0] == 0
    finally:
        services.stop()
    # Still removed without a trace.
    p = launcher(root, "--json", "admin", "uninstall", "--purge-data", "--yes")
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(os.listdir(root)) == []


def test_a_disagreeing_flag_is_named_without_python_words(pyz, root):
    install(pyz, root)
    p = bk(pyz, "admin", "install", "--root", str(root), "--yes", "--no-start", "--data-dir", "/srv/elsewhere",
           check=False)
    assert p.returncode == 2 and "--data-dir" in p.stderr
    assert "None" not in p.stdout + p.stderr


def test_a_staged_install_is_usable_through_its_own_launcher(pyz, root, tmp_path):
    install(pyz, root)
    r = str(root)
    # bk update: the plan for the staged install, not for /.
    p = launcher(root, "--json", "update")
    assert p.returncode == 0, p.stdout + p.stderr
    plan = json.loads(p.stdout)["data"]
    assert plan["root"] == r and plan["installed_version"], plan
    # bk admin services status: the staged units and socket.
    p = launcher(root, "--json", "admin", "services", "status")
    st = json.loads(p.stdout)["data"]
    assert st["units"] == {"gpubk-broker.service": True, "gpubk-monitor.service": True}, st
    # bk admin login-hook: status, install and uninstall under the staged root.
    p = launcher(root, "--json", "admin", "login-hook", "status")
    assert json.loads(p.stdout)["data"]["path"] == f"{r}/etc/profile.d/gpubk.sh"
    p = launcher(root, "--json", "admin", "login-hook", "install")
    assert p.returncode == 0 and (root / "etc/profile.d/gpubk.sh").is_file(), p.stdout + p.stderr
    p = launcher(root, "--json", "admin", "login-hook", "uninstall")
    assert p.returncode == 0 and not (root / "etc/profile.d/gpubk.sh").exists(), p.stdout + p.stderr
    # A private trial through the staged command: BK_DATA_DIR is private mode,
    # and the staged system config is no user config to refuse.
    os.chmod(tmp_path, 0o755)
    trial = tmp_path / "trial"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "BK_DATA_DIR": str(trial),
           "BK_GPU_COUNT": "2"}
    p = subprocess.run([str(root / "usr/local/bin/bk"), "--json", "1", "30m"], capture_output=True, text=True,
                       timeout=60, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout)["data"]["status"] == "created"
    p = subprocess.run([str(root / "usr/local/bin/bk"), "--json", "info"], capture_output=True, text=True,
                       timeout=60, env=env)
    assert json.loads(p.stdout)["data"]["mode"] == "private"
    # The archive run from anywhere else still means /.
    p = bk(pyz, "--json", "admin", "services", "status", check=False)
    assert json.loads(p.stdout)["data"]["units"]["gpubk-broker.service"] == os.path.exists(
        "/etc/systemd/system/gpubk-broker.service")
