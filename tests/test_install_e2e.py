"""End to end, without systemd (these machines do not run it): install into
a staging root with a real throwaway service account, read the installed
units, run their ``ExecStartPre=`` and ``ExecStart=`` lines as the ``User=``
and ``Group=`` they name, with the environment a unit gives (systemd's PATH,
the account's HOME, the unit's UMask=, ``BK_CONFIG_FILE`` naming the staged
config since it is not /etc), and then let real users book, list and cancel
through the installed ``bk`` command (the staged command link to
``/opt/gpubk/bin/bk``), and pass the deployment check
``bk doctor --probe --require-monitor --strict`` as an ordinary user (and,
once the user unit ``bk-worker.service`` runs for her, with
``--require-worker`` too).

These machines have no GPUs either: without a GPU backend the monitor
rightly reports ``degraded`` (it samples a simulation), which the strict
check fails.  So every process, the units' and the users', gets
``BK_GPU_SIM_FILE`` naming two simulated GPUs, the one thing added to what
systemd would give; on a GPU server NVML takes its place.

Root only: real accounts (``useradd``, removed after), chown to them, and
processes started as them; every process is stopped by its own pid.
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers_broker import SYSTEM_PYTHON, Accounts, make_base, needs_root, ping, poll

from tests.helpers_install import variant

pytestmark = [pytest.mark.slow, pytest.mark.root, needs_root]

# What systemd puts in a service's environment before the unit's own
# Environment= lines (systemd.exec(5), "Environment Variables in Spawned
# Processes"): its default PATH, and for User= the account's HOME, USER,
# LOGNAME and SHELL.
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A unit file's sections, each key with every value it was given, in order
    (systemd allows a key more than once: ExecStartPre=, SystemCallFilter=)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):              # a continued line
            pending = line[:-1] + " "
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        assert current is not None, f"a setting outside any section: {raw!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def unit_environment(service: dict[str, list[str]], account: pwd.struct_passwd, config: Path) -> dict:
    env = {"PATH": SYSTEMD_PATH, "HOME": account.pw_dir, "USER": account.pw_name,
           "LOGNAME": account.pw_name, "SHELL": account.pw_shell, "LANG": "C.UTF-8"}
    for line in service.get("Environment", []):
        for word in shlex.split(line):
            key, _, value = word.partition("=")
            env[key] = value
    env["BK_CONFIG_FILE"] = str(config)          # the staged config is not /etc/gpubk/config.json
    env["BK_GPU_SIM_FILE"] = str(sim_file(config))
    return env


def sim_file(config: Path) -> Path:
    """Two simulated GPUs beside the staged tree (world-readable)."""
    path = config.parents[3] / "gpus.json"
    return path


def command_line(value: str) -> tuple[list[str], bool]:
    """An Exec*= value -> (argv, failure ignored).  "-" ignores failure;
    "+", "!" and "@" change privileges or argv[0], which bk's units must
    not need."""
    ignore = value.startswith("-")
    value = value.lstrip("-")
    assert value[:1] not in "+!@:", f"unexpected Exec prefix in {value!r}"
    return shlex.split(value), ignore


class Unit:
    """A system unit runs as its User=/Group=; a user unit (``account``
    given) as the user whose systemd --user instance starts it."""

    def __init__(self, path: Path, config: Path, account=None):
        self.path = path
        self.sections = parse_unit(path.read_text())
        service = self.sections["Service"]
        self.service = service
        if account is None:
            import grp

            # By name, as the installer writes them (as a package would).
            self.uid = pwd.getpwnam(service["User"][-1]).pw_uid
            self.gid = grp.getgrnam(service["Group"][-1]).gr_gid
        else:
            assert "User" not in service, f"a user unit names User=: {path}"
            self.uid, self.gid = account.uid, account.gid
        assert self.uid != 0, f"{path.name} would run as root"
        self.account = pwd.getpwuid(self.uid)
        self.env = unit_environment(service, self.account, config)
        self.umask = int(service.get("UMask", ["0022"])[-1], 8)

    def popen_args(self) -> dict:
        return {"user": self.uid, "group": self.gid, "extra_groups": [], "umask": self.umask,
                "env": self.env, "cwd": "/"}

    def pre(self) -> None:
        for value in self.service.get("ExecStartPre", []):
            argv, ignore = command_line(value)
            p = subprocess.run(argv, capture_output=True, text=True, timeout=60, **self.popen_args())
            assert ignore or p.returncode == 0, f"{self.path.name}: {value} -> {p.returncode}: {p.stderr}"

    def start(self, log: Path) -> subprocess.Popen:
        (value,) = self.service["ExecStart"]
        argv, _ = command_line(value)
        with open(log, "wb") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, **self.popen_args())


@pytest.fixture(scope="module")
def server(pyz):
    """A staged install whose two units run as their accounts; two users."""
    base = make_base()
    root = base / "root"
    root.mkdir(mode=0o755)
    accounts = Accounts(base)
    started: list[subprocess.Popen] = []
    try:
        svc = accounts.user()
        ada, bob = accounts.user(), accounts.user()
        p = subprocess.run([SYSTEM_PYTHON, str(pyz), "--json", "admin", "install", "--root", str(root), "--yes",
                            "--no-start", "--service-user", svc.name, "--simulated-gpus", "2",
                            "--python", SYSTEM_PYTHON],
                           capture_output=True, text=True, timeout=300,
                           env={"PATH": "/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"})
        assert p.returncode == 0, p.stdout + p.stderr
        config = root / "etc/gpubk/config.json"
        sim = sim_file(config)
        sim.write_text(json.dumps({"gpus": [{"name": "H100", "mem_total_mib": 81559, "mem_used_mib": 0,
                                             "util": 0, "processes": []}] * 2}))
        os.chmod(sim, 0o644)
        units = {name: Unit(root / "etc/systemd/system" / name, config)
                 for name in ("gpubk-broker.service", "gpubk-monitor.service")}
        socket = Path(json.loads(config.read_text())["socket"])
        broker, monitor = units["gpubk-broker.service"], units["gpubk-monitor.service"]
        assert broker.uid == svc.uid and monitor.uid == svc.uid

        broker.pre()
        started.append(broker.start(base / "broker.log"))
        poll(lambda: started[0].poll() is None and socket.exists() and ping(socket) is not None, 60,
             "the broker to answer")
        monitor.pre()
        started.append(monitor.start(base / "monitor.log"))
        yield {"base": base, "root": root, "config": config, "socket": socket, "service": svc,
               "users": (ada, bob), "procs": started, "units": units,
               "bk": root / "usr/local/bin/bk"}
    finally:
        for proc in started:                    # only what this fixture started, by pid
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(10)
        accounts.cleanup()
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def as_user(server, account, *args: str) -> tuple[int, dict]:
    """The installed bk command, as a user would type it: no BK_CONFIG_FILE
    of our own (the staged launcher names the staged config)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": account.home, "LANG": "C.UTF-8", "TZ": "UTC",
           "BK_GPU_SIM_FILE": str(sim_file(server["config"]))}
    p = subprocess.run([str(server["bk"]), "--json", *args], capture_output=True, text=True, timeout=60,
                       env=env, cwd=account.home, user=account.uid, group=account.gid, extra_groups=[])
    try:
        return p.returncode, json.loads(p.stdout)
    except ValueError:
        raise AssertionError(f"bk {' '.join(args)}: rc {p.returncode}: {p.stdout!r} {p.stderr!r}") from None


def test_the_units_name_a_non_root_account_and_the_staged_launcher(server):
    launcher = str(server["root"] / "opt/gpubk/bin/bk")
    for name, unit in server["units"].items():
        (start,) = unit.service["ExecStart"]
        assert start.split()[0] == launcher, (name, start)
        assert unit.account.pw_name == server["service"].name
    assert os.path.realpath(server["bk"]) == launcher


def test_users_book_list_and_cancel_through_the_installed_command(server):
    ada, bob = server["users"]
    rc, env = as_user(server, ada, "1", "30m", "--note", "e2e")
    assert rc == 0, env
    mine = env["data"]["reservation"]
    assert mine["uid"] == ada.uid                      # the broker took the kernel's word for it
    rc, env = as_user(server, bob, "x", "1", "1h")
    assert rc == 0, env
    bobs = env["data"]["reservation"]

    rc, env = as_user(server, ada, "l")
    assert rc == 0 and [r["id"] for r in env["data"]["reservations"]] == [mine["id"]], env
    rc, env = as_user(server, ada, "l", "--all")
    assert rc == 0 and {r["id"] for r in env["data"]["reservations"]} >= {mine["id"], bobs["id"]}, env

    rc, env = as_user(server, bob, "d", mine["id"][:8], "--yes")
    assert rc == 5 and env["error"]["code"] == "permission_denied", env
    rc, env = as_user(server, ada, "d", mine["id"][:8], "--yes")
    assert rc == 0 and env["data"]["status"] == "cancelled", env
    rc, env = as_user(server, ada, "l")
    assert rc == 0 and env["data"]["reservations"] == [], env
    rc, env = as_user(server, bob, "d", bobs["id"][:8], "--yes")
    assert rc == 0, env


def test_the_deployment_check_passes_as_an_ordinary_user(server):
    ada, _ = server["users"]
    data = server["root"] / "var/lib/gpubk"

    def monitor_running():
        rc, env = as_user(server, ada, "doctor")
        state = (env["data"].get("monitor") or {}).get("state")
        return state == "running"
    poll(monitor_running, 60, "the monitor's heartbeat")
    rc, env = as_user(server, ada, "doctor", "--probe", "--require-monitor", "--strict")
    report = env["data"]
    assert rc == 0 and report["ok"], json.dumps(report, indent=1)
    names = {c["name"]: c for c in report["checks"]}
    for name in ("config", "data directory", "ledger", "policy", "gpu_backend", "socket directory",
                 "monitor", "broker", "atomic replace", "locking"):
        assert names[name]["status"] == "ok", names[name]
    assert f"(uid {ada.uid})" in names["broker"]["detail"]
    assert str(server["config"]) in names["config"]["detail"]
    assert not list(data.glob(".ledger.json.tmp-probe-*"))

    # ada has no worker yet: requiring one names it, in the human form too.
    p = subprocess.run([str(server["bk"]), "doctor", "--probe", "--require-monitor", "--strict",
                        "--require-worker"], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "HOME": ada.home, "LANG": "C.UTF-8",
                            "BK_GPU_SIM_FILE": str(sim_file(server["config"]))},
                       user=ada.uid, group=ada.gid, extra_groups=[])
    assert p.returncode == 1 and "not ready: 1 check failed (worker)" in p.stdout, p.stdout + p.stderr


def test_the_user_unit_gives_ada_her_worker(server):
    """The installed user unit bk-worker.service, as ada's systemd --user
    would run it: then even --require-worker passes."""
    ada, _ = server["users"]
    unit = Unit(server["root"] / "etc/systemd/user/bk-worker.service", server["config"], account=ada)
    assert unit.service["ExecStart"][0].split()[0] == str(server["root"] / "opt/gpubk/bin/bk")
    unit.env["HOME"] = ada.home                      # the throwaway account's real home
    worker = unit.start(server["base"] / "worker.log")
    try:
        def runs():
            assert worker.poll() is None, (server["base"] / "worker.log").read_text(errors="replace")
            rc, env = as_user(server, ada, "doctor", "--require-worker")
            return {c["name"]: c for c in env["data"]["checks"]}["worker"]["status"] == "ok"
        poll(runs, 60, "ada's worker")
        rc, env = as_user(server, ada, "doctor", "--probe", "--require-monitor", "--require-worker", "--strict")
        assert rc == 0 and env["data"]["ok"], json.dumps(env["data"], indent=1)
        worker_check = {c["name"]: c for c in env["data"]["checks"]}["worker"]
        assert f"pid {worker.pid}" in worker_check["detail"]
    finally:
        if worker.poll() is None:                      # by its own pid
            os.kill(worker.pid, signal.SIGTERM)
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(worker.pid, signal.SIGKILL)
                worker.wait(10)


def test_stopping_the_units_is_seen_by_the_doctor(server):
    """Last (the module's order): SIGTERM, as systemctl stop sends it."""
    ada, _ = server["users"]
    broker, monitor = server["procs"]
    for proc in (monitor, broker):
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0, (server["base"] / "broker.log").read_text(errors="replace")
    deadline = time.monotonic() + 5
    while server["socket"].exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    rc, env = as_user(server, ada, "doctor", "--probe", "--require-monitor", "--strict")
    assert rc == 1
    report = env["data"]
    assert {"monitor", "broker", "probe"} <= set(report["failed"]), report["failed"]
    names = {c["name"]: c for c in report["checks"]}
    assert names["monitor"]["detail"].startswith("stopped")
    assert all(names[n]["fix"] for n in report["failed"])


def test_an_update_after_the_monitor_stopped_is_not_rolled_back(server, pyz):
    """After the test above: the monitor's last heartbeat says ``stopped``
    (as after every systemctl stop of an update).  The upgrade's own
    verification must not take that for a broken archive."""
    for proc in server["procs"]:                 # stopped already, unless this test runs alone
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(30)
    new = variant(pyz, server["base"] / "new.pyz", version="9.9.1")     # the same archive is up to date
    p = subprocess.run([SYSTEM_PYTHON, str(pyz), "--json", "update", str(new), "--apply", "--yes",
                        "--root", str(server["root"])], capture_output=True, text=True, timeout=300,
                       env={"PATH": "/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
                            "BK_GPU_SIM_FILE": str(sim_file(server["config"]))})
    data = json.loads(p.stdout)["data"]
    assert p.returncode == 0 and data["status"] == "updated", json.dumps(data.get("verify"), indent=1)[-3000:]
