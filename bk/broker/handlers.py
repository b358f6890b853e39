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
while one transaction runs are committed together in the next.  Reads that
only the host can make (the audit log, the probe) are serialised by one
lock.  Neither looks at the GPUs: each call carries the latest snapshot the
refresher took (``Latest``), so no request waits for a driver.
"""

from __future__ import annotations

import functools
import threading
import time
import traceback
from collections.abc import Callable

from bk.core.envelope import failure, success
from bk.core.errors import BkError, Internal
from bk.core.record import dataclass
from bk.ipc import protocol
from bk.service import ops
from bk.service.app import user_name
from bk.service.context import Actor
from bk.service.telemetry import Fixed

GPU_SNAPSHOT_SECONDS = 2.0


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
    __slots__ = ("item", "done", "outcome", "warnings")

    def __init__(self, item):
        self.item = item
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
    """

    def __init__(self, run_batch: Callable[[list], tuple[list, list[str]]], max_batch: int = 64):
        self._run_batch = run_batch
        self._max = max_batch
        self._cv = threading.Condition()
        self._queue: list[_Slot] = []
        self._leading = False

    def submit(self, item) -> tuple[object, list[str]]:
        slot = _Slot(item)
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
                    batch, self._queue = self._queue[: self._max], self._queue[self._max:]
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


class Dispatcher:
    """Turns one decoded request into one reply envelope.  Never raises."""

    def __init__(self, service, *, log: Callable[[str], None] | None = None,
                 reload: Callable[[], object] | None = None, latest: Latest | None = None):
        self.service = service
        self.log = log or (lambda line: None)
        # reload() returns a new service when the configuration changed (the
        # policy an administrator edits), else None; called under the lock.
        self.reload = reload
        self.lock = threading.Lock()
        self.latest = latest or Latest(service.telemetry)
        self.commits = GroupCommit(self._write_batch)

    def _current(self) -> None:
        if self.reload is None:
            return
        try:
            fresh = self.reload()
        except BkError as e:       # an edit that broke the file: keep serving the old policy
            self.log(f"configuration not reloaded: {e.message}")
            return
        if fresh is not None:
            self.service = fresh
            self.log("configuration changed: reloaded the policy")

    def _write_batch(self, items: list) -> tuple[list, list[str]]:
        with self.lock:
            self._current()
            policy = self.service.policy
            # Each call was made before the lock; a reload in between changes
            # the policy its write is checked against, so rebind it.
            batch = [(op, req, _with_policy(call, policy)) for op, req, call in items]
            outcomes = self.service.gateway.write_batch(batch)
            return outcomes, []

    def dispatch(self, obj: object, peer: Peer) -> dict:
        command = "broker"
        call = None
        try:
            name, fields = protocol.parse_request(obj)
            op = ops.served(name)      # the allowlist: local reads are not broker ops
            command = op.name
            req = op.decode(fields)
            call = self.service.call(actor_for(peer), telemetry=self.latest.current(), peer_pid=peer.pid)
            if op.access == ops.WRITE:
                outcome, _ = self.commits.submit((op, req, call))
                if isinstance(outcome, BaseException):
                    raise outcome
                result = outcome
            else:
                with self.lock:
                    self._current()
                    result = self.service.gateway.run(op, req, call)
            return success(command, result.to_wire(), list(call.warnings))
        except BkError as err:
            return failure(command, err, *(() if call is None else (list(call.warnings),)))
        except Exception as exc:  # one request's bug must not end the broker
            self.log(f"internal error in {command} for uid {peer.uid}: {type(exc).__name__}: {exc}\n"
                     + traceback.format_exc().rstrip())
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
