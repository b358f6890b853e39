"""``bk admin enforce`` where enforcement cannot or does not run, through the
built ``bk.pyz``; nothing changes for a server that never turns it on; and
the enforcer's own paths that need no users (in-process, real kernel, root):
a ledger never read, a program detached by someone else, the status file's
trust, the configuration keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers_enforce import TestCgroup, mknod, needs_kernel, open_result

ROOT = Path(__file__).resolve().parent.parent


def run_pyz(pyz, tmp_path, *args, env_extra=None):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "TZ": "UTC",
           "BK_DATA_DIR": str(tmp_path / "data"), "BK_GPU_COUNT": "2", "XDG_STATE_HOME": str(tmp_path / "s"),
           **(env_extra or {})}
    return subprocess.run([sys.executable, str(pyz), *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize("words", [["admin", "enforce", "status"], ["admin", "enforce", "on", "--dry-run"],
                                   ["admin", "enforce", "off", "--dry-run"], ["admin", "enforce", "run"]])
def test_a_private_ledger_has_no_enforcement(pyz, tmp_path, words):
    p = run_pyz(pyz, tmp_path, "--json", *words)
    env = json.loads(p.stdout)
    assert p.returncode == 78 and env["ok"] is False and env["error"]["code"] == "config", p.stdout
    assert "trusted configuration" in env["error"]["message"] and "admin install" in env["error"]["hint"]


def test_enforce_needs_an_action_and_checks_its_flags(pyz, tmp_path):
    p = run_pyz(pyz, tmp_path, "admin", "enforce")
    assert p.returncode == 2 and "needs an action" in p.stderr
    p = run_pyz(pyz, tmp_path, "admin", "enforce", "on", "--grace", "0")
    assert p.returncode == 2 and "--grace" in p.stderr
    p = run_pyz(pyz, tmp_path, "admin", "enforce", "on", "--failure", "sometimes")
    assert p.returncode == 2


PROBE = """
import contextlib, io, json, sys
from bk.cli.main import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "enforce": sorted(m for m in sys.modules
                  if m.startswith(("bk.enforce", "bk.core.enforce", "bk.core.devprog", "bk.cli.cmd_enforce"))),
                  "out": out.getvalue()}))
"""


def test_doctor_on_a_server_that_never_turned_it_on_checks_and_imports_nothing_of_it(tmp_path):
    """Nothing changes for a server that never turns enforcement on: no
    check, no import (a fresh interpreter, sys.modules after the command)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update({"HOME": str(tmp_path), "BK_DATA_DIR": str(tmp_path / "data"), "BK_GPU_COUNT": "2",
                "PYTHONPATH": str(ROOT)})
    p = subprocess.run([sys.executable, "-c", PROBE, "--json", "doctor"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=60)
    doc = json.loads(p.stdout.splitlines()[-1])
    checks = {c["name"] for c in json.loads(doc["out"])["data"]["checks"]}
    assert not checks & {"enforcer", "enforce_kernel", "enforce_cgroup"}, checks
    assert doc["enforce"] == []


def test_the_keys_are_checked_like_every_key():
    from bk.core.errors import ConfigError
    from bk.store.config import KEYS, check_value

    assert check_value(KEYS["enforce_bypass"], [1002, 1001, 1002], "t") == [1001, 1002]
    for key, bad in (("enforce_bypass", [-1]), ("enforce_bypass", ["alice"]), ("enforce_bypass", [2 ** 32]),
                     ("enforce_failure", "sometimes"), ("enforce", 1), ("enforce_signal_grace_seconds", 0),
                     ("enforce_state_dir", "relative/dir")):
        with pytest.raises(ConfigError):
            check_value(KEYS[key], bad, "t")
    assert all(KEYS[k].security for k in KEYS if k.startswith("enforce"))


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_the_status_file_is_believed_only_from_root(tmp_path):
    from bk.enforce import state

    d = tmp_path / "st"
    state.write_status(str(d), {"state": "enforcing", "pid": os.getpid(), "updated_at": 1})
    assert state.read_status(str(d))[0] == "ok"
    os.chown(d / "status.json", 65534, 65534)
    assert state.read_status(str(d)) == (state.DAMAGED, None)     # someone else's: not believed
    os.chown(d / "status.json", 0, 0)
    os.chmod(d / "status.json", 0o666)
    assert state.read_status(str(d)) == (state.DAMAGED, None)     # writable by others: not believed
    assert state.liveness(None, state.ABSENT, 0) == state.ABSENT
    assert state.liveness({"state": "enforcing", "pid": os.getpid(), "updated_at": 100}, "ok", 200) == state.STALE


# ------------------------------------------------------------------ in process, real kernel

@pytest.fixture
def cg():
    c = TestCgroup()
    try:
        yield c
    finally:
        c.cleanup()


def _probe(leaf, paths):
    script = ("import os, sys\nfrom tests.helpers_enforce import open_result\n"
              "open(sys.argv[1], 'w').write(str(os.getpid()))\nprint(' '.join(open_result(p) for p in sys.argv[2:]))")
    return subprocess.run([sys.executable, "-c", script, str(leaf / "cgroup.procs"), *map(str, paths)],
                          capture_output=True, text=True, timeout=30, check=True, cwd=ROOT).stdout.split()


def _enforcer(cg, tmp_path, read, **kw):
    from bk.core import enforce as rule
    from bk.enforce import daemon

    opts = daemon.Options(root=str(cg.path), state_dir=str(tmp_path / "state"), **kw)
    return daemon.Enforcer(opts, devices=rule.index_map(2), read_ledger=read, log=lambda line: None)


def _unreadable():
    from bk.core.errors import IOFailure

    raise IOFailure("the ledger and every backup are damaged")


@pytest.mark.root
@needs_kernel()
@pytest.mark.parametrize("fail_open", [True, False], ids=["open", "closed"])
def test_a_ledger_never_read_fails_as_configured(cg, tmp_path, fail_open):
    leaf = cg.make("user.slice/user-1000.slice/session-1.scope")
    nodes = [mknod(tmp_path, 0), mknod(tmp_path, 1)]
    e = _enforcer(cg, tmp_path, _unreadable, fail_open=fail_open, links=fail_open)
    try:
        e.step()
        st = e.status()
        if fail_open:
            assert st["state"] == "failing-open" and st["targets"] == []
            assert _probe(leaf, nodes) == ["ENXIO", "ENXIO"]
        else:
            assert st["state"] == "failing-closed" and len(st["targets"]) == 1
            assert _probe(leaf, nodes) == ["EPERM", "EPERM"]
    finally:
        e.shutdown(detach=True)
    assert _probe(leaf, nodes) == ["ENXIO", "ENXIO"]


@pytest.mark.root
@needs_kernel()
def test_a_program_detached_by_someone_else_is_attached_again(cg, tmp_path):
    """runc detaches every device program of a container it updates."""
    import time

    from bk.core.models import Reservation
    from bk.enforce import kernel

    leaf = cg.make("user.slice/user-1000.slice/session-1.scope")
    nodes = [mknod(tmp_path, 0), mknod(tmp_path, 1)]
    now = int(time.time())
    book = [Reservation(id="a" * 32, uid=1000, user="ada", mode="shared", gpus=(0,), share=1, start=now - 60,
                        end=now + 3600, created=now)]
    e = _enforcer(cg, tmp_path, lambda: book, fail_open=False, links=False)
    try:
        e.step()
        assert _probe(leaf, nodes) == ["ENXIO", "EPERM"]
        top = os.open(cg.path / "user.slice/user-1000.slice", os.O_RDONLY | os.O_DIRECTORY)
        try:
            (pid,) = kernel.query(top).ids
            fd = kernel.prog_fd_by_id(pid)
            kernel.detach(top, fd)
            os.close(fd)
            assert _probe(leaf, nodes) == ["ENXIO", "ENXIO"]
            e._verified_at = 0.0                      # the next verification is due
            e.step()
            assert len(kernel.query(top).ids) == 1
        finally:
            os.close(top)
        assert _probe(leaf, nodes) == ["ENXIO", "EPERM"]
        events = (tmp_path / "state" / "events.jsonl").read_text()
        assert '"event":"reattached"' in events
    finally:
        e.shutdown(detach=True)
    assert open_result(nodes[1]) == "ENXIO"


# ------------------------------------------------------------------ what the enforcer reads

def test_device_numbers_from_the_driver(tmp_path):
    """A fake /proc: the driver's GPUs (bus id -> Device Minor), the dynamic
    nvidia-caps major, and the capability minors of MIG instances."""
    from bk.enforce import cgroups

    proc = tmp_path / "proc"
    (proc / "driver/nvidia/gpus/0000:3b:00.0").mkdir(parents=True)
    (proc / "driver/nvidia/gpus/0000:1a:00.0").mkdir(parents=True)
    (proc / "driver/nvidia/gpus/0000:3b:00.0/information").write_text("Model: H100\nDevice Minor: \t 0\n")
    (proc / "driver/nvidia/gpus/0000:1a:00.0/information").write_text("Model: H100\nDevice Minor: \t 1\n")
    for rel, minor in (("gpu1/mig/gi3/access", 30), ("gpu1/mig/gi3/ci0/access", 31), ("gpu0/mig/gi1/access", 12)):
        p = proc / "driver/nvidia/capabilities" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\n")
    (proc / "devices").write_text("Character devices:\n  1 mem\n195 nvidia-frontend\n236 nvidia-caps\n"
                                  "508 nvidia-uvm\n\nBlock devices:\n236 nvidia-caps\n")
    m = cgroups.device_map(2, str(proc))
    assert m.source == "driver" and m.caps_major == 236
    # PCI order: 0000:1a (minor 1) is GPU 0, with its instance's two capability nodes.
    assert m.nodes(0) == ((195, 1), (236, 30), (236, 31)) and m.nodes(1) == ((195, 0), (236, 12))
    assert cgroups.device_map(2, str(tmp_path / "none")).source == "index"


def test_cgroup_mounts_and_container_paths():
    from bk.enforce import cgroups

    info = ("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
            "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
            "36 31 0:33 / /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices\n"
            "90 27 0:38 / /sys/fs/cgroup rw shared:1 - cgroup2 cgroup2 rw\n"
            "91 27 0:38 / /mnt/with\\040space rw - cgroup2 cgroup2 rw\n")
    assert cgroups.cgroup2_mounts(info) == ["/sys/fs/cgroup/unified", "/sys/fs/cgroup", "/mnt/with space"]
    hexid = "3f2a9c1b12ab" + "0" * 52
    assert cgroups.container_path(f"/system.slice/docker-{hexid}.scope") == f"system.slice/docker-{hexid}.scope"
    assert cgroups.container_path(f"/docker/{hexid}/init.scope") == f"docker/{hexid}"      # nested cgroups
    assert cgroups.container_path(f"/machine.slice/libpod-{hexid}.scope/container") == \
        f"machine.slice/libpod-{hexid}.scope"
    # A rootless container is inside its user's slice: the slice's program already governs it.
    assert cgroups.container_path(f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{hexid}.scope") \
        is None
    assert cgroups.container_path("/system.slice/sshd.service") is None
