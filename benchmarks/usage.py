"""Usage history: the cost of ``bk u users --since 30d`` and the bytes per GPU-day.

    python3 build.py && python3 benchmarks/usage.py [--days 30] [--gpus 8] [--users 20] [--runs 10]

The history: ``--days`` days ending now, for ``--gpus`` GPUs and ``--users``
users (uids 20001..), made by the real ``Folder`` (one sample every 30 s, so
two per minute record: the fold is real, the sampling coarser than the
monitor's 2 s to keep generation to seconds) and appended day by day
through the real ``UsageStore`` with the default settings, so sealing,
roll-up (days older than 14 are hourly) and the seal totals are exactly what
a monitor would have left.  Bookings: on each GPU, back to back 1-8 h
shared bookings of random users with random gaps; a booked user runs a
process 60 % of the time; 5 % of the unbooked minutes a random user runs
one anyway (unreserved use).  Seed 12 (printed).

The clock (``BK_NOW``) is 23:59 UTC today, the worst moment: today's raw
file is nearly full and is read line by line (whole sealed days are read
from their seals).  Then ``/usr/bin/python3 dist/bk.pyz u users --since
30d --json`` is timed whole-process (median of ``--runs`` after one
warm-up), with ``--since 10d`` (both edge days raw), ``bk u`` and ``bk l``
on the same data directory, and the history's size per GPU-day is
printed, raw and rolled up.  Target (issue 12): under 200 ms.  A report, not
a test: it prints a table.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bk.core.models import GpuInfo, GpuProcess, Reservation  # noqa: E402
from bk.core.telemetry import Snapshot  # noqa: E402
from bk.core.usage import DAY, Folder  # noqa: E402
from bk.store.usage import HOURLY, RAW, UsageStore  # noqa: E402

SEED = 12
STEP = 30
TARGET_MS = 200.0


def bookings(rng, gpus: int, users: int, lo: int, hi: int) -> list[Reservation]:
    out = []
    for g in range(gpus):
        t = lo
        while t < hi:
            t += rng.randrange(0, 6) * 3600
            length = rng.randrange(1, 9) * 3600
            uid = 20001 + rng.randrange(users)
            out.append(Reservation(f"{g:02d}{t:010d}-bench", uid, f"u{uid}", "shared", (g,), 1,
                                   t, t + length, t))
            t += length
    return out


def generate(directory: str, *, now: int, days: int, gpus: int, users: int, seed: int = SEED) -> int:
    rng = random.Random(seed)
    hi = now - now % 60
    lo = hi - days * DAY
    res = bookings(rng, gpus, users, lo, hi)
    by_gpu: dict[int, list[Reservation]] = {g: [r for r in res if g in r.gpus] for g in range(gpus)}
    idx = {g: 0 for g in range(gpus)}
    store = UsageStore(directory)
    folder = Folder(period_s=60, interval_s=STEP)
    batch, written, day = [], 0, lo // DAY
    for t in range(lo, hi, STEP):
        infos, active = [], []
        for g in range(gpus):
            lst = by_gpu[g]
            while idx[g] < len(lst) and lst[idx[g]].end <= t:
                idx[g] += 1
            cur = lst[idx[g]] if idx[g] < len(lst) and lst[idx[g]].start <= t else None
            procs = []
            if cur is not None:
                active.append(cur)
                if rng.random() < 0.6:
                    procs.append(GpuProcess(1000 + g, mem_mib=rng.randrange(2000, 30000),
                                            sm=rng.randrange(0, 100), uid=cur.uid))
            elif rng.random() < 0.05:
                procs.append(GpuProcess(2000 + g, mem_mib=rng.randrange(500, 8000), sm=rng.randrange(0, 50),
                                        uid=20001 + rng.randrange(users)))
            infos.append(GpuInfo(g, f"GPU-{g}", "bench", 81920, sum(p.mem_mib for p in procs),
                                 rng.randrange(0, 100) if procs else 0, 40, procs))
        batch += folder.add(t, Snapshot(t, "bench", tuple(infos), (), True), None, active)
        if t // DAY != day:
            written += store.append(batch)
            batch, day = [], t // DAY
    batch += folder.flush()
    written += store.append(batch)
    return written


def timed(argv: list[str], env: dict, runs: int) -> float:
    subprocess.run(argv, env=env, check=True, capture_output=True)
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, check=True, capture_output=True)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1000


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--users", type=int, default=20)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args(argv)
    pyz = ROOT / "dist" / "bk.pyz"
    if not pyz.exists():
        print("build first: python3 build.py", file=sys.stderr)
        return 2
    base = tempfile.mkdtemp(prefix="bk-usage-bench-")
    try:
        data = os.path.join(base, "data")
        os.mkdir(data, 0o700)
        # The worst moment of the day: 23:59 UTC, when today's raw file is
        # nearly full and must be read record by record (sealed days are not).
        now = int(time.time()) // DAY * DAY + DAY - 60
        t0 = time.perf_counter()
        n = generate(os.path.join(data, "usage"), now=now, days=args.days, gpus=args.gpus, users=args.users)
        gen_s = time.perf_counter() - t0
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": base, "BK_DATA_DIR": data,
               "BK_GPU_COUNT": str(args.gpus), "TZ": "UTC", "LC_ALL": "C.UTF-8", "BK_NOW": str(now)}
        py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        users_ms = timed([py, str(pyz), "u", "users", "--since", f"{args.days}d", "--json"], env, args.runs)
        edge_ms = timed([py, str(pyz), "u", "users", "--since", "10d", "--json"], env, args.runs)
        dash_ms = timed([py, str(pyz), "u", "--json"], env, args.runs)
        list_ms = timed([py, str(pyz), "l"], env, args.runs)
        store = UsageStore(os.path.join(data, "usage"))
        sizes = store.sizes()
        parts = store._partitions(None, None)
        raw_days = sum(1 for _s, k, _x in parts if k == RAW)
        hourly_days = sum(1 for _s, k, _x in parts if k == HOURLY)
        print(f"seed {SEED}; {n} records written in {gen_s:.1f} s ({args.days} days, {args.gpus} GPUs, "
              f"{args.users} users; {raw_days} raw days, {hourly_days} rolled-up days)")
        print(f"{'measure':<44}{'value':>12}")
        label = f"bk u users --since {args.days}d --json (median)"
        print(f"{label:<44}{users_ms:>9.1f} ms"
              f"   target < {TARGET_MS:.0f} ms: {'ok' if users_ms < TARGET_MS else 'MISSED'}")
        print(f"{'bk u users --since 10d (two raw edge days)':<44}{edge_ms:>9.1f} ms")
        print(f"{'bk u --json (dashboard, median)':<44}{dash_ms:>9.1f} ms")
        print(f"{'bk l (same data directory, median)':<44}{list_ms:>9.1f} ms")
        if raw_days:
            print(f"{'raw bytes per GPU-day (records + seals)':<44}"
                  f"{sizes[RAW] / (raw_days * args.gpus):>9.0f} B")
        if hourly_days:
            print(f"{'rolled-up bytes per GPU-day (records + seals)':<44}"
                  f"{sizes[HOURLY] / (hourly_days * args.gpus):>9.0f} B")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
