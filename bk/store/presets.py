"""The user's private state files: booking presets, the prompt history and
the hints already given in this session (``said_this_session``).

Both live in the per-user state directory (``$XDG_STATE_HOME/bk``; with
``BK_DATA_DIR`` set, a trial run, ``$BK_DATA_DIR/state``, see
``bk.store.paths``), never in the shared data directory: a preset or a
command history is nobody else's business, and in shared mode the user
cannot write the data directory anyway.

The facts that shape this module:

* The directory is created 0700 and every file in it 0600, whatever the
  umask (``bk.store.fsutil`` sets the mode after creating).  Every name is
  opened relative to the directory's descriptor with ``O_NOFOLLOW``, and an
  existing file or directory that is a link, not ours, or writable by others
  is refused with the command that fixes it, never silently chmod-ed: it is
  evidence that something is not what the user thinks (the same rules as
  the ledger's, see ``bk.store.fsutil``).
* A crash must leave the old file or the new one, never half of each.  We
  write a temporary file in the same directory (``rename(2)`` is atomic only
  within one file system), ``fsync`` it, rename it over the old name, then
  ``fsync`` the directory so the rename itself reaches the disk.
* Two ``bk p save`` of the same user may race; the read-modify-write holds an
  ``flock`` on ``state.lock``, a file that is never replaced (a lock on a
  file that a rename swaps out would lock nothing).  The wait is bounded.
* A damaged presets file is reported (exit 74) with the path to fix, never
  silently dropped: losing a user's presets quietly is worse than an error.
  The prompt history is a convenience, so a damaged one is just ignored.
"""

from __future__ import annotations

import os

from bk.core import jsonfast
from bk.core.errors import BkError, Busy, IOFailure
from bk.store.fsutil import (
    Safety,
    io_error,
    open_dir,
    open_file,
    read_all,
    replace_file,
)
from bk.store.lock import FileLock

TYPE_CHECKING = False
if TYPE_CHECKING:   # annotations only: collections.abc imports collections, typing more
    from collections.abc import Callable
    from typing import Any

SCHEMA = "gpubk.presets.v1"
PRESETS_FILE = "presets.json"
LOCK_FILE = "state.lock"
HISTORY_FILE = "prompt_history"
DIR_MODE = 0o700
FILE_MODE = 0o600
MAX_BYTES = 1 << 20          # a presets file is a few KiB; anything bigger is not ours
LOCK_WAIT_SECONDS = 5.0


class StateDir:
    """The open per-user state directory; ``with StateDir(path) as d:``."""

    def __init__(self, path: str, *, create: bool):
        self.path = path
        self.safety = Safety(os.getuid())
        self.create = create
        self.fd: int | None = None

    def __enter__(self) -> StateDir:
        if self.create:
            # With BK_DATA_DIR set the state directory is inside the data
            # directory (``bk.store.paths``), which a first ``bk p save`` may
            # have to create: 0700, as the ledger wants it, whatever the umask
            # (makedirs applies the mode to the last component only).
            parent = os.path.dirname(os.path.abspath(self.path))
            if not os.path.isdir(parent):
                try:
                    os.makedirs(parent, DIR_MODE, exist_ok=True)
                    os.chmod(parent, DIR_MODE, follow_symlinks=False)
                except OSError as e:
                    raise io_error(e, "creating", parent) from None
        self.fd = open_dir(self.path, self.safety, create_mode=DIR_MODE if self.create else None)
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def read(self, name: str) -> bytes | None:
        """A file's content, or None when the file (or the directory) does not exist."""
        if self.fd is None:
            return None
        path = os.path.join(self.path, name)
        fd = open_file(self.fd, name, path, self.safety)
        if fd is None:
            return None
        try:
            if os.fstat(fd).st_size > MAX_BYTES:
                raise IOFailure(f"{path} is larger than {MAX_BYTES // 1024} KiB; it is not a bk state file",
                                hint=f"move it away: mv {path} {path}.old")
            return read_all(fd)
        except OSError as e:
            raise io_error(e, "reading", path) from None
        finally:
            os.close(fd)

    def replace(self, name: str, data: bytes) -> None:
        """Atomically give ``name`` the content ``data`` (mode 0600)."""
        replace_file(self.fd, name, self.path, data, FILE_MODE)

    def lock(self, wait: float = LOCK_WAIT_SECONDS) -> FileLock:
        """``flock`` on ``state.lock``, a file that is never replaced (a lock
        on a file that a rename swaps out would lock nothing), bounded."""
        path = os.path.join(self.path, LOCK_FILE)

        def busy(pid: int | None) -> Busy:
            by = f" by process {pid}" if pid else ""
            return Busy(f"another bk is changing your presets ({path} is locked{by})",
                        hint="retry in a moment", details={"path": path, "holder_pid": pid})
        return FileLock(self.fd, LOCK_FILE, path, self.safety, mode=FILE_MODE, timeout=wait,
                        busy=busy)


class PresetFile:
    """The presets file of one user: ``{"schema": ..., "presets": {name: {...}}}``.

    Records are plain dicts here; ``bk.service.presets`` gives them meaning
    and validates their fields.
    """

    def __init__(self, state_dir: str):
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, PRESETS_FILE)

    def read(self) -> dict[str, dict]:
        with StateDir(self.state_dir, create=False) as d:
            raw = d.read(PRESETS_FILE)
        return {} if raw is None else self._decode(raw)

    def _decode(self, raw: bytes) -> dict[str, dict]:
        hint = f"fix or move it away (mv {self.path} {self.path}.bad); you lose the presets in it"
        try:
            doc = jsonfast.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise IOFailure(f"{self.path} is damaged: {e}", hint=hint) from None
        if not isinstance(doc, dict) or not isinstance(doc.get("presets"), dict):
            raise IOFailure(f"{self.path} is damaged: no 'presets' object", hint=hint)
        if doc.get("schema") != SCHEMA:
            raise IOFailure(f"{self.path} has schema {doc.get('schema')!r}, this bk reads {SCHEMA!r}",
                            hint="a newer bk wrote it; use that version, or " + hint)
        presets = doc["presets"]
        if not all(isinstance(k, str) and isinstance(v, dict) for k, v in presets.items()):
            raise IOFailure(f"{self.path} is damaged: a preset is not an object", hint=hint)
        return presets

    def update(self, change: Callable[[dict[str, dict]], Any]) -> Any:
        """Lock, re-read, let ``change`` mutate the presets, write them back.

        ``change`` returns what ``update`` returns; it may raise to abandon
        the change (nothing is written then)."""
        with StateDir(self.state_dir, create=True) as d, d.lock():
            raw = d.read(PRESETS_FILE)
            presets = {} if raw is None else self._decode(raw)
            before = jsonfast.dumps(presets, sort_keys=True)
            result = change(presets)
            if jsonfast.dumps(presets, sort_keys=True) != before:
                import json  # an indented file: json's own writer

                doc = {"schema": SCHEMA, "presets": dict(sorted(presets.items()))}
                d.replace(PRESETS_FILE, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())
        return result


class HistoryFile:
    """The interactive prompt's line history: one command per line, newest last, bounded.

    We keep our own plain format instead of ``readline.write_history_file``:
    GNU readline and libedit (macOS) write different formats, and readline
    would create the file with the umask's mode rather than 0600.  History is
    a convenience: an unreadable file reads as empty."""

    def __init__(self, state_dir: str, limit: int = 1000):
        self.state_dir = state_dir
        self.limit = limit

    def read(self) -> list[str]:
        try:
            with StateDir(self.state_dir, create=False) as d:
                raw = d.read(HISTORY_FILE)
        except BkError:
            return []
        if raw is None:
            return []
        lines = raw.decode("utf-8", "replace").splitlines()
        return [line for line in lines if line.strip()][-self.limit:]

    def write(self, lines: list[str]) -> None:
        keep = [line for line in lines if line.strip() and "\n" not in line][-self.limit:]
        with StateDir(self.state_dir, create=True) as d, d.lock():
            d.replace(HISTORY_FILE, "".join(line + "\n" for line in keep).encode("utf-8"))


def said_this_session(state_dir: str, name: str, session: str, *, keep: int = 16) -> bool:
    """Whether ``name`` was already said in ``session`` (a key naming this
    login or terminal session); records that it is said now, remembering
    the last ``keep`` sessions (two terminals open side by side are two
    sessions, each told once).  A convenience like the history: a file that
    cannot be read or written means "not said", so the worst case is a hint
    shown again, never one lost."""
    try:
        with StateDir(state_dir, create=False) as d:
            raw = d.read(name)
        seen = [] if raw is None else raw.decode("utf-8", "replace").splitlines()
        if session in seen:
            return True
        with StateDir(state_dir, create=True) as d:
            d.replace(name, "".join(k + "\n" for k in [*seen, session][-keep:]).encode("utf-8"))
    except (BkError, OSError):
        pass
    return False
