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
import subprocess
from pathlib import Path

import pytest
from helpers_admin import as_nobody, private
from helpers_broker import needs_root, site
from helpers_install import staging_root  # noqa: F401  (the fixture "root")

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


# ------------------------------------------- trust of a backup (issue 22, 30)

def _manifest_entry(path, data: bytes, mode: int = 0o600) -> dict:
    import hashlib

    return {"path": path, "size": len(data), "mode": f"{mode:04o}", "sha256": hashlib.sha256(data).hexdigest()}


FORGE = """import hashlib, json, os, sys
root = sys.argv[1]
forged = json.dumps({"schema": "forged", "reservations": []}).encode()
os.unlink(os.path.join(root, "ledger.json"))
with open(os.path.join(root, "ledger.json"), "wb") as f:
    f.write(forged)
path = os.path.join(root, "manifest.json")
doc = json.load(open(path))
for e in doc["files"]:
    if e["path"] == "ledger.json":
        e.update(size=len(forged), sha256=hashlib.sha256(forged).hexdigest())
os.unlink(path)
with open(path, "w") as f:
    json.dump(doc, f)
print("swapped")
"""


@needs_root
@pytest.mark.root
def test_a_backup_another_account_can_change_is_never_made_verified_or_restored(bk):
    """Issue 22: root filled an existing empty directory owned by anyone; its
    owner swapped the ledger and the manifest, and verify said every checksum
    matched.  With a real second account: a directory it made is refused for
    a backup, one below its directory too, and a backup it could change
    (its directory, one file of its, a file others may write) is refused by
    verify and restore (exit 78), the data directory left alone."""
    from helpers_broker import Accounts

    bk.book("1", "30m", "--note", "genuine")
    os.chmod(bk.root, 0o755)
    shared = bk.root / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)                       # like /tmp
    accounts = Accounts(bk.root)
    try:
        mallory = accounts.user()

        def as_mallory(*argv):
            p = subprocess.run(list(argv), user=mallory.uid, group=mallory.gid, extra_groups=[],
                               capture_output=True, text=True, timeout=60, cwd="/")
            assert p.returncode == 0, (argv, p.stdout, p.stderr)
            return p.stdout

        # Her empty directory, and a new one below a directory of hers: refused.
        as_mallory("mkdir", "-m", "0700", str(shared / "pre"))
        as_mallory("mkdir", "-m", "0755", str(shared / "hers"))
        for target in (shared / "pre", shared / "hers" / "new"):
            env = bk.json("admin", "data", "backup", str(target), code=78)
            assert env["error"]["code"] == "config" and str(mallory.uid) in env["error"]["message"], env
        assert os.listdir(shared / "pre") == [] and os.listdir(shared / "hers") == []

        # A backup she controls (as the old code left one in her directory):
        # she swaps the ledger and fixes the manifest; verify and restore
        # refuse it.
        made = shared / "made"
        bk.data_of("admin", "data", "backup", str(made))
        for p in [made, *made.rglob("*")]:
            os.chown(p, mallory.uid, mallory.gid)
        assert as_mallory("/usr/bin/python3", "-c", FORGE, str(made)).strip() == "swapped"
        env = bk.json("admin", "data", "verify", str(made), code=78)
        assert "owned by uid" in env["error"]["message"], env
        bk.data_of("admin", "data", "clear", "--yes", "--backup-dir", str(bk.root / "kept"))
        env = bk.json("admin", "data", "restore", str(made), "--yes", code=78)
        assert env["error"]["code"] == "config" and os.listdir(bk.data) == []
        bk.data_of("admin", "data", "restore", str(bk.root / "kept"), "--yes")

        # Root's directory, but one file hers, or one others may write.
        for change in ("owner", "mode"):
            one = bk.root / f"one-{change}"
            bk.data_of("admin", "data", "backup", str(one))
            if change == "owner":
                os.chown(one / "audit.jsonl", mallory.uid, mallory.gid)
            else:
                os.chmod(one / "audit.jsonl", 0o646)
            env = bk.json("admin", "data", "verify", str(one), code=78)
            assert "audit.jsonl" in env["error"]["message"], env
    finally:
        accounts.cleanup()
    assert [r["note"] for r in bk.data_of("l")["reservations"]] == ["genuine"]


def test_restore_writes_only_bks_files_with_bks_modes(bk):
    """Issue 30: restore applied the manifest's modes (a 0666 ledger) and
    restored any file the manifest listed (a 6777 stray).  A listed file bk
    never keeps makes the backup fail verification; the modes restored are
    bk's, whatever the manifest says."""
    bk.book("1", "30m")
    dest = bk.root / "b"
    bk.data_of("admin", "data", "backup", str(dest))
    doc = json.loads((dest / "manifest.json").read_text())
    for e in doc["files"]:
        e["mode"] = "0666"
    stray = b"#!/bin/sh\nid\n"
    (dest / "stray").write_bytes(stray)
    os.chmod(dest / "stray", 0o755)
    doc["files"].append(_manifest_entry("stray", stray, 0o6777))
    (dest / "manifest.json").write_text(json.dumps(doc))
    env = bk.json("admin", "data", "verify", str(dest), code=1)
    assert {p["path"]: p["problem"] for p in env["data"]["problems"]} == {"stray": "unknown"}
    bk.data_of("admin", "data", "clear", "--yes", "--backup-dir", str(bk.root / "b2"))
    env = bk.json("admin", "data", "restore", str(dest), "--yes", code=1)
    assert env["data"]["status"] == "tampered" and os.listdir(bk.data) == []

    doc["files"] = [e for e in doc["files"] if e["path"] != "stray"]
    (dest / "manifest.json").write_text(json.dumps(doc))
    os.unlink(dest / "stray")
    assert bk.data_of("admin", "data", "restore", str(dest), "--yes")["status"] == "restored"
    modes = {str(p.relative_to(bk.data)): stat.S_IMODE(p.stat().st_mode) for p in bk.data.rglob("*")}
    assert modes["ledger.json"] == 0o600 and modes["audit.jsonl"] == 0o600 and modes["backups"] == 0o700
    assert modes == {p: 0o700 if (bk.data / p).is_dir() else 0o600 for p in modes}, modes
    assert not (bk.data / "stray").exists()
    bk.book("1", "30m", "--again")


def test_only_bks_files_are_copied_and_every_file_bk_wrote_is_one(bk):
    """The table of bk's files (``bk.store.backup.FILES``) against a data
    directory a real session filled: bookings, a job run by the worker, a
    preset, the monitor; anything else there is left out and named."""
    import sys
    import time

    bk.book("1", "30m")
    bk.run("1", "30m", "--", "echo", "hi")
    bk.run("w", "once")
    bk.run("p", "save", "mine", "1", "30m")
    mon = subprocess.Popen([sys.executable, str(bk.pyz), "m"], env=bk.env, cwd=bk.root,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (bk.data / "monitor" / "heartbeat.json").exists():
            assert time.monotonic() < deadline and mon.poll() is None
            time.sleep(0.05)
    finally:
        mon.terminate()
        mon.wait(30)
    (bk.data / "notes.txt").write_text("the administrator's")
    (bk.data / "scratch").mkdir()
    got = bk.data_of("admin", "data", "backup", str(bk.root / "b"))
    assert got["skipped"] == ["notes.txt", "scratch/"]
    listed = {f["path"] for f in got["files"]}
    on_disk = {str(p.relative_to(bk.data)) for p in bk.data.rglob("*") if p.is_file()
               and not p.name.endswith(".lock") and p.parts[-2:] != ("usage", ".lock")}
    assert on_disk - listed == {"notes.txt"}, on_disk - listed
    assert {"ledger.json", "monitor/heartbeat.json", "state/presets.json"} <= listed
    assert any(p.startswith("state/jobs/specs/") for p in listed) and any(p.startswith("usage/raw/") for p in listed) \
        or any(p.startswith("state/jobs/logs/") for p in listed)


def test_the_writers_names_are_bks_files():
    from bk.store import backup as b

    for rel in ("ledger.json", "ledger.json.damaged-20260713T104130Z-1a2b", "audit.jsonl", "cluster-node-id",
                "backups/ledger-0000000042.json", "archive/2026-07.jsonl",
                "audit.d/audit-0000000001-0000000900.jsonl", "audit.d/audit-0000000001-0000000900.jsonl.sha256",
                "monitor/snapshot.json", "monitor/heartbeat.json", "usage/raw/2026-07-13.jsonl",
                "usage/raw/2026-07-13.seal", "usage/hourly/2026-06-01.jsonl"):
        assert b.known(rel, shared=True) and b.known(rel, shared=False), rel
    for rel in ("state/presets.json", "state/jobs/specs/" + "a" * 32 + ".json", "state/jobs/logs/" + "a" * 32 + ".log.1"):
        assert b.known(rel, shared=False) and b.known(rel, shared=True) is None, rel
    for rel in ("stray", "ledger.json.bak", "backups/ledger-1.json", "../etc/passwd", "monitor/monitor.lock"):
        assert b.known(rel, shared=True) is None and b.known(rel, shared=False) is None, rel


def _can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare --mount (a private mount namespace)")
def test_a_backup_onto_a_full_disk_leaves_no_partial_directory(bk):
    """Issue 30: a backup that ran out of space left a partial directory.
    In a private mount namespace, a 64 KiB tmpfs takes the backup of a data
    directory several times that size: exit 74 naming the full disk, and
    nothing left on it."""
    import shlex
    import sys

    from bk.cli.app import run as in_process

    for i in range(30):         # in-process: thirty archive starts were most of this test's time
        assert in_process(["1", "30m", "-q", "--note", f"{i:02d} " + "n" * 900], dict(bk.env)) == 0
    size = sum(p.stat().st_size for p in bk.data.rglob("*") if p.is_file())
    assert size > 4 * 64 * 1024, size
    mnt = bk.root / "small"
    mnt.mkdir()
    out = bk.root / "out.json"
    cmd = " ".join(shlex.quote(w) for w in [sys.executable, str(bk.pyz), "--json", "admin", "data", "backup"])
    script = "\n".join([
        "set -e",
        f"mount -t tmpfs -o size=64k,mode=0755 tmpfs {mnt}",
        "set +e",
        f"{cmd} {mnt}/bak > {out}; echo $? > {out}.rc",
        f"{cmd} {mnt}/deeper/bak > {out}.2; echo $? >> {out}.rc",
        f"ls -A {mnt} > {out}.ls",
    ])
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                       env=bk.env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert Path(f"{out}.rc").read_text().split() == ["74", "74"], (out.read_text(), p.stderr)
    assert Path(f"{out}.ls").read_text() == ""                  # no partial backup, no parent made for one
    err = json.loads(out.read_text())["error"]
    assert err["code"] == "io_error" and "no space left" in err["message"] and "was removed" in err["message"], err


@needs_root
@pytest.mark.root
def test_purge_data_says_it_keeps_the_backups_and_does(pyz, root):
    """Issue 30: ``--purge-data`` keeps DATA_DIR-backups (the backups
    ``bk admin data backup`` made by default); the plan says so."""
    from helpers_install import bk as run
    from helpers_install import install

    install(pyz, root)
    kept = root / "var/lib/gpubk-backups"
    (kept / "20260713T104130Z").mkdir(parents=True, mode=0o700)
    (kept / "20260713T104130Z" / "manifest.json").write_text("{}")
    plan = json.loads(run(pyz, "--json", "admin", "uninstall", "--root", str(root), "--dry-run",
                          "--purge-data").stdout)["data"]
    assert plan["kept"] == [str(kept)]
    said = run(pyz, "admin", "uninstall", "--root", str(root), "--dry-run", "--purge-data").stdout
    assert f"keep         {kept}  [backups;" in said
    run(pyz, "admin", "uninstall", "--root", str(root), "--purge-data", "--yes")
    assert (kept / "20260713T104130Z" / "manifest.json").exists()
    assert not (root / "var/lib/gpubk").exists()
