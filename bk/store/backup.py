"""Backups of the data directory: copy, verify, clear, restore.

A backup is a directory: a copy of every file the data directory holds (the
ledger, its rotated backups, the archive, the audit log and its sealed
segments, usage history, the monitor's files) under the same relative
names, plus ``manifest.json``: the bk version, when, from where, and per
file its size, mode and SHA-256.

The facts that decide the design.  The ledger and the audit log change
together under the writers' lock (``ledger.lock``); a copy taken while a
writer commits could hold a ledger one commit ahead of its audit log, which
the store would then call lost commits.  So the copy is made holding that
lock (writers wait, readers go on).  Files are read through descriptors
opened with ``O_NOFOLLOW``, and a link anywhere is refused, not followed:
root runs this, in a directory the service account owns.  Every copy is
written to a temp name, fsync-ed and renamed; the manifest is written last,
so a backup without a manifest is an interrupted one and ``verify`` says so.

``restore`` writes only into an empty data directory (never over data),
verifies the backup first, and gives every file and directory the data
directory's owner, with the modes the manifest recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat

from bk.core.errors import Busy, ConfigError, InvalidInput, IOFailure
from bk.core.record import dataclass
from bk.store.fsutil import O_NOFOLLOW, Safety, fsync_dir_at, io_error, open_dir, replace_file
from bk.store.lock import FileLock

MANIFEST = "manifest.json"
FORMAT = "gpubk.backup"
VERSION = 1
LOCK = "ledger.lock"
SKIP = (LOCK,)                    # the lock file carries no data
CHUNK = 1 << 20


@dataclass(frozen=True)
class Entry:
    path: str          # relative, with "/"
    size: int
    mode: int
    sha256: str

    def to_json(self) -> dict:
        return {"path": self.path, "size": self.size, "mode": f"{self.mode:04o}", "sha256": self.sha256}


@dataclass(frozen=True)
class Problem:
    path: str
    why: str           # missing | changed | unlisted | not a file | size

    def to_json(self) -> dict:
        return {"path": self.path, "problem": self.why}


def _walk(root: str) -> list[str]:
    """Relative paths of the regular files below ``root``, sorted; a link
    or anything else that is not a file or a directory is refused."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for d in list(dirnames):
            if os.path.islink(os.path.join(dirpath, d)):
                raise IOFailure(f"{os.path.join(dirpath, d)} is a symbolic link; refusing to follow it",
                                hint="move it aside and run again")
        for name in filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
                raise IOFailure(f"{full} is not a regular file; refusing to copy it",
                                hint="move it aside and run again")
            if rel not in SKIP and not name.startswith("."):
                out.append(rel)
    return sorted(out)


def _read(path: str) -> tuple[bytes, int]:
    fd = os.open(path, os.O_RDONLY | O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        chunks = []
        while True:
            b = os.read(fd, CHUNK)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks), stat.S_IMODE(st.st_mode)
    finally:
        os.close(fd)


def _write(root: str, rel: str, data: bytes, mode: int, owner: tuple[int, int] | None) -> None:
    directory = os.path.join(root, *rel.split("/")[:-1])
    _makedirs(root, directory, owner)
    dirfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | O_NOFOLLOW | os.O_CLOEXEC)
    try:
        replace_file(dirfd, rel.split("/")[-1], directory, data, mode, owner=owner)
    finally:
        os.close(dirfd)


def _makedirs(root: str, directory: str, owner: tuple[int, int] | None, mode: int = 0o700) -> None:
    rel = os.path.relpath(directory, root)
    cur = root
    for part in ([] if rel == "." else rel.split(os.sep)):
        cur = os.path.join(cur, part)
        try:
            os.mkdir(cur, mode)
            if owner is not None:
                os.chown(cur, *owner)
        except FileExistsError:
            if os.path.islink(cur) or not os.path.isdir(cur):
                raise IOFailure(f"{cur} is not a directory", hint="move it aside") from None


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _empty_or_new(path: str, what: str) -> None:
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise InvalidInput(f"{what} {path} is not a directory") from None
    if names:
        raise InvalidInput(f"{what} {path} is not empty", hint="name a new or empty directory")


def lock_state(data_dir: str, owner_uid: int) -> tuple[str, int | None]:
    """("free" | "held" | "missing", pid) for the writers' lock."""
    from bk.store.lock import probe

    dirfd = open_dir(data_dir, Safety(owner_uid))
    if dirfd is None:
        return "missing", None
    try:
        return probe(dirfd, LOCK, os.path.join(data_dir, LOCK), Safety(owner_uid))
    finally:
        os.close(dirfd)


def held_locks(data_dir: str) -> list[tuple[str, int | None]]:
    """Every ``*.lock`` below the data directory that a process holds now
    (the ledger's writers, the monitor's single-instance lock): a live
    writer, whose files must not be cleared or replaced under it."""
    import fcntl

    found = []
    for dirpath, _dirs, files in os.walk(data_dir):
        for name in files:
            if not name.endswith(".lock"):
                continue
            path = os.path.join(dirpath, name)
            try:
                fd = os.open(path, os.O_RDONLY | O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
            except BlockingIOError:
                from bk.store.lock import holder as holder_pid

                try:
                    pid = holder_pid(fd)
                except Exception:      # noqa: BLE001  (the pid is a courtesy)
                    pid = None
                found.append((path, pid))
            finally:
                os.close(fd)
    return found


def backup(data_dir: str, dest: str, *, owner_uid: int, bk_version: str, now_iso: str,
           lock_timeout: float = 10.0) -> list[Entry]:
    """Copy the data directory to ``dest`` (new or empty, made 0700) under
    the writers' lock; the manifest last.  Returns the entries."""
    if not os.path.isdir(data_dir):
        raise InvalidInput(f"there is no data directory {data_dir} to back up")
    dest = os.path.abspath(dest)
    if os.path.commonpath([dest, os.path.abspath(data_dir)]) == os.path.abspath(data_dir):
        raise InvalidInput("the backup may not lie inside the data directory", hint="name a directory outside it")
    _empty_or_new(dest, "backup directory")
    os.makedirs(dest, mode=0o700, exist_ok=True)
    os.chmod(dest, 0o700)
    safety = Safety(owner_uid)
    dirfd = open_dir(data_dir, safety)
    if dirfd is None:
        raise InvalidInput(f"there is no data directory {data_dir} to back up")
    entries = []
    try:
        # Only an existing lock is taken: one created here would be root's,
        # and the service account's next commit would refuse it.  No lock
        # file means no writer has ever committed.
        from contextlib import nullcontext

        lock = FileLock(dirfd, LOCK, os.path.join(data_dir, LOCK), safety, mode=0o600, timeout=lock_timeout,
                        what="the ledger") if os.path.exists(os.path.join(data_dir, LOCK)) else nullcontext()
        with lock:
            for rel in _walk(data_dir):
                try:
                    data, mode = _read(os.path.join(data_dir, *rel.split("/")))
                except FileNotFoundError:
                    continue          # a monitor file replaced meanwhile
                except OSError as e:
                    raise io_error(e, "reading", os.path.join(data_dir, rel)) from None
                _write(dest, rel, data, 0o600, None)
                entries.append(Entry(rel, len(data), mode, _digest(data)))
    finally:
        os.close(dirfd)
    st = os.stat(data_dir)
    manifest = {"format": FORMAT, "version": VERSION, "bk_version": bk_version, "created": now_iso,
                "source": os.path.abspath(data_dir), "data_dir_mode": f"{stat.S_IMODE(st.st_mode):04o}",
                "files": [e.to_json() for e in entries]}
    _write(dest, MANIFEST, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode(), 0o600, None)
    fsync_dir_at(dest)
    return entries


def read_manifest(src: str) -> dict:
    path = os.path.join(src, MANIFEST)
    try:
        data, _mode = _read(path)
    except FileNotFoundError:
        raise InvalidInput(f"{src} has no {MANIFEST}: not a bk backup, or an interrupted one") from None
    except OSError as e:
        raise io_error(e, "reading", path) from None
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise InvalidInput(f"{path} is not valid JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("files"), list):
        raise InvalidInput(f"{path} is not a bk backup manifest")
    if isinstance(doc.get("version"), int) and doc["version"] > VERSION:
        raise ConfigError(f"{src} was written by a newer bk (backup format {doc['version']})",
                          hint="restore it with that bk")
    return doc


def verify(src: str) -> tuple[dict, list[Entry], list[Problem]]:
    """Check every file of a backup against its manifest."""
    doc = read_manifest(src)
    entries, problems = [], []
    listed = set()
    for f in doc["files"]:
        try:
            e = Entry(str(f["path"]), int(f["size"]), int(str(f["mode"]), 8), str(f["sha256"]))
        except (KeyError, TypeError, ValueError):
            raise InvalidInput(f"{src}/{MANIFEST} has a malformed entry: {str(f)[:80]}") from None
        if e.path.startswith("/") or ".." in e.path.split("/"):
            raise InvalidInput(f"{src}/{MANIFEST} names a path outside the backup: {e.path[:80]}")
        entries.append(e)
        listed.add(e.path)
        full = os.path.join(src, *e.path.split("/"))
        try:
            data, _mode = _read(full)
        except FileNotFoundError:
            problems.append(Problem(e.path, "missing"))
            continue
        except OSError:
            problems.append(Problem(e.path, "not a file"))
            continue
        if len(data) != e.size or _digest(data) != e.sha256:
            problems.append(Problem(e.path, "changed"))
    for rel in _walk(src):
        if rel != MANIFEST and rel not in listed:
            problems.append(Problem(rel, "unlisted"))
    return doc, entries, problems


def clear(data_dir: str) -> list[str]:
    """Remove everything inside the data directory (not the directory)."""
    removed = []
    for name in sorted(os.listdir(data_dir)):
        full = os.path.join(data_dir, name)
        if os.path.isdir(full) and not os.path.islink(full):
            import shutil

            shutil.rmtree(full)
        else:
            os.unlink(full)
        removed.append(name)
    fsync_dir_at(data_dir)
    return removed


def restore(src: str, data_dir: str, entries: list[Entry], *, owner: tuple[int, int],
            dir_mode: int) -> None:
    """Copy verified ``entries`` into the empty ``data_dir``, owned by ``owner``."""
    _empty_or_new(data_dir, "data directory")
    if not os.path.isdir(data_dir):
        os.mkdir(data_dir, dir_mode)
    os.chown(data_dir, *owner)
    os.chmod(data_dir, dir_mode)
    for e in entries:
        data, _mode = _read(os.path.join(src, *e.path.split("/")))
        if _digest(data) != e.sha256:
            raise IOFailure(f"{e.path} changed while it was restored", hint="verify the backup again")
        parent = os.path.join(data_dir, *e.path.split("/")[:-1])
        _makedirs(data_dir, parent, owner, dir_mode)
        _write(data_dir, e.path, data, e.mode & 0o777, owner)
    fsync_dir_at(data_dir)


def guard_stopped(data_dir: str, socket_path: str | None) -> None:
    """Refuse (``Busy``, exit 75) while a service runs: the broker answers
    on its socket, or a process holds one of the writers' locks."""
    import socket as _socket

    if socket_path and os.path.exists(socket_path):
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        s.settimeout(1.0)
        try:
            s.connect(socket_path)
            alive = True
        except OSError:
            alive = False
        finally:
            s.close()
        if alive:
            raise Busy(f"the broker is running (it answers on {socket_path})",
                       hint="stop the services first: sudo systemctl stop gpubk-broker gpubk-monitor")
    held = held_locks(data_dir) if os.path.isdir(data_dir) else []
    if held:
        path, pid = held[0]
        raise Busy(f"{path} is held by {f'process {pid}' if pid else 'a running process'}: a service is writing",
                   hint="stop the services first: sudo systemctl stop gpubk-broker gpubk-monitor",
                   details={"locks": [p for p, _ in held]})
