"""What this installation is and whether it is healthy: ``bk info``,
``bk config`` and ``bk doctor``, as data for every front end.

Everything here only reads.  ``doctor`` runs each check on its own and turns
any ``BkError`` into a failed check, so one broken part (an unreadable
ledger, an untrusted config) never hides the verdict on the others.  The
checks that write or talk to the broker (atomic replace, locking, the broker
round trip) run only with ``bk doctor --probe``.
"""

from __future__ import annotations

from bk import clock
from bk.core.errors import BkError
from bk.service.status import policy_summary


def _check(name: str, ok: bool, detail: str) -> dict:
    return {"name": name, "ok": bool(ok), "detail": detail}


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


def info_view(app, *, call=None) -> dict:
    s = app.settings
    call = call or app.call()
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
    }


# --------------------------------------------------------------- config

def config_view(app, *, call=None) -> dict:
    """Every key with its effective value and where it came from."""
    from bk.store.config import KEYS

    s = app.settings
    call = call or app.call()
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

def _config_check(app, call) -> dict:
    s = app.settings
    if s.mode == "private":
        where = s.source or "defaults (no config file)"
        return _check("config", True, f"private mode; settings from {where}")
    from bk.store.config import check_trusted

    path = s.locations.config_file
    check_trusted(path)
    return _check("config", True, f"shared mode; {path} is root-owned and not writable by others")


def _ledger_checks(app, call) -> list[dict]:
    store = app.store
    checks = [_check(name, ok, detail) for name, ok, detail in store.check()]
    for c in checks:
        if c["name"] == "data directory" and c["ok"]:
            problem = _unwritable(app, store.paths.data_dir)
            if problem:
                c.update(ok=False, detail=c["detail"] + "; " + problem)
    return checks


def _unwritable(app, data_dir: str) -> str | None:
    """Why the next write into ``data_dir`` would fail although the
    directory looks right: its file system is mounted read-only (statvfs's
    ST_RDONLY, for the directory or, before the first write, its nearest
    existing parent), or, where this user is the writer (private mode), the
    directory is not writable by them.  Only ``--probe`` writes; this is
    the read-only way to see the same thing."""
    import os

    from bk.store.fsutil import mount_point

    where = data_dir
    while not os.path.exists(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    try:
        if os.statvfs(where).f_flag & os.ST_RDONLY:
            mount = mount_point(where)
            return (f"read-only file system: {mount} is mounted read-only; remount it "
                    f"read-write (mount -o remount,rw {mount}) or point BK_DATA_DIR at a "
                    "writable directory")
    except OSError as e:
        return f"cannot inspect {where}: {e.strerror}"
    if app.settings.mode == "private" and not os.access(where, os.W_OK | os.X_OK):
        return f"{where} is not writable by you (ls -ld {where})"
    return None


def _policy_check(app, call) -> dict:
    """The store's own rule (``bk.core.policy``): what fails here is what
    the next booking would refuse, and nothing else."""
    from bk.core.policy import policy_diff

    state = app.ledger(call=call)
    if state.policy is None:
        return _check("policy", True, "not bound yet; the first booking records it")
    diff = policy_diff(state.policy, call.policy.bound())
    if diff.conflicts:
        return _check("policy", False, "configuration disagrees with the ledger's policy: " + diff.describe())
    detail = "configuration agrees with the policy bound in the ledger"
    if diff.additions:
        detail += f"; the ledger lacks {diff.describe_additions()}, which the next write adds"
    return _check("policy", True, detail)


def _gpu_check(app, call) -> dict:
    snap, inv = call.telemetry.snapshot(), call.telemetry.inventory()
    gpus = snap.gpus
    detail = f"{snap.source}: {len(gpus)} GPU{'s' if len(gpus) != 1 else ''}"
    reason = inv.reason
    if reason:
        detail += f" ({reason})"
    # On a shared server a simulation standing in for missing telemetry is a
    # fault unless the administrator fixed the count in the config (then only
    # the live data is missing, and placement uses share slots alone); in
    # private mode (BK_GPU_COUNT, a demo) it is what was asked for.
    ok = True
    if reason and app.settings.mode == "shared":
        if "gpu_count" in app.settings.explicit:
            detail += (f"; no GPU telemetry, so {call.policy.gpu_count} GPUs from the "
                       "configuration are scheduled by share slots alone")
        else:
            ok = False
            detail += "; set gpu_count in the configuration (sudo bk admin init --gpu-count N)"
    if call.policy.gpu_count != len(gpus):
        ok = False
        detail += f"; the policy schedules {call.policy.gpu_count}"
    return _check("gpu_backend", ok, detail)


CHECKS = (("config", _config_check), ("ledger", _ledger_checks),
          ("policy", _policy_check), ("gpu_backend", _gpu_check))


def _broker_check(app, call) -> dict:
    """The broker answers, runs as the service account, and sees us as who we are."""
    import os

    from bk import __version__

    got = app.ping(call=call)
    broker, peer = got.get("broker", {}), got.get("peer", {})
    problems = []
    if broker.get("uid") != app.settings["service_uid"]:
        problems.append(f"it runs as uid {broker.get('uid')}, not the service account "
                        f"{app.settings['service_uid']}")
    if peer.get("uid") != os.getuid():
        problems.append(f"it sees you as uid {peer.get('uid')}, but you are uid {os.getuid()}")
    if broker.get("version") != __version__:
        problems.append(f"it runs bk {broker.get('version')}, this is bk {__version__} "
                        "(restart it after an upgrade)")
    detail = (f"{app.settings['socket']}: bk {broker.get('version')}, pid {broker.get('pid')}, "
              f"uid {broker.get('uid')}; it knows you as {peer.get('user')} (uid {peer.get('uid')})")
    return _check("broker", not problems, "; ".join([detail, *problems]))


def _probe_checks(app, call) -> list[dict]:
    checks = []
    if app.settings.mode == "shared":
        checks.append(_broker_check(app, call))
    return checks + [_check(n, ok, d) for n, ok, d in app.probe(call=call)]


def doctor(app, probe: bool = False, *, call=None) -> dict:
    """Run every read-only check, and with ``probe`` the ones that write
    (atomic replace and locking in the data directory, done by the broker on
    a shared server) -> ``{"ok": bool, "checks": [{name, ok, detail}]}``."""
    call = call or app.call()
    checks: list[dict] = []
    for name, fn in CHECKS + ((("probe", _probe_checks),) if probe else ()):
        try:
            got = fn(app, call)
        except BkError as e:
            got = _check(name, False, e.message + (f" ({e.hint})" if e.hint else ""))
        except OSError as e:
            got = _check(name, False, f"{e.filename or name}: {e.strerror}")
        checks.extend(got if isinstance(got, list) else [got])
    for w in call.warnings:
        checks.append(_check("ledger_read", False, w))
    return {"ok": all(c["ok"] for c in checks), "checks": checks}
