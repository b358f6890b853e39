"""The paths an install owns, as its manifest records them: what each one
needs, noticing a hand edit (drift), and changing one safely.

The rules.  A path the manifest lists that still matches what install left
there is refreshed freely; one changed by hand since is never overwritten
or removed: the plan is refused, showing the difference (``drift_text``).
A path the manifest does not list is created when absent, adopted when it
is already identical, or replaced with its old content backed up
(root-only) so that uninstall can put it back.  Missing parent directories
are created root-owned 0755, and the existing ones above them must be
root's alone, as ``bk admin init`` checks its own.

Install, update and the login hook all decide through ``file_action``;
``bk.admin.install_apply`` records ``entry_for`` an action in the manifest
*before* making the change, so an interrupted install leaves nothing that
uninstall does not know about.  Writes go through ``bk.store.fsutil``'s one
atomic replace (temp file, fsync, rename, fsync the directory), owned by
root from the first byte.
"""

from __future__ import annotations

import difflib
import os

from bk.admin import init
from bk.admin import manifest as mf
from bk.core.errors import ConfigError
from bk.core.record import dataclass
from bk.core.timegrid import counted
from bk.store.fsutil import Safety, fsync_dir_at, open_dir, replace_file

SMALL = 256 << 10          # installed files up to this size are kept for drift diffs


@dataclass
class Action:
    """One change (or a note that a path is already right)."""

    op: str          # create | update | replace | adopt | keep | skip | mkdir | link | init
    path: str
    role: str
    why: str = ""
    kind: str = "file"
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    target: str | None = None
    data: bytes | None = None
    before: dict | None = None
    step: object = None              # an init.Step for op "init"

    def to_json(self) -> dict:
        out = {"op": self.op, "path": self.path, "role": self.role, "kind": self.kind,
               "mode": f"{self.mode:04o}", "uid": self.uid, "gid": self.gid, "why": self.why}
        if self.target is not None:
            out["target"] = self.target
        if self.data is not None:
            out["sha256"] = mf.sha256_bytes(self.data)
        if self.step is not None:
            out["op"] = self.step.action
        return out

    @property
    def changes(self) -> bool:
        return self.op not in ("keep", "skip") and not (self.step is not None and self.step.action == "keep")


def parents(path: str, done: set[str]) -> list[Action]:
    """mkdir actions for the missing directories above ``path``, top first;
    the existing ones must be safe (root-owned, not writable by others)."""
    missing = []
    d = os.path.dirname(path)
    while not os.path.lexists(d) and d not in done:
        missing.append(d)
        d = os.path.dirname(d)
    if d not in done:
        init._check_ancestors(os.path.join(d, "x"), (0,))
    out = []
    for d in reversed(missing):
        done.add(d)
        out.append(Action("mkdir", d, "parent", kind="dir", mode=0o755))
    return out


def drift_text(entry: mf.Entry, config_dir: str) -> str:
    """How a tracked path differs from what install left there."""
    now = mf.state(entry.path)
    if now is None:
        return f"{entry.path}: removed since it was installed"
    if now.get("kind") != entry.kind:
        return f"{entry.path}: was a {entry.kind}, now a {now.get('kind')}"
    if entry.kind == "link":
        return f"{entry.path}: points to {now.get('target')}, installed pointing to {entry.target}"
    lines = []
    if entry.kind == "file" and now.get("sha256") != entry.sha256:
        try:
            old = mf.backup_bytes(config_dir, entry.sha256 or "")
            with open(entry.path, "rb") as f:
                new = f.read()
            diff = difflib.unified_diff(old.decode(errors="replace").splitlines(),
                                        new.decode(errors="replace").splitlines(),
                                        f"{entry.path} (installed)", f"{entry.path} (now)", lineterm="", n=1)
            lines += list(diff)[:60]
        except ConfigError:
            lines.append(f"{entry.path}: content changed (sha256 {now.get('sha256', '')[:12]}, installed "
                         f"{(entry.sha256 or '')[:12]})")
    for key in ("uid", "gid", "mode"):
        if now.get(key) != getattr(entry, key):
            lines.append(f"{entry.path}: {key} {now.get(key)}, installed {getattr(entry, key)}")
    return "\n".join(lines) or f"{entry.path}: changed"


def refuse_drift(drifted: list[mf.Entry], config_dir: str, doing: str) -> None:
    """Raise the ConfigError that shows each hand edit; ``doing`` names the command."""
    text = "\n".join(drift_text(e, config_dir) for e in drifted)
    hint = "put the installed version back (or move the file away), then rerun"
    # A drop-in is how a unit is changed for good; it is no answer for the
    # login hook, the launcher or a man page, so it is named only for units.
    units = sorted((e.role == "user-unit", os.path.basename(e.path)) for e in drifted
                   if e.role in ("unit", "user-unit"))
    if units:
        user, name = units[0]
        hint += (f"; to change a unit for good, use a drop-in: sudo systemctl {'--global ' if user else ''}"
                 f"edit {name}")
    raise ConfigError(f"{counted(len(drifted), 'installed file')} {'was' if len(drifted) == 1 else 'were'} changed by "
                      f"hand since the install; {doing} refuses to overwrite or remove "
                      f"{'them' if len(drifted) != 1 else 'it'}:\n{text}",
                      hint=hint, details={"drift": [e.path for e in drifted]})


def file_action(path: str, data: bytes, mode: int, role: str, m: mf.Manifest | None,
                drifted: list[mf.Entry]) -> Action:
    """What the file ``path`` needs to hold ``data`` (root-owned, ``mode``);
    a tracked one changed by hand is appended to ``drifted`` instead."""
    now = mf.state(path)
    entry = m.find(path) if m else None
    want = {"kind": "file", "sha256": mf.sha256_bytes(data), "uid": 0, "gid": 0, "mode": f"{mode:04o}"}
    if entry is not None:
        if now is None:
            return Action("create", path, role, "installed file was missing", data=data, mode=mode)
        if not mf.same(now, entry.expected()):
            drifted.append(entry)
            return Action("keep", path, role, "changed by hand", mode=mode)
        if mf.same(now, want):
            return Action("keep", path, role, "up to date", mode=mode)
        return Action("update", path, role, "refresh", data=data, mode=mode)
    if now is None:
        return Action("create", path, role, data=data, mode=mode)
    if mf.same(now, want):
        return Action("adopt", path, role, "already there, identical; kept after uninstall", data=data, mode=mode,
                      before=now)
    if now["kind"] != "file":
        raise ConfigError(f"{path} exists and is a {now['kind']}, not a file; not replacing it",
                          hint="move it away, then rerun")
    return Action("replace", path, role, "an older file is backed up in the manifest and restored by "
                  "uninstall", data=data, mode=mode, before=now)


def entry_for(a: Action) -> mf.Entry:
    """The manifest entry that records ``a`` as done (made before ``a`` is)."""
    if a.kind == "link":
        return mf.Entry(a.path, "link", a.role, target=a.target, before=a.before)
    if a.step is not None:
        s = a.step
        before = mf.state(s.path) if s.action in ("adopt", "chmod", "write", "rewrite") else None
        if s.action in ("write", "rewrite"):
            return mf.Entry(s.path, "file", "config", s.uid, s.gid, f"{s.mode:04o}",
                            sha256=None, before=before, mutable=True)
        return mf.Entry(s.path, "dir", a.role, s.uid, s.gid, f"{s.mode:04o}", before=before,
                        mutable=a.role in ("data", "runtime"))
    if a.kind == "dir":
        return mf.Entry(a.path, "dir", a.role, 0, 0, f"{a.mode:04o}")
    return mf.Entry(a.path, "file", a.role, 0, 0, f"{a.mode:04o}",
                    sha256=mf.sha256_bytes(a.data or b""), before=a.before)


def make_dir(path: str, mode: int) -> None:
    # 0700 until it is root's: nobody can slip a file in between mkdir and chown.
    os.mkdir(path, 0o700)
    os.chown(path, 0, 0, follow_symlinks=False)
    os.chmod(path, mode)
    fsync_dir_at(os.path.dirname(path))


def write_file(path: str, data: bytes, mode: int) -> None:
    """Replace ``path`` atomically with ``data``, root-owned, ``mode``."""
    directory, name = os.path.split(path)
    fd = open_dir(directory, Safety(0))
    if fd is None:
        raise ConfigError(f"{directory} disappeared during the install", hint="inspect it and rerun")
    try:
        replace_file(fd, name, directory, data, mode, owner=(0, 0))
    finally:
        os.close(fd)


def remove_tracked(e: mf.Entry | None, cfg_dir: str) -> None:
    """Undo one tracked file that install no longer writes: put back what was
    there before it (from the backup), or remove it if nothing was."""
    if e is None or mf.state(e.path) is None:
        return
    if e.before and e.before.get("backup"):
        data = mf.backup_bytes(cfg_dir, e.before["backup"])
        write_file(e.path, data, int(e.before["mode"], 8))
    elif not e.before:
        os.unlink(e.path)
