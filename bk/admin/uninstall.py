"""``bk admin uninstall``: undo exactly what the install manifest lists.

Uninstall removes the manifest's entries newest first and puts back what
was there before each one (from the root-only backups): a replaced file
returns byte for byte, a link that was there before is restored, a
directory that existed before keeps its content.  It refuses while a
service runs (with systemd: while a unit is active, and it disables the
units before removing their files, so no link in ``*.wants/`` dangles),
and on drift: a tracked file changed by hand since the install is shown,
not removed.  The data directory is kept unless ``--purge-data``;
``bk admin services uninstall`` removes only the units.

Order.  The manifest is saved after every removal, so an uninstall stopped
halfway is rerun from where it stopped.  The manifest's own directory and
those above it go last, after the manifest.  The archive this command may
be running from goes after everything else in the manifest: zipimport
reopens the archive by name for every import, so once it is unlinked only
modules already loaded can run.
"""

from __future__ import annotations

import os

from bk.admin import manifest as mf
from bk.admin import services, tracked
from bk.admin.layout import Layout, need_root
from bk.core.errors import Busy, ConfigError
from bk.core.record import dataclass, field
from bk.store.fsutil import Safety, fsync_dir_at, open_dir, replace_file


@dataclass
class Removal:
    op: str           # remove | restore | rmdir | purge | keep | gone
    entry: mf.Entry
    why: str = ""

    def to_json(self) -> dict:
        return {"op": self.op, "path": self.entry.path, "role": self.entry.role, "kind": self.entry.kind,
                "why": self.why}


@dataclass
class UninstallPlan:
    layout: Layout
    manifest: mf.Manifest
    removals: list[Removal]
    purge_data: bool
    only_services: bool
    running: list[str]
    systemd: bool
    kept: list[str] = field(default_factory=list)    # paths bk never removes, said in the plan

    def to_json(self) -> dict:
        return {"root": self.layout.root, "purge_data": self.purge_data, "services_only": self.only_services,
                "steps": [r.to_json() for r in self.removals], "running": self.running,
                "systemd": self.systemd, "kept": self.kept}


SERVICE_ROLES = ("unit",)


def uninstall_plan(root: str, *, purge_data: bool = False, only_services: bool = False,
                   runner=None) -> UninstallPlan:
    """What uninstall would do to each manifest entry; refuses on drift, changes nothing."""
    layout = Layout(os.path.normpath(root))
    m = mf.load(layout.config_dir) if os.path.isdir(layout.config_dir) else None
    if m is None:
        raise ConfigError(f"nothing to uninstall: there is no install manifest {mf.manifest_path(layout.config_dir)}",
                          hint="bk admin uninstall removes only what bk admin install recorded")
    removals: list[Removal] = []
    drifted: list[mf.Entry] = []
    for e in reversed(m.entries):
        if only_services and e.role not in SERVICE_ROLES:
            continue
        now = mf.state(e.path)
        if e.mutable or e.role == "config":
            removals.append(_mutable(e, now, purge_data))
        elif now is None:
            removals.append(Removal("gone", e, "already removed"))
        elif mf.same(now, e.expected()):
            if e.kind == "dir":
                removals.append(Removal("rmdir", e, "if empty") if e.before is None
                                else Removal("keep", e, "was there before"))
            elif e.before is None:
                removals.append(Removal("remove", e))
            elif mf.same(e.before, e.expected()):
                removals.append(Removal("keep", e, "was there before, identical"))
            else:
                removals.append(Removal("restore", e, "put back what was there before"))
        elif e.before is not None and mf.same(now, e.before):
            removals.append(Removal("gone", e, "as it was before"))
        else:
            drifted.append(e)
    if drifted:
        tracked.refuse_drift(drifted, layout.config_dir, "bk admin uninstall")
    socket_path = m.options.get("socket") or layout.socket
    data_dir = m.options.get("data_dir") or layout.p("/var/lib/gpubk")
    systemd = services.systemd_running(layout.root)
    if systemd:
        import subprocess

        running = [f"{u} is active" for u in services.active_units(runner or subprocess.run)]
    else:
        running = services.running_writers(socket_path, data_dir)
    if _enforcing(layout.config):
        # In closed mode the enforcer's programs outlive it: removing bk
        # would leave GPUs closed with nothing left to open them.
        running.append("hard enforcement is on (turn it off first: sudo bk admin enforce off)")
    # What ``bk admin data backup`` made (DATA_DIR-backups) is the
    # administrator's, not the install's: even --purge-data keeps it.
    backups = data_dir.rstrip("/") + "-backups"
    kept = [backups] if purge_data and not only_services and os.path.isdir(backups) else []
    return UninstallPlan(layout, m, removals, purge_data, only_services, running, systemd, kept)


def _enforcing(config_path: str) -> bool:
    import json

    try:
        with open(config_path, "rb") as f:
            doc = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("enforce") is True


def _mutable(e: mf.Entry, now: dict | None, purge: bool) -> Removal:
    if now is None:
        return Removal("gone", e, "already removed")
    if e.role == "data" and not purge:
        return Removal("keep", e, "data kept (add --purge-data to remove it)")
    if e.role == "config":
        if e.before is not None and e.before.get("backup"):
            return Removal("restore", e, "put back the configuration that was there before")
        return Removal("remove", e, "the trusted configuration")
    if e.before is not None:
        return Removal("purge", e, "emptied; its owner and mode put back")
    return Removal("purge", e, "removed with its contents")


def uninstall(up: UninstallPlan, *, euid: int | None = None, runner=None) -> list[Removal]:
    """Carry out ``up`` (refused while a service runs); the removals done."""
    need_root("bk admin uninstall", euid)
    if up.running:
        hint = ("sudo bk admin enforce off; sudo systemctl disable --now gpubk-monitor.service gpubk-broker.service"
                if up.systemd
                else "stop the broker and the monitor first (kill -TERM their pids)")
        # Busy (75): stopping them is all it takes, then the same command succeeds.
        raise Busy("the services are still running: " + "; ".join(up.running) + "; nothing was removed",
                   hint=hint)
    if up.systemd and any(r.entry.role == "unit" and r.op == "remove" for r in up.removals):
        # Stopped is not disabled: enable's links in *.wants/ would dangle
        # once the unit files are gone.
        import subprocess

        services.run([["systemctl", "disable", *services.UNITS, *services.OPTIONAL]], runner or subprocess.run)
    cfg_dir = up.layout.config_dir
    m = up.manifest
    # The manifest's own directory and those above it hold the manifest
    # until the very end: they go last, after it.
    holders = {cfg_dir}
    d = cfg_dir
    while d != os.path.dirname(d):
        d = os.path.dirname(d)
        holders.add(d)
    done: list[Removal] = []
    deferred: list[Removal] = []
    # The archive this very command may be running from goes last: zipimport
    # reopens the archive by name for every import, so after the unlink only
    # modules already loaded can run (the caller loads what it still needs).
    opt = up.layout.opt
    last = [r for r in up.removals if r.entry.path == opt or r.entry.path.startswith(opt + "/")
            or opt.startswith(r.entry.path + "/")]
    for r in [r for r in up.removals if r not in last] + last:
        e = r.entry
        if r.op == "rmdir" and e.path in holders:
            deferred.append(r)
            continue
        if r.op in ("remove", "restore"):
            _remove_or_restore(e, r.op, cfg_dir)
        elif r.op == "rmdir":
            try:
                os.rmdir(e.path)
            except OSError:
                r.why = "kept: not empty"
                continue
        elif r.op == "purge":
            _purge(e)
        else:
            continue
        done.append(r)
        m.drop(e.path)
        mf.save(cfg_dir, m)
    if up.only_services:
        return done
    # Everything the manifest listed is dealt with: the manifest and its
    # backups go, then the directories install made to hold them.
    mf.remove(cfg_dir)
    for r in sorted(deferred, key=lambda r: -len(r.entry.path)):
        try:
            os.rmdir(r.entry.path)
            done.append(r)
        except OSError:
            r.why = "kept: not empty"
    return done


def _remove_or_restore(e: mf.Entry, op: str, cfg_dir: str) -> None:
    if op == "restore" and e.kind == "file":
        b = e.before or {}
        data = mf.backup_bytes(cfg_dir, b.get("backup") or "")
        directory, name = os.path.split(e.path)
        fd = open_dir(directory, Safety(0))
        try:
            replace_file(fd, name, directory, data, int(b["mode"], 8), owner=(b["uid"], b["gid"]))
        finally:
            os.close(fd)
        return
    if op == "restore" and e.kind == "link" and e.before and e.before.get("kind") == "link":
        os.unlink(e.path)
        os.symlink(e.before["target"], e.path)
        return
    os.unlink(e.path)
    fsync_dir_at(os.path.dirname(e.path))


def _purge(e: mf.Entry) -> None:
    import shutil

    if e.before is not None and e.before.get("kind") == "dir":
        for name in os.listdir(e.path):
            full = os.path.join(e.path, name)
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)
        b = e.before
        os.chown(e.path, b["uid"], b["gid"], follow_symlinks=False)
        os.chmod(e.path, int(b["mode"], 8))
    else:
        shutil.rmtree(e.path)
