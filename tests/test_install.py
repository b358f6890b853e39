"""``bk admin install`` / ``uninstall`` into a staging root, through the built archive.

Root only (the installer chowns to the service account, ``nobody`` here:
it creates no accounts).  The staging root is a root-owned 0755 directory
under /tmp, so the trust rules accept it as they would /.  Every test
hashes the tree (paths, kinds, owners, modes, contents, link targets) to
say "nothing changed" or "exactly as before".
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers_install import BASE, NOBODY, PYTHON, bk, install, owner_mode, staging_root, tree  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root"), pytest.mark.root]


def test_install_lays_out_every_file_as_documented(pyz, root):
    rc, env = install(pyz, root)
    assert env["data"]["status"] == "installed"
    r = str(root)
    expect = {
        "opt/gpubk/bk.pyz": (0, 0, 0o644), "opt/gpubk/bin/bk": (0, 0, 0o755),
        "etc/gpubk/config.json": (0, 0, 0o644), "etc/gpubk/install-manifest.json": (0, 0, 0o600),
        "var/lib/gpubk": (NOBODY, NOBODY, 0o755), "run/gpubk": (NOBODY, NOBODY, 0o755),
        "etc/systemd/system/gpubk-broker.service": (0, 0, 0o644),
        "etc/systemd/system/gpubk-monitor.service": (0, 0, 0o644),
        "etc/systemd/system/gpubk-enforcer.service": (0, 0, 0o644),
        "etc/systemd/user/bk-worker.service": (0, 0, 0o644),
        "usr/local/share/man/man1/bk.1": (0, 0, 0o644),
        "usr/local/share/man/man5/gpubk-config.5": (0, 0, 0o644),
        "usr/local/share/bash-completion/completions/bk": (0, 0, 0o644),
        "usr/local/share/zsh/site-functions/_bk": (0, 0, 0o644),
        "usr/share/doc/gpubk/GUIDE.md": (0, 0, 0o644),
        "usr/share/doc/gpubk/GUIDE.zh-CN.md": (0, 0, 0o644),
    }
    for rel, want in expect.items():
        assert owner_mode(root / rel) == (want[0], os.lstat(root / rel).st_gid if want[0] == NOBODY else 0,
                                          want[2]), rel
    assert os.readlink(root / "usr/local/bin/bk") == f"{r}/opt/gpubk/bin/bk"
    assert not (root / "etc/profile.d/gpubk.sh").exists()          # only with --login-hook
    launcher = (root / "opt/gpubk/bin/bk").read_text()
    assert f"exec {PYTHON} {r}/opt/gpubk/bk.pyz" in launcher and f"{r}/etc/gpubk/config.json" in launcher
    cfg = json.loads((root / "etc/gpubk/config.json").read_text())
    assert cfg["data_dir"] == f"{r}/var/lib/gpubk" and cfg["socket"] == f"{r}/run/gpubk/broker.sock"
    assert cfg["service_uid"] == NOBODY and cfg["gpu_count"] == 4
    unit = (root / "etc/systemd/system/gpubk-broker.service").read_text()
    assert f"ExecStart={r}/opt/gpubk/bin/bk broker" in unit and "\nUser=nobody\n" in unit
    assert "RestartPreventExitStatus=75 77 78" in unit and "RuntimeDirectory=gpubk" in unit
    assert f"ReadWritePaths={r}/var/lib/gpubk" in unit
    assert f"ExecStart={r}/opt/gpubk/bin/bk m" in (root / "etc/systemd/system/gpubk-monitor.service").read_text()
    assert "ExecStart=" + f"{r}/opt/gpubk/bin/bk w start" in (root / "etc/systemd/user/bk-worker.service").read_text()
    assert not re.search(r"@[A-Z_]+@", unit)
    # The archive carries bytecode for the launcher's interpreter, and runs.
    out = subprocess.run([str(root / "opt/gpubk/bin/bk"), "--version", "--json"], capture_output=True,
                         text=True, check=True)
    assert json.loads(out.stdout)["ok"] is True
    want_py = subprocess.run([PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True).stdout.strip()
    import zipfile

    with zipfile.ZipFile(root / "opt/gpubk/bk.pyz") as z:
        assert json.loads(z.read("bk/_build.json"))["python"] == want_py
        assert "bk/cli/app.pyc" in z.namelist()
    # The manifest names every path it created, with what was there before.
    man = json.loads((root / "etc/gpubk/install-manifest.json").read_text())
    paths = {e["path"] for e in man["entries"]}
    for rel in expect:
        if rel != "etc/gpubk/install-manifest.json":
            assert f"{r}/{rel}" in paths, rel
    assert all(e["before"] is None for e in man["entries"])


@pytest.fixture(name="account")
def service_account():
    """A throwaway service account (systemd-analyze rightly warns about nobody)."""
    from tests.helpers_broker import Accounts, make_base

    base = make_base()
    accounts = Accounts(base)
    try:
        yield accounts
    finally:
        accounts.cleanup()
        shutil.rmtree(base, ignore_errors=True)


def test_units_verify_cleanly_and_are_hardened(pyz, root, account):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    svc = account.user()
    install(pyz, root, "--service-user", svc.name)
    env = dict(os.environ, MANPATH=str(root / "usr/local/share/man"))    # Documentation=man:... must resolve
    for name in ("gpubk-broker.service", "gpubk-monitor.service", "gpubk-enforcer.service"):
        unit = root / "etc/systemd/system" / name
        text = unit.read_text()
        # By name, as a package's unit says it; Type=notify for the broker,
        # which sends READY=1 once its socket answers.
        # The enforcer is root's (it loads device programs); the others the service account's.
        assert f"\nUser={'root' if name == 'gpubk-enforcer.service' else svc.name}\n" in text
        assert ("\nType=notify\n" in text) == (name == "gpubk-broker.service")
        if name == "gpubk-enforcer.service":
            # Root, but only what loading and attaching device programs needs
            # (and CAP_KILL for enforce_signal): no CAP_DAC_OVERRIDE, no
            # CAP_SETUID, nothing kept across exec.
            caps = re.search(r"\nCapabilityBoundingSet=([^\n]*)\n", text).group(1).split()
            assert sorted(caps) == ["CAP_BPF", "CAP_KILL", "CAP_NET_ADMIN", "CAP_SYS_ADMIN"], caps
            assert "\nAmbientCapabilities=\n" in text and "\nNoNewPrivileges=yes\n" in text
        v = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, env=env)
        assert v.returncode == 0 and v.stderr == "", v.stderr
        s = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)], capture_output=True,
                           text=True, env=env)
        m = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", s.stdout + s.stderr)
        assert m, s.stdout[-500:] + s.stderr
        print(f"{name}: exposure {m.group(1)} {m.group(2)}")
        assert float(m.group(1)) <= 4.9


def test_dry_run_changes_nothing_and_shows_the_plan(pyz, root):
    before = tree(root)
    p = bk(pyz, "--json", "admin", "install", "--root", str(root), "--dry-run", *BASE)
    env = json.loads(p.stdout)["data"]
    assert env["status"] == "dry_run"
    ops = {(a["op"], a["path"]) for a in env["actions"]}
    assert ("create", f"{root}/opt/gpubk/bk.pyz") in ops and ("link", f"{root}/usr/local/bin/bk") in ops
    assert tree(root) == before


def test_uninstall_leaves_the_root_as_it_was(pyz, root):
    # An unknown bk command and a config directory with the administrator's file, there before.
    (root / "usr/local/bin").mkdir(parents=True)
    (root / "usr/local/bin/bk").write_text("#!/bin/sh\necho not ours\n")
    os.chmod(root / "usr/local/bin/bk", 0o755)
    (root / "etc/gpubk").mkdir(parents=True)
    (root / "etc/gpubk/README").write_text("the administrator's notes\n")
    before = tree(root)
    rc, env = install(pyz, root, "--login-hook")
    assert any("left alone" in w for w in env["warnings"])
    assert (root / "usr/local/bin/bk").read_text() == "#!/bin/sh\necho not ours\n"
    assert (root / "etc/profile.d/gpubk.sh").exists()
    dry = bk(pyz, "--json", "admin", "uninstall", "--root", str(root), "--dry-run", "--purge-data")
    assert json.loads(dry.stdout)["data"]["status"] == "dry_run"
    middle = tree(root)
    assert middle != before
    out = bk(pyz, "--json", "admin", "uninstall", "--root", str(root), "--purge-data", "--yes")
    assert json.loads(out.stdout)["data"]["status"] == "removed"
    assert tree(root) == before


def test_uninstall_keeps_data_unless_purged(pyz, root):
    install(pyz, root)
    (root / "var/lib/gpubk/keepme").write_text("x")
    bk(pyz, "admin", "uninstall", "--root", str(root), "--yes")
    assert (root / "var/lib/gpubk/keepme").exists()
    assert not (root / "etc/gpubk/config.json").exists() and not (root / "opt/gpubk").exists()


def test_reinstall_keeps_data_and_config_and_refuses_bound_changes(pyz, root):
    install(pyz, root)
    cfg = root / "etc/gpubk/config.json"
    doc = json.loads(cfg.read_text())
    doc["admin_contact"] = "ops@example.org"                    # edited by the administrator
    cfg.write_text(json.dumps(doc))
    (root / "var/lib/gpubk/marker").write_text("data")
    rc, env = install(pyz, root)
    assert env["data"]["status"] == "unchanged" and env["data"]["reconcile"] is True
    assert json.loads(cfg.read_text())["admin_contact"] == "ops@example.org"
    assert (root / "var/lib/gpubk/marker").read_text() == "data"
    # Flags left out are taken from the installed config.
    p = bk(pyz, "--json", "admin", "install", "--root", str(root), "--yes", "--no-start", "--python", PYTHON)
    assert json.loads(p.stdout)["data"]["config"]["gpu_count"] == 4
    before = tree(root)
    p = bk(pyz, "--json", "admin", "install", "--root", str(root), "--yes", "--no-start", "--python", PYTHON,
           "--gpu-count", "8", "--slot-minutes", "10", check=False)
    rc, env = p.returncode, json.loads(p.stdout)
    assert rc == 2 and "bound into the ledger" in env["error"]["message"]
    assert "--gpu-count 8 (installed: 4)" in env["error"]["message"] and "--slot-minutes 10" in env["error"]["message"]
    assert tree(root) == before


def test_a_hand_edited_unit_is_drift_shown_as_a_diff(pyz, root):
    install(pyz, root)
    unit = root / "etc/systemd/system/gpubk-broker.service"
    unit.write_text(unit.read_text().replace("RestartSec=2s", "RestartSec=9s"))
    before = tree(root)
    p = bk(pyz, "--json", "admin", "uninstall", "--root", str(root), "--yes", "--purge-data", check=False)
    err = json.loads(p.stdout)["error"]
    assert p.returncode == 78 and "changed by hand" in err["message"]
    assert "-RestartSec=2s" in err["message"] and "+RestartSec=9s" in err["message"]
    assert tree(root) == before
    p = bk(pyz, "--json", "admin", "install", "--root", str(root), "--yes", "--no-start", *BASE, check=False)
    assert p.returncode == 78 and "RestartSec=9s" in json.loads(p.stdout)["error"]["message"]


def test_a_command_directory_not_owned_by_root_is_refused(pyz, root):
    (root / "usr/local/bin").mkdir(parents=True)
    os.chown(root / "usr/local/bin", NOBODY, NOBODY)
    before = tree(root)
    rc, env = install(pyz, root, check=False)
    assert rc == 78 and "--command-path /usr/bin/bk" in env["error"]["hint"]
    assert tree(root) == before
    rc, env = install(pyz, root, "--command-path", "/usr/bin/bk")
    assert os.readlink(root / "usr/bin/bk") == f"{root}/opt/gpubk/bin/bk"
    # A reinstall keeps the link where it is; --no-command-link takes it away.
    rc, env = install(pyz, root)
    assert env["data"]["command_path"] == "/usr/bin/bk" and not (root / "usr/local/bin/bk").exists()
    rc, env = install(pyz, root, "--no-command-link")
    assert env["data"]["command_path"] is None and not os.path.lexists(root / "usr/bin/bk")
    bk(pyz, "admin", "uninstall", "--root", str(root), "--yes", "--purge-data")
    assert tree(root) == before


def test_an_identical_link_is_adopted_and_left_on_uninstall(pyz, root):
    (root / "usr/local/bin").mkdir(parents=True)
    os.symlink(f"{root}/opt/gpubk/bin/bk", root / "usr/local/bin/bk")
    before = tree(root)
    rc, env = install(pyz, root)
    assert ("adopt", f"{root}/usr/local/bin/bk") in {(a["op"], a["path"]) for a in env["data"]["actions"]}
    bk(pyz, "admin", "uninstall", "--root", str(root), "--yes", "--purge-data")
    assert tree(root) == before


def test_the_seed_uninstall_sequence_with_the_installed_command(pyz, root):
    """The README's lines, systemd absent: services uninstall, then uninstall
    --purge-data, both run by /opt/gpubk/bin/bk, which deletes itself."""
    install(pyz, root)
    bk_cmd = str(root / "opt/gpubk/bin/bk")

    def run(*args):
        p = subprocess.run([bk_cmd, *args, "--root", str(root)], capture_output=True, text=True, timeout=120,
                           env={"PATH": "/usr/bin:/bin", "HOME": "/"})
        assert p.returncode == 0, p.stdout + p.stderr
        return p

    st = json.loads(run("--json", "admin", "services", "status").stdout)["data"]
    assert st["systemd"] is False and st["status"] == "stopped" and all(st["units"].values())
    run("admin", "services", "uninstall", "--yes")
    assert not (root / "etc/systemd/system/gpubk-broker.service").exists()
    assert (root / "opt/gpubk/bk.pyz").exists()
    out = json.loads(run("--json", "admin", "uninstall", "--purge-data", "--yes").stdout)
    assert out["ok"] is True and f"{root}/opt/gpubk/bk.pyz" in out["data"]["removed"]
    assert sorted(os.listdir(root)) == []


def test_group_access_units_and_directories(pyz, root, account):
    svc = account.user()
    group, gid = account.group()
    install(pyz, root, "--service-user", svc.name, "--access", "group", "--group", group)
    assert owner_mode(root / "var/lib/gpubk") == (svc.uid, gid, 0o750)
    assert owner_mode(root / "run/gpubk") == (svc.uid, gid, 0o2750)
    for name in ("gpubk-broker.service", "gpubk-monitor.service"):
        unit = (root / "etc/systemd/system" / name).read_text()
        assert f"\nGroup={group}\n" in unit and "RuntimeDirectoryMode=2750" in unit
        if shutil.which("systemd-analyze"):
            v = subprocess.run(["systemd-analyze", "verify", str(root / "etc/systemd/system" / name)],
                               capture_output=True, text=True,
                               env=dict(os.environ, MANPATH=str(root / "usr/local/share/man")))
            assert v.returncode == 0 and v.stderr == "", v.stderr


def test_without_a_terminal_it_needs_yes_and_changes_nothing(pyz, root):
    before = tree(root)
    p = bk(pyz, "admin", "install", "--root", str(root), "--no-start", *BASE, check=False)
    assert p.returncode == 2 and "confirm with --yes" in p.stderr
    assert tree(root) == before


def test_install_from_an_installed_package_builds_the_archive(root, capsys):
    """No archive to copy (a pip install, here the checkout): the installer
    builds one from the package, with the content hash build.py gives."""
    import importlib.util
    import zipfile

    from bk.cli.app import run

    rc = run(["--json", "admin", "install", "--root", str(root), "--yes", "--no-start", *BASE],
             env={"PATH": "/usr/bin:/bin", "HOME": "/root"})
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    assert out["data"]["archive_from"] == "the installed bk package"
    spec = importlib.util.spec_from_file_location("build_for_test", Path(__file__).parent.parent / "build.py")
    build = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = build          # dataclasses look their module up there
    try:
        spec.loader.exec_module(build)
    finally:
        del sys.modules[spec.name]
    with zipfile.ZipFile(root / "opt/gpubk/bk.pyz") as z:
        recorded = json.loads(z.read("bk/_build.json"))["content_sha256"]
        names = z.namelist()
        content = {n: z.read(n) for n in names if build.archive.is_content_entry(n)}
    # build.py's digest of what was installed is what the archive records,
    # and build.py would have packed the same entries (compared by name: the
    # tree may change under a test while others work in it).
    assert recorded == build.archive.content_sha256(content)
    assert set(content) == set(build.collect(build.ROOT))
    assert "bk/resources/install/gpubk-broker.service" in names and "bk/resources/man/bk.1" in names
    p = subprocess.run([str(root / "opt/gpubk/bin/bk"), "--version"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.startswith("bk ")


def test_uninstall_refuses_while_the_broker_runs(pyz, root):
    install(pyz, root)
    unit = root / "etc/systemd/system/gpubk-broker.service"
    from bk.admin.services import TemporaryService

    with TemporaryService(str(unit), f"{root}/run/gpubk/broker.sock"):
        p = bk(pyz, "--json", "admin", "uninstall", "--root", str(root), "--yes", check=False)
        err = json.loads(p.stdout)["error"]
        assert p.returncode == 75 and "still running" in err["message"] and "answers" in err["message"]
        assert err["code"] == "busy"
    bk(pyz, "admin", "uninstall", "--root", str(root), "--yes", "--purge-data")


def test_not_root_is_refused_before_anything_changes(pyz, root):
    shutil.copy(pyz, root / "bk.pyz")              # where nobody can read it
    os.chmod(root / "bk.pyz", 0o644)
    pyz = root / "bk.pyz"
    before = tree(root)
    p = subprocess.run(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups",
                        PYTHON, str(pyz), "--json", "admin", "install", "--root", str(root), "--yes", *BASE],
                       capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": "/"})
    err = json.loads(p.stdout)["error"]
    assert p.returncode == 5 and err["code"] == "permission_denied" and err["hint"].startswith("sudo bk admin install")
    assert tree(root) == before


def test_guided_install_asks_one_question_at_a_time(pyz, root):
    """No --yes at a terminal: the questions with their defaults, a review, a confirmation."""
    import pty
    import select
    import time

    argv = [PYTHON, str(pyz), "admin", "install", "--root", str(root), "--no-start", "--python", PYTHON]
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(PYTHON, argv, {"PATH": "/usr/bin:/bin", "HOME": "/root", "TERM": "dumb", "LANG": "C.UTF-8"})
    answers = [("Service account", b"nobody\n"), ("Administrator contact", b"\n"), ("How many GPUs", b"4\n"),
               ("Who may book", b"\n"),
               ("Slice length", b"\n"), ("Share slots", b"\n"), ("Data directory", b"\n"),
               ("The bk command", b"\n"), ("Show notices at login", b"n\n"), ("Apply this plan?", b"y\n")]
    seen = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if answers and answers[0][0].encode() in seen:
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
    text = seen.decode(errors="replace")
    assert not answers, text[-2000:]
    assert os.waitstatus_to_exitcode(status) == 0, text[-2000:]
    assert "[/var/lib/gpubk]" in text and "bk admin install will:" in text
    assert json.loads((root / "etc/gpubk/config.json").read_text())["gpu_count"] == 4
    assert not (root / "etc/profile.d/gpubk.sh").exists()


def test_a_reconcile_that_changes_the_archive_refuses_while_the_broker_runs(pyz, root, tmp_path):
    install(pyz, root)
    from bk.admin.services import TemporaryService

    other = tmp_path / "other.pyz"
    subprocess.run([PYTHON, str(Path(__file__).parent.parent / "build.py"), "-o", str(other)], check=True,
                   capture_output=True, env={"PATH": "/usr/bin:/bin", "SOURCE_DATE_EPOCH": "1700000000"})
    before = tree(root)
    with TemporaryService(str(root / "etc/systemd/system/gpubk-broker.service"), f"{root}/run/gpubk/broker.sock"):
        p = subprocess.run([PYTHON, str(other), "--json", "admin", "install", "--root", str(root), "--yes",
                            "--no-start", "--python", PYTHON], capture_output=True, text=True, timeout=300,
                           env={"PATH": "/usr/bin:/bin", "HOME": "/root"})
        assert p.returncode == 75 and "archive would change" in json.loads(p.stdout)["error"]["message"]
    after = tree(root)
    after.pop("run/gpubk/broker.sock.lock", None)      # the broker's own lock file, left by design
    assert after == before


@pytest.mark.parametrize("fail_at", [0, 2, 5, 12, 20, -1])
def test_an_install_stopped_at_any_step_is_removed_completely(root, monkeypatch, fail_at):
    """Each change is recorded before it is made: whatever step fails (a
    crash, a full disk), uninstall finds everything done so far and removes
    it, and a rerun of install completes."""
    from bk.admin import install as inst
    from bk.admin import install_apply, uninstall
    from bk.core.errors import IOFailure

    before = tree(root)
    env = {"PATH": "/usr/bin:/bin", "HOME": "/root"}
    opts = inst.Options(root=str(root), service_user="nobody", gpu_count=4, python=PYTHON, start=False)
    p = inst.plan(opts, env)
    changes = [a for a in p.actions if a.changes]
    target = changes[fail_at]
    real = install_apply._do

    def failing(a, doc):
        if a is target:
            raise IOFailure(f"injected failure at {a.path}")
        real(a, doc)

    monkeypatch.setattr(install_apply, "_do", failing)
    with pytest.raises(IOFailure):
        install_apply.apply(p)
    monkeypatch.setattr(install_apply, "_do", real)
    if (root / "etc/gpubk").exists() and (root / "etc/gpubk/install-manifest.json").exists():
        up = uninstall.uninstall_plan(str(root), purge_data=True)
        uninstall.uninstall(up)
    assert tree(root) == before, f"left behind after a failure at {target.path}"
    # And a failed install can simply be run again.
    install_apply.apply(inst.plan(opts, env))
    assert (root / "opt/gpubk/bin/bk").exists()


@pytest.mark.parametrize("fail_at", [3, 15, -2])
def test_a_rerun_after_a_failure_finishes_and_still_uninstalls_cleanly(root, monkeypatch, fail_at):
    from bk.admin import install as inst
    from bk.admin import install_apply, uninstall
    from bk.core.errors import IOFailure

    before = tree(root)
    env = {"PATH": "/usr/bin:/bin", "HOME": "/root"}
    opts = inst.Options(root=str(root), service_user="nobody", gpu_count=4, python=PYTHON, start=False)
    p = inst.plan(opts, env)
    target = [a for a in p.actions if a.changes][fail_at]
    real = install_apply._do
    monkeypatch.setattr(install_apply, "_do", lambda a, doc: (_ for _ in ()).throw(IOFailure("injected"))
                        if a is target else real(a, doc))
    with pytest.raises(IOFailure):
        install_apply.apply(p)
    monkeypatch.setattr(install_apply, "_do", real)
    result = install_apply.apply(inst.plan(opts, env))
    assert result.status in ("reconciled", "installed")
    uninstall.uninstall(uninstall.uninstall_plan(str(root), purge_data=True))
    assert tree(root) == before


def test_with_systemd_it_reloads_enables_and_starts_and_restarts_on_a_reconcile(pyz, root):
    """systemd is not PID 1 on the test machines, so the plan is told it is
    and systemctl is a fake that records what it was asked."""
    from bk.admin import install as inst
    from bk.admin import install_apply

    calls: list[list[str]] = []

    def fake(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "inactive\n", "")

    env = {"PATH": "/usr/bin:/bin", "HOME": "/root"}
    units = ["gpubk-broker.service", "gpubk-monitor.service"]
    p = inst.plan(inst.Options(root=str(root), service_user="nobody", gpu_count=4, python=PYTHON,
                               archive=str(pyz)), env)
    p.systemd = True
    install_apply.apply(p, runner=fake)
    assert calls == [["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", *units]]
    # The enforcer's unit is installed, and left disabled: enforcement is opt-in (bk admin enforce on).
    assert (root / "etc/systemd/system/gpubk-enforcer.service").exists()
    assert not any("gpubk-enforcer.service" in c for c in calls)
    calls.clear()
    p = inst.plan(inst.Options(root=str(root), python=PYTHON, archive=str(pyz)), env)
    p.systemd = True
    result = install_apply.apply(p, runner=fake)
    assert result.status == "unchanged"
    assert calls == [["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", *units],
                     ["systemctl", "restart", *units]]
    # Uninstall asks systemd whether the units are active.
    active = []

    def status(cmd, **kw):
        active.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "active\n" if cmd[-1] == units[0] else "inactive\n", "")

    from bk.admin import services

    assert services.active_units(status) == [units[0]]


def test_a_replaced_file_is_backed_up_and_restored(pyz, root):
    """The README's venv: /opt/gpubk already holds a virtual environment
    whose bin/bk is pip's script.  Install replaces it with the launcher
    (keeping a root-only copy); uninstall puts pip's script back."""
    venv_bin = root / "opt/gpubk/bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "bk").write_text("#!/opt/gpubk/bin/python\nfrom bk.cli.main import main\nmain()\n")
    os.chmod(venv_bin / "bk", 0o755)
    os.symlink("/usr/bin/python3", venv_bin / "python")
    before = tree(root)
    rc, env = install(pyz, root)
    ops = {a["path"]: a["op"] for a in env["data"]["actions"]}
    assert ops[f"{root}/opt/gpubk/bin/bk"] == "replace"
    assert "exec /usr/bin/python3" in (venv_bin / "bk").read_text()
    man = json.loads((root / "etc/gpubk/install-manifest.json").read_text())
    entry = next(e for e in man["entries"] if e["path"] == f"{root}/opt/gpubk/bin/bk")
    backup = root / "etc/gpubk/install-backup" / entry["before"]["backup"]
    assert owner_mode(backup) == (0, 0, 0o600) and owner_mode(backup.parent) == (0, 0, 0o700)
    bk(pyz, "admin", "uninstall", "--root", str(root), "--yes", "--purge-data")
    assert tree(root) == before


def test_with_systemd_uninstall_disables_the_units_before_removing_them(pyz, root):
    from bk.admin import uninstall

    install(pyz, root)
    calls: list[list[str]] = []

    def fake(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "inactive\n", "")

    up = uninstall.uninstall_plan(str(root), only_services=True, runner=fake)
    up.systemd = True
    uninstall.uninstall(up, runner=fake)
    assert ["systemctl", "disable", "gpubk-broker.service", "gpubk-monitor.service",
            "gpubk-enforcer.service"] in calls
    assert not (root / "etc/systemd/system/gpubk-broker.service").exists()
    assert not (root / "etc/systemd/system/gpubk-enforcer.service").exists()


def test_the_accounts_check_sees_only_what_an_install_could_make():
    # Someone else's account added meanwhile (another test, another person)
    # is not the installer's doing; one that names the staging root is.
    import secrets

    from tests.helpers_install import staged_root

    names = ["bkx" + secrets.token_hex(3), "bkx" + secrets.token_hex(3)]
    try:
        with staged_root():
            subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", names[0]], check=True, capture_output=True)
        with pytest.raises(AssertionError, match="creates no accounts"):
            with staged_root() as d:
                subprocess.run(["useradd", "-M", "-d", str(d / "home"), "-s", "/usr/sbin/nologin", names[1]],
                               check=True, capture_output=True)
    finally:
        for name in names:
            subprocess.run(["userdel", name], capture_output=True)


def test_uninstall_refuses_while_enforcement_is_on(pyz, root):
    """Closed mode's programs outlive the enforcer: removing bk then would
    leave the GPUs closed with nothing to open them."""
    install(pyz, root)
    cfg = root / "etc/gpubk/config.json"
    doc = json.loads(cfg.read_text())
    cfg.write_text(json.dumps({**doc, "enforce": True}))
    before = tree(root)
    p = bk(pyz, "--json", "admin", "uninstall", "--root", str(root), "--yes", check=False)
    assert p.returncode == 75 and "bk admin enforce off" in p.stdout, p.stdout
    assert tree(root) == before
