"""The two services, seen from the installer: start, stop, and whether
they are stopped.

Facts.  systemd is the init system when ``/run/systemd/system`` exists
(what ``sd_booted(3)`` tests); in a container, a chroot, or a staging root
it is not there, and ``systemctl`` would fail or act on the wrong machine.
Then the installer says so and prints the exact commands instead of running
them.

"Stopped" without systemd.  Before files are removed or replaced, nothing
may be writing them.  The writers announce themselves in two ways the
kernel keeps honest: the broker holds an ``flock`` on ``<socket>.lock`` for
as long as it runs and answers on its socket; every ledger writer holds
``ledger.lock`` in the data directory while it commits, and the monitor its
lock in ``<data>/monitor``.  A socket nobody answers (connect refused or no
socket) and locks nobody holds (a non-blocking ``flock`` succeeds) mean
stopped; a lock taken to probe is dropped at once.
"""

from __future__ import annotations

import os
import subprocess

from bk.admin import rootenv

UNITS = ("gpubk-broker.service", "gpubk-monitor.service")
# The enforcer's unit is installed disabled; only bk admin enforce on|off
# enables, starts, stops or disables it.  Uninstall stops and disables it.
OPTIONAL = ("gpubk-enforcer.service",)


def systemd_running(root: str) -> bool:
    return root == "/" and os.path.isdir("/run/systemd/system")


def start_commands(first: bool, start: bool) -> list[list[str]]:
    cmds = [["systemctl", "daemon-reload"]]
    if start:
        cmds.append(["systemctl", "enable", "--now", *UNITS])
        if not first:
            cmds.append(["systemctl", "restart", *UNITS])
    else:
        cmds.append(["systemctl", "enable", *UNITS])
    return cmds


def foreground(launcher: str) -> str:
    """The line that says how to run the services where systemd does not."""
    return (f"without systemd (a container, LXC, WSL), run them in the foreground instead: "
            f"sudo {launcher} admin services run")


def stop_commands() -> list[list[str]]:
    return [["systemctl", "stop", *UNITS]]


def shown(cmds: list[list[str]]) -> list[str]:
    return ["sudo " + " ".join(c) for c in cmds]


def run(cmds: list[list[str]], runner=subprocess.run) -> list[dict]:
    """Run systemctl commands; the outcome of each (nothing raised).  As
    root: found on root's own PATH, in bk's environment (``bk.admin.rootenv``)."""
    out = []
    for c in cmds:
        try:
            p = runner(c, capture_output=True, text=True, timeout=120, check=False, env=rootenv.environment(),
                       cwd=rootenv.CWD)
            out.append({"command": " ".join(c), "rc": p.returncode, "stderr": (p.stderr or "").strip()[-400:]})
        except (OSError, subprocess.SubprocessError) as e:
            out.append({"command": " ".join(c), "rc": None, "stderr": str(e)})
    return out


def _answers(socket_path: str) -> bool:
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(socket_path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _held(path: str) -> bool:
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def running_writers(socket_path: str, data_dir: str) -> list[str]:
    """What shows that a service still runs; empty when everything is stopped."""
    found = []
    if os.path.exists(socket_path) and _answers(socket_path):
        found.append(f"the broker answers on {socket_path}")
    locks = [socket_path + ".lock", os.path.join(data_dir, "ledger.lock")]
    mon = os.path.join(data_dir, "monitor")
    if os.path.isdir(mon):
        locks += sorted(os.path.join(mon, n) for n in os.listdir(mon) if n.endswith(".lock"))
    found += [f"{p} is locked by a running writer" for p in locks if _held(p)]
    return found


def active_units(runner=subprocess.run) -> list[str]:
    """With systemd: the units systemd says are active (or activating)."""
    active = []
    for unit in UNITS + OPTIONAL:
        try:
            p = runner(["systemctl", "is-active", unit], capture_output=True, text=True, timeout=30, check=False,
                       env=rootenv.environment(), cwd=rootenv.CWD)
        except (OSError, subprocess.SubprocessError):
            continue
        if (p.stdout or "").strip() in ("active", "activating", "reloading", "deactivating"):
            active.append(unit)
    return active


def status(root: str, socket_path: str, data_dir: str, runner=subprocess.run) -> dict:
    systemd = systemd_running(root)
    return {"systemd": systemd, "active_units": active_units(runner) if systemd else None,
            "running": running_writers(socket_path, data_dir)}


def unit_exec(unit_path: str) -> tuple[list[str], int, int]:
    """(ExecStart= argv, User=, Group=) of an installed unit, as numbers."""
    from bk.admin import unitfile

    svc = unitfile.load(unit_path)
    uid = unitfile.uid_of(svc.user, f"{unit_path}: User=")
    return svc.exec_start, uid, unitfile.gid_of(svc.group, uid, f"{unit_path}: Group=")


class TemporaryService:
    """Without systemd: run a unit's ``ExecStart=`` as its ``User=`` for as
    long as a verification needs it (``with`` block), then SIGTERM it.

    What systemd would add (the sandbox, the runtime directory) is not
    reproduced: the installer made the socket directory, and the point is
    that the new archive starts and serves as the service account."""

    def __init__(self, unit_path: str, socket_path: str, *, timeout: float = 20.0):
        self.unit_path, self.socket_path, self.timeout = unit_path, socket_path, timeout
        self.proc = None

    def __enter__(self) -> TemporaryService:
        import time

        argv, uid, gid = unit_exec(self.unit_path)
        env = rootenv.environment(HOME="/")
        self.proc = subprocess.Popen(argv, user=uid, group=gid, extra_groups=[], env=env, cwd=rootenv.CWD,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if _answers(self.socket_path):
                return self
            time.sleep(0.05)
        return self              # not answering: the verification will say so

    def __exit__(self, *exc) -> None:
        import signal

        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
        if self.proc.stderr:
            self.proc.stderr.close()
