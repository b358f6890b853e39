"""Energy per GPU and per booking (bk.core.energy, folded by
bk.core.usage.Folder): counter deltas, what is unknown, how an interval is
shared, and conservation over random mixes (hypothesis)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bk.core import energy as E
from bk.core.models import GpuInfo, GpuProcess, Reservation
from bk.core.telemetry import Attribution, Snapshot
from bk.core.usage import Folder, rollup, summarise

T = 1_800_000_000 - 1_800_000_000 % 60


def test_counter_delta_unknowns():
    d = E.counter_delta
    assert d(None, T, 5, interval_s=2) is None                       # no earlier reading
    assert d((T - 2, 100), T, None, interval_s=2) is None            # N/A now
    assert d((T - 2, 100), T, 140_100, interval_s=2) == 140_000
    assert d((T - 2, 100), T, 50, interval_s=2) is None              # a reset (driver reload)
    assert d((T - 2, 2**64 - 10), T, 5, interval_s=2) is None        # a wrap of the 64 bits
    assert d((T - 60, 100), T, 200, interval_s=2) is None            # a gap: cannot be placed in its minutes
    assert d((T, 100), T, 200, interval_s=2) is None                 # no time passed (or the clock went back)
    assert d((T - 2, 0), T, 10**12, interval_s=2) is None            # more than any board draws
    assert d((T - 2, 0), T, 2_000_000, interval_s=2, limit_mw=700_000) == 2_000_000     # 1000 W
    assert d((T - 2, 0), T, 2_000_000, interval_s=2, limit_mw=300_000) is None   # > 1.5 x its limit


def test_split_exclusive_gets_everything():
    parts, other = E.split(1000, 2, baseline_mw=70_000, capacity=2, holders=[("x", "exclusive", 2)],
                           sm={("u", None): 50, E.OTHER: 10}, present=set())
    assert parts == {"x": 1000} and other == 0


def test_split_shared_baseline_by_slots_work_by_sm():
    # 2 s at a 70 W baseline = 140 J of the 500 J; one of two slots held by "a", the other by "b"
    parts, other = E.split(500_000, 2, baseline_mw=70_000, capacity=2,
                           holders=[("a", "shared", 1), ("b", "shared", 1)],
                           sm={"a": 75, "b": 25}, present={"a", "b"})
    assert parts == pytest.approx({"a": 70_000 + 270_000, "b": 70_000 + 90_000}) and other == 0
    # one slot empty: its half of the baseline is nobody's
    parts, other = E.split(500_000, 2, baseline_mw=70_000, capacity=2, holders=[("a", "shared", 1)],
                           sm={"a": 75}, present={"a"})
    assert parts == pytest.approx({"a": 70_000 + 360_000}) and other == pytest.approx(70_000)
    # no SM reading: the work to the bookings with a process there
    parts, other = E.split(500_000, 2, baseline_mw=70_000, capacity=2,
                           holders=[("a", "shared", 1), ("b", "shared", 1)], sm={}, present={"b"})
    assert parts == pytest.approx({"a": 70_000, "b": 70_000 + 360_000}) and other == 0
    # nobody computes and nobody is there: the work is nobody's
    parts, other = E.split(500_000, 2, baseline_mw=None, capacity=2, holders=[("a", "shared", 1)],
                           sm={}, present=set())
    assert parts == {} and other == 500_000


def test_settle_adds_up_exactly():
    parts, other = E.settle(1000, {"a": 333.7, "b": 333.7, "c": 332.6})
    assert parts == {"a": 333, "b": 333, "c": 332} and other == 2
    parts, other = E.settle(10, {"a": 10.0000001})        # float noise never makes a negative "other"
    assert sum(parts.values()) + other == 10 and other >= 0


# ------------------------------------------------------------- through the folder

def booking(rid, uid, gpus, mode="shared", share=1):
    return Reservation(id=rid, uid=uid, user=f"u{uid}", gpus=tuple(gpus), start=T - 3600, end=T + 86400,
                       mode=mode, share=share, created=T - 3600)


def test_exclusive_booking_gets_the_counter_delta_exactly():
    f = Folder(60, 2)
    r = booking("x", 1000, (0,), mode="exclusive", share=2)
    counter = 10**9
    for k in range(30):
        g = GpuInfo(0, "GPU-0", "H100", processes=[GpuProcess(7, sm=k % 100, uid=1000)],
                    energy_mj=counter, power_limit_mw=700_000)
        f.add(T + 2 * k, Snapshot(T + 2 * k, "fake", (g,)), {(0, 7): Attribution("ok", "verified", 1000)}, [r],
              baselines={0: 70_000})
        counter += 123_457 + k
    (rec,) = f.flush()
    want = sum(123_457 + k for k in range(29))
    assert rec.energy_mj == want and rec.energy_s == 58 and rec.energy_other_mj == 0
    assert [(u.reservation, u.energy_mj) for u in rec.uses] == [("x", want)]


def test_unknown_counter_gives_no_figure():
    f = Folder(60, 2)
    r = booking("a", 1000, (0,))
    for k, c in enumerate((None, None, None)):
        f.add(T + 2 * k, Snapshot(T + 2 * k, "fake", (GpuInfo(0, "G", "x", processes=[], energy_mj=c),)), {}, [r])
    (rec,) = f.flush()
    assert rec.energy_mj is None and rec.energy_s == 0 and rec.energy_other_mj is None
    assert [u.energy_mj for u in rec.uses] == [None]
    d = rec.to_dict()
    assert d["energy_mj"] is None and d["uses"][0]["energy_mj"] is None


def test_a_record_without_energy_reads_as_unknown():
    """A format 1 record (written before energy) has no energy fields."""
    from bk.core.usage import MinuteRecord

    old = {"t": T, "gpu": 0, "v": 1, "period_s": 60, "samples": 30, "covered_s": 60, "util_avg": 5.0,
           "util_n": 30, "mem_peak_mib": 1, "blind_s": 0,
           "uses": [{"uid": 1, "reservation": "r", "mode": "shared", "booked_s": 60, "active_s": 0,
                     "unreserved_s": 0, "sm_avg": None, "sm_n": 0, "mem_peak_mib": None}]}
    rec = MinuteRecord.from_dict(old)
    assert rec.energy_mj is None and rec.uses[0].energy_mj is None
    assert summarise([rec]).by_reservation["r"].energy_mj is None


def random_world(rng: random.Random):
    gpus = rng.randint(1, 3)
    cap = rng.randint(1, 4)
    res = []
    for g in range(gpus):
        if rng.random() < 0.3:
            res.append(booking(f"x{g}", 1000 + g, (g,), mode="exclusive", share=cap))
            continue
        used = 0
        while used < cap and rng.random() < 0.7:
            share = rng.randint(1, cap - used)
            res.append(booking(f"s{g}-{used}", 1000 + rng.randint(0, 5), (g,), share=share))
            used += share
    return gpus, cap, res


def random_sample(rng, gpus, res, counters, t):
    infos, atts = [], {}
    for g in range(gpus):
        procs = []
        if rng.random() < 0.9:
            for k in range(rng.randint(0, 4)):
                pid = 100 * g + k
                kind = rng.choice(["ok", "ok", "unreserved", "unknown", "system"])
                holders = [r for r in res if g in r.gpus]
                uid = rng.choice(holders).uid if kind == "ok" and holders else 3000 + k
                procs.append(GpuProcess(pid, mem_mib=rng.randint(0, 9000),
                                        sm=None if rng.random() < 0.2 else rng.randint(0, 100), uid=uid))
                atts[(g, pid)] = Attribution(kind if kind != "ok" or holders else "unreserved",
                                             "verified", uid if kind != "unknown" else None)
        else:
            procs = None
        if rng.random() < 0.05:
            counters[g] = rng.randint(0, 1000)                  # a reset
        elif rng.random() < 0.05:
            counters[g] = None                                  # N/A
        else:
            counters[g] = (counters[g] or 0) + rng.randint(0, 1_400_000)
        infos.append(GpuInfo(g, f"GPU-{g}", "x", processes=procs, energy_mj=counters[g],
                             power_limit_mw=700_000))
    return Snapshot(t, "fake", tuple(infos)), atts


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 200))
def test_energy_is_conserved_over_random_mixes(seed, samples):
    """Whatever the bookings, processes, SM readings and counter faults:
    every record's parts and ``other`` add up to its energy (within 0.5 %:
    in fact exactly), none is negative, an exclusive booking's part is the
    whole, a record's energy is the sum of the counter deltas that were
    known, and roll-ups and totals keep the sums."""
    rng = random.Random(seed)
    gpus, cap, res = random_world(rng)
    baselines = {g: rng.choice([None, 50_000, 70_000, 2_000_000]) for g in range(gpus)}
    f = Folder(60, 2, capacity=cap)
    counters = {g: rng.randint(0, 10**9) for g in range(gpus)}
    known: dict[tuple[int, int], int] = {}
    prev = {g: None for g in range(gpus)}
    records, t = [], T
    for _ in range(samples):
        t += rng.choice([1, 2, 2, 2, 3, 9])
        snap, atts = random_sample(rng, gpus, res, counters, t)
        records += f.add(t, snap, atts, res, baselines={g: b for g, b in baselines.items() if b})
        for g in range(gpus):
            delta = E.counter_delta(prev[g], t, counters[g], interval_s=2, limit_mw=700_000)
            if delta is not None:
                key = (t - t % 60, g)
                known[key] = known.get(key, 0) + delta
            prev[g] = (t, counters[g]) if counters[g] is not None else None
    records += f.flush()
    for r in records:
        assert r.energy_mj == known.get((r.t, r.gpu)), (seed, r)
        if r.energy_mj is None:
            assert r.energy_other_mj is None and all(u.energy_mj is None for u in r.uses)
            continue
        parts = [u.energy_mj for u in r.uses]
        assert all(p is not None and p >= 0 for p in parts) and r.energy_other_mj >= 0, seed
        assert abs(sum(parts) + r.energy_other_mj - r.energy_mj) <= 0.005 * r.energy_mj, seed
        assert sum(parts) + r.energy_other_mj == r.energy_mj, seed
        excl = [u for u in r.uses if u.mode == "exclusive"]
        if excl:
            assert excl[0].energy_mj == r.energy_mj, seed
    hourly = rollup(records)
    total = sum(r.energy_mj or 0 for r in records)
    assert sum(r.energy_mj or 0 for r in hourly) == total
    for h in hourly:
        if h.energy_mj is not None:
            assert sum(u.energy_mj or 0 for u in h.uses) + h.energy_other_mj == h.energy_mj, seed
    s = summarise(records)
    assert sum(g.energy_mj or 0 for g in s.by_gpu.values()) == total
    booked = sum(u.energy_mj or 0 for r in records for u in r.uses if u.reservation)
    assert sum(b.energy_mj or 0 for b in s.by_reservation.values()) == booked
