"""Private job specs: one file per job, written once, never changed.

Layout (all the user's, directories 0700, files 0600)::

    STATE_DIR/jobs/            the jobs directory (worker.lock, worker.json)
    STATE_DIR/jobs/specs/ID.json   one spec per job
    STATE_DIR/jobs/logs/ID.log     its output (bk.jobs.logs)

A spec is created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` relative to the
open ``specs`` directory (``bk.store.fsutil``): a name that exists, or a
symbolic link planted there, makes the write fail instead of following it
or writing into someone else's file.  It is written, ``fsync``-ed, and the
directory ``fsync``-ed before the booking that names it is made, so a
booking never names a spec that a crash lost.  If the booking then fails,
the caller removes the spec (``remove``): nothing half-made is left.

The binding: the booking carries ``digest_of(bytes)``; ``read_spec``
re-reads the file through the same checks (owner, single link, not
writable by others, mode 0600) and refuses it when the digest differs.

Why every spec holds a random ``salt``.  The digest sits in the shared
ledger, which every local user reads, and everything else a spec holds can
be guessed: its id and creation time are in the ledger too, the working
directory is usually the home directory, PATH is the distribution's, and
the command is a handful of words (``python3 train.py --token ...``).  A
hash of guessable bytes confirms a guess: a dictionary over likely command
lines recovered one with its token in under a minute.  So each spec carries
32 random bytes (``salt``, hex) that appear nowhere else; the digest covers
them, and without them no guess can be checked against the ledger.  The
salt is just another field of the spec's bytes, so verifying is unchanged:
a spec written before salts existed is still bound by the digest its
booking holds, and it still runs for its owner.
"""

from __future__ import annotations

import json
import os
import stat

from bk.core.errors import IOFailure, NotFound
from bk.core.jobs import JOB_ID, digest_of
from bk.core.record import dataclass
from bk.store.fsutil import (
    Safety,
    fsync_dir,
    io_error,
    make_dirs,
    open_dir,
    open_file,
    open_subdir,
    read_all,
    unlink_quietly,
    write_all,
)

SCHEMA = "gpubk.jobspec.v1"
SALT_BYTES = 32
DIR_MODE = 0o700
FILE_MODE = 0o600
MAX_SPEC_BYTES = 256 * 1024
JOBS_SUBDIR = "jobs"


def jobs_dir(state_dir: str) -> str:
    return os.path.join(state_dir, JOBS_SUBDIR)


@dataclass(frozen=True)
class Spec:
    id: str
    argv: tuple[str, ...]
    cwd: str
    path: str | None
    created: int
    digest: str
    keep: bool = False           # bk run --keep: the booking lasts to its end after the command exits


class JobsDir:
    """``with JobsDir(path, create=True) as d``: the open jobs directory and
    its ``specs``/``logs`` sub-directories, checked like every state path."""

    def __init__(self, path: str, *, create: bool):
        self.path = path
        self.create = create
        self.safety = Safety(os.getuid())
        self.fd: int | None = None

    def __enter__(self) -> JobsDir:
        mode = DIR_MODE if self.create else None
        if self.create:
            parent = os.path.dirname(self.path)
            make_dirs(parent, DIR_MODE)
        self.fd = open_dir(self.path, self.safety, create_mode=mode)
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def sub(self, name: str) -> int | None:
        """An open sub-directory (``specs``, ``logs``); None when missing and not creating."""
        if self.fd is None:
            return None
        return open_subdir(self.fd, name, os.path.join(self.path, name), self.safety,
                           create_mode=DIR_MODE if self.create else None)


def encode_spec(job_id: str, argv: list[str], cwd: str, path: str | None, created: int,
                salt: str | None, *, keep: bool = False) -> bytes:
    """The spec's bytes.  ``salt`` None gives the form written before salts
    (what an old booking's digest covers); every new spec has one.
    ``keep`` is written only when set, so a spec without it reads as it
    always did."""
    doc = {"schema": SCHEMA, "id": job_id, "argv": list(argv), "cwd": cwd, "path": path,
           "created": created}
    if salt is not None:
        doc["salt"] = salt
    if keep:
        doc["keep"] = True
    return (json.dumps(doc, sort_keys=True, ensure_ascii=True, separators=(",", ":")) + "\n").encode()


def write_spec(jobs_path: str, job_id: str, argv: list[str], cwd: str, path: str | None,
               created: int, *, keep: bool = False) -> str:
    """Write a new spec (it must not exist), durably; returns its digest."""
    if not JOB_ID.fullmatch(job_id):
        raise ValueError("bad job id")
    data = encode_spec(job_id, argv, cwd, path, created, os.urandom(SALT_BYTES).hex(), keep=keep)
    if len(data) > MAX_SPEC_BYTES:
        raise IOFailure(f"the command line is too long for a job spec ({len(data)} bytes; "
                        f"at most {MAX_SPEC_BYTES})", hint="put the command in a script and run that")
    with JobsDir(jobs_path, create=True) as d:
        sfd = d.sub("specs")
        spath = os.path.join(jobs_path, "specs")
        name = f"{job_id}.json"
        try:
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             FILE_MODE, dir_fd=sfd)
            except OSError as e:
                raise io_error(e, "creating", os.path.join(spath, name)) from None
            try:
                os.fchmod(fd, FILE_MODE)
                write_all(fd, data)
                os.fsync(fd)
            except OSError as e:
                os.close(fd)
                unlink_quietly(sfd, name)
                raise io_error(e, "writing", os.path.join(spath, name)) from None
            os.close(fd)
            fsync_dir(sfd, spath)
        finally:
            os.close(sfd)
    return digest_of(data)


def read_spec(jobs_path: str, job_id: str, digest: str | None) -> Spec:
    """The spec of ``job_id``, checked against the booking's ``digest``.
    ``NotFound`` when it is gone; ``IOFailure`` when it was changed (digest
    mismatch), is readable or writable by others, or is malformed."""
    if not JOB_ID.fullmatch(job_id or ""):
        raise NotFound("the booking names no valid job spec")
    name = f"{job_id}.json"
    path = os.path.join(jobs_path, "specs", name)
    with JobsDir(jobs_path, create=False) as d:
        sfd = d.sub("specs") if d.fd is not None else None
        if sfd is None:
            raise NotFound(f"the job spec {path} is missing")
        try:
            fd = open_file(sfd, name, path, d.safety)
            if fd is None:
                raise NotFound(f"the job spec {path} is missing")
            try:
                st = os.fstat(fd)
                if stat.S_IMODE(st.st_mode) & 0o077:
                    raise IOFailure(f"refusing the job spec {path}: others may read it "
                                    f"(mode {stat.S_IMODE(st.st_mode):04o}); it was not run",
                                    hint=f"inspect it; bk writes specs 0600: chmod 600 {path}")
                if st.st_size > MAX_SPEC_BYTES:
                    raise IOFailure(f"refusing the job spec {path}: it is too large to be bk's")
                data = read_all(fd)
            finally:
                os.close(fd)
        finally:
            os.close(sfd)
    if digest is None or digest_of(data) != digest:
        raise IOFailure(f"refusing the job spec {path}: it was changed after the booking was made "
                        "(its digest does not match); it was not run",
                        hint="book the command again: bk run N DUR -- CMD", details={"path": path})
    try:
        doc = json.loads(data)
        argv = tuple(doc["argv"])
        if doc.get("schema") != SCHEMA or doc.get("id") != job_id or not argv or \
                not all(isinstance(a, str) for a in argv) or not isinstance(doc["cwd"], str):
            raise ValueError("unexpected fields")
        return Spec(job_id, argv, doc["cwd"], doc.get("path"), int(doc.get("created") or 0), digest,
                    doc.get("keep") is True)
    except (ValueError, KeyError, TypeError) as e:
        raise IOFailure(f"refusing the job spec {path}: it is malformed ({e})") from None


def remove(jobs_path: str, job_id: str) -> bool:
    """Remove a spec (a failed booking, a finished job); True when it existed."""
    if not JOB_ID.fullmatch(job_id or ""):
        return False
    try:
        with JobsDir(jobs_path, create=False) as d:
            sfd = d.sub("specs") if d.fd is not None else None
            if sfd is None:
                return False
            try:
                os.unlink(f"{job_id}.json", dir_fd=sfd)
                return True
            except FileNotFoundError:
                return False
            finally:
                os.close(sfd)
    except OSError as e:
        raise io_error(e, "removing a job spec in", jobs_path) from None


def listed(jobs_path: str) -> dict[str, float]:
    """Every spec's job id and modification time (epoch seconds)."""
    out: dict[str, float] = {}
    with JobsDir(jobs_path, create=False) as d:
        sfd = d.sub("specs") if d.fd is not None else None
        if sfd is None:
            return out
        try:
            for name in os.listdir(sfd):
                jid = name[:-5] if name.endswith(".json") else ""
                if JOB_ID.fullmatch(jid):
                    try:
                        out[jid] = os.stat(name, dir_fd=sfd, follow_symlinks=False).st_mtime
                    except OSError:
                        continue
        finally:
            os.close(sfd)
    return out


def clean(jobs_path: str, *, keep: set[str], now: float, grace_s: int) -> list[str]:
    """Remove specs no live job needs: those not in ``keep`` (the ids of
    jobs whose booking is current or upcoming) older than ``grace_s`` (a
    spec is written just before its booking commits: a young one may be
    about to be referenced)."""
    gone = []
    for jid, mtime in listed(jobs_path).items():
        if jid not in keep and now - mtime >= grace_s and remove(jobs_path, jid):
            gone.append(jid)
    return gone
