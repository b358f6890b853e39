"""The install manifest: what ``bk admin install`` created or changed, and
what was there before, so ``bk admin uninstall`` can put the machine back.

Where.  ``<root>/etc/gpubk/install-manifest.json``, root:root 0600 (it names
backups of files that may not be everyone's to read), with the backups
beside it in ``install-backup/``, one file per content, named by its
sha256 (the same content backed up twice is one file).

What an entry says.  ``path`` (the real path, staging root included),
``kind`` (file, link, dir), ``role`` (archive, launcher, unit, man, ...),
the owner, mode and sha256 (or link target) that install left there, and
``before``: None when nothing was there, else the state it found (for a
replaced file, the backup's name).  ``mutable`` entries (the config, the
data and socket directories) are the administrator's to change: uninstall
removes them whatever they hold now; every other entry must still be as
install left it, or uninstall refuses (drift) and shows the difference.

Commit protocol.  The manifest is written with ``replace_file`` (temporary
file, fsync, rename, fsync of the directory), the one atomic-replace helper
of the store.  Install records an entry *before* it makes the change: after
a crash between the two, the path is still in its ``before`` state, which
uninstall recognises and leaves alone, and a rerun of install continues.
A change made and not recorded cannot happen, so nothing is left behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat

from bk.core.errors import ConfigError
from bk.core.record import dataclass, field
from bk.store.fsutil import Safety, open_dir, replace_file

FORMAT = "gpubk-install-manifest/1"
NAME = "install-manifest.json"
BACKUPS = "install-backup"
MAX_BYTES = 16 << 20


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def state(path: str) -> dict | None:
    """What is at ``path`` now (links not followed), or None."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    base = {"uid": st.st_uid, "gid": st.st_gid, "mode": f"{stat.S_IMODE(st.st_mode):04o}"}
    if stat.S_ISLNK(st.st_mode):
        return {"kind": "link", "target": os.readlink(path)}
    if stat.S_ISDIR(st.st_mode):
        return {"kind": "dir", **base}
    if stat.S_ISREG(st.st_mode):
        return {"kind": "file", "sha256": sha256_file(path), **base}
    return {"kind": "other", **base}


@dataclass
class Entry:
    path: str
    kind: str                  # file | link | dir
    role: str
    uid: int = 0
    gid: int = 0
    mode: str = "0644"
    sha256: str | None = None
    target: str | None = None
    before: dict | None = None
    mutable: bool = False

    def expected(self) -> dict:
        if self.kind == "link":
            return {"kind": "link", "target": self.target}
        out = {"kind": self.kind, "uid": self.uid, "gid": self.gid, "mode": self.mode}
        if self.kind == "file":
            out["sha256"] = self.sha256
        return out

    def to_json(self) -> dict:
        return {"path": self.path, "kind": self.kind, "role": self.role, "uid": self.uid, "gid": self.gid,
                "mode": self.mode, "sha256": self.sha256, "target": self.target, "before": self.before,
                "mutable": self.mutable}

    @classmethod
    def from_json(cls, d: dict) -> Entry:
        return cls(path=str(d["path"]), kind=str(d["kind"]), role=str(d.get("role", "")),
                   uid=int(d.get("uid", 0)), gid=int(d.get("gid", 0)), mode=str(d.get("mode", "0644")),
                   sha256=d.get("sha256"), target=d.get("target"), before=d.get("before"),
                   mutable=bool(d.get("mutable", False)))


def same(now: dict | None, want: dict | None) -> bool:
    """Whether a path's state matches a recorded one (owner and mode included)."""
    if now is None or want is None:
        return now is want
    return all(now.get(k) == v for k, v in want.items() if k != "backup")


@dataclass
class Manifest:
    root: str
    version: str
    installed_at: str
    updated_at: str
    options: dict = field(default_factory=dict)
    entries: list[Entry] = field(default_factory=list)

    def find(self, path: str) -> Entry | None:
        return next((e for e in self.entries if e.path == path), None)

    def record(self, entry: Entry) -> None:
        """Add or replace the entry for its path; a replaced entry keeps its ``before``."""
        old = self.find(entry.path)
        if old is not None:
            entry.before = old.before
            self.entries[self.entries.index(old)] = entry
        else:
            self.entries.append(entry)

    def drop(self, path: str) -> None:
        self.entries = [e for e in self.entries if e.path != path]

    def to_json(self) -> dict:
        return {"format": FORMAT, "root": self.root, "version": self.version,
                "installed_at": self.installed_at, "updated_at": self.updated_at,
                "options": self.options, "entries": [e.to_json() for e in self.entries]}


def manifest_path(config_dir: str) -> str:
    return os.path.join(config_dir, NAME)


def load(config_dir: str) -> Manifest | None:
    """The manifest, or None when there is none; a damaged one is an error, never ignored."""
    path = manifest_path(config_dir)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except PermissionError:
        raise ConfigError(f"cannot read the install manifest {path}: it is root's",
                          hint="run it with sudo") from None
    try:
        doc = json.loads(raw)
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format')!r}")
        return Manifest(root=doc["root"], version=doc.get("version", ""),
                        installed_at=doc.get("installed_at", ""), updated_at=doc.get("updated_at", ""),
                        options=dict(doc.get("options") or {}),
                        entries=[Entry.from_json(e) for e in doc["entries"]])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"the install manifest {path} is damaged ({e}); not guessing what was installed",
                          hint="restore it from a backup, or remove the installed files by hand "
                               "(bk-admin(8), FILES)") from None


def save(config_dir: str, m: Manifest) -> None:
    data = (json.dumps(m.to_json(), indent=2, sort_keys=True) + "\n").encode()
    fd = open_dir(config_dir, Safety(0))
    if fd is None:
        raise ConfigError(f"{config_dir} disappeared during the install", hint="inspect it and rerun")
    try:
        replace_file(fd, NAME, config_dir, data, 0o600, owner=(0, 0))
    finally:
        os.close(fd)


def remove(config_dir: str) -> None:
    """The manifest and its backups, the last thing uninstall removes."""
    import shutil

    shutil.rmtree(os.path.join(config_dir, BACKUPS), ignore_errors=True)
    try:
        os.unlink(manifest_path(config_dir))
    except FileNotFoundError:
        pass


def backup(config_dir: str, path: str) -> str:
    """Keep a copy of the file at ``path`` (about to be replaced); returns its name."""
    with open(path, "rb") as f:
        data = f.read()
    name = sha256_bytes(data)
    top = os.path.join(config_dir, BACKUPS)
    if not os.path.isdir(top):
        os.mkdir(top, 0o700)
        os.chown(top, 0, 0)
    fd = open_dir(top, Safety(0))
    try:
        replace_file(fd, name, top, data, 0o600, owner=(0, 0))
    finally:
        os.close(fd)
    return name


def backup_bytes(config_dir: str, name: str) -> bytes:
    path = os.path.join(config_dir, BACKUPS, os.path.basename(name))
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ConfigError(f"the backup {path} is missing; cannot restore what was there before",
                          hint="restore it from a system backup, then rerun") from None
    if sha256_bytes(data) != name:
        raise ConfigError(f"the backup {path} does not match its checksum", hint="restore it from a system backup")
    return data
