"""The data every layer shares: reservations, policy, ledger, GPU snapshots.

Times are whole seconds since the Unix epoch, UTC (``int``).  The pure core
compares integers; only the edges (JSON, humans) turn them into ISO-8601 or
local time, through ``bk.core.timegrid``.

Records keep the fields they do not know in ``extra`` so that a newer bk's
ledger survives a round trip through an older one (forward compatibility).
"""

from __future__ import annotations

from bk.core import record
from bk.core.record import dataclass, field
from bk.core.utctime import format_utc, parse_utc

SHARED = "shared"
EXCLUSIVE = "exclusive"
MODES = (SHARED, EXCLUSIVE)

# Processes that every desktop or driver runs; they belong to nobody's booking.
SYSTEM_LABELS = ("xorg", "x", "gnome-shell", "nvidia-persistenced", "nvidia-smi", "kwin_x11",
                 "kwin_wayland", "gdm", "sddm", "xwayland", "dcgm", "nv-hostengine",
                 "nvidia-cuda-mps-server")

UPCOMING = "upcoming"
ACTIVE = "active"
ENDED = "ended"
CANCELLED = "cancelled"


def iso(t: int | None) -> str | None:
    """Epoch seconds -> ``2026-07-13T18:00:00Z`` (None stays None)."""
    return None if t is None else format_utc(t)


def parse_iso(text: str) -> int:
    """ISO-8601 with ``Z`` or an offset -> epoch seconds.  Raises ValueError."""
    return parse_utc(text)


@dataclass(frozen=True, bulk=True)
class Edit:
    """One change to a reservation: who, when, and the fields before/after."""

    at: int
    actor_uid: int
    actor: str
    before: dict
    after: dict
    extra: dict = field(default_factory=dict)

    NAMES = ("at", "actor_uid", "actor", "before", "after")

    def to_dict(self) -> dict:
        d = dict(self.extra)
        d.update({"at": iso(self.at), "actor_uid": self.actor_uid, "actor": self.actor,
                  "before": self.before, "after": self.after})
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Edit:
        return cls(parse_iso(d["at"]), int(d["actor_uid"]), str(d["actor"]),
                   dict(d.get("before") or {}), dict(d.get("after") or {}),
                   {k: v for k, v in d.items() if k not in cls.NAMES})


@dataclass(frozen=True, bulk=True)
class Job:
    """A command attached to a booking, as the shared ledger may know it: a
    state and a short safe summary, never the command line (that stays in
    the owner's private job spec).  Unknown keys are kept."""

    status: str
    summary: str | None = None
    extra: dict = field(default_factory=dict)

    NAMES = ("status", "summary")

    def to_dict(self) -> dict:
        d = dict(self.extra)
        d.update({"status": self.status, "summary": self.summary})
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Job:
        if not isinstance(d, dict) or not isinstance(d.get("status"), str):
            raise ValueError("a job needs a status")
        return cls(d["status"], d.get("summary"), {k: v for k, v in d.items() if k not in cls.NAMES})


@dataclass(frozen=True, bulk=True)
class Advance:
    """A queued booking's standing request to move earlier (``--advance``,
    ``bk.core.advance``): never before ``after`` (the start it asked for),
    waiting since ``since`` (its place, first come first served), on its
    own GPUs only when it pinned them, never on ``excluded`` ones."""

    since: int
    after: int
    pinned: bool = False
    excluded: tuple[int, ...] = ()
    extra: dict = field(default_factory=dict)

    NAMES = ("since", "after", "pinned", "excluded")

    def to_dict(self) -> dict:
        d = dict(self.extra)
        d.update({"since": iso(self.since), "after": iso(self.after), "pinned": self.pinned,
                  "excluded": list(self.excluded)})
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Advance:
        if not isinstance(d, dict):
            raise ValueError("an advance is an object")
        ex = d.get("excluded") or []
        if not isinstance(ex, list) or not all(type(g) is int and g >= 0 for g in ex):
            raise ValueError("an advance's excluded GPUs are a list of indices")
        pinned = d.get("pinned", False)
        if type(pinned) is not bool:
            raise ValueError("an advance's pinned is true or false")
        return cls(parse_iso(d["since"]), parse_iso(d["after"]), pinned, tuple(ex),
                   {k: v for k, v in d.items() if k not in cls.NAMES})


@dataclass(frozen=True, bulk=True)
class Reservation:
    id: str
    uid: int
    user: str
    mode: str
    gpus: tuple[int, ...]
    share: int
    start: int
    end: int
    created: int
    mem_mib: int | None = None
    op_id: str | None = None
    note: str | None = None
    cancelled_at: int | None = None
    cancelled_by: int | None = None
    cancel_reason: str | None = None
    edits: list[Edit] = field(default_factory=list)
    job: Job | None = None
    advance: Advance | None = None            # moves earlier on its own (bk.core.advance)
    shared_with: tuple[str, ...] = ()         # users and @groups who may use it (bk.core.sharing)
    extra: dict = field(default_factory=dict)

    @property
    def short_id(self) -> str:
        return self.id[:8]

    def status(self, now: int) -> str:
        if self.cancelled_at is not None:
            return CANCELLED
        if now >= self.end:
            return ENDED
        if now >= self.start:
            return ACTIVE
        return UPCOMING

    def is_live(self, now: int) -> bool:
        """Holds capacity now or later (not cancelled, not ended)."""
        return self.cancelled_at is None and self.end > now

    def replace(self, **changes) -> Reservation:
        return record.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dict(self.extra)
        d.update({
            "id": self.id, "uid": self.uid, "user": self.user, "mode": self.mode,
            "gpus": list(self.gpus), "share": self.share, "mem_mib": self.mem_mib,
            "start": iso(self.start), "end": iso(self.end), "created": iso(self.created),
            "op_id": self.op_id, "note": self.note,
            "cancelled_at": iso(self.cancelled_at), "cancelled_by": self.cancelled_by,
            "cancel_reason": self.cancel_reason,
            "edits": [e.to_dict() for e in self.edits],
            "job": self.job.to_dict() if self.job is not None else None,
            "advance": self.advance.to_dict() if self.advance is not None else None,
            "shared_with": list(self.shared_with),
        })
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Reservation:
        known = {f.name for f in record.fields(cls)} - {"extra"}
        extra = {k: v for k, v in d.items() if k not in known}
        ca = d.get("cancelled_at")
        return cls(
            id=d["id"], uid=d["uid"], user=d["user"], mode=d["mode"],
            gpus=tuple(d["gpus"]), share=d["share"],
            start=parse_iso(d["start"]), end=parse_iso(d["end"]),
            created=parse_iso(d["created"]), mem_mib=d.get("mem_mib"),
            op_id=d.get("op_id"), note=d.get("note"),
            cancelled_at=parse_iso(ca) if ca else None,
            cancelled_by=d.get("cancelled_by"), cancel_reason=d.get("cancel_reason"),
            edits=[Edit.from_dict(e) for e in d.get("edits") or []],
            job=Job.from_dict(d["job"]) if d.get("job") is not None else None,
            advance=Advance.from_dict(d["advance"]) if d.get("advance") is not None else None,
            shared_with=tuple(d.get("shared_with") or ()), extra=extra,
        )


@dataclass(frozen=True, bulk=True)
class Blackout:
    """An administrator window in which no booking may run (all GPUs)."""

    id: str
    start: int
    end: int
    reason: str
    created_by: int = 0
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = dict(self.extra)
        d.update({"id": self.id, "start": iso(self.start), "end": iso(self.end),
                  "reason": self.reason, "created_by": self.created_by})
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Blackout:
        extra = {k: v for k, v in d.items() if k not in ("id", "start", "end", "reason", "created_by")}
        return cls(d["id"], parse_iso(d["start"]), parse_iso(d["end"]), d.get("reason", ""),
                   int(d.get("created_by", 0)), extra)


@dataclass(frozen=True)
class Policy:
    """The scheduling rules.  ``BOUND_KEYS`` are recorded in the ledger at its
    first write; a writer whose configuration disagrees must refuse (SPEC 5)."""

    gpu_count: int
    slot_minutes: int = 5
    max_shared_users: int = 2
    shared_memory_reserve_mb: int = 512
    require_shared_memory: bool = False
    booking_horizon_days: int = 30
    max_booking_hours: int = 720
    queue_search_hours: int = 168
    disabled_gpus: frozenset[int] = frozenset()
    gpu_priority: tuple[tuple[int, int], ...] = ()   # (gpu index, priority value)
    limits: object = None                    # bk.core.limits.LimitRules, or None: no per-user limits
    advance_default: bool = False            # a queued booking advances unless asked not to
    fair_share_half_life_s: int | None = None   # advances in fair-share order (None: first come, first served)

    BOUND_KEYS = ("gpu_count", "slot_minutes", "max_shared_users",
                  "shared_memory_reserve_mb", "require_shared_memory")

    @property
    def slot_seconds(self) -> int:
        return self.slot_minutes * 60

    def priority(self, gpu: int) -> int:
        for g, p in self.gpu_priority:
            if g == gpu:
                return p
        return 0

    def bound(self) -> dict:
        return {k: getattr(self, k) for k in self.BOUND_KEYS}


@dataclass
class GpuProcess:
    """One process on one GPU.  The backend gives pid, memory and SM; the
    rest comes from /proc (``bk.gpu.procinfo``) or the simulation file, and
    is None where it could not be read."""

    pid: int
    mem_mib: int | None = None
    sm: int | None = None          # SM utilisation percent, None when unknown
    uid: int | None = None         # the process's real UID (None: /proc unreadable)
    user: str | None = None
    label: str | None = None       # a safe short label, never the arguments
    since: int | None = None       # process start, epoch seconds
    container: str | None = None   # "docker:3f2a9c1b12ab" when it runs in a container
    identity: str | None = None    # set by whoever attributed it (a monitor snapshot)


@dataclass
class GpuInfo:
    """One GPU as the backend sees it now.  ``None`` means unknown, never 0."""

    index: int
    uuid: str
    name: str
    mem_total_mib: int | None = None
    mem_used_mib: int | None = None
    util: int | None = None
    temperature: int | None = None
    processes: list[GpuProcess] | None = None   # None: the backend cannot list them
    power_mw: int | None = None          # power draw now, milliwatts
    power_limit_mw: int | None = None    # the enforced power limit, milliwatts
    energy_mj: int | None = None         # the driver's total-energy counter, millijoules since it loaded

    def live_state(self) -> str:
        """``idle``, ``busy`` or ``unknown``, used to break placement ties."""
        if self.processes is None and self.util is None:
            return "unknown"
        if self.processes or (self.util or 0) >= 5:
            return "busy"
        return "idle"


@dataclass(frozen=True, bulk=True)
class Notice:
    """A message for users: an announcement (``uid`` None, everyone) or a
    notice to one user (an administrator cancelled their booking)."""

    id: str
    at: int
    text: str
    level: str = "info"            # info | warning | critical
    uid: int | None = None         # None: an announcement for everyone
    until: int | None = None
    reservation: str | None = None
    created_by: int = 0
    archived: bool = False
    extra: dict = field(default_factory=dict)

    LEVELS = ("info", "warning", "critical")

    def to_dict(self) -> dict:
        d = dict(self.extra)
        d.update({"id": self.id, "at": iso(self.at), "text": self.text, "level": self.level,
                  "uid": self.uid, "until": iso(self.until), "reservation": self.reservation,
                  "created_by": self.created_by, "archived": self.archived})
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Notice:
        names = ("id", "at", "text", "level", "uid", "until", "reservation", "created_by", "archived")
        extra = {k: v for k, v in d.items() if k not in names}
        return cls(d["id"], parse_iso(d["at"]), d["text"], d.get("level", "info"), d.get("uid"),
                   parse_iso(d["until"]) if d.get("until") else None, d.get("reservation"),
                   int(d.get("created_by", 0)), bool(d.get("archived", False)), extra)


@dataclass(frozen=True, bulk=True)
class OpRecord:
    """What an ``--op-id`` key did, so a retry returns the original result."""

    op_id: str
    uid: int
    action: str          # create | edit | cancel
    digest: str          # hash of the canonical request
    reservation: str     # the reservation id it produced or changed
    at: int
    extra: dict = field(default_factory=dict)

    NAMES = ("op_id", "uid", "action", "digest", "reservation", "at")

    def to_dict(self) -> dict:
        d = dict(self.extra)
        d.update({"op_id": self.op_id, "uid": self.uid, "action": self.action,
                  "digest": self.digest, "reservation": self.reservation, "at": iso(self.at)})
        return d

    @classmethod
    def from_dict(cls, d: dict) -> OpRecord:
        return cls(d["op_id"], int(d["uid"]), d["action"], d["digest"], d["reservation"],
                   parse_iso(d["at"]), {k: v for k, v in d.items() if k not in cls.NAMES})


@dataclass
class LedgerState:
    """The whole hot ledger in memory.  ``seq`` grows by one per commit."""

    seq: int = 0
    policy: dict | None = None          # the bound policy (Policy.bound()), None before the first write
    reservations: list[Reservation] = field(default_factory=list)
    blackouts: list[Blackout] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    ops: list[OpRecord] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    # A partial read (``DocKeep(holds=True)``): the live bookings it did not
    # build, each as ``(start, end, gpus)`` in the document's own form (the
    # fixed-width UTC strings, which sort as the instants do; a list of GPUs).
    holds: list = field(default_factory=list)

    def copy(self) -> LedgerState:
        """A state whose lists may change without touching this one.  The
        records themselves are frozen, so sharing them is safe: this is what
        makes a refused write in a batch roll back by construction."""
        return LedgerState(self.seq, self.policy, list(self.reservations), list(self.blackouts),
                           list(self.notices), list(self.ops), self.extra)

    def find(self, rid: str) -> Reservation | None:
        for r in self.reservations:
            if r.id == rid:
                return r
        return None

    def swap(self, old: Reservation, new: Reservation) -> None:
        """Put ``new`` where ``old`` stands.  ``list.index`` would compare
        every booking before it field by field (on a 10,000-booking ledger
        that is most of an edit); ``old`` is a record of this state, so it
        is found by identity, at C speed, and only a record that is not
        (an equal copy) is looked for by value."""
        from itertools import compress, count, repeat
        from operator import is_

        rs = self.reservations
        i = next(compress(count(), map(is_, rs, repeat(old))), None)
        rs[rs.index(old) if i is None else i] = new


# Write kinds: the ``action`` of an audit record (SPEC 5), part of the format.
CREATE, EDIT, CANCEL, ADMIN_CANCEL = "create", "edit", "cancel", "admin_cancel"
NOTICE_PUBLISH, NOTICE_ARCHIVE = "notice_publish", "notice_archive"
COMMIT, RECOVER = "commit", "recover"
ADVANCED = "booking_advanced"        # bk.core.advance.EVENT: a booking moved earlier on its own
ACTIONS = (CREATE, EDIT, CANCEL, ADMIN_CANCEL, NOTICE_PUBLISH, NOTICE_ARCHIVE, COMMIT, RECOVER, ADVANCED)


@dataclass(frozen=True)
class AuditEntry:
    """What one change tells the audit log.  The store adds time, seq,
    index and the actor; ``owner`` is the uid the change concerns (so that
    an administrator's action shows in the owner's ``bk lg``)."""

    action: str
    result: str
    reservation: str | None = None
    op_id: str | None = None
    before: dict | None = None
    after: dict | None = None
    owner: int | None = None
    reason: str | None = None

    def to_dict(self) -> dict:
        d = {"action": self.action, "reservation": self.reservation, "op_id": self.op_id,
             "before": self.before, "after": self.after, "result": self.result}
        if self.owner is not None:
            d["owner"] = self.owner
        if self.action in (CANCEL, ADMIN_CANCEL):
            d["reason"] = self.reason
        return d


@dataclass
class Mutation:
    """What ``apply`` did: ``changed`` decides whether anything is written;
    ``audit`` holds action/reservation/op_id/before/after/result per change."""

    changed: bool
    audit: list = field(default_factory=list)     # AuditEntry records (or their dicts)
    result: object = None
    # The state to commit when ``apply`` worked on a copy (a batch whose
    # refused items were dropped with their copies); None: the one passed in.
    state: object = None
