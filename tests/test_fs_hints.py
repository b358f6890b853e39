"""Error hints that match the cause, through the built archive: a regular
file where the data directory should be is not about links; a read-only
file system is not a permission problem, and ``bk doctor`` (without
``--probe``) fails its data-directory check on one.  The read-only case
mounts a tmpfs in a private mount namespace (``unshare --mount``, root
only), so nothing outside the test sees it."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def bk_env(tmp: Path, data: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update(HOME=str(tmp), BK_DATA_DIR=str(data), BK_GPU_COUNT="4", TZ="UTC", NO_COLOR="1",
               XDG_CONFIG_HOME=str(tmp / "cfg"), XDG_STATE_HOME=str(tmp / "st"),
               BK_NOW="2026-07-13T10:41:30Z")
    return env


def run(pyz, env, *argv):
    return subprocess.run([sys.executable, str(pyz), "--json", *argv], env=env, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=60)


def doctor_check(doc: dict, name: str) -> dict:
    [c] = [c for c in doc["data"]["checks"] if c["name"] == name]
    return c


def test_a_regular_file_as_the_data_directory_is_not_called_a_link(pyz, tmp_path):
    data = tmp_path / "data"
    data.write_text("not a directory\n")
    env = bk_env(tmp_path, data)
    r = run(pyz, env, "1", "30m")
    assert r.returncode == 78, r.stdout + r.stderr
    err = json.loads(r.stdout)["error"]
    assert err["message"] == f"refusing to use {data}: it is a regular file, not a directory"
    assert "link" not in err["hint"] and f"mv {data} {data}.old" in err["hint"]
    doc = json.loads(run(pyz, env, "doctor").stdout)
    assert doc["data"]["ok"] is False
    check = doctor_check(doc, "data directory")
    assert not check["ok"] and "regular file" in check["detail"] and "link" not in check["detail"]


def test_a_symbolic_link_as_the_data_directory_still_says_links(pyz, tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    data = tmp_path / "data"
    data.symlink_to(tmp_path / "real")
    r = run(pyz, bk_env(tmp_path, data), "1", "30m")
    assert r.returncode == 78
    err = json.loads(r.stdout)["error"]
    assert "symbolic link" in err["message"] and "does not follow links" in err["hint"]


def _can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                          capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare --mount (a private mount namespace)")
def test_a_read_only_file_system_is_named_and_fails_doctor(pyz, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    data = mnt / "data"
    env = bk_env(tmp_path, data)
    out = tmp_path / "out"
    out.mkdir()
    bk = f"{shlex.quote(sys.executable)} {shlex.quote(str(pyz))} --json"
    # One shell in its own mount namespace: book on a writable tmpfs, remount
    # it read-only, then book again and ask the doctor.  The mount dies with
    # the namespace.
    script = "\n".join([
        "set -e",
        f"mount -t tmpfs -o size=16m tmpfs {mnt}",
        f"{bk} 1 30m > {out}/first.json",
        f"mount -o remount,ro {mnt}",
        "set +e",
        f"{bk} 1 30m > {out}/second.json; echo $? > {out}/second.rc",
        f"{bk} doctor > {out}/doctor.json; echo $? > {out}/doctor.rc",
        f"BK_DATA_DIR={mnt}/fresh {bk} doctor > {out}/fresh.json; echo $? > {out}/fresh.rc",
    ])
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads((out / "first.json").read_text())["ok"]
    assert (out / "second.rc").read_text().strip() == "74"
    err = json.loads((out / "second.json").read_text())["error"]
    assert err["code"] == "io_error" and "read-only file system" in err["message"]
    assert "permission" not in err["message"] + err["hint"]
    assert f"mount -o remount,rw {mnt}" in err["hint"] and "BK_DATA_DIR" in err["hint"]
    for name in ("doctor", "fresh"):          # an existing data directory, and one yet to be made
        doc = json.loads((out / f"{name}.json").read_text())
        assert doc["data"]["ok"] is False            # plain doctor, no --probe
        check = doctor_check(doc, "data directory")
        assert not check["ok"] and "read-only file system" in check["detail"], check
        assert f"mount -o remount,rw {mnt}" in check["detail"]
    assert not os.path.exists(data)                       # the tmpfs is gone with its namespace


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd") or not os.path.exists("/usr/bin/python3"),
                    reason="needs root, useradd and /usr/bin/python3 (a real user: root writes anywhere)")
def test_an_unwritable_state_directory_is_named_and_fails_doctor(pyz):
    """Issue 30 item 11: the hint sent the user to "the data directory (bk
    doctor)", and doctor, which did not look at the state directory, passed."""
    from helpers_broker import SYSTEM_PYTHON, Accounts, make_base

    base = make_base()
    accounts = Accounts(base)
    try:
        ada = accounts.user()
        archive = base / "bk.pyz"
        shutil.copy(pyz, archive)
        os.chmod(archive, 0o644)
        home = Path(ada.home)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "TZ": "UTC", "NO_COLOR": "1",
               "BK_DATA_DIR": str(home / "data"), "BK_GPU_COUNT": "4"}

        def bk(*argv):
            p = subprocess.run([SYSTEM_PYTHON, str(archive), "--json", *argv], env=env, capture_output=True,
                               text=True, stdin=subprocess.DEVNULL, timeout=60, cwd=home, user=ada.uid,
                               group=ada.gid, extra_groups=[])
            return p.returncode, json.loads(p.stdout)

        assert bk("p", "save", "small", "1", "30m")[0] == 0
        state = home / "data" / "state"
        assert state.is_dir()
        os.chmod(state, 0o555)
        code, env_ = bk("p", "save", "big", "4", "2h")
        assert code == 74, env_
        hint = env_["error"]["hint"]
        assert str(state) in hint and "0555" in hint and "data directory" not in hint, hint
        code, doc = bk("doctor", "--strict")
        assert code == 1 and "state directory" in doc["data"]["failed"], doc
        check = doctor_check(doc, "state directory")
        assert str(state) in check["detail"] and check["fix"] == f"chmod u+rwx {state}"
        os.chmod(state, 0o700)
        code, doc = bk("doctor")
        assert doctor_check(doc, "state directory")["ok"]
        assert bk("p", "save", "big", "4", "2h")[0] == 0
    finally:
        accounts.cleanup()
        shutil.rmtree(base, ignore_errors=True)
