"""Backups of the data directory: copy, verify, clear, restore.

A backup is a directory: a copy of every file bk keeps in the data
directory (the ledger, its rotated backups, the archive, the audit log and
its sealed segments, usage history, the monitor's files, the node id; in a
trial data directory the private state too) under the same relative names,
plus ``manifest.json``: the bk version, when, from where, and per file its
size, its mode at the source and its SHA-256.

The facts that decide the design.

* The ledger and the audit log change together under the writers' lock
  (``ledger.lock``); a copy taken while a writer commits could hold a
  ledger one commit ahead of its audit log, which the store would then call
  lost commits.  So the copy is made holding that lock (writers wait,
  readers go on).
* Root makes, checks and restores backups, and a checksum proves nothing
  about a directory someone else can write: its owner can replace the
  ledger and the manifest together, and every checksum matches.  Whoever
  can change a directory can rename what is in it, so this holds for every
  directory above the backup too.  So ``backup`` creates the backup
  directory itself (an existing one only when it is root's, 0700 and
  empty), below directories only root can change, and ``verify`` and
  ``restore`` refuse (``ConfigError``, exit 78) a backup with any directory
  or file not owned by root or writable by group or others, or below a
  directory others can change.
* A path is looked up again at every use, and a directory renamed or a
  link planted between two uses redirects the second.  So everything below
  the backup directory is created, opened and read relative to descriptors
  of its directories (``mkdir``/``open`` with ``dir_fd``, ``O_NOFOLLOW``),
  opened once; the same for the data directory.  A link anywhere is
  refused, never followed.
* What a manifest says is only as good as the backup's directory; what bk
  itself keeps is known here (``FILES``, ``DIRS``).  So a backup copies
  only bk's files (others are named in ``skipped``), ``verify`` calls a
  listed file that bk never keeps a problem (``unknown``), and ``restore``
  writes bk's files with bk's modes and owners for this server's mode,
  never the modes a manifest records.
* A backup that fails (a full disk) leaves nothing: what it created is
  removed before the error is reported.  Every copy is written to a temp
  name, fsync-ed and renamed; the manifest is written last, so a backup
  without a manifest is an interrupted one and ``verify`` says so.

``restore`` writes only into an empty data directory (never over data),
verifies the backup first, and gives every file and directory its owner
(the service account; the monitor account for ``monitor/`` and ``usage/``)
and bk's mode.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat

from bk.core.errors import BkError, Busy, ConfigError, InvalidInput, IOFailure
from bk.core.lazyre import Pattern
from bk.core.record import dataclass
from bk.store.fsutil import (
    O_CLOEXEC,
    O_DIRECTORY,
    O_NOFOLLOW,
    O_NONBLOCK,
    Safety,
    fsync_dir,
    fsync_dir_at,
    io_error,
    kind,
    make_dirs,
    open_dir,
    replace_file,
    unsafe_ancestor,
    unsafe_stat,
)
from bk.store.lock import FileLock

MANIFEST = "manifest.json"
FORMAT = "gpubk.backup"
VERSION = 1
LOCK = "ledger.lock"
CHUNK = 1 << 20
BACKUP_MODE = 0o700                 # the backup directory and every directory in it
BACKUP_FILE_MODE = 0o600

# ------------------------------------------------------------ what bk keeps

# The modes bk gives what it writes: (private mode, shared mode); the
# owner: the service account (in private mode the user), or the monitor
# account (``monitor_uid``, else the service account).  They repeat the
# writers' own choices (``bk.store.ledger.Modes``, ``segments``,
# ``snapshot``, ``usage``, the cluster's node id, the private state);
# ``tests/test_admin_data.py`` checks a real data directory against them.
LEDGER = (0o600, 0o644)             # the ledger, its backups, the archive
AUDIT = (0o600, 0o640)
DAMAGED = (0o600, 0o600)
PUBLIC = (0o644, 0o644)
USAGE = (0o600, 0o644)
PRIVATE = (0o600, None)             # a trial's private state: never in a shared data directory

FILES = (
    (Pattern(r"ledger\.json"), LEDGER, "service"),
    (Pattern(r"ledger\.json\.damaged-[0-9TZ]+-[0-9a-f]+"), DAMAGED, "service"),
    (Pattern(r"audit\.jsonl"), AUDIT, "service"),
    (Pattern(r"cluster-node-id"), PUBLIC, "service"),
    (Pattern(r"backups/ledger-\d{10}\.json"), LEDGER, "service"),
    (Pattern(r"archive/\d{4}-\d{2}\.jsonl"), LEDGER, "service"),
    (Pattern(r"audit\.d/audit-\d{10}-\d{10}\.jsonl(\.sha256)?"), AUDIT, "service"),
    (Pattern(r"monitor/(snapshot|heartbeat|activity)\.json"), PUBLIC, "monitor"),
    (Pattern(r"usage/(raw|hourly)/\d{4}-\d{2}-\d{2}\.(jsonl|seal)"), USAGE, "monitor"),
    (Pattern(r"state/(presets\.json|prompt_history|worker-hint)"), PRIVATE, "service"),
    (Pattern(r"state/jobs/worker\.json"), PRIVATE, "service"),
    (Pattern(r"state/jobs/specs/[0-9a-f]{32}\.json"), PRIVATE, "service"),
    (Pattern(r"state/jobs/logs/[0-9a-f]{32}\.log(\.1)?"), PRIVATE, "service"),
)
DIRS = {
    "backups": ((0o700, 0o755), "service"),
    "archive": ((0o700, 0o755), "service"),
    "audit.d": ((0o700, 0o750), "service"),
    "monitor": ((0o755, 0o755), "monitor"),
    "usage": ((0o700, 0o755), "monitor"),
    "usage/raw": ((0o700, 0o755), "monitor"),
    "usage/hourly": ((0o700, 0o755), "monitor"),
    "state": ((0o700, None), "service"),
    "state/jobs": ((0o700, None), "service"),
    "state/jobs/specs": ((0o700, None), "service"),
    "state/jobs/logs": ((0o700, None), "service"),
}


def known(rel: str, *, shared: bool) -> tuple[int, str] | None:
    """``(mode, owner role)`` of a file bk keeps at ``rel``, else None."""
    for pattern, modes, role in FILES:
        if pattern.fullmatch(rel):
            mode = modes[1 if shared else 0]
            return None if mode is None else (mode, role)
    return None


def known_dir(rel: str, *, shared: bool) -> tuple[int, str] | None:
    found = DIRS.get(rel)
    if found is None:
        return None
    mode = found[0][1 if shared else 0]
    return None if mode is None else (mode, found[1])


@dataclass(frozen=True)
class Entry:
    path: str          # relative, with "/"
    size: int
    mode: int          # at the source, for the record; restore gives bk's
    sha256: str

    def to_json(self) -> dict:
        return {"path": self.path, "size": self.size, "mode": f"{self.mode:04o}", "sha256": self.sha256}


@dataclass(frozen=True)
class Problem:
    path: str
    why: str           # missing | changed | unlisted | not a file | unknown

    def to_json(self) -> dict:
        return {"path": self.path, "problem": self.why}


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------ walking by descriptor

def _open_sub(dirfd: int, name: str, path: str) -> int:
    """A directory inside ``dirfd``, never through a link."""
    try:
        return os.open(name, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, dir_fd=dirfd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise IOFailure(f"{path} is not a directory (a link?); refusing to follow it",
                            hint="move it aside and run again") from None
        raise io_error(e, "opening", path) from None


def _read_at(dirfd: int, name: str, path: str) -> tuple[bytes, os.stat_result]:
    """The whole of a regular file inside ``dirfd``, and its ``fstat``
    (what was read, not what the name pointed to a moment before)."""
    try:
        fd = os.open(name, os.O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, dir_fd=dirfd)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):
            raise IOFailure(f"{path} is not a regular file; refusing to read it",
                            hint="move it aside and run again") from None
        raise io_error(e, "opening", path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IOFailure(f"{path} is {kind(st.st_mode)}, not a regular file; refusing to read it",
                            hint="move it aside and run again")
        chunks = []
        while True:
            b = os.read(fd, CHUNK)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks), st
    except OSError as e:
        raise io_error(e, "reading", path) from None
    finally:
        os.close(fd)


def _tree(dirfd: int, top: str, check=None, descend=None, rel: str = ""):
    """Every entry below ``dirfd`` (named ``top``), depth first, sorted by
    name: ``(relative path, kind, st, fd)`` with kind ``dir`` (``fd`` its
    own descriptor, open while its entries are yielded), ``file`` (``fd``
    its directory's), ``other`` (a link, FIFO, device or socket) or
    ``skipped`` (a directory ``descend`` did not want).  A directory is
    opened with ``O_NOFOLLOW`` relative to its parent and ``check(st, path,
    want_dir)`` is called with its ``fstat``, and with each file's
    ``lstat``."""
    for name in sorted(os.listdir(dirfd)):
        sub = f"{rel}/{name}" if rel else name
        path = os.path.join(top, *sub.split("/"))
        try:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            if descend is not None and not descend(sub):
                yield sub, "skipped", st, None
                continue
            fd = _open_sub(dirfd, name, path)
            try:
                st = os.fstat(fd)
                if check is not None:
                    check(st, path, True)
                yield sub, "dir", st, fd
                yield from _tree(fd, top, check, descend, sub)
            finally:
                os.close(fd)
        elif stat.S_ISREG(st.st_mode):
            if check is not None:
                check(st, path, False)
            yield sub, "file", st, dirfd
        else:
            yield sub, "other", st, dirfd


# ------------------------------------------------------------ trust of a backup

def _refuse(path: str, problem: str, hint: str) -> ConfigError:
    return ConfigError(f"refusing the backup {path}: {problem}", hint, details={"path": path, "problem": problem})


def _trusted_parent(directory: str, what: str) -> None:
    """Nobody but root can change ``directory`` or anything above it
    (a sticky ``/tmp`` directly above a backup nobody else can write is
    fine: its sticky bit stops renames of what others own)."""
    found = unsafe_ancestor(directory, (0,))
    if found is None:
        return
    where, st, why = found
    said = {"unreadable": "it cannot be read", "not a directory": "it is not a directory (a link?)",
            "owner": f"it is owned by uid {st.st_uid if st else '?'}, not root",
            "writable": "group or others can write it"}[why]
    raise _refuse(what, f"{where} above it can be changed by others: {said}",
                  "keep backups in a directory only root can change, such as /var/lib/gpubk-backups")


def _root_owned(st: os.stat_result, path: str, want_dir: bool) -> None:
    """A directory or file of a backup: root's, one name, not group or
    other writable."""
    found = unsafe_stat(st, 0, want_dir=want_dir)
    if found is not None:
        raise _refuse(path, found[1], "a backup is trusted only when root made it and only root can change "
                      "it; make a new one: sudo bk admin data backup")


def _open_backup(src: str) -> tuple[str, int]:
    """The backup directory's real path and an open, checked descriptor."""
    real = os.path.realpath(os.path.abspath(src))
    if not os.path.isdir(real):
        raise InvalidInput(f"there is no backup directory {src}")
    _trusted_parent(os.path.dirname(real), real)
    try:
        fd = os.open(real, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
    except OSError as e:
        raise io_error(e, "opening", real) from None
    try:
        _root_owned(os.fstat(fd), real, True)
    except BaseException:
        os.close(fd)
        raise
    return real, fd


# ------------------------------------------------------------------- backup

def _quiet(rel: str) -> bool:
    """Files of bk's that carry no data: locks, and the temp files of a
    write in progress (``replace_file``)."""
    name = rel.rsplit("/", 1)[-1]
    return name.endswith(".lock") or name.startswith(".")


class _Dest:
    """The backup directory being filled, and the directories made in it,
    each created and opened relative to its parent's descriptor."""

    def __init__(self, fd: int, path: str):
        self.path = path
        self.fds = {"": fd}

    def dir(self, rel: str) -> int:
        if rel in self.fds:
            return self.fds[rel]
        up, _, name = rel.rpartition("/")
        parent = self.dir(up)
        path = os.path.join(self.path, *rel.split("/"))
        try:
            os.mkdir(name, BACKUP_MODE, dir_fd=parent)
        except FileExistsError:
            pass
        except OSError as e:
            raise io_error(e, "creating", path) from None
        fd = _open_sub(parent, name, path)
        os.fchmod(fd, BACKUP_MODE)
        self.fds[rel] = fd
        return fd

    def write(self, rel: str, data: bytes) -> None:
        up, _, name = rel.rpartition("/")
        fd = self.dir(up)
        replace_file(fd, name, os.path.join(self.path, *up.split("/")) if up else self.path, data,
                     BACKUP_FILE_MODE)

    def close(self) -> None:
        for rel, fd in self.fds.items():
            if rel:
                os.close(fd)
        self.fds = {"": self.fds[""]}


def _remove_made(name: str, real_parent: str, top_made: str | None) -> None:
    """Remove a backup that failed, and the parents made for it (root's
    0700 directories below directories only root can change: ``rmtree``
    by path is safe here)."""
    import shutil

    shutil.rmtree(os.path.join(real_parent, name), ignore_errors=True)
    if top_made is not None:
        d = real_parent
        while True:
            try:
                os.rmdir(d)
            except OSError:
                break
            if d == top_made:
                break
            d = os.path.dirname(d)


def _empty(real: str) -> None:
    import shutil

    for name in os.listdir(real):
        full = os.path.join(real, name)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full, ignore_errors=True)
        else:
            try:
                os.unlink(full)
            except OSError:
                pass


def backup(data_dir: str, dest: str, *, owner_uid: int, bk_version: str, now_iso: str, shared: bool,
           lock_timeout: float = 10.0) -> tuple[list[Entry], list[str]]:
    """Copy bk's files of the data directory into the new directory
    ``dest`` under the writers' lock; the manifest last.  Returns the
    entries and what was left out (files in the data directory that are
    not bk's).  On any failure nothing of ``dest`` is left."""
    if not os.path.isdir(data_dir):
        raise InvalidInput(f"there is no data directory {data_dir} to back up")
    data_real = os.path.realpath(data_dir)
    real = os.path.realpath(os.path.abspath(dest))
    name = os.path.basename(real)
    if not name:
        raise InvalidInput(f"{dest} does not name a new directory", hint="name a new directory")
    if os.path.commonpath([real, data_real]) == data_real:
        raise InvalidInput("the backup may not lie inside the data directory", hint="name a directory outside it")
    existing = os.path.dirname(real)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    _trusted_parent(existing, real)
    top_made = make_dirs(os.path.dirname(real), BACKUP_MODE)      # root's, 0700: trusted as made
    real_parent = os.path.dirname(real)
    try:
        pfd = os.open(real_parent, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
    except OSError as e:
        raise io_error(e, "opening", real_parent) from None
    created = filling = False
    dest_dir = None
    try:
        try:
            os.mkdir(name, BACKUP_MODE, dir_fd=pfd)
            created = True
        except FileExistsError:
            pass
        except OSError as e:
            raise io_error(e, "creating", real) from None
        bfd = _open_sub(pfd, name, real)
        dest_dir = _Dest(bfd, real)
        st = os.fstat(bfd)
        if created:
            os.fchmod(bfd, BACKUP_MODE)
        else:
            # Someone else's directory, or one others may enter or write,
            # could be changed under the copy or after it.
            if st.st_uid != 0 or stat.S_IMODE(st.st_mode) != BACKUP_MODE:
                raise _refuse(real, f"it exists, owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}; "
                              "bk makes a backup only in a directory it creates, or in an empty one "
                              "that is root's with mode 0700", "name a new directory; bk creates it")
            if os.listdir(bfd):
                raise InvalidInput(f"backup directory {real} is not empty", hint="name a new or empty directory")
        filling = True
        entries, skipped = _copy(data_dir, dest_dir, owner_uid=owner_uid, shared=shared,
                                 lock_timeout=lock_timeout)
        st = os.stat(data_dir)
        manifest = {"format": FORMAT, "version": VERSION, "bk_version": bk_version, "created": now_iso,
                    "source": os.path.abspath(data_dir), "data_dir_mode": f"{stat.S_IMODE(st.st_mode):04o}",
                    "files": [e.to_json() for e in entries]}
        dest_dir.write(MANIFEST, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
        for fd in dest_dir.fds.values():
            fsync_dir(fd, real)
        fsync_dir(pfd, real_parent)
    except BaseException as e:
        if dest_dir is not None:
            dest_dir.close()
            os.close(dest_dir.fds[""])
            dest_dir = None
        if created or top_made is not None:
            _remove_made(name, real_parent, top_made)
        elif filling:                   # root's empty directory, given: empty again
            _empty(real)
        if (created or filling) and isinstance(e, BkError):
            what = "removed" if created else "emptied"
            raise type(e)(f"{e.message}; the unfinished backup {real} was {what}", e.hint,
                          details=e.details) from None
        raise
    finally:
        if dest_dir is not None:
            dest_dir.close()
            os.close(dest_dir.fds[""])
        os.close(pfd)
    return entries, skipped


def _copy(data_dir: str, dest: _Dest, *, owner_uid: int, shared: bool,
          lock_timeout: float) -> tuple[list[Entry], list[str]]:
    safety = Safety(owner_uid)
    dirfd = open_dir(data_dir, safety)
    if dirfd is None:
        raise InvalidInput(f"there is no data directory {data_dir} to back up")
    entries: list[Entry] = []
    skipped: list[str] = []
    try:
        # Only an existing lock is taken: one created here would be root's,
        # and the service account's next commit would refuse it.  No lock
        # file means no writer has ever committed.
        from contextlib import nullcontext

        exists = os.path.lexists(os.path.join(data_dir, LOCK))
        lock = FileLock(dirfd, LOCK, os.path.join(data_dir, LOCK), safety, mode=0o600, timeout=lock_timeout,
                        what="the ledger") if exists else nullcontext()
        with lock:
            for rel, what, st, fd in _tree(dirfd, data_dir, descend=lambda r: known_dir(r, shared=shared)
                                           is not None):
                if what == "dir":
                    continue
                path = os.path.join(data_dir, *rel.split("/"))
                if _quiet(rel):
                    continue
                if known(rel, shared=shared) is None:
                    skipped.append(rel + ("/" if what == "skipped" else ""))
                    continue
                if what != "file":
                    raise IOFailure(f"{path} is {kind(st.st_mode)}, not a regular file; refusing to copy it",
                                    hint="move it aside and run again")
                try:
                    data, fst = _read_at(fd, rel.rsplit("/", 1)[-1], path)
                except FileNotFoundError:
                    continue          # a monitor file replaced meanwhile
                dest.write(rel, data)
                entries.append(Entry(rel, len(data), stat.S_IMODE(fst.st_mode), _digest(data)))
    finally:
        os.close(dirfd)
    return entries, skipped


# ------------------------------------------------------------- verify, restore

def _parse(src: str, data: bytes) -> dict:
    path = os.path.join(src, MANIFEST)
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


def _entries(src: str, doc: dict) -> list[Entry]:
    out = []
    for f in doc["files"]:
        try:
            e = Entry(str(f["path"]), int(f["size"]), int(str(f["mode"]), 8), str(f["sha256"]))
        except (KeyError, TypeError, ValueError):
            raise InvalidInput(f"{src}/{MANIFEST} has a malformed entry: {str(f)[:80]}") from None
        parts = e.path.split("/")
        if e.path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise InvalidInput(f"{src}/{MANIFEST} names a path outside the backup: {e.path[:80]}")
        out.append(e)
    return out


def verify(src: str, *, shared: bool) -> tuple[dict, list[Entry], list[Problem]]:
    """Check every file of a backup against its manifest.  Refused
    (``ConfigError``) when the backup could have been changed by anyone
    but root; a file bk never keeps in a data directory like this one
    (``shared``) is a problem (``unknown``)."""
    real, bfd = _open_backup(src)
    try:
        found: dict[str, tuple[int, str]] = {}
        dirs = set()
        for rel, what, st, fd in _tree(bfd, real, check=_root_owned):
            path = os.path.join(real, *rel.split("/"))
            if what == "dir":
                dirs.add(rel)
            elif what == "other":
                raise _refuse(real, f"{path} is {kind(st.st_mode)}", "a backup holds only files and directories")
            else:
                data, fst = _read_at(fd, rel.rsplit("/", 1)[-1], path)
                _root_owned(fst, path, False)
                found[rel] = (len(data), _digest(data)) if rel != MANIFEST else (len(data), data)
        if MANIFEST not in found:
            raise InvalidInput(f"{src} has no {MANIFEST}: not a bk backup, or an interrupted one")
        doc = _parse(real, found.pop(MANIFEST)[1])
    finally:
        os.close(bfd)
    entries = _entries(real, doc)
    problems: list[Problem] = []
    listed = set()
    for e in entries:
        listed.add(e.path)
        if known(e.path, shared=shared) is None:
            problems.append(Problem(e.path, "unknown"))
        elif e.path in found:
            size, digest = found[e.path]
            if size != e.size or digest != e.sha256:
                problems.append(Problem(e.path, "changed"))
        else:
            problems.append(Problem(e.path, "not a file" if e.path in dirs else "missing"))
    for rel in sorted(found):
        if rel not in listed:
            problems.append(Problem(rel, "unlisted"))
    return doc, entries, problems


def _read_backup_file(bfd: int, real: str, rel: str) -> bytes:
    """One file of the backup, through checked directories."""
    parts = rel.split("/")
    fds = []
    try:
        fd = bfd
        for i, name in enumerate(parts[:-1]):
            path = os.path.join(real, *parts[:i + 1])
            fd = _open_sub(fd, name, path)
            fds.append(fd)
            _root_owned(os.fstat(fd), path, True)
        path = os.path.join(real, *parts)
        data, st = _read_at(fd, parts[-1], path)
        _root_owned(st, path, False)
        return data
    finally:
        for fd in fds:
            os.close(fd)


def restore(src: str, data_dir: str, entries: list[Entry], *, shared: bool,
            owners: dict[str, tuple[int, int]], dir_owner: tuple[int, int], dir_mode: int) -> None:
    """Copy the verified ``entries`` into the empty ``data_dir``: each with
    bk's mode and its owner (``owners`` by role: ``service``, ``monitor``),
    whatever the manifest says; the data directory itself, when missing,
    is created ``dir_mode`` and ``dir_owner``'s."""
    plan = []
    for e in entries:
        found = known(e.path, shared=shared)
        if found is None:
            raise InvalidInput(f"{e.path} is not a file bk keeps; nothing was restored",
                               hint="verify the backup: sudo bk admin data verify DIR")
        plan.append((e, *found))
    if not os.path.isdir(data_dir):
        try:
            os.mkdir(data_dir, dir_mode)
            os.chown(data_dir, *dir_owner)
            os.chmod(data_dir, dir_mode)
        except OSError as e:
            raise io_error(e, "creating", data_dir) from None
    try:
        dfd = os.open(data_dir, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
    except OSError as e:
        raise io_error(e, "opening", data_dir) from None
    real, bfd = _open_backup(src)
    made = {"": dfd}
    try:
        if os.listdir(dfd):
            raise InvalidInput(f"the data directory {data_dir} is not empty; restore writes only into an empty one")
        for e, mode, role in plan:
            data = _read_backup_file(bfd, real, e.path)
            if _digest(data) != e.sha256:
                raise IOFailure(f"{e.path} changed while it was restored", hint="verify the backup again")
            up, _, name = e.path.rpartition("/")
            fd = _restore_dir(made, data_dir, up, shared=shared, owners=owners)
            replace_file(fd, name, os.path.join(data_dir, *up.split("/")) if up else data_dir, data, mode,
                         owner=owners[role])
        for fd in made.values():
            fsync_dir(fd, data_dir)
    finally:
        for fd in made.values():
            os.close(fd)
        os.close(bfd)


def _restore_dir(made: dict, data_dir: str, rel: str, *, shared: bool, owners: dict) -> int:
    if rel in made:
        return made[rel]
    up, _, name = rel.rpartition("/")
    parent = _restore_dir(made, data_dir, up, shared=shared, owners=owners)
    mode, role = known_dir(rel, shared=shared) or (0o700, "service")
    path = os.path.join(data_dir, *rel.split("/"))
    try:
        os.mkdir(name, mode, dir_fd=parent)
    except FileExistsError:
        pass
    except OSError as e:
        raise io_error(e, "creating", path) from None
    fd = _open_sub(parent, name, path)
    try:
        os.fchown(fd, *owners[role])
        os.fchmod(fd, mode)
    except OSError as e:
        os.close(fd)
        raise io_error(e, "setting the owner and mode of", path) from None
    made[rel] = fd
    return fd


# ------------------------------------------------------------------ the rest

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
