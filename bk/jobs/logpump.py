"""The writer of one job's log: a small process between the job and its files.

Why a process.  A job that writes its log file itself (stdout and stderr
opened ``O_APPEND`` on it) can write as fast as the disk takes it: a check
once per worker tick let one log reach 30 MB before it was looked at, or
never looked at, when the job exited within the tick.  The kernel has no
per-file size limit (``RLIMIT_FSIZE`` counts every file the job writes,
its checkpoints included).  So the job's stdout and stderr are one pipe,
and this process copies the pipe into ``ID.log``, counting: when a write
would take the segment past its size, the rest goes into a fresh one.  The
log is bounded at every write, whatever the job does and however fast it
ends.  The pipe's buffer (64 KiB on Linux) is all that can wait: a job that
writes faster than the disk takes it is slowed down, never lost.

How a segment is closed: ``rename(ID.log, ID.log.1)`` relative to the open
``logs`` directory (replacing the older segment, atomically), then a new
``ID.log`` is created ``O_EXCL | O_NOFOLLOW`` there.  This process is the
only writer of both names, so nothing is copied and nothing is lost between
the two steps; a reader (``bk j log``) that looks in between sees the older
segment and no current one.

It runs in a session of its own (the worker's ``killpg`` of the job's group
does not reach it), ignores SIGINT, SIGHUP and SIGTERM (a job told to stop
may still say why), and ends when the last writer of the pipe is gone: the
job and everything it started that kept its output.  It outlives a worker
that dies, so output written after a worker crash is still kept (and still
bounded) until the next worker stops the orphan.

Written data that the disk refuses (``ENOSPC``) is dropped, and the pipe is
still read: a full disk must not block the job on its next ``write``.

This module imports only the standard library: the worker starts it as
``python -I -S`` with the directory holding ``bk`` on ``sys.path``
(``bk.jobs.logs.start_pump``), so it costs one small interpreter per
running job and reads nothing else of bk.
"""

from __future__ import annotations

import os
import signal
import sys

CHUNK = 64 * 1024
FILE_MODE = 0o600


def _create(dirfd: int, name: str) -> int:
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, FILE_MODE, dir_fd=dirfd)
    except FileExistsError:
        # Only the owner can write this directory; a name there now is a
        # leftover (a reader cannot create it): replace it, once.
        os.unlink(name, dir_fd=dirfd)
        fd = os.open(name, flags, FILE_MODE, dir_fd=dirfd)
    os.fchmod(fd, FILE_MODE)
    return fd


def pump(src: int, dirfd: int, fd: int, name: str, older: str, segment: int, chunk: int = CHUNK) -> int:
    """Copy ``src`` until its end into ``fd`` (the open ``name`` in
    ``dirfd``), starting a new segment whenever ``segment`` bytes are
    written; returns the bytes dropped because the disk refused them."""
    size = os.fstat(fd).st_size if fd >= 0 else 0
    dropped = 0
    while True:
        try:
            data = os.read(src, chunk)
        except OSError:
            break
        if not data:
            break
        view = memoryview(data)
        while view:
            if fd < 0 or size >= segment:
                try:
                    if fd >= 0:
                        os.close(fd)
                        fd = -1
                        os.rename(name, older, src_dir_fd=dirfd, dst_dir_fd=dirfd)
                    fd, size = _create(dirfd, name), 0
                except OSError:
                    dropped += len(view)
                    break
            try:
                n = os.write(fd, view[:segment - size])
            except OSError:
                dropped += len(view)
                break
            size += n
            view = view[n:]
    if fd >= 0:
        os.close(fd)
    return dropped


def main(argv: list[str]) -> int:
    """``DIRFD FD NAME OLDER SEGMENT``: the descriptors were passed open by
    the worker; the pipe is standard input."""
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    dirfd, fd, name, older, segment = int(argv[0]), int(argv[1]), argv[2], argv[3], int(argv[4])
    if "/" in name or "/" in older or segment < 1:
        return 2
    pump(0, dirfd, fd, name, older, segment)
    return 0


if __name__ == "__main__":          # pragma: no cover - started with -c by start_pump
    sys.exit(main(sys.argv[1:]))
