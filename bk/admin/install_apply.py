"""Applying an install plan (``bk.admin.install.plan``), then verifying it.

Facts.  A crash, a full disk or a killed ``sudo`` can stop an install at
any step, and whatever it left must be something ``bk admin uninstall``
removes.  A file written before the manifest records it would be a file
nobody knows about; a manifest entry for a file not yet written is only a
path uninstall finds already gone.

Decision.  Each change is recorded in the manifest first and made second;
entries for paths made before the manifest's own directory exists wait in
memory and are recorded as soon as it does.  The settings (interpreter,
command path, login hook, data directory) are recorded before the first
change, so an interrupted install is rerun with them.  A replaced file's
old content is backed up before it is overwritten; installed files up to
``tracked.SMALL`` are kept too, so drift can be shown as a diff.

Then verify, as the users of the install will see it: the config and the
directories through ``bk.admin.init.verify`` (as every client loads the
config and as the broker checks the directories), and the launcher by
running ``bk --version`` through it.  Only then are the services started
(or restarted, on a reconcile).
"""

from __future__ import annotations

import os

from bk.admin import cmdlink, init, rootenv, services, tracked
from bk.admin import manifest as mf
from bk.admin.install import Plan, Result
from bk.admin.layout import Layout, need_root
from bk.admin.tracked import Action
from bk.core.errors import Busy, ConfigError


def apply(p: Plan, *, euid: int | None = None, runner=None) -> Result:
    """Make the changes ``p`` lists, recording each first; verify; start or restart the services."""
    need_root("bk admin install", euid)
    layout = p.layout
    now = _now_iso()
    m = p.manifest or mf.Manifest(layout.root, p.version, now, now)
    # The settings first: an install interrupted halfway is rerun with them.
    m.options = _recorded_options(p)
    stopped = _stop_for_archive(p, runner)
    applied: list[Action] = []
    pending: list[mf.Entry] = []       # recorded once the manifest's directory exists
    for a in p.actions:
        if not a.changes:
            if a.role == "data" and a.step is not None and m.find(a.path) is None:
                # A data directory already in place (the data an uninstall
                # kept): tracked from now on as it is, so that --purge-data
                # empties it and a plain uninstall keeps it.
                entry = tracked.entry_for(a)
                entry.before = mf.state(a.path)
                pending.append(entry)
            continue
        if a.op == "remove":
            tracked.remove_tracked(m.find(a.path), layout.config_dir)
            m.drop(a.path)
            mf.save(layout.config_dir, m)
            applied.append(a)
            continue
        entry = tracked.entry_for(a)
        if a.op == "replace":
            entry.before = dict(a.before or {}, backup=mf.backup(layout.config_dir, a.path))
        if os.path.isdir(layout.config_dir):
            m.record(entry)
            mf.save(layout.config_dir, m)
        else:
            pending.append(entry)
        if a.op != "adopt":            # an identical file or link: recorded, not touched
            _do(a, p.init_plan.config)
            if a.role == "archive":
                _reread_if_running(a.path)
        if pending and os.path.isdir(layout.config_dir):
            for e in pending:
                m.record(e)
            pending = []
            mf.save(layout.config_dir, m)
        if a.step is not None and a.step.action in ("write", "rewrite"):
            entry.sha256 = mf.sha256_file(a.path)
            m.record(entry)
            mf.save(layout.config_dir, m)
        if a.kind == "file" and a.step is None and a.data is not None and len(a.data) <= tracked.SMALL:
            mf.backup(layout.config_dir, a.path)        # the installed text, for drift diffs
        applied.append(a)
    for e in pending:
        m.record(e)
    m.version = p.version
    m.updated_at = now
    m.options = _recorded_options(p)
    mf.save(layout.config_dir, m)
    os.chmod(mf.manifest_path(layout.config_dir), 0o600)
    init.verify(p.init_plan)
    _verify_launcher(layout)
    ran: list[dict] = []
    notes: list[str] = []
    if p.systemd:
        import subprocess

        ran = services.run(p.service_commands, runner or subprocess.run)
        if stopped and not p.options.start:
            notes.append("the services were stopped for this change (--no-start): start them with "
                         "sudo systemctl start gpubk-broker gpubk-monitor")
        failed = [r for r in ran if r["rc"] != 0]
        if failed:
            notes.append("systemctl failed: " + "; ".join(f"{r['command']}: {r['stderr']}" for r in failed))
    else:
        why = "a staging root" if layout.root != "/" else "systemd is not running here (no /run/systemd/system)"
        notes.append(f"services not started: {why}; where systemd runs, start them with:")
        notes += ["  " + c for c in services.shown(services.start_commands(not p.reconcile, True))]
        notes.append(services.foreground(layout.launcher))
    status = "reconciled" if p.reconcile else "installed"
    if not applied:
        status = "unchanged"
    return Result(p, status, applied, ran, notes)


def _recorded_options(p: Plan) -> dict:
    return {"python": p.python, "command_path": p.command_path, "login_hook": p.hook_wanted,
            "data_dir": p.init_plan.options.data_dir, "socket": p.init_plan.options.socket,
            "service_uid": p.init_plan.service_uid}


def _do(a: Action, doc: dict) -> None:
    if a.step is not None:
        init._apply_step(a.step, doc)
    elif a.op == "mkdir":
        tracked.make_dir(a.path, a.mode)
    elif a.kind == "link":
        cmdlink.make_link(a.path, a.target or "")
    else:
        tracked.write_file(a.path, a.data or b"", a.mode)


def _stop_for_archive(p: Plan, runner) -> bool:
    """A running service must not see its archive replaced: zipimport keeps
    the old file's table of contents and reopens the file by name for every
    lazy import, so the new file's bytes would be read at the old offsets.
    Nor may it go on serving after the access rule changed: the broker reads
    that rule only when it starts.  With systemd the services are stopped
    first (and started again after, unless --no-start); without it, such a
    reconcile refuses while they run."""
    archive = any(a.role == "archive" and a.changes for a in p.actions)
    # A new access rule is read by the broker only when it starts: until
    # then it would serve everyone through a socket it made for all.
    config = any(a.step is not None and a.step.action == "rewrite" for a in p.actions)
    if not p.reconcile or not (archive or config):
        return False
    if p.systemd:
        import subprocess

        services.run(services.stop_commands(), runner or subprocess.run)
        return True
    running = services.running_writers(p.init_plan.options.socket, p.init_plan.options.data_dir)
    if running:
        what = "the archive would change under them" if archive else \
            "the configuration they read at start-up would change (" + "; ".join(
                a.step.why.split(" (", 1)[1].rstrip(")") for a in p.actions
                if a.step is not None and a.step.action == "rewrite") + ")"
        raise Busy(f"the services are running and {what}: " + "; ".join(running),
                   hint="stop them first, then rerun (or use sudo bk update --apply)" if archive
                   else "stop them first, then rerun and start them again")
    return False


def _reread_if_running(path: str) -> None:
    """This process may run from the archive just replaced (``sudo bk update
    NEW.pyz --apply`` run by the installed bk).  zipimport keeps the table of
    contents it read at start-up and reopens the file by name for each
    import: the modules still to import would be read from the new file at
    the old offsets.  ``invalidate_caches`` makes it read the new table
    (zipimporter.invalidate_caches, Python 3.10+)."""
    from bk.admin.pyzfile import running_archive

    running = running_archive()
    if running and os.path.realpath(running) == os.path.realpath(path):
        import importlib

        importlib.invalidate_caches()


def _verify_launcher(layout: Layout) -> None:
    import subprocess

    try:
        proc = subprocess.run([layout.launcher, "--version"], capture_output=True, text=True, timeout=60,
                              check=False, env=rootenv.environment(), cwd=rootenv.CWD)
    except (OSError, subprocess.SubprocessError) as e:
        raise ConfigError(f"the installed {layout.launcher} does not run: {e}",
                          hint="check the interpreter it names (--python)") from None
    if proc.returncode != 0 or not proc.stdout.startswith("bk "):
        raise ConfigError(f"the installed {layout.launcher} does not run: {proc.stderr.strip()[-300:]}",
                          hint="check the interpreter it names (--python)")


def _now_iso() -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
