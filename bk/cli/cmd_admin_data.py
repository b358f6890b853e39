"""``bk admin data backup|verify|clear|restore``: the ledger's files as a
whole (``recover`` is in ``bk.cli.cmd_admin``).

Root only (exit 5) before anything is read.  These work on the files
themselves and run here, not through the broker.
"""

from __future__ import annotations

import argparse

from bk.cli.common import need_root
from bk.cli.render import Output, safe
from bk.core.errors import EXIT_PARTIAL, UsageError
from bk.core.timegrid import counted

RAW = argparse.RawDescriptionHelpFormatter


# ------------------------------------------------------------- registration


def register_data(dacts) -> None:
    b = dacts.add_parser("backup", help="copy the data directory, with a checksummed manifest",
                         description="Copy the ledger, its backups, the archive, the audit log and the "
                         "usage history (bk's files only; others are named and left out) into DIR, which it "
                         "creates 0700 (an existing DIR must be root's, 0700 and empty; every directory above "
                         "it only root's to change), with manifest.json: the bk version and a SHA-256 per "
                         "file. The services may run: it holds the writers' lock meanwhile. A backup that "
                         "fails (a full disk) is removed.",
                         epilog="Examples:\n  sudo bk admin data backup\n"
                                "  sudo bk admin data backup /srv/backup/gpubk-2026-07-13",
                         formatter_class=RAW)
    b.add_argument("dir", nargs="?", metavar="DIR",
                   help="where (default: DATA_DIR-backups/STAMP next to the data directory)")
    b.add_argument("--dry-run", action="store_true", help="say where; copy nothing")
    b.set_defaults(handler=run_data_backup, command="admin data backup")
    v = dacts.add_parser("verify", help="check every file of a backup against its manifest",
                         description="Check every checksum of a backup; exit 1 naming each file that is "
                                     "missing, changed, not in the manifest, or not a file bk keeps. A backup "
                                     "anyone but root could have changed (a directory or file not root's, or "
                                     "writable by group or others, or below such a directory) is refused "
                                     "(exit 78).",
                         epilog="Examples:\n  sudo bk admin data verify /var/lib/gpubk-backups/20260713T180000Z",
                         formatter_class=RAW)
    v.add_argument("dir", metavar="DIR")
    v.set_defaults(handler=run_data_verify, command="admin data verify")
    c = dacts.add_parser("clear", help="back up, then empty the data directory (services stopped)",
                         description="Back up the data directory (and verify the copy), then remove "
                         "everything in it. The services must be stopped: the broker must not answer on "
                         "its socket and no process may hold a writer's lock (else exit 75).",
                         epilog="Examples:\n  sudo systemctl stop gpubk-broker gpubk-monitor\n"
                                "  sudo bk admin data clear --yes",
                         formatter_class=RAW)
    c.add_argument("--backup-dir", metavar="DIR", help="where the backup goes (default as for backup)")
    c.add_argument("-y", "--yes", action="store_true", help="do not ask")
    c.add_argument("--dry-run", action="store_true", help="say what would go; change nothing")
    c.set_defaults(handler=run_data_clear, command="admin data clear")
    r = dacts.add_parser("restore", help="restore a backup into an empty data directory",
                         description="Verify the backup, then copy it into the data directory, which must "
                         "be empty (bk admin data clear empties it): bk's files only, owned by the service "
                         "account (monitor/ and usage/ by the monitor account) with the modes bk gives them, "
                         "whatever the manifest says. The services must be stopped (else exit 75).",
                         epilog="Examples:\n  sudo bk admin data restore /var/lib/gpubk-backups/20260713T180000Z --yes",
                         formatter_class=RAW)
    r.add_argument("dir", metavar="DIR")
    r.add_argument("-y", "--yes", action="store_true", help="do not ask")
    r.add_argument("--dry-run", action="store_true", help="verify and say what would be restored")
    r.set_defaults(handler=run_data_restore, command="admin data restore")


def _data_dir(app, call) -> str:
    from bk.service import Empty

    return app.run("info", Empty(), call=call)["data_dir"]


def _files_text(result) -> str:
    total = sum(e.size for e in result.files)
    return f"{counted(len(result.files), 'file')}, {counted(total, 'byte')}"


def run_data_backup(args, ctx) -> Output:
    need_root("data backup")
    from bk.service import DataRequest

    result = ctx.app().run("data_backup", DataRequest(args.dir, args.dry_run), call=ctx.call())
    if result.status == "dry_run":
        return Output("admin data backup", result.to_json(), f"would back up {result.data_dir} to {result.backup_dir}")
    left = (f"\nleft out, not bk's: {', '.join(safe(p) for p in result.skipped)}" if result.skipped else "")
    return Output("admin data backup", result.to_json(),
                  f"backed up {result.data_dir} to {result.backup_dir} ({_files_text(result)}){left}\n"
                  f"check it with: sudo bk admin data verify {result.backup_dir}", done=f"backup {result.backup_dir}")


def _problems_text(result) -> str:
    return "\n".join(f"  {p.why}: {safe(p.path)}" for p in result.problems)


def run_data_verify(args, ctx) -> Output:
    need_root("data verify")
    from bk.service import DataRequest

    result = ctx.app().run("data_verify", DataRequest(args.dir), call=ctx.call())
    if result.problems:
        return Output("admin data verify", result.to_json(),
                      f"{result.backup_dir} does NOT verify:\n{_problems_text(result)}", exit_code=EXIT_PARTIAL)
    return Output("admin data verify", result.to_json(),
                  f"{result.backup_dir}: every checksum matches ({_files_text(result)}, bk {result.bk_version})")


def _unconfirmed(args, ctx, command: str, words) -> Output | None:
    """The answer when a command that replaces the data directory is not
    confirmed (None: go on).  ``--yes`` or ``--dry-run`` confirm; elsewhere a
    terminal is asked and no terminal is a usage error.  ``words(data_dir)``
    gives the refusal, its hint and the question."""
    if args.yes or args.dry_run:
        return None
    refusal, hint, question = words(_data_dir(ctx.app(), ctx.call()))
    if not ctx.interactive:
        raise UsageError(refusal, hint=hint)
    if ctx.confirm(question):
        return None
    return Output(command, {"status": "declined"}, "nothing changed", exit_code=EXIT_PARTIAL)


def run_data_clear(args, ctx) -> Output:
    need_root("data clear")
    from bk.service import DataRequest

    app, call = ctx.app(), ctx.call()
    declined = _unconfirmed(args, ctx, "admin data clear", lambda data_dir: (
        f"bk admin data clear empties {data_dir}; confirm with --yes", "it backs up first; look with --dry-run",
        f"Back up, then empty {data_dir}?"))
    if declined:
        return declined
    result = app.run("data_clear", DataRequest(args.backup_dir, args.dry_run), call=call)
    if result.status == "dry_run":
        return Output("admin data clear", result.to_json(),
                      f"would back up to {result.backup_dir}, then remove from {result.data_dir}: "
                      + ", ".join(result.removed))
    if not result.removed:
        return Output("admin data clear", result.to_json(), f"{result.data_dir} is already empty")
    return Output("admin data clear", result.to_json(),
                  f"backed up to {result.backup_dir} ({_files_text(result)}), then emptied {result.data_dir}",
                  done=f"cleared {result.data_dir}")


def run_data_restore(args, ctx) -> Output:
    need_root("data restore")
    from bk.service import DataRequest

    app, call = ctx.app(), ctx.call()
    declined = _unconfirmed(args, ctx, "admin data restore", lambda data_dir: (
        f"confirm restoring {args.dir} into {data_dir} with --yes", "look first with --dry-run",
        f"Restore {args.dir} into {data_dir}?"))
    if declined:
        return declined
    result = app.run("data_restore", DataRequest(args.dir, args.dry_run), call=call)
    if result.status == "tampered":
        return Output("admin data restore", result.to_json(),
                      f"{result.backup_dir} does NOT verify; nothing restored:\n{_problems_text(result)}",
                      exit_code=EXIT_PARTIAL)
    verb = "would restore" if result.status == "dry_run" else "restored"
    return Output("admin data restore", result.to_json(),
                  f"{verb} {result.backup_dir} ({_files_text(result)}) into {result.data_dir}",
                  done=None if result.status == "dry_run" else f"restored {result.data_dir}")
