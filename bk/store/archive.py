"""Archive of ended and cancelled bookings: monthly append-only JSON lines.

A booking that ended (or was cancelled) more than ``archive_after_hours``
ago leaves the hot ledger, so a commit costs what the live bookings cost,
not what the history costs.  It goes to ``archive/YYYY-MM.jsonl``, the month
of the moment it stopped mattering (``ledgerdoc.closed_at``), one line per
booking::

    {"seq": 42, "archived_at": "2026-07-14T18:00:00Z", "reservation": {...}}

Ordering, and what a crash leaves: the archive lines are appended and
fsync-ed *before* the ledger without those bookings replaces the old one.
A crash in between leaves the bookings in both places, and the next commit
archives them again; so does a recovery that goes on from an older backup
(``bk admin data recover``), whose ledger still holds bookings archived
since.  The append therefore skips a booking whose identical record is
already in the last ``TAIL_BYTES`` of its month file, which is where the
previous, unacknowledged copy was written (a read of bounded size, so the
archive's size still does not change a commit's cost).  A copy it cannot
see (a duplicate older than that) is harmless: readers keep the copy with
the highest ``seq`` (the later line on a tie).  A crash inside
the append leaves a last line without its newline; the next append cuts
that fragment off first (its booking is still in the ledger) so that the
fragment and the next record never run together into one bad line.

Retention: a month file is deleted once its whole month is older than
``ledger_retention_days``; readers also skip older records in the files
that remain.  A commit touches only the files it appends to and lists the
directory, so the size of the archive does not change its cost.
"""

from __future__ import annotations

import os

from bk.core import jsonfast, ledgerdoc, utctime
from bk.core.models import LedgerState, Reservation
from bk.store.fsutil import (
    O_CLOEXEC,
    NamePattern,
    Safety,
    fsync_dir,
    io_error,
    open_file,
    read_all,
    unlink_quietly,
    write_all,
)

NAME = NamePattern(4, "-", 2, ".jsonl")


def earliest_close(reservations) -> float:
    """The earliest moment one of ``reservations`` stopped mattering
    (``ledgerdoc.closed_at``; infinity for none): until ``archive_after``
    past it, no commit has anything to archive or drop."""
    return min(map(ledgerdoc.closed_at, reservations), default=float("inf"))


def committed(state: LedgerState, *, now: int, archive_after: int,
              earliest: float | None = None) -> dict[str, str]:
    """Before ``apply`` runs: the bookings that may be archived, as their
    canonical JSON.  Only these can move, and only if ``apply`` left them
    unchanged: the archive is written before the commit point, so a
    booking created or changed by this very transaction must not reach it
    (a crash would leave an unacknowledged write in the archive).  Such a
    booking moves at the next commit.  ``earliest``: at most the earliest
    ``closed_at`` of the bookings (``earliest_close``), when the caller
    knows it: nothing closed, nothing to look for."""
    move_before = now - archive_after
    if earliest is not None and earliest > move_before:
        return {}
    return {r.id: _canonical(r) for r in state.reservations
            if not (r.cancelled_at is None and r.end > move_before)
            and ledgerdoc.closed_at(r) <= move_before}


def _canonical(r: Reservation) -> str:
    return jsonfast.dumps(ledgerdoc.reservation_to_dict(r), sort_keys=True)


def split(state: LedgerState, *, now: int, archive_after: int, retention: int,
          movable: dict[str, str], earliest: float | None = None) -> list[Reservation]:
    """Take bookings closed for longer than ``archive_after`` seconds out of
    ``state`` and return those to archive (only ``movable`` ones, see
    ``committed``); drop what is past ``retention`` (bookings, op-id keys,
    notices, blackouts) without archiving it.  ``earliest`` as for
    ``committed``, of the bookings ``state`` holds now: when none has closed
    long enough to move or drop, they are not looked at one by one (the
    list is then left as it was)."""
    move_before, drop_before = now - archive_after, now - retention
    keep, moved = state.reservations, []
    if earliest is None or earliest <= move_before or earliest < drop_before:
        keep = []
        for r in state.reservations:
            if r.cancelled_at is None and r.end > move_before:
                keep.append(r)
                continue
            closed = ledgerdoc.closed_at(r)
            if closed < drop_before:
                continue
            if closed <= move_before and movable.get(r.id) == _canonical(r):
                moved.append(r)
            else:
                keep.append(r)
        if len(keep) != len(state.reservations):
            state.reservations = keep
    # An op-id key answers retries while its booking is hot, or for the
    # archive window after it was used; older keys are forgotten.
    if any(o.at <= move_before for o in state.ops):
        live = {r.id for r in keep}
        state.ops = [o for o in state.ops if o.reservation in live or o.at > move_before]
    state.notices = [n for n in state.notices
                     if not ((n.until is not None and n.until < drop_before)
                             or (n.archived and n.at < drop_before))]
    state.blackouts = [b for b in state.blackouts if b.end >= drop_before]
    return moved


def month_name(t: int) -> str:
    return utctime.format_utc(t)[:7] + ".jsonl"


def month_end(name: str) -> int | None:
    """First second after the month a file name stands for."""
    m = NAME.match(name)
    if not m:
        return None
    y, mo = int(m.group(1)), int(m.group(2))
    y, mo = (y + 1, 1) if mo == 12 else (y, mo + 1)
    return utctime.days_from_civil(y, mo, 1) * 86400


def group(moved: list[Reservation], *, seq: int, now: int) -> dict[str, bytes]:
    """The bytes to append to each month file."""
    stamp = utctime.format_utc(now)
    out: dict[str, list[bytes]] = {}
    for r in moved:
        line = jsonfast.dumps({"seq": seq, "archived_at": stamp,
                           "reservation": ledgerdoc.reservation_to_dict(r)},
                          separators=(",", ":"), allow_nan=False)
        out.setdefault(month_name(ledgerdoc.closed_at(r)), []).append(line.encode("ascii") + b"\n")
    return {name: b"".join(lines) for name, lines in out.items()}


def last_line_end(fd: int, size: int) -> int:
    """Offset just after the last newline (0 if there is none)."""
    pos = size
    while pos > 0:
        n = min(65536, pos)
        pos -= n
        i = os.pread(fd, n, pos).rfind(b"\n")
        if i >= 0:
            return pos + i + 1
    return 0


def cut_torn_tail(fd: int) -> bool:
    """Drop an unterminated last line (an interrupted append)."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return False
    os.ftruncate(fd, last_line_end(fd, size))
    return True


TAIL_BYTES = 1 << 20            # how far back an append looks for a booking it would repeat


def _archived_tail(fd: int) -> set[str]:
    """The bookings (canonical JSON) of the whole lines in the file's last
    ``TAIL_BYTES``."""
    size = os.fstat(fd).st_size
    start = max(0, size - TAIL_BYTES)
    data = os.pread(fd, size - start, start)
    if start:
        data = data[data.find(b"\n") + 1:]            # from the first whole line
    out = set()
    for line in data.split(b"\n"):
        try:
            rec = jsonfast.loads(line)["reservation"]
        except (ValueError, TypeError, KeyError):
            continue
        out.add(jsonfast.dumps(rec, sort_keys=True))
    return out


def _not_yet(lines: bytes, seen: set[str]) -> bytes:
    """The lines of ``lines`` whose booking ``seen`` does not hold already."""
    keep = []
    for line in lines.splitlines(keepends=True):
        if jsonfast.dumps(jsonfast.loads(line)["reservation"], sort_keys=True) not in seen:
            keep.append(line)
    return b"".join(keep)


def append(dirfd: int, dirpath: str, safety: Safety, mode: int, groups: dict[str, bytes]) -> None:
    """Append and fsync each month's lines, less the bookings the file's tail
    already holds as they are (an archiving repeated after a crash or a
    recovery, see the module's essay); fsync the directory if a file is new."""
    created = False
    for name in sorted(groups):
        path = os.path.join(dirpath, name)
        exists = _exists(dirfd, name)
        fd = open_file(dirfd, name, path, safety, os.O_RDWR | os.O_APPEND, create_mode=mode)
        try:
            cut_torn_tail(fd)
            data = _not_yet(groups[name], _archived_tail(fd)) if exists else groups[name]
            if data:
                write_all(fd, data)
                os.fsync(fd)
        except OSError as e:
            raise io_error(e, "appending to", path) from None
        finally:
            os.close(fd)
        created = created or not exists
    if created:
        fsync_dir(dirfd, dirpath)


def _exists(dirfd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def prune(dirfd: int, dirpath: str, cutoff: int) -> list[str]:
    """Delete month files whose whole month ended before ``cutoff``."""
    gone = []
    for name in os.listdir(dirfd):
        end = month_end(name)
        if end is not None and end <= cutoff:
            unlink_quietly(dirfd, name)
            gone.append(name)
    if gone:
        fsync_dir(dirfd, dirpath)
    return sorted(gone)


def files(dirfd: int) -> list[str]:
    return sorted(n for n in os.listdir(dirfd) if NAME.match(n))


def read(dirfd: int, dirpath: str, safety: Safety, *, cutoff: int, uid: int | None = None,
         since: int | None = None) -> tuple[list[Reservation], list[str]]:
    """Archived bookings closed at or after ``max(cutoff, since)``, oldest
    first, one per id, and the problems met (malformed lines are skipped)."""
    low = cutoff if since is None else max(cutoff, since)
    best: dict[str, tuple[int, dict]] = {}
    problems: list[str] = []
    for name in files(dirfd):
        if month_end(name) <= low:
            continue
        path = os.path.join(dirpath, name)
        fd = open_file(dirfd, name, path, safety, os.O_RDONLY | O_CLOEXEC)
        if fd is None:
            continue
        try:
            data = read_all(fd)
        except OSError as e:
            raise io_error(e, "reading", path) from None
        finally:
            os.close(fd)
        for seq, rec in _records(data, path, problems, uid):
            if uid is not None and rec.get("uid") != uid:
                continue
            rid = rec.get("id")
            old = best.get(rid)
            if old is None or seq >= old[0]:
                best[rid] = (seq, rec)
    out = []
    for _seq, rec in best.values():
        try:
            r = ledgerdoc.reservation_from_dict(rec)
        except (KeyError, TypeError, ValueError) as e:
            problems.append(f"archived booking {str(rec.get('id'))[:8]}: {e}")
            continue
        if ledgerdoc.closed_at(r) >= low:
            out.append(r)
    out.sort(key=lambda r: (ledgerdoc.closed_at(r), r.id))
    return out, problems


def _records(data: bytes, path: str, problems: list[str], uid: int | None):
    """(seq, reservation dict) per line.  Whole files parse in one
    ``jsonfast.loads`` call; only a file with a bad line is parsed line by line.

    For one user's history, lines that cannot be theirs are skipped before
    parsing: bk writes compact JSON with sorted keys, so a booking of uid N
    contains ``"uid":N,`` (its ``user`` key follows).  A quote inside a
    string is escaped, so text cannot fake the key; a false match (a
    ``uid`` inside a job) is removed after parsing."""
    if data and not data.endswith(b"\n"):
        data = data[:data.rfind(b"\n") + 1]
        problems.append(f"{path}: the last line is incomplete, an interrupted append; ignored")
    lines = [line for line in data.split(b"\n") if line.strip()]
    if uid is not None:
        needle = b'"uid":%d,' % uid
        lines = [line for line in lines if needle in line]
    try:
        items = jsonfast.loads(b"[" + b",".join(lines) + b"]") if lines else []
        bad = None
    except ValueError:
        items, bad = [], True
    if bad:
        items = []
        for n, line in enumerate(lines, 1):
            try:
                items.append(jsonfast.loads(line))
            except ValueError:
                if len(problems) < 20:
                    problems.append(f"{path}: line {n} is not valid JSON; skipped")
    for item in items:
        if (isinstance(item, dict) and type(item.get("seq")) is int
                and isinstance(item.get("reservation"), dict)
                and isinstance(item["reservation"].get("id"), str)):
            yield item["seq"], item["reservation"]
        elif len(problems) < 20:
            problems.append(f"{path}: a line is not an archive record; skipped")
