"""What the per-user limits (issue 27) add to one booking, and what an advance costs.

Prints a table; run with ``python3 benchmarks/limits.py``.  Target: the
limit checks add at most 2 ms to a booking at 1,000 live bookings.

Cases, each on random ledgers of 1,000 (and 10,000) live bookings over 7
days on 8 GPUs, 20 users:

* ``place``: the scheduler alone (``bk.core.scheduler.place``), what a
  booking costs without limits, with the hold index kept from the call
  before (``bk.core.capacity``: a writer's placements in a row, the
  broker's); ``cold``: the same with no index kept (the first placement of
  a process: a private-mode command);
* ``place + limits``: the same request through ``bk.core.limits.place_booking``
  with every limit set for its user (GPUs at once, GPU-hours, length, how
  far ahead, shared VRAM), tight enough that none refuses: the full cost of
  checking, the user's own bookings found and measured;
* ``checks``: the limit checks alone (the user's bookings found, the
  request's and the placement's limits), the cost ``added`` measures
  with the scheduler's noise around it;
* ``refusal``: a request that the GPU-hours limit refuses, with what
  passes (``fits``: a shorter length, fewer GPUs, the earliest time);
* ``advance plan``: ``bk.core.advance.plan`` after a cancellation with 10
  advancing bookings, what the broker adds to that cancel's commit (with
  the index kept from the placement before; ``cold``: none kept).

Each time is the median of several runs with the ledger already in memory
(the service's transaction has read it for the placement anyway).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bk.core import advance, capacity  # noqa: E402
from bk.core import limits as L  # noqa: E402
from bk.core.errors import PolicyRefused  # noqa: E402
from bk.core.models import SHARED, Advance, Policy, Reservation  # noqa: E402
from bk.core.scheduler import Request, place  # noqa: E402

NOW = 1_783_944_000 + 120
SLOT = 300
GPUS = 8
USERS = 20
POLICY = Policy(gpu_count=GPUS)


def ledger(n: int, seed: int) -> list[Reservation]:
    """``n`` live bookings over 7 days, about a third of the slot-time booked."""
    rng = random.Random(seed)
    first = NOW - NOW % SLOT
    span = 7 * 86400 // SLOT
    mean = max(1, int(0.33 * GPUS * 2 * span / (n * 1.3)))
    out = []
    for i in range(n):
        s = first + rng.randrange(span) * SLOT
        uid = 1000 + i % USERS
        out.append(Reservation(f"r{i}", uid, f"user{uid}", SHARED, (rng.randrange(GPUS),), 1, s,
                               s + rng.randint(1, 2 * mean) * SLOT, NOW - 3600))
    return out


def median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def bounds(**values) -> L.Bounds:
    return L.Bounds("user1000", {k: L.Bound(k, v, "*", "everyone") for k, v in values.items()})


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--sizes", default="1000,10000")
    args = ap.parse_args(argv)
    tz = timezone.utc
    print(f"{'live bookings':>13}  {'place':>8}  {'cold':>8}  {'+ limits':>9}  {'added':>8}  {'checks':>8}  "
          f"{'refusal':>8}  {'advance plan':>12}  {'cold':>8}")
    for n in (int(x) for x in args.sizes.split(",")):
        row(n, args.runs, tz)
    print("target: limits add at most 2 ms at 1,000 live bookings")


def row(n: int, runs: int, tz) -> None:
    """One line of the table: ``n`` live bookings."""
    res = ledger(n, n)
    req = Request(count=1, duration=2 * 3600, mode=SHARED, start=None)
    mine = len(L.own_held(res, 1000, NOW))
    held_h = L.held_future_s(L.own_held(res, 1000, NOW), NOW) / 3600
    loose = bounds(gpus=GPUS, gpu_hours=held_h + 10, booking_hours=24, ahead_hours=168, shared_vram_gib=80)
    tight = bounds(gpu_hours=max(0.5, held_h - 1))

    def plain():
        place(req, reservations=res, blackouts=(), policy=POLICY, gpus=None, now=NOW, tz=tz)

    def limited():
        L.place_booking(req, loose, 1000, reservations=res, blackouts=(), policy=POLICY, gpus=None, now=NOW,
                        tz=tz)

    placed = place(req, reservations=res, blackouts=(), policy=POLICY, gpus=None, now=NOW, tz=tz)

    def checks():
        """The limit checks alone, as place_booking runs them around the placement."""
        held = L.own_held(res, 1000, NOW)
        L.check_request(loose, L.Held(None, NOW, NOW + req.duration, (0,)), held, now=NOW, slot_seconds=SLOT,
                        tz=tz)
        L.check_placed(loose, L.Held(None, placed.start, placed.end, tuple(placed.gpus)), held, now=NOW,
                       slot_seconds=SLOT, tz=tz)

    def refused():
        try:
            L.place_booking(req, tight, 1000, reservations=res, blackouts=(), policy=POLICY, gpus=None,
                            now=NOW, tz=tz)
        except PolicyRefused:
            return
        raise AssertionError("the tight limit did not refuse")

    # Ten advancing bookings queued behind a full GPU 0, which a cancel frees.
    wall = Reservation("wall", 999, "wall", "exclusive", (0,), 2, NOW - NOW % SLOT, NOW + 86400, NOW - 60)
    waiting = [Reservation(f"a{i}", 1000 + i, f"user{1000 + i}", SHARED, (0,), 1, NOW + 86400 + i * 3600,
                           NOW + 86400 + (i + 1) * 3600, NOW - 60,
                           advance=Advance(NOW - 60 + i, NOW - NOW % SLOT, True, ())) for i in range(10)]
    freed = [r for r in res if 0 not in r.gpus] + [wall.replace(cancelled_at=NOW)] + waiting

    room, changed = advance.freed_by([wall], [wall.replace(cancelled_at=NOW)], now=NOW)

    def plan():
        moves = advance.plan(freed, (), POLICY, (), NOW, freed=room, changed=changed)
        assert len(moves) == 10, "not all moved"

    def cold(fn):
        def run():
            capacity._last = None
            fn()
        return run

    p, pc, lim, chk, ref, adv, advc = (median_ms(f, runs) for f in (plain, cold(plain), limited, checks, refused,
                                                                       plan, cold(plan)))
    print(f"{n:>13,}  {p:>6.2f}ms  {pc:>6.2f}ms  {lim:>7.2f}ms  {lim - p:>6.2f}ms  {chk:>6.3f}ms  {ref:>6.2f}ms  "
          f"{adv:>10.2f}ms  {advc:>6.2f}ms   (user1000 holds {mine} of them)")


if __name__ == "__main__":
    main()
