"""``bk admin data backup|verify|clear|restore`` through the built archive:
a checksummed copy, a tampered backup named and refused, clear backs up
first, restore only into an empty data directory; on a shared server clear
and restore refuse while the broker runs (exit 75), and a restore gives the
files back to the service account."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat

import pytest
from helpers_admin import as_nobody, private
from helpers_broker import needs_root, site

pytestmark = pytest.mark.slow


@pytest.fixture
def bk(pyz):
    yield from private(pyz)


def _files(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            and p.name != "ledger.lock"}


def test_backup_verify_tamper_clear_restore(bk):
    a = bk.book("1", "30m")
    b = bk.book("2", "1h", "-t", "12:00")
    bk.data_of("d", a["short_id"], "-y")
    dest = bk.root / "b1"
    got = bk.data_of("admin", "data", "backup", str(dest))
    paths = {f["path"] for f in got["files"]}
    assert {"ledger.json", "audit.jsonl"} <= paths and any(p.startswith("backups/") for p in paths)
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["bk_version"] and manifest["format"] == "gpubk.backup"
    assert all(len(f["sha256"]) == 64 for f in manifest["files"])
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o700
    assert bk.data_of("admin", "data", "verify", str(dest))["status"] == "verified"

    # A backup directory that is not empty is refused; so is one inside the data.
    assert bk.json("admin", "data", "backup", str(dest), code=2)["error"]["code"] == "invalid_input"
    assert bk.json("admin", "data", "backup", str(bk.data / "x"), code=2)["error"]["code"] == "invalid_input"

    # Restore only into an empty data directory.
    env = bk.json("admin", "data", "restore", str(dest), "--yes", code=2)
    assert "not empty" in env["error"]["message"]

    # Clear backs up first, then empties the data directory.
    before = _files(bk.data)
    assert bk.json("admin", "data", "clear", code=2)["error"]["message"].endswith("confirm with --yes")
    cleared = bk.data_of("admin", "data", "clear", "--yes", "--backup-dir", str(bk.root / "b2"))
    assert cleared["status"] == "cleared" and os.listdir(bk.data) == []
    assert bk.data_of("admin", "data", "verify", str(bk.root / "b2"))["status"] == "verified"
    assert bk.data_of("l")["reservations"] == []

    done = bk.data_of("admin", "data", "restore", str(bk.root / "b2"), "--yes")
    assert done["status"] == "restored"
    assert _files(bk.data) == before
    assert [r["id"] for r in bk.data_of("l")["reservations"]] == [b["id"]]
    assert [e["action"] for e in bk.data_of("history", b["short_id"])["events"]] == ["create"]
    bk.book("1", "30m", "--again")                         # and it writes on


def test_a_tampered_backup_names_the_file_and_is_not_restored(bk):
    bk.book("1", "30m")
    dest = bk.root / "b"
    bk.data_of("admin", "data", "backup", str(dest))
    with open(dest / "audit.jsonl", "a") as f:
        f.write('{"seq": 99, "index": 0}\n')
    (dest / "stray.json").write_text("{}")
    env = bk.json("admin", "data", "verify", str(dest), code=1)
    problems = {p["path"]: p["problem"] for p in env["data"]["problems"]}
    assert problems == {"audit.jsonl": "changed", "stray.json": "unlisted"}
    assert "audit.jsonl" in bk.run("admin", "data", "verify", str(dest), code=1).stdout
    (dest / "stray.json").unlink()
    os.unlink(dest / "ledger.json")
    bk.data_of("admin", "data", "clear", "--yes", "--backup-dir", str(bk.root / "b2"))
    env = bk.json("admin", "data", "restore", str(dest), "--yes", code=1)
    assert env["data"]["status"] == "tampered" and os.listdir(bk.data) == []


def test_dry_runs_change_nothing(bk):
    bk.book("1", "30m")
    before = _files(bk.data)
    got = bk.data_of("admin", "data", "backup", "--dry-run")
    assert got["backup_dir"].startswith(str(bk.root / "data-backups"))
    assert bk.data_of("admin", "data", "clear", "--dry-run")["status"] == "dry_run"
    assert _files(bk.data) == before and not (bk.root / "data-backups").exists()


def test_clear_refuses_while_a_writer_holds_the_lock(bk):
    bk.book("1", "30m")
    fd = os.open(bk.data / "ledger.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        env = bk.json("admin", "data", "clear", "--yes", code=75)
        assert env["error"]["code"] == "busy" and "stop the services" in env["error"]["hint"]
    finally:
        os.close(fd)
    assert (bk.data / "ledger.json").exists()


@needs_root
@pytest.mark.root
@pytest.mark.parametrize("argv", [["admin", "data", "backup"], ["admin", "data", "verify", "/tmp"],
                                  ["admin", "data", "clear", "--yes"], ["admin", "data", "restore", "/tmp", "--yes"]],
                         ids=" ".join)
def test_non_root_is_refused(pyz, argv):
    p = as_nobody(pyz, *argv)
    assert p.returncode == 5 and json.loads(p.stdout)["error"]["code"] == "permission_denied"


@needs_root
@pytest.mark.root
def test_shared_server_services_must_be_stopped_and_restore_keeps_the_service_owner():
    if not shutil.which("useradd"):
        pytest.skip("needs useradd")
    with site() as srv:
        ada = srv.accounts.user()
        assert srv.init().returncode == 0
        srv.start_broker()
        rc, env = srv.run_json(ada, "1", "1h", "--note", "keep me")
        assert rc == 0, env
        booked = env["data"]["reservation"]
        dest = srv.base / "bak"
        rc, env = srv.run_json(None, "admin", "data", "backup", str(dest))     # fine while running
        assert rc == 0, env
        for argv in (["clear", "--yes"], ["restore", str(dest), "--yes"]):
            rc, env = srv.run_json(None, "admin", "data", *argv)
            assert rc == 75 and env["error"]["code"] == "busy", env
            assert "broker is running" in env["error"]["message"]
        modes = {str(p.relative_to(srv.data)): stat.S_IMODE(p.stat().st_mode)
                 for p in srv.data.rglob("*") if p.is_file() and p.name != "ledger.lock"}
        srv.stop_broker()
        rc, env = srv.run_json(None, "admin", "data", "clear", "--yes", "--backup-dir", str(srv.base / "bak2"))
        assert rc == 0 and env["data"]["status"] == "cleared", env
        rc, env = srv.run_json(None, "admin", "data", "restore", str(dest), "--yes")
        assert rc == 0, env
        st = os.stat(srv.data)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (srv.service.uid, 0o755)
        for p in srv.data.rglob("*"):
            assert p.stat().st_uid == srv.service.uid, p
            if p.is_file():
                assert stat.S_IMODE(p.stat().st_mode) == modes[str(p.relative_to(srv.data))], p
        srv.start_broker()
        rc, env = srv.run_json(ada, "l")
        assert [r["id"] for r in env["data"]["reservations"]] == [booked["id"]]
        rc, env = srv.run_json(ada, "1", "30m", "--again")
        assert rc == 0, env
