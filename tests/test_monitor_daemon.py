"""``bk m`` as a real process (the built bk.pyz): SIGTERM flushes and
records ``stopped``, ``kill -9`` leaves it to go ``stale``, a second monitor
is refused (75), and the wrong account on a shared server is refused (77)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers_broker import SYSTEM_PYTHON, make_base, needs_root, poll
from helpers_broker import site as shared_site

from bk.store import snapshot as sf

SIM = {"gpus": [
    {"name": "H100", "mem_total_mib": 81559, "mem_used_mib": 4096, "util": 37,
     "processes": [{"pid": 4242, "uid": 1000, "user": "ada", "label": "python", "mem_mib": 4000, "sm": 30}]},
    {"name": "H100", "mem_total_mib": 81559, "mem_used_mib": 0, "util": 0, "processes": []},
]}


@pytest.fixture
def site(tmp_path):
    sim = tmp_path / "sim.json"
    sim.write_text(json.dumps(SIM))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "TZ": "UTC",
           "BK_DATA_DIR": str(tmp_path / "data"), "BK_GPU_SIM_FILE": str(sim)}
    procs: list[subprocess.Popen] = []
    yield env, tmp_path / "data", procs
    for p in procs:                      # only what this test started, by its own handle
        if p.poll() is None:
            p.kill()
            p.wait(10)


def start(pyz: Path, env: dict, procs: list, *args: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, str(pyz), "m", "--interval", "0.2", *args], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs.append(p)
    return p


def heartbeat(data: Path, now: int | None = None, **kw) -> sf.Heartbeat:
    return sf.read_heartbeat(str(data / "monitor"), int(time.time()) if now is None else now, **kw)


def wait_samples(data: Path, p: subprocess.Popen, n: int = 3) -> sf.Heartbeat:
    def ready():
        if p.poll() is not None:
            raise AssertionError(f"bk m exited with {p.returncode}: {p.stderr.read()}")
        hb = heartbeat(data)
        return hb if hb.state == "running" and (hb.samples or 0) >= n else None
    return poll(ready, 60, "the monitor's heartbeat")


def test_sigterm_flushes_the_minute_and_records_stopped(pyz, site):
    env, data, procs = site
    p = start(pyz, env, procs)
    hb = wait_samples(data, p)
    assert hb.pid == p.pid
    snap = sf.read_snapshot(str(data / "monitor"), int(time.time()))
    assert snap is not None and snap.gpus[0].processes[0].pid == 4242
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0, p.stderr.read()
    hb = heartbeat(data)
    assert hb.state == "stopped" and hb.pid == p.pid and "stopped by signal" in hb.detail
    from bk.store.usage import UsageStore

    records = UsageStore(str(data / "usage")).records()
    assert {r.gpu for r in records} == {0, 1}
    # The samples of the open minute were written at the stop: a partial
    # record (the run lasted seconds, not a minute).
    assert all(0 < r.covered_s < 60 for r in records)
    gpu0 = [r for r in records if r.gpu == 0]
    assert any(u.uid == 1000 for r in gpu0 for u in r.uses)


def test_kill_9_leaves_a_heartbeat_that_goes_stale(pyz, site):
    env, data, procs = site
    p = start(pyz, env, procs)
    hb = wait_samples(data, p)
    p.kill()
    p.wait(10)
    now = int(time.time())
    gone = heartbeat(data, now)
    assert gone.state == "stale" and f"process {p.pid} is gone" in gone.detail
    # Even where the pid cannot be checked (or was reused), the clock says so.
    last = gone.updated_at
    assert last >= hb.updated_at
    assert heartbeat(data, last + 1, alive=lambda pid: True).state == "running"
    assert heartbeat(data, last + 60, alive=lambda pid: True).state == "stale"
    # A client no longer takes its snapshot once it is older than three intervals.
    assert sf.read_snapshot(str(data / "monitor"), last + 1) is not None
    assert sf.read_snapshot(str(data / "monitor"), last + 60) is None


@pytest.mark.slow
def test_a_second_monitor_is_refused_naming_the_first(pyz, site):
    env, data, procs = site
    first = start(pyz, env, procs)
    wait_samples(data, first, 1)
    second = subprocess.run([sys.executable, str(pyz), "--json", "m", "--interval", "0.2"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 75, second
    err = json.loads(second.stdout)["error"]
    assert err["code"] == "busy" and f"pid {first.pid}" in err["message"]
    assert err["details"]["holder_pid"] == first.pid
    assert first.poll() is None                       # the first one is undisturbed
    first.send_signal(signal.SIGINT)                  # Ctrl-C stops it as cleanly as SIGTERM
    assert first.wait(30) == 0
    assert heartbeat(data).state == "stopped"


@pytest.mark.slow
def test_once_and_status_through_the_archive(pyz, site):
    env, data, procs = site
    once = subprocess.run([sys.executable, str(pyz), "m", "--once", "--json"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert once.returncode == 0, once.stderr
    d = json.loads(once.stdout)["data"]
    assert d["gpus"][0]["processes"][0]["attribution"]["state"] == "unreserved"
    assert not data.exists()                          # --once writes nothing
    st = subprocess.run([sys.executable, str(pyz), "m", "status"], env=env, capture_output=True,
                        text=True, timeout=60)
    assert st.returncode == 0 and st.stdout.startswith("monitor: absent")
    p = start(pyz, env, procs)
    wait_samples(data, p, 1)
    st = subprocess.run([sys.executable, str(pyz), "st", "--json"], env=env, capture_output=True,
                        text=True, timeout=60)
    mon = json.loads(st.stdout)["data"]["monitor"]
    assert mon["state"] == "running" and mon["pid"] == p.pid
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="a trusted shared-mode config must be root's")
def test_the_wrong_account_on_a_shared_server_is_refused(pyz, tmp_path):
    import shutil

    base = make_base()
    try:
        etc = base / "etc"
        etc.mkdir(mode=0o755)
        cfg = etc / "config.json"
        cfg.write_text(json.dumps({"data_dir": str(base / "data"), "service_uid": 4242,
                                   "socket": str(base / "run" / "broker.sock")}))
        os.chmod(cfg, 0o644)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "TZ": "UTC",
               "BK_CONFIG_FILE": str(cfg), "BK_GPU_COUNT": "2"}
        r = subprocess.run([sys.executable, str(pyz), "--json", "m"], env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 77, r
        err = json.loads(r.stdout)["error"]
        assert err["code"] == "wrong_account" and "uid 4242" in err["message"]
        cfg.write_text(json.dumps({"data_dir": str(base / "data"), "service_uid": 0, "monitor_uid": 4343,
                                   "socket": str(base / "run" / "broker.sock")}))
        r = subprocess.run([sys.executable, str(pyz), "m"], env=env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 77 and "uid 4343" in r.stderr, r
        assert not (base / "data").exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
@needs_root
@pytest.mark.root
def test_shared_server_monitor_as_the_service_account_feeds_every_user():
    """A real shared server: the monitor runs as the service account, a user
    books through the broker, and another user's bk st reads the monitor's
    snapshot (their process attributed to the booking) and its heartbeat."""
    with shared_site() as s:
        ada, bob = s.accounts.user(), s.accounts.user()
        assert s.init().returncode == 0
        s.start_broker()
        sim = s.base / "sim.json"
        sim.write_text(json.dumps({"gpus": [
            {"name": "H100", "mem_total_mib": 81559, "util": 50, "processes": [
                {"pid": 4242, "uid": ada.uid, "user": ada.name, "label": "python", "mem_mib": 4000}]},
            *({"name": "H100", "mem_total_mib": 81559, "util": 0, "processes": []} for _ in range(3))]}))
        os.chmod(sim, 0o644)

        def env(account):
            return {**s.env(account), "BK_GPU_SIM_FILE": str(sim)}

        rc, booked = s.run_json(ada, "1", "1h", "-g", "0", env=env(ada))
        assert rc == 0, booked
        # Anyone but the monitor account is refused (77) before touching anything.
        r = s.run(bob, "m", env=env(bob))
        assert r.returncode == 77 and "monitor account" in r.stderr, r
        mon = subprocess.Popen([SYSTEM_PYTHON, str(s.pyz), "m", "--interval", "0.5"], env=env(s.service),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=s.base,
                               **s.popen_args(s.service))
        try:
            def running():
                if mon.poll() is not None:
                    raise AssertionError(f"bk m exited with {mon.returncode}: {mon.stderr.read()}")
                rc, st = s.run_json(bob, "st", "-v", env=env(bob))
                return st if rc == 0 and st["data"]["monitor"]["state"] == "running" else None
            st = poll(running, 60, "bob's bk st to see the running monitor")["data"]
            assert st["monitor"]["pid"] == mon.pid
            proc = st["gpus"][0]["processes"][0]
            assert (proc["pid"], proc["state"]) == (4242, "ok")
            snapfile = s.data / "monitor" / sf.SNAPSHOT_FILE
            assert snapfile.stat().st_uid == s.service.uid and (snapfile.stat().st_mode & 0o777) == 0o644
        finally:
            mon.send_signal(signal.SIGTERM)
            assert mon.wait(30) == 0
        rc, st = s.run_json(bob, "m", "status", env=env(bob))
        assert rc == 0 and st["data"]["state"] == "stopped"
