"""Typed requests the front ends hand to the service layer, and the results
it hands back.  Times are epoch seconds (UTC); the front end has already
resolved "tomorrow 9am" with its clock and time zone.

Requests are plain data, each with a field spec (``bk.service.fieldspecs``)
that the operation table (``bk.service.ops``) names, so the broker and the
MCP server rebuild them from JSON with one strict decoder, and the op-id
digest is computed from a canonical form (``canonical``).  Front ends build
them with ``bk.service.builders`` rather than by hand.
"""

from __future__ import annotations

from bk.core import jsonfast, record
from bk.core.errors import InvalidInput
from bk.core.models import EXCLUSIVE, MODES, SHARED, Policy
from bk.core.record import dataclass
from bk.service.context import Actor  # noqa: F401  (re-exported: requests are made for an actor)


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
    again: bool = False               # book even if it repeats a booking just made (booking.repeat_of)
    # A command attached to the booking (bk N DUR -- CMD): the private spec's
    # id and digest, and the safe summary the ledger may show (bk.core.jobs).
    job_id: str | None = None
    job_digest: str | None = None
    job_summary: str | None = None
    # Issue 27: move earlier on its own when queued (None of the two: the
    # server's advance_default), and who else may use it ("alice,@nlp").
    advance: bool = False
    no_advance: bool = False
    shared_with: str | None = None
    # Issue 25: end the booking after this many minutes seen idle (opt-in),
    # and bk adopt: the processes it follows, "PID:START,..." (START: the
    # process's start time in clock ticks since boot, /proc/PID/stat).
    idle_release_minutes: int | None = None
    adopt: str | None = None


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
    advance: bool = False             # move earlier on its own from now on (bk.core.advance)
    no_advance: bool = False          # stop doing so
    shared_with: str | None = None    # who else may use it: "alice,@nlp"; "none": nobody
    idle_release_minutes: int | None = None   # 0: off (no opt-in: the administrator's policy alone)
    keep_until: int | None = None             # hold nudges and idle release until then; 0: stop holding

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


LATE_FIELDS = ("idle_release_minutes", "adopt", "keep_until")


def canonical(action: str, req: object) -> str:
    """A stable digest of what a request asks for (op-id and dry-run excluded),
    so that a retry with the same op-id can be told apart from a different
    request that reuses the key.  ``again`` is excluded too: with an op-id
    the op-id rules alone decide, and digests recorded before the field
    existed stay valid."""
    d = record.asdict(req)
    d.pop("op_id", None)
    d.pop("dry_run", None)
    d.pop("again", None)
    # A retried bk N DUR -- CMD writes a new spec (new id and digest): it is
    # still the same request.
    d.pop("job_id", None)
    d.pop("job_digest", None)
    # Fields added later are left out at their default, so digests recorded
    # before they existed stay valid.
    for k in ("advance", "no_advance", "shared_with"):
        if d.get(k) in (False, None):
            d.pop(k, None)
    for late in LATE_FIELDS:
        if d.get(late) is None:
            d.pop(late, None)
    import hashlib

    blob = jsonfast.dumps([action, d], sort_keys=True, separators=(",", ":"), default=list)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


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
    if share is not None and not 1 <= share <= 64:
        raise InvalidInput(f"--share must be 1-64, got {share}")
    mem = getattr(req, "mem_mib", None)
    if mem is not None and mem <= 0:
        raise InvalidInput("memory must be positive", hint="example: -m 12g")


@dataclass(frozen=True)
class NoticeRequest:
    text: str
    level: str = "info"
    until: int | None = None
    dry_run: bool = False
    start: int | None = None       # shown from then (default: now)


@dataclass(frozen=True)
class NoticeArchiveRequest:
    ref: str
    dry_run: bool = False


@dataclass(frozen=True)
class AuditRequest:
    limit: int = 50
    all: bool = False
    reservation: str | None = None


@dataclass(frozen=True)
class JobStateRequest:
    """The worker (or ``bk j retry``) changes one job's state: only the
    owner's own jobs (``bk.service.jobs.apply_job_state``)."""

    ref: str                   # the reservation's full ID
    job_id: str                # the job it must still carry
    status: str
    reason: str | None = None
    exit_code: int | None = None
    retry: bool = False        # requeue an ended job (bk j retry --accept-duplicate-risk)


@dataclass(frozen=True)
class Empty:
    """The request of an operation that takes no fields (ping, probe)."""


@dataclass(frozen=True)
class RecoverRequest:
    ledger_seq: int            # the commit the ledger reads at, as the caller saw it
    audit_seq: int             # the newest commit the audit log records: the loss accepted is between
    replay: bool = False
    dry_run: bool = False


# The administrator's maintenance windows, notice edits and policy binding
# (bk.service.maintenance, bk.service.policyedit).

@dataclass(frozen=True)
class MaintainRequest:
    start: int
    end: int
    reason: str
    level: str = "warning"
    block: bool = True               # False: an announcement only, no blackout
    overlapping: str = "refuse"      # refuse | keep | cancel the bookings already in the window
    seen: str | None = None          # comma-separated full IDs of the overlapping bookings shown
    text: str | None = None          # the announcement; default: the reason
    dry_run: bool = False

    @property
    def seen_ids(self) -> frozenset[str]:
        return frozenset(x for x in (self.seen or "").split(",") if x)


@dataclass(frozen=True)
class BlackoutEndRequest:
    ref: str
    dry_run: bool = False


@dataclass(frozen=True)
class NoticeEditRequest:
    ref: str
    text: str | None = None
    level: str | None = None
    until: int | None = None
    clear_until: bool = False
    dry_run: bool = False


@dataclass(frozen=True)
class PolicyBindRequest:
    gpu_count: int
    slot_minutes: int
    max_shared_users: int
    shared_memory_reserve_mb: int
    require_shared_memory: bool
    force: bool = False
    dry_run: bool = False

    def bound(self) -> dict:
        return {k: getattr(self, k) for k in Policy.BOUND_KEYS}


@dataclass(frozen=True)
class CleanupRequest:
    """Cancel the caller's current and upcoming bookings made with an op-id
    prefix (an agent's session tag), or all of them, in one commit."""

    op_id_prefix: str | None = None
    all: bool = False
    dry_run: bool = False
