"""The pure usage fold (bk.core.usage): samples -> minute records -> roll-ups,
totals and events.  Fake clock: the samples carry their own times."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bk.core import usage, usagecheck
from bk.core.errors import InvalidInput
from bk.core.models import GpuInfo, GpuProcess, Reservation
from bk.core.telemetry import Snapshot
from bk.core.usage import Folder, MinuteRecord, Use

T0 = 1_800_000_000 - 1_800_000_000 % 86400      # a UTC midnight
ADA, BOB, CAT = 1000, 2000, 3000


class Att:
    """The contract-A attribution: state, identity, uid."""

    def __init__(self, state, identity=None, uid=None):
        self.state, self.identity, self.uid = state, identity, uid


def booking(rid, uid, gpus, start, end, mode="shared", cancelled=None):
    return Reservation(rid, uid, f"u{uid}", mode, tuple(gpus), 1, start, end, start, cancelled_at=cancelled)


def snap(t, *gpus):
    return Snapshot(t, "test", tuple(gpus), (), True)


def gpu(i, procs=(), util=None, mem=None):
    return GpuInfo(i, f"GPU-{i}", "test", 81920, mem, util, None, None if procs is None else list(procs))


def fold(samples, reservations, *, period=60, interval=2, atts=None):
    f = Folder(period, interval)
    out = []
    for t, s in samples:
        out += f.add(t, s, (atts or {}).get(t, {}), reservations)
    return out, f


def test_booked_active_and_unreserved_per_gpu():
    r = booking("r-ada", ADA, [0], T0, T0 + 3600)
    samples = []
    for k in range(30):
        t = T0 + 2 * k
        # ada runs for the first 20 samples; bob runs on GPU 1 without a booking all minute
        p0 = [GpuProcess(10, mem_mib=1000 + k, sm=50, uid=ADA)] if k < 20 else []
        samples.append((t, snap(t, gpu(0, p0, util=80, mem=2000), gpu(1, [GpuProcess(11, 300, None, BOB)], util=5))))
    out, f = fold(samples + [(T0 + 60, snap(T0 + 60, gpu(0), gpu(1)))], [r])
    assert [(m.t, m.gpu) for m in out] == [(T0, 0), (T0, 1)]
    g0, g1 = out
    assert (g0.samples, g0.covered_s, g0.util_avg, g0.mem_peak_mib, g0.blind_s) == (30, 60, 80.0, 2000, 0)
    (u,) = g0.uses
    assert (u.uid, u.reservation, u.mode, u.booked_s, u.active_s, u.unreserved_s) == (ADA, "r-ada", "shared", 60, 40, 0)
    assert (u.sm_avg, u.sm_n, u.mem_peak_mib) == (50.0, 20, 1019)
    (b,) = g1.uses
    assert (b.uid, b.reservation, b.booked_s, b.active_s, b.unreserved_s, b.sm_avg, b.mem_peak_mib) == \
        (BOB, None, 0, 0, 60, None, 300)
    # The sample at T0+60 opened the next minute; flush gives it.
    rest = f.flush()
    assert [(m.t, m.samples) for m in rest] == [(T0 + 60, 1), (T0 + 60, 1)]
    assert f.flush() == []


def test_a_gap_counts_one_interval_not_the_whole_gap():
    out, f = fold([(T0, snap(T0, gpu(0))), (T0 + 4, snap(T0 + 4, gpu(0))), (T0 + 40, snap(T0 + 40, gpu(0)))], [])
    (m,) = f.flush()
    # 2 (first) + 4 (since previous, within 3 x interval) + 2 (after a 36 s gap)
    assert (m.samples, m.covered_s) == (3, 8)


def test_clock_going_back_closes_the_period():
    out, f = fold([(T0 + 120, snap(T0 + 120, gpu(0))), (T0 + 5, snap(T0 + 5, gpu(0)))], [])
    assert [m.t for m in out] == [T0 + 120]
    assert [m.t for m in f.flush()] == [T0]


def test_contract_a_attributions_and_plain_strings():
    r = booking("r-bob", BOB, [0], T0, T0 + 3600)
    # A root-owned container process attributed (inferred) to bob, the booker.
    p = GpuProcess(20, 500, 30, 0)
    atts = {T0: {(0, 20): Att("ok", "inferred", BOB)}, T0 + 2: {(0, 20): "unreserved"}}
    out, f = fold([(T0, snap(T0, gpu(0, [p]))), (T0 + 2, snap(T0 + 2, gpu(0, [p])))], [r], atts=atts)
    (m,) = f.flush()
    by = {(u.uid, u.reservation): u for u in m.uses}
    assert by[(BOB, "r-bob")].active_s == 2 and by[(BOB, "r-bob")].booked_s == 4
    assert by[(0, None)].unreserved_s == 2       # the string state keeps the process's own uid


def test_fallback_attribution_and_what_is_not_counted():
    r = booking("r-ada", ADA, [0], T0, T0 + 3600)
    procs = [GpuProcess(1, 100, 10, ADA), GpuProcess(2, 50, None, None),             # unknown owner
             GpuProcess(3, 90, None, 0, "root", "Xorg"), GpuProcess(4, 10, 5, CAT)]  # system; cat unreserved
    out, f = fold([(T0, snap(T0, gpu(0, procs), gpu(1, [GpuProcess(5, 1, 1, ADA)])))], [r])
    m0, m1 = f.flush()
    assert {(u.uid, u.reservation): (u.active_s, u.unreserved_s) for u in m0.uses} == \
        {(ADA, "r-ada"): (2, 0), (CAT, None): (0, 2)}
    # ada on GPU 1 while booked on GPU 0: wrong-gpu, counted as unreserved use there
    assert [(u.uid, u.reservation, u.unreserved_s) for u in m1.uses] == [(ADA, None, 2)]


def test_no_process_list_is_blind_not_idle():
    r = booking("r-ada", ADA, [0], T0, T0 + 3600)
    out, f = fold([(T0, snap(T0, gpu(0, None)))], [r])
    (m,) = f.flush()
    assert m.blind_s == 2 and m.uses[0].booked_s == 2 and m.uses[0].active_s == 0
    assert usage.events([m], min_idle_s=0) == []      # blind minutes are never called idle


def test_cancelled_and_other_gpu_bookings_are_not_booked_time():
    rs = [booking("r1", ADA, [0], T0, T0 + 3600, cancelled=T0 - 5), booking("r2", ADA, [1], T0, T0 + 3600),
          booking("r3", BOB, [0], T0 + 60, T0 + 120)]
    out, f = fold([(T0, snap(T0, gpu(0), gpu(1)))], rs)
    m0, m1 = f.flush()
    assert m0.uses == () and [u.reservation for u in m1.uses] == ["r2"]


def test_two_shared_bookings_on_one_gpu_each_get_their_owner():
    rs = [booking("ra", ADA, [0], T0, T0 + 60), booking("rb", BOB, [0], T0, T0 + 60)]
    out, f = fold([(T0, snap(T0, gpu(0, [GpuProcess(1, 10, 90, BOB)])))], rs)
    (m,) = f.flush()
    by = {u.reservation: (u.booked_s, u.active_s, u.sm_avg) for u in m.uses}
    assert by == {"ra": (2, 0, None), "rb": (2, 2, 90.0)}


def test_record_round_trip_and_t_first():
    m = MinuteRecord(T0, 3, 60, 30, 60, 12.5, 30, 100, 0, (Use(ADA, "r", "exclusive", 60, 30, 0, 40.0, 15, 9),))
    d = m.to_dict()
    assert next(iter(d)) == "t"
    assert MinuteRecord.from_dict(d) == m


def test_rollup_weights_and_is_idempotent():
    a = MinuteRecord(T0, 0, 60, 30, 60, 10.0, 30, 100, 0, (Use(ADA, "r", "shared", 60, 60, 0, 10.0, 30, 5),))
    b = MinuteRecord(T0 + 60, 0, 60, 10, 20, 70.0, 10, 300, 4, (Use(ADA, "r", "shared", 20, 0, 0, None, 0, None),
                                                                Use(BOB, None, None, 0, 0, 20, 80.0, 10, 7)))
    (h,) = usage.rollup([a, b])
    assert (h.t, h.period_s, h.samples, h.covered_s, h.util_avg, h.util_n, h.mem_peak_mib, h.blind_s) == \
        (T0, 3600, 40, 80, 25.0, 40, 300, 4)
    assert [(u.uid, u.booked_s, u.active_s, u.unreserved_s, u.sm_avg, u.sm_n, u.mem_peak_mib) for u in h.uses] == \
        [(ADA, 80, 60, 0, 10.0, 30, 5), (BOB, 0, 0, 20, 80.0, 10, 7)]
    assert usage.rollup([h]) == [h]
    # The same sums; only first/last coarsen to the hour.
    assert strip(usage.summarise([a, b]).to_store()) == strip(usage.summarise([h]).to_store() | {"records": 2})


def strip(doc):
    if isinstance(doc, dict):
        return {k: strip(v) for k, v in doc.items() if k not in ("first", "last")}
    return doc


def test_events_join_consecutive_periods():
    idle = [MinuteRecord(T0 + 60 * k, 0, uses=(Use(ADA, "r", "shared", 60, 0),)) for k in range(40)]
    unres = [MinuteRecord(T0 + 60 * k, 1, uses=(Use(BOB, None, None, 0, 0, 60, 50.0, 1, 700),))
             for k in (0, 1, 2, 10)]
    evs = usage.events(idle + unres, min_idle_s=1800)
    assert [(e.kind, e.uid, e.gpu, e.start, e.end, e.seconds) for e in evs] == [
        ("idle-booking", ADA, 0, T0, T0 + 2400, 2400),
        ("unreserved", BOB, 1, T0, T0 + 180, 180),
        ("unreserved", BOB, 1, T0 + 600, T0 + 660, 60)]
    assert evs[1].mem_peak_mib == 700 and evs[1].sm_avg == 50.0
    assert [e.kind for e in usage.events(idle[:20], min_idle_s=1800)] == []


JAN15 = int(datetime(2027, 1, 15, tzinfo=timezone.utc).timestamp())


@pytest.mark.parametrize("text, want", [
    ("30d", T0 + 43200 - 30 * 86400), ("2w", T0 + 43200 - 14 * 86400), ("12h", T0), ("90m", T0 + 43200 - 5400),
    ("1d12h", T0 - 86400), ("today", T0), ("2027-01-15", JAN15), ("2027-01-15T08:00:00Z", JAN15 + 28800),
    ("2027-01-15T09:00:00+01:00", JAN15 + 28800)])
def test_parse_since(text, want):
    assert usage.parse_since(text, T0 + 43200, timezone.utc) == want


@pytest.mark.parametrize("bad", ["", "soon", "30x", "2027-13-01", "-3d"])
def test_parse_since_refuses(bad):
    with pytest.raises(InvalidInput):
        usage.parse_since(bad, T0, timezone.utc)


def test_local_days_cover_the_window():
    days = usage.local_days(T0 + 100, timezone.utc, 7)
    assert days[-1] == (T0, T0 + 86400) and days[0][0] == T0 - 6 * 86400
    assert all(a[1] == b[0] for a, b in zip(days, days[1:], strict=False))


# ------------------------------------------------------------ fold = brute force over samples

gaps = st.lists(st.sampled_from([1, 2, 2, 2, 3, 5, 7, 30, 61]), min_size=1, max_size=120)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(gaps=gaps, seed=st.integers(0, 2**32 - 1))
def test_fold_equals_a_per_sample_sum(gaps, seed):
    """Every sample's seconds (since the previous one, at most 3 intervals;
    one interval after a gap) summed by hand equal the records' sums."""
    import random

    rng = random.Random(seed)
    rs = [booking("a", ADA, [0, 1], T0 + 20, T0 + 200), booking("b", BOB, [1], T0, T0 + 400)]
    folder, out, want = Folder(60, 2), [], {}
    t, last = T0, None
    for gap in gaps:
        t += gap
        gpus = []
        for g in (0, 1):
            procs = [GpuProcess(100 + u, 10, None, u) for u in (ADA, BOB, CAT) if rng.random() < 0.4]
            gpus.append(gpu(g, procs))
        dt = 2 if last is None or t - last > 6 else t - last
        last = t
        for g in gpus:
            for r in rs:
                if r.start <= t < r.end and g.index in r.gpus:
                    k = (r.uid, r.id, g.index)
                    b, a, u = want.get(k, (0, 0, 0))
                    ran = any(p.uid == r.uid for p in g.processes)
                    want[k] = (b + dt, a + (dt if ran else 0), u)
            for uid in {p.uid for p in g.processes}:
                if not any(r.uid == uid and r.start <= t < r.end and g.index in r.gpus for r in rs):
                    k = (uid, None, g.index)
                    b, a, u = want.get(k, (0, 0, 0))
                    want[k] = (b, a, u + dt)
        out += folder.add(t, snap(t, *gpus), None, rs)
    out += folder.flush()
    got = {}
    for m in out:
        assert m.t % 60 == 0
        for u in m.uses:
            k = (u.uid, u.reservation, m.gpu)
            b, a, x = got.get(k, (0, 0, 0))
            got[k] = (b + u.booked_s, a + u.active_s, x + u.unreserved_s)
    assert got == want, f"seed={seed}"
    assert len({(m.t, m.gpu) for m in out}) == len(out)
    assert sum(m.samples for m in out) == 2 * len(gaps)


# ---------------------------------------------------------------- range checks (issue 30, item 14)

_GOOD = MinuteRecord(1_800_000_000 - 1_800_000_000 % 60, 3, 60, 30, 60, 41.5, 30, 2048, 0,
                     (Use(1000, "r" * 36, "shared", 60, 30, 0, 12.5, 15, 1024), Use(2000, None, None, 0, 0, 60))).to_dict()

_OUT = [("t", -60), ("t", _GOOD["t"] + 1), ("t", "now"), ("gpu", 64), ("gpu", -1), ("gpu", True),
        ("period_s", 0), ("period_s", 7), ("period_s", 2 * 86400), ("samples", -1), ("samples", 10 ** 9),
        ("covered_s", 10 ** 14), ("blind_s", -1), ("util_avg", 100.5), ("util_avg", float("nan")),
        ("util_avg", "high"), ("util_n", 31), ("mem_peak_mib", 10 ** 30), ("mem_peak_mib", 1.5),
        ("uses", {}), ("uses", [1])]
_USE_OUT = [("uid", -1), ("uid", 1 << 32), ("uid", None), ("reservation", ""), ("reservation", 7),
            ("reservation", "x" * 500), ("mode", "all"), ("booked_s", 10 ** 14), ("active_s", -1),
            ("unreserved_s", 1.0), ("sm_n", 31), ("sm_avg", 101), ("sm_avg", float("inf")), ("mem_peak_mib", -1)]


def test_a_record_bk_wrote_is_in_range_and_so_are_its_defaults():
    assert usagecheck.record_problem(_GOOD) is None
    sparse = {"t": _GOOD["t"], "gpu": 0, "uses": [{"uid": 5}]}        # every other key has its default
    assert usagecheck.record_problem(sparse) is None and not _fine_or_none(sparse)
    assert usagecheck.record_problem(MinuteRecord(_GOOD["t"] - _GOOD["t"] % 3600, 0, 3600, 7200, 3600).to_dict()) is None


def _fine_or_none(d):
    try:
        return usagecheck._fine(d)
    except (KeyError, TypeError):
        return None


@pytest.mark.parametrize("key, value", _OUT + [("uses." + k, v) for k, v in _USE_OUT])
def test_a_field_out_of_range_is_named_by_both_paths(key, value):
    import copy

    d = copy.deepcopy(_GOOD)
    if key.startswith("uses."):
        d["uses"][0][key[5:]] = value
    else:
        d[key] = value
    why = usagecheck.record_problem(d)
    assert why is not None and (key.split(".")[-1] in why or "use" in why), why
    assert _fine_or_none(d) in (False, None)              # the fast path never passes what the slow one names
    assert len(why) < 120                                 # a value of any size is shown cut short
