"""Job logs: private, two segments per job, bounded three ways.

``logs/ID.log`` is the current segment: the job's stdout and stderr are
opened on it with ``O_APPEND`` (``open_for_job``), so the job writes it
directly and its output outlives a worker crash.  When it grows past
``SEGMENT_BYTES`` the worker copies it to ``ID.log.1`` (replacing the older
segment) and truncates it (``rotate``); ``O_APPEND`` makes each later write
land at the new end, so the file never has a hole.  A job's log is
therefore at most about two segments (the per-job cap), checked every
worker tick.

``clean`` enforces the other two bounds for logs of jobs no longer running:
an age limit (``MAX_AGE_S`` since the last write) and a per-user total
(``TOTAL_BYTES``), oldest first.
"""

from __future__ import annotations

import os

from bk.core.jobs import JOB_ID
from bk.jobs.specs import FILE_MODE, JobsDir
from bk.store.fsutil import io_error, open_file, replace_file

SEGMENT_BYTES = 8 * 1024 * 1024        # per segment; a job keeps two
MAX_AGE_S = 14 * 86400
TOTAL_BYTES = 256 * 1024 * 1024        # all of one user's job logs
TAIL_BYTES = 64 * 1024                 # what bk j log shows by default


def _names(job_id: str) -> tuple[str, str]:
    if not JOB_ID.fullmatch(job_id or ""):
        raise ValueError("bad job id")
    return f"{job_id}.log", f"{job_id}.log.1"


def open_for_job(jobs_path: str, job_id: str) -> int:
    """A descriptor of the job's current segment, for its stdout and stderr
    (the caller closes it once the job has it)."""
    cur, _old = _names(job_id)
    with JobsDir(jobs_path, create=True) as d:
        lfd = d.sub("logs")
        try:
            return open_file(lfd, cur, os.path.join(jobs_path, "logs", cur), d.safety,
                             os.O_WRONLY | os.O_APPEND, create_mode=FILE_MODE)
        finally:
            os.close(lfd)


def rotate(jobs_path: str, job_id: str, segment: int = SEGMENT_BYTES) -> bool:
    """Copy-and-truncate the current segment once it exceeds ``segment``."""
    cur, old = _names(job_id)
    with JobsDir(jobs_path, create=False) as d:
        lfd = d.sub("logs") if d.fd is not None else None
        if lfd is None:
            return False
        try:
            path = os.path.join(jobs_path, "logs", cur)
            fd = open_file(lfd, cur, path, d.safety, os.O_RDWR)
            if fd is None:
                return False
            try:
                size = os.fstat(fd).st_size
                if size <= segment:
                    return False
                # Keep the newest ``segment`` bytes: a job that wrote far more
                # within one tick still leaves a bounded log.
                data = os.pread(fd, segment, size - segment)
                replace_file(lfd, old, os.path.join(jobs_path, "logs"), data, FILE_MODE, sync=False)
                os.ftruncate(fd, 0)
                return True
            except OSError as e:
                raise io_error(e, "rotating", path) from None
            finally:
                os.close(fd)
        finally:
            os.close(lfd)


def read(jobs_path: str, job_id: str, limit: int | None = TAIL_BYTES) -> tuple[bytes, bool]:
    """``(text, cut)``: the older segment then the current one, the last
    ``limit`` bytes (None: all); ``cut`` says older output was left out."""
    parts = []
    with JobsDir(jobs_path, create=False) as d:
        lfd = d.sub("logs") if d.fd is not None else None
        if lfd is None:
            return b"", False
        try:
            for name in reversed(_names(job_id)):
                path = os.path.join(jobs_path, "logs", name)
                fd = open_file(lfd, name, path, d.safety)
                if fd is None:
                    continue
                try:
                    size = os.fstat(fd).st_size
                    parts.append(os.pread(fd, size, 0))
                except OSError as e:
                    raise io_error(e, "reading", path) from None
                finally:
                    os.close(fd)
        finally:
            os.close(lfd)
    data = b"".join(parts)
    if limit is not None and len(data) > limit:
        return data[-limit:], True
    return data, False


def sizes(jobs_path: str) -> dict[str, tuple[int, float]]:
    """Per job id: (bytes of both segments, newest modification time)."""
    out: dict[str, tuple[int, float]] = {}
    with JobsDir(jobs_path, create=False) as d:
        lfd = d.sub("logs") if d.fd is not None else None
        if lfd is None:
            return out
        try:
            for name in os.listdir(lfd):
                jid = name.split(".", 1)[0]
                if not JOB_ID.fullmatch(jid) or name not in _names(jid):
                    continue
                try:
                    st = os.stat(name, dir_fd=lfd, follow_symlinks=False)
                except OSError:
                    continue
                size, mtime = out.get(jid, (0, 0.0))
                out[jid] = (size + st.st_size, max(mtime, st.st_mtime))
        finally:
            os.close(lfd)
    return out


def remove(jobs_path: str, job_id: str) -> None:
    with JobsDir(jobs_path, create=False) as d:
        lfd = d.sub("logs") if d.fd is not None else None
        if lfd is None:
            return
        try:
            for name in _names(job_id):
                try:
                    os.unlink(name, dir_fd=lfd)
                except FileNotFoundError:
                    pass
        finally:
            os.close(lfd)


def clean(jobs_path: str, *, running: set[str], now: float, max_age_s: int = MAX_AGE_S,
          total_bytes: int = TOTAL_BYTES) -> list[str]:
    """Remove the logs of jobs not ``running`` that are older than
    ``max_age_s``, then, oldest first, until all logs fit ``total_bytes``."""
    found = sizes(jobs_path)
    gone = [j for j, (_s, m) in found.items() if j not in running and now - m > max_age_s]
    for j in gone:
        remove(jobs_path, j)
        found.pop(j)
    total = sum(s for s, _m in found.values())
    for j, (s, _m) in sorted(found.items(), key=lambda kv: kv[1][1]):
        if total <= total_bytes:
            break
        if j in running:
            continue
        remove(jobs_path, j)
        gone.append(j)
        total -= s
    return gone
