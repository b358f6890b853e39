"""Job logs: private, two segments per job, bounded three ways.

``logs/ID.log`` is the current segment, ``ID.log.1`` the one before.  A
worker's job writes into a pipe whose reader, the job's log pump
(``bk.jobs.logpump``, started by ``start_pump``), writes the segments: it
starts a new one exactly when the current one holds ``SEGMENT_BYTES``, so a
job's log never exceeds two segments (the per-job cap), at any moment,
however fast the job writes or ends.  A log left over the cap by an older
bk is brought back within it (``rotate``: its newest ``SEGMENT_BYTES`` kept)
before its job writes again.

``clean`` enforces the other two bounds for logs of jobs no longer running:
an age limit (``MAX_AGE_S`` since the last write) and a per-user total
(``TOTAL_BYTES``), oldest first.
"""

from __future__ import annotations

import os
import subprocess
import sys

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
    """A descriptor of the job's current segment, opened for appending with
    the state directory's checks (the caller closes it)."""
    cur, _old = _names(job_id)
    with JobsDir(jobs_path, create=True) as d:
        lfd = d.sub("logs")
        try:
            return open_file(lfd, cur, os.path.join(jobs_path, "logs", cur), d.safety,
                             os.O_WRONLY | os.O_APPEND, create_mode=FILE_MODE)
        finally:
            os.close(lfd)


# The pump's whole start-up: only the directory that holds ``bk`` (a
# checkout, site-packages, or the archive itself: zipimport reads it) is
# added to an isolated interpreter's path, and only ``bk.jobs.logpump``,
# which imports nothing of bk, is loaded from it.
_PUMP = ("import sys; sys.path.insert(0, sys.argv[1]); from bk.jobs import logpump; "
         "sys.exit(logpump.main(sys.argv[2:]))")


def _bk_root() -> str:
    """The directory (or archive) that holds the ``bk`` package: this
    module is ``bk/jobs/logs.py`` inside it (in ``bk.pyz`` too, where the
    path runs through the archive and zipimport reads it)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_pump(jobs_path: str, job_id: str, segment: int = SEGMENT_BYTES) -> tuple[int, subprocess.Popen]:
    """The write end of a pipe for the job's stdout and stderr, and the log
    pump that reads it into the job's segments (``bk.jobs.logpump``).  The
    caller gives the write end to the job and closes it; the pump ends when
    the job and whatever it started have all closed it."""
    cur, old = _names(job_id)
    rotate(jobs_path, job_id, segment)
    with JobsDir(jobs_path, create=True) as d:
        lfd = d.sub("logs")
        try:
            path = os.path.join(jobs_path, "logs", cur)
            fd = open_file(lfd, cur, path, d.safety, os.O_WRONLY | os.O_APPEND, create_mode=FILE_MODE)
            try:
                r, w = os.pipe()
                try:
                    proc = subprocess.Popen(
                        [sys.executable, "-I", "-S", "-c", _PUMP, _bk_root(), str(lfd), str(fd), cur, old,
                         str(segment)],
                        stdin=r, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(lfd, fd),
                        close_fds=True, start_new_session=True, cwd="/", env={})
                except BaseException:
                    os.close(w)
                    raise
                finally:
                    os.close(r)
            finally:
                os.close(fd)
        finally:
            os.close(lfd)
    return w, proc


def rotate(jobs_path: str, job_id: str, segment: int = SEGMENT_BYTES) -> bool:
    """Copy-and-truncate the current segment once it exceeds ``segment``
    (a log nobody writes now: before its pump starts)."""
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
                # Keep the newest ``segment`` bytes of a log written before
                # pumps bounded every write.
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
