"""The ledger's health, for ``bk doctor``: read-only checks of the data
directory, the ledger, its backups, the audit log and the writers' lock
(``check``), and the deployment probe (``probe``, ``bk doctor --probe``),
which tries for real the writes a commit relies on.

They read the files the way ``bk.store.ledger.Store`` does (its paths, its
safety rule, its parser) but are no part of a transaction, so they live
beside it: ``ledger.py`` is the commit protocol and nothing else.
"""

from __future__ import annotations

import os

from bk.core import ledgerdoc
from bk.core.errors import BkError, WrongAccount
from bk.core.timegrid import counted
from bk.store.fsutil import open_dir, open_file, open_subdir, replace_file, unlink_quietly
from bk.store.ledger import AUDIT, BACKUPS, LEDGER, LOCK, TMP_PREFIX
from bk.store.lock import FileLock
from bk.store.lock import probe as lock_probe

# Checks of files that only the owner may open in shared mode (see check()).
PRIVATE_TO_OWNER = ("audit log", "lock")


def check(store) -> list[tuple[str, bool, str]]:
    """Read-only health checks for ``bk doctor``: (name, ok, detail)."""
    out = []
    seen: dict = {}    # the ledger's check reads it in full; the audit log's compares with that read
    for name, test in (("data directory", _check_dir), ("ledger", _check_ledger),
                       ("backups", _check_backups), ("audit log", _check_audit), ("lock", _check_lock)):
        try:
            out.append((name, *test(store, seen)))
        except BkError as e:
            if name in PRIVATE_TO_OWNER and not store.private and os.geteuid() not in (0, store.safety.uid):
                # On a shared server the audit log and the lock belong to
                # the service account alone; an ordinary user's doctor
                # cannot read them, and must not call that a fault.
                out.append((name, True, "readable only by the service account; "
                                        "sudo bk doctor checks it"))
                continue
            out.append((name, False, e.message + (f" (hint: {e.hint})" if e.hint else "")))
        except OSError as e:
            out.append((name, False, str(e)))
    return out

def _check_dir(store, seen):
    got = store._in_dir(lambda fd: (os.fstat(fd), os.fstatvfs(fd), os.listdir(fd)))
    if got is None:
        return True, f"{store.paths.data_dir} does not exist yet; the first write creates it"
    st, vfs, names = got
    mode, free = st.st_mode & 0o7777, vfs.f_bavail * vfs.f_frsize
    detail = f"{store.paths.data_dir}: mode {mode:04o}, uid {st.st_uid}, {free >> 20} MiB free"
    temps = sum(n.startswith(TMP_PREFIX) for n in names)
    if temps:
        detail += f"; {temps} temp files of an interrupted write (the next write removes them)"
    if store.private and mode & 0o077:
        return False, detail + f"; private mode expects 0700 (chmod 700 {store.paths.data_dir})"
    return free >= store.min_free, detail

def _check_ledger(store, seen):
    # The full invariant check, whatever the seal says: doctor is where
    # a reader's trust in the seal is itself checked.
    got = seen["read"] = store.read(verify=True)
    st = got.state
    if got.source != "ledger":
        return got.source == "empty", (got.warnings[0] if got.warnings else "no ledger yet")
    bound = "policy not bound yet" if st.policy is None else "policy " + ", ".join(
        f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in sorted(st.policy.items()))
    n = len(st.reservations)
    seal = ledgerdoc.sealed(store._in_dir(lambda fd: store._read(fd, LEDGER, store.paths.ledger)) or b"")
    seal_note = {True: "", None: "; not sealed (written by an older bk or rewritten by hand): reads "
                                 "check it in full until the next write seals it",
                 False: "; its seal does not match its bytes (edited in place?): reads check it in "
                        "full until the next write seals it"}[seal]
    return True, f"valid: commit {st.seq}, {counted(n, 'booking')}; {bound}{seal_note}"

def _check_backups(store, seen):
    def valid(data: bytes | None) -> bool:
        # A backup is a committed ledger's bytes: a matching seal says
        # they are what a writer checked, with no parse (a torn copy
        # loses its seal).  Only one without a matching seal is parsed,
        # as the fallback in _load_once would parse it.
        if data is None:
            return False
        return ledgerdoc.sealed(data) or not store._parse(data)[2]

    def scan(dirfd):
        names = store._backup_names(dirfd)
        bfd = open_subdir(dirfd, BACKUPS, store.paths.backups_dir, store.safety)
        if bfd is None:
            return [], []
        try:
            return names, [n for n in names if valid(
                store._read(bfd, n, os.path.join(store.paths.backups_dir, n)))]
        finally:
            os.close(bfd)
    names, good = store._in_dir(scan, ([], []))
    if not names:
        return True, "none yet"
    bad = [n for n in names if n not in good]
    detail = f"{len(good)} of {len(names)} valid, newest {names[0]}"
    if bad:   # a backup that cannot be read is no backup: say which
        detail += "; invalid: " + ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    return not bad, detail

def _check_audit(store, seen):
    from bk.store import audit, segments

    tail = store.audit_tail(limit=1, include_pending=False)
    seq = (seen.get("read") or store.read()).state.seq
    last = tail.entries[-1]["seq"] if tail.entries else 0
    if last > seq:
        lost = store.lost_commits()
        records = lost[2] if lost else []
        return False, (f"audit log has commits the ledger lacks ({seq + 1}-{last}): "
                       f"{audit.describe_lost(records)}; writes are refused until they are restored "
                       "or the loss is accepted (bk admin data recover)")
    agree = (f"agrees with the ledger (commit {seq})" if last == seq else
             f"commit {seq}'s records are in the ledger's journal; the next write adds them")
    # Only a torn last line is harmless (the next writer cuts it and the
    # ledger's journal holds its records); any other damage is a problem.
    torn_only = all("incomplete" in p for p in tail.problems)
    start = _audit_start(store)
    problems = list(tail.problems[:3]) + ([start] if start else [])
    sealed = store.audit_segments()
    if sealed:
        problems.append(segments.describe(sealed))
    bad = any(why for _n, why in sealed)
    return torn_only and not start and not bad, "; ".join([agree] + problems)

def _audit_start(store) -> str | None:
    from bk.store import audit

    def first(dirfd):
        fd = open_file(dirfd, AUDIT, store.paths.audit, store.safety)
        if fd is None:
            return None
        try:
            return audit.head_problem(fd)
        finally:
            os.close(fd)
    return store._in_dir(first)

def _check_lock(store, seen):
    state, pid = store._in_dir(lambda fd: lock_probe(fd, LOCK, store.paths.lock, store.safety),
                              ("missing", None))
    if state == "held":
        return True, f"held by {f'process {pid}' if pid else 'a writer'} right now"
    return True, "free" if state == "free" else "no lock file yet"

# --- deployment probe (bk doctor --probe) -----------------------------------

def probe(store, lock_wait: float = 2.0) -> list[tuple[str, bool, str]]:
    """The writes a commit relies on, tried for real in the data
    directory: a temp file written, fsync'ed, renamed over another name
    and the directory fsync'ed; then the writers' lock taken and
    released.  The probe file carries the temp prefix, so one left by a
    crash is removed by the next commit like any other."""
    if os.geteuid() != store.safety.uid:
        raise WrongAccount(f"only uid {store.safety.uid} may write {store.paths.data_dir}",
                           "on a shared server the broker runs this probe")
    out = []
    dirfd = open_dir(store.paths.data_dir, store.safety, create_mode=store.modes.dir)
    try:
        name = f"{TMP_PREFIX}probe-{os.getpid()}"
        t0 = store.monotonic()
        try:
            unlink_quietly(dirfd, name)        # a probe of ours that was killed
            replace_file(dirfd, name + ".done", store.paths.data_dir, b"bk doctor --probe\n",
                         store.modes.ledger, tmp=name)
            unlink_quietly(dirfd, name + ".done")
            ms = (store.monotonic() - t0) * 1000
            out.append(("atomic replace", True, f"write, fsync, rename and directory fsync in "
                                                f"{store.paths.data_dir} took {ms:.1f} ms"))
        except BkError as e:
            out.append(("atomic replace", False, e.message))
        t0 = store.monotonic()
        try:
            lock = FileLock(dirfd, LOCK, store.paths.lock, store.safety, mode=store.modes.lock,
                            timeout=min(store.lock_timeout, lock_wait), what="the ledger",
                            monotonic=store.monotonic, sleep=store.sleep)
            with lock:
                pass
            out.append(("locking", True, f"flock on {store.paths.lock} taken and released in "
                                         f"{(store.monotonic() - t0) * 1000:.1f} ms"))
        except BkError as e:
            out.append(("locking", False, e.message))
    finally:
        os.close(dirfd)
    return out
