"""``bk update``: preview, apply, verify with the new archive, roll back a broken one.

Root only.  A staging root without systemd: the update runs the new broker
unit's ExecStart= as its User= for the verification (``bk doctor --probe
--strict``), so the check is real.  Bookings are made through a real broker
(the unit's ExecStart=, as nobody) and compared booking by booking after.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers_install import bk, install, staging_root, variant  # noqa: F401 - the root fixture

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root"), pytest.mark.root]


def launcher(root: Path, *args: str, user: int | None = None):
    import subprocess

    cmd = [str(root / "opt/gpubk/bin/bk"), *args]
    if user is not None:
        cmd = ["setpriv", "--reuid", str(user), "--regid", str(user), "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": "/"})


def bookings(root: Path) -> list[dict]:
    p = launcher(root, "--json", "l", "--all")
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads(p.stdout)["data"]
    return sorted(({k: r[k] for k in ("id", "gpus", "start", "end", "user")} for r in data["reservations"]),
                  key=lambda r: r["id"])


def with_bookings(pyz: Path, root: Path) -> list[dict]:
    from bk.admin.services import TemporaryService

    install(pyz, root)
    with TemporaryService(str(root / "etc/systemd/system/gpubk-broker.service"), f"{root}/run/gpubk/broker.sock"):
        for words in (["1", "30m"], ["2", "1h", "-t", "+2h"], ["x", "1", "20m"]):
            p = launcher(root, "--json", *words)
            assert p.returncode == 0, p.stdout + p.stderr
    found = bookings(root)
    assert len(found) == 3
    return found


def test_update_preview_changes_nothing(pyz, root, tmp_path):
    install(pyz, root)
    new = variant(pyz, tmp_path / "new.pyz", version="9.8.7")
    before = (root / "opt/gpubk/bk.pyz").read_bytes()
    p = bk(pyz, "--json", "update", str(new), "--root", str(root))
    data = json.loads(p.stdout)["data"]
    assert data["status"] == "plan" and data["new_version"] == "9.8.7"
    assert any("doctor --probe --strict" in s for s in data["steps"])
    assert (root / "opt/gpubk/bk.pyz").read_bytes() == before


def test_update_replaces_the_archive_and_keeps_every_booking(pyz, root, tmp_path):
    kept = with_bookings(pyz, root)
    new = variant(pyz, tmp_path / "new.pyz", version="9.8.7")
    p = bk(pyz, "--json", "update", str(new), "--apply", "--yes", "--root", str(root), check=False)
    data = json.loads(p.stdout)["data"]
    assert p.returncode == 0 and data["status"] == "updated", data.get("verify")
    assert data["verify"]["ok"] is True
    assert launcher(root, "--version").stdout.strip() == "bk 9.8.7"
    assert bookings(root) == kept
    assert not (root / "opt/gpubk/bk.pyz.previous").exists()
    # Still removable as a whole after the upgrade.
    bk(pyz, "admin", "uninstall", "--root", str(root), "--yes", "--purge-data")
    assert os.listdir(root) == []


def test_a_broken_archive_is_rolled_back(pyz, root, tmp_path):
    kept = with_bookings(pyz, root)
    before = (root / "opt/gpubk/bk.pyz").read_bytes()
    bad = variant(pyz, tmp_path / "bad.pyz", version="6.6.6", broken=True)
    p = bk(pyz, "--json", "update", str(bad), "--apply", "--yes", "--root", str(root), check=False)
    data = json.loads(p.stdout)["data"]
    assert p.returncode == 1 and data["status"] == "rolled_back"
    assert data["verify"]["ok"] is False
    assert (root / "opt/gpubk/bk.pyz").read_bytes() == before
    assert launcher(root, "--version").stdout.strip() != "bk 6.6.6"
    assert bookings(root) == kept
    bk(pyz, "admin", "uninstall", "--root", str(root), "--yes", "--purge-data")
    assert os.listdir(root) == []


def test_a_failed_verification_names_doctors_failing_checks(pyz, root, tmp_path):
    """Issue 30 item 13: the rollback printed the raw last 1500 characters
    of doctor's JSON, cut mid-object."""
    with_bookings(pyz, root)
    bad = variant(pyz, tmp_path / "bad.pyz", version="6.6.7", failing=True)
    p = bk(pyz, "update", str(bad), "--apply", "--yes", "--root", str(root), check=False)
    assert p.returncode == 1, p.stdout + p.stderr
    text = p.stdout
    assert "failed its verification; rolled back" in text
    assert "  selftest: FAIL: failed on purpose xxx" in text and "    fix: use the other archive" in text
    assert '"checks"' not in text and '{"' not in text and '"detail"' not in text, text
    bk(pyz, "admin", "uninstall", "--root", str(root), "--yes", "--purge-data")


def test_anyone_may_preview_but_only_root_applies(pyz, root):
    install(pyz, root)
    new = variant(pyz, root / "incoming.pyz", version="9.8.7")     # where nobody can read it
    os.chmod(new, 0o644)
    p = launcher(root, "--json", "update", str(new), "--root", str(root), user=65534)
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout)["data"]["installed_version"] is not None
    p = launcher(root, "--json", "update", str(new), "--apply", "--yes", "--root", str(root), user=65534)
    err = json.loads(p.stdout)["error"]
    assert p.returncode == 5 and err["code"] == "permission_denied" and err["hint"].startswith("sudo bk update --apply")


def test_the_installed_command_can_upgrade_itself(pyz, root, tmp_path):
    """``sudo bk update NEW.pyz --apply`` run by the installed bk replaces the
    very archive it runs from, and still finishes and reports."""
    kept = with_bookings(pyz, root)
    new = variant(pyz, tmp_path / "new.pyz", version="9.8.8")
    os.chmod(tmp_path, 0o755)
    p = launcher(root, "--json", "update", str(new), "--apply", "--yes", "--root", str(root))
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout)["data"]["status"] == "updated"
    assert launcher(root, "--version").stdout.strip() == "bk 9.8.8"
    assert bookings(root) == kept
