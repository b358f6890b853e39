"""``bk admin data backup|verify|clear|restore``: the data directory as a whole.

These run on the host as root (or, in private mode, as the data's owner),
never through the broker: they copy files the broker writes, so clear and
restore first establish that no service runs (``backup.guard_stopped``:
the broker's socket answers nothing, no writer holds a lock).  A backup
can be taken while the services run: it holds the writers' lock while it
copies.  The file work is ``bk.store.backup``; here are the rules and the
results.
"""

from __future__ import annotations

import os

from bk.core.errors import InvalidInput
from bk.core.record import dataclass
from bk.core.utctime import format_utc
from bk.store import backup as store


@dataclass(frozen=True)
class DataResult:
    status: str                  # backed_up | verified | tampered | cleared | restored | dry_run
    data_dir: str
    backup_dir: str | None = None
    files: tuple = ()            # Entry
    problems: tuple = ()         # Problem
    removed: tuple = ()
    bk_version: str | None = None

    def to_json(self) -> dict:
        return {"status": self.status, "data_dir": self.data_dir, "backup_dir": self.backup_dir,
                "files": [e.to_json() for e in self.files], "problems": [p.to_json() for p in self.problems],
                "removed": list(self.removed), "bk_version": self.bk_version}


def default_dir(data_dir: str, now: int) -> str:
    stamp = format_utc(now).replace("-", "").replace(":", "")
    parent = os.path.dirname(os.path.abspath(data_dir).rstrip("/"))
    return os.path.join(parent, os.path.basename(data_dir.rstrip("/")) + "-backups", stamp)


def _owner(service) -> int:
    uid = service.settings["service_uid"] if service.shared else None
    return uid if uid is not None else os.geteuid()


def _socket(service) -> str | None:
    return service.settings["socket"] if service.shared else None


def backup(service, dest: str | None, *, now: int, dry_run: bool = False) -> DataResult:
    from bk import __version__

    data_dir = service.settings.data_dir
    dest = os.path.abspath(dest or default_dir(data_dir, now))
    if dry_run:
        return DataResult("dry_run", data_dir, dest, bk_version=__version__)
    entries = store.backup(data_dir, dest, owner_uid=_owner(service), bk_version=__version__,
                           now_iso=format_utc(now), lock_timeout=service.settings["lock_timeout_seconds"])
    return DataResult("backed_up", data_dir, dest, tuple(entries), bk_version=__version__)


def verify(service, src: str) -> DataResult:
    doc, entries, problems = store.verify(os.path.abspath(src))
    return DataResult("tampered" if problems else "verified", service.settings.data_dir, os.path.abspath(src),
                      tuple(entries), tuple(problems), bk_version=str(doc.get("bk_version")))


def clear(service, dest: str | None, *, now: int, dry_run: bool = False) -> DataResult:
    """Back up, verify the copy, then empty the data directory."""
    data_dir = service.settings.data_dir
    store.guard_stopped(data_dir, _socket(service))
    if not os.path.isdir(data_dir) or not os.listdir(data_dir):
        return DataResult("cleared", data_dir)
    if dry_run:
        return DataResult("dry_run", data_dir, os.path.abspath(dest or default_dir(data_dir, now)),
                          removed=tuple(sorted(os.listdir(data_dir))))
    made = backup(service, dest, now=now)
    _doc, _entries, problems = store.verify(made.backup_dir)
    if problems:
        raise InvalidInput(f"the backup {made.backup_dir} does not verify ({problems[0].path} "
                           f"{problems[0].why}); nothing was cleared")
    store.guard_stopped(data_dir, _socket(service))
    removed = store.clear(data_dir)
    return DataResult("cleared", data_dir, made.backup_dir, made.files, removed=tuple(removed),
                      bk_version=made.bk_version)


def restore(service, src: str, *, dry_run: bool = False) -> DataResult:
    data_dir = service.settings.data_dir
    store.guard_stopped(data_dir, _socket(service))
    doc, entries, problems = store.verify(os.path.abspath(src))
    if problems:
        return DataResult("tampered", data_dir, os.path.abspath(src), tuple(entries), tuple(problems),
                          bk_version=str(doc.get("bk_version")))
    if os.path.isdir(data_dir) and os.listdir(data_dir):
        raise InvalidInput(f"the data directory {data_dir} is not empty; restore writes only into an empty one",
                           hint="sudo bk admin data clear (it backs up first), then restore")
    if dry_run:
        return DataResult("dry_run", data_dir, os.path.abspath(src), tuple(entries),
                          bk_version=str(doc.get("bk_version")))
    uid = _owner(service)
    if os.path.isdir(data_dir):
        st = os.stat(data_dir)
        owner, mode = (st.st_uid, st.st_gid), st.st_mode & 0o777
    else:
        gid = service.settings["service_gid"] if service.shared else None
        owner = (uid, gid if gid is not None else os.getegid())
        try:
            mode = int(str(doc.get("data_dir_mode", "0700")), 8) & 0o755
        except ValueError:
            mode = 0o700
    store.restore(os.path.abspath(src), data_dir, entries, owner=owner, dir_mode=mode)
    return DataResult("restored", data_dir, os.path.abspath(src), tuple(entries),
                      bk_version=str(doc.get("bk_version")))
