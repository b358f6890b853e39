"""What the broker will do for a caller: the operation allowlist.

Every request names one operation from ``OPERATIONS``; each operation has a
strict field decoder (unknown fields, wrong types, nulls where a value is
required and absurd numbers are refused before the service sees them) and
one service call.  The caller's identity is an argument, ``Peer``, that the
server took from the kernel (SO_PEERCRED); no field of a request can name a
user, so a forged ``uid`` is an unknown field like any other.

The service layer then revalidates everything exactly as it does in private
mode: ownership, policy, capacity, idempotency.  This module adds no rule of
its own beyond the shape of the input.

Failure containment: a ``BkError`` becomes an error envelope for that one
request; anything else is logged with its traceback and answered as
``internal``.  Either way the broker and every other connection go on.

Service calls are serialised by one lock: the ledger has one writer anyway
(its file lock), and the service object keeps a per-command GPU snapshot and
warning list that must not be shared between two requests at once.  Booking
writes go through a group commit (``GroupCommit``): those that queue up while
one transaction runs are committed together in the next.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
import time
import traceback
from collections.abc import Callable

from bk.broker import protocol
from bk.core import record
from bk.core.envelope import failure, success
from bk.core.errors import BkError, Internal, InvalidInput
from bk.core.models import Notice
from bk.core.record import dataclass
from bk.service.app import user_name
from bk.service.requests import (
    Actor,
    BookRequest,
    BookResult,
    CancelRequest,
    CancelResult,
    EditRequest,
    from_wire,
)
from bk.service.views import notice_json, reservation_json

# Integers on the wire are counts, MiB, GPU indices or epoch seconds.  None
# of them is negative, and 2**36 seconds is past the year 4000: anything
# larger is junk that must not reach date arithmetic.
MAX_WIRE_INT = 1 << 36
MAX_NOTICE_TEXT = 2000
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


# ------------------------------------------------------------- field checks

# Text a user sends ends up on other users' terminals (``bk l --all``, the
# TUI, notices).  C0/C1 control characters would let it carry terminal escape
# sequences, and bidirectional overrides can make it read differently from
# what it is, so neither may enter the shared ledger.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _check_value(name: str, value: object) -> None:
    if type(value) is int and not 0 <= value <= MAX_WIRE_INT:
        raise InvalidInput(f"field {name!r} is out of range")
    if isinstance(value, str) and _UNPRINTABLE.search(value):
        raise InvalidInput(f"field {name!r} contains control characters",
                           hint="plain text only: no escape sequences, tabs or line breaks")
    if isinstance(value, list):
        for x in value:
            if type(x) is not int or not 0 <= x < 64:
                raise InvalidInput(f"field {name!r} must be a list of GPU indices (0-63)")


def decode_request(cls, fields: dict):
    """A typed request from untrusted fields: ``from_wire`` plus what it lets
    through (null for a field that needs a value, out-of-range numbers)."""
    defaults = {f.name: f.default for f in record.fields(cls)}
    for name, value in fields.items():
        if name in defaults:
            if value is None and defaults[name] is not None:
                raise InvalidInput(f"field {name!r} may not be null")
            _check_value(name, value)
    return from_wire(cls, fields)


def _notice_fields(fields: dict) -> tuple[str, str, int | None, bool]:
    allowed = ("text", "level", "until", "dry_run")
    for k in fields:
        if k not in allowed:
            raise InvalidInput(f"unknown field {k!r}; notice_publish takes " + ", ".join(allowed))
    text, level, until = fields.get("text"), fields.get("level", "info"), fields.get("until")
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_NOTICE_TEXT:
        raise InvalidInput(f"'text' must be a non-empty string of at most {MAX_NOTICE_TEXT} characters")
    _check_value("text", text)
    if not isinstance(level, str) or level not in Notice.LEVELS:
        raise InvalidInput("'level' must be one of " + ", ".join(Notice.LEVELS))
    if until is not None:
        if type(until) is not int:
            raise InvalidInput("'until' must be epoch seconds (an integer) or null")
        _check_value("until", until)
    dry_run = fields.get("dry_run", False)
    if type(dry_run) is not bool:
        raise InvalidInput("'dry_run' must be true or false")
    return text, level, until, dry_run


MAX_AUDIT_LIMIT = 1000
_RESERVATION_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _audit_fields(fields: dict) -> tuple[int, bool, str | None]:
    allowed = ("limit", "all", "reservation")
    for k in fields:
        if k not in allowed:
            raise InvalidInput(f"unknown field {k!r}; audit takes " + ", ".join(allowed))
    limit, every, rid = fields.get("limit", 50), fields.get("all", False), fields.get("reservation")
    if type(limit) is not int or not 1 <= limit <= MAX_AUDIT_LIMIT:
        raise InvalidInput(f"'limit' must be an integer from 1 to {MAX_AUDIT_LIMIT}")
    if type(every) is not bool:
        raise InvalidInput("'all' must be true or false")
    if rid is not None and (type(rid) is not str or not _RESERVATION_ID.match(rid)):
        raise InvalidInput("'reservation' must be a full reservation ID")
    return limit, every, rid


def _no_fields(op: str, fields: dict) -> None:
    if fields:
        raise InvalidInput(f"{op} takes no fields, got {sorted(fields)[0]!r}")


# ------------------------------------------------------------- results

@dataclass(frozen=True)
class View:
    """What rendering a result needs, captured under the lock so that the
    rendering itself can run outside it."""

    now: int
    policy: object
    gpu_mem: dict


def _reservation_data(view: View, res, actor: Actor) -> dict:
    return reservation_json(res, now=view.now, actor_uid=actor.uid, policy=view.policy,
                            gpu_mem=view.gpu_mem)


def book_data(view: View, result: BookResult, actor: Actor) -> dict:
    """What a booking or edit reply carries: the CLI's JSON fields plus
    ``record``, the ledger form, so a client rebuilds the exact object."""
    return {"status": result.status, "reservation": _reservation_data(view, result.reservation, actor),
            "placement": result.placement, "dry_run": result.dry_run,
            "record": result.reservation.to_dict()}


def cancel_data(view: View, result: CancelResult, actor: Actor) -> dict:
    return {"status": result.status, "reservation": _reservation_data(view, result.reservation, actor),
            "dry_run": result.dry_run, "record": result.reservation.to_dict()}


# ------------------------------------------------------------- operations
#
# Each operation decodes its fields, makes its one service call inside
# ``calls.serial()`` and renders the reply after it.  Decoding and rendering
# stay outside the lock so that, while one request waits for the disk
# (fsync releases the GIL), the next ones are already parsed.

def _ping(calls, fields: dict, actor: Actor, peer: Peer) -> dict:
    from bk import __version__

    _no_fields("ping", fields)
    return {"broker": {"version": __version__, "pid": os.getpid(), "uid": os.geteuid()},
            "peer": {"pid": peer.pid, "uid": actor.uid, "user": actor.user, "admin": actor.is_admin}}


def _book(calls, fields, actor, peer):
    req = decode_request(BookRequest, fields)
    result = calls.write("book", req, actor)
    calls.warnings.extend(result.warnings)
    return book_data(calls.view(), result, actor)


def _edit(calls, fields, actor, peer):
    req = decode_request(EditRequest, fields)
    result = calls.write("edit", req, actor)
    calls.warnings.extend(result.warnings)
    return book_data(calls.view(), result, actor)


def _cancel(calls, fields, actor, peer):
    req = decode_request(CancelRequest, fields)
    result = calls.write("cancel", req, actor)
    return cancel_data(calls.view(), result, actor)


def _notice_publish(calls, fields, actor, peer):
    text, level, until, dry_run = _notice_fields(fields)
    with calls.serial() as service:
        if until is not None and until <= service.now():
            raise InvalidInput("'until' is already past")
        notice = service.publish_notice(text, level=level, until=until, actor=actor, dry_run=dry_run)
    return {"notice": notice_json(notice), "record": notice.to_dict()}


def _notice_archive(calls, fields, actor, peer):
    for k in fields:
        if k not in ("ref", "dry_run"):
            raise InvalidInput(f"unknown field {k!r}; notice_archive takes ref, dry_run")
    ref, dry_run = fields.get("ref"), fields.get("dry_run", False)
    if type(ref) is not str or not 4 <= len(ref) <= 36 or not re.fullmatch(r"[0-9a-f-]+", ref):
        raise InvalidInput("'ref' must be a notice ID or a prefix of at least 4 characters")
    if type(dry_run) is not bool:
        raise InvalidInput("'dry_run' must be true or false")
    with calls.serial() as service:
        notice = service.archive_notice(ref, actor=actor, dry_run=dry_run)
    return {"notice": notice_json(notice), "record": notice.to_dict()}


def _probe(calls, fields, actor, peer):
    # Anyone may ask (bk doctor --probe is a user's deployment check); it
    # writes one small temp file, and connections are bounded anyway.
    _no_fields("probe", fields)
    with calls.serial() as service:
        checks = service.probe()
    return {"checks": [{"name": n, "ok": ok, "detail": d} for n, ok, d in checks]}


def _audit(calls, fields, actor, peer):
    limit, every, rid = _audit_fields(fields)
    with calls.serial() as service:
        tail = service.audit(limit, every, reservation=rid, actor=actor)
    return {"entries": tail.entries, "problems": tail.problems, "complete": tail.complete}


Operation = Callable[..., dict]

OPERATIONS: dict[str, Operation] = {
    "ping": _ping,
    "book": _book,
    "edit": _edit,
    "cancel": _cancel,
    "notice_publish": _notice_publish,
    "audit": _audit,
    "probe": _probe,
    "notice_archive": _notice_archive,
}


# ------------------------------------------------------------- dispatcher

class _Calls:
    """One request's access to the shared service: ``serial()`` holds the
    dispatcher's lock around the service call and collects the warnings the
    service raised on the way."""

    def __init__(self, dispatcher: Dispatcher):
        self.dispatcher = dispatcher
        self.warnings: list[str] = []

    @contextlib.contextmanager
    def serial(self):
        d = self.dispatcher
        with d.lock:
            d._current()
            service = d.service
            service.warnings.clear()
            d._fresh_snapshot()
            try:
                yield service
            finally:
                self.warnings.extend(service.warnings)

    def write(self, kind: str, req, actor: Actor):
        """One booking write through the group commit; raises its BkError."""
        outcome, warnings = self.dispatcher.commits.submit((kind, req, actor))
        self.warnings.extend(warnings)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def view(self) -> View:
        with self.dispatcher.lock:
            service = self.dispatcher.service
            return View(service.now(), service.policy,
                        {g.index: g.mem_total_mib for g in service.gpus()})


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
                 monotonic: Callable[[], float] = time.monotonic,
                 reload: Callable[[], object] | None = None):
        self.service = service
        self.log = log or (lambda line: None)
        self.monotonic = monotonic
        # reload() returns a new service when the configuration changed (the
        # policy an administrator edits), else None; called under the lock.
        self.reload = reload
        self.lock = threading.Lock()
        self._snapshot_at: float | None = None
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
            self._snapshot_at = None
            self.log("configuration changed: reloaded the policy")

    def _write_batch(self, items: list) -> tuple[list, list[str]]:
        with self.lock:
            self._current()
            self.service.warnings.clear()
            self._fresh_snapshot()
            outcomes = self.service.write_batch(items)
            return outcomes, list(self.service.warnings)

    def _fresh_snapshot(self) -> None:
        # The service caches one GPU snapshot per command; a broker lives for
        # months, so let it look again once the snapshot is a few seconds old.
        t = self.monotonic()
        if self._snapshot_at is None or t - self._snapshot_at >= GPU_SNAPSHOT_SECONDS:
            self.service.refresh()
            self._snapshot_at = t

    def dispatch(self, obj: object, peer: Peer) -> dict:
        command = "broker"
        try:
            op, fields = protocol.parse_request(obj)
            run = OPERATIONS.get(op)
            if run is None:
                raise InvalidInput(f"unknown operation {op[:40]!r}",
                                   hint="operations: " + ", ".join(OPERATIONS))
            command = op
            calls = _Calls(self)
            data = run(calls, fields, actor_for(peer), peer)
            return success(command, data, list(dict.fromkeys(calls.warnings)))
        except BkError as err:
            return failure(command, err)
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
