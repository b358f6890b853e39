"""What this installation is and whether it is healthy: ``bk info``,
``bk config`` and ``bk doctor``, as data for every front end.

Everything here only reads, except ``bk doctor --probe``.  ``doctor`` runs
each check on its own and turns any ``BkError`` into a failed check, so one
broken part (an unreadable ledger, an untrusted config, a broker that does
not answer) never hides the verdict on the others.

A check is ``ok``, ``warn`` or ``fail``, with a ``detail`` (what was found)
and, unless it is ok, a ``fix`` (the command or the change that repairs
it).  A warning is something a working installation can live with for a
while (a monitor that stopped, a broker socket missing because the broker
is down when nobody asked for ``--probe``); ``--strict`` counts warnings as
failures, so ``bk doctor --probe --require-monitor --strict`` is the
deployment check: exit 1 unless every part a shared server needs is there
and works.  Which parts are required is the caller's to say: a private
ledger has no monitor and no broker, and most users never start a
scheduled-command worker (``--require-worker`` asks for the caller's own).
"""

from __future__ import annotations

from bk import clock
from bk.core.envelope import SHARED_RESULT
from bk.core.errors import BkError
from bk.core.record import dataclass
from bk.core.timegrid import counted
from bk.service.status import policy_summary

OK, WARN, FAIL = "ok", "warn", "fail"


def _check(name: str, ok: bool, detail: str, *, fix: str | None = None, status: str | None = None) -> dict:
    """One check's record.  ``status`` (ok/warn/fail) wins over ``ok`` when given."""
    status = status or (OK if ok else FAIL)
    return {"name": name, "ok": status != FAIL, "status": status, "detail": detail,
            "fix": None if status == OK else fix}


# ----------------------------------------------------------------- info

def _gecos(uid: int) -> tuple[str | None, str | None]:
    """(account name, the GECOS full-name field) of ``uid``, or Nones."""
    import pwd

    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return None, None
    # GECOS is "Full Name,Room,Work phone,Home phone,Other"; the first field
    # is the one administrators fill in ("GPU admins <gpu@lab.example>").
    return pw.pw_name, (pw.pw_gecos or "").split(",")[0].strip() or None


def admin_contact(settings) -> dict:
    """Who to ask: the configured contact, else the service account's (or
    root's) GECOS name."""
    if settings["admin_contact"]:
        return {"contact": settings["admin_contact"], "source": "config", "account": None}
    uid = settings["service_uid"] if settings["service_uid"] is not None else 0
    account, gecos = _gecos(uid)
    return {"contact": gecos or account, "source": "gecos" if gecos else "account", "account": account}


@dataclass(frozen=True)
class Report:
    """A read whose result is its JSON document (``bk info``, ``bk config``,
    ``bk doctor``): ``report["checks"]`` reads it."""

    json: dict

    def to_json(self) -> dict:
        return self.json

    def __getitem__(self, key: str):
        return self.json[key]


class InfoResult(Report):
    """``bk info``: who runs this server, its mode, data, GPUs and rules."""


class ConfigResult(Report):
    """``bk config``: every setting, its effective value and its source."""


class DoctorResult(Report):
    """``bk doctor``: every check (ok, warn, fail) with its detail and fix, and the verdict."""

    @classmethod
    def unusable(cls, error: BkError, **flags) -> DoctorResult:
        """The report when the configuration itself cannot be used (no
        service could be opened): one failed check, ``config``."""
        return cls(unusable(error, **flags))


@dataclass(frozen=True)
class DoctorRequest:
    probe: bool = False               # also try the broker round trip, an atomic replace and the lock
    strict: bool = False              # warnings count as failures
    require_monitor: bool = False
    require_worker: bool = False


def _serve_info(service, req, call) -> InfoResult:
    return InfoResult(_info(service, call))


def _serve_config(service, req, call) -> ConfigResult:
    return ConfigResult(_config(service, call))


def _serve_doctor(service, req: DoctorRequest, call) -> DoctorResult:
    return DoctorResult(_doctor(service, req.probe, strict=req.strict, require_monitor=req.require_monitor,
                                require_worker=req.require_worker, call=call))


def _info(app, call) -> dict:
    s = app.settings
    inv = call.telemetry.inventory()
    return {
        "admin": admin_contact(s),
        "mode": s.mode,
        "data_dir": s.data_dir,
        "config_file": s.source,
        "gpu_count": call.policy.gpu_count,
        "backend": {"name": inv.source, "simulated": inv.simulated},
        "policy": policy_summary(call.policy),
        "timezone": clock.describe_zone(call.tz),
        "your_limits": _your_limits(call),
        "advance_default": call.policy.advance_default,
        "fair_share": call.policy.fair_share_half_life_s is not None,
    }


def _your_limits(call) -> dict | None:
    """The lab's per-user limits that apply to the caller (issue 27), or None."""
    from bk.service.limits import bounds

    b = bounds(call)
    return None if b is None else b.to_json()


# --------------------------------------------------------------- config

def _config(app, call) -> dict:
    """Every key with its effective value and where it came from."""
    from bk.store.config import KEYS

    s = app.settings
    from_file = s.explicit
    keys = {}
    for name, key in KEYS.items():
        value = s[name]
        source = "file" if name in from_file else "default"
        if name == "gpu_count" and value is None:
            value = call.policy.gpu_count
            inv = call.telemetry.inventory()
            if inv.reason:
                source = "simulated default"
            elif inv.simulated:
                source = "environment"          # BK_GPU_COUNT or BK_GPU_SIM_FILE
            else:
                source = "detected"
        if name == "data_dir" and value is None:
            value = s.data_dir
            source = "default" if s.mode == "shared" else "environment"
        keys[name] = {"value": value, "source": source, "security": key.security, "doc": key.doc}
    return {"mode": s.mode, "config_file": s.locations.config_file, "config_read": s.source,
            "trusted": s.locations.config_is_system, "data_dir": s.data_dir,
            "state_dir": s.locations.state_dir, "settings": keys}


# --------------------------------------------------------------- doctor

def _split_hint(detail: str) -> tuple[str, str | None]:
    """The store words a refusal as "message (hint: how to fix)", or ends
    it with the command that fixes it in parentheses ("(chmod 700 DIR)");
    doctor keeps the two apart (detail, fix), leaving a bare command in the
    detail too, as it always was."""
    if detail.endswith(")") and " (hint: " in detail:
        head, _, hint = detail.rpartition(" (hint: ")
        return head, hint[:-1]
    if detail.endswith(")") and " (chmod " in detail:
        return detail, detail.rpartition(" (")[2][:-1]
    return detail, None


def _failed(name: str, e: BkError) -> dict:
    return _check(name, False, e.message, fix=e.hint)


def _account(uid: int | None) -> str:
    from bk.users import user_name

    if uid is None:
        return "nobody"
    return user_name(uid) or f"uid {uid}"


def _trust_chain(path: str) -> str:
    """"path (owner, mode)" for the file and every directory above it: what
    the trust rule looked at, so the administrator sees it was all of it."""
    import os
    import stat

    parts = []
    here = os.path.abspath(path)
    while True:
        st = os.lstat(here)
        mode = stat.S_IMODE(st.st_mode)
        parts.append(f"{here} {_account(st.st_uid)} {mode:04o}" + (" sticky" if mode & stat.S_ISVTX else ""))
        parent = os.path.dirname(here)
        if parent == here:
            return ", ".join(parts)
        here = parent


def _config_check(app, call) -> dict:
    s = app.settings
    if s.mode == "private":
        where = s.source or "defaults (no config file)"
        return _check("config", True, f"private mode; settings from {where}")
    from bk.store.config import check_trusted

    path = s.locations.config_file
    check_trusted(path)
    return _check("config", True, f"shared mode; {path} and every directory above it are root-owned and "
                                  f"writable by nobody else: {_trust_chain(path)}")


def _ledger_checks(app, call) -> list[dict]:
    store = app.store
    checks = []
    from bk.store import health

    for name, ok, detail in health.check(store):
        detail, fix = _split_hint(detail)
        checks.append(_check(name, ok, detail, fix=fix))
    for c in checks:
        if c["name"] == "data directory" and c["ok"]:
            problem = _unwritable(app, store.paths.data_dir) or _not_owned(app, store.paths.data_dir)
            if problem:
                # The remedy stays in the detail too, as it always was: a
                # report pasted without its fixes still says what to do.
                c.update(ok=False, status=FAIL, fix=problem[1],
                         detail=c["detail"] + "; " + "; ".join(p for p in problem if p))
    return checks


def _not_owned(app, data_dir: str) -> tuple[str, str | None] | None:
    """On a shared server: the data directory must belong to the service
    account and lie below directories only root or that account can change
    (the broker's own start-up rule, ``check_owned_dir``)."""
    import os

    s = app.settings
    if s.mode != "shared" or not os.path.lexists(data_dir):
        return None
    if s["service_uid"] is None:
        return (f"{s.source} names no service_uid, so nobody may own it",
                "sudo bk admin init --service-user ACCOUNT")
    from bk.store.config import check_owned_dir

    try:
        check_owned_dir(data_dir, s["service_uid"], "data directory")
    except BkError as e:
        return e.message, e.hint
    return None


def _unwritable(app, data_dir: str) -> tuple[str, str] | None:
    """Why the next write into ``data_dir`` would fail although the
    directory looks right, as (problem, fix): its file system is mounted
    read-only (statvfs's ST_RDONLY, for the directory or, before the first
    write, its nearest existing parent), or, where this user is the writer
    (private mode), the directory is not writable by them.  Only
    ``--probe`` writes; this is the read-only way to see the same thing."""
    import os

    from bk.store.fsutil import mount_point

    where = data_dir
    while not os.path.exists(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    try:
        if os.statvfs(where).f_flag & os.ST_RDONLY:
            mount = mount_point(where)
            return (f"read-only file system: {mount} is mounted read-only",
                    f"remount it read-write (mount -o remount,rw {mount}) or point BK_DATA_DIR at a "
                    "writable directory")
    except OSError as e:
        return f"cannot inspect {where}: {e.strerror}", f"ls -ld {where}"
    if app.settings.mode == "private" and not os.access(where, os.W_OK | os.X_OK):
        return f"{where} is not writable by you", f"ls -ld {where}; chown it to yourself or set BK_DATA_DIR"
    return None


def _state_check(app, call) -> dict:
    """The caller's own state directory (presets, job specs and logs, the
    prompt history): every write there is this user's, so it and the
    directories bk keeps in it must be real directories of theirs, writable
    by them and by nobody else (``StateDir``'s rule).  Before the first
    preset or job it need not exist, but its nearest existing parent must
    let it be made."""
    import os
    import stat

    from bk.store.fsutil import unsafe_stat

    top = app.settings.locations.state_dir
    me = os.geteuid()
    if not os.path.lexists(top):
        where = top
        while not os.path.lexists(where) and os.path.dirname(where) != where:
            where = os.path.dirname(where)
        if os.path.isdir(where) and os.access(where, os.W_OK | os.X_OK):
            return _check("state directory", True, f"{top}: not made yet (the first preset or job makes it)")
        return _check("state directory", False, f"{top} does not exist and {where} does not let you make it",
                      fix=f"ls -ld {where}; make {top} yours (mkdir -p -m 0700 {top}) or set XDG_STATE_HOME")
    checked = []
    for path in (top, os.path.join(top, "jobs"), os.path.join(top, "jobs", "specs"),
                 os.path.join(top, "jobs", "logs")):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        bad = unsafe_stat(st, me, want_dir=True)
        if bad is not None:
            return _check("state directory", False, f"{path}: {bad[1]}",
                          fix=f"ls -ld {path}; it must be a directory of yours (uid {me}), mode 0700")
        if not os.access(path, os.W_OK | os.X_OK):
            return _check("state directory", False, f"{path} is not writable by you "
                          f"(mode {stat.S_IMODE(st.st_mode):04o})", fix=f"chmod u+rwx {path}")
        checked.append(path)
    return _check("state directory", True, f"{top}: yours and writable"
                  + (f" ({len(checked) - 1} directories in it too)" if len(checked) > 1 else ""))


def _socket_check(app, call) -> dict:
    """The broker's socket directory and socket: owned by the service
    account, the modes ``access`` asks for.  A missing directory or socket
    only means the broker is not running (systemd creates the directory at
    start, RuntimeDirectory=), so without ``--probe`` that is a warning."""
    import os
    import stat

    from bk.store.config import check_owned_dir

    s = app.settings
    path, uid = s["socket"], s["service_uid"]
    directory = os.path.dirname(path)
    start = "sudo systemctl start gpubk-broker"
    if uid is None:
        return _check("socket directory", False, f"{s.source} names no service_uid",
                      fix="sudo bk admin init --service-user ACCOUNT")
    if not os.path.lexists(directory):
        return _check("socket directory", True, f"{directory} does not exist: the broker is not running "
                      "(its unit creates the directory at start)", status=WARN, fix=start)
    st = check_owned_dir(directory, uid, "socket directory")
    mode = stat.S_IMODE(st.st_mode)
    detail = f"{directory}: {_account(st.st_uid)}, mode {mode:04o}"
    if s["access"] == "group":
        import grp

        try:
            gid = grp.getgrnam(s["group"]).gr_gid
        except KeyError:
            return _check("socket directory", False, detail + f"; group {s['group']!r} does not exist",
                          fix=f"groupadd {s['group']}, or fix 'group' in {s.source}")
        if st.st_gid != gid or mode & 0o007 or not mode & stat.S_ISGID or not mode & 0o010:
            return _check("socket directory", False, detail + f"; access is 'group': it must be "
                          f"{_account(uid)}:{s['group']}, mode 2750, so only members reach the socket",
                          fix=f"sudo chgrp {s['group']} {directory} && sudo chmod 2750 {directory}")
        want = 0o660
    else:
        if mode & 0o001 == 0:
            return _check("socket directory", False, detail + "; access is 'all', but others cannot "
                          "enter it, so nobody else reaches the socket", fix=f"sudo chmod 755 {directory}")
        want = 0o666
    try:
        sst = os.lstat(path)
    except FileNotFoundError:
        return _check("socket directory", True, detail + f"; no socket at {path}: the broker is not "
                      "running", status=WARN, fix=f"{start} (by hand: sudo -u {_account(uid)} bk broker)")
    smode = stat.S_IMODE(sst.st_mode)
    if not stat.S_ISSOCK(sst.st_mode):
        return _check("socket directory", False, detail + f"; {path} is not a socket",
                      fix=f"move {path} away; the broker binds its own socket there")
    if sst.st_uid != uid or smode != want:
        return _check("socket directory", False, detail + f"; the socket is {_account(sst.st_uid)}'s, "
                      f"mode {smode:04o}, not {_account(uid)}'s, mode {want:04o}",
                      fix="sudo systemctl restart gpubk-broker (the broker binds the socket with the "
                          "right owner and mode)")
    return _check("socket directory", True, detail + f"; socket {path}: {_account(sst.st_uid)}, mode {smode:04o}")


def _policy_check(app, call) -> dict:
    """The store's own rule (``bk.core.policy``): what fails here is what
    the next booking would refuse, and nothing else."""
    from bk.core.ledgerdoc import DocKeep
    from bk.core.policy import policy_diff

    state = app.ledger(call=call, keep=DocKeep())       # the bound policy; no booking is needed
    if state.policy is None:
        return _check("policy", True, "not bound yet; the first booking records it")
    diff = policy_diff(state.policy, call.policy.bound())
    if diff.conflicts:
        return _check("policy", False, "configuration disagrees with the ledger's policy: " + diff.describe(),
                      fix=f"put the ledger's values back in {app.settings.source or 'the configuration'} "
                          "(man 5 gpubk-config, Policy binding)")
    detail = "configuration agrees with the policy bound in the ledger"
    if diff.additions:
        detail += f"; the ledger lacks {diff.describe_additions()}, which the next write adds"
    return _check("policy", True, detail)


def _gpu_check(app, call) -> dict:
    snap, inv = call.telemetry.snapshot(), call.telemetry.inventory()
    gpus = snap.gpus
    detail = f"{snap.source}: {counted(len(gpus), 'GPU')}"
    reason = inv.reason
    if reason or snap.reason:
        detail += f" ({reason or snap.reason})"
    # What this source can and cannot see, so that "no processes" is never
    # read where the truth is "cannot tell" (nvidia-smi lists none).
    if snap.capabilities:
        detail += "; sees " + ", ".join(snap.capabilities)
    if snap.gaps:
        detail += "; missing " + ", ".join(snap.gaps)
    # On a shared server a simulation standing in for missing telemetry is a
    # fault unless the administrator fixed the count in the config (then only
    # the live data is missing, and placement uses share slots alone); in
    # private mode (BK_GPU_COUNT, a demo) it is what was asked for.  A real
    # fallback (nvidia-smi, after NVML did not answer) is no fault: its gaps
    # are named above.  A server without the driver at all expects GPUs it
    # cannot have: unless it was installed as a trial server (simulated_gpus,
    # a simulation chosen on purpose, with no reason), that is a fault
    # whatever the count, and no tool is worth pointing at.
    from bk.gpu import NO_DRIVER_LOADED

    ok = True
    fix = None
    if app.settings["simulated_gpus"] and snap.simulated and not (reason or snap.reason):
        detail += (f"; simulated on purpose (simulated_gpus in {app.settings.source or 'the configuration'}): "
                   "placement by share slots alone")
    elif (reason or snap.reason) == NO_DRIVER_LOADED and app.settings.mode == "shared":
        ok = False
        detail += "; this server expects real GPUs (simulated_gpus is not set)"
        fix = ("install and load the NVIDIA driver (its kernel module makes /proc/driver/nvidia/version), "
               "then restart the services; a trial server without GPUs: sudo bk admin install "
               "--simulated-gpus N")
    elif (reason or snap.reason) and snap.simulated and app.settings.mode == "shared":
        if "gpu_count" in app.settings.explicit:
            detail += (f"; no GPU telemetry, so {counted(call.policy.gpu_count, 'GPU')} from the "
                       "configuration are scheduled by share slots alone")
        else:
            ok = False
            detail += "; set gpu_count in the configuration (sudo bk admin init --gpu-count N)"
    if call.policy.gpu_count != len(gpus):
        ok = False
        detail += f"; the policy schedules {call.policy.gpu_count}"
    return _check("gpu_backend", ok, detail, fix=fix)


def _broker_check(app, call) -> dict:
    """The broker answers, runs as the service account, and authenticates
    us: the uid it read from SO_PEERCRED for this very connection is ours."""
    import os

    from bk import __version__
    from bk.service.requests import Empty

    got = app.run("ping", Empty(), call=call).to_json()
    broker, peer = got.get("broker", {}), got.get("peer", {})
    problems, fixes = [], []
    if broker.get("uid") != app.settings["service_uid"]:
        problems.append(f"it runs as uid {broker.get('uid')}, not the service account "
                        f"{app.settings['service_uid']}")
        fixes.append(f"run it as {_account(app.settings['service_uid'])} (User= in gpubk-broker.service)")
    if peer.get("uid") != os.getuid():
        problems.append(f"it sees you as uid {peer.get('uid')}, but you are uid {os.getuid()}")
        fixes.append(f"something else answers at {app.settings['socket']}: find it (ss -xlp) and stop it")
    if broker.get("version") != __version__:
        problems.append(f"it runs bk {broker.get('version')}, this is bk {__version__} "
                        "(restart it after an upgrade)")
        fixes.append("sudo systemctl restart gpubk-broker")
    detail = (f"{app.settings['socket']}: bk {broker.get('version')}, pid {broker.get('pid')}, "
              f"uid {broker.get('uid')}; it knows you as {peer.get('user')} (uid {peer.get('uid')})")
    return _check("broker", not problems, "; ".join([detail, *problems]), fix="; ".join(fixes) or None)


def _probe_checks(app, call) -> list[dict]:
    """Atomic replace and the writers' lock, tried for real in the data
    directory by its writer: this process in private mode, the broker (as
    the service account) on a shared server."""
    checks = []
    from bk.service.requests import Empty

    for name, ok, detail in app.run("probe", Empty(), call=call).checks:
        detail, fix = _split_hint(detail)
        checks.append(_check(name, ok, detail, fix=fix))
    return checks


def _monitor_check(app, call, required: bool) -> tuple[dict, dict | None]:
    """The monitor's heartbeat (contract B, ``bk.store.snapshot``): the
    check and the heartbeat's JSON."""
    import os

    from bk.store.snapshot import ABSENT_HEARTBEAT, HEARTBEAT_FILE, monitor_dir, monitor_owner, read_heartbeat

    directory = monitor_dir(app.settings)
    # Only the monitor account's files count: a heartbeat anyone else
    # wrote there is no evidence that the monitor runs.
    hb = read_heartbeat(directory, call.now, owner=monitor_owner(app.settings))
    got = hb.to_json()
    state = hb.state
    where = f"pid {hb.pid}" if hb.pid else "no pid"
    age = got.get("age_s")
    seen = f", last heard from {age:.0f} s ago" if isinstance(age, (int, float)) else ""
    every = f", sampling every {hb.interval_s:g} s" if hb.interval_s else ""
    detail = f"{state} ({where}{seen}{every})" + (f": {hb.detail}" if hb.detail else "")
    start = ("sudo systemctl start gpubk-monitor" if app.settings.mode == "shared"
             else "run bk m in another terminal (or leave out --require-monitor)")
    if state == "running":
        return _check("monitor", True, detail), got
    path = os.path.join(directory, HEARTBEAT_FILE)
    if state == "damaged" or (state == "absent" and os.path.lexists(path)):
        # A file is there, but no heartbeat bk can believe (damaged, or
        # written by another account): the reader treats it as none.
        why = hb.detail if hb.detail != ABSENT_HEARTBEAT.detail else \
            f"{path} is damaged or not the monitor account's"
        return _check("monitor", True, f"damaged: {why}", status=FAIL if required else WARN,
                      fix=f"restart the monitor, which writes a new one ({start})"), got
    if state == "absent":
        if not required:
            return _check("monitor", True, f"no monitor has run here ({directory}); each command "
                                           "samples the GPUs itself"), got
        return _check("monitor", False, f"no monitor has run here ({directory})", fix=start), got
    from bk.gpu import NO_DRIVER_LOADED

    fixes = {"degraded": ("no NVIDIA driver is loaded: install and load it, then restart the monitor; a "
                          "trial server without GPUs: sudo bk admin install --simulated-gpus N")
                         if NO_DRIVER_LOADED in (hb.detail or "") else
                         "the GPU backend reports gaps: journalctl -u gpubk-monitor, nvidia-smi",
             "stale": "it stopped answering; sudo systemctl restart gpubk-monitor"
                      if app.settings.mode == "shared" else "it stopped answering; restart bk m",
             "stopped": start,
             "topology-mismatch": "the GPUs differ from the ones the ledger schedules: check nvidia-smi "
                                  "and gpu_count (man 5 gpubk-config), then restart the monitor"}
    # A degraded monitor runs and samples; what it reports has gaps.  That
    # stays a warning even when a monitor is required (--strict fails it).
    status = FAIL if required and state != "degraded" else WARN
    return _check("monitor", True, detail, status=status, fix=fixes.get(state, start)), got


def _worker_check(app, call, required: bool) -> dict | None:
    """Your scheduled-command worker (``bk w``): one per user, found by the
    kernel lock it holds.  Required, it must run; otherwise it is worth a
    line only when you have jobs waiting for it (then a warning), since
    most users never attach a command to a booking."""
    from bk.service import jobs

    st = jobs._worker_status(app)
    if st["state"] == "running":
        since = f" since {st['since']}" if st.get("since") else ""
        return _check("worker", True, f"your worker runs (pid {st['pid']}{since})")
    waiting = sum(1 for r in jobs._my_jobs(app, call) if r.job.status in ("pending", "running"))
    fix = ("systemctl --user enable --now bk-worker (and loginctl enable-linger $USER), "
           "or bk w start in a terminal that stays open")
    if waiting:
        return _check("worker", True, f"no worker runs for you, and {waiting} of your jobs wait for one",
                      status=FAIL if required else WARN, fix=fix)
    if required:
        return _check("worker", False, "no worker runs for you", fix=fix)
    return None


def _notify_check(app, call) -> dict | None:
    """Your notifications (``bk notify``): a channel that has been failing,
    or settings with no deliverer to act on them; nothing for most users."""
    from bk.service.notify import doctor_check

    return doctor_check(app, call)


# What to do when a check fails and its own error named no fix.
FIXES = {
    "config": "sudo bk admin init, or correct the file (man 5 gpubk-config)",
    "data directory": "ls -ld DIR: it must be a real directory owned by its writer (you in private mode, "
                      "the service account on a server), not writable by group or others",
    "ledger": "see docs/GUIDE.md section 5.10 (backups, validation and recovery)",
    "backups": "move the invalid backups aside (they are never used); the next writes make new ones",
    "audit log": "sudo bk admin data recover --dry-run shows what the ledger lacks",
    "lock": "see who holds it: ls -l /proc/*/fd 2>/dev/null | grep ledger.lock",
    "gpu_backend": "set gpu_count in the configuration (sudo bk admin init --gpu-count N); install "
                   "nvidia-ml-py for live data",
    "ledger_read": "sudo bk doctor shows what the service account sees; docs/GUIDE.md section 5.10",
    "broker": "systemctl status gpubk-broker",
    "probe": "fix the broker first (systemctl status gpubk-broker)",
    "atomic replace": "the data directory's file system refuses a write, an fsync or a rename: "
                      "check it (df, mount, dmesg)",
    "locking": "the file system refuses flock (a network mount?): keep the data directory on a local disk",
}

def _enforce_checks(app, call) -> list[dict]:
    """Hard enforcement, only where the configuration turns it on (issue 31):
    kernel support, the cgroup v2 mount, the enforcer and its programs."""
    from bk.enforce.admin import doctor_checks

    return [_check(name, status != FAIL, detail, fix=fix, status=status)
            for name, status, detail, fix in doctor_checks(app.settings, now=call.now)]


CHECKS = (("config", _config_check), ("ledger", _ledger_checks), ("state directory", _state_check),
          ("policy", _policy_check), ("gpu_backend", _gpu_check))


def _run(name: str, fn, *args) -> list[dict]:
    try:
        got = fn(*args)
    except BkError as e:
        got = _failed(name, e)
    except OSError as e:
        got = _check(name, False, f"{e.filename or name}: {e.strerror}")
    return got if isinstance(got, list) else [got]


def unusable(error: BkError, *, probe: bool = False, strict: bool = False, require_monitor: bool = False,
             require_worker: bool = False) -> dict:
    """The report when the configuration itself cannot be used (untrusted,
    unreadable, a bad value): every other check depends on it, so there is
    one failed check, ``config``, saying why and how to fix it, instead of
    the refusal every other command gives (exit 78)."""
    check = _failed("config", error)
    check["fix"] = check["fix"] or FIXES["config"]
    check["detail"] += "; nothing else can be checked until bk can read its configuration"
    return {"ok": False, "strict": strict, "probe": probe, "require_monitor": require_monitor,
            "require_worker": require_worker, "failed": ["config"], "warnings": 0, "monitor": None,
            "checks": [check]}


def _doctor(app, probe: bool = False, *, strict: bool = False, require_monitor: bool = False,
            require_worker: bool = False, call=None) -> dict:
    """Run every read-only check, and with ``probe`` the ones that try for
    real (the broker's answer and identity; atomic replace and locking in
    the data directory, done by the broker on a shared server).

    -> ``{"ok", "strict", "probe", "require_monitor", "require_worker",
    "failed": [name], "warnings": n, "monitor": heartbeat or None,
    "checks": [{name, ok, status, detail, fix}]}``.  With ``strict`` a
    warning is not ok: the check's ``ok`` and the verdict say so."""
    call = call or app.call()
    shared = app.settings.mode == "shared"
    checks: list[dict] = []
    for name, fn in CHECKS:
        checks += _run(name, fn, app, call)
    if shared:
        checks += _run("socket directory", _socket_check, app, call)
    heartbeat = None
    try:
        monitor, heartbeat = _monitor_check(app, call, require_monitor)
        checks.append(monitor)
    except BkError as e:
        checks.append(_failed("monitor", e))
    except OSError as e:
        checks.append(_check("monitor", False, f"{e.filename or 'heartbeat'}: {e.strerror}"))
    checks += [c for c in _run("worker", _worker_check, app, call, require_worker) if c is not None]
    if shared and app.settings["enforce"]:
        checks += _run("enforcer", _enforce_checks, app, call)
    checks += [c for c in _run("notifications", _notify_check, app, call) if c is not None]
    if probe:
        answered = True
        if shared:
            try:
                checks.append(_broker_check(app, call))
            except BkError as e:
                answered = False
                checks.append(_failed("broker", e))
            except OSError as e:
                answered = False
                checks.append(_check("broker", False, f"{e.filename or app.settings['socket']}: {e.strerror}"))
        if answered:
            checks += _run("probe", _probe_checks, app, call)
        else:
            checks.append(_check("probe", False, "atomic replace and locking not tried: the broker, "
                                 "which tries them on a shared server, did not answer"))
    for w in call.warnings:
        if w.startswith(SHARED_RESULT):
            # The broker's shared probe: a real measurement, only not this
            # caller's own; said beside the checks it measured, not a failure.
            for c in checks:
                if c["name"] in ("atomic replace", "locking"):
                    c["detail"] = f"{c['detail']} ({w})"
            continue
        checks.append(_check("ledger_read", False, w))
    for c in checks:
        if c["status"] != OK and not c["fix"]:
            c["fix"] = FIXES.get(c["name"])
        if strict and c["status"] == WARN:
            c["ok"] = False
    failed = [c["name"] for c in checks if not c["ok"]]
    return {"ok": not failed, "strict": strict, "probe": probe, "require_monitor": require_monitor,
            "require_worker": require_worker, "failed": failed,
            "warnings": sum(c["status"] == WARN for c in checks), "monitor": heartbeat, "checks": checks}
