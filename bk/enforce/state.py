"""The enforcer's files: its status (``status.json``), its events
(``events.jsonl``) and its single-instance lock, in ``enforce_state_dir``
(``/var/lib/gpubk-enforcer``, the unit's ``StateDirectory=``).

The facts:

* The enforcer runs as root, so its files are root's; a reader believes
  them only when root owns them and nobody else can write them (the
  store's owner and mode rule, ``Safety(0)``), as it believes the
  monitor's files only from the monitor account.
* ``status.json`` is replaced whole (``replace_file``: temp file, rename)
  on every change and at every renewal, so readers (``bk admin enforce
  status``, ``bk doctor``) take no lock and never see half of it.  It is a
  heartbeat too (rewritten at least every 5 s): an ``updated_at`` older
  than ``STALE_S``, or a ``pid``
  that no longer runs, means the enforcer is not running, whatever the
  file says.
* ``events.jsonl`` gets one line per thing a person should hear about
  (a process signalled, failing open or closed, an attachment refused),
  appended with ``O_APPEND`` in one ``write``; past ``EVENTS_MAX`` bytes it
  is renamed to ``events.jsonl.1`` (one old file kept).  It holds UIDs,
  PIDs, GPU numbers and program labels, never command lines.
* ``enforcer.lock`` is held (``flock``) for the enforcer's life: a second
  one exits 75, naming the holder.  It is the daemons' one lock
  (``bk.daemon.instance_lock``): 0600, so no user can open it, hold it and
  keep the enforcer from starting again; one an older bk made 0644 is
  replaced at the next start, and the log says so.
"""

from __future__ import annotations

import json
import os

from bk.core.errors import BkError
from bk.core.models import iso
from bk.store.fsutil import Safety, open_dir, open_file, read_all, replace_file

SCHEMA = "gpubk.enforcer.v1"
STATUS_FILE = "status.json"
EVENTS_FILE = "events.jsonl"
LOCK_FILE = "enforcer.lock"
DIR_MODE, FILE_MODE = 0o755, 0o644
STALE_S = 15                       # the enforcer rewrites its status at least every 5 s
EVENTS_MAX = 1 << 20
MAX_BYTES = 8 << 20

ENFORCING, FAILING_OPEN, FAILING_CLOSED, STOPPED = "enforcing", "failing-open", "failing-closed", "stopped"
STALE, ABSENT, DAMAGED = "stale", "absent", "damaged"


def _dir(directory: str, create: bool) -> int | None:
    return open_dir(directory, Safety(0), create_mode=DIR_MODE if create else None)


def write_status(directory: str, doc: dict) -> None:
    data = json.dumps({"schema": SCHEMA, **doc}, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    fd = _dir(directory, True)
    try:
        replace_file(fd, STATUS_FILE, directory, data, FILE_MODE, sync=False)
    finally:
        os.close(fd)


def read_status(directory: str) -> tuple[str, dict | None]:
    """(``absent``|``damaged``|``ok``, the document): the file as root
    wrote it, or why it cannot be believed."""
    try:
        fd = _dir(directory, False)
    except (BkError, OSError):
        return DAMAGED, None
    if fd is None:
        return ABSENT, None
    try:
        f = open_file(fd, STATUS_FILE, os.path.join(directory, STATUS_FILE), Safety(0))
        if f is None:
            return ABSENT, None
        try:
            if os.fstat(f).st_size > MAX_BYTES:
                return DAMAGED, None
            doc = json.loads(read_all(f))
        finally:
            os.close(f)
    except (BkError, OSError, ValueError):
        return DAMAGED, None
    finally:
        os.close(fd)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return DAMAGED, None
    return "ok", doc


def pid_alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def liveness(doc: dict | None, found: str, now: float) -> str:
    """The enforcer's state as a reader must take it: the recorded state
    while fresh and its process runs; ``stale``, ``absent`` or ``damaged``
    otherwise (``stopped`` when it recorded a clean stop)."""
    if doc is None:
        return found
    state = doc.get("state")
    if state == STOPPED:
        return STOPPED
    updated = doc.get("updated_at")
    if not isinstance(updated, (int, float)) or not 0 <= now - updated < STALE_S or not pid_alive(doc.get("pid")):
        return STALE
    return state if state in (ENFORCING, FAILING_OPEN, FAILING_CLOSED) else DAMAGED


def append_event(directory: str, event: dict) -> None:
    """One line in ``events.jsonl`` (never raises: an event that cannot be
    written is in the log already)."""
    line = json.dumps(event, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    try:
        fd = _dir(directory, True)
    except (BkError, OSError):
        return
    try:
        try:
            st = os.stat(EVENTS_FILE, dir_fd=fd, follow_symlinks=False)
            if st.st_size + len(line) > EVENTS_MAX:
                os.replace(EVENTS_FILE, EVENTS_FILE + ".1", src_dir_fd=fd, dst_dir_fd=fd)
        except FileNotFoundError:
            pass
        f = open_file(fd, EVENTS_FILE, os.path.join(directory, EVENTS_FILE), Safety(0),
                      os.O_WRONLY | os.O_APPEND, create_mode=FILE_MODE)
        if f is not None:
            try:
                os.write(f, line)
            finally:
                os.close(f)
    except (BkError, OSError):
        pass
    finally:
        os.close(fd)


def read_events(directory: str, *, limit: int = 50, uid: int | None = None) -> list[dict]:
    """The newest ``limit`` events (of ``uid`` when given), oldest first."""
    try:
        fd = _dir(directory, False)
    except (BkError, OSError):
        return []
    if fd is None:
        return []
    out: list[dict] = []
    try:
        for name in (EVENTS_FILE + ".1", EVENTS_FILE):
            try:
                f = open_file(fd, name, os.path.join(directory, name), Safety(0))
            except (BkError, OSError):
                continue
            if f is None:
                continue
            try:
                raw = read_all(f)
            finally:
                os.close(f)
            for line in raw.splitlines():
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if isinstance(e, dict) and (uid is None or e.get("uid") == uid):
                    out.append(e)
    finally:
        os.close(fd)
    return out[-limit:]


def event(kind: str, now: float, **fields) -> dict:
    return {"time": iso(int(now)), "event": kind, **fields}
