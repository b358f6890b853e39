"""The activity state of a booking (bk.core.activity): each rule on one
sample, the idle clock over time, the baseline, the nudge and release
decisions, and the property that one active sample resets the clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bk.core import activity as A
from bk.core.models import GpuInfo, GpuProcess, Reservation
from bk.core.telemetry import Attribution, Snapshot

T = 1_800_000_000
UID = 1000


def res(rid="r1", uid=UID, gpus=(0,), mode="shared", start=T - 60, end=T + 86400, **extra):
    return Reservation(id=rid, uid=uid, user="ada", gpus=tuple(gpus), start=start, end=end, mode=mode,
                       share=1, created=start, extra=extra)


def gpu(i=0, *, procs=(), util=0, power=None, limit=700_000, energy=None):
    return GpuInfo(i, f"GPU-{i}", "H100", mem_total_mib=81559, mem_used_mib=0, util=util,
                   processes=None if procs is None else list(procs), power_mw=power, power_limit_mw=limit,
                   energy_mj=energy)


def proc(pid=7, *, sm=0, mem=8000, uid=UID, label="python"):
    return GpuProcess(pid, mem_mib=mem, sm=sm, uid=uid, user="ada", label=label)


def ok(*pairs, uid=UID, state="ok"):
    return {(g, pid): Attribution(state, "verified" if state != "unknown" else None,
                                  uid if state != "unknown" else None) for g, pid in pairs}


def judge(g, atts=None, *, baseline=70_000, cpu=None, sm_readable=True, r=None):
    r = r or res(gpus=(g.index,))
    atts = ok(*((g.index, p.pid) for p in g.processes or ())) if atts is None else atts
    return A.judge_booking(r, {g.index: g}, atts, {g.index: baseline} if baseline else {},
                           cpu_share=cpu, sm_readable=sm_readable)


# ------------------------------------------------------------- one sample, rule by rule

@pytest.mark.parametrize("case, g, kw, want", [
    ("compute by SM", gpu(procs=[proc(sm=60)], power=400_000), {}, (A.ACTIVE, "sm")),
    ("light compute at low power is still compute", gpu(procs=[proc(sm=20)], power=80_000), {},
     (A.ACTIVE, "sm")),
    ("a notebook holding 8 GB", gpu(procs=[proc(sm=0)], power=72_000), {}, (A.IDLE_HELD, "memory-held")),
    ("no SM sample since the last look: nothing ran", gpu(procs=[proc(sm=None)], power=72_000), {},
     (A.IDLE_HELD, "memory-held")),
    ("a framework reserving all memory, idle", gpu(procs=[proc(sm=0, mem=79000)], power=71_000), {},
     (A.IDLE_HELD, "memory-held")),
    ("a spin kernel: 100 % SM at idle power", gpu(procs=[proc(sm=100)], power=90_000), {},
     (A.IDLE_HELD, "spin")),
    ("100 % SM with power unknown is believed", gpu(procs=[proc(sm=100)], power=None), {},
     (A.ACTIVE, "sm")),
    ("100 % SM before any baseline is believed", gpu(procs=[proc(sm=100)], power=90_000),
     {"baseline": None}, (A.ACTIVE, "sm")),
    ("no process of the booking", gpu(procs=[], util=100, power=300_000), {}, (A.EMPTY, "no-process")),
    ("utilisation stuck at 100 % with no process", gpu(procs=[], util=100, power=70_000), {},
     (A.EMPTY, "no-process")),
    ("no process list", gpu(procs=None), {}, (A.UNKNOWN, "no-process-list")),
    ("a data loader: no compute, CPU busy", gpu(procs=[proc(sm=0)], power=72_000), {"cpu": 1.8},
     (A.ACTIVE, "cpu")),
    ("an idle notebook's heartbeat is not busy", gpu(procs=[proc(sm=0)], power=72_000), {"cpu": 0.003},
     (A.IDLE_HELD, "memory-held")),
    ("no SM readings: power above the baseline", gpu(procs=[proc(sm=None)], power=300_000),
     {"sm_readable": False}, (A.ACTIVE, "power")),
    ("no SM readings: idle power", gpu(procs=[proc(sm=None)], power=75_000, util=100),
     {"sm_readable": False}, (A.IDLE_HELD, "memory-held")),
    ("no SM readings nor power: utilisation", gpu(procs=[proc(sm=None)], util=40),
     {"sm_readable": False, "baseline": None}, (A.ACTIVE, "util")),
    ("no evidence at all", GpuInfo(0, "GPU-0", "x", processes=[proc(sm=None)]),
     {"sm_readable": False, "baseline": None}, (A.UNKNOWN, "no-evidence")),
])
def test_one_sample(case, g, kw, want):
    j = judge(g, **kw)
    assert (j.state, j.reason) == want, case


def test_mps_client_counts_by_the_boards_power():
    """Under MPS the server has the SM samples, the client none: the
    client's booking is active while the board works, idle when it does not."""
    server = GpuProcess(50, mem_mib=300, sm=95, uid=0, user="root", label="nvidia-cuda-mps-server")
    client = proc(sm=None)
    atts = ok((0, client.pid))
    atts[(0, 50)] = Attribution("system", "verified", 0)
    assert judge(gpu(procs=[server, client], power=420_000, util=95), atts).state == A.ACTIVE
    j = judge(gpu(procs=[server, client], power=72_000, util=0), atts)
    assert (j.state, j.reason) == (A.IDLE_HELD, "memory-held")


def test_unknown_owner_computing_on_the_booking_gpu_is_not_called_empty():
    """A root container process on a GPU that two users hold is ambiguous:
    while it computes, the booking is unknown (it may be this booker's), so
    the idle clock does not run; a silent ghost (a process gone from /proc
    that the driver still lists) does not hold the clock back."""
    ghost = GpuProcess(99, mem_mib=4000, sm=None)
    busy = GpuProcess(98, mem_mib=4000, sm=70, uid=0, container="docker:abc")
    atts = {(0, 98): Attribution("unknown", "ambiguous", None), (0, 99): Attribution("unknown", None, None)}
    assert judge(gpu(procs=[busy, ghost], power=300_000), atts).state == A.UNKNOWN
    assert judge(gpu(procs=[ghost], power=70_000), {(0, 99): Attribution("unknown", None, None)}).state == A.EMPTY


def test_an_unknown_owner_on_a_gpu_without_sm_readings_holds_the_clock_while_the_board_works():
    """hidepid and no per-process SM: the booking's own processes may be
    the ones of unknown owner; while the board works the booking is unknown,
    and empty again once it is quiet."""
    hidden = GpuProcess(98, mem_mib=4000, sm=None)
    atts = {(0, 98): Attribution("unknown", None, None)}
    assert judge(gpu(procs=[hidden], power=400_000), atts, sm_readable=False).state == A.UNKNOWN
    assert judge(gpu(procs=[hidden], power=None, util=80), atts, sm_readable=False, baseline=None).state == A.UNKNOWN
    assert judge(gpu(procs=[hidden], power=72_000), atts, sm_readable=False).state == A.EMPTY


def test_shared_slot_idle_next_to_a_busy_neighbour():
    """The neighbour's compute (and the board's power) is not this booking's."""
    mine, theirs = proc(7, sm=0), proc(8, sm=90, uid=2000)
    atts = {**ok((0, 7)), **ok((0, 8), uid=2000)}
    j = judge(gpu(procs=[mine, theirs], util=90, power=450_000), atts)
    assert (j.state, j.reason) == (A.IDLE_HELD, "memory-held")


def test_a_mig_gpu_that_lists_no_process_cannot_tell():
    """The driver may hide the processes of MIG instances: "none listed" is
    not "empty" there, so no idle clock runs on a false empty."""
    r = res()
    tr = A.Tracker(2.0)
    mig = GpuInfo(0, "GPU-0", "NVIDIA A100-SXM4-40GB (MIG)", processes=[], util=0)
    tr.observe(T, Snapshot(T, "nvml", (mig,), ("mig",), False), {}, [r])
    assert tr.bookings[r.id].state == A.UNKNOWN
    tr.observe(T + 2, Snapshot(T + 2, "nvml", (gpu(procs=[]),), (), False), {}, [r])
    assert tr.bookings[r.id].state == A.EMPTY


def test_a_booking_is_active_when_any_of_its_gpus_is():
    r = res(gpus=(0, 1))
    g0, g1 = gpu(0, procs=[proc(7, sm=0)]), gpu(1, procs=[proc(8, sm=50)])
    j = A.judge_booking(r, {0: g0, 1: g1}, ok((0, 7), (1, 8)), {}, cpu_share=None, sm_readable=True)
    assert j.state == A.ACTIVE and j.processes == 2 and j.sm_max == 50
    # one GPU cannot tell and the other is idle: unknown, not idle
    j = A.judge_booking(r, {0: g0, 1: gpu(1, procs=None)}, ok((0, 7)), {}, cpu_share=None, sm_readable=True)
    assert j.state == A.UNKNOWN
    # a GPU missing from the snapshot cannot tell either
    assert A.judge_booking(r, {0: g0}, ok((0, 7)), {}, cpu_share=None, sm_readable=True).state == A.UNKNOWN


def test_evidence_is_what_was_seen():
    j = judge(gpu(procs=[proc(sm=0, mem=8192)], power=72_000), cpu=0.001)
    assert j.evidence() == {"processes": 1, "mem_mib": 8192, "sm_max": 0, "power_mw": 72_000,
                            "baseline_mw": 70_000, "threshold_mw": 140_000, "cpu_pct": 0.1}


# ------------------------------------------------------------- the baseline

def test_baseline_learns_quiet_samples_only():
    b = None
    b = A.learn_baseline(b, gpu(procs=[proc(sm=80)], power=400_000))     # busy: not learned
    assert b is None
    b = A.learn_baseline(b, gpu(procs=[], util=100, power=68_000))       # no process: quiet, whatever util says
    assert b == 68_000
    b = A.learn_baseline(b, gpu(procs=[proc(sm=0)], util=0, power=60_000))
    assert b == 60_000
    for _ in range(10):                                                   # rises slowly
        b = A.learn_baseline(b, gpu(procs=[], power=100_000))
    assert 60_000 < b < 61_000
    assert A.learn_baseline(b, gpu(procs=None, power=1)) == b           # blind: nothing learned
    mps = GpuProcess(50, sm=90, label="nvidia-cuda-mps-server")          # the clients' work, on the server
    assert A.learn_baseline(b, gpu(procs=[mps, proc(sm=None)], util=90, power=10_000)) == b
    assert A.learn_baseline(b, gpu(procs=[proc(sm=None)], util=40, power=10_000)) == b


def test_margin():
    assert A.margin_mw(700_000) == 70_000 and A.margin_mw(150_000) == 25_000 and A.margin_mw(None) == 25_000


# ------------------------------------------------------------- over time

def snap(t, *gpus, gaps=()):
    return Snapshot(t, "fake", tuple(gpus), tuple(gaps), False)


def run(tracker, r, samples, t0=T, step=2):
    """Feed (gpu, atts, cpu_seconds) samples; returns the activities."""
    out = []
    t = t0
    for g, atts, cpu in samples:
        s = snap(t, g)
        tracker.observe(t, s, atts, [r], {r.id: cpu} if cpu is not None else {})
        out.append((t, tracker.bookings[r.id].state, tracker.bookings[r.id].idle_s))
        t += step
    return out


def idle_sample(cpu=0.0):
    return gpu(procs=[proc(sm=0)], power=72_000), ok((0, 7)), cpu


def busy_sample():
    return gpu(procs=[proc(sm=70)], power=400_000), ok((0, 7)), 0.0


def test_idle_clock_runs_resets_and_pauses():
    r = res()
    tr = A.Tracker(2.0)
    tr.baselines["GPU-0"] = 70_000
    out = run(tr, r, [idle_sample()] * 5)
    assert [x[2] for x in out] == [0, 2, 4, 6, 8]          # from the first sample seen idle
    out = run(tr, r, [busy_sample()], t0=T + 10)
    assert out[0][1:] == (A.ACTIVE, 0) and tr.bookings[r.id].idle_since is None
    blind = (gpu(procs=None), {}, None)
    out = run(tr, r, [idle_sample(), blind, blind, idle_sample()], t0=T + 12)
    assert [x[1:] for x in out] == [(A.IDLE_HELD, 0), (A.UNKNOWN, 0), (A.UNKNOWN, 0), (A.IDLE_HELD, 0)]
    out = run(tr, r, [idle_sample()], t0=T + 20)
    assert out[0][1:] == (A.IDLE_HELD, 2)                   # unknown paused the clock, did not reset it


def test_a_gap_counts_at_most_three_intervals():
    r = res()
    tr = A.Tracker(2.0)
    run(tr, r, [idle_sample()] * 2)
    run(tr, r, [idle_sample()], t0=T + 3600)          # the monitor was down for an hour
    assert tr.bookings[r.id].idle_s == 4


def test_cpu_counts_over_its_window():
    """A data loader's CPU keeps the booking active; one burst counts for
    CPU_WINDOW_S, then the booking is idle again."""
    r = res()
    tr = A.Tracker(2.0)
    tr.baselines["GPU-0"] = 70_000
    out = run(tr, r, [idle_sample(1.5)] + [idle_sample(0.0)] * 20)
    states = [s for _, s, _ in out]
    assert states[0] == A.ACTIVE
    assert states[1:A.CPU_WINDOW_S // 2 - 1] == [A.ACTIVE] * (A.CPU_WINDOW_S // 2 - 2)
    assert states[-1] == A.IDLE_HELD


def test_bookings_that_end_are_forgotten_and_a_new_owner_starts_afresh():
    r = res()
    tr = A.Tracker(2.0)
    run(tr, r, [idle_sample()] * 3)
    tr.observe(T + 6, snap(T + 6, gpu()), {}, [])
    assert tr.bookings == {}


def test_restart_keeps_the_idle_clock():
    r = res()
    tr = A.Tracker(2.0)
    tr.baselines["GPU-0"] = 70_000
    run(tr, r, [idle_sample()] * 10)
    kept = tr.to_store()
    again = A.Tracker(2.0)
    again.load(kept)
    assert again.baselines == tr.baselines and 70_000 < tr.baselines["GPU-0"] < 72_000
    run(again, r, [idle_sample()], t0=T + 22)           # 4 s after the last sample
    assert again.bookings[r.id].idle_s == 22


def test_load_skips_what_it_cannot_use():
    tr = A.Tracker()
    tr.load({"bookings": {"a": {"uid": "x"}, "b": {"uid": 5, "idle_s": -3, "state": "bogus"}, "c": 7},
             "baselines": {"GPU-0": True, "GPU-1": -5, "GPU-2": 60_000}})
    assert set(tr.bookings) == {"b"} and tr.bookings["b"].idle_s == 0 and tr.bookings["b"].state == A.UNKNOWN
    assert tr.baselines == {"GPU-2": 60_000}


# ------------------------------------------------------------- decisions

def act(state=A.IDLE_HELD, idle_s=0, nudged=()):
    return A.Activity("r1", UID, state=state, idle_s=idle_s, nudged=tuple(nudged))


def test_nudges_at_30_and_45_minutes_once_each():
    assert A.decide(act(idle_s=29 * 60), now=T).nudge is None
    assert A.decide(act(idle_s=30 * 60), now=T).nudge == 30
    assert A.decide(act(idle_s=31 * 60, nudged=(30,)), now=T).nudge is None
    assert A.decide(act(idle_s=50 * 60, nudged=(30,)), now=T).nudge == 45
    # a monitor that comes back after 50 minutes idle gives the latest one only
    a = act(idle_s=50 * 60)
    d = A.decide(a, now=T)
    assert d.nudge == 45
    A.mark_nudged(a, d.nudge)
    assert a.nudged == (30, 45) and A.decide(a, now=T).nudge is None


def test_release_only_after_its_threshold_and_only_when_seen_idle():
    assert A.release_after(None, None) is None
    assert A.release_after(60, 240) == 3600 and A.release_after(None, 240) == 14400
    assert A.decide(act(idle_s=3599), now=T, release_after_s=3600).release is False
    assert A.decide(act(idle_s=3600), now=T, release_after_s=3600).release is True
    assert A.decide(act(A.EMPTY, idle_s=3600), now=T, release_after_s=3600).release is True
    assert A.decide(act(A.UNKNOWN, idle_s=9999), now=T, release_after_s=3600).release is False
    assert A.decide(act(A.ACTIVE, idle_s=0), now=T, release_after_s=60).release is False
    snoozed = A.decide(act(idle_s=9999), now=T, release_after_s=3600, snoozed_until=T + 1)
    assert snoozed.release is False and snoozed.nudge is None
    assert A.decide(act(idle_s=9999), now=T + 1, release_after_s=3600, snoozed_until=T + 1).release is True


def test_booking_opt_in_and_snooze_come_from_the_ledger():
    a = act(idle_s=3600)
    assert A.booking_decision(a, res(idle_release_minutes=60), now=T).release is True
    assert A.booking_decision(a, res(), now=T).release is False
    assert A.booking_decision(a, res(), now=T, policy_release_minutes=60).release is True
    assert A.booking_decision(a, res(idle_release_minutes=120), now=T, policy_release_minutes=60).release is False
    keep = res(idle_release_minutes=60, idle_keep_until="2027-01-15T09:00:00Z")
    assert A.booking_decision(a, keep, now=T).release is False      # kept for an hour more
    assert A.booking_decision(a, res(idle_release_minutes=True), now=T).release is False   # not a number


def test_tracker_marks_nudges_and_publishes_them():
    r = res(idle_release_minutes=1)
    tr = A.Tracker(2.0, nudge_minutes=(1,))
    tr.baselines["GPU-0"] = 70_000
    run(tr, r, [idle_sample()] * 31)
    doc = tr.doc(snap(T, gpu()), [r])
    row = doc["bookings"][0]
    assert row["state"] == A.IDLE_HELD and row["idle_s"] == 60 and row["nudges"] == [1]
    assert row["release_after_s"] == 60 and row["release_due"] is True
    b = tr.baselines["GPU-0"]
    assert doc["gpus"] == [{"index": 0, "baseline_mw": b, "threshold_mw": b + 70_000}] and doc["v"] == 1


# ------------------------------------------------------------- the property

KINDS = st.sampled_from(["active", "idle", "empty", "blind"])


def sample_of(kind):
    if kind == "active":
        return busy_sample()
    if kind == "idle":
        return idle_sample()
    if kind == "empty":
        return gpu(procs=[]), {}, None
    return gpu(procs=None), {}, None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(KINDS, st.integers(1, 8)), min_size=1, max_size=120), st.integers(60, 600))
def test_an_active_sample_anywhere_in_the_window_resets_the_clock(seq, window):
    """For any sequence of samples and gaps: the idle clock never exceeds
    the time since the last active sample, so a booking with an active
    sample within the last ``window`` seconds is never released with a
    threshold of ``window``; and the clock equals the idle time seen since
    then (unknown samples add nothing, each sample at most 3 intervals)."""
    r = res()
    tr = A.Tracker(2.0)
    tr.baselines["GPU-0"] = 70_000
    t, last_active, expect, prev, prev_state = T, None, 0, None, None
    for kind, gap in seq:
        t += gap
        g, atts, cpu = sample_of(kind)
        tr.observe(t, snap(t, g), atts, [r], {r.id: cpu} if cpu is not None else {})
        a = tr.bookings[r.id]
        dt = 2 if prev is None or gap > 6 else gap
        prev = t
        if a.state == A.ACTIVE:
            last_active, expect = t, 0
        elif a.state in A.IDLE_STATES and prev_state in A.IDLE_STATES:
            expect += dt
        prev_state = a.state
        assert a.idle_s == expect
        if last_active is not None:
            assert a.idle_s <= t - last_active
            if t - last_active < window:
                assert not A.decide(a, now=t, release_after_s=window).release
