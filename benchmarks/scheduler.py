"""How long the pure scheduler takes to place one request, and how that grows
with the ledger.  Prints a table; run with ``python3 benchmarks/scheduler.py``.

Cases (issue #4):
  * 8 GPUs each booked in back-to-back 5-minute pieces for the next N days
    (7 days: 8 * 2016 = 16,128 bookings); an 8-GPU exclusive request must
    queue past all of them.  Target: under 50 ms at 7 days.
  * 1-, 2- and 4-GPU shared requests on random ledgers of 1,000 to 10,000
    bookings over 7 days.  The bookings shrink as they multiply so that the
    ledger stays about as full (the search has a comparable answer), and the
    growth column shows the cost of the ledger itself.

Each time is the median of several runs of ``place`` with everything built
beforehand (the service layer pays the same: the ledger is already in
memory).  ``us/booking`` should stay roughly flat for n log n growth.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bk.core.models import EXCLUSIVE, SHARED, Policy, Reservation  # noqa: E402
from bk.core.scheduler import Request, place  # noqa: E402

NOW = 1_783_944_000 + 120          # 2026-07-13 12:02 UTC, mid-slice on purpose
SLOT = 300
GPUS = 8
POLICY = Policy(gpu_count=GPUS)


def tiled(days: int) -> list[Reservation]:
    """Every GPU booked in 5-minute pieces from now's slice for ``days``."""
    first = NOW - NOW % SLOT
    out = []
    for g in range(GPUS):
        for k in range(days * 86400 // SLOT):
            s = first + k * SLOT
            out.append(Reservation(f"t{g}-{k}", 1000 + k % 7, f"user{k % 7}", EXCLUSIVE if k % 3 else SHARED,
                                   (g,), 2 if k % 3 == 0 else 1, s, s + SLOT, NOW - 86400))
    return out


def random_ledger(n: int, seed: int) -> list[Reservation]:
    """``n`` bookings over 7 days, about 35 % of all slot-time booked."""
    rng = random.Random(seed)
    first = NOW - NOW % SLOT
    span = 7 * 86400 // SLOT
    # Mean length in slices that keeps the slot-time booked near 35 %:
    # n * mean * 1.3 slots (mixed shares and GPU counts) = 0.35 * 8 GPUs * 2 slots * span.
    mean = max(1, int(0.35 * GPUS * 2 * span / (n * 1.3 * 1.4)))
    out = []
    for i in range(n):
        s = first + rng.randrange(-12, span) * SLOT
        length = rng.randint(1, 2 * mean - 1) * SLOT
        k = rng.choice((1, 1, 1, 2))
        exclusive = rng.random() < 0.15
        out.append(Reservation(f"r{i}", 1000 + i % 20, f"user{i % 20}", EXCLUSIVE if exclusive else SHARED,
                               tuple(sorted(rng.sample(range(GPUS), k))), 1 if exclusive else rng.choice((1, 1, 2)),
                               s, s + length, NOW - 86400, cancelled_at=NOW if rng.random() < 0.05 else None))
    return out


def measure(req: Request, ledger: list[Reservation], runs: int) -> tuple[float, str]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        p = place(req, reservations=ledger, blackouts=[], policy=POLICY, gpus=None, now=NOW)
        times.append(time.perf_counter() - t0)
    wait = (p.start - (NOW - NOW % SLOT)) // 60
    return statistics.median(times) * 1000, f"+{wait // 60}h{wait % 60:02d}m gpus {','.join(map(str, p.gpus))}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="runs per case, median reported (default 7)")
    args = ap.parse_args(argv)
    rows = []
    exclusive8 = Request(count=8, duration=3600, mode=EXCLUSIVE)
    for days in (1, 2, 4, 7):
        ledger = tiled(days)
        ms, result = measure(exclusive8, ledger, args.runs)
        rows.append((f"8 GPU exclusive, tiled {days}d", len(ledger), ms, result))
    for count in (1, 2, 4):
        req = Request(count=count, duration=3600, mode=SHARED)
        for n in (1000, 2500, 5000, 10000):
            ledger = random_ledger(n, seed=n + count)
            ms, result = measure(req, ledger, args.runs)
            rows.append((f"{count} GPU shared, random", n, ms, result))
    print(f"{'case':<30} {'bookings':>9} {'ms':>8} {'us/booking':>11}  result")
    for name, n, ms, result in rows:
        print(f"{name:<30} {n:>9} {ms:>8.2f} {ms * 1000 / n:>11.2f}  {result}")
    print("\ngrowth from the smallest to the largest ledger (n x: bookings, time x: measured, n log n x: the bound):")
    print(f"{'case':<30} {'n x':>6} {'time x':>7} {'n log n x':>10}")
    series: dict[str, list] = {}
    for name, n, ms, _ in rows:
        series.setdefault(name.split(",")[0], []).append((n, ms))
    for name, points in series.items():
        (n0, t0), (n1, t1) = points[0], points[-1]
        print(f"{name:<30} {n1 / n0:>6.1f} {t1 / t0:>7.1f} {n1 * math.log(n1) / (n0 * math.log(n0)):>10.1f}")
    target = rows[3]
    verdict = "OK" if target[2] < 50 else "OVER"
    print(f"\ntarget: 8-GPU exclusive on {target[1]} bookings under 50 ms: {target[2]:.1f} ms {verdict}")
    return 0 if target[2] < 50 else 1


if __name__ == "__main__":
    sys.exit(main())
