"""Usage history on disk: daily append-only partitions, seals, roll-ups, retention.

Layout under ``<data_dir>/usage`` (``usage_dir``)::

    raw/2026-12-01.jsonl        one MinuteRecord per line (60 s, one GPU), UTC day
    raw/2026-12-01.seal         {"records": N, "bytes": B, "sha256": ..., "summary": {...}}
    hourly/2026-11-01.jsonl     the same day rolled up into 3600 s records
    hourly/2026-11-01.seal
    .lock                       the writer's flock (never replaced)

Facts, and what follows from them:

* ``write(2)`` on an ``O_APPEND`` descriptor puts the bytes at the end, but a
  crash (or a full disk) can leave only part of a batch: a last line without
  its newline.  Readers ignore an unterminated last line; the writer cuts it
  off before its next append (``archive.cut_torn_tail``), so a fragment never
  runs together with the next record.  A batch is fsync-ed once: records
  that were acknowledged survive a power loss, and a batch costs one fsync
  per day file it touches (one, except at midnight).
* A day can be finished only by time: records for day D arrive until the
  monitor's first sample after midnight closes the last minute.  A day is
  sealed once it ended ``SEAL_GRACE`` ago: its seal holds the record count,
  the byte length and the SHA-256 of the file, and the day's totals (by
  user, GPU and booking).  ``verify`` recomputes the hash and count: a
  changed, cut or extended file is reported ``tampered``.  A late record for
  a sealed day (a monitor that was stopped across midnight flushes on
  start-up) is appended after checking the seal, which is then rewritten;
  a seal that no longer matches is left alone, so tampering stays visible.
* Queries over whole sealed days read only the seals' totals, never the
  records: 30 days of 8 GPUs cost 30 small files plus the partial days at
  the edges (the benchmark, benchmarks/usage.py).  The seal's totals are
  trusted as the seal's hash is: ``bk u`` does not re-hash on every read;
  ``verify`` does.
* Roll-up, for sealed raw days older than ``raw_days``: (1) write the hourly
  file (atomic replace), (2) write its seal, (3) delete the raw day's seal,
  then its file.  A crash after (1) leaves an hourly file without a seal,
  which readers ignore and the next roll-up rewrites; after (2) both exist,
  readers prefer the sealed roll-up and the next run finishes (3); inside
  (3) the raw day is merely unsealed, never a seal without its records.  A
  raw day whose seal does not verify is not rolled up (its evidence is kept).
* Retention deletes whole partitions (file and seal) of days that ended more
  than ``retention_days`` ago.
* The steps above are named (``STEPS``, the ``step=`` seam), and
  tests/test_usage_crash.py kills a writer by SIGKILL after each of them.
* One writer: the monitor, which holds its own single-writer lock; appends
  and maintenance also take ``.lock`` here so that a second writer (a test,
  an administrator's repair) waits instead of interleaving.  Readers take
  no lock: appends only add whole lines at the end, and seals and roll-ups
  appear by rename.

Files are 0644 in shared mode (the monitor writes, users read their own
dashboard) and 0600 in private mode.  Records hold uids, reservation ids,
GPU indices and numbers, never a command line or a name.
"""

from __future__ import annotations

import os

from bk.core import jsonfast
from bk.core import usage as core
from bk.core.timegrid import counted
from bk.core.usage import DAY, MinuteRecord, Summary
from bk.core.usagecheck import record_problem, summary_problem
from bk.core.utctime import days_from_civil, format_utc
from bk.store.fsutil import (
    O_CLOEXEC,
    NamePattern,
    Safety,
    fsync_dir,
    io_error,
    open_dir,
    open_file,
    open_subdir,
    read_all,
    read_file,
    replace_file,
    unlink_quietly,
    write_all,
)

RAW, HOURLY = "raw", "hourly"
KINDS = (RAW, HOURLY)
DAYFILE = NamePattern(4, "-", 2, "-", 2, ".jsonl")
SEAL_GRACE = 300          # seconds after midnight before a day is sealed
SEAL_VERSION = 1
# The named steps of the write protocol, for crash tests (``step=``):
# appended/synced per day file of a batch; sealed per seal written; the
# three steps of a roll-up.
STEPS = ("appended", "synced", "sealed", "hourly_written", "hourly_sealed", "raw_unsealed", "raw_removed")


def _no_step(step: str) -> None:
    pass


def _sha256(data: bytes) -> str:
    # hashlib (OpenSSL: about 2 ms to import) only for the seals of past
    # days: bk st reads a running booking's usage of today without one.
    import hashlib

    return hashlib.sha256(data).hexdigest()


def usage_dir(settings) -> str:
    return os.path.join(settings.data_dir, "usage")


def day_name(t: int) -> str:
    return format_utc(t)[:10]


def day_of(name: str) -> int | None:
    """Epoch seconds of the start of the day a partition's name stands for."""
    m = DAYFILE.match(name) or DAYFILE.match(name + ".jsonl")
    if not m:
        return None
    return days_from_civil(int(m.group(1)), int(m.group(2)), int(m.group(3))) * DAY


def next_maintenance(t: int) -> int:
    """The first instant after ``t`` at which a day becomes sealable: a
    writer runs ``maintain`` then (and on its first append), not per batch."""
    due = t - t % DAY + SEAL_GRACE
    return due if due > t else due + DAY


def _line(r: MinuteRecord) -> bytes:
    return jsonfast.dumps(r.to_dict(), separators=(",", ":"), allow_nan=False).encode("ascii") + b"\n"


def _line_t(line: bytes) -> int | None:
    """The period start of a record line, from its first bytes (``{"t":N,``)."""
    if not line.startswith(b'{"t":'):
        return None
    end = line.find(b",", 5)
    try:
        return int(line[5:end])
    except ValueError:
        return None


def parse_lines(data: bytes, path: str, problems: list[str], *, since: int | None = None,
                until: int | None = None, needle: bytes | None = None,
                skipped: list[tuple[int, str]] | None = None) -> list[MinuteRecord]:
    out = []
    for d in parse_dicts(data, path, problems, since=since, until=until, needle=needle, skipped=skipped):
        out.append(MinuteRecord.from_dict(d))       # parse_dicts checked every field
    return out


MAX_PROBLEMS = 20          # lines named per read; the rest are counted


def _skip(problems: list[str], skipped: list[tuple[int, str]] | None, data: bytes, line: bytes,
          path: str, why: str) -> None:
    """Name one skipped line (its number found only now: the common path
    never counts lines)."""
    n = data[:data.find(line)].count(b"\n") + 1
    if skipped is not None:
        skipped.append((n, why))
    if len(problems) < MAX_PROBLEMS:
        problems.append(f"{path}: line {n} {why}; skipped")


def parse_dicts(data: bytes, path: str, problems: list[str], *, since: int | None = None,
                until: int | None = None, needle: bytes | None = None,
                skipped: list[tuple[int, str]] | None = None) -> list[dict]:
    """Records of a partition's bytes, in file order, each checked field by
    field (``bk.core.usagecheck.record_problem``).  An unterminated last line (an
    interrupted append) is ignored; a bad line is skipped and named in
    ``problems`` (at most ``MAX_PROBLEMS``), its line number and why added
    to ``skipped``.  ``since``/``until`` filter on the period start before
    parsing; ``needle`` keeps only lines containing it (a reservation id,
    a uid), and the lines that do not even begin like a record, so that a
    view of one user's lines still says that the file is damaged."""
    if data and not data.endswith(b"\n"):
        data = data[:data.rfind(b"\n") + 1]
        problems.append(f"{path}: the last line is incomplete, an interrupted append; ignored")
    lines = [ln for ln in data.split(b"\n") if ln]
    if since is not None or until is not None:
        lo = -1 << 62 if since is None else since
        hi = 1 << 62 if until is None else until
        kept = []
        for ln in lines:
            t = _line_t(ln)
            if t is None or lo <= t < hi:
                kept.append(ln)
        lines = kept
    if needle is not None:
        lines = [ln for ln in lines if needle in ln or not ln.startswith(b'{"t":') or not ln.endswith(b"}")]
    try:
        items = jsonfast.loads(b"[" + b",".join(lines) + b"]") if lines else []
    except ValueError:
        items = None
    if items is None or len(items) != len(lines):      # a bad line, or one that held two values
        items = []
        for ln in lines:
            try:
                items.append(jsonfast.loads(ln))
            except ValueError:
                items.append(_BAD_JSON)
    out = []
    for ln, d in zip(lines, items, strict=True):
        why = "is not valid JSON" if d is _BAD_JSON else record_problem(d)
        if why is not None:
            _skip(problems, skipped, data, ln, path, why if d is _BAD_JSON else f"is not a usage record ({why})")
            continue
        if (since is None or d["t"] >= since) and (until is None or d["t"] < until) and (
                needle is None or needle in ln):
            out.append(d)
    return out


_BAD_JSON = object()


def seal_problem(data: bytes) -> str | None:
    """Why the bytes of a seal file are not a seal bk wrote (its totals out
    of range included); None when they are one."""
    try:
        doc = jsonfast.loads(data)
    except ValueError:
        return "not valid JSON"
    if not (isinstance(doc, dict) and isinstance(doc.get("sha256"), str)
            and type(doc.get("bytes")) is int and isinstance(doc.get("summary"), dict)):
        return "not a seal"
    return summary_problem(doc["summary"])


class Check:
    """One partition as ``verify`` found it."""

    __slots__ = ("kind", "day", "state", "records", "detail")

    def __init__(self, kind: str, day: str, state: str, records: int | None, detail: str = ""):
        self.kind, self.day, self.state, self.records, self.detail = kind, day, state, records, detail

    def to_json(self) -> dict:
        return {"kind": self.kind, "day": self.day, "state": self.state, "records": self.records,
                "detail": self.detail}


class UsageStore:
    """The usage history in ``directory``.

    ``private``: modes 0700/0600, else 0755/0644.  ``owner_uid``: who must own
    the files (the monitor account in shared mode; default this process).
    Readers never create anything: a missing directory is an empty history."""

    def __init__(self, directory: str, *, private: bool = True, owner_uid: int | None = None,
                 raw_days: int = 14, retention_days: int = 400, lock_timeout: float = 10.0,
                 step=None):
        self.dir = directory
        self.private = private
        self.dir_mode, self.file_mode = (0o700, 0o600) if private else (0o755, 0o644)
        self.safety = Safety(os.geteuid() if owner_uid is None else owner_uid)
        self.raw_days, self.retention_days = raw_days, retention_days
        self.lock_timeout = lock_timeout
        self.problems: list[str] = []
        self._next_maintenance: int | None = None
        self._step = step or _no_step       # crash tests: called after each of STEPS

    @classmethod
    def for_settings(cls, settings, *, owner_uid: int | None = None) -> UsageStore:
        if owner_uid is None and settings.mode == "shared":
            owner_uid = settings["monitor_uid"]
            if owner_uid is None:
                owner_uid = settings["service_uid"]
        return cls(usage_dir(settings), private=settings.mode == "private", owner_uid=owner_uid,
                   raw_days=settings["usage_raw_days"], retention_days=settings["usage_retention_days"],
                   lock_timeout=settings["lock_timeout_seconds"])

    # -- opening -----------------------------------------------------------

    def _root(self, create: bool) -> int | None:
        return open_dir(self.dir, self.safety, create_mode=self.dir_mode if create else None)

    def _sub(self, root: int, kind: str, create: bool) -> int | None:
        return open_subdir(root, kind, os.path.join(self.dir, kind), self.safety,
                           create_mode=self.dir_mode if create else None)

    def _read(self, dirfd: int, name: str, path: str) -> bytes | None:
        return read_file(dirfd, name, path, self.safety, os.O_RDONLY | O_CLOEXEC)

    def _lock(self, root: int):
        from bk.store.lock import FileLock

        return FileLock(root, ".lock", os.path.join(self.dir, ".lock"), self.safety, mode=0o600,
                        timeout=self.lock_timeout, what="the usage history")

    # -- writing -----------------------------------------------------------

    def append(self, records, *, now: int | None = None) -> int:
        """Append records (any days, any order) and fsync each day file once.
        Then, when the data has moved into a new day, seal, roll up and
        prune (``maintain``) with ``now`` (default: the end of the newest
        record).  Returns how many records were written."""
        records = list(records)
        if not records:
            return 0
        by_day: dict[str, list[bytes]] = {}
        for r in records:
            by_day.setdefault(day_name(r.t), []).append(_line(r))
        root = self._root(create=True)
        try:
            with self._lock(root):
                raw = self._sub(root, RAW, create=True)
                try:
                    created = False
                    for day in sorted(by_day):
                        created |= self._append_day(raw, day, b"".join(by_day[day]))
                    if created:
                        fsync_dir(raw, os.path.join(self.dir, RAW))
                finally:
                    os.close(raw)
                when = now if now is not None else max(r.end for r in records)
                if self._next_maintenance is None or when >= self._next_maintenance:
                    self._maintain(root, when)
                    self._next_maintenance = next_maintenance(when)
        finally:
            os.close(root)
        return len(records)

    def _append_day(self, raw: int, day: str, data: bytes) -> bool:
        name, seal = f"{day}.jsonl", f"{day}.seal"
        path = os.path.join(self.dir, RAW, name)
        existed = os.path.exists(path)
        sealed = self._load_seal(raw, RAW, day)
        fd = open_file(raw, name, path, self.safety, os.O_RDWR | os.O_APPEND, create_mode=self.file_mode)
        try:
            from bk.store.archive import cut_torn_tail

            if cut_torn_tail(fd):
                self.problems.append(f"{path}: cut off an incomplete last line (an interrupted append)")
            intact = sealed is not None and self._matches(read_all(fd), sealed)
            write_all(fd, data)
            self._step("appended")
            os.fsync(fd)
            self._step("synced")
            body = read_all(fd) if intact else None
        except OSError as e:
            raise io_error(e, "appending to", path) from None
        finally:
            os.close(fd)
        if body is not None:
            # A late record for a sealed day: the seal matched before, so it
            # is rewritten to cover the new lines too.
            self._write_seal(raw, RAW, day, body)
        elif sealed is not None:
            self.problems.append(f"{os.path.join(self.dir, RAW, seal)}: the day no longer matches "
                                 "its seal; the late records were appended and the seal kept")
        return not existed

    def maintain(self, now: int) -> dict:
        """Seal ended days, roll up old raw days, drop partitions past
        retention.  Returns what it did, by action, as day names."""
        root = self._root(create=True)
        try:
            with self._lock(root):
                return self._maintain(root, now)
        finally:
            os.close(root)

    def _maintain(self, root: int, now: int) -> dict:
        done = {"sealed": [], "rolled_up": [], "dropped": [], "kept_unverified": []}
        drop_before = now - self.retention_days * DAY
        roll_before = now - self.raw_days * DAY
        fds = {k: self._sub(root, k, create=True) for k in KINDS}
        try:
            for kind in KINDS:
                fd = fds[kind]
                for name in sorted(os.listdir(fd)):
                    start = day_of(name) if DAYFILE.match(name) else None
                    if start is None:
                        continue
                    day = name[:-6]
                    if start + DAY <= drop_before:
                        unlink_quietly(fd, name)
                        unlink_quietly(fd, f"{day}.seal")
                        done["dropped"].append(f"{kind}/{day}")
                        continue
                    if kind != RAW:
                        continue
                    if start + DAY + SEAL_GRACE > now:
                        continue
                    seal = self._load_seal(fd, RAW, day)
                    if seal is None:
                        data = self._read(fd, name, os.path.join(self.dir, RAW, name)) or b""
                        self._write_seal(fd, RAW, day, data)
                        done["sealed"].append(day)
                        seal = self._load_seal(fd, RAW, day)
                    if start + DAY <= roll_before:
                        if self._roll_up(fds, day, seal):
                            done["rolled_up"].append(day)
                        else:
                            done["kept_unverified"].append(day)
                for name in os.listdir(fd):
                    if name.startswith(".") and ".tmp-" in name:
                        unlink_quietly(fd, name)
                fsync_dir(fd, os.path.join(self.dir, kind))
        finally:
            for fd in fds.values():
                os.close(fd)
        return done

    def _roll_up(self, fds: dict, day: str, seal: dict | None) -> bool:
        raw, hourly = fds[RAW], fds[HOURLY]
        name = f"{day}.jsonl"
        data = self._read(raw, name, os.path.join(self.dir, RAW, name)) or b""
        if seal is None or not self._matches(data, seal):
            self.problems.append(f"{os.path.join(self.dir, RAW, name)}: does not match its seal; "
                                 "not rolled up (kept as evidence): bk u verify")
            return False
        if self._load_seal(hourly, HOURLY, day) is None:
            recs = parse_lines(data, os.path.join(self.dir, RAW, name), self.problems)
            body = b"".join(_line(r) for r in core.rollup(recs))
            replace_file(hourly, name, os.path.join(self.dir, HOURLY), body, self.file_mode)
            self._step("hourly_written")
            self._write_seal(hourly, HOURLY, day, body)
            self._step("hourly_sealed")
        # The seal goes first: a raw day without its seal is only "not yet
        # sealed" (readers use the sealed roll-up; the next run removes it),
        # whereas a seal without its day would read as lost records.
        unlink_quietly(raw, f"{day}.seal")
        self._step("raw_unsealed")
        unlink_quietly(raw, name)
        self._step("raw_removed")
        return True

    # -- seals -------------------------------------------------------------

    def _seal_doc(self, kind: str, day: str, data: bytes) -> dict:
        problems: list[str] = []
        dicts = parse_dicts(data, os.path.join(self.dir, kind, f"{day}.jsonl"), problems)
        summ = Summary()
        for d in dicts:
            summ.add_dict(d)
        return {"v": SEAL_VERSION, "kind": kind, "day": day, "records": len(dicts), "bytes": len(data),
                "sha256": _sha256(data), "summary": summ.to_store()}

    def _write_seal(self, dirfd: int, kind: str, day: str, data: bytes) -> None:
        doc = self._seal_doc(kind, day, data)
        replace_file(dirfd, f"{day}.seal", os.path.join(self.dir, kind),
                     jsonfast.dumps(doc, separators=(",", ":"), sort_keys=True).encode("ascii") + b"\n",
                     self.file_mode)
        if kind == RAW:
            self._step("sealed")

    def _load_seal(self, dirfd: int, kind: str, day: str) -> dict | None:
        path = os.path.join(self.dir, kind, f"{day}.seal")
        data = self._read(dirfd, f"{day}.seal", path)
        if data is None:
            return None
        why = seal_problem(data)
        if why is not None:
            self.problems.append(f"{path}: not a valid seal ({why}); the day is read from its records")
            return None
        return jsonfast.loads(data)

    @staticmethod
    def _matches(data: bytes, seal: dict) -> bool:
        return len(data) == seal["bytes"] and _sha256(data) == seal["sha256"]

    def verify(self) -> list[Check]:
        """Every partition checked against its seal: ``ok``, ``tampered``
        (bytes, hash or record count differ), ``unsealed`` (not yet ended,
        or sealing has not run), ``seal-without-data``."""
        out: list[Check] = []
        root = self._root(create=False)
        if root is None:
            return out
        try:
            for kind in KINDS:
                fd = self._sub(root, kind, create=False)
                if fd is None:
                    continue
                try:
                    names = set(os.listdir(fd))
                    days = sorted({n.rsplit(".", 1)[0] for n in names
                                   if DAYFILE.match(n) or (n.endswith(".seal") and day_of(n[:-5]))})
                    for day in days:
                        out.append(self._check(fd, kind, day, f"{day}.jsonl" in names))
                finally:
                    os.close(fd)
        finally:
            os.close(root)
        return out

    def _check(self, fd: int, kind: str, day: str, has_data: bool) -> Check:
        seal_data = self._read(fd, f"{day}.seal", os.path.join(self.dir, kind, f"{day}.seal"))
        bad_seal = None if seal_data is None else seal_problem(seal_data)
        seal = None if seal_data is None or bad_seal else jsonfast.loads(seal_data)
        if not has_data:
            return Check(kind, day, "seal-without-data", None, "the records are gone; the seal remains")
        data = self._read(fd, f"{day}.jsonl", os.path.join(self.dir, kind, f"{day}.jsonl")) or b""
        problems: list[str] = []
        skipped: list[tuple[int, str]] = []
        n = len(parse_lines(data, os.path.join(self.dir, kind, f"{day}.jsonl"), problems, skipped=skipped))
        if seal is not None and not self._matches(data, seal):
            return Check(kind, day, "tampered", n,
                         f"sealed {seal['bytes']} bytes, sha256 {seal['sha256'][:12]}; found {len(data)} "
                         f"bytes, sha256 {_sha256(data)[:12]}")
        if skipped:
            # Lines no reader counts: a damaged day, sealed or not (a seal
            # made over them proves only that they were there then).
            first, why = skipped[0]
            more = f" and {counted(len(skipped) - 1, 'more line')}" if len(skipped) > 1 else ""
            return Check(kind, day, "damaged", n, f"{counted(len(skipped), 'line')} skipped: "
                         f"line {first} {why}{more}")
        if bad_seal is not None:
            return Check(kind, day, "damaged", n, f"the seal is not valid: {bad_seal}")
        if seal is None:
            return Check(kind, day, "unsealed", n, "; ".join(problems))
        if n != seal.get("records"):
            return Check(kind, day, "tampered", n, f"sealed {counted(seal['records'], 'record')}; found {n}" if type(seal.get("records")) is int else "the seal has no record count")
        if jsonfast.loads(jsonfast.dumps(self._seal_doc(kind, day, data)["summary"])) != seal["summary"]:
            return Check(kind, day, "tampered", n, "the seal's totals are not the sum of its records")
        return Check(kind, day, "ok", n)

    # -- reading -----------------------------------------------------------

    def _partitions(self, since: int | None, until: int | None) -> list[tuple[int, str, bool]]:
        """(day start, kind, sealed) for each day that overlaps [since,
        until): a sealed roll-up wins over a raw day, an unsealed roll-up (a
        crash mid roll-up) is ignored."""
        root = self._root(create=False)
        if root is None:
            return []
        found: dict[int, tuple[str, bool]] = {}
        try:
            for kind in (RAW, HOURLY):
                fd = self._sub(root, kind, create=False)
                if fd is None:
                    continue
                try:
                    names = set(os.listdir(fd))
                finally:
                    os.close(fd)
                for n in names:
                    if not DAYFILE.match(n):
                        continue
                    start = day_of(n)
                    if (since is not None and start + DAY <= since) or (until is not None and start >= until):
                        continue
                    sealed = f"{n[:-6]}.seal" in names
                    if kind == HOURLY and not sealed:
                        continue
                    found[start] = (kind, sealed)
        finally:
            os.close(root)
        return [(s, k, sealed) for s, (k, sealed) in sorted(found.items())]

    def _day_data(self, kind: str, start: int) -> bytes:
        name = f"{day_name(start)}.jsonl"
        root = self._root(create=False)
        if root is None:
            return b""
        try:
            fd = self._sub(root, kind, create=False)
            if fd is None:
                return b""
            try:
                return self._read(fd, name, os.path.join(self.dir, kind, name)) or b""
            finally:
                os.close(fd)
        finally:
            os.close(root)

    def _day_seal(self, kind: str, start: int) -> dict | None:
        root = self._root(create=False)
        if root is None:
            return None
        try:
            fd = self._sub(root, kind, create=False)
            if fd is None:
                return None
            try:
                return self._load_seal(fd, kind, day_name(start))
            finally:
                os.close(fd)
        finally:
            os.close(root)

    def records(self, since: int | None = None, until: int | None = None, *,
                gpus=None, uid: int | None = None) -> list[MinuteRecord]:
        """The stored records with a period start in [since, until), oldest
        first (rolled-up days give hourly records).  With ``uid``, only the
        records that have a use of that user (whole, with the other uses):
        lines are written compactly with ``uid`` first in each use, so
        ``{"uid":N,`` finds them before anything is parsed."""
        out: list[MinuteRecord] = []
        want = None if gpus is None else set(gpus)
        needle = None if uid is None else b'{"uid":%d,' % uid
        for start, kind, _sealed in self._partitions(since, until):
            path = os.path.join(self.dir, kind, f"{day_name(start)}.jsonl")
            recs = parse_lines(self._day_data(kind, start), path, self.problems, since=since, until=until,
                               needle=needle)
            if uid is not None:
                recs = [r for r in recs if any(u.uid == uid for u in r.uses)]
            out.extend(r for r in recs if want is None or r.gpu in want)
        out.sort(key=lambda r: (r.t, r.gpu))
        return out

    def summary(self, since: int | None = None, until: int | None = None) -> Summary:
        """Totals by user, GPU and booking over the records with a period
        start in [since, until).  Whole sealed days come from their seals."""
        total = Summary()
        for start, kind, sealed in self._partitions(since, until):
            whole = (since is None or start >= since) and (until is None or start + DAY <= until)
            if whole and sealed:
                seal = self._day_seal(kind, start)
                if seal is not None:
                    total.merge(Summary.from_store(seal["summary"]))
                    continue
            path = os.path.join(self.dir, kind, f"{day_name(start)}.jsonl")
            part = Summary()
            for d in parse_dicts(self._day_data(kind, start), path, self.problems, since=since, until=until):
                part.add_dict(d)
            total.merge(part)
        return total

    def daily(self, since: int, until: int) -> list[tuple[int, Summary]]:
        """One Summary per UTC day in [since, until) (day starts), for charts."""
        out = []
        start = since - since % DAY
        while start < until:
            out.append((start, self.summary(max(start, since), min(start + DAY, until))))
            start += DAY
        return out

    def booking_usage(self, reservation_id: str, *, start: int | None = None,
                      end: int | None = None) -> tuple[int, int]:
        """(booked_s, active_s) of one booking, today's records included.
        ``start``/``end`` (the booking's span) limit the days read."""
        booked = active = 0
        needle = jsonfast.dumps(reservation_id).encode("ascii")
        for day, kind, sealed in self._partitions(start, end):
            seal = self._day_seal(kind, day) if sealed else None
            if seal is not None:
                b = (seal["summary"].get("by_reservation") or {}).get(reservation_id)
                if b:
                    booked += int(b.get("booked_s", 0))
                    active += int(b.get("active_s", 0))
                continue
            path = os.path.join(self.dir, kind, f"{day_name(day)}.jsonl")
            for r in parse_lines(self._day_data(kind, day), path, self.problems, needle=needle):
                for u in r.uses:
                    if u.reservation == reservation_id:
                        booked += u.booked_s
                        active += u.active_s
        return booked, active

    def span(self) -> tuple[int, int] | None:
        """(first day start, last day end) of the stored history, or None."""
        parts = self._partitions(None, None)
        if not parts:
            return None
        return parts[0][0], parts[-1][0] + DAY

    def sizes(self) -> dict[str, int]:
        """Bytes on disk per kind (records and seals), for doctor and the benchmark."""
        out = {k: 0 for k in KINDS}
        for kind in KINDS:
            d = os.path.join(self.dir, kind)
            try:
                names = os.listdir(d)
            except OSError:
                continue
            for n in names:
                try:
                    out[kind] += os.stat(os.path.join(d, n), follow_symlinks=False).st_size
                except OSError:
                    pass
        return out
