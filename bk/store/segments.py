"""The audit log's sealed segments: ``audit.d/`` of a data directory.

The live log (``audit.jsonl``, ``bk.store.audit``) grows by every commit;
without rotation it is kept forever.  When it passes the segment size the
writer (holding the ledger lock, after its own records are appended) seals
everything older than its commit into ``audit.d/audit-FIRST-LAST.jsonl``
(the commits it holds) next to ``audit-FIRST-LAST.jsonl.sha256`` (its
SHA-256, as sha256sum writes it), then replaces the live log with its own
commit's records only, so the log still ends with the commit the ledger's
journal holds and the repair step (``audit.repair``) works as before.
Sealed segments whose newest record is older than the retention are
deleted.

Crashes: before the segment is renamed into place the live log is whole (a
stray seal is replaced next time); after it, before the live log is
replaced, the segment and the log both hold the older commits: readers
de-duplicate by ``(seq, index)``, and the next rotation, which starts at
the same first commit, replaces that segment.  Nothing is lost at any step
(``segment_written`` is the crash step the tests kill the writer at).

Readers (``bk lg``, ``bk history``) read the live log first and then the
segments, newest first, until they have as many records as they want;
``bk doctor`` checks every segment against its seal.  The ledger's Store
decides when to rotate and turns a failure into a warning: a rotation is
housekeeping after the commit, never part of it.
"""

from __future__ import annotations

import os

from bk.core.timegrid import counted
from bk.store import audit
from bk.store.fsutil import NamePattern, Safety, io_error, open_file, open_subdir, replace_file

TYPE_CHECKING = False
if TYPE_CHECKING:   # annotations only: collections.abc would import collections
    from collections.abc import Callable

SEGMENTS = "audit.d"
SEGMENT = NamePattern("audit-", 10, "-", 10, ".jsonl")
SEAL_SUFFIX = ".sha256"
SEGMENT_BYTES = 8 << 20
SEGMENT_ENV = "BK_TEST_AUDIT_SEGMENT_BYTES"     # tests only: a small segment size
STEPS = ("segment_written",)                    # reached only when the log is rotated


class Segments:
    """``audit.d/`` of the data directory ``data_dir``, opened through the
    data directory's descriptor like every other file the Store manages."""

    def __init__(self, data_dir: str, safety: Safety, *, file_mode: int, dir_mode: int):
        self.path = os.path.join(data_dir, SEGMENTS)
        self.safety, self.file_mode, self.dir_mode = safety, file_mode, dir_mode

    def rotate(self, dirfd: int, afd: int, start: int, *, cutoff: str,
               replace_live: Callable[[bytes], None], step: Callable[[str], None]) -> list[str]:
        """Seal the live log ``afd``'s bytes before ``start`` into a new
        segment and keep only those after it (``replace_live``); delete the
        segments whose newest record is older than ``cutoff``."""
        sfd = open_subdir(dirfd, SEGMENTS, self.path, self.safety, create_mode=self.dir_mode)
        try:
            def seal_and_write(name: str, data: bytes, seal: bytes) -> None:
                replace_file(sfd, name + SEAL_SUFFIX, self.path, seal, self.file_mode)
                replace_file(sfd, name, self.path, data, self.file_mode)
                step("segment_written")

            return rotate(afd, start, seal_and_write=seal_and_write, replace_live=replace_live, sfd=sfd,
                          cutoff=cutoff)
        finally:
            os.close(sfd)

    def complete(self, dirfd: int, tail: audit.AuditTail, limit: int, uid: int | None,
                 max_bytes: int, *, reservation: str | None = None,
                 budget: int | None = None, pause: Callable[[], object] | None = None) -> audit.AuditTail:
        """``tail`` (read from the live log) completed with older records
        from the segments, newest segment first, until ``limit`` are found
        (or, with ``budget``, until that many bytes have been read in all)."""
        sfd = open_subdir(dirfd, SEGMENTS, self.path, self.safety)
        if sfd is None:
            return tail
        try:
            for name in segment_names(sfd):
                if len(tail.entries) >= limit or not tail.complete:
                    break
                left = max_bytes if budget is None else min(max_bytes, budget - tail.scanned)
                if left <= 0:
                    tail.complete = False
                    break
                path = os.path.join(self.path, name)
                fd = open_file(sfd, name, path, self.safety)
                if fd is None:
                    continue
                try:
                    older = audit.read_tail(fd, limit=limit - len(tail.entries), uid=uid,
                                            max_bytes=left, path=path, reservation=reservation,
                                            pause=pause)
                except OSError as e:
                    raise io_error(e, "reading", path) from None
                finally:
                    os.close(fd)
                tail = merge_tails(tail, older, limit)
        finally:
            os.close(sfd)
        return tail

    def verify(self, dirfd: int) -> list[tuple[str, str | None]]:
        """Each segment, newest first, with what is wrong with it (None: its seal matches)."""
        sfd = open_subdir(dirfd, SEGMENTS, self.path, self.safety)
        if sfd is None:
            return []
        try:
            return [(n, verify_segment(sfd, n)) for n in segment_names(sfd)]
        finally:
            os.close(sfd)


def describe(found: list[tuple[str, str | None]]) -> str | None:
    """``bk doctor``'s line about the segments ``Segments.verify`` found; None without any."""
    if not found:
        return None
    bad = [why for _n, why in found if why]
    return (f"{counted(len(found), 'sealed segment')} in {SEGMENTS}/"
            + (": " + "; ".join(bad[:3]) if bad else ", every seal matches"))


def _first_seq(data: bytes) -> int | None:
    for line in data.split(b"\n"):
        if line.strip():
            try:
                return audit.parse(line)["seq"]
            except ValueError:
                continue
    return None


def _last_time(fd: int) -> str | None:
    for _off, line, terminated in audit.Backwards(fd, os.fstat(fd).st_size, audit.BLOCK):
        if terminated and line.strip():
            try:
                t = audit.parse(line).get("time")
            except ValueError:
                continue
            return t if isinstance(t, str) else None
    return None


def segment_names(sfd: int) -> list[str]:
    """Sealed segments, newest first (their names sort by commit)."""
    return sorted((n for n in os.listdir(sfd) if SEGMENT.match(n)), reverse=True)


def rotate(afd: int, start: int, *, seal_and_write, replace_live, sfd: int, cutoff: str) -> list[str]:
    """Seal the log's bytes before ``start`` (the older commits) and keep
    only those after it.  ``seal_and_write(name, data, seal)`` writes the
    seal then the segment into ``sfd`` atomically; ``replace_live(data)``
    replaces the live log.  Returns the segments deleted for retention."""
    import hashlib

    head = os.pread(afd, start, 0) if start > 0 else b""
    first = _first_seq(head)
    if first is None:
        return []
    last = first
    for line in reversed(head.rstrip(b"\n").split(b"\n")):
        try:
            last = audit.parse(line)["seq"]
            break
        except ValueError:
            continue
    name = f"audit-{first:010d}-{last:010d}.jsonl"
    for old in segment_names(sfd):            # an interrupted earlier attempt from the same commit
        if int(SEGMENT.match(old).group(1)) == first and old != name:
            _unlink(sfd, old)
            _unlink(sfd, old + SEAL_SUFFIX)
    seal = f"{hashlib.sha256(head).hexdigest()}  {name}\n".encode()
    seal_and_write(name, head, seal)
    size = os.fstat(afd).st_size
    replace_live(os.pread(afd, size - start, start))
    gone = []
    for old in segment_names(sfd)[1:]:
        fd = os.open(old, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0), dir_fd=sfd)
        try:
            newest = _last_time(fd)
        finally:
            os.close(fd)
        if newest is not None and newest < cutoff:
            _unlink(sfd, old)
            _unlink(sfd, old + SEAL_SUFFIX)
            gone.append(old)
    return gone


def _unlink(dirfd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dirfd)
    except FileNotFoundError:
        pass


def verify_segment(sfd: int, name: str) -> str | None:
    """None when the segment matches its seal, else what is wrong."""
    import hashlib

    try:
        fd = os.open(name + SEAL_SUFFIX, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0), dir_fd=sfd)
    except FileNotFoundError:
        return f"{name} has no seal"
    try:
        want = os.read(fd, 4096).split(b" ", 1)[0].decode("ascii", "replace")
    finally:
        os.close(fd)
    h = hashlib.sha256()
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0), dir_fd=sfd)
    try:
        while chunk := os.read(fd, audit.BLOCK):
            h.update(chunk)
    finally:
        os.close(fd)
    return None if h.hexdigest() == want else f"{name} does not match its seal (changed after it was sealed)"


def merge_tails(newer: audit.AuditTail, older: audit.AuditTail, limit: int) -> audit.AuditTail:
    """``newer`` (the live log, or segments read so far) completed with the
    records of an older segment, de-duplicated, the newest ``limit`` kept."""
    seen = {(r["seq"], r["index"]) for r in newer.entries}
    both = [r for r in older.entries if (r["seq"], r["index"]) not in seen] + newer.entries
    both.sort(key=lambda r: (r["seq"], r["index"]))
    return audit.AuditTail(both[-limit:] if limit > 0 else [], older.problems + newer.problems, older.complete,
                           newer.scanned + older.scanned)
