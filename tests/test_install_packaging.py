"""What a distribution packager needs from ``bk admin install``, through
the built archive: ``--destdir`` stages a package's files naming their
final paths (no configuration, data or manifest; run by an ordinary user);
the shipped ``sysusers.d`` and ``tmpfiles.d`` files make the account and
the data directory the units name; the guides land in
``/usr/share/doc/gpubk`` where bk(1) points; and a hand install keeps its
completion under ``/usr/local``.

The account and tmpfiles checks run systemd's own tools against the staged
tree (``--root``), never against this machine; systemd is never started.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers_broker import SYSTEM_PYTHON, Accounts, make_base, needs_root

from tests.helpers_install import install, staging_root  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.root, pytest.mark.slow, needs_root]


@pytest.fixture
def packager(pyz):
    """An ordinary account, a build directory it owns and a copy of the archive it can read."""
    base = make_base()
    accounts = Accounts(base)
    try:
        who = accounts.user()
        build = base / "build"
        build.mkdir(mode=0o755)
        os.chown(build, who.uid, who.gid)
        archive = base / "bk.pyz"
        shutil.copy(pyz, archive)
        os.chmod(archive, 0o644)
        yield who, build, archive
    finally:
        accounts.cleanup()
        shutil.rmtree(base, ignore_errors=True)


def stage(who, archive: Path, dest: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([SYSTEM_PYTHON, str(archive), "--json", "admin", "install", "--destdir", str(dest),
                           "--python", SYSTEM_PYTHON, *extra], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "HOME": who.home, "LANG": "C.UTF-8"}, cwd=who.home,
                          user=who.uid, group=who.gid, extra_groups=[])


def files_under(dest: Path) -> dict[str, Path]:
    out = {}
    for dirpath, _dirs, names in os.walk(dest):
        for name in names:
            path = Path(dirpath, name)
            if not path.is_symlink():
                out["/" + str(path.relative_to(dest))] = path
    return out


def test_destdir_stages_a_package_that_names_its_final_paths(packager):
    who, dest, archive = packager
    p = stage(who, archive, dest)
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads(p.stdout)["data"]
    assert data["status"] == "staged" and data["service_user"] == "gpubk"
    staged = files_under(dest)
    for path in ("/opt/gpubk/bk.pyz", "/opt/gpubk/bin/bk", "/usr/lib/systemd/system/gpubk-broker.service",
                 "/usr/lib/systemd/system/gpubk-monitor.service", "/usr/lib/systemd/user/bk-worker.service",
                 "/usr/share/man/man1/bk.1", "/usr/share/man/man5/gpubk-config.5", "/usr/share/man/man8/bk-admin.8",
                 "/usr/share/bash-completion/completions/bk", "/usr/share/zsh/site-functions/_bk",
                 "/usr/share/doc/gpubk/GUIDE.md", "/usr/share/doc/gpubk/GUIDE.zh-CN.md",
                 "/usr/lib/sysusers.d/gpubk.conf", "/usr/lib/tmpfiles.d/gpubk.conf", "/usr/bin/bk"):
        assert path in staged or os.path.islink(str(dest) + path), path
    assert {f["path"] for f in data["files"]} == set(staged)
    assert data["command_link"] == {"path": "/usr/bin/bk", "target": "/opt/gpubk/bin/bk"}
    # What only the server's own install writes is not there.
    for path in ("/etc/gpubk/config.json", "/etc/gpubk/install-manifest.json"):
        assert path not in staged
    assert not (dest / "var").exists() and not (dest / "run").exists()
    # Owned by the packager: no root was needed.
    assert all(p.lstat().st_uid == who.uid for p in staged.values())
    # Every file names the final paths, never the staging directory.
    for path, real in staged.items():
        assert str(dest).encode() not in real.read_bytes(), path
    assert os.readlink(dest / "usr/bin/bk") == "/opt/gpubk/bin/bk"
    broker = (dest / "usr/lib/systemd/system/gpubk-broker.service").read_text()
    assert "\nExecStart=/opt/gpubk/bin/bk broker\n" in broker and "\nUser=gpubk\n" in broker
    assert "\nGroup=gpubk\n" in broker and "\nType=notify\n" in broker
    assert "\nReadWritePaths=/var/lib/gpubk\n" in broker
    launcher = (dest / "opt/gpubk/bin/bk").read_text()
    assert "BK_CONFIG_FILE" not in launcher and launcher.rstrip().endswith(
        f'exec {SYSTEM_PYTHON} /opt/gpubk/bk.pyz "$@"')
    assert (dest / "usr/share/doc/gpubk/GUIDE.md").read_bytes() == (ROOT / "docs/GUIDE.md").read_bytes()
    # bk(1)'s pointer to the guide resolves in the package.
    page = (dest / "usr/share/man/man1/bk.1").read_text()
    pointer = re.search(r"\\fI(/usr/share/doc/gpubk/GUIDE\.md)\\fR", page)
    assert pointer and (dest / pointer.group(1).lstrip("/")).is_file()
    assert not re.search(r"@[A-Z_]+@", broker + (dest / "usr/lib/sysusers.d/gpubk.conf").read_text())


@pytest.mark.skipif(not (shutil.which("systemd-sysusers") and shutil.which("systemd-tmpfiles")),
                    reason="systemd-sysusers and systemd-tmpfiles are not installed")
def test_sysusers_and_tmpfiles_make_the_account_and_directory_the_units_name(packager):
    who, dest, archive = packager
    p = stage(who, archive, dest, "--access", "group", "--group", "gpuusers", "--data-dir", "/srv/gpubk")
    assert p.returncode == 0, p.stdout + p.stderr
    # systemd's tools, against the staged tree as the target's root, owned
    # by root as the package manager installs it.
    subprocess.run(["chown", "-R", "0:0", str(dest)], check=True)
    (dest / "etc").mkdir(exist_ok=True)
    (dest / "etc/group").write_text("gpuusers:x:4242:\n")
    for tool in (["systemd-sysusers", f"--root={dest}"], ["systemd-tmpfiles", "--create", f"--root={dest}"]):
        r = subprocess.run(tool, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    passwd = {ln.split(":")[0]: ln.split(":") for ln in (dest / "etc/passwd").read_text().splitlines()}
    assert "gpubk" in passwd and passwd["gpubk"][5] == "/srv/gpubk" and passwd["gpubk"][6] == "/usr/sbin/nologin"
    st = (dest / "srv/gpubk").stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (int(passwd["gpubk"][2]), 4242, 0o750)
    unit = (dest / "usr/lib/systemd/system/gpubk-monitor.service").read_text()
    assert "\nUser=gpubk\n" in unit and "\nGroup=gpuusers\n" in unit and "\nRuntimeDirectoryMode=2750\n" in unit


def test_destdir_refuses_what_belongs_in_the_configuration(packager):
    who, dest, archive = packager
    p = stage(who, archive, dest, "--gpu-count", "8")
    assert p.returncode == 2 and "--gpu-count" in json.loads(p.stdout)["error"]["message"]
    assert os.listdir(dest) == []
    p = stage(who, archive, dest, "--root", "/tmp")
    assert p.returncode == 2 and os.listdir(dest) == []


def test_a_hand_install_keeps_completion_under_usr_local_and_the_guide_where_bk_1_points(pyz, root):
    install(pyz, root)
    assert (root / "usr/local/share/bash-completion/completions/bk").is_file()
    assert not (root / "usr/share/bash-completion").exists()
    page = (root / "usr/local/share/man/man1/bk.1").read_text()
    pointer = re.search(r"\\fI(/usr/share/doc/gpubk/GUIDE\.md)\\fR", page)
    assert pointer and (root / pointer.group(1).lstrip("/")).is_file()
    # bash-completion finds it there: $XDG_DATA_DIRS/bash-completion/completions.
    share = root / "usr/local/share"
    assert (share / "bash-completion/completions/bk").read_bytes() == (
        ROOT / "install/completion/bk.bash").read_bytes()
