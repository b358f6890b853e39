"""The user's own notification files: preferences, the delivery log, the lease.

Layout (the user's, directories 0700, files 0600)::

    $XDG_CONFIG_HOME/bk/notify.json     preferences (bk notify set): events,
                                        channels, quiet hours, email address,
                                        webhook URL; never in a shared file
    STATE_DIR/notify/deliveries.json    the delivery log and each channel's health
    STATE_DIR/notify/log.lock           held while the log is rewritten
    STATE_DIR/notify/deliverer.lock     held by the one running deliverer
    STATE_DIR/notify/deliverer.json     its pid and start time

The delivery log is one small JSON document, replaced whole with the
store's atomic protocol (``fsutil.replace_file``: temp file, fsync, rename,
fsync of the directory) under ``log.lock``, so a crash at any instant
leaves the previous version or the next, never half of one.  Every change
re-reads the file under the lock first: ``bk notify test`` records a
channel's health while a deliverer runs, and neither loses the other's
write.  Entries are dropped two days after their window closed, so the
file stays the size of the user's current bookings.
"""

from __future__ import annotations

import json
import os

from bk.core.errors import BkError, Busy, ConfigError
from bk.store.fsutil import Safety, make_dirs, open_dir, open_file, read_all, replace_file
from bk.store.lock import FileLock, holder

DIR_MODE = 0o700
FILE_MODE = 0o600
SUBDIR = "notify"
PREFS_FILE = "notify.json"
LOG_FILE = "deliveries.json"
LOG_LOCK = "log.lock"
LEASE_FILE = "deliverer.lock"
STATE_FILE = "deliverer.json"
PREFS_SCHEMA = "gpubk.notify-prefs.v1"
LOG_SCHEMA = "gpubk.notify-log.v1"
MAX_BYTES = 4 << 20
KEEP_S = 2 * 86400           # entries live this long after their window closed


def notify_dir(state_dir: str) -> str:
    return os.path.join(state_dir, SUBDIR)


class PrivateDir:
    """``with PrivateDir(path, create=...) as d``: the open directory (``d.fd``,
    None when it is missing and not created), checked like every state path:
    the user's own, not writable by group or others, no links."""

    def __init__(self, path: str, *, create: bool):
        self.path, self.create = path, create
        self.safety = Safety(os.getuid())
        self.fd: int | None = None

    def __enter__(self) -> PrivateDir:
        if self.create:
            make_dirs(os.path.dirname(self.path), DIR_MODE)
        self.fd = open_dir(self.path, self.safety, create_mode=DIR_MODE if self.create else None)
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def read(self, name: str) -> bytes | None:
        if self.fd is None:
            return None
        fd = open_file(self.fd, name, os.path.join(self.path, name), self.safety)
        if fd is None:
            return None
        try:
            if os.fstat(fd).st_size > MAX_BYTES:
                raise ConfigError(f"{os.path.join(self.path, name)} is larger than bk ever writes it",
                                  hint="move it aside; bk starts a new one")
            return read_all(fd)
        finally:
            os.close(fd)

    def write(self, name: str, data: bytes) -> None:
        replace_file(self.fd, name, self.path, data, FILE_MODE)

    def lock(self, name: str, *, timeout: float, busy=None) -> FileLock:
        return FileLock(self.fd, name, os.path.join(self.path, name), self.safety, mode=FILE_MODE,
                        timeout=timeout, busy=busy)


def _doc(data: bytes | None, schema: str, path: str) -> dict:
    if data is None:
        return {"schema": schema}
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        doc = None
    if not isinstance(doc, dict) or doc.get("schema") != schema:
        raise ConfigError(f"{path} is not a file bk can read (damaged, or written by something else)",
                          hint=f"move it aside (mv {path} {path}.bad); bk starts a new one")
    return doc


def _encode(doc: dict) -> bytes:
    return (json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True) + "\n").encode()


# ------------------------------------------------------------ preferences

def read_prefs(path: str) -> dict:
    """The user's own choices as stored (keys they set), ``{}`` when none."""
    with PrivateDir(os.path.dirname(path), create=False) as d:
        doc = _doc(d.read(os.path.basename(path)), PREFS_SCHEMA, path)
    doc.pop("schema", None)
    return doc


def prefs_stamp(path: str):
    """What changes when the preferences do (a stat, for the deliverer's loop)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def write_prefs(path: str, prefs: dict) -> None:
    with PrivateDir(os.path.dirname(path), create=True) as d:
        d.write(os.path.basename(path), _encode({**prefs, "schema": PREFS_SCHEMA}))


# ------------------------------------------------------------ the delivery log

class DeliveryLog:
    """The delivery log of one user (see the module docstring)."""

    def __init__(self, directory: str, *, lock_timeout: float = 10.0):
        self.directory = directory
        self.path = os.path.join(directory, LOG_FILE)
        self.lock_timeout = lock_timeout

    def read(self) -> dict:
        """``{"entries": {key: entry}, "health": {channel: ...}}``; empty when none."""
        with PrivateDir(self.directory, create=False) as d:
            doc = _doc(d.read(LOG_FILE), LOG_SCHEMA, self.path)
        doc.setdefault("entries", {})
        doc.setdefault("health", {})
        return doc

    def update(self, change, *, now: int) -> dict:
        """Re-read under the lock, ``change(doc)`` in place, prune, replace
        durably; returns the document written."""
        with PrivateDir(self.directory, create=True) as d, d.lock(LOG_LOCK, timeout=self.lock_timeout):
            doc = _doc(d.read(LOG_FILE), LOG_SCHEMA, self.path)
            doc.setdefault("entries", {})
            doc.setdefault("health", {})
            change(doc)
            doc["entries"] = {k: e for k, e in doc["entries"].items()
                              if not isinstance(e.get("expires"), int) or e["expires"] + KEEP_S > now}
            d.write(LOG_FILE, _encode(doc))
            return doc


# ------------------------------------------------------------ the lease

class Lease:
    """One deliverer per user: ``deliverer.lock``, an flock the kernel drops
    when its holder dies however it dies, and ``deliverer.json`` beside it."""

    def __init__(self, directory: str, *, now: int, owner: str):
        self.directory, self.now, self.owner = directory, now, owner
        self._dir: PrivateDir | None = None
        self._lock: FileLock | None = None

    def __enter__(self) -> Lease:
        self._dir = PrivateDir(self.directory, create=True).__enter__()

        def busy(pid):
            by = f" (process {pid})" if pid else ""
            return Busy(f"a bk notification deliverer already runs for you{by}",
                        hint="it runs inside your worker: see it with bk notify",
                        details={"holder_pid": pid})
        try:
            self._lock = self._dir.lock(LEASE_FILE, timeout=0, busy=busy)
            self._lock.acquire()
            self._dir.write(STATE_FILE, _encode({"pid": os.getpid(), "since": self.now, "owner": self.owner}))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if self._dir is not None:
            self._dir.__exit__()
            self._dir = None


def deliverer_status(directory: str, proc_locks: str = "/proc/locks") -> dict:
    """``{"state": "running" | "absent", "pid", "since"}``, read-only: the
    holder of the lease from ``/proc/locks`` (never by taking it)."""
    out = {"state": "absent", "pid": None, "since": None}
    try:
        with PrivateDir(directory, create=False) as d:
            if d.fd is None:
                return out
            fd = open_file(d.fd, LEASE_FILE, os.path.join(directory, LEASE_FILE), d.safety)
            if fd is None:
                return out
            try:
                pid = holder(fd, proc_locks)
            finally:
                os.close(fd)
            if pid is None:
                return out
            out.update(state="running", pid=pid)
            raw = d.read(STATE_FILE)
            doc = json.loads(raw) if raw else {}
            if isinstance(doc, dict) and doc.get("pid") == pid and isinstance(doc.get("since"), int):
                out["since"] = doc["since"]
    except (BkError, OSError, ValueError):
        return out
    return out
