"""Typed requests the front ends hand to the service layer, and the results
it hands back.  Times are epoch seconds (UTC); the front end has already
resolved "tomorrow 9am" with its clock and time zone.

Requests are plain data so the broker can rebuild them from a frame with a
strict field allowlist (``from_wire``) and the op-id digest can be computed
from a canonical form (``canonical``).
"""

from __future__ import annotations

import json

from bk.core import record
from bk.core.errors import InvalidInput
from bk.core.models import EXCLUSIVE, MODES, SHARED, Reservation
from bk.core.record import dataclass, field


@dataclass(frozen=True)
class Actor:
    """Who is asking.  Always from the kernel: the process UID, or
    SO_PEERCRED in the broker; never from a field a client sent."""

    uid: int
    user: str

    @property
    def is_admin(self) -> bool:
        return self.uid == 0


@dataclass(frozen=True)
class BookRequest:
    count: int
    duration: int
    mode: str = SHARED
    share: int = 1
    mem_mib: int | None = None
    start: int | None = None          # None: now (the current slice), queued if full
    queue: bool = False               # explicit start: earliest start at or after it
    pinned: tuple[int, ...] | None = None
    excluded: tuple[int, ...] = ()
    note: str | None = None
    op_id: str | None = None
    dry_run: bool = False


@dataclass(frozen=True)
class EditRequest:
    ref: str                          # full id (front ends resolve prefixes and list numbers first)
    duration: int | None = None       # new total length
    start: int | None = None          # new start (before start only)
    end: int | None = None            # new end (the only change allowed after start)
    mode: str | None = None
    share: int | None = None
    mem_mib: int | None = None
    clear_mem: bool = False
    pinned: tuple[int, ...] | None = None
    excluded: tuple[int, ...] | None = None
    queue: bool = False
    note: str | None = None
    op_id: str | None = None
    dry_run: bool = False

    def changes(self) -> dict:
        skip = {"ref", "op_id", "dry_run", "queue"}
        return {f.name: getattr(self, f.name) for f in record.fields(self)
                if f.name not in skip and getattr(self, f.name) not in (None, False)}


@dataclass(frozen=True)
class CancelRequest:
    ref: str
    reason: str | None = None
    op_id: str | None = None
    dry_run: bool = False


def canonical(action: str, req: object) -> str:
    """A stable digest of what a request asks for (op-id and dry-run excluded),
    so that a retry with the same op-id can be told apart from a different
    request that reuses the key."""
    d = record.asdict(req)
    d.pop("op_id", None)
    d.pop("dry_run", None)
    import hashlib

    blob = json.dumps([action, d], sort_keys=True, separators=(",", ":"), default=list)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


_WIRE_TYPES = {
    "count": int, "duration": int, "mode": str, "share": int, "mem_mib": int, "start": int,
    "queue": bool, "pinned": list, "excluded": list, "note": str, "op_id": str, "dry_run": bool,
    "ref": str, "end": int, "clear_mem": bool, "reason": str,
}


def from_wire(cls, fields: dict):
    """Build a request from untrusted JSON: only the dataclass's fields, each
    with its exact type (bool is not an int here)."""
    if not isinstance(fields, dict):
        raise InvalidInput("request fields must be an object")
    defaults = {f.name: f.default for f in record.fields(cls)}
    kwargs = {}
    for k, v in fields.items():
        if k not in defaults:
            raise InvalidInput(f"unknown field {k!r}")
        want = _WIRE_TYPES[k]
        if v is None:
            if defaults[k] is not None:
                raise InvalidInput(f"field {k!r} may not be null")
            kwargs[k] = None
            continue
        if want is int and (not isinstance(v, int) or isinstance(v, bool) or not -2**53 < v < 2**53):
            raise InvalidInput(f"field {k!r} must be an integer")
        if want is not int and not isinstance(v, want):
            raise InvalidInput(f"field {k!r} must be {want.__name__}")
        if want is list:
            if len(v) > 64 or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                raise InvalidInput(f"field {k!r} must be a list of GPU indices")
            v = tuple(v)
        if want is str and len(v) > 1000:
            raise InvalidInput(f"field {k!r} is too long")
        kwargs[k] = v
    try:
        req = cls(**kwargs)
    except TypeError as e:
        raise InvalidInput(f"incomplete request: {e}") from None
    check_request(req)
    return req


def check_request(req) -> None:
    """Shape checks shared by every front end (the scheduler checks the rest)."""
    if isinstance(req, BookRequest):
        if req.count < 1 or req.count > 64:
            raise InvalidInput(f"GPU count must be 1-64, got {req.count}", hint="example: bk 2 1h")
        if req.duration <= 0:
            raise InvalidInput("duration must be positive", hint="example: bk 1 30m")
    mode = getattr(req, "mode", None)
    if mode is not None and mode not in MODES:
        raise InvalidInput(f"mode must be {SHARED} or {EXCLUSIVE}, got {mode!r}")
    share = getattr(req, "share", None)
    if share is not None and share < 1:
        raise InvalidInput(f"--share must be at least 1, got {share}")
    mem = getattr(req, "mem_mib", None)
    if mem is not None and mem <= 0:
        raise InvalidInput("memory must be positive", hint="example: -m 12g")


@dataclass
class BookResult:
    status: str                        # created | queued | exists | updated | dry_run
    reservation: Reservation
    placement: dict | None = None      # {"gpus": {index: reason}, "requested_start": iso}
    warnings: list[str] = field(default_factory=list)
    dry_run: bool = False


@dataclass
class CancelResult:
    status: str                        # cancelled | exists
    reservation: Reservation
    dry_run: bool = False
