"""The monitor's two files: the latest GPU snapshot and its heartbeat.

Both live in ``<data_dir>/monitor`` (``monitor_dir``), written only by the
one running ``bk m`` (it holds ``monitor.lock`` there, see
``bk.monitor.daemon``) and read by every client without a lock.

The facts this module is built on:

* Readers never lock.  Each file is replaced whole with ``rename(2)``
  (``bk.store.fsutil.replace_file``): an opener sees the previous version or
  the new one, never half of either.  So a reader needs no coordination with
  the writer, and a monitor stuck in a driver call cannot stall ``bk st``.
* The snapshot is rewritten every sample (2 s).  It is fsync-ed like every
  state file, so after a power loss it is a whole, old version; the
  heartbeat is not (a lost heartbeat after a crash reads as ``stale``, which
  is the truth), except the final ``stopped`` one.
* Files are 0644 in a 0755 directory: every user's ``bk st`` reads them.  A
  reader checks them with the store's one owner/mode rule (``Safety``)
  against the account that should run the monitor (``monitor_owner``), so a
  snapshot planted by someone else (to steer placement) is not believed.
* What a reader cannot use is a miss, never an error: missing, damaged,
  foreign, from another schema, or older than three sample intervals
  (``FRESH_INTERVALS``).  The client then asks the GPUs itself, as if no
  monitor ran.
* Every field of ``GpuInfo`` and ``GpuProcess`` is written by name from the
  record's own field list (``bk.core.record.fields``), and read back the
  same way, ignoring names the reader does not know: a field added later
  rides along without a change here, and an older reader is not confused.

Heartbeat states (``heartbeat_state``, pure, the clock passed in):
``running`` (fresh, last sample fine), ``degraded`` (fresh, but the backend
failed or reported a lost driver, or the ledger could not be read),
``topology-mismatch`` (fresh, but the GPUs seen differ from the ledger's
count), ``stale`` (no update for more than three intervals, or its process
is gone), ``stopped`` (it recorded a clean stop), ``damaged`` (a file is
there, but not one bk can believe: not JSON, not a heartbeat, too large,
or not the monitor account's), ``absent`` (no monitor ever wrote one here).
A heartbeat dated ahead of the reader's clock (the clock was stepped back)
is stale, and its detail says so rather than a negative age.
"""

from __future__ import annotations

import os

from bk.core import jsonfast
from bk.core.errors import BkError
from bk.core.models import GpuInfo, GpuProcess, iso
from bk.core.record import dataclass, fields
from bk.core.telemetry import MAX_PID, Snapshot, gpus_problem, whole
from bk.store.fsutil import Safety, open_dir, open_file, read_all, replace_file

SNAPSHOT_SCHEMA = "gpubk.snapshot.v1"
HEARTBEAT_SCHEMA = "gpubk.heartbeat.v1"
SNAPSHOT_FILE = "snapshot.json"
HEARTBEAT_FILE = "heartbeat.json"
LOCK_FILE = "monitor.lock"
SUBDIR = "monitor"
DIR_MODE = 0o755
FILE_MODE = 0o644
FRESH_INTERVALS = 3              # a file is fresh while younger than this many intervals
MIN_FRESH_S = 2                  # ... and at least this many seconds (times are whole seconds)
MAX_INTERVAL_S = 3600            # bk m --interval allows 0.05..3600
MAX_BYTES = 8 << 20              # 64 GPUs with hundreds of processes is well under 1 MiB

RUNNING, DEGRADED, STALE, STOPPED, MISMATCH, DAMAGED, ABSENT = (
    "running", "degraded", "stale", "stopped", "topology-mismatch", "damaged", "absent")
STATES = (RUNNING, DEGRADED, STALE, STOPPED, MISMATCH, DAMAGED, ABSENT)
# What the monitor itself may record; stale, damaged and absent are only ever read.
RECORDED = (RUNNING, DEGRADED, MISMATCH, STOPPED)


def monitor_dir(settings) -> str:
    return os.path.join(settings.data_dir, SUBDIR)


def monitor_owner(settings) -> int:
    """The account whose files a reader believes: the monitor account on a
    shared server (``monitor_uid``, else ``service_uid``), the user in
    private mode."""
    if settings.mode == "shared":
        uid = settings["monitor_uid"]
        if uid is None:
            uid = settings["service_uid"]
        if uid is not None:
            return uid
    return os.geteuid()


# ------------------------------------------------------------- the snapshot

@dataclass(frozen=True)
class SnapshotFile:
    """A snapshot as read back, with what the monitor said about it."""

    snapshot: Snapshot
    fingerprint: str | None
    interval_s: float
    pid: int | None
    activity: dict | None = None      # each running booking's activity state (bk.core.activity)


def _record_dict(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _from_dict(cls, d: dict, skip: tuple[str, ...] = ()):
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names and k not in skip})


def snapshot_doc(snapshot: Snapshot, *, interval_s: float, inventory_fingerprint: str | None,
                 attributions: dict | None = None, pid: int | None = None,
                 activity: dict | None = None) -> dict:
    """The JSON document of a snapshot.  ``attributions`` ((gpu, pid) ->
    an object with ``state``, ``identity`` and ``uid``) adds each process's
    judgement as ``attribution``, for readers such as ``jq``; bk's own
    clients judge again against the ledger they read.  ``activity``
    (``bk.core.activity.Tracker.doc``) is added as it is: a field a reader
    of this schema that does not know it ignores."""
    gpus = []
    for g in snapshot.gpus:
        d = _record_dict(g)
        if g.processes is not None:
            procs = []
            for p in g.processes:
                pd = _record_dict(p)
                a = (attributions or {}).get((g.index, p.pid))
                if a is not None:
                    pd["attribution"] = {"state": getattr(a, "state", a if isinstance(a, str) else None),
                                         "identity": getattr(a, "identity", None),
                                         "uid": getattr(a, "uid", None)}
                procs.append(pd)
            d["processes"] = procs
        gpus.append(d)
    doc = _record_dict(snapshot)          # taken_at, source, gaps, simulated, and what comes later
    doc.update({"schema": SNAPSHOT_SCHEMA, "taken_at_iso": iso(snapshot.taken_at), "gpus": gpus,
                "fingerprint": inventory_fingerprint, "interval_s": interval_s, "pid": pid})
    if activity is not None:
        doc["activity"] = activity
    return {k: list(v) if isinstance(v, tuple) else v for k, v in doc.items()}


def parse_snapshot(doc: object) -> SnapshotFile:
    """The inverse of ``snapshot_doc``; raises ValueError/TypeError/KeyError
    on anything that is not one, and ValueError on a reading out of range
    (``bk.core.telemetry.gpus_problem``): a utilisation of 10^9 % or a pid
    of -1 is damage, and a damaged snapshot is not believed in part."""
    if not isinstance(doc, dict) or doc.get("schema") != SNAPSHOT_SCHEMA:
        raise ValueError("not a gpubk snapshot")
    if not isinstance(doc["gpus"], list):
        raise TypeError("gpus is not a list")
    gpus = []
    for g in doc["gpus"]:
        if not isinstance(g, dict):
            raise TypeError("gpu is not an object")
        procs = g.get("processes")
        info = _from_dict(GpuInfo, g, skip=("processes",))
        if procs is not None:
            if not isinstance(procs, list) or not all(isinstance(p, dict) for p in procs):
                raise TypeError("processes")
            info.processes = [_from_dict(GpuProcess, p) for p in procs]
        gpus.append(info)
    why = gpus_problem(gpus)
    if why is not None:
        raise ValueError(why)
    taken = doc["taken_at"]
    interval = doc["interval_s"]
    if (not whole(taken, 0, 1 << 40) or type(interval) not in (int, float)
            or not 0 < interval <= MAX_INTERVAL_S):
        raise ValueError("taken_at/interval_s")
    own = {f.name: f for f in fields(Snapshot)}
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in doc.items() if k in own and k != "gpus"}
    snap = Snapshot(**kw, gpus=tuple(gpus))
    if (not isinstance(snap.source, str) or not isinstance(snap.gaps, tuple)
            or not all(isinstance(x, str) for x in snap.gaps) or not isinstance(snap.simulated, bool)
            or not (snap.reason is None or isinstance(snap.reason, str))
            or not isinstance(snap.capabilities, tuple) or not all(isinstance(x, str) for x in snap.capabilities)):
        raise TypeError("source/gaps/simulated/reason/capabilities")
    fp = doc.get("fingerprint")
    pid = doc.get("pid")
    act = doc.get("activity")
    if not (isinstance(act, dict) and isinstance(act.get("bookings"), list)):
        act = None                     # an older monitor's, or not one this reader can use
    return SnapshotFile(snap, fp if isinstance(fp, str) else None, float(interval),
                        pid if whole(pid, 1, MAX_PID) else None, act)


def _dir(directory: str, owner: int | None, create: bool) -> int | None:
    safety = Safety(os.geteuid() if owner is None else owner)
    return open_dir(directory, safety, create_mode=DIR_MODE if create else None)


def _write(directory: str, name: str, doc: dict, *, sync: bool) -> None:
    data = jsonfast.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    dirfd = _dir(directory, None, True)
    try:
        replace_file(dirfd, name, directory, data, FILE_MODE, sync=sync)
    finally:
        os.close(dirfd)


def write_snapshot(directory: str, snapshot: Snapshot, *, interval_s: float,
                   inventory_fingerprint: str | None, attributions: dict | None = None,
                   activity: dict | None = None) -> None:
    """Replace ``snapshot.json`` (atomic, fsync-ed, 0644).  Raises
    ``IOFailure``/``ConfigError`` like every store write."""
    _write(directory, SNAPSHOT_FILE, snapshot_doc(
        snapshot, interval_s=interval_s, inventory_fingerprint=inventory_fingerprint,
        attributions=attributions, pid=os.getpid(), activity=activity), sync=True)


def _read_doc(directory: str, name: str, owner: int | None) -> object | None:
    """The parsed JSON of ``name``, or None for anything unusable."""
    try:
        dirfd = _dir(directory, owner, False)
    except (BkError, OSError):
        return None
    if dirfd is None:
        return None
    try:
        fd = open_file(dirfd, name, os.path.join(directory, name), Safety(
            os.fstat(dirfd).st_uid if owner is None else owner))
        if fd is None:
            return None
        try:
            if os.fstat(fd).st_size > MAX_BYTES:
                return None
            return jsonfast.loads(read_all(fd))
        finally:
            os.close(fd)
    except (BkError, OSError, ValueError):
        return None
    finally:
        os.close(dirfd)


def fresh(taken_at: float, now: float, interval_s: float, max_age_s: float | None = None) -> bool:
    """Younger than ``max_age_s``, by default three sample intervals (at
    least ``MIN_FRESH_S``: the times are whole seconds, so a sub-second test
    interval would otherwise flap with the second hand).  A time ahead of
    ``now`` (a clock stepped back) is not fresh either."""
    limit = max(FRESH_INTERVALS * interval_s, MIN_FRESH_S) if max_age_s is None else max_age_s
    return 0 <= now - taken_at < limit


def read_snapshot_file(directory: str, now: int, *, max_age_s: float | None = None,
                       owner: int | None = None) -> SnapshotFile | None:
    """The fresh snapshot with its fingerprint; None when missing, stale,
    damaged or not written by ``owner`` (default: the directory's owner)."""
    doc = _read_doc(directory, SNAPSHOT_FILE, owner)
    if doc is None:
        return None
    try:
        got = parse_snapshot(doc)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if not fresh(got.snapshot.taken_at, now, got.interval_s, max_age_s):
        return None
    return got


def read_snapshot_doc(directory: str, *, owner: int | None = None) -> dict | None:
    """The snapshot document as the monitor wrote it (``parse_snapshot`` and
    ``fresh`` judge it), for a reader that also wants the fields the
    ``Snapshot`` record does not carry (``bk.service.notify``: a booking's
    activity); None for anything ``read_snapshot_file`` would not believe."""
    doc = _read_doc(directory, SNAPSHOT_FILE, owner)
    return doc if isinstance(doc, dict) else None


def read_snapshot(directory: str, now: int, *, max_age_s: float | None = None,
                  owner: int | None = None) -> Snapshot | None:
    got = read_snapshot_file(directory, now, max_age_s=max_age_s, owner=owner)
    return None if got is None else got.snapshot


# ------------------------------------------------------------- the heartbeat

@dataclass(frozen=True)
class Heartbeat:
    """The monitor as a reader sees it now (``read_heartbeat``)."""

    state: str
    pid: int | None = None
    updated_at: int | None = None
    started_at: int | None = None
    interval_s: float | None = None
    detail: str | None = None
    age_s: int | None = None
    samples: int | None = None

    def to_json(self) -> dict:
        return {"state": self.state, "pid": self.pid, "updated_at": iso(self.updated_at),
                "started_at": iso(self.started_at), "interval_s": self.interval_s,
                "age_s": self.age_s, "detail": self.detail, "samples": self.samples}


ABSENT_HEARTBEAT = Heartbeat(ABSENT, detail="no monitor has run here")


def heartbeat_doc(*, status: str, pid: int, started_at: int, updated_at: int, interval_s: float,
                  detail: str | None, samples: int) -> dict:
    if status not in RECORDED:
        raise ValueError(f"a monitor cannot record {status!r}")
    return {"schema": HEARTBEAT_SCHEMA, "status": status, "pid": pid, "started_at": started_at,
            "updated_at": updated_at, "updated_at_iso": iso(updated_at), "interval_s": interval_s,
            "detail": detail, "samples": samples}


def write_heartbeat(directory: str, doc: dict, *, sync: bool = False) -> None:
    _write(directory, HEARTBEAT_FILE, doc, sync=sync)


def heartbeat_state(doc: dict | None, now: int, *, alive: bool | None) -> str:
    """The state a reader reports for a heartbeat document at ``now``.
    ``alive``: whether its pid still runs (None: cannot tell).  Pure."""
    if doc is None:
        return ABSENT
    status = doc["status"]
    if status == STOPPED:
        return STOPPED
    if alive is False or not fresh(doc["updated_at"], now, doc["interval_s"]):
        return STALE
    return status


def _valid_heartbeat(doc: object) -> bool:
    if not isinstance(doc, dict) or doc.get("schema") != HEARTBEAT_SCHEMA:
        return False
    # In range, not only of the right type: a pid of -1 would make the
    # liveness probe kill(-1, 0), a question about every process.
    ints = (("pid", 1, MAX_PID), ("started_at", 0, 1 << 40), ("updated_at", 0, 1 << 40),
            ("samples", 0, 1 << 62))
    return (doc.get("status") in RECORDED and all(whole(doc.get(k), lo, hi) for k, lo, hi in ints)
            and type(doc.get("interval_s")) in (int, float) and 0 < doc["interval_s"] <= MAX_INTERVAL_S
            and (doc.get("detail") is None or isinstance(doc["detail"], str)))


def pid_alive(pid: int) -> bool | None:
    """Whether ``pid`` runs (signal 0 checks existence and permission, sends
    nothing; EPERM means it exists under another account)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return None
    return True


def read_heartbeat(directory: str, now: int, *, owner: int | None = None,
                   alive=pid_alive) -> Heartbeat:
    """The monitor's state now; ``absent`` when none ever wrote here, and
    for a damaged or foreign file (with a detail saying so)."""
    path = os.path.join(directory, HEARTBEAT_FILE)
    doc = _read_doc(directory, HEARTBEAT_FILE, owner)
    if doc is None:
        if os.path.lexists(path):
            # There, but unreadable to bk: the reader treats it as no
            # heartbeat, and says it is damaged rather than absent.
            return Heartbeat(DAMAGED, detail=f"{path} is damaged or not the monitor account's")
        return ABSENT_HEARTBEAT
    if not _valid_heartbeat(doc):
        return Heartbeat(DAMAGED, detail=f"{path} is not a heartbeat bk can read")
    live = alive(doc["pid"]) if doc["status"] != STOPPED else None
    state = heartbeat_state(doc, now, alive=live)
    detail = doc.get("detail")
    if state == STALE:
        if live is False:
            why = f"process {doc['pid']} is gone"
        elif doc["updated_at"] > now:
            why = (f"its last update is {doc['updated_at'] - now} s ahead of this clock (the clock "
                   "went back, or the heartbeat came from the future)")
        else:
            why = f"no update for {now - doc['updated_at']} s"
        detail = why + (f" (last: {detail})" if detail else "")
    return Heartbeat(state, doc["pid"], doc["updated_at"], doc["started_at"], doc["interval_s"], detail,
                     now - doc["updated_at"] if doc["updated_at"] <= now else None, doc["samples"])
