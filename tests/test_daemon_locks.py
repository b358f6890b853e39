"""No user can keep a daemon from starting (issue 22, item 2), with real
accounts, the built ``bk.pyz`` and the daemons run as the service account.

``flock`` needs only an open descriptor, and a descriptor only read access:
an older bk made the broker's ``SOCKET.lock`` and the monitor's
``monitor.lock`` 0644, so any user could open one, wait on it and take it
the moment the daemon died, and the next start (``systemctl restart``, an
upgrade, a restart after a crash) exited 75, which the unit's
``RestartPreventExitStatus=75`` turns into "down until a person acts".
Each test plays that with a second account: a process of its own that
opened the lock file while it was readable and waits on it across a
restart.  Every lock file is now 0600, and a daemon that finds a readable
one, or one held by another account than its own (and root's), replaces it
with a fresh one the intruder cannot reach, and says so with the uid.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest
from helpers_broker import SYSTEM_PYTHON, needs_root, poll, site

from bk.store import lock as bklock

pytestmark = [needs_root, pytest.mark.root, pytest.mark.slow]

HOLD = ("import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
        "print('opened', flush=True)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n")


def holder(srv, account, path: Path) -> subprocess.Popen:
    """A process of ``account`` (None: root) that opens ``path`` and waits
    for its lock; it says ``opened``, then ``held`` once it has it."""
    p = subprocess.Popen([SYSTEM_PYTHON, "-c", HOLD, str(path)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
                         **srv.popen_args(account))
    line = p.stdout.readline()
    assert line == "opened\n", (line, p.stderr.read() if p.poll() is not None else "")
    return p


def held(p: subprocess.Popen) -> bool:
    line = p.stdout.readline()
    assert line == "held\n", line
    return True


def let_go(p: subprocess.Popen) -> None:
    p.stdin.close()
    p.wait(30)


def cannot_open(srv, account, path: Path) -> bool:
    r = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; open(sys.argv[1])", str(path)], capture_output=True,
                       text=True, timeout=30, cwd="/", **srv.popen_args(account))
    return r.returncode != 0 and "Permission denied" in r.stderr


def mode_owner_inode(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_ino


@pytest.fixture
def srv():
    with site() as s:
        assert s.init().returncode == 0
        s.intruder = s.accounts.user()
        yield s


def test_no_user_can_keep_the_broker_from_restarting(srv):
    srv.start_broker()
    lock = Path(f"{srv.socket}.lock")
    mode, owner, _ = mode_owner_inode(lock)
    assert (mode, owner) == (0o600, srv.service.uid)
    assert cannot_open(srv, srv.intruder, lock)

    # A lock file an older bk left readable: the intruder opens it while the
    # broker runs, and waits on it across a restart.
    os.chmod(lock, 0o644)
    old_inode = mode_owner_inode(lock)[2]
    h = holder(srv, srv.intruder, lock)
    try:
        assert srv.stop_broker() == 0
        assert held(h)                         # it took the lock the moment the broker stopped
        srv.start_broker()                     # the old broker exited 75 here: down for good
        log = srv.log()
        assert f"held by pid {h.pid} of uid {srv.intruder.uid} ({srv.intruder.name})" in log, log
        mode, owner, inode = mode_owner_inode(lock)
        assert (mode, owner) == (0o600, srv.service.uid) and inode != old_inode
        assert cannot_open(srv, srv.intruder, lock)
        assert bklock.holder(os.open(lock, os.O_RDONLY)) == srv.broker.pid
        # And again, the intruder still holding its descriptor of the old file.
        assert srv.stop_broker() == 0
        srv.start_broker()
        rc, env = srv.run_json(srv.intruder, "1", "30m")
        assert rc == 0, env
    finally:
        let_go(h)


def test_the_broker_names_a_holder_of_another_account(srv):
    """Root is not replaced (an administrator's tool may hold a lock on
    purpose), but the refusal says whose the holder is."""
    lock = Path(f"{srv.socket}.lock")
    srv.start_broker()
    assert srv.stop_broker() == 0
    h = holder(srv, None, lock)
    try:
        assert held(h)
        srv.start_broker(wait=False)
        assert srv.broker.wait(60) == 75
        log = srv.log()
        assert f"another broker is running on {srv.socket} (pid {h.pid})" in log, log
        assert "the holder runs as uid 0 (root), not as the account that owns the lock" in log, log
    finally:
        let_go(h)
    srv.start_broker()


def test_no_user_can_keep_the_monitor_from_restarting(srv):
    sim = srv.base / "sim.json"
    sim.write_text(json.dumps({"gpus": [{"name": "H100", "mem_total_mib": 81559, "util": 0, "processes": []}
                                        for _ in range(4)]}))
    os.chmod(sim, 0o644)
    env = {**srv.env(srv.service), "BK_GPU_SIM_FILE": str(sim)}
    lock = srv.data / "monitor" / "monitor.lock"

    def monitor() -> subprocess.Popen:
        m = subprocess.Popen([SYSTEM_PYTHON, str(srv.pyz), "m", "--interval", "0.5"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=srv.base,
                             **srv.popen_args(srv.service))

        def holding():
            if m.poll() is not None:
                raise AssertionError(f"bk m exited with {m.returncode}: {m.stderr.read()}")
            if not lock.exists():
                return False
            fd = os.open(lock, os.O_RDONLY)
            try:
                return bklock.holder(fd) == m.pid
            finally:
                os.close(fd)
        poll(holding, 60, "the monitor to hold its lock")
        return m

    def stop(m: subprocess.Popen) -> str:
        m.send_signal(signal.SIGTERM)
        assert m.wait(30) == 0
        return m.stderr.read()

    m = monitor()
    mode, owner, _ = mode_owner_inode(lock)
    assert (mode, owner) == (0o600, srv.service.uid)
    assert cannot_open(srv, srv.intruder, lock)
    os.chmod(lock, 0o644)                      # as an older bk made it
    old_inode = mode_owner_inode(lock)[2]
    h = holder(srv, srv.intruder, lock)
    try:
        stop(m)
        assert held(h)
        m = monitor()                          # the old monitor exited 75 here
        mode, owner, inode = mode_owner_inode(lock)
        assert (mode, owner) == (0o600, srv.service.uid) and inode != old_inode
        assert cannot_open(srv, srv.intruder, lock)
        said = stop(m)
        assert f"held by pid {h.pid} of uid {srv.intruder.uid}" in said, said
        stop(monitor())
    finally:
        let_go(h)


def test_no_user_can_hold_the_ledger_lock_against_every_write(srv):
    srv.start_broker()
    rc, env = srv.run_json(srv.intruder, "1", "30m")
    assert rc == 0, env
    lock = srv.data / "ledger.lock"
    assert mode_owner_inode(lock)[:2] == (0o600, srv.service.uid)
    assert cannot_open(srv, srv.intruder, lock)
    os.chmod(lock, 0o644)
    h = holder(srv, srv.intruder, lock)
    try:
        assert held(h)                         # the broker commits only while it books
        # The old broker waited lock_timeout_seconds, then refused every write (busy, 75).
        rc, env = srv.run_json(srv.intruder, "1", "1h", timeout=60)
        assert rc == 0, env
        assert mode_owner_inode(lock)[:2] == (0o600, srv.service.uid)
        assert cannot_open(srv, srv.intruder, lock)
        rc, env = srv.run_json(srv.intruder, "d", env["data"]["reservation"]["id"], "-y")
        assert rc == 0, env
    finally:
        let_go(h)
    # A broker that starts on a ledger lock others could open replaces it at once, and says so.
    assert srv.stop_broker() == 0
    os.chmod(lock, 0o644)
    srv.start_broker()
    assert mode_owner_inode(lock)[:2] == (0o600, srv.service.uid)
    assert f"{lock} had mode 0644" in srv.log(), srv.log()
