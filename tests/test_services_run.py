"""``bk admin services run`` and the trial server, end to end, as a
container would use them: no systemd, the built archive installed into a
staging root as a trial server (``--simulated-gpus``), the two services
started by ``services run`` as a real throwaway service account, and a real
second user booking through the broker it started and passing the
deployment check ``bk doctor --probe --require-monitor --strict``.

Everything is run through the staged install's own command, with no
``--root`` and no ``BK_*`` variable: the staged launcher finds its root.

Root only: real accounts (``useradd``, removed after), processes started
as them, signals sent by pid to what the test started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from helpers_broker import SYSTEM_PYTHON, Accounts, make_base, needs_root, ping, poll

pytestmark = [pytest.mark.root, pytest.mark.slow, needs_root]

SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Server:
    """A staged install and the ``services run`` that serves it."""

    def __init__(self, base: Path, pyz: Path, accounts: Accounts, *extra: str):
        self.base, self.accounts = base, accounts
        self.root = base / "root"
        self.root.mkdir(mode=0o755)
        self.svc = accounts.user()
        self.ada = accounts.user()
        p = subprocess.run([SYSTEM_PYTHON, str(pyz), "--json", "admin", "install", "--root", str(self.root),
                            "--yes", "--no-start", "--service-user", self.svc.name, "--python", SYSTEM_PYTHON,
                            *extra], capture_output=True, text=True, timeout=300, env=self.root_env())
        assert p.returncode == 0, p.stdout + p.stderr
        self.install = json.loads(p.stdout)["data"]
        self.bk = self.root / "usr/local/bin/bk"
        self.launcher = self.root / "opt/gpubk/bin/bk"
        self.socket = self.root / "run/gpubk/broker.sock"
        self.run_proc: subprocess.Popen | None = None
        self.log = base / "run.log"

    @staticmethod
    def root_env() -> dict:
        # What a container's entry point has; BK_SERVICES_RUN_MARK must not
        # reach the services (they get the units' environment, not ours).
        return {"PATH": "/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8", "BK_SERVICES_RUN_MARK": "leak"}

    def start(self) -> subprocess.Popen:
        with open(self.log, "wb") as log:
            self.run_proc = subprocess.Popen([str(self.launcher), "--json", "admin", "services", "run"],
                                             stdout=subprocess.PIPE, stderr=log, env=self.root_env(),
                                             start_new_session=True)
        return self.run_proc

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def as_ada(self, *args: str) -> tuple[int, dict]:
        a = self.ada
        p = subprocess.run([str(self.bk), "--json", *args], capture_output=True, text=True, timeout=60,
                           env={"PATH": "/usr/bin:/bin", "HOME": a.home, "LANG": "C.UTF-8", "TZ": "UTC"},
                           cwd=a.home, user=a.uid, group=a.gid, extra_groups=[])
        try:
            return p.returncode, json.loads(p.stdout)
        except ValueError:
            raise AssertionError(f"bk {' '.join(args)}: rc {p.returncode}: {p.stdout!r} {p.stderr!r}") from None

    def stop(self) -> tuple[int, dict]:
        proc = self.run_proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        return proc.returncode, json.loads(out)

    def cleanup(self) -> None:
        proc = self.run_proc
        if proc is not None and proc.poll() is None:     # only the run this test started, by pid
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate(timeout=30)


@pytest.fixture
def make_server(pyz):
    made: list[Server] = []
    bases: list[Path] = []
    accounts: list[Accounts] = []

    def make(*extra: str) -> Server:
        base = make_base()
        bases.append(base)
        acc = Accounts(base)
        accounts.append(acc)
        s = Server(base, pyz, acc, *extra)
        made.append(s)
        return s

    yield make
    for s in made:
        s.cleanup()
    for acc in accounts:
        acc.cleanup()
    for base in bases:
        shutil.rmtree(base, ignore_errors=True)


def proc_status(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def proc_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode().partition("=")[::2] for item in raw.split(b"\0") if item)


def gone(pid: int) -> bool:
    """Exited and reaped: no /proc entry at all (a zombie still has one)."""
    return not os.path.exists(f"/proc/{pid}")


def monitor_pid(server: Server) -> int | None:
    rc, env = server.as_ada("m", "status")
    data = env.get("data") or {}
    return data.get("pid") if data.get("state") == "running" else None


def test_services_run_serves_a_real_user_as_the_units_say_and_stops_on_sigterm(make_server):
    server = make_server("--simulated-gpus", "2")
    svc = server.svc
    # No systemd here: the install says when to use services run.
    assert any("admin services run" in note for note in server.install["notes"]), server.install["notes"]
    server.start()
    # The deployment check of a trial server passes, monitor required, strict.
    poll(lambda: server.as_ada("doctor", "--probe", "--require-monitor", "--strict")[0] == 0, 90,
         "the deployment check to pass: " + server.log_text()[-2000:])
    rc, env = server.as_ada("doctor", "--probe", "--require-monitor", "--strict")
    checks = {c["name"]: c for c in env["data"]["checks"]}
    assert checks["monitor"]["status"] == "ok" and checks["monitor"]["detail"].startswith("running")
    assert "simulated on purpose" in checks["gpu_backend"]["detail"]
    # Every view says simulated.
    rc, env = server.as_ada("info")
    assert env["data"]["backend"] == {"name": "simulated", "simulated": True}
    rc, env = server.as_ada("st")
    assert env["data"]["telemetry"]["source"] == "simulated" and env["data"]["telemetry"]["simulated"] is True
    p = subprocess.run([str(server.bk), "info"], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "HOME": server.ada.home, "LANG": "C.UTF-8"},
                       user=server.ada.uid, group=server.ada.gid, extra_groups=[])
    assert "2 (simulated on purpose" in p.stdout, p.stdout

    # A real second user books through the broker services run started.
    rc, env = server.as_ada("1", "30m")
    assert rc == 0 and env["data"]["status"] == "created", env
    rc, env = server.as_ada("l")
    assert [r["user"] for r in env["data"]["reservations"]] == [server.ada.name]

    # The broker runs as the unit's User=, with the account's groups and the
    # units' environment, and nothing of the caller's.
    broker = ping(server.socket)["data"]["broker"]
    mon = monitor_pid(server)
    assert mon is not None
    for pid in (broker["pid"], mon):
        st = proc_status(pid)
        assert st["Uid"].split() == [str(svc.uid)] * 4 and st["Gid"].split()[0] == str(svc.gid)
        assert sorted(int(g) for g in st["Groups"].split()) == sorted(os.getgrouplist(svc.name, svc.gid))
        env = proc_env(pid)
        assert env["PATH"] == SYSTEMD_PATH and env["USER"] == svc.name and env["HOME"] == svc.home
        assert "BK_SERVICES_RUN_MARK" not in env and "BK_CONFIG_FILE" in env      # the staged launcher's
        assert "NOTIFY_SOCKET" in env if pid == broker["pid"] else "NOTIFY_SOCKET" not in env
    log = server.log_text()
    # Type=notify: the monitor (After= the broker) starts only once the broker is ready.
    assert log.index("gpubk-broker.service: ready") < log.index("gpubk-monitor.service: started")

    # bk admin services status, through the staged launcher with no --root.
    p = subprocess.run([str(server.launcher), "--json", "admin", "services", "status"], capture_output=True,
                       text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": "/root"})
    st = json.loads(p.stdout)["data"]
    assert st["status"] == "running" and any(str(server.socket) in r for r in st["running"]), st

    # SIGTERM: both stop cleanly, in order, are reaped, and the run exits 0.
    rc, env = server.stop()
    assert rc == 0 and env["ok"] is True and env["data"]["status"] == "stopped", env
    assert gone(broker["pid"]) and gone(mon)
    assert not server.socket.exists()                            # the broker removed its socket
    log = server.log_text()
    assert log.index("gpubk-monitor.service: stopping") < log.index("gpubk-broker.service: stopping")
    rc, env = server.as_ada("m", "status")
    assert env["data"]["state"] == "stopped"                     # the monitor recorded its clean stop
    # The booking survived.
    rc, env = server.as_ada("l")
    assert len(env["data"]["reservations"]) == 1


def test_a_service_that_dies_is_restarted_and_one_that_cannot_start_ends_the_run(make_server):
    server = make_server("--simulated-gpus", "2")
    proc = server.start()
    first = poll(lambda: monitor_pid(server), 90, "the monitor to run: " + server.log_text()[-2000:])
    os.kill(first, signal.SIGKILL)                               # the monitor dies
    again = poll(lambda: (pid := monitor_pid(server)) and pid != first and pid, 60,
                 "the monitor to be restarted: " + server.log_text()[-2000:])
    assert again != first and proc.poll() is None
    assert "gpubk-monitor.service was killed by signal 9; restarting in 5 s" in server.log_text()

    # The broker dies and cannot start again: a data directory others may
    # write is refused by its ExecStartPre= (bk broker --check, exit 78),
    # which RestartPreventExitStatus= says no restart can fix.
    data = server.root / "var/lib/gpubk"
    broker = ping(server.socket)["data"]["broker"]["pid"]
    os.chmod(data, 0o777)
    try:
        os.kill(broker, signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    finally:
        os.chmod(data, 0o755)
    env = json.loads(out)
    assert proc.returncode == 78 and env["ok"] is False, (proc.returncode, env)
    assert "a restart cannot fix" in env["error"]["message"]
    assert gone(broker) and gone(again)                          # the monitor was stopped and reaped
    log = server.log_text()
    assert "gpubk-broker.service was killed by signal 9; restarting in 2 s" in log
    assert "exited with status 78" in log


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia/version"), reason="this machine has an NVIDIA driver")
def test_a_server_that_expects_real_gpus_fails_its_check_with_the_driver_fix(make_server):
    server = make_server("--gpu-count", "2")
    server.start()
    poll(lambda: monitor_pid(server) is not None or "degraded" in json.dumps(server.as_ada("m", "status")[1]),
         90, "the monitor to sample: " + server.log_text()[-2000:])
    rc, env = server.as_ada("doctor", "--probe", "--require-monitor", "--strict")
    assert rc == 1
    checks = {c["name"]: c for c in env["data"]["checks"]}
    gpu, mon = checks["gpu_backend"], checks["monitor"]
    assert gpu["status"] == "fail" and "no NVIDIA driver is loaded" in gpu["detail"]
    assert mon["status"] != "ok" and "no NVIDIA driver is loaded" in mon["detail"]
    for check in (gpu, mon):
        assert "nvidia-smi" not in check["fix"] and "driver" in check["fix"]
        assert "--simulated-gpus" in check["fix"]
    rc, env = server.stop()
    assert rc == 0
