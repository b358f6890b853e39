"""The ledger as a JSON document: format, codec and validation (pure).

The store writes the whole hot ledger as one JSON object and replaces the
file atomically, so this module decides what a committed ledger looks like
and whether a file read back from disk may be trusted.  It does no I/O: the
store hands it bytes or dicts and gets back a ``LedgerState`` plus a list of
problems.

Document, format version 1 (every object's keys are written sorted; fields
of a reservation at their default, null or no edits, are left out)::

    {"format": "gpubk.ledger", "version": 1,
     "seq": 17,                      # grows by one per commit
     "commit": "9f2c...",            # random per commit: tells two writes apart
     "written_at": "2026-07-13T18:00:00Z",
     "policy": {...} | null,         # Policy.bound() recorded at the first write
     "journal": {"seq": 17, "audit": [...]},   # this commit's audit records
     "reservations": [{...}, ...], "blackouts": [...], "notices": [...],
     "ops": [...], ...,              # unknown top-level keys round-trip
     "digest": "crc32:1a2b3c4d"}     # the seal: always the last key (below)

Speed matters because every command reads the ledger: a 10,000-booking
ledger has 30,000 timestamps.  ``datetime`` costs about 2 us per conversion,
so the codec uses ``parse_utc``/``format_utc``, written for the one form bk
writes (``YYYY-MM-DDTHH:MM:SSZ``) with plain integer arithmetic and a memo
that decoding fills for encoding.  Reservations are converted field by field
here rather than through ``Reservation.from_dict`` for the same reason; a
test keeps the two in agreement.

The seal.  Every writer runs the full invariant check (``bk.core.ledgercheck``)
before it commits, so a reader that gets exactly the bytes a writer
committed need not run it again (it is a quarter of a read).  The store
therefore seals what it writes: ``seal`` appends ``"digest"`` as the last
key, a CRC-32 of every byte before it, and ``sealed`` says whether a file's
bytes still match.  A matching seal lets a read skip the invariant check
(never the structural decoding), and a writer that read those bytes check
only what its transaction changed (``ledgercheck.trusted``, ``Checked``); no seal (a ledger from an older bk, or one
rewritten by a JSON tool, which moves the key) or a wrong one (an edit in
place, a torn or damaged file) takes the full check, and a file that fails
it is never used.  The digest guards against accidents, not adversaries:
whoever can rewrite the ledger can rewrite its digest too, and can already
write any booking.  CRC-32 rather than SHA-256 because ``zlib`` imports in
0.1 ms and hashes 2 MB in 0.4 ms, while ``hashlib`` costs 2 ms to import
(OpenSSL) and 1 ms to hash, on every command.
"""

from __future__ import annotations

import zlib

from bk.core import jsonfast
from bk.core.models import (
    Advance,
    Blackout,
    Edit,
    Job,
    LedgerState,
    Notice,
    OpRecord,
    Reservation,
)
from bk.core.record import dataclass, field
from bk.core.timegrid import counted
from bk.core.utctime import format_utc, parse_utc

FORMAT = "gpubk.ledger"
VERSION = 1
OP_ACTIONS = ("create", "edit", "cancel")
MAX_PROBLEMS = 20

_TOP_KEYS = frozenset((
    "format", "version", "seq", "commit", "written_at", "policy", "journal",
    "reservations", "blackouts", "notices", "ops", "digest",
))
_RES_KEYS = frozenset((
    "id", "uid", "user", "mode", "gpus", "share", "mem_mib", "start", "end", "created",
    "op_id", "note", "cancelled_at", "cancelled_by", "cancel_reason", "edits", "job",
    "advance", "shared_with",
))


def _opt_time(v) -> int | None:
    return None if v is None else parse_utc(v)


# --- records ----------------------------------------------------------------

def canonical(v):
    """``v`` with every dict's keys in sorted order (lists keep theirs)."""
    if type(v) is dict:
        return {k: canonical(v[k]) for k in sorted(v)}
    if type(v) is list:
        return [canonical(x) for x in v]
    return v


def edit_to_dict(e: Edit) -> dict:
    d = {"actor": e.actor, "actor_uid": e.actor_uid, "after": canonical(e.after),
         "at": format_utc(e.at), "before": canonical(e.before)}
    if e.extra:
        d = canonical({**{k: v for k, v in e.extra.items() if k not in Edit.NAMES}, **d})
    return d


def edit_from_dict(d: dict) -> Edit:
    unknown = d.keys() - set(Edit.NAMES)
    return Edit(parse_utc(d["at"]), int(d["actor_uid"]), str(d["actor"]),
                dict(d.get("before") or {}), dict(d.get("after") or {}),
                {k: d[k] for k in unknown} if unknown else {})


def reservation_to_dict(r: Reservation) -> dict:
    """The document form: keys sorted, fields at their default (None, no
    edits) left out, unknown fields kept.  ``Reservation.to_dict`` writes
    the same content with every field present."""
    d = {}
    if r.advance is not None:
        d["advance"] = canonical(r.advance.to_dict())
    if r.cancel_reason is not None:
        d["cancel_reason"] = r.cancel_reason
    if r.cancelled_at is not None:
        d["cancelled_at"] = format_utc(r.cancelled_at)
    if r.cancelled_by is not None:
        d["cancelled_by"] = r.cancelled_by
    d["created"] = format_utc(r.created)
    if r.edits:
        d["edits"] = [edit_to_dict(e) for e in r.edits]
    d["end"] = format_utc(r.end)
    d["gpus"] = list(r.gpus)
    d["id"] = r.id
    if r.job is not None:
        d["job"] = canonical(r.job.to_dict())
    if r.mem_mib is not None:
        d["mem_mib"] = r.mem_mib
    d["mode"] = r.mode
    if r.note is not None:
        d["note"] = r.note
    if r.op_id is not None:
        d["op_id"] = r.op_id
    d["share"] = r.share
    if r.shared_with:
        d["shared_with"] = list(r.shared_with)
    d["start"] = format_utc(r.start)
    d["uid"] = r.uid
    d["user"] = r.user
    if r.extra:
        merged = {k: v for k, v in r.extra.items() if k not in _RES_KEYS}
        merged.update(d)
        d = canonical(merged)
    return d


class DocKeep:
    """Which reservations a view needs, tested on their document form
    before any record is built: the caller's (``uid``), and those that hold
    capacity somewhere in ``[lo, hi)`` (not cancelled; ``hi`` None: no end),
    those shared with others (``shared``: the caller may be one of them),
    or at all on a GPU numbered ``gpu_count`` or more (a view shows those
    GPUs whatever the window), or whose ID starts with ``prefix`` (the
    booking a command names by an ID prefix, anyone's); with no argument,
    none (a read for the policy, the notices, the blackouts: ``loads``
    does not even parse the reservations then).  Times compare as the
    fixed-width strings ``format_utc`` writes, which sort as the instants
    do.

    ``holds``: each live booking not kept (not cancelled, ending after
    ``lo``) is still summarised, as ``hold(d)`` in ``LedgerState.holds``:
    a view that needs only where capacity is held later (``bk st``'s next
    free time) gets that without a record built per booking."""

    def __init__(self, *, uid: int | None = None, lo: int | None = None, hi: int | None = None,
                 gpu_count: int | None = None, shared: bool = False, holds: bool = False,
                 prefix: str | None = None):
        self.uid, self.gpu_count, self.shared, self.holds = uid, gpu_count, shared, holds
        self.prefix = prefix
        self.window = lo is not None
        self.lo = format_utc(lo) if lo is not None else ""
        self.hi = format_utc(hi) if hi is not None else None

    @property
    def none(self) -> bool:
        """Keeps no reservation and summarises none (``loads`` skips them)."""
        return (self.uid is None and self.prefix is None and not self.window and self.gpu_count is None
                and not self.shared and not self.holds)

    def __call__(self, d: dict) -> bool:
        if self.uid is not None and d["uid"] == self.uid:
            return True
        if self.prefix is not None and d["id"].startswith(self.prefix):
            return True
        if "cancelled_at" in d:
            return False
        if self.shared and "shared_with" in d:
            return True
        if self.gpu_count is not None and d["end"] > self.lo and max(d["gpus"]) >= self.gpu_count:
            return True
        return self.window and d["end"] > self.lo and (self.hi is None or d["start"] < self.hi)

    def hold(self, d: dict) -> tuple | None:
        """A booking not kept, as ``LedgerState.holds`` has it; None when it
        holds nothing from ``lo`` on (or summaries were not asked for)."""
        if not self.holds or "cancelled_at" in d or not d["end"] > self.lo:
            return None
        return (d["start"], d["end"], d["gpus"])


# The fields of a booking that convert without a nested record: most
# bookings have no others, and a write decodes every one of them.
_SCALAR_KEYS = frozenset((
    "id", "uid", "user", "mode", "gpus", "share", "mem_mib", "start", "end", "created",
    "op_id", "note", "cancelled_at", "cancelled_by", "cancel_reason",
))


def reservation_from_dict(d: dict) -> Reservation:
    """Like ``Reservation.from_dict``; raises KeyError/TypeError/ValueError."""
    if d.keys() <= _SCALAR_KEYS:
        # The same conversion without the fields it lacks (their defaults:
        # no edits, job, advance, sharing or unknown fields), a third faster.
        get = d.get
        cancelled = get("cancelled_at")
        return Reservation(
            d["id"], d["uid"], d["user"], d["mode"], tuple(d["gpus"]), d["share"],
            parse_utc(d["start"]), parse_utc(d["end"]), parse_utc(d["created"]),
            get("mem_mib"), get("op_id"), get("note"), None if cancelled is None else parse_utc(cancelled),
            get("cancelled_by"), get("cancel_reason"))
    unknown = d.keys() - _RES_KEYS
    edits = d.get("edits")
    return Reservation(
        d["id"], d["uid"], d["user"], d["mode"], tuple(d["gpus"]), d["share"],
        parse_utc(d["start"]), parse_utc(d["end"]), parse_utc(d["created"]),
        d.get("mem_mib"), d.get("op_id"), d.get("note"), _opt_time(d.get("cancelled_at")),
        d.get("cancelled_by"), d.get("cancel_reason"),
        [edit_from_dict(e) for e in edits] if edits else [], _job(d.get("job")),
        _advance(d.get("advance")), _names(d.get("shared_with")),
        {k: d[k] for k in unknown} if unknown else {},
    )


def _advance(v: object):
    """An advance record; anything else is passed through for validation to refuse."""
    if v is None:
        return None
    try:
        return Advance.from_dict(v)
    except (KeyError, TypeError, ValueError):
        return v


def _names(v: object):
    if v is None:
        return ()
    return tuple(v) if type(v) is list else v


def _job(v: object):
    """A job record; anything else is passed through for validation to refuse."""
    if type(v) is dict and type(v.get("status")) is str:
        return Job.from_dict(v)
    return v


def closed_at(r: Reservation) -> int:
    """When a booking stopped mattering: its end, or its cancellation if earlier."""
    if r.cancelled_at is not None and r.cancelled_at < r.end:
        return r.cancelled_at
    return r.end


# --- document ---------------------------------------------------------------

@dataclass
class DocMeta:
    """What a document says about the commit that wrote it (not ledger data)."""

    version: int | None = None
    seq: int = 0
    commit: str | None = None
    written_at: int | None = None
    journal_seq: int | None = None
    journal: list[dict] = field(default_factory=list)
    partial: bool = False            # decoded with ``keep``: only some reservations

    @property
    def newer(self) -> bool:
        return isinstance(self.version, int) and self.version > VERSION


def encode(state: LedgerState, *, commit: str, written_at: int, journal: list[dict]) -> dict:
    """The document for ``state`` as committed with seq ``state.seq``; every
    dict in it has its keys sorted, so ``dumps`` output is canonical."""
    doc = {
        "blackouts": [canonical(b.to_dict()) for b in state.blackouts],
        "commit": commit, "format": FORMAT,
        "journal": {"audit": canonical(journal), "seq": state.seq},
        "notices": [canonical(n.to_dict()) for n in state.notices],
        "ops": [canonical(o.to_dict()) for o in state.ops],
        "policy": canonical(state.policy),
        "reservations": [reservation_to_dict(r) for r in state.reservations],
        "seq": state.seq, "version": VERSION, "written_at": format_utc(written_at),
    }
    if state.extra:
        extra = {k: v for k, v in state.extra.items() if k not in _TOP_KEYS}
        extra.update(doc)
        doc = {k: extra[k] if k in _TOP_KEYS else canonical(extra[k]) for k in sorted(extra)}
    return doc


def dumps(doc: dict) -> bytes:
    """Compact ASCII JSON and a newline.  ``encode`` sorts every dict's keys,
    so the same state always gives the same bytes (files can be compared
    and hashed) without paying for ``sort_keys`` on every commit."""
    text = jsonfast.dumps(doc, separators=(",", ":"), allow_nan=False, check_circular=False)
    return text.encode("ascii") + b"\n"


_SEAL = b',"digest":"crc32:'
_SEAL_LEN = len(_SEAL) + 8 + 3          # the head, eight hex digits, '"}' and the newline


def seal(data: bytes) -> bytes:
    """``dumps`` output with its digest appended as the document's last key."""
    if not data.endswith(b"}\n") or len(data) < 4:
        raise ValueError("not a dumps() document")
    body = data[:-2]
    return b'%s%s%08x"}\n' % (body, _SEAL, zlib.crc32(body))


def sealed(data: bytes) -> bool | None:
    """True: the last key is a digest of the bytes before it; False: it is
    there and does not match; None: the document carries no seal."""
    tail = data[-_SEAL_LEN:]
    if len(data) <= _SEAL_LEN or not tail.startswith(_SEAL) or not tail.endswith(b'"}\n'):
        return None
    try:
        want = int(tail[len(_SEAL):-3], 16)
    except ValueError:
        return False
    return zlib.crc32(memoryview(data)[:-_SEAL_LEN]) == want


# The writer encodes records one by one, so it keeps one encoder (json.dumps
# would build one for every call made with options).
_encode_json = jsonfast.encoder(separators=(",", ":"), allow_nan=False, check_circular=False)

# --- the writer's shortcuts: what one transaction changed ---------------------

MAX_MOVED = 64       # positions a Delta compares one by one; past that, by identity


class Delta:
    """How a transaction changed one list of frozen records (the bookings,
    the op keys): the records it added (new ones, and changed ones, which
    are new records) and those it took away, told apart by identity.

    A transaction appends, replaces a record where it stood, or removes
    some; the common cases leave most positions holding the same object.
    So the lists are first compared position by position (``is``, at C
    speed, no object made per record); when few positions differ, those
    and the tail are the whole change (``at``).  Anything else (a removal
    in the middle shifts every record after it) is compared by identity
    (``at`` None)."""

    __slots__ = ("old", "new", "fresh", "gone", "at")

    def __init__(self, old: list, new: list, fresh: list, gone: list, at: list[int] | None):
        self.old, self.new, self.fresh, self.gone, self.at = old, new, fresh, gone, at

    @classmethod
    def of(cls, old: list, new: list) -> Delta | None:
        """None when ``new`` lists one record twice."""
        from itertools import compress
        from operator import is_not, not_

        n = min(len(old), len(new))
        at = list(compress(range(n), map(is_not, old, new)))
        if len(at) <= MAX_MOVED:
            return cls(old, new, [new[i] for i in at] + new[n:], [old[i] for i in at] + old[n:], at)
        old_ids, new_ids = set(map(id, old)), set(map(id, new))
        if len(new_ids) != len(new):
            return None
        return cls(old, new, list(compress(new, map(not_, map(old_ids.__contains__, map(id, new))))),
                   list(compress(old, map(not_, map(new_ids.__contains__, map(id, old))))), None)

    def encoded(self, old_bytes: list[bytes], to_bytes) -> list[bytes]:
        """The bytes of ``new``'s records, given ``old_bytes`` for ``old``'s."""
        new = self.new
        if self.at is not None:
            n = min(len(self.old), len(new))
            out = old_bytes[:n]
            for i in self.at:
                out[i] = to_bytes(new[i])
            out.extend(map(to_bytes, new[n:]))
            return out
        memo = dict(zip(map(id, self.old), old_bytes, strict=True))
        get = memo.get
        return [get(id(r)) or to_bytes(r) for r in new]


# The writer's document from parts (each record's bytes kept, the lists as
# chunks, the seal's CRC combined) is bk.core.docparts, which only writers load.


def _no_constants(name: str):
    raise ValueError(f"{name} is not valid JSON")


class _Dropped:
    """A reservation a reader's ``DocKeep`` does not keep, in its place in
    the document's list: the record's dict was let go as soon as it was
    parsed."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<dropped>"


DROPPED = _Dropped()


def loads(data: bytes, keep=None) -> dict:
    """Bytes -> dict.  Raises ValueError (never returns a non-dict).

    ``keep`` (a ``DocKeep``; a reader of a sealed document only): the
    reservations it does not keep are ``DROPPED`` in the list.  The JSON
    parser hands every object it completes to a hook before it parses the
    next, so a booking the view does not need is judged and let go at once
    and a read of a few bookings never holds the dicts of all of them (at
    10,000 that is most of the memory of ``bk l``).  The hook only sees an
    object, not where it sits; one that looks like a booking elsewhere
    would be dropped too, so every drop is counted, and unless each one is
    found in the reservations list the document is parsed again whole."""
    if keep is not None:
        doc = _loads_skipping(data) if keep.none else _loads_dropping(data, keep)
        if doc is not None:
            return doc
    try:
        doc = jsonfast.loads(data, parse_constant=_no_constants)
    except (UnicodeDecodeError, RecursionError) as e:
        raise ValueError(str(e)) from None
    if not isinstance(doc, dict):
        raise ValueError(f"the document is a JSON {type(doc).__name__}, not an object")
    return doc


def _loads_dropping(data: bytes, keep) -> dict | None:
    dropped = 0
    lo = keep.lo if keep.holds else None
    held: list = []                        # keep.hold of the dropped, in document order

    def hook(d: dict):
        nonlocal dropped
        if "created" in d and "gpus" in d and "uid" in d and "id" in d:
            try:
                if not keep(d):
                    # keep.hold(d), inline: this runs once per booking.
                    if lo is not None and "cancelled_at" not in d and d["end"] > lo:
                        held.append((d["start"], d["end"], d["gpus"]))
                    dropped += 1
                    return DROPPED
            except (KeyError, TypeError, ValueError, AttributeError):
                pass                       # kept: conversion says what is wrong with it
        return d
    try:
        doc = jsonfast.loads(data, object_hook=hook, parse_constant=_no_constants)
    except (UnicodeDecodeError, RecursionError):
        return None                        # the plain parse says so
    if not isinstance(doc, dict):
        return None
    if dropped:
        res = doc.get("reservations")
        if type(res) is not list or res.count(DROPPED) != dropped:
            return None
    if lo is not None:
        # Every drop is in the reservations list, so ``held`` is theirs.  A
        # key that is no string: no JSON document has it (decode takes it).
        doc[DROPPED] = held
    return doc


_scan: list = []            # the JSON scanner ``_loads_skipping`` uses, made on first use


def _scanner():
    if not _scan:
        _scan.extend(jsonfast.scanners(_no_constants))
    return _scan


def _loads_skipping(data: bytes) -> dict | None:
    """The document without its reservations (an empty list), for a read
    that keeps none (``DocKeep()``: the notices, the policy): they are most
    of its bytes, and not even parsed.

    How the list is found without parsing it.  The writer sorts the keys,
    so the top-level object is read pair by pair with the JSON parser's
    own scanner up to the key "reservations"; its value ends where the
    pairs after it begin: ``,"seq":`` (the last place those bytes occur;
    within a string they cannot, a quote there is escaped), from where the
    pairs are read again up to the object's end.  Found anywhere else
    (inside a value after the list), the pairs from it do not end the
    document, and the document is parsed whole (None).  Top-level keys
    between "reservations" and "seq" (none that bk writes; a newer bk's)
    would be skipped with the list: such a read is partial (never
    committed), and none of its readers looks at them."""
    try:
        s = data.decode("ascii")
    except UnicodeDecodeError:
        return None
    scan, string = _scanner()
    doc: dict = {}
    try:
        if s[0] != "{":
            return None
        i = 1
        while True:                          # the head, up to "reservations"
            if s[i] != '"':
                return None
            key, i = string(s, i + 1)
            if s[i] != ":":
                return None
            if key == "reservations":
                break
            doc[key], i = scan(s, i + 1)
            if s[i] != ",":
                return None
            i += 1
        start = i + 1
        i = s.rfind(',"seq":')
        if s[start] != "[" or i <= start or s[i - 1] != "]":
            return None
        while s[i] == ",":                   # the tail, from "seq" to the end
            if s[i + 1] != '"':
                return None
            key, i = string(s, i + 2)
            if s[i] != ":" or key == "reservations":
                return None
            doc[key], i = scan(s, i + 1)
        if s[i] != "}" or s[i + 1:] not in ("", "\n"):
            return None
    except (IndexError, StopIteration, ValueError, RecursionError):
        return None                          # the plain parse says what is wrong
    doc["reservations"] = []
    return doc


class _Problems(list):
    """A problem list that stops growing at MAX_PROBLEMS (and says so)."""

    dropped = 0

    def add(self, msg: str) -> None:
        if len(self) < MAX_PROBLEMS:
            self.append(msg)
        else:
            self.dropped += 1

    def done(self) -> list[str]:
        out = list(self)
        if self.dropped:
            out.append(f"... and {counted(self.dropped, 'more problem')}")
        return out


def _why(e: Exception) -> str:
    if isinstance(e, KeyError):
        return f"missing field {e.args[0]!r}"
    return str(e) or type(e).__name__


def _records(doc: dict, key: str, conv, out: list, probs: _Problems, keep=None, holds=None) -> None:
    items = doc.get(key, [])
    if not isinstance(items, list):
        probs.add(f"{key}: expected a list, got {type(items).__name__}")
        return
    for i, d in enumerate(items):
        if d is DROPPED:                   # loads(keep=...): not kept (summarised by loads)
            continue
        if not isinstance(d, dict):
            probs.add(f"{key}[{i}]: expected an object, got {type(d).__name__}")
            continue
        if keep is not None:
            try:
                if not keep(d):
                    h = keep.hold(d)
                    if h is not None:
                        holds.append(h)
                    continue
            except (KeyError, TypeError, ValueError, AttributeError):
                pass                       # conversion says what is wrong with it
        try:
            out.append(conv(d))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            rid = d.get("id") if isinstance(d.get("id"), str) else None
            probs.add(f"{key}[{i}]{f' (id {rid[:8]})' if rid else ''}: {_why(e)}")


def decode(doc: dict, keep=None) -> tuple[LedgerState | None, DocMeta, list[str]]:
    """Document -> (state, meta, problems).  ``state`` is None when the
    document cannot be read at all (wrong format or version).

    ``keep``: a test of a reservation's raw dict (``DocKeep``); the others
    are neither converted nor checked.  Only for a sealed document, whose
    every record a writer checked, and only for a reader: the state is then
    a part of the ledger, never one to commit."""
    meta = DocMeta()
    probs = _Problems()
    if not isinstance(doc, dict):
        return None, meta, [f"the document is a JSON {type(doc).__name__}, not an object"]
    held = doc.pop(DROPPED, None)          # loads(keep=DocKeep(holds=True)): the dropped, summarised
    if doc.get("format") != FORMAT:
        return None, meta, [f"format is {doc.get('format')!r}, expected {FORMAT!r}"]
    meta.version = doc.get("version")
    if type(meta.version) is not int or meta.version < 1:
        return None, meta, [f"version is {meta.version!r}, expected an integer >= 1"]
    if meta.newer:
        return None, meta, [f"format version {meta.version} is newer than this bk understands "
                            f"({VERSION})"]
    seq = doc.get("seq")
    if type(seq) is not int or seq < 0:
        probs.add(f"seq is {seq!r}, expected an integer >= 0")
        seq = 0
    meta.seq = seq
    commit = doc.get("commit")
    meta.commit = commit if isinstance(commit, str) else None
    try:
        meta.written_at = _opt_time(doc.get("written_at"))
    except ValueError as e:
        probs.add(f"written_at: {e}")
    journal = doc.get("journal")
    if journal is not None:
        if (not isinstance(journal, dict) or type(journal.get("seq")) is not int
                or not isinstance(journal.get("audit"), list)
                or not all(isinstance(a, dict) for a in journal["audit"])):
            probs.add("journal: expected {\"seq\": int, \"audit\": [objects]}")
        else:
            meta.journal_seq = journal["seq"]
            meta.journal = journal["audit"]
            if meta.journal_seq != seq:
                probs.add(f"journal seq {meta.journal_seq} differs from seq {seq}")
    policy = doc.get("policy")
    if policy is not None and not isinstance(policy, dict):
        probs.add(f"policy: expected an object or null, got {type(policy).__name__}")
        policy = None
    state = LedgerState(seq=seq, policy=policy,
                        extra={k: v for k, v in doc.items() if k not in _TOP_KEYS})
    meta.partial = keep is not None
    _records(doc, "reservations", reservation_from_dict, state.reservations, probs, keep, state.holds)
    if held is not None:
        state.holds = held
    _records(doc, "blackouts", Blackout.from_dict, state.blackouts, probs)
    _records(doc, "notices", Notice.from_dict, state.notices, probs)
    _records(doc, "ops", OpRecord.from_dict, state.ops, probs)
    return state, meta, probs.done()


def plain_copy(v):
    """A JSON value copied all the way down (a policy, top-level extras)."""
    if type(v) is dict:
        return {k: plain_copy(x) for k, x in v.items()}
    if type(v) is list:
        return [plain_copy(x) for x in v]
    return v
