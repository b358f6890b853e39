"""The audit log: append-only JSON lines, read from the end, bounded.

One line per record::

    {"time": "2026-07-13T18:00:00Z", "seq": 17, "index": 0, "uid": 1000,
     "user": "ada", "action": "create", "reservation": "3f6c...",
     "op_id": null, "before": null, "after": {...}, "result": "created"}

``seq`` is the ledger commit that made the change and ``index`` the
record's place within that commit, so ``(seq, index)`` names a record.  The
writer appends only while it holds the ledger lock, and only after the
ledger that contains the same records (its journal) is durable; the next
writer repairs a log that lost or tore them (see ``scan_commit`` and
docs/ARCHITECTURE.md, "Storage").

What the kernel guarantees about the appends, and what it does not:
``O_APPEND`` moves every ``write`` to the end of the file atomically, so
appends never overwrite each other; but a write can stop partway when the
disk fills or the machine loses power (and a ``kill -9`` between pages of a
large write), leaving a last line without its newline.  Readers therefore
tolerate one torn final line, report other malformed lines, and never fail
because of them.  The reader walks backwards in blocks and stops after
``limit`` entries or ``max_bytes``, so its cost does not grow with the log.
"""

from __future__ import annotations

import os

from bk.core import jsonfast
from bk.core.record import dataclass, field
from bk.core.timegrid import counted

TYPE_CHECKING = False
if TYPE_CHECKING:   # annotations only: collections.abc would import collections
    from collections.abc import Callable, Iterator

FIELDS = ("time", "seq", "index", "uid", "user", "action", "reservation", "op_id",
          "before", "after", "result")
BLOCK = 65536
MAX_SCAN = 16 << 20
MAX_PROBLEMS = 20


def make_records(items: list[dict], *, seq: int, time: str, uid: int, user: str) -> list[dict]:
    """Complete the records a transaction supplied: the store sets time,
    seq and index, and uid and user unless the item names its own actor (a
    group commit carries several callers' writes); other keys (an ``owner``
    uid, say) are kept."""
    out = []
    for i, item in enumerate(items):
        rec = {"time": time, "seq": seq, "index": i, "uid": item.get("uid", uid),
               "user": item.get("user", user)}
        for k in FIELDS[5:]:
            rec[k] = item.get(k)
        for k in sorted(item):
            if k not in rec:
                rec[k] = item[k]
        out.append(rec)
    return out


def encode(records: list[dict]) -> bytes:
    return b"".join(jsonfast.dumps(r, separators=(",", ":"), allow_nan=False).encode("ascii") + b"\n"
                    for r in records)


class Backwards:
    """Lines of a file from the last to the first, as ``(offset, line,
    terminated)``; ``terminated`` is False only for a final line that lacks
    its newline.  Reads at most ``max_bytes``; ``complete`` tells whether it
    reached the start of the file.

    With ``needle``, only the newest ``head`` lines and the lines that
    contain ``needle`` are yielded, found with ``bytes.rfind`` over each
    block: the lines in between are never split out, so a search for one
    user's thin thread through a large log costs about what reading it
    costs (Python's per-line loop was nine tenths of the time)."""

    def __init__(self, fd: int, size: int, max_bytes: int | None = None, *,
                 needle: bytes | None = None, head: int = 2, block: int = BLOCK,
                 pause: Callable[[], object] | None = None):
        self.fd, self.size, self.max_bytes = fd, size, max_bytes
        self.needle, self.head, self.block, self.pause = needle, head, block, pause
        self.complete = True
        self.read = 0                  # bytes read so far

    def _blocks(self) -> Iterator[tuple[int, bytes]]:
        """(offset, bytes) of the blocks before the end, last first, within the budget."""
        pos, budget = self.size, self.max_bytes
        while pos > 0:
            n = min(self.block, pos) if budget is None else min(self.block, pos, budget)
            if n <= 0:
                self.complete = False
                return
            pos -= n
            if budget is not None:
                budget -= n
            self.read += n
            if self.pause is not None:
                self.pause()
            yield pos, os.pread(self.fd, n, pos)

    def __iter__(self) -> Iterator[tuple[int, bytes, bool]]:
        if self.needle is not None:
            yield from self._matching()
            return
        pos, pending, tail_terminated = self.size, b"", False
        for pos, data in self._blocks():
            pending = data + pending
            parts = pending.split(b"\n")
            end = pos + len(pending)
            last = len(parts) - 1
            for i in range(last, 0, -1):
                line = parts[i]
                start = end - len(line)
                terminated = tail_terminated or i != last
                if line or terminated:
                    yield start, line, terminated
                end = start - 1
            if last:
                tail_terminated = True
            pending = parts[0]
        if self.complete and (pending or tail_terminated):
            yield 0, pending, tail_terminated

    def _matching(self) -> Iterator[tuple[int, bytes, bool]]:
        # ``carry``: the oldest partial line so far; it ends where a newline
        # starts or, before any newline was met, at the end of the file
        # (``at_end``: a line there lacks its newline).
        needle, head = self.needle, self.head
        carry, at_end = b"", True
        for pos, data in self._blocks():
            data += carry
            lo = data.find(b"\n") + 1           # data[lo:] holds whole lines only
            if not lo:
                carry = data
                continue
            end = len(data)                      # the unread text is data[lo:end]
            while head and end >= lo:
                s = data.rfind(b"\n", lo, end) + 1 or lo
                line = data[s:end]
                terminated = end < len(data) or not at_end
                if line or terminated:
                    head -= bool(line)
                    yield pos + s, line, terminated
                end = s - 1
            while end > lo:
                j = data.rfind(needle, lo, end)
                if j < 0:
                    break
                s = data.rfind(b"\n", lo, j) + 1 or lo
                e = data.find(b"\n", j)
                terminated = e >= 0 or not at_end
                yield pos + s, data[s:e if e >= 0 else len(data)], terminated
                end = s - 1
            carry, at_end = data[:lo - 1], False
        if self.complete and (carry or not at_end) and (head or needle in carry):
            yield 0, carry, not at_end


def parse(line: bytes) -> dict:
    """One line -> record; ValueError says why it is not one."""
    try:
        rec = jsonfast.loads(line)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"not JSON ({str(e)[:60]})") from None
    if not isinstance(rec, dict):
        raise ValueError("not a JSON object")
    if type(rec.get("seq")) is not int or type(rec.get("index")) is not int:
        raise ValueError("no integer seq and index")
    return rec


@dataclass
class AuditTail:
    """The newest ``limit`` matching records, oldest first.  ``problems``
    lists malformed lines met on the way; ``complete`` is False when the
    scan stopped at ``max_bytes`` before finding ``limit`` records."""

    entries: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    complete: bool = True
    scanned: int = 0               # bytes of log read to find them


def _matches(rec: dict, uid: int | None, reservation: str | None = None) -> bool:
    if reservation is not None and rec.get("reservation") != reservation:
        return False
    return uid is None or rec.get("uid") == uid or rec.get("owner") == uid


def needle(uid: int | None, reservation: str | None) -> bytes | None:
    """Bytes every line of a matching record contains, or None (no filter).

    A record's uid and owner are JSON integers, so their decimal digits are
    in the line whatever the spacing; a reservation ID is plain ASCII.  A
    line without them cannot match, and is passed over without being
    parsed: a user's trail is a thin thread through everyone's log, and
    parsing every line to find it was most of the cost of a scan."""
    if reservation is not None:
        return reservation.encode("ascii", "replace")
    return None if uid is None else str(uid).encode("ascii")


def read_tail(fd: int | None, *, limit: int, uid: int | None = None, max_bytes: int = MAX_SCAN,
              pending: list[dict] = (), path: str = "audit log",
              reservation: str | None = None, pause: Callable[[], object] | None = None) -> AuditTail:
    """The last ``limit`` records (for ``uid``: acted by or about that user;
    for ``reservation``: about that booking).  ``pause`` is called before
    each block is read (the broker lets a commit in progress finish first).

    ``pending`` are the records of the ledger's newest commit (its journal):
    they are shown even if a crash kept them from reaching the log yet.
    Records are de-duplicated by ``(seq, index)``.  With a filter, lines
    that cannot match (``needle``) are skipped unparsed, so damage in them
    is reported only by an unfiltered read (the administrator's, doctor's).
    """
    out = AuditTail()
    seen: set[tuple[int, int]] = set()
    problems: list[tuple[int, str]] = []
    newest = -1
    found: list[dict] = []
    size = os.fstat(fd).st_size if fd is not None else 0
    want = needle(uid, reservation)
    lines = Backwards(fd, size, max_bytes, needle=want, pause=pause) if fd is not None else ()
    for off, line, terminated in lines:
        if not line.strip():
            continue
        if not terminated:
            problems.append((off, f"{path}: the last line (byte {off}) is incomplete, an "
                                  "interrupted write; ignored"))
            continue
        # The newest record is always parsed: its seq decides which of the
        # journal's records the log lacks (below).
        if want is not None and newest >= 0 and want not in line:
            continue
        try:
            rec = parse(line)
        except ValueError as e:
            if len(problems) < MAX_PROBLEMS:
                problems.append((off, f"{path}: line at byte {off}: {e}; skipped"))
            continue
        newest = max(newest, rec["seq"])
        key = (rec["seq"], rec["index"])
        if key in seen:
            continue
        seen.add(key)
        if _matches(rec, uid, reservation):
            found.append(rec)
            if len(found) >= limit:
                break
    else:
        out.complete = getattr(lines, "complete", True)
    out.scanned = getattr(lines, "read", 0)
    # The journal's records join those the log lacks (a crash may have torn
    # or lost their append); a log that went past the journal's commit (a
    # ledger restored from a backup) takes precedence.
    found.extend(r for r in pending if isinstance(r, dict) and type(r.get("seq")) is int
                 and type(r.get("index")) is int and r["seq"] >= newest
                 and (r["seq"], r["index"]) not in seen and _matches(r, uid, reservation))
    found.sort(key=lambda r: (r["seq"], r["index"]))
    out.entries = found[-limit:] if limit > 0 else []
    out.problems = [msg for _off, msg in sorted(problems)]
    return out


@dataclass
class CommitScan:
    """What the end of the log says about one commit."""

    last_seq: int = 0              # newest well-formed record's seq (0: none)
    present: set = field(default_factory=set)   # indexes of ``seq``'s records found
    torn_at: int | None = None     # offset where an unterminated last line starts


def scan_commit(fd: int, seq: int | None, max_bytes: int = MAX_SCAN) -> CommitScan:
    """Look at the end of the log for the records of commit ``seq``.

    Stops at the first record older than ``seq``, so the cost is that of
    the last commit, not of the log.  Malformed lines are skipped here; the
    reader reports them.
    """
    out = CommitScan()
    size = os.fstat(fd).st_size
    for off, line, terminated in Backwards(fd, size, max_bytes):
        if not terminated:
            out.torn_at = off
            continue
        try:
            rec = parse(line)
        except ValueError:
            continue
        out.last_seq = max(out.last_seq, rec["seq"])
        if seq is None or rec["seq"] < seq:
            break
        if rec["seq"] == seq:
            out.present.add(rec["index"])
        elif out.last_seq > seq and not out.present:
            # The log went past this ledger (it was restored from a backup):
            # nothing of ``seq`` can be missing that bk could still add.
            break
    return out


def repair(fd: int, seq: int | None, journal: list[dict]) -> tuple[int, bool]:
    """Make the log (opened ``O_APPEND``, under the ledger lock) hold the
    records of commit ``seq`` that the ledger carries in ``journal``.

    A torn last line is cut off first: it can only belong to the newest
    commit (every writer repairs before it appends), and that commit's
    records are all in the journal.  Returns (newest seq in the log or the
    journal, whether anything was cut or appended).
    """
    scan = scan_commit(fd, seq)
    if scan.torn_at is not None:
        os.ftruncate(fd, scan.torn_at)
    missing = []
    if seq is not None and scan.last_seq <= seq:
        missing = [r for r in journal if r.get("index") not in scan.present]
        if missing:
            data = encode(missing)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
    return max(scan.last_seq, seq or 0), scan.torn_at is not None or bool(missing)


_JOURNAL_KEY = b'"journal":'


def journal_of(ledger_bytes: bytes) -> list[dict]:
    """The audit records a ledger file carries (no validation: for display).

    Only the journal is decoded, not the whole ledger: every audit read
    asks for it, and decoding a ledger of thousands of bookings (with their
    notes) to find one small object cost each read more than its scan.
    Inside a JSON string every quote is escaped, so ``"journal":`` can only
    be a key; ``bk.core.ledgerdoc`` writes the top level's keys sorted, and
    the first such key is the top level's unless a booking-free list before
    it (``blackouts``) carries one.  Anything unexpected falls back to
    decoding the whole document."""
    at = ledger_bytes.find(_JOURNAL_KEY)
    start = at + len(_JOURNAL_KEY)
    # A commit's records are a few KiB: decode a window first, the rest of
    # the file only when the journal is longer than that.
    for end in (start + 65536, len(ledger_bytes)):
        if at <= 0:
            break
        try:
            journal, _ = jsonfast.raw_decode(ledger_bytes[start:end].decode("ascii"))
        except (ValueError, UnicodeDecodeError, RecursionError):
            continue
        if isinstance(journal, dict) and type(journal.get("seq")) is int and isinstance(journal.get("audit"), list):
            return journal["audit"]
        break
    try:
        doc = jsonfast.loads(ledger_bytes)
    except (ValueError, RecursionError):
        return []
    journal = doc.get("journal") if isinstance(doc, dict) else None
    records = journal.get("audit") if isinstance(journal, dict) else None
    return records if isinstance(records, list) else []


def describe_lost(records: list[dict]) -> str:
    """``bookings a1b2c3d4 (ada: create), ...`` from lost audit records (the commits
    a ledger lacks that the log still witnesses)."""
    seen: dict[str, str] = {}
    for e in records:
        rid = e.get("reservation")
        if rid:
            who = e.get("user") or str(e.get("uid"))
            seen.setdefault(rid, f"{str(rid)[:8]} ({who}: {e.get('action')})")
    if not seen:
        return f"{counted(len(records), 'audit record')} and no booking"
    shown = list(seen.values())
    more = f" and {len(shown) - 10} more" if len(shown) > 10 else ""
    return "bookings " + ", ".join(shown[:10]) + more


def head_problem(fd: int) -> str | None:
    """The log must start at commit 1, or where retention trimmed it, at a
    line that is a whole record: None when it does, else what is wrong."""
    head = os.pread(fd, 4096, 0)
    if not head:
        return None
    try:
        rec = jsonfast.loads(head.split(b"\n", 1)[0])
        ok = isinstance(rec, dict) and isinstance(rec.get("seq"), int)
    except ValueError:
        ok = False
    return None if ok else "the audit log does not start with a whole record (its head is damaged)"
