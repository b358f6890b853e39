"""Installing again: over a data directory an uninstall kept (issue 30,
item 3), and with an archive older than the installed one (item 12).

Over kept data the new configuration must say what the kept ledger bound
at its first booking, or the broker cannot start (``bk broker --check``
exits 78 with ``slot_minutes: ledger 10, configuration 5``); a flag that
disagrees with the ledger is refused, naming both.  A downgrade, by
``bk admin install`` or ``bk update``, is said as one and asked; under
``--yes`` it is refused unless ``--allow-downgrade``.

Root only: the staging root's broker runs as ``nobody`` (the unit's
``ExecStart=``), and ``bk broker --check`` runs as ``nobody`` too.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers_install import NOBODY, PYTHON, bk, converse, install, staging_root, tree, variant  # noqa: F401

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="needs root"), pytest.mark.root]


def launcher(root: Path, *args: str, user: int | None = None) -> subprocess.CompletedProcess:
    cmd = [str(root / "opt/gpubk/bin/bk"), *args]
    if user is not None:
        cmd = ["setpriv", "--reuid", str(user), "--regid", str(user), "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": "/"})


def book_one(root: Path) -> None:
    from bk.admin.services import TemporaryService

    with TemporaryService(str(root / "etc/systemd/system/gpubk-broker.service"), f"{root}/run/gpubk/broker.sock"):
        p = launcher(root, "--json", "1", "30m")
        assert p.returncode == 0, p.stdout + p.stderr


def test_a_reinstall_over_kept_data_keeps_the_ledgers_policy(pyz, root):
    install(pyz, root, "--slot-minutes", "10", "--max-shared-users", "3")
    book_one(root)                                    # the first booking binds the policy
    bk(pyz, "admin", "uninstall", "--root", str(root), "--yes")
    assert (root / "var/lib/gpubk/ledger.json").exists() and not (root / "etc/gpubk/config.json").exists()

    # A flag that disagrees with the kept ledger is refused, naming both values.
    before = tree(root)
    rc, env = install(pyz, root, "--slot-minutes", "5", check=False)
    assert rc == 2 and "--slot-minutes 5 (ledger: 10)" in env["error"]["message"], env
    assert tree(root) == before
    p = bk(pyz, "admin", "install", "--root", str(root), "--dry-run", "--service-user", "nobody",
           "--python", PYTHON)
    assert "kept data: the ledger in" in p.stdout and "slot_minutes 10" in p.stdout, p.stdout
    p = bk(pyz, "--json", "admin", "install", "--root", str(root), "--dry-run", "--service-user", "nobody",
           "--python", PYTHON)
    data = json.loads(p.stdout)["data"]
    assert data["kept_ledger_policy"]["slot_minutes"] == 10 and data["config"]["gpu_count"] == 4, data
    assert tree(root) == before

    # Without the flags, guided at a terminal: the bound settings are not
    # asked (they stay), and the new config carries them.
    env = {"PATH": "/usr/bin:/bin", "HOME": "/root", "TERM": "dumb", "LANG": "C.UTF-8"}
    rc, text = converse([PYTHON, str(pyz), "admin", "install", "--root", str(root), "--no-start",
                         "--service-user", "nobody", "--python", PYTHON], env,
                        [("Service account", b"\n"), ("Administrator contact", b"\n"), ("Who may book", b"\n"), ("Data directory", b"\n"), ("The bk command", b"\n"),
                         ("Show notices at login", b"\n"), ("Apply this plan?", b"\n")])
    assert rc == 0, text[-3000:]
    assert "keeps a ledger: its GPU count (4), slices (10 min) and share slots (3) stay" in text, text
    assert "Slice length" not in text and "How many GPUs" not in text and "Share slots" not in text
    cfg = json.loads((root / "etc/gpubk/config.json").read_text())
    assert cfg["slot_minutes"] == 10 and cfg["max_shared_users"] == 3 and cfg["gpu_count"] == 4
    p = launcher(root, "broker", "--check", user=NOBODY)
    assert p.returncode == 0, p.stdout + p.stderr
    # The kept data is the new install's: --purge-data takes the bookings with the rest.
    bk(pyz, "admin", "uninstall", "--root", str(root), "--yes", "--purge-data")
    assert os.listdir(root / "var/lib/gpubk") == [] and not (root / "etc").exists()


def test_a_kept_ledger_with_a_rebound_memory_rule_keeps_it(pyz, root):
    """The memory rule is bound too and no install flag sets it: it is
    carried into the new config from the ledger."""
    install(pyz, root)
    cfg_path = root / "etc/gpubk/config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["shared_memory_reserve_mb"] = 2048             # set before the first booking, as an administrator may
    cfg_path.write_text(json.dumps(cfg))
    book_one(root)
    bk(pyz, "admin", "uninstall", "--root", str(root), "--yes")
    install(pyz, root)
    assert json.loads(cfg_path.read_text())["shared_memory_reserve_mb"] == 2048
    p = launcher(root, "broker", "--check", user=NOBODY)
    assert p.returncode == 0, p.stdout + p.stderr
    bk(pyz, "admin", "uninstall", "--root", str(root), "--yes", "--purge-data")


def test_install_says_downgrade_and_refuses_it_under_yes(pyz, root, tmp_path):
    os.chmod(tmp_path, 0o755)
    newer = variant(pyz, tmp_path / "newer.pyz", version="9.8.7")
    rc, env = install(newer, root)
    assert env["data"]["direction"] == "new"
    assert launcher(root, "--version").stdout.strip() == "bk 9.8.7"
    before = tree(root)
    p = bk(pyz, "admin", "install", "--root", str(root), "--dry-run", "--python", PYTHON)
    assert "DOWNGRADE: bk 9.8.7 is installed; this archive is the older bk" in p.stdout, p.stdout
    rc, env = install(pyz, root, check=False)
    assert rc == 2 and "a downgrade" in env["error"]["message"] and "--allow-downgrade" in env["error"]["hint"]
    assert tree(root) == before
    rc, env = install(pyz, root, "--allow-downgrade")
    assert env["data"]["direction"] == "downgrade" and env["data"]["installed_version"] == "9.8.7"
    assert launcher(root, "--version").stdout.strip() != "bk 9.8.7"
    # And up again: an upgrade needs no flag.
    rc, env = install(newer, root)
    assert env["data"]["direction"] == "upgrade"
    bk(pyz, "admin", "uninstall", "--root", str(root), "--yes", "--purge-data")


def test_update_says_downgrade_and_refuses_it_under_yes(pyz, root, tmp_path):
    os.chmod(tmp_path, 0o755)
    newer = variant(pyz, tmp_path / "newer.pyz", version="9.8.7")
    install(newer, root)
    p = bk(pyz, "update", str(pyz), "--root", str(root))
    assert "this is a DOWNGRADE: bk 9.8.7 would be replaced by the older bk" in p.stdout, p.stdout
    before = tree(root)
    p = bk(pyz, "--json", "update", str(pyz), "--apply", "--yes", "--root", str(root), check=False)
    err = json.loads(p.stdout)["error"]
    assert p.returncode == 2 and "a downgrade" in err["message"] and "--allow-downgrade" in err["hint"]
    assert tree(root) == before
    p = bk(pyz, "--json", "update", str(pyz), "--apply", "--yes", "--allow-downgrade", "--root", str(root),
           check=False)
    data = json.loads(p.stdout)["data"]
    assert p.returncode == 0 and data["status"] == "updated" and data["direction"] == "downgrade", data
    assert launcher(root, "--version").stdout.strip() != "bk 9.8.7"
    bk(pyz, "admin", "uninstall", "--root", str(root), "--yes", "--purge-data")


def test_at_a_terminal_a_downgrade_is_asked_and_enter_keeps_what_is_installed(pyz, root, tmp_path):
    os.chmod(tmp_path, 0o755)
    newer = variant(pyz, tmp_path / "newer.pyz", version="9.8.7")
    install(newer, root)
    before = tree(root)
    env = {"PATH": "/usr/bin:/bin", "HOME": "/root", "TERM": "dumb", "LANG": "C.UTF-8"}
    rc, text = converse([PYTHON, str(pyz), "update", str(pyz), "--apply", "--root", str(root)], env,
                        [("Downgrade now? [y/N]", b"\n")])
    assert rc == 1 and "nothing changed" in text, text
    rc, text = converse([PYTHON, str(pyz), "admin", "install", "--root", str(root), "--no-start",
                         "--python", PYTHON], env, [("Downgrade bk 9.8.7 to", b"\n")])
    assert rc == 1 and "DOWNGRADE" in text and "[y/N]" in text and "--allow-downgrade" in text, text
    assert tree(root) == before
    bk(pyz, "admin", "uninstall", "--root", str(root), "--yes", "--purge-data")
