"""Ledger benchmark: commit latency, bytes written per commit, unlocked read.

    python3 benchmarks/ledger.py [--dir DIR] [--commits N] [--quick]

For 100, 1,000 and 10,000 live bookings, each with 0 and 100,000 archived
ones, it times transactions that change one booking, the way the CLI runs
them (a fresh Store per command, so nothing is cached) and the way the
broker does (one long-lived Store).  ``os.fsync`` is wrapped to measure the
time spent waiting for the disk, so the table shows the cost of bk itself
("cpu") apart from the device.  Bytes written come from ``wchar`` in
/proc/self/io (every byte bk hands to ``write``: ledger, backup, audit).

Targets (SPEC 0 and issue #3): with 1,000 live bookings a commit costs under
10 ms plus fsync; archived history does not change the cost of a commit.
The DIR should be on the file system a real data directory would use
(default: a temporary directory).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bk.core.models import Mutation, Policy, Reservation  # noqa: E402
from bk.store import archive  # noqa: E402
from bk.store.fsutil import Safety  # noqa: E402
from bk.store.ledger import Store  # noqa: E402

T = 1_780_000_000
POLICY = Policy(gpu_count=8).bound()
_fsync_seconds = [0.0]
_real_fsync = os.fsync


def _timed_fsync(fd):
    t = time.perf_counter()
    try:
        _real_fsync(fd)
    finally:
        _fsync_seconds[0] += time.perf_counter() - t


os.fsync = _timed_fsync


def wchar() -> int:
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def booking(i: int, start: int, end: int, *, cancelled: bool = False) -> Reservation:
    return Reservation(str(uuid.UUID(int=i + 1, version=4)), 1000 + i % 50, f"user{i % 50}",
                       "shared", (i % 8,), 1, start, end, start - 3600, mem_mib=8192,
                       note=f"experiment {i}", cancelled_at=start - 60 if cancelled else None)


def populate(data: str, live: int, archived: int) -> None:
    store = Store(data, clock=lambda: T, min_free_bytes=0)

    def fill(state):
        state.reservations = [booking(i, T + (i // 8) * 3600, T + (i // 8) * 3600 + 3000)
                              for i in range(live)]
        return Mutation(True, [{"action": "create", "result": "bulk"}])
    store.transact(fill, policy=POLICY, actor_uid=0, actor="bench")
    if archived:
        old = [booking(10**7 + i, T - 80 * 86400 + i * 60, T - 80 * 86400 + i * 60 + 1800,
                       cancelled=i % 7 == 0) for i in range(archived)]
        os.makedirs(store.paths.archive_dir, mode=0o700, exist_ok=True)
        fd = os.open(store.paths.archive_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            archive.append(fd, store.paths.archive_dir, Safety(os.geteuid()), 0o600,
                           archive.group(old, seq=1, now=T))
        finally:
            os.close(fd)


def edit_one(n: int):
    def apply(state):
        r = state.reservations[n % len(state.reservations)]
        r.note = f"edited {n}"
        return Mutation(True, [{"action": "edit", "reservation": r.id, "result": "updated"}])
    return apply


def measure(data: str, commits: int, *, fresh: bool) -> dict:
    times, cpu, syncs = [], [], []
    store = Store(data, clock=lambda: T)
    for n in range(3):     # warm up: page cache, and the journal after populate()
        store.transact(edit_one(n), policy=POLICY, actor_uid=1000, actor="bench")
    w0 = wchar()
    for n in range(commits):
        if fresh:
            store = Store(data, clock=lambda: T)
        _fsync_seconds[0] = 0.0
        c0, t0 = time.process_time(), time.perf_counter()
        store.transact(edit_one(n), policy=POLICY, actor_uid=1000, actor="bench")
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        syncs.append(_fsync_seconds[0])
    wrote = (wchar() - w0) / commits
    ms = [t * 1000 for t in times]
    return {"median": statistics.median(ms), "p90": sorted(ms)[int(0.9 * (len(ms) - 1))],
            "fsync": statistics.median(s * 1000 for s in syncs),
            "self": statistics.median((t - s) * 1000 for t, s in zip(times, syncs, strict=True)),
            "cpu": statistics.median(c * 1000 for c in cpu), "bytes": wrote}


def time_reads(data: str, n: int) -> tuple[float, float]:
    reads, history = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        Store(data, clock=lambda: T).read()
        reads.append(time.perf_counter() - t0)
    for _ in range(max(1, n // 4)):
        t0 = time.perf_counter()
        Store(data, clock=lambda: T).archived(uid=1000)
        history.append(time.perf_counter() - t0)
    return statistics.median(reads) * 1000, statistics.median(history) * 1000


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", help="where to create the test data directories (default: a temp dir)")
    ap.add_argument("--commits", type=int, default=30, help="commits per row (default 30)")
    ap.add_argument("--quick", action="store_true", help="100 and 1,000 live bookings only")
    args = ap.parse_args(argv)
    base = tempfile.mkdtemp(prefix="bk-bench-", dir=args.dir)
    rows = []
    try:
        for live in (100, 1000) if args.quick else (100, 1000, 10000):
            for archived in (0, 100_000):
                data = os.path.join(base, f"{live}-{archived}")
                populate(data, live, archived)
                os.sync()
                commits = max(5, args.commits // (4 if live >= 10000 else 1))
                cli = measure(data, commits, fresh=True)
                broker = measure(data, commits, fresh=False)
                read_ms, history_ms = time_reads(data, commits)
                size = os.stat(os.path.join(data, "ledger.json")).st_size
                rows.append((live, archived, cli, broker, read_ms, history_ms, size))
                shutil.rmtree(data)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    head = ("live", "archived", "commit ms", "p90", "fsync", "wall-fsync", "cpu",
            "broker cpu", "KiB/commit", "ledger KiB", "read ms", "history ms")
    print(" | ".join(f"{h:>10}" for h in head))
    print("-+-".join("-" * 10 for _ in head))
    for live, archived, cli, broker, read_ms, history_ms, size in rows:
        cells = (f"{live:,}", f"{archived:,}", f"{cli['median']:.1f}", f"{cli['p90']:.1f}",
                 f"{cli['fsync']:.1f}", f"{cli['self']:.1f}", f"{cli['cpu']:.1f}",
                 f"{broker['cpu']:.1f}",
                 f"{cli['bytes'] / 1024:.0f}", f"{size / 1024:.0f}", f"{read_ms:.1f}",
                 f"{history_ms:.0f}")
        print(" | ".join(f"{c:>10}" for c in cells))
    print("\ncommit ms, p90: wall time of one transaction as the CLI runs it (a fresh Store); "
          "fsync: time inside fsync;\nwall-fsync: commit minus fsync; cpu: process CPU time of a "
          "commit; broker cpu: the same with one\nlong-lived Store; KiB/commit: bytes written "
          "(ledger + backup + audit); read ms: unlocked read with\nvalidation (fresh Store); "
          "history ms: archived() for one user (50 users).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
