"""Fair share: each user's decayed past usage, for ordering contested advances.

The facts.  First come, first served is fair to requests, not to people: a
user who queues many bookings, or has had the GPUs all week, is first in
line as often as anyone.  Slurm's answer is a user's *decayed* past usage:
an hour used a half-life ago counts half an hour, two half-lives ago a
quarter, so the past is forgiven at a steady rate.

The rule here.  A user's usage is the GPU-seconds the monitor recorded for
them (``bk.core.usage``): booked time on their bookings' GPUs plus time
their processes ran on GPUs without a booking there.  Each day's total
counts ``2 ** -(age / half_life)``, the age measured from the middle of the
part of the day that has passed.  Days older than ``WINDOW_HALF_LIVES``
half-lives weigh under 0.4% and are not read.  A user's *share* is their
part of everyone's decayed usage (0 to 1); nobody's usage: everyone 0.

What it decides.  Only the order in which several advancing bookings are
offered capacity that frees up (``bk.core.advance``, rule 4): the least
decayed usage first, then first come.  It never moves an accepted booking
later and never refuses one; without fair share (the default) that order
is first come, first served.

Pure: the per-day totals and ``now`` are arguments.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:   # annotations only: collections.abc would import collections
    from collections.abc import Iterable, Mapping


DAY = 86400
WINDOW_HALF_LIVES = 8


def window(now: int, half_life_s: int) -> tuple[int, int]:
    """The span of history that counts: ``WINDOW_HALF_LIVES`` half-lives back."""
    return now - WINDOW_HALF_LIVES * half_life_s, now


def weight(t: float, now: int, half_life_s: int) -> float:
    """What one GPU-second at ``t`` counts at ``now``."""
    return 2.0 ** (-max(0.0, now - t) / half_life_s)


def decayed(days: Iterable[tuple[int, Mapping[int, float]]], now: int, half_life_s: int) -> dict[int, float]:
    """``days``: (day start, {uid: GPU-seconds}) per UTC day; returns each
    uid's decayed GPU-seconds at ``now``."""
    out: dict[int, float] = {}
    for start, by_uid in days:
        end = min(start + DAY, now)
        if end <= start:
            continue
        w = weight((start + end) / 2, now, half_life_s)
        for uid, secs in by_uid.items():
            if secs:
                out[uid] = out.get(uid, 0.0) + secs * w
    return out


def shares(usage: Mapping[int, float]) -> dict[int, float]:
    """Each uid's part of the decayed total (they add up to 1)."""
    total = sum(usage.values())
    return {uid: (v / total if total else 0.0) for uid, v in usage.items()}


def used_seconds(totals) -> int:
    """What counts as a user's use in one ``bk.core.usage.Totals``."""
    return totals.booked_s + totals.unreserved_s
