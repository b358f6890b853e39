"""``bk admin enforce on|off|status``: the plan, its application, and what
the kernel and the enforcer say now.

Plan, apply, verify (the shape of ``bk admin init``):

* ``on`` plans what enforcement would do right now: the cgroups it would
  govern and, per user, the GPUs they keep and the ones they lose (every
  GPU they hold no booking on), with their processes that keep a GPU open
  without a booking (the kernel checks only at open).  Applying it writes
  ``enforce: true`` (and the options given) into the trusted
  configuration, then enables and starts ``gpubk-enforcer.service``; it
  waits until the enforcer reports ``enforcing``.
* ``off`` plans what would be detached.  Applying it writes ``enforce:
  false``, stops and disables the unit (without systemd: SIGTERM to the
  running enforcer, found by its lock), then detaches every gpubk program
  still attached anywhere in the cgroup tree (an earlier enforcer's plain
  attachments in closed mode) and counts again: ``off`` reports zero or
  fails.
* ``status`` reads: the configuration, the kernel's support, the
  enforcer's status file and, as root, the programs the kernel holds on
  each governed cgroup.

Without systemd (a container, a chroot, this project's tests) nothing is
started or stopped through ``systemctl``; the result says how to run the
enforcer (``bk admin enforce run``, as root).
"""

from __future__ import annotations

import json
import os
import subprocess
import time

from bk.core import enforce as rule
from bk.core.errors import ConfigError, InvalidInput, PermissionDenied
from bk.core.record import dataclass, field
from bk.core.timegrid import counted
from bk.enforce import cgroups, state

UNIT = "gpubk-enforcer.service"
UNIT_DIR = "/etc/systemd/system"
READY_S = 15.0


def _name(uid: int) -> str | None:
    from bk.users import user_name

    return user_name(uid)


def need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise PermissionDenied(f"bk admin enforce {what} is for the administrator (root)",
                               hint=f"sudo bk admin enforce {what}")


def systemd_running() -> bool:
    return os.path.isdir("/run/systemd/system")


def parse_bypass(words: list[str]) -> list[int]:
    """UIDs from user names or numbers (``--bypass alice,1002``)."""
    import pwd

    out = []
    for w in (x.strip() for chunk in words for x in chunk.split(",")):
        if not w:
            continue
        if w.isdigit():
            out.append(int(w))
            continue
        try:
            out.append(pwd.getpwnam(w).pw_uid)
        except KeyError:
            raise InvalidInput(f"--bypass: no user {w!r}", hint="name an existing account or give its UID") from None
    return sorted(set(out))


# -------------------------------------------------------------- what is there

@dataclass(frozen=True)
class Look:
    """Enforcement as seen now from this process."""

    support: dict
    root: str | None
    targets: list
    uncredited: list
    plan: list
    gpus: list
    devices: dict | None
    problems: list = field(default_factory=list)


def _support() -> dict:
    from bk.enforce import kernel

    if os.geteuid() != 0:
        return {"ok": None, "detail": "not checked: loading a device program needs root", "links": None}
    return kernel.probe().to_json()


def look(settings, now: int) -> Look:
    """What enforcement would govern and decide right now: the same
    discovery and rule as the enforcer, with container credits from the
    monitor's snapshot (no credit is remembered here, so a container whose
    credit came from an earlier booking shows as uncredited)."""
    from bk.enforce import daemon

    problems = []
    root = settings["enforce_cgroup_root"] or cgroups.find_root()
    read = daemon.ledger_reader(settings)
    try:
        reservations = read()
    except Exception as e:   # noqa: BLE001  (a BkError or an OSError: say it, plan with no bookings)
        problems.append(f"the ledger cannot be read: {getattr(e, 'message', e)}")
        reservations = []
    count = daemon.gpu_count(settings, read)
    devices = cgroups.device_map(count)
    gpus = [d.gpu for d in devices.gpus]
    targets, uncredited, found_holders = [], [], []
    snap = daemon.snapshot_reader(settings)(now)
    if root is None:
        problems.append("no cgroup v2 hierarchy is mounted")
    else:
        opts = daemon.options_for(settings, True)
        e = daemon.Enforcer(opts, devices=devices, read_ledger=lambda: reservations,
                            read_snapshot=lambda t: snap, kernel=_NoKernel(), log=lambda line: None)
        e._ledger()
        found = cgroups.scan(root)
        problems += list(found.problems)
        p = daemon.Pass()
        targets = e._targets(found, now, p)
        uncredited = p.uncredited
        if snap is not None:
            container_uid = {}
            for t in targets:
                if t.kind == rule.CONTAINER:
                    for pid in cgroups.procs(root, t.path):
                        container_uid[pid] = t.uid
            found_holders = rule.holders(snap, reservations, now, enforced=e.enforced, container_uid=container_uid)
    plan = rule.plan(targets, reservations, now, gpus, found_holders)
    return Look(_support(), root, targets, uncredited, plan, gpus, devices.to_json(), problems)


class _NoKernel:
    """The planner never touches the kernel."""


def plan_json(lk: Look) -> list[dict]:
    return [p.to_json(_name(p.uid)) for p in lk.plan]


# -------------------------------------------------------------- configuration

def write_config(settings, changes: dict) -> dict:
    """Set ``changes`` in the trusted configuration (atomic, trust-checked
    before it takes the name, like ``bk admin gpu-policy``); the document
    before."""
    from bk.store.config import KEYS, check_trusted, check_value
    from bk.store.fsutil import Safety, open_dir, replace_file

    path = settings.locations.config_file
    if not path or not settings.locations.config_is_system:
        raise ConfigError("enforcement needs a shared server's trusted configuration",
                          hint="set up the server first: sudo bk admin install (or bk admin init)")
    with open(path, "rb") as f:
        before = json.loads(f.read(1 << 20))
    after = dict(before)
    for key, value in changes.items():
        after[key] = check_value(KEYS[key], value, "bk admin enforce")
    if after == before:
        return before
    directory, name = os.path.split(path)
    fd = open_dir(directory, Safety(0))
    if fd is None:
        raise ConfigError(f"{directory} disappeared", hint="inspect it and rerun")
    try:
        replace_file(fd, name, directory, (json.dumps(after, indent=2, sort_keys=True) + "\n").encode(), 0o644,
                     owner=(0, 0), check=check_trusted)
    finally:
        os.close(fd)
    return before


def _systemctl(*args: str) -> dict:
    try:
        p = subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=60, check=False)
        return {"command": "systemctl " + " ".join(args), "rc": p.returncode, "stderr": p.stderr.strip()[-400:]}
    except (OSError, subprocess.SubprocessError) as e:
        return {"command": "systemctl " + " ".join(args), "rc": None, "stderr": str(e)}


def wait_for(state_dir: str, want: tuple[str, ...], timeout: float, *, since: float = 0.0) -> str:
    """Poll the status file until its state is one of ``want`` (updated
    after ``since``); the last state seen."""
    deadline = time.monotonic() + timeout
    seen = state.ABSENT
    while True:
        found, doc = state.read_status(state_dir)
        seen = state.liveness(doc, found, time.time())
        if seen in want and (doc is None or doc.get("updated_at", 0) >= since):
            return seen
        if time.monotonic() > deadline:
            return seen
        time.sleep(0.1)


def running_pid(state_dir: str) -> int | None:
    """The running enforcer's pid, from the holder of its lock; for a
    reader who may not open the lock (root's, 0600), from its status while
    that says it runs."""
    from bk.store.lock import holder

    try:
        fd = os.open(os.path.join(state_dir, state.LOCK_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except PermissionError:
        found, doc = state.read_status(state_dir)
        live = state.liveness(doc, found, time.time()) in (state.ENFORCING, state.FAILING_OPEN, state.FAILING_CLOSED)
        return doc["pid"] if live else None
    except OSError:
        return None
    try:
        return holder(fd)
    finally:
        os.close(fd)


# -------------------------------------------------------------- sweeping

@dataclass(frozen=True)
class Attached:
    cgroup: str
    id: int                       # the cgroup's id (its inode): the same in every cgroup namespace
    program: int
    name: str
    uid: int | None
    link: bool

    def to_json(self) -> dict:
        return {"cgroup": self.cgroup, "id": self.id, "program": self.program, "name": self.name, "uid": self.uid,
                "user": _name(self.uid) if self.uid is not None else None, "link": self.link}


def attached(root: str) -> list[Attached]:
    """Every gpubk program attached anywhere below ``root`` (root only:
    naming a program by its id needs ``CAP_SYS_ADMIN``)."""
    from bk.enforce import kernel

    links = {}
    try:
        for li in kernel.cgroup_links():
            if li.attach_type == kernel.ATTACH_CGROUP_DEVICE:
                links[(li.cgroup_id, li.prog_id)] = li.id
    except OSError:
        pass
    out = []
    for d, _subdirs, _files in os.walk(root):
        try:
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            ino = os.fstat(fd).st_ino
            try:
                ids = kernel.query(fd).ids
            except OSError:
                continue
            for pid in ids:
                info = kernel.prog_by_id(pid)
                if info is None:
                    continue
                if rule.is_program(info.name):
                    uid = rule.uid_of_program(info.name)
                    rel = "" if os.path.samefile(d, root) else os.path.relpath(d, root)
                    out.append(Attached(rel, ino, pid, info.name, uid, (ino, pid) in links))
        finally:
            os.close(fd)
    return out


def detach_all(root: str) -> tuple[int, list[str]]:
    """Detach every gpubk program below ``root``: links by id, plain
    attachments by descriptor.  (detached, problems)."""
    from bk.enforce import kernel

    n, problems = 0, []
    links = {}
    try:
        for li in kernel.cgroup_links():
            links[(li.cgroup_id, li.prog_id)] = li.id
    except OSError as e:
        problems.append(f"cannot list BPF links: {e.strerror}")
    for a in attached(root):
        path = os.path.join(root, a.cgroup)
        try:
            cg = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            link_id = links.get((os.fstat(cg).st_ino, a.program))
            if link_id is not None:
                lfd = kernel.link_fd_by_id(link_id)
                try:
                    kernel.link_detach(lfd)
                finally:
                    os.close(lfd)
            else:
                pfd = kernel.prog_fd_by_id(a.program)
                try:
                    kernel.detach(cg, pfd)
                finally:
                    os.close(pfd)
            n += 1
        except OSError as e:
            problems.append(f"{a.cgroup}: {e.strerror}")
        finally:
            os.close(cg)
    return n, problems


# -------------------------------------------------------------- on / off / status

def turn_on(settings, changes: dict, *, now: int, dry_run: bool) -> dict:
    lk = look(settings, now)
    want = {"enforce": True, **changes}
    out = {"status": "dry_run" if dry_run else "on", "dry_run": dry_run, "config_file": settings.source,
           "settings": want, "kernel": lk.support, "cgroup_root": lk.root, "devices": lk.devices,
           "plan": plan_json(lk), "uncredited": lk.uncredited, "problems": lk.problems,
           "systemd": systemd_running(), "actions": [], "enforcer": None}
    steps = [f"set {k} = {json.dumps(v)} in {settings.source}" for k, v in want.items()]
    unit = os.path.join(UNIT_DIR, UNIT)
    if out["systemd"]:
        steps.append(f"systemctl enable {UNIT}; systemctl restart {UNIT}")
    else:
        steps.append("start the enforcer as root: bk admin enforce run (systemd is not running here)")
    out["steps"] = steps
    if dry_run:
        return out
    need_root("on")
    if lk.support.get("ok") is False:
        from bk.core.errors import Unavailable

        raise Unavailable(f"this kernel cannot enforce: {lk.support['detail']}",
                          hint="nothing was changed; see bk admin enforce status")
    if lk.root is None:
        from bk.core.errors import Unavailable

        raise Unavailable("no cgroup v2 hierarchy is mounted here", hint="nothing was changed")
    write_config(settings, want)
    started = time.time()
    if out["systemd"]:
        if not os.path.exists(unit):
            out["problems"].append(f"{unit} is not installed: install it with sudo bk admin install")
        out["actions"] += [_systemctl("daemon-reload"), _systemctl("enable", UNIT), _systemctl("restart", UNIT)]
        out["enforcer"] = wait_for(settings["enforce_state_dir"], (state.ENFORCING, state.FAILING_OPEN,
                                                                   state.FAILING_CLOSED), READY_S, since=started)
    return out


def turn_off(settings, *, dry_run: bool) -> dict:
    root = settings["enforce_cgroup_root"] or cgroups.find_root()
    state_dir = settings["enforce_state_dir"]
    is_root = os.geteuid() == 0
    now_attached = [a.to_json() for a in attached(root)] if root and is_root else None
    pid = running_pid(state_dir)
    out = {"status": "dry_run" if dry_run else "off", "dry_run": dry_run, "config_file": settings.source,
           "systemd": systemd_running(), "enforcer_pid": pid, "attached": now_attached,
           "actions": [], "detached": 0, "left": None, "problems": []}
    steps = [f"set enforce = false in {settings.source}"]
    if out["systemd"]:
        steps.append(f"systemctl disable --now {UNIT}")
    elif pid is not None:
        steps.append(f"SIGTERM the running enforcer (pid {pid}); it detaches its programs")
    steps.append("detach every gpubk device program still attached, and count again")
    out["steps"] = steps
    if dry_run:
        return out
    need_root("off")
    write_config(settings, {"enforce": False})
    if out["systemd"]:
        out["actions"].append(_systemctl("disable", "--now", UNIT))
    if pid is not None:
        import signal

        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 30
        while running_pid(state_dir) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        if running_pid(state_dir) is not None:
            out["problems"].append(f"the enforcer (pid {pid}) did not stop within 30 s")
    if root is not None:
        n, problems = detach_all(root)
        out["detached"], out["problems"] = n, out["problems"] + problems
        left = attached(root)
        out["left"] = [a.to_json() for a in left]
        if left:
            out["problems"].append(f"{len(left)} gpubk programs are still attached")
    return out


def status(settings, *, now: int, events: int = 20) -> dict:
    """What enforcement is and does here, for anyone (the kernel's view
    needs root)."""
    state_dir = settings["enforce_state_dir"]
    found, doc = state.read_status(state_dir)
    live = state.liveness(doc, found, time.time())
    root = settings["enforce_cgroup_root"] or cgroups.find_root()
    is_root = os.geteuid() == 0
    kernel_view = None
    if is_root and root is not None:
        kernel_view = [a.to_json() for a in attached(root)]
    out = {"enforce": settings["enforce"], "failure": settings["enforce_failure"],
           "signal": settings["enforce_signal"], "grace_s": settings["enforce_signal_grace_seconds"],
           "bypass": settings["enforce_bypass"], "state_dir": state_dir, "cgroup_root": root,
           "kernel": _support(), "enforcer": live, "status": doc, "attached": kernel_view,
           "events": state.read_events(state_dir, limit=events, uid=None if is_root else os.getuid()),
           "verdict": verdict(settings["enforce"], live, doc, kernel_view)}
    return out


def verdict(on: bool, live: str, doc: dict | None, kernel_view: list | None) -> dict:
    """ok and a sentence: what doctor reports, the same for status."""
    if not on:
        left = len(kernel_view or ())
        if left:
            return {"ok": False, "detail": f"enforcement is off but {left} gpubk programs are attached",
                    "fix": "sudo bk admin enforce off"}
        if live in (state.ENFORCING, state.FAILING_OPEN, state.FAILING_CLOSED):
            return {"ok": False, "detail": "enforcement is off but an enforcer still runs",
                    "fix": "sudo bk admin enforce off"}
        return {"ok": True, "detail": "enforcement is off", "fix": None}
    if live != state.ENFORCING:
        failure = (doc or {}).get("failure")
        what = {"open": "every GPU is open", "closed": "no managed GPU opens"}.get(failure, "")
        return {"ok": False, "detail": f"enforcement is on but the enforcer is {live}" + (f": {what}" if what else ""),
                "fix": "sudo systemctl restart gpubk-enforcer; journalctl -u gpubk-enforcer"}
    targets = doc.get("targets") or []
    missing = [t["cgroup"] for t in targets if not t.get("attached")]
    if kernel_view is not None:
        # By the cgroup's id, not its path: the enforcer may see the tree through a cgroup namespace.
        have = {(a["id"], a["program"]) for a in kernel_view}
        missing += [t["cgroup"] for t in targets if t.get("attached") and (t.get("id"), t.get("program")) not in have]
    if missing or doc.get("problems"):
        return {"ok": False, "detail": f"enforcing, but not on {', '.join(missing) or 'every cgroup'}"
                + (f": {'; '.join(doc['problems'])}" if doc.get("problems") else ""),
                "fix": "journalctl -u gpubk-enforcer; bk admin enforce status"}
    users = sorted({t["uid"] for t in targets})
    return {"ok": True, "detail": f"enforcing on {counted(len(targets), 'cgroup')} of {counted(len(users), 'user')} "
            f"({doc.get('failure')} on failure)", "fix": None}


def doctor_checks(settings, *, now: int) -> list[tuple[str, str, str, str | None]]:
    """``bk doctor``'s checks while enforcement is on: (name, ok|warn|fail,
    detail, fix) for the kernel, the cgroup v2 mount and the enforcer with
    its programs per user."""
    d = status(settings, now=now, events=0)
    out = []
    k = d["kernel"]
    if k.get("ok") is None:
        running = d["enforcer"] == state.ENFORCING
        out.append(("enforce_kernel", "ok" if running else "warn",
                     "not probed (needs root); the running enforcer loads its programs" if running
                     else "not probed (needs root)", "sudo bk doctor"))
    else:
        out.append(("enforce_kernel", "ok" if k["ok"] else "fail", k["detail"],
                    None if k["ok"] else "a kernel with CONFIG_BPF_SYSCALL and CONFIG_CGROUP_BPF (4.15+; links 5.7+)"))
    root = d["cgroup_root"]
    out.append(("enforce_cgroup", "ok" if root else "fail",
                f"cgroup v2 is mounted at {root}" if root else "no cgroup v2 hierarchy is mounted",
                None if root else "boot with systemd's unified or hybrid cgroup layout"))
    v = d["verdict"]
    detail = v["detail"]
    doc = d["status"] or {}
    per_user: dict = {}
    for t in doc.get("targets") or []:
        per_user.setdefault(t.get("user") or f"uid {t['uid']}", set()).update(t.get("gpus") or ())
    if v["ok"] and per_user:
        shown = "; ".join(f"{u}: {', '.join(map(str, sorted(g))) or 'no GPU'}" for u, g in sorted(per_user.items()))
        detail += f"; may open now: {shown}"
    out.append(("enforcer", "ok" if v["ok"] else "fail", detail, v["fix"]))
    return out
