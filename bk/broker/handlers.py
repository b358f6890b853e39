"""What the broker will do for a caller: the operation table, served.

Every request names one row of ``bk.service.ops.OPERATIONS``; the row's
field spec decodes it (unknown fields, wrong types, nulls where a value is
required and absurd numbers are refused before the service sees them), and
the same ``LocalGateway`` that runs private mode runs it.  The caller's
identity is an argument, ``Peer``, that the server took from the kernel
(SO_PEERCRED); no field of a request can name a user, so a forged ``uid``
is an unknown field like any other.  The reply is the result's own JSON
(``to_wire``: what the CLI shows, plus the ledger records a client needs to
rebuild the typed result).  Nothing here is per operation: adding one is a
row in the table.

Failure containment: a ``BkError`` becomes an error envelope for that one
request; anything else is logged with its traceback and answered as
``internal``.  Either way the broker and every other connection go on.

Writes go through a group commit (``GroupCommit``): those that queue up
while one transaction runs are committed together in the next.  Neither
writes nor reads look at the GPUs: each call carries the latest snapshot
the refresher took (``Latest``), so no request waits for a driver.

Reads that only the host can make (the audit log, the write probe, the
lost-commit report) never take the writers' lock: the store's readers rely
on atomic renames and appends, not on the lock, so a scan of a large log
cannot hold up anyone's booking.  A request still costs the broker CPU,
and all its threads share one interpreter, so the work is shared out round
the UIDs (``Turns``: a few reads at once, the next turn to the UID that
has waited longest), and one user's reads are bounded three ways (``ReadSlots``, ``Shared``, and the scan budget of
``bk.service.hostreads.USER_AUDIT_SCAN``): at most ``READ_SLOTS_PER_UID`` of a
UID's reads run at once (the rest wait their turn, at most
``READ_SLOT_WAIT`` seconds, then hear ``busy``); an ordinary user's probe
shares the result of one made in the last ``SHARED_SECONDS`` seconds; and
an ordinary user's audit read stops after a fixed number of bytes.  The
administrator's reads take slots too but are not cut short.

Writes first.  While a commit runs, reads wait: one about to start waits
for it, and a scan in progress pauses before its next block (the store's
``pause`` hook), each at most ``WRITER_FIRST_WAIT`` seconds.  A commit is
short and every user's writes wait on it, so it should not share the
interpreter with someone's scan; reads go on between commits.  Writes of
one UID are shared out too: at most ``WRITES_PER_UID_PER_BATCH`` of them
in one group commit.  A write's dry run changes nothing, so it is served
as a read (``LocalGateway.dry_run``: the committed ledger, no lock), not
in a commit that everyone's writes wait for.
"""

from __future__ import annotations

import functools
import threading
import time
import traceback
from collections.abc import Callable

from bk.core import journal
from bk.core.envelope import failure, shared_result_note, success
from bk.core.errors import BkError, Busy, Internal
from bk.core.record import dataclass
from bk.ipc import protocol
from bk.service import ops
from bk.service.app import user_name
from bk.service.context import Actor
from bk.service.telemetry import Fixed

GPU_SNAPSHOT_SECONDS = 2.0
# One UID's reads in progress at once: enough for a person's terminal and a
# script, too few for one user's threads to take the interpreter from the
# writers and everyone else's reads.
READ_SLOTS_PER_UID = 2
READ_SLOT_WAIT = 20.0
# One UID's writes in one group commit (GroupCommit's per_key).
WRITES_PER_UID_PER_BATCH = 4
# Reads doing their work at once, shared round the UIDs (Turns).  Three: one
# UID's two read slots always leave one for everybody else.
TURNS = 3
WRITER_FIRST_WAIT = 1.0
# Reads whose result ordinary users share: the probe writes, fsyncs and takes
# the ledger lock for real, and what it finds does not change by the second.
SHARED_SECONDS = {"probe": 10.0}
# The journal priority of each thing the store reports (bk.store.ledger.REPORTS):
# data lost or writes refused are errors; a loss accepted on purpose and a
# lock file replaced are warnings.  The same report is logged at most once
# per REPORT_EVERY seconds (every write would repeat it), with a count.
REPORT_PRIORITY = {"no_valid_ledger": journal.ERR, "lost_commits": journal.ERR, "recovered": journal.ERR,
                   "accepted_loss": journal.WARNING, "lock_replaced": journal.WARNING}
REPORT_EVERY = 300.0


@dataclass(frozen=True)
class Peer:
    """The connecting process as the kernel saw it at connect() time."""

    pid: int
    uid: int
    gid: int


@functools.lru_cache(maxsize=512)
def _name(uid: int) -> str:
    # Names only label records; identity is the UID.  A renamed account keeps
    # its old label in this process until the broker restarts.
    return user_name(uid)


def actor_for(peer: Peer) -> Actor:
    return Actor(peer.uid, _name(peer.uid))


class Latest:
    """The newest GPU snapshot, swapped in whole by ``refresh`` (the
    server's refresher thread, never a request) and read without a lock."""

    def __init__(self, telemetry, *, monotonic: Callable[[], float] = time.monotonic):
        self._source = telemetry
        self._monotonic = monotonic
        self._fixed = None
        self.taken_at: float | None = None
        self.error: str | None = None

    def refresh(self) -> None:
        try:
            self._source.refresh()
            fixed = Fixed(self._source.snapshot(), self._source.inventory())
        except BkError as e:         # keep serving the last good snapshot
            self.error = e.message
            if self._fixed is not None:
                return
            raise
        self._fixed, self.taken_at, self.error = fixed, self._monotonic(), None

    def current(self):
        if self._fixed is None:
            self.refresh()
        return self._fixed

    def stale(self, seconds: float = GPU_SNAPSHOT_SECONDS) -> bool:
        return self.taken_at is None or self._monotonic() - self.taken_at >= seconds


class _Slot:
    __slots__ = ("item", "key", "done", "outcome", "warnings")

    def __init__(self, item, key=None):
        self.item = item
        self.key = key
        self.done = False
        self.outcome = None
        self.warnings: list[str] = []


class GroupCommit:
    """Booking writes that arrive while another is being committed wait, and
    are then committed together in one transaction.

    A write's cost is dominated by the transaction (re-read, validate,
    encode, three fsyncs), not by the rule it applies, and the ledger has one
    writer anyway.  So under load one commit acknowledges many callers, and
    throughput grows with the number of clients instead of staying flat.

    Leadership: the first caller to find no commit in progress becomes the
    leader and commits everything queued (including its own write, at most
    ``max_batch`` at a time); callers that arrive meanwhile wait on the
    condition.  A leader whose own write is done hands over: it stops
    leading and wakes the others, one of which leads the next batch, so no
    caller waits longer than it takes to commit the writes queued before it.

    Fairness: while writes of more than one key (the caller's UID) wait, a
    batch takes at most ``per_key`` writes of each, oldest first; the rest
    wait for the next batch.  One user's sixteen connections of writes so
    cost another user's write at most ``per_key`` of theirs, not sixteen;
    with nobody else waiting, one user's writes fill the batch.
    """

    def __init__(self, run_batch: Callable[[list], tuple[list, list[str]]], max_batch: int = 64,
                 per_key: int | None = None):
        self._run_batch = run_batch
        self._max = max_batch
        self._per_key = per_key
        self._cv = threading.Condition()
        self._queue: list[_Slot] = []
        self._leading = False

    def _take(self) -> list[_Slot]:
        """The next batch, removed from the queue (under ``_cv``)."""
        if self._per_key is None or len({slot.key for slot in self._queue}) < 2:
            # Nobody else waits: one caller's writes fill the batch.
            batch, self._queue = self._queue[: self._max], self._queue[self._max:]
            return batch
        batch, rest, taken = [], [], {}
        for slot in self._queue:
            n = taken.get(slot.key, 0)
            if len(batch) < self._max and n < self._per_key:
                taken[slot.key] = n + 1
                batch.append(slot)
            else:
                rest.append(slot)
        self._queue = rest
        return batch

    def submit(self, item, key: object = None) -> tuple[object, list[str]]:
        slot = _Slot(item, key)
        with self._cv:
            self._queue.append(slot)
            while self._leading and not slot.done:
                self._cv.wait()
            if slot.done:
                return slot.outcome, slot.warnings
            self._leading = True
        try:
            while not slot.done:
                with self._cv:
                    batch = self._take()
                try:
                    outcomes, warnings = self._run_batch([b.item for b in batch])
                except BaseException as exc:   # a bug: every caller of this batch hears of it
                    outcomes, warnings = [exc] * len(batch), []
                with self._cv:
                    for b, o in zip(batch, outcomes, strict=True):
                        b.outcome, b.warnings, b.done = o, warnings, True
                    self._cv.notify_all()
        finally:
            with self._cv:
                self._leading = False
                self._cv.notify_all()
        return slot.outcome, slot.warnings


class ReadSlots:
    """At most ``per_uid`` reads of one UID at once; the next waits for one
    of them to finish, up to ``wait`` seconds, then is refused ``busy``
    (nothing was done: retrying is safe).  Other UIDs are never kept
    waiting by it: slots are counted per UID only."""

    def __init__(self, per_uid: int = READ_SLOTS_PER_UID, wait: float = READ_SLOT_WAIT, *,
                 monotonic: Callable[[], float] = time.monotonic):
        self.per_uid, self.wait, self._monotonic = per_uid, wait, monotonic
        self._cv = threading.Condition()
        self._held: dict[int, int] = {}

    def held(self, uid: int) -> int:
        with self._cv:
            return self._held.get(uid, 0)

    def acquire(self, uid: int) -> None:
        deadline = self._monotonic() + self.wait
        with self._cv:
            while self._held.get(uid, 0) >= self.per_uid:
                left = deadline - self._monotonic()
                if left <= 0:
                    raise Busy(f"uid {uid} already has {self.per_uid} reads in progress at the broker, the "
                               f"most one user may have at once (it waited {self.wait:g} s for one to finish)",
                               hint="retry in a moment; run fewer bk lg / bk history / bk doctor --probe at once",
                               details={"reason": "read_slots", "limit": self.per_uid, "uid": uid})
                self._cv.wait(left)
            self._held[uid] = self._held.get(uid, 0) + 1

    def release(self, uid: int) -> None:
        with self._cv:
            left = self._held.get(uid, 0) - 1
            if left > 0:
                self._held[uid] = left
            else:
                self._held.pop(uid, None)
            self._cv.notify_all()


class Turns:
    """At most ``width`` reads do their work in the broker at once; when more
    wait, the turns go round the UIDs that wait, one each, in the order they
    began to wait, so a UID with sixteen requests queued and one with a
    single request alternate instead of the single one waiting for all
    sixteen.

    Why so few: the broker's threads share one interpreter, so the CPU a
    request needs is what one user must not take from everyone else, and
    running more at once only makes each slower.  Why not one: a UID holds
    at most ``READ_SLOTS_PER_UID`` turns (its read slots come first), so
    with ``TURNS`` above that a read that takes long (a cold disk) never
    keeps another UID's reads waiting.  Writes take no turn: they decode
    in a moment, those arriving during a commit queue up for the next
    (``GroupCommit``), and a commit must never wait for a read; reads pause
    for it instead (``after_commit``)."""

    def __init__(self, width: int = TURNS):
        self.width = width
        self._cv = threading.Condition()
        self._inside = 0
        self._waiting: dict[int, list[list[bool]]] = {}     # uid -> its waiters' flags, oldest first
        self._order: list[int] = []                           # UIDs with waiters, whose turn is next

    def enter(self, uid: int) -> None:
        with self._cv:
            if self._inside < self.width and not self._order:
                self._inside += 1
                return
            flag = [False]
            self._waiting.setdefault(uid, []).append(flag)
            if uid not in self._order:
                self._order.append(uid)
            while not flag[0]:
                self._cv.wait()

    def leave(self) -> None:
        with self._cv:
            self._inside -= 1
            while self._inside < self.width and self._order:
                uid = self._order.pop(0)
                waiters = self._waiting[uid]
                waiters.pop(0)[0] = True
                self._inside += 1
                if waiters:
                    self._order.append(uid)          # its next one waits for the others' turns
                else:
                    del self._waiting[uid]
            self._cv.notify_all()


class Shared:
    """One result of a read, shared by the callers who ask within
    ``seconds`` of it being made; one caller makes it while the others
    wait for that one instead of making their own."""

    def __init__(self, seconds: float, *, monotonic: Callable[[], float] = time.monotonic):
        self.seconds, self._monotonic = seconds, monotonic
        self._lock = threading.Lock()
        self._made: tuple[float, object] | None = None

    def get(self, make: Callable[[], object]) -> tuple[object, float | None]:
        """(the result, its age in seconds: None when made for this caller)."""
        with self._lock:
            if self._made is not None and self._monotonic() - self._made[0] < self.seconds:
                return self._made[1], self._monotonic() - self._made[0]
            result = make()
            self._made = (self._monotonic(), result)
            return result, None


class Dispatcher:
    """Turns one decoded request into one reply envelope.  Never raises."""

    def __init__(self, service, *, log: Callable[[str], None] | None = None,
                 reload: Callable[[], object] | None = None, latest: Latest | None = None,
                 read_slots: ReadSlots | None = None):
        self.service = service
        self.log = log or (lambda line: None)
        # reload() returns a new service when the configuration changed (the
        # policy an administrator edits), else None; called under _reload_lock.
        self.reload = reload
        self.lock = threading.Lock()           # the writers': one transaction at a time
        self._reload_lock = threading.Lock()
        self.latest = latest or Latest(service.telemetry)
        self.commits = GroupCommit(self._write_batch, per_key=WRITES_PER_UID_PER_BATCH)
        self.readers = read_slots or ReadSlots()
        self.turns = Turns()
        self._shared = {name: Shared(seconds) for name, seconds in SHARED_SECONDS.items()}
        self._no_commit = threading.Event()        # set: no commit in progress (reads may go)
        self._no_commit.set()
        self._reported: dict[tuple[str, str], tuple[float, int]] = {}
        self._reported_lock = threading.Lock()
        self._hook(service)

    def _hook(self, service) -> None:
        store = getattr(service, "store", None)
        if store is not None:
            store.pause = self.after_commit
            store.report = self.store_report

    def store_report(self, kind: str, message: str) -> None:
        """Log what the store says a person must act on, at its priority."""
        now = time.monotonic()
        with self._reported_lock:
            last, repeats = self._reported.get((kind, message), (None, 0))
            if last is not None and now - last < REPORT_EVERY:
                self._reported[(kind, message)] = (last, repeats + 1)
                return
            self._reported[(kind, message)] = (now, 0)
        again = f" (and {repeats} more times in the last {REPORT_EVERY:g} s)" if repeats else ""
        self.log(journal.mark(REPORT_PRIORITY.get(kind, journal.WARNING), f"{message}{again}"))

    def after_commit(self) -> None:
        """Return once no commit is in progress (at most WRITER_FIRST_WAIT s)."""
        self._no_commit.wait(WRITER_FIRST_WAIT)

    def _current(self) -> None:
        if self.reload is None:
            return
        with self._reload_lock:
            try:
                fresh = self.reload()
            except BkError as e:       # an edit that broke the file: keep serving the old policy
                self.log(journal.warning(f"configuration not reloaded: {e.message}"))
                return
            if fresh is not None:
                self._hook(fresh)
                self.service = fresh
                self.log(journal.notice("configuration changed: reloaded the policy"))

    def _call(self, op, fields, peer: Peer, made: list):
        """Decode the request and make its call (``made`` gets the call, for
        the warnings of an error reply)."""
        req = op.decode(fields)
        made.append(self.service.call(actor_for(peer), telemetry=self.latest.current(), peer_pid=peer.pid))
        return req, made[-1]

    def _read(self, op, fields, peer: Peer, made: list, req=None):
        """A host-side read, outside the writers' lock (module docstring):
        a read slot of the caller's UID first, then a turn (``Turns``).
        With ``req`` (already decoded, its call in ``made``): a write's dry
        run, which changes nothing and so is served like a read."""
        self.readers.acquire(peer.uid)
        try:
            self.turns.enter(peer.uid)
            try:
                self._current()
                self.after_commit()
                service = self.service
                if req is not None:
                    return service.gateway.dry_run(op, req, made[-1])
                req, call = self._call(op, fields, peer, made)
                shared = self._shared.get(op.name)
                if shared is None or call.actor.is_admin:
                    return service.gateway.run(op, req, call)
                result, age = shared.get(lambda: service.gateway.run(op, req, call))
                if age is not None:
                    call.warn(shared_result_note(age, op.name, shared.seconds))
                return result
            finally:
                self.turns.leave()
        finally:
            self.readers.release(peer.uid)

    def _write_batch(self, items: list) -> tuple[list, list[str]]:
        with self.lock:
            self._no_commit.clear()
            try:
                self._current()
                policy = self.service.policy
                # Each call was made before the lock; a reload in between changes
                # the policy its write is checked against, so rebind it.
                batch = [(op, req, _with_policy(call, policy)) for op, req, call in items]
                outcomes = self.service.gateway.write_batch(batch)
                return outcomes, []
            finally:
                self._no_commit.set()

    def dispatch(self, obj: object, peer: Peer) -> dict:
        command = "broker"
        made: list = []               # the call, once made
        try:
            name, fields = protocol.parse_request(obj)
            op = ops.served(name)      # the allowlist: local reads are not broker ops
            command = op.name
            if op.access == ops.WRITE:
                # Decoded without a turn: it is cheap, and writes decoded while
                # a commit runs are what the next group commit takes together.
                req, call = self._call(op, fields, peer, made)
                if getattr(req, "dry_run", False) is True and not (op.accepts_loss or op.rebinds):
                    result = self._read(op, fields, peer, made, req=req)
                else:
                    outcome, _ = self.commits.submit((op, req, call), key=peer.uid)
                    if isinstance(outcome, BaseException):
                        raise outcome
                    result = outcome
            else:
                result = self._read(op, fields, peer, made)
                call = made[-1]
            return success(command, result.to_wire(), list(call.warnings))
        except BkError as err:
            return failure(command, err, *(() if not made else (list(made[-1].warnings),)))
        except Exception as exc:  # one request's bug must not end the broker
            self.log(journal.error(f"internal error in {command} for uid {peer.uid}: {type(exc).__name__}: "
                                   f"{exc}\n" + traceback.format_exc().rstrip()))
            return failure(command, Internal("the broker hit an unexpected error (a bug); check with "
                                             "bk l whether the change was made",
                                             hint="the administrator can read: journalctl -u gpubk-broker"))

    def dispatch_frame(self, body: bytes, peer: Peer) -> dict:
        """Decode one frame's body and dispatch it; bad JSON is one error reply."""
        try:
            obj = protocol.decode(body)
        except BkError as err:
            return failure("broker", err)
        return self.dispatch(obj, peer)


def _with_policy(call, policy):
    from bk.core.record import replace

    return call if call.policy is policy else replace(call, policy=policy)
