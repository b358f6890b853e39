"""``bk doctor`` as the deployment check: every check has a status (ok,
warn, fail) and a fix; ``--strict`` counts warnings; ``--require-monitor``
and ``--require-worker`` say which parts must be there (a real monitor and
a real worker); an unusable
configuration is a failed check, not a refusal.  In private mode in-process,
and on a real shared server (real accounts, a real broker) as root."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys

import pytest
from helpers_broker import needs_root, poll, site
from helpers_cli import bk_fixture

from bk.core import errors


@pytest.fixture
def bk(monkeypatch, capsys):
    yield from bk_fixture(monkeypatch, capsys)


def checks(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


# ------------------------------------------------------------- private mode

def test_a_healthy_private_ledger_passes_strict(bk):
    bk.ok("1", "30m")
    r = bk.json("doctor", "--probe", "--strict")
    assert r.code == 0, r.out
    d = r.data
    assert d["ok"] and d["failed"] == [] and d["warnings"] == 0 and d["strict"] and d["probe"]
    for c in d["checks"]:
        assert set(c) >= {"name", "ok", "status", "detail", "fix"}
        assert c["status"] == "ok" and c["ok"] and c["fix"] is None, c
    names = set(checks(d))
    assert {"config", "data directory", "ledger", "policy", "gpu_backend", "monitor",
            "atomic replace", "locking"} <= names
    assert "worker" not in names and "socket directory" not in names and "broker" not in names
    assert "all checks passed" in bk("doctor", "--strict").out


def test_a_failure_names_the_check_and_its_fix(bk):
    bk.ok("1", "30m")
    bk.data_dir.chmod(0o755)
    r = bk.json("doctor")
    assert r.code == 0                       # a report; only --strict decides the exit status
    d = r.data
    assert not d["ok"] and d["failed"] == ["data directory"]
    c = checks(d)["data directory"]
    assert c["status"] == "fail" and not c["ok"] and "0700" in c["detail"]
    assert c["fix"] == f"chmod 700 {bk.data_dir}", c
    r = bk("doctor", "--strict")
    assert r.code == errors.EXIT_PARTIAL
    assert "not ready: 1 check failed (data directory)" in r.out
    assert "to fix:\n  data directory: " in r.out


def test_require_worker_fails_without_a_worker(bk):
    d = bk.data("doctor")
    assert "worker" not in checks(d)              # no jobs, no worker asked for: nothing to say
    r = bk.json("doctor", "--require-worker")
    assert r.code == 0 and not r.data["ok"] and r.data["require_worker"]
    w = checks(r.data)["worker"]
    assert w["status"] == "fail" and "no worker runs for you" in w["detail"]
    assert "bk w start" in w["fix"] and "bk-worker" in w["fix"]
    r = bk("doctor", "--require-worker", "--strict")
    assert r.code == errors.EXIT_PARTIAL and "not ready: 1 check failed (worker)" in r.out


@pytest.mark.slow
def test_the_worker_for_real(pyz, tmp_path):
    """A job waiting without a worker is a warning; a real ``bk w start``
    satisfies --require-worker --strict."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "TZ": "UTC",
           "BK_DATA_DIR": str(tmp_path / "data"), "BK_GPU_COUNT": "2"}

    def run(*args) -> tuple[int, dict]:
        p = subprocess.run([sys.executable, str(pyz), "--json", *args], env=env, capture_output=True,
                           text=True, timeout=60)
        return p.returncode, json.loads(p.stdout)

    (tmp_path / "data").mkdir(mode=0o700)
    rc, got = run("1", "30m", "-t", "+2h", "--", "/bin/true")
    assert rc == 0, got
    rc, got = run("doctor")
    w = checks(got["data"])["worker"]
    assert rc == 0 and w["status"] == "warn" and "1 of your jobs wait" in w["detail"], w
    rc, got = run("doctor", "--strict")
    assert rc == errors.EXIT_PARTIAL and got["data"]["failed"] == ["worker"]

    worker = subprocess.Popen([sys.executable, str(pyz), "w", "start"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        def runs():
            assert worker.poll() is None, worker.stderr.read()
            return checks(run("doctor")[1]["data"])["worker"]["status"] == "ok"
        poll(runs, 60, "the worker to hold its lock")
        rc, got = run("doctor", "--require-worker", "--strict")
        w = checks(got["data"])["worker"]
        assert rc == 0 and f"pid {worker.pid}" in w["detail"], got
    finally:
        if worker.poll() is None:           # only the worker this test started
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(10)


def test_no_monitor_is_fine_unless_required(bk):
    d = bk.data("doctor", "--strict")
    m = checks(d)["monitor"]
    assert m["status"] == "ok" and d["ok"]
    r = bk.json("doctor", "--require-monitor", "--strict")
    assert r.code == errors.EXIT_PARTIAL
    m = checks(r.data)["monitor"]
    assert m["status"] == "fail" and not m["ok"] and m["fix"] and r.data["failed"] == ["monitor"]
    assert r.data["require_monitor"] is True


def test_an_unusable_configuration_is_the_failed_check(bk):
    bk.config(slot_minutes=7)               # not a divisor of 60
    assert bk.json("l").code == errors.EXIT_CONFIG          # every other command refuses
    r = bk.json("doctor", "--strict")
    assert r.code == errors.EXIT_PARTIAL and r.envelope["ok"]
    d = r.data
    assert d["failed"] == ["config"] and len(d["checks"]) == 1
    c = d["checks"][0]
    assert "slot_minutes" in c["detail"] and "gpubk-config" in c["fix"]
    assert bk("doctor").code == 0


def test_help_documents_the_flags(bk):
    text = bk.data("help", "doctor")["text"]
    for flag in ("--probe", "--strict", "--require-monitor", "--require-worker"):
        assert flag in text
    assert "bk doctor --probe --require-monitor --strict" in text


# ------------------------------------------------------------- the monitor, for real

@pytest.mark.slow
def test_the_monitor_heartbeat_running_stopped_and_gone(pyz, tmp_path):
    """A real ``bk m`` (the built archive): running passes --require-monitor
    --strict; after SIGTERM it is stopped (a warning, a failure when
    required); killed, it goes stale; a damaged heartbeat is no heartbeat."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "TZ": "UTC",
           "BK_DATA_DIR": str(tmp_path / "data"), "BK_GPU_COUNT": "2"}

    def run(*args) -> tuple[int, dict]:
        p = subprocess.run([sys.executable, str(pyz), "--json", "doctor", *args], env=env,
                           capture_output=True, text=True, timeout=60)
        return p.returncode, json.loads(p.stdout)["data"]

    def start() -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, str(pyz), "m", "--interval", "0.2"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        started.append(p)
        return p

    def monitor_is(state: str):
        rc, d = run()
        return d if checks(d)["monitor"]["detail"].startswith(state) else None

    started: list[subprocess.Popen] = []
    try:
        p = start()
        poll(lambda: p.poll() is None and monitor_is("running"), 60, "the monitor to run")
        rc, d = run("--require-monitor", "--strict")
        m = checks(d)["monitor"]
        assert rc == 0 and m["status"] == "ok" and f"pid {p.pid}" in m["detail"], d
        assert d["monitor"]["state"] == "running" and d["monitor"]["pid"] == p.pid

        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0, p.stderr.read()
        rc, d = run()
        m = checks(d)["monitor"]
        assert rc == 0 and d["ok"] and m["status"] == "warn" and m["detail"].startswith("stopped")
        assert "bk m" in m["fix"]
        rc, d = run("--strict")
        assert rc == errors.EXIT_PARTIAL and d["failed"] == ["monitor"]
        rc, d = run("--require-monitor")
        assert checks(d)["monitor"]["status"] == "fail" and not d["ok"]

        p = start()
        poll(lambda: p.poll() is None and monitor_is("running"), 60, "the monitor to run again")
        p.kill()
        p.wait(30)
        rc, d = run("--require-monitor", "--strict")
        m = checks(d)["monitor"]
        assert rc == errors.EXIT_PARTIAL and m["status"] == "fail" and m["detail"].startswith("stale")
        assert f"process {p.pid} is gone" in m["detail"]

        # Issue 30 item 13: `bk m status` called a damaged heartbeat absent
        # while doctor called it damaged; both say damaged.
        (tmp_path / "data" / "monitor" / "heartbeat.json").write_text("{not json")
        rc, d = run()
        m = checks(d)["monitor"]
        assert m["status"] == "warn" and m["detail"].startswith("damaged: "), m
        assert d["monitor"]["state"] == "damaged"
        st = subprocess.run([sys.executable, str(pyz), "m", "status"], env=env, capture_output=True,
                            text=True, timeout=60)
        assert st.returncode == 0 and st.stdout.startswith("monitor: damaged ("), st.stdout
    finally:
        for q in started:               # only what this test started
            if q.poll() is None:
                q.kill()
                q.wait(10)


# ------------------------------------------------------------- a shared server

@pytest.fixture(scope="module")
def srv():
    if os.geteuid() != 0:
        pytest.skip("needs root (real accounts)")
    with site() as s:
        s.users = (s.accounts.user(),)
        p = s.init()
        assert p.returncode == 0, p.stderr
        yield s


def doctor(srv, account, *args) -> tuple[int, dict]:
    rc, env = srv.run_json(account, "doctor", *args)
    assert env["ok"] is True, env
    return rc, env["data"]


@pytest.mark.slow
@pytest.mark.root
@needs_root
def test_shared_server_without_and_with_its_broker(srv):
    (ada,) = srv.users
    # No broker: the socket is missing, a warning; --strict fails it.
    rc, d = doctor(srv, ada)
    assert rc == 0 and d["ok"] and d["warnings"] == 1, d
    sock = checks(d)["socket directory"]
    assert sock["status"] == "warn" and "not running" in sock["detail"]
    assert "gpubk-broker" in sock["fix"]
    cfg = checks(d)["config"]
    assert str(srv.config) in cfg["detail"] and str(srv.config.parent) in cfg["detail"]
    assert "/ root 0755" in cfg["detail"]               # every directory up to / was looked at
    rc, d = doctor(srv, ada, "--strict")
    assert rc == errors.EXIT_PARTIAL and d["failed"] == ["socket directory"]
    # --probe: the broker does not answer, and the probe is not tried.
    rc, d = doctor(srv, ada, "--probe")
    c = checks(d)
    assert c["broker"]["status"] == "fail" and c["broker"]["fix"]
    assert c["probe"]["status"] == "fail" and "not tried" in c["probe"]["detail"]
    assert d["failed"] == ["broker", "probe"]

    srv.start_broker()
    try:
        rc, d = doctor(srv, ada, "--probe", "--strict")
        assert rc == 0 and d["ok"], d
        c = checks(d)
        assert f"(uid {ada.uid})" in c["broker"]["detail"]            # authenticated as ada
        assert c["atomic replace"]["ok"] and c["locking"]["ok"]
        assert "mode 0666" in c["socket directory"]["detail"]
        rc, d = doctor(srv, None, "--probe", "--strict")           # root: every file is readable
        assert rc == 0 and d["ok"], d
        assert checks(d)["audit log"]["detail"].startswith("agrees with the ledger")

        # A socket directory others cannot enter: nobody reaches the broker.
        os.chmod(srv.socket.parent, 0o700)
        try:
            rc, d = doctor(srv, None, "--strict")
            s = checks(d)["socket directory"]
            assert rc == errors.EXIT_PARTIAL and s["status"] == "fail"
            assert s["fix"] == f"sudo chmod 755 {srv.socket.parent}"
        finally:
            os.chmod(srv.socket.parent, 0o755)
    finally:
        srv.stop_broker()


@pytest.mark.slow
@pytest.mark.root
@needs_root
def test_shared_server_untrusted_config_and_foreign_data_dir(srv):
    (ada,) = srv.users
    mode = stat.S_IMODE(os.lstat(srv.config).st_mode)
    os.chmod(srv.config, 0o666)
    try:
        rc, d = doctor(srv, ada, "--strict")
        assert rc == errors.EXIT_PARTIAL and d["failed"] == ["config"]
        c = d["checks"][0]
        assert "writable by group or others" in c["detail"] and c["fix"] == f"sudo chmod 644 {srv.config}"
    finally:
        os.chmod(srv.config, mode)
    os.chown(srv.data, ada.uid, -1)            # the data directory handed to the wrong account
    try:
        rc, d = doctor(srv, None)
        data = checks(d)["data directory"]
        assert data["status"] == "fail" and data["fix"], data
        assert f"chown {srv.service.name}" in data["fix"] or str(srv.service.uid) in data["fix"], data
    finally:
        os.chown(srv.data, srv.service.uid, -1)
    rc, d = doctor(srv, None)
    assert d["ok"], json.dumps(d, indent=1)


def test_a_heartbeat_from_ahead_of_the_clock_says_the_clock_went_back(pyz, tmp_path):
    """Issue 30 item 13: after the clock was stepped back, the monitor's
    heartbeat read "no update for -114708 s"."""
    from bk.store import snapshot as sf

    now = 1_780_000_000
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "TZ": "UTC",
           "BK_DATA_DIR": str(tmp_path / "data"), "BK_GPU_COUNT": "2", "BK_NOW": str(now)}
    assert subprocess.run([sys.executable, str(pyz), "1", "30m"], env=env, capture_output=True,
                          timeout=60).returncode == 0
    directory = tmp_path / "data" / "monitor"
    directory.mkdir(mode=0o755)
    # Written by a live process (this one) at a time 114708 s ahead of bk's clock.
    sf.write_heartbeat(str(directory), sf.heartbeat_doc(status="running", pid=os.getpid(), started_at=now + 114000,
                                                        updated_at=now + 114708, interval_s=2.0, detail=None,
                                                        samples=5))
    for argv in (["m", "status"], ["doctor"]):
        p = subprocess.run([sys.executable, str(pyz), *argv], env=env, capture_output=True, text=True, timeout=60)
        text = " ".join(p.stdout.split())
        assert "114708 s ahead of this clock (the clock went back" in text, (argv, p.stdout)
        assert "-114708" not in text
    p = subprocess.run([sys.executable, str(pyz), "--json", "m", "status"], env=env, capture_output=True,
                       text=True, timeout=60)
    hb = json.loads(p.stdout)["data"]
    assert hb["state"] == "stale" and hb["age_s"] is None        # no age at all, rather than a wrong one
