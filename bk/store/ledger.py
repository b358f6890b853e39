"""The Store: the only code that reads and writes the ledger.

The facts (fsutil and lock say how the kernel behaves): a rename within a
directory is atomic and durable once the directory is fsync-ed; a file's
data is durable once the file is fsync-ed; an ``flock`` dies with its
holder; appends can tear.  The consequences, as a protocol (the step names
are those of the ``BK_TEST_CRASH_AT`` test hook):

 1. ``locked``   take the writers' lock (bounded wait, then ``Busy``).
 2. ``read``     read and validate the ledger; an invalid one falls back to
                 the newest valid backup, none valid refuses (exit 74).
 3. ``repaired`` complete the audit log from the ledger's journal: the
                 ledger carries its own commit's audit records, so records a
                 crash kept from the log are appended now, a torn last line
                 is cut off first.
 4. ``applied``  check the bound policy and let the caller change a copy.
 5. ``archived`` append long-ended bookings to the archive and fsync it.
 6. ``audit_synced``  fsync the audit log: the previous commit's records
                 are durable before the journal that holds them is replaced.
 7. ``tmp_written``, ``tmp_synced``: the new document in a temp file of
                 the same directory, then fsync.
 8. ``replaced`` ``os.replace`` over the ledger: the commit point.
 9. ``dir_synced``  fsync the directory: the commit is durable.
10. ``audit_appended``  append this commit's records (not synced; step 6 of
                 the next commit or step 3 after a power loss covers them).
11. ``backup_written``  a copy in backups/ (not synced: a torn backup fails
                 validation and the next older one is used); rotate.

After step 10, a log past its segment size is rotated (``bk.store.segments``:
older commits sealed into audit.d/, ``segment_written`` the test step);
a failure there is a warning, never an undone commit.  This module is the
transaction; ``bk.store.audit`` is the journal's format and the live log,
``bk.store.segments`` its sealed past.

A crash before 8 leaves the old ledger (and maybe a stale temp file, removed
by the next writer); at or after 8 the new one.  The audit log never holds
a record of a commit that is not in the ledger, because records reach the
log only after step 9.  Readers never lock: they open the ledger and see
one complete version.  docs/ARCHITECTURE.md ("Storage") has the details.
"""

from __future__ import annotations

# _thread, not threading: its lock is all a transaction needs, and threading's
# import (weakref sets, the main thread's bookkeeping) is paid by every command.
import _thread
import gc
import os
import time

from bk.core import ledgerdoc, utctime
from bk.core.errors import BkError, ConfigError, Internal, IOFailure, LostCommits, WrongAccount
from bk.core.models import LedgerState, Mutation
from bk.core.record import dataclass
from bk.store.fsutil import (
    NamePattern,
    Safety,
    ensure_free,
    io_error,
    keep_newest,
    open_dir,
    open_file,
    open_subdir,
    read_all,
    read_file,
    replace_file,
    unlink_quietly,
    write_all,
    write_new,
)

TYPE_CHECKING = False
if TYPE_CHECKING:   # annotations only: collections.abc would import collections
    from collections.abc import Callable

    from bk.core import ledgercheck

# bk.store.archive, .audit and .segments are the writer's and the history
# views' (about 1 ms to load): a read imports none of them (Store.segments),
# nor bk.store.lock: reads take no lock.


def _token_hex(nbytes: int) -> str:
    # os.urandom directly: the secrets module pulls in hmac and OpenSSL's
    # hashlib, a start-up cost every command would pay for a temp-file name.
    return os.urandom(nbytes).hex()

LEDGER, LOCK, AUDIT, BACKUPS, ARCHIVE = "ledger.json", "ledger.lock", "audit.jsonl", "backups", "archive"
# What Store.report is told: each a problem a person must act on (the
# broker logs it at the priority bk.broker.handlers gives the kind).
NO_VALID_LEDGER, LOST_COMMITS, RECOVERED, ACCEPTED_LOSS, LOCK_REPLACED = (
    "no_valid_ledger", "lost_commits", "recovered", "accepted_loss", "lock_replaced")
REPORTS = (NO_VALID_LEDGER, LOST_COMMITS, RECOVERED, ACCEPTED_LOSS, LOCK_REPLACED)
TMP_PREFIX = ".ledger.json.tmp-"
BACKUP_NAME = NamePattern("ledger-", 10, ".json")
CRASH_ENV = "BK_TEST_CRASH_AT"
SCAN_PAUSE_ENV = "BK_TEST_SCAN_PAUSE"       # tests only: FIFO[:UID], see testhooks.park
STEPS = ("locked", "read", "repaired", "applied", "archived", "audit_synced", "tmp_partial",
         "tmp_written", "tmp_synced", "replaced", "dir_synced", "audit_partial",
         "audit_appended", "backup_written")


@dataclass(frozen=True)
class Modes:
    dir: int
    ledger: int
    lock: int
    audit: int


# Shared mode: clients read the ledger, its backups and the archive directly
# (0644); the audit log is for the service account and its group (0640),
# users see their trail through the broker; only writers open the lock.
PRIVATE = Modes(dir=0o700, ledger=0o600, lock=0o600, audit=0o600)
SHARED = Modes(dir=0o755, ledger=0o644, lock=0o600, audit=0o640)


@dataclass(frozen=True)
class StorePaths:
    data_dir: str
    ledger: str
    lock: str
    audit: str
    backups_dir: str
    archive_dir: str


@dataclass
class ReadResult:
    state: LedgerState
    warnings: list[str]
    source: str                      # "ledger", "backup:NAME" or "empty"
    partial: bool = False            # only the reservations ``keep`` asked for (never to commit)


@dataclass
class _Loaded:
    state: LedgerState
    meta: ledgerdoc.DocMeta
    source: str
    warnings: list[str]
    damaged: bytes | None = None     # the invalid ledger a backup stands in for
    data: bytes | None = None        # the ledger's bytes (source "ledger")


@dataclass(frozen=True)
class _Kept:
    """What this Store last committed (or read under the lock), and the
    bytes of the file that holds it (``Store._kept_state`` compares them).
    ``state`` is never changed: transactions and readers get copies."""

    state: LedgerState
    meta: ledgerdoc.DocMeta
    data: bytes
    checked: ledgercheck.Checked | None      # set when this Store ran the check (its own commit)
    encoded: object                          # bk.core.docparts.Encoded: its records' bytes (its own commit), or None
    earliest: float                         # archive.earliest_close of the bookings, or less


def _own_copy(state: LedgerState) -> LedgerState:
    """A copy that may be changed in every part without touching ``state``
    (``LedgerState.copy`` shares the policy and the top-level extras)."""
    c = state.copy()
    c.policy = ledgerdoc.plain_copy(state.policy)
    c.extra = ledgerdoc.plain_copy(state.extra)
    return c


def _now() -> int:
    return int(time.time())


class _gc_paused:  # noqa: N801 - used as a function: ``with _gc_paused():``
    """Decoding and encoding a ledger allocates about ten objects per
    booking, none of which form reference cycles; CPython's cyclic
    collector would still walk them all several times (a quarter of a
    10,000-booking commit).  Collection is paused for the duration.  (A
    class, not contextlib.contextmanager: contextlib imports collections
    and functools, which a read need not pay for.)"""

    __slots__ = ("was",)

    def __enter__(self):
        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc) -> None:
        if self.was:
            gc.enable()


class Store:
    def __init__(self, data_dir: str, *, private: bool = True, lock_timeout: float = 10.0,
                 backup_keep: int = 10, retention_days: int = 90, archive_after_hours: int = 24,
                 owner_uid: int | None = None, clock: Callable[[], int] = _now,
                 monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, capacity: int | None = None,
                 min_free_bytes: int = 1 << 20, audit_retention_days: int = 400,
                 audit_segment_bytes: int | None = None):
        data_dir = os.path.abspath(data_dir)
        j = os.path.join
        self.paths = StorePaths(data_dir, j(data_dir, LEDGER), j(data_dir, LOCK),
                                j(data_dir, AUDIT), j(data_dir, BACKUPS), j(data_dir, ARCHIVE))
        self.private = private
        self.modes = PRIVATE if private else SHARED
        self.safety = Safety(os.geteuid() if owner_uid is None else owner_uid)
        self.lock_timeout, self.backup_keep = lock_timeout, max(backup_keep, 0)
        self.retention = retention_days * 86400
        self.archive_after = archive_after_hours * 3600
        self.clock, self.monotonic, self.sleep = clock, monotonic, sleep
        self.capacity, self.min_free = capacity, min_free_bytes
        self.audit_retention = audit_retention_days * 86400
        self._segment_bytes = audit_segment_bytes
        self._segments = None
        self._tlock = _thread.allocate_lock()
        self._active: int | None = None
        self._valid: bytes | None = None       # the last ledger bytes known to validate
        self._kept: _Kept | None = None          # see _kept_state
        self._seen: ReadResult | None = None       # check(): the ledger check's read
        self._crash = self._scan_pause = None
        self._crash_hits = 0
        crash, pause = os.environ.get(CRASH_ENV), os.environ.get(SCAN_PAUSE_ENV)
        if crash or pause:                          # tests only: bk.store.testhooks
            from bk.store import testhooks

            self._crash = testhooks.crash_point(crash, STEPS)
            self._scan_pause = testhooks.scan_pause(pause)
        # Called before each block an audit scan reads: the broker's hook to
        # let a commit in progress finish first (None: never pause).
        self.pause: Callable[[], object] | None = None
        # Told (kind, message) of what a person must know about this data:
        # REPORTS.  The broker logs them; None: nobody listens.
        self.report: Callable[[str, str], None] | None = None

    @property
    def segments(self):
        """The sealed audit segments (``bk.store.segments``), made on first use."""
        if self._segments is None:
            from bk.store import segments

            self._segments = segments.Segments(self.paths.data_dir, self.safety, file_mode=self.modes.audit,
                                               dir_mode=0o700 if self.private else 0o750)
        return self._segments

    @property
    def audit_segment_bytes(self) -> int:
        """The live log's size past which a commit seals its older part."""
        if self._segment_bytes is None:
            from bk.store import segments

            self._segment_bytes = int(os.environ.get(segments.SEGMENT_ENV) or segments.SEGMENT_BYTES)
        return self._segment_bytes

    # --- reading -----------------------------------------------------------

    def read(self, *, verify: bool = False, keep: ledgerdoc.DocKeep | None = None) -> ReadResult:
        """The committed ledger, validated, without taking the lock.  With
        ``verify`` the invariants are checked even when the seal matches
        (``bk doctor``).  ``keep``: the reservations the caller will look
        at; a sealed ledger builds only those (``partial``), any other is
        read whole, since its check needs every record."""
        dirfd = open_dir(self.paths.data_dir, self.safety)
        if dirfd is None:
            return ReadResult(LedgerState(), [], "empty")
        try:
            kept = None if verify else self._kept_state(dirfd)
            if kept is not None:
                return ReadResult(_own_copy(kept.state), [], "ledger")
            with _gc_paused():
                got = self._load(dirfd, verify, keep)
        finally:
            os.close(dirfd)
        return ReadResult(got.state, got.warnings, got.source, got.meta.partial)

    def _kept_state(self, dirfd: int) -> _Kept | None:
        """The state this Store committed last, if the ledger file still
        holds exactly the bytes it wrote (or read).  The same bytes decode
        to the same state, so nothing a file's stamp can hide (an edit in
        place within one tick of the file system's clock, times put back,
        another inode with the same bytes) makes this wrong; any other
        content (another writer's commit, a restore, a repair by hand,
        damage) reads the file again.  The file is opened with the checks
        of every read (``open_file``).  The broker is the only writer of a
        shared ledger, so there it costs a read of the file and a compare
        (a few MB at C speed) instead of decoding every booking."""
        kept = self._kept
        if kept is None:
            return None
        fd = open_file(dirfd, LEDGER, self.paths.ledger, self.safety)
        if fd is None:
            return None
        try:
            if os.fstat(fd).st_size != len(kept.data) or read_all(fd) != kept.data:
                return None
        except OSError:
            return None
        finally:
            os.close(fd)
        return kept

    def _read(self, dirfd: int, name: str, path: str) -> bytes | None:
        return read_file(dirfd, name, path, self.safety)

    def _parse(self, data: bytes, verify: bool = False, keep=None):
        """Bytes -> (state, meta, problems).  Validation depends only on the
        bytes, so bytes this Store validated (or wrote) before skip the
        invariant check, and so do bytes whose seal matches: a writer
        checked them before it committed them (``ledgerdoc.seal``)."""
        sealed = not verify and ledgerdoc.sealed(data)
        keep = keep if sealed else None
        try:
            doc = ledgerdoc.loads(data) if keep is None else ledgerdoc.loads(data, keep)
        except ValueError as e:
            return None, ledgerdoc.DocMeta(), [f"not valid JSON: {e}"]
        state, meta, problems = ledgerdoc.decode(doc, keep)
        if state is not None and not problems and data != self._valid and not sealed:
            from bk.core import ledgercheck  # only bytes without a seal are checked on reading

            problems = ledgercheck.check_state(state, self.capacity)
            if not problems:
                self._valid = data
        return state, meta, problems

    def _load(self, dirfd: int, verify: bool = False, keep=None) -> _Loaded:
        """The ledger, or the newest valid backup, or an empty state.

        A fallback is only reported if the ledger is still the same file
        afterwards: an unlocked reader that found no ledger may meet the
        backup of the first commit a moment later, and one that read a
        damaged ledger may race the write that repairs it.  Either way a
        writer was at work, and the load starts again."""
        for _attempt in range(3):
            try:
                got = self._load_once(dirfd, verify, keep)
            except IOFailure as e:
                if not hasattr(e, "seen") or self._read(dirfd, LEDGER, self.paths.ledger) == e.seen:
                    raise
                continue
            if got.source == "ledger" or self._read(dirfd, LEDGER, self.paths.ledger) == got.damaged:
                return got
        return got

    def _load_once(self, dirfd: int, verify: bool = False, keep=None) -> _Loaded:
        p = self.paths
        data = self._read(dirfd, LEDGER, p.ledger)
        problems: list[str] = []
        if data is not None:
            state, meta, problems = self._parse(data, verify, keep)
            if not problems:
                return _Loaded(state, meta, "ledger", [], data=data)
            if meta.newer:
                raise ConfigError(
                    f"{p.ledger} was written by a newer bk (format version {meta.version}; this bk "
                    f"reads {ledgerdoc.VERSION})", "upgrade bk on this machine",
                    details={"path": p.ledger, "version": meta.version})
        bad: dict[str, str] = {}
        for name in self._backup_names(dirfd):
            bpath = os.path.join(p.backups_dir, name)
            bdata = self._read_backup(dirfd, name, bpath)
            bstate, bmeta, bprobs = self._parse(bdata, verify, keep) if bdata is not None else (None, None, ["gone"])
            if not bprobs:
                what = ("is missing" if data is None
                        else f"is invalid ({'; '.join(problems[:3])})")
                return _Loaded(bstate, bmeta, f"backup:{name}", [
                    f"THE LEDGER {p.ledger} {what}. Using the newest valid backup {bpath} "
                    f"(commit {bmeta.seq}, written {utctime.format_utc(bmeta.written_at or 0)}); "
                    f"changes after it are lost unless recovered by hand. The next write "
                    f"replaces the ledger and keeps the damaged file as {LEDGER}.damaged-*."],
                    damaged=data)
            bad[name] = bprobs[0]
        if data is None and not bad:
            return _Loaded(LedgerState(), ledgerdoc.DocMeta(), "empty", [])
        err = self._no_valid_copy(problems if data is not None else None, bad)
        err.seen = data          # what was judged, for _load's second look
        raise err

    def _no_valid_copy(self, problems: list[str] | None, bad: dict[str, str]) -> IOFailure:
        p = self.paths
        what = "is missing" if problems is None else f"is invalid: {'; '.join(problems[:5])}"
        # The restored files must belong to the data directory's owner (the
        # service account on a shared server), or the next write refuses them.
        as_owner = "" if self.private else f"sudo -u '#{self.safety.uid}' "
        none = (f"there is no backup in {p.backups_dir}" if not bad else
                f"the one backup in {p.backups_dir} is not valid" if len(bad) == 1 else
                f"none of the {len(bad)} backups in {p.backups_dir} is valid")
        return IOFailure(
            f"no valid ledger: {p.ledger} {what}, and {none}; bk will not write until a valid ledger is in place",
            f"inspect the files, then either restore a copy you trust with "
            f"`{as_owner}cp COPY {p.ledger}.new && {as_owner}mv {p.ledger}.new {p.ledger}`, or "
            f"start an empty ledger (every booking is lost) with `{as_owner}mv {p.ledger} "
            f"{p.ledger}.damaged; {as_owner}mv {p.backups_dir} {p.backups_dir}.damaged`",
            details={"ledger": p.ledger, "problems": problems, "backups": bad})

    def _backup_names(self, dirfd: int) -> list[str]:
        """Backup file names, newest first."""
        bfd = open_subdir(dirfd, BACKUPS, self.paths.backups_dir, self.safety)
        if bfd is None:
            return []
        try:
            return sorted((n for n in os.listdir(bfd) if BACKUP_NAME.match(n)), reverse=True)
        finally:
            os.close(bfd)

    def _read_backup(self, dirfd: int, name: str, path: str) -> bytes | None:
        bfd = open_subdir(dirfd, BACKUPS, self.paths.backups_dir, self.safety)
        try:
            return self._read(bfd, name, path) if bfd is not None else None
        finally:
            if bfd is not None:
                os.close(bfd)

    # --- writing -----------------------------------------------------------

    def transact(self, apply: Callable[[LedgerState], Mutation], *, policy: dict | None,
                 actor_uid: int, actor: str, warnings: list[str] | None = None,
                 accept_loss: tuple[int, int] | None = None) -> object:
        """Run ``apply`` on a fresh copy of the ledger under the lock and
        commit what it changed; returns ``Mutation.result``.  If ``apply``
        raises, nothing is written.  Problems that do not undo the commit
        (a backup that could not be written) are added to ``warnings``.

        When the audit log records commits newer than the ledger that was
        read, the transaction is refused (``LostCommits``) unless
        ``accept_loss`` is exactly (the seq read, the newest audited seq):
        the caller saw that loss and accepts it, and no other."""
        if self._active == _thread.get_ident():
            raise Internal("nested ledger transaction (apply() called transact())")
        with self._tlock:
            self._active = _thread.get_ident()
            try:
                return self._transact(apply, policy, actor_uid, actor,
                                      warnings if warnings is not None else [], accept_loss)
            finally:
                self._active = None

    def _transact(self, apply, policy, actor_uid, actor, warnings, accept_loss=None):
        if os.geteuid() != self.safety.uid:
            raise WrongAccount(
                f"{self.paths.data_dir} belongs to uid {self.safety.uid}; this process runs as "
                f"uid {os.geteuid()} and may not write it",
                "in shared mode every write goes through the broker (bk broker)")
        from bk.store.lock import FileLock

        dirfd = open_dir(self.paths.data_dir, self.safety, create_mode=self.modes.dir)
        try:
            lock = FileLock(dirfd, LOCK, self.paths.lock, self.safety, mode=self.modes.lock,
                            timeout=self.lock_timeout, what="the ledger", monotonic=self.monotonic,
                            sleep=self.sleep, log=lambda line: self._report(LOCK_REPLACED, line))
            with lock, _gc_paused():
                self._step("locked")
                return self._commit(dirfd, apply, policy, actor_uid, actor, warnings, accept_loss)
        finally:
            os.close(dirfd)

    def _commit(self, dirfd, apply, policy, actor_uid, actor, warnings, accept_loss=None):
        from bk.core import docparts, ledgercheck
        from bk.store import archive, audit

        p = self.paths
        now = self.clock()
        self._remove_temps(dirfd)
        kept = self._kept_state(dirfd)
        frame = None
        if kept is not None:
            got = _Loaded(kept.state, kept.meta, "ledger", [])
        else:
            try:
                got = self._load(dirfd)
            except IOFailure as e:
                if "backups" in e.details:           # no valid ledger and no valid backup
                    self._report(NO_VALID_LEDGER, f"{e.message}; fix: {e.hint}")
                raise
        if got.meta.partial:
            raise Internal("a transaction read part of the ledger")
        warnings.extend(got.warnings)
        self._step("read")
        afd = open_file(dirfd, AUDIT, p.audit, self.safety, os.O_RDWR | os.O_APPEND,
                        create_mode=self.modes.audit)
        try:
            try:
                last_seq, repaired = audit.repair(afd, got.meta.journal_seq, got.meta.journal)
            except OSError as e:
                raise io_error(e, "repairing", p.audit) from None
            self._step("repaired")
            if last_seq > got.meta.seq and accept_loss != (got.meta.seq, last_seq):
                # The audit log is the witness: it holds commits newer than
                # what was read (an older backup, or nothing at all).  A
                # commit on top would make their bookings unrecoverable.
                lost = self._lost(got, last_seq)
                self._report(LOST_COMMITS, f"a write was refused: {lost.message} (the ledger {self.paths.ledger}, "
                             f"the audit log {self.paths.audit}); fix: {lost.hint}")
                raise lost
            # What was read stays as it was (it may become the kept state);
            # the transaction changes a copy.
            base, state = got.state, _own_copy(got.state)
            checked = kept.checked if kept is not None else None
            self._bind(state, policy)
            movable = archive.committed(state, now=now, archive_after=self.archive_after,
                                        earliest=kept.earliest if kept is not None else None)
            mutation = apply(state)
            if not isinstance(mutation, Mutation):
                raise Internal(f"apply() returned {type(mutation).__name__}, not a Mutation")
            if mutation.state is not None:
                state = mutation.state
            self._step("applied")
            recovering = got.source != "ledger" and got.source != "empty"
            if not mutation.changed and not recovering:
                if repaired:
                    self._sync_audit(afd)
                if kept is None and got.source == "ledger" and got.data is not None:
                    self._kept = _Kept(base, got.meta, got.data, None, None,
                                       archive.earliest_close(base.reservations))
                return mutation.result
            state.seq = max(got.meta.seq, last_seq) + 1
            items = [a.to_dict() if hasattr(a, "to_dict") else a for a in mutation.audit] \
                or [{"action": "commit", "result": "ok"}]
            if recovering:
                items.insert(0, {"action": "recover", "result": "ok",
                                 "before": {"ledger": "invalid" if got.damaged else "missing"},
                                 "after": {"source": got.source, "seq": got.meta.seq}})
            records = audit.make_records(items, seq=state.seq, time=utctime.format_utc(now),
                                         uid=actor_uid, user=actor)
            # With the state this Store committed last, what the transaction
            # changed is all that needs checking (ledgercheck.Checked) and
            # encoding (docparts.Encoded); the archive's scan is skipped
            # while no booking has closed long enough to move.
            if kept is None and got.source == "ledger" and got.data is not None:
                # Bytes another process committed, checked whole: by this
                # Store as it read them (unsealed), or by their writer
                # (sealed).  What this transaction changed is then all there
                # is to check (ledgercheck.Checked, .trusted) and, sealed, to
                # encode (ledgerframe.Framed).
                if ledgerdoc.sealed(got.data):
                    from bk.core import ledgerframe

                    checked = ledgercheck.trusted(base, self.capacity)
                    frame = ledgerframe.framed(got.data, base, got.meta)
                elif got.data == self._valid:
                    checked = ledgercheck.Checked(base, self.capacity)
            delta = earliest = None
            if checked is not None:
                delta = ledgerdoc.Delta.of(checked.reservations, state.reservations)
                if delta is not None and kept is not None:
                    earliest = min(kept.earliest, archive.earliest_close(delta.fresh))
            listed = state.reservations
            moved = archive.split(state, now=now, archive_after=self.archive_after,
                                  retention=self.retention, movable=movable, earliest=earliest)
            if state.reservations is not listed:
                delta = None
            if earliest is not None and (earliest <= now - self.archive_after or earliest < now - self.retention):
                earliest = None          # split looked at every booking: _keep finds the exact one
            problems, checked = ledgercheck.check_next(state, self.capacity, checked, delta)
            if problems:
                raise Internal("refusing to write an invalid ledger: " + "; ".join(problems[:5]),
                               details={"problems": problems})
            token = _token_hex(8)
            try:
                data, encoded = docparts.document(state, commit=token, written_at=now, journal=records,
                                                   known=kept.encoded if kept is not None else None, delta=delta,
                                                   frame=frame)
                lines = audit.encode(records)
                groups = archive.group(moved, seq=state.seq, now=now)
            except (TypeError, ValueError, RecursionError) as e:
                raise Internal(f"the new ledger cannot be written as JSON: {e}") from None
            need = 2 * len(data) + len(lines) + sum(len(b) for b in groups.values())
            ensure_free(dirfd, p.data_dir, need, self.min_free)
            # Every managed directory is opened and checked before the commit
            # point, so that a refusal (a symlinked backups/) never follows it.
            bfd = open_subdir(dirfd, BACKUPS, p.backups_dir, self.safety,
                              create_mode=self.modes.dir) if self.backup_keep else None
            kept_as = None
            try:
                if got.damaged is not None:
                    kept_as = self._keep_damaged(dirfd, got.damaged, now, warnings)
                self._archive(dirfd, groups, now)
                self._step("archived")
                self._sync_audit(afd)
                self._step("audit_synced")
                self._replace(dirfd, data)
                self._keep(dirfd, state, data, token, now, records, checked, encoded, earliest)
                start = os.fstat(afd).st_size
                self._append_audit(afd, lines, state.seq, warnings)
                self._step("audit_appended")
                self._rotate_audit(dirfd, afd, start, now, warnings)
                if bfd is not None:
                    self._backup(bfd, state.seq, data, warnings)
                self._step("backup_written")
            finally:
                if bfd is not None:
                    os.close(bfd)
            if recovering:
                self._report_recovery(got, state.seq, kept_as)
            if accept_loss is not None and last_seq > got.meta.seq:
                self._report(ACCEPTED_LOSS, f"{p.ledger}: commits {got.meta.seq + 1}-{last_seq}, in the "
                             f"audit log {p.audit} but not in the ledger, were accepted as lost by "
                             f"{actor} (uid {actor_uid}) with bk admin data recover; commit {state.seq} "
                             "writes over them, and the audit log keeps their records")
            return mutation.result
        finally:
            os.close(afd)

    def _keep(self, dirfd: int, state: LedgerState, data: bytes, token: str, now: int, records: list[dict],
              checked, encoded, earliest) -> None:
        """After the commit point: remember what was committed, and its
        bytes (``_kept_state``)."""
        from bk.core import ledgercheck
        from bk.store import archive

        meta = ledgerdoc.DocMeta(version=ledgerdoc.VERSION, seq=state.seq, commit=token, written_at=now,
                                 journal_seq=state.seq, journal=ledgerdoc.canonical(records))
        if earliest is None:
            earliest = archive.earliest_close(state.reservations)
        # Lists of its own, which the kept state, its check and its bytes
        # share (and nothing changes): the caller keeps the state it made.
        kept = _own_copy(state)
        if checked is not None:
            checked = ledgercheck.Checked(kept, self.capacity, checked.by_id, checked.holds, checked.quick)
        if encoded is not None:             # None: a document spliced from the bytes read (ledgerframe.Framed)
            encoded = encoded.bound(kept.reservations, kept.ops)
        self._kept = _Kept(kept, meta, data, checked, encoded, earliest)

    def _bind(self, state: LedgerState, policy: dict | None) -> None:
        """Policy binding (SPEC 5, ``bk.core.policy``): the first write
        records the policy; a writer configured differently refuses.  Keys
        the ledger does not have yet are recorded, not treated as a conflict."""
        from bk.core.policy import policy_diff  # writes only: reads never load it

        if policy is None:
            return
        diff = policy_diff(state.policy, policy)
        if diff.conflicts:
            raise ConfigError(
                f"the configuration disagrees with the policy bound in {self.paths.ledger}: "
                f"{diff.describe()}",
                "the ledger keeps the policy of its first write; put those values back in the "
                "configuration (bk config shows the effective one) or ask the administrator",
                details={"differences": diff.conflicts})
        if diff.additions or state.policy is None:
            state.policy = {**(state.policy or {}), **diff.additions}

    def secure_lock(self) -> None:
        """Take and let go of the writers' lock once, as its owner: a lock
        file others could open, or one an intruder holds, is replaced now
        (``bk.store.lock.acquire``, reported as ``lock_replaced``) rather
        than at the first write.  Nothing to do before the first write."""
        if os.geteuid() != self.safety.uid:
            return
        dirfd = open_dir(self.paths.data_dir, self.safety)
        if dirfd is None:
            return
        try:
            if os.path.lexists(self.paths.lock):
                from bk.store.lock import FileLock

                with FileLock(dirfd, LOCK, self.paths.lock, self.safety, timeout=self.lock_timeout,
                              what="the ledger", monotonic=self.monotonic, sleep=self.sleep,
                              log=lambda line: self._report(LOCK_REPLACED, line)):
                    pass
        finally:
            os.close(dirfd)

    def lost_commits(self) -> tuple[int, int, list[dict]] | None:
        """What the audit log records beyond the ledger that reads now:
        (seq read, newest audited seq, the records of the missing commits),
        or None when nothing is missing."""
        got = self.read()
        tail = self.audit_tail(limit=5000, include_pending=False)
        newest = max((e.get("seq", 0) for e in tail.entries), default=0)
        if newest <= got.state.seq:
            return None
        return got.state.seq, newest, [e for e in tail.entries if e.get("seq", 0) > got.state.seq]

    def _lost(self, got, last_seq: int) -> LostCommits:
        from bk.store import audit

        tail = self.audit_tail(limit=5000, include_pending=False)
        lost = [e for e in tail.entries if e.get("seq", 0) > got.meta.seq]
        where = {"empty": "is missing, and so is every backup"}.get(
            got.source, f"was read from {got.source.removeprefix('backup:')}" if got.source != "ledger"
            else f"is at commit {got.meta.seq}")
        return LostCommits(
            f"the audit log records commits {got.meta.seq + 1}-{last_seq} that the ledger lacks "
            f"(the ledger {where}); " + audit.describe_lost(lost) + "; refusing to write over them",
            hint="put the newer ledger back if you have one; else accept the loss, which the audit "
                 "log keeps: bk admin data recover (sudo on a shared server)",
            details={"ledger_seq": got.meta.seq, "audit_seq": last_seq,
                     "reservations": sorted({e["reservation"] for e in lost if e.get("reservation")})})

    def _archive(self, dirfd: int, groups: dict[str, bytes], now: int) -> None:
        p = self.paths
        create = self.modes.dir if groups else None
        afd = open_subdir(dirfd, ARCHIVE, p.archive_dir, self.safety, create_mode=create)
        if afd is None:
            return
        from bk.store import archive

        try:
            if groups:
                archive.append(afd, p.archive_dir, self.safety, self.modes.ledger, groups)
            archive.prune(afd, p.archive_dir, now - self.retention)
        finally:
            os.close(afd)

    def _sync_audit(self, afd: int) -> None:
        try:
            os.fsync(afd)
        except OSError as e:
            raise io_error(e, "syncing", self.paths.audit) from None

    def _replace(self, dirfd: int, data: bytes) -> None:
        """Steps 7 to 9: temp file, fsync, rename (the commit point), fsync
        the directory.  If syncing the directory fails the commit may not
        survive a power loss: the caller hears so (and may retry with its
        op-id) rather than being told it is durable."""
        replace_file(dirfd, LEDGER, self.paths.data_dir, data, self.modes.ledger,
                     tmp=f"{TMP_PREFIX}{os.getpid()}-{_token_hex(4)}",
                     write=self._write_tmp, step=self._step)

    def _write_tmp(self, fd: int, data: bytes) -> None:
        if self._hit("tmp_partial"):
            write_all(fd, data[:len(data) // 2])
            self._die()
        write_all(fd, data)

    def _append_audit(self, afd: int, lines: bytes, seq: int, warnings: list[str]) -> None:
        try:
            if self._hit("audit_partial"):
                write_all(afd, lines[:len(lines) // 2])
                self._die()
            write_all(afd, lines)
        except OSError as e:
            warnings.append(f"commit {seq} is saved, but its audit records could not be appended "
                            f"to {self.paths.audit} ({e.strerror}); the next write adds them")

    def _rotate_audit(self, dirfd: int, afd: int, start: int, now: int, warnings: list[str]) -> None:
        """Seal the older commits of a log past its segment size; keep sealed
        segments for the retention (``bk.store.segments``)."""
        def replace_live(data: bytes) -> None:
            replace_file(dirfd, AUDIT, self.paths.data_dir, data, self.modes.audit)

        try:
            if os.fstat(afd).st_size >= self.audit_segment_bytes:
                self.segments.rotate(dirfd, afd, start, replace_live=replace_live, step=self._step,
                                     cutoff=utctime.format_utc(now - self.audit_retention))
        except (BkError, OSError) as e:
            warnings.append(f"the audit log {self.paths.audit} could not be rotated: "
                            f"{getattr(e, 'message', None) or e}; the next write tries again")

    def _backup(self, bfd: int, seq: int, data: bytes, warnings: list[str]) -> None:
        try:
            replace_file(bfd, f"ledger-{seq:010d}.json", self.paths.backups_dir, data,
                         self.modes.ledger, sync=False)
            keep_newest(bfd, BACKUP_NAME, self.backup_keep)
        except (BkError, OSError) as e:
            warnings.append(f"commit {seq} is saved, but no backup was written: {e}")

    def _keep_damaged(self, dirfd: int, data: bytes, now: int, warnings: list[str]) -> str | None:
        stamp = utctime.format_utc(now).replace("-", "").replace(":", "")
        name = f"{LEDGER}.damaged-{stamp}-{_token_hex(2)}"
        try:
            write_new(dirfd, name, os.path.join(self.paths.data_dir, name), data,
                      self.modes.ledger & 0o600)
            warnings.append(f"the damaged ledger was kept as {os.path.join(self.paths.data_dir, name)}")
            return os.path.join(self.paths.data_dir, name)
        except BkError as e:
            warnings.append(f"could not keep a copy of the damaged ledger: {e.message}")
            return None

    def _report(self, kind: str, message: str) -> None:
        if self.report is not None:
            try:
                self.report(kind, message)
            except Exception:  # noqa: BLE001  (telling must never undo a commit)
                pass

    def _report_recovery(self, got: _Loaded, seq: int, kept: str | None) -> None:
        p = self.paths
        backup = os.path.join(p.backups_dir, got.source.removeprefix("backup:"))
        what = "was missing" if got.damaged is None else "was damaged (it did not validate)"
        keep = f"; the damaged file is kept as {kept}" if kept else ""
        self._report(RECOVERED, f"{p.ledger} {what}: commit {seq} rebuilt it from the newest valid backup "
                     f"{backup} (commit {got.meta.seq}){keep}; bookings made after commit {got.meta.seq} are "
                     f"lost unless recovered by hand: see what the audit log {p.audit} holds beyond it "
                     "with sudo bk admin data recover --dry-run")

    def _remove_temps(self, dirfd: int) -> None:
        """Temp files left by a writer that died (only lock holders make
        them, and we hold the lock)."""
        for name in os.listdir(dirfd):
            if name.startswith(TMP_PREFIX):
                unlink_quietly(dirfd, name)

    # --- history and audit views ------------------------------------------------

    def audit_tail(self, limit: int = 50, uid: int | None = None, *,
                   max_bytes: int | None = None, include_pending: bool = True,
                   reservation: str | None = None, budget: int | None = None):
        """The newest ``limit`` audit records (of ``uid``: by or about that
        user; of ``reservation``: about that booking), oldest first, with
        the malformed lines met on the way: an ``audit.AuditTail``.
        ``max_bytes``: how far back to scan each file (None:
        ``audit.MAX_SCAN``); ``budget``: how many bytes the live log and the
        sealed segments together may be read (None: no such bound), so that
        one request's work has a ceiling whatever the history holds."""
        from bk.store import audit

        if max_bytes is None:
            max_bytes = audit.MAX_SCAN
        if budget is not None:
            max_bytes = min(max_bytes, budget)
        dirfd = open_dir(self.paths.data_dir, self.safety)
        if dirfd is None:
            return audit.AuditTail()
        try:
            pending = self._journal(dirfd) if include_pending else []
            fd = open_file(dirfd, AUDIT, self.paths.audit, self.safety)
            try:
                if self._scan_pause is not None and self._scan_pause[1] in (None, uid):
                    from bk.store import testhooks

                    testhooks.park(self._scan_pause[0])
                tail = audit.read_tail(fd, limit=limit, uid=uid, max_bytes=max_bytes, pending=pending,
                                       path=self.paths.audit, reservation=reservation, pause=self.pause)
            except OSError as e:
                raise io_error(e, "reading", self.paths.audit) from None
            finally:
                if fd is not None:
                    os.close(fd)
            if len(tail.entries) < limit and tail.complete:
                tail = self.segments.complete(dirfd, tail, limit, uid, max_bytes, reservation=reservation,
                                              budget=budget, pause=self.pause)
            return tail
        finally:
            os.close(dirfd)

    def audit_segments(self) -> list[tuple[str, str | None]]:
        """Each sealed segment, newest first, with what is wrong with it (None: its seal matches)."""
        return self._in_dir(self.segments.verify, [])

    def _in_dir(self, fn, default=None):
        """``fn(dirfd)`` on the data directory, or ``default`` when it does not exist."""
        dirfd = open_dir(self.paths.data_dir, self.safety)
        if dirfd is None:
            return default
        try:
            return fn(dirfd)
        finally:
            os.close(dirfd)

    def _journal(self, dirfd: int) -> list[dict]:
        from bk.store import audit

        kept = self._kept_state(dirfd)
        if kept is not None:
            return kept.meta.journal
        data = self._read(dirfd, LEDGER, self.paths.ledger)
        return audit.journal_of(data) if data else []

    def archived(self, uid: int | None = None, since: int | None = None) -> list:
        """Archived bookings within retention (closed at or after ``since``).
        Right after an archiving commit, and after a crash until the next
        one, a booking can be both here and in the ledger: prefer the
        ledger's copy."""
        dirfd = open_dir(self.paths.data_dir, self.safety)
        if dirfd is None:
            return []
        try:
            afd = open_subdir(dirfd, ARCHIVE, self.paths.archive_dir, self.safety)
            if afd is None:
                return []
            from bk.store import archive

            try:
                with _gc_paused():
                    found, _problems = archive.read(afd, self.paths.archive_dir, self.safety,
                                                    cutoff=self.clock() - self.retention,
                                                    uid=uid, since=since)
                return found
            finally:
                os.close(afd)
        finally:
            os.close(dirfd)

    # --- test hook -------------------------------------------------------------

    def _hit(self, step: str) -> bool:
        if self._crash is None or self._crash[0] != step:
            return False
        self._crash_hits += 1
        return self._crash_hits >= self._crash[1]

    def _step(self, step: str) -> None:
        if self._hit(step):
            self._die()

    def _die(self) -> None:
        from bk.store import testhooks

        testhooks.die()
