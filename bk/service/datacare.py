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
    skipped: tuple = ()          # backup: what is in the data directory but is not bk's

    def to_json(self) -> dict:
        return {"status": self.status, "data_dir": self.data_dir, "backup_dir": self.backup_dir,
                "files": [e.to_json() for e in self.files], "problems": [p.to_json() for p in self.problems],
                "removed": list(self.removed), "bk_version": self.bk_version, "skipped": list(self.skipped)}


def default_dir(data_dir: str, now: int) -> str:
    stamp = format_utc(now).replace("-", "").replace(":", "")
    parent = os.path.dirname(os.path.abspath(data_dir).rstrip("/"))
    return os.path.join(parent, os.path.basename(data_dir.rstrip("/")) + "-backups", stamp)


def _owner(service) -> int:
    uid = service.settings["service_uid"] if service.shared else None
    return uid if uid is not None else os.geteuid()


def _socket(service) -> str | None:
    return service.settings["socket"] if service.shared else None


def _shared(service) -> bool:
    return bool(service.shared)


def _backup(service, dest: str | None, *, now: int, dry_run: bool = False) -> DataResult:
    from bk import __version__

    data_dir = service.settings.data_dir
    dest = os.path.abspath(dest or default_dir(data_dir, now))
    if dry_run:
        return DataResult("dry_run", data_dir, dest, bk_version=__version__)
    entries, skipped = store.backup(data_dir, dest, owner_uid=_owner(service), bk_version=__version__,
                                    now_iso=format_utc(now), shared=_shared(service),
                                    lock_timeout=service.settings["lock_timeout_seconds"])
    return DataResult("backed_up", data_dir, dest, tuple(entries), bk_version=__version__, skipped=tuple(skipped))


def _verify(service, src: str) -> DataResult:
    doc, entries, problems = store.verify(os.path.abspath(src), shared=_shared(service))
    return DataResult("tampered" if problems else "verified", service.settings.data_dir, os.path.abspath(src),
                      tuple(entries), tuple(problems), bk_version=str(doc.get("bk_version")))


def _clear(service, dest: str | None, *, now: int, dry_run: bool = False) -> DataResult:
    """Back up, verify the copy, then empty the data directory."""
    data_dir = service.settings.data_dir
    store.guard_stopped(data_dir, _socket(service))
    if not os.path.isdir(data_dir) or not os.listdir(data_dir):
        return DataResult("cleared", data_dir)
    if dry_run:
        return DataResult("dry_run", data_dir, os.path.abspath(dest or default_dir(data_dir, now)),
                          removed=tuple(sorted(os.listdir(data_dir))))
    made = _backup(service, dest, now=now)
    _doc, _entries, problems = store.verify(made.backup_dir, shared=_shared(service))
    if problems:
        raise InvalidInput(f"the backup {made.backup_dir} does not verify ({problems[0].path} "
                           f"{problems[0].why}); nothing was cleared")
    store.guard_stopped(data_dir, _socket(service))
    removed = store.clear(data_dir)
    return DataResult("cleared", data_dir, made.backup_dir, made.files, removed=tuple(removed),
                      bk_version=made.bk_version)


def _restore(service, src: str, *, dry_run: bool = False) -> DataResult:
    data_dir = service.settings.data_dir
    store.guard_stopped(data_dir, _socket(service))
    doc, entries, problems = store.verify(os.path.abspath(src), shared=_shared(service))
    if problems:
        return DataResult("tampered", data_dir, os.path.abspath(src), tuple(entries), tuple(problems),
                          bk_version=str(doc.get("bk_version")))
    if os.path.isdir(data_dir) and os.listdir(data_dir):
        raise InvalidInput(f"the data directory {data_dir} is not empty; restore writes only into an empty one",
                           hint="sudo bk admin data clear (it backs up first), then restore")
    if dry_run:
        return DataResult("dry_run", data_dir, os.path.abspath(src), tuple(entries),
                          bk_version=str(doc.get("bk_version")))
    owners, dir_owner, dir_mode = _restored_owners(service)
    store.restore(os.path.abspath(src), data_dir, entries, shared=_shared(service), owners=owners,
                  dir_owner=dir_owner, dir_mode=dir_mode)
    return DataResult("restored", data_dir, os.path.abspath(src), tuple(entries),
                      bk_version=str(doc.get("bk_version")))


def _restored_owners(service) -> tuple[dict, tuple[int, int], int]:
    """Who owns what a restore writes, and the data directory's owner and
    mode when it must be made: this server's configuration decides, never
    the backup (``store.known``: the files' modes).  An existing data
    directory keeps its owner and mode (the install made it)."""
    from bk.store.snapshot import monitor_owner

    settings = service.settings
    uid = _owner(service)
    gid = settings["service_gid"] if service.shared else None
    gid = gid if gid is not None else os.getegid()
    mode = 0o700
    if service.shared:
        mode = 0o755
        if settings["access"] == "group" and settings["group"]:
            import grp

            try:
                gid = grp.getgrnam(settings["group"]).gr_gid
            except KeyError:
                raise InvalidInput(f"the configured group {settings['group']!r} does not exist",
                                   hint="create it, or fix 'group' in the configuration") from None
            mode = 0o750
    owner = (uid, gid)
    if os.path.isdir(settings.data_dir):
        st = os.stat(settings.data_dir)
        owner, mode = (st.st_uid, st.st_gid), st.st_mode & 0o777
    monitor = monitor_owner(settings) if service.shared else uid
    return {"service": (owner[0], owner[1]), "monitor": (monitor, owner[1])}, owner, mode


# ------------------------------------------------------------ the rows

@dataclass(frozen=True)
class DataRequest:
    dir: str | None = None            # backup, clear: where the backup goes; verify, restore: the backup
    dry_run: bool = False


def _serve_backup(service, req: DataRequest, call) -> DataResult:
    return _backup(service, req.dir, now=call.now, dry_run=req.dry_run)


def _serve_verify(service, req: DataRequest, call) -> DataResult:
    if not req.dir:
        raise InvalidInput("which backup?", hint="bk admin data verify DIR")
    return _verify(service, req.dir)


def _serve_clear(service, req: DataRequest, call) -> DataResult:
    return _clear(service, req.dir, now=call.now, dry_run=req.dry_run)


def _serve_restore(service, req: DataRequest, call) -> DataResult:
    if not req.dir:
        raise InvalidInput("which backup?", hint="bk admin data restore DIR")
    return _restore(service, req.dir, dry_run=req.dry_run)
