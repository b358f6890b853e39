"""The fast search against the brute-force slice scanner, on random worlds.

Each case is built from its own seed, and a failure prints the command that
replays exactly that case.  ``BK_TEST_SEED`` moves the whole run to another
base seed; ``BK_TEST_CASES`` sets how many cases each of the ten chunks runs
(1,000 by default: 10,000 cases in a few seconds).
"""

from __future__ import annotations

import os
import random

import pytest

from bk.core.errors import BkError
from bk.core.models import EXCLUSIVE, SHARED, Blackout, GpuInfo, GpuProcess, Policy, Reservation
from bk.core.record import replace
from bk.core.scheduler import Request, options_now, place, recommend
from tests.reference_scheduler import reference_fits, reference_place

BASE_SEED = int(os.environ.get("BK_TEST_SEED", "20260713"))
CHUNKS = 10
PER_CHUNK = int(os.environ.get("BK_TEST_CASES", "1000"))
EPOCH = 1_783_900_800          # 2026-07-13 00:00 UTC


def random_world(rng: random.Random) -> dict:
    """A small ledger, policy, GPU snapshot and request; mostly valid, with
    every rule given a chance to refuse."""
    slot_minutes = rng.choice((5, 15, 30, 60))
    q = slot_minutes * 60
    n = rng.randint(1, 4)
    cap = rng.randint(1, 3)
    queue_hours = rng.randint(0, 48 * q // 3600)
    window = queue_hours * 3600 // q                      # search length in slices
    policy = Policy(
        gpu_count=n, slot_minutes=slot_minutes, max_shared_users=cap,
        shared_memory_reserve_mb=512, require_shared_memory=rng.random() < 0.05,
        booking_horizon_days=rng.randint(1, 2), max_booking_hours=rng.choice((1, 4) + (720,) * 10),
        queue_search_hours=queue_hours,
        disabled_gpus=frozenset(g for g in range(n) if rng.random() < 0.05),
        gpu_priority=tuple((g, rng.randint(0, 2)) for g in range(n) if rng.random() < 0.3),
    )
    now = EPOCH + rng.randrange(0, 86400 // q) * q + rng.randrange(0, q)
    here = now - now % q

    def mem():
        return rng.choice((None, None, 2000, 6000, 9000, 20000))

    reservations = []
    for i in range(rng.randint(0, 16)):
        start = here + rng.randint(-6, window + 6) * q
        share_mode = rng.random() < 0.8
        reservations.append(Reservation(
            id=f"r{i}", uid=1000 + i % 3, user=("alice", "bob", "carol")[i % 3],
            mode=SHARED if share_mode else EXCLUSIVE,
            gpus=tuple(sorted(rng.sample(range(n), rng.randint(1, n)))),
            share=rng.randint(1, cap) if share_mode else 1,
            start=start, end=start + rng.randint(1, 10) * q, created=EPOCH,
            mem_mib=mem() if share_mode else None,
            cancelled_at=EPOCH if rng.random() < 0.1 else None))
    blackouts = []
    for i in range(rng.choice((0, 0, 1, 2))):
        start = here + rng.randint(-2, window + 4) * q + rng.choice((0, 0, rng.randrange(q)))
        blackouts.append(Blackout(f"b{i}", start, start + rng.randint(1, 6) * q, "maintenance"))
    gpus = None
    if rng.random() < 0.7:
        gpus = [GpuInfo(g, f"GPU-{g}", "sim", mem_total_mib=rng.choice((None, 16384, 24576, 40960)),
                        util=rng.choice((None, 0, 50)),
                        processes=rng.choice((None, [], [GpuProcess(4242)])))
                for g in range(n) if rng.random() < 0.9]
    load = {g: rng.choice((0.0, 0.5)) for g in range(n) if rng.random() < 0.5}

    count = rng.randint(1, n + (1 if rng.random() < 0.1 else 0))
    pinned = None
    if rng.random() < 0.2 and count <= n:
        pinned = tuple(sorted(rng.sample(range(n), count)))
    excluded = tuple(g for g in range(n) if rng.random() < 0.05)
    duration = rng.randint(1, 8) * q + (rng.randrange(1, q) if rng.random() < 0.02 else 0)
    start = None
    if rng.random() < 0.5:
        start = here + rng.randint(0, window + 2) * q
    req = Request(
        count=count, duration=duration, mode=SHARED if rng.random() < 0.75 else EXCLUSIVE,
        share=rng.randint(1, cap + (1 if rng.random() < 0.05 else 0)), mem_mib=mem(),
        start=start, queue=rng.random() < 0.5, pinned=pinned, excluded=excluded,
        ignore_id=rng.choice([None, None] + [r.id for r in reservations]))
    return dict(req=req, reservations=reservations, blackouts=blackouts, policy=policy,
                gpus=gpus, now=now, load=load)


def fast_outcome(world: dict):
    try:
        p = place(world["req"], reservations=world["reservations"], blackouts=world["blackouts"],
                  policy=world["policy"], gpus=world["gpus"], now=world["now"], load=world["load"])
    except BkError as e:
        return ("error", type(e).__name__, e.details.get("rule")), None
    return ("ok", p.start, p.gpus), p


def replay(seed: int) -> str:
    return (f"seed {seed}; replay with: BK_TEST_SEED={seed} BK_TEST_CASES=1 python3 -m pytest "
            f"'tests/test_scheduler_diff.py::test_fast_search_agrees_with_slice_scanner[0]'")


def check_case(seed: int) -> None:
    world = random_world(random.Random(seed))
    w = world
    want = reference_place(w["req"], w["reservations"], w["blackouts"], w["policy"], w["gpus"],
                           w["now"], w["load"])
    got, placement = fast_outcome(world)
    assert got == want, f"{replay(seed)}\nfast {got} != reference {want}\n{world}"
    if placement is None:
        return
    assert placement.end - placement.start == w["req"].duration
    assert placement.queued == (placement.start > (w["req"].start or w["now"] - w["now"] % (w["policy"].slot_seconds)))
    options = recommend(w["req"], reservations=w["reservations"], blackouts=w["blackouts"],
                        policy=w["policy"], gpus=w["gpus"], now=w["now"], load=w["load"])
    assert (options[0].start, options[0].gpus) == (placement.start, placement.gpus), replay(seed)
    assert len({(o.start, o.gpus) for o in options}) == len(options), replay(seed) + ": repeated option"
    for o in options:
        assert reference_fits(w["req"], w["reservations"], w["blackouts"], w["policy"], w["gpus"],
                              w["now"], o.start, o.gpus), f"{replay(seed)}: option {o} does not fit"


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_fast_search_agrees_with_slice_scanner(chunk):
    first = BASE_SEED + chunk * PER_CHUNK
    for seed in range(first, first + PER_CHUNK):
        try:
            check_case(seed)
        except AssertionError:
            raise
        except Exception as e:         # a crash in either scheduler: still name the seed
            raise AssertionError(f"{replay(seed)}\n{type(e).__name__}: {e}") from e


def test_outcomes_cover_every_rule():
    """The generator is only useful if it reaches every branch."""
    seen = set()
    for seed in range(BASE_SEED, BASE_SEED + 600):
        w = random_world(random.Random(seed))
        out = reference_place(w["req"], w["reservations"], w["blackouts"], w["policy"], w["gpus"],
                              w["now"], w["load"])
        if out[0] == "ok":
            seen.add("queued" if out[1] > (w["req"].start or w["now"] - w["now"] % w["policy"].slot_seconds)
                     else "ok")
        else:
            seen.add(out[2])
    missing = {"ok", "queued", "input", "max_length", "require_shared_memory", "horizon", "gpu_count",
               "disabled_gpu", "memory", "excluded", "blackout", "capacity"} - seen
    assert not missing


def test_an_answer_days_past_the_first_sweep_agrees_with_slice_scanner():
    """``place`` sweeps a day ahead first and widens only when the answer
    is not inside (``first_fit``): GPUs booked solid for days, with gaps,
    put most answers past one or more widenings."""
    far = 0
    for seed in range(BASE_SEED, BASE_SEED + 200):
        rng = random.Random(seed)
        n, q = rng.randint(1, 3), 3600
        policy = Policy(gpu_count=n, slot_minutes=60, max_shared_users=1, queue_search_hours=24 * 9,
                        booking_horizon_days=10, max_booking_hours=48)
        now = EPOCH + rng.randrange(0, 24) * q + rng.randrange(0, q)
        here = now - now % q
        reservations = []
        for g in range(n):
            t = here + rng.randint(-2, 3) * q
            while t < here + 9 * 86400:
                length = rng.randint(1, 60) * q
                reservations.append(Reservation(f"r{len(reservations)}", 1000, "alice", SHARED, (g,), 1,
                                                t, t + length, EPOCH))
                t += length + rng.choice((0, 0, 0, q, 2 * q, 5 * q))
        req = Request(count=rng.randint(1, n), duration=rng.randint(1, 6) * q, mode=SHARED, share=1,
                      mem_mib=None, start=None, queue=True, pinned=None, excluded=(), ignore_id=None)
        world = dict(req=req, reservations=reservations, blackouts=[], policy=policy, gpus=None, now=now, load={})
        want = reference_place(req, reservations, [], policy, None, now, {})
        got, placement = fast_outcome(world)
        assert got == want, f"seed {seed}: fast {got} != reference {want}"
        far += placement is not None and placement.start - here > 86400
    assert far > 20, far


def test_options_now_from_the_bookings_of_a_window_are_recommends_options_now():
    """``options_now`` (``bk g``'s first read: the bookings before
    ``complete_until``, and maybe some later ones) gives exactly the options
    of ``recommend`` (every booking) that start at the requested time, or
    None; its refusals are ``recommend``'s."""
    told = unknown = 0
    for seed in range(BASE_SEED, BASE_SEED + 3000):
        rng = random.Random(seed)
        w = random_world(rng)
        req = replace(w["req"], start=None, queue=False, ignore_id=None)
        q = w["policy"].slot_seconds
        until = w["now"] - w["now"] % q + rng.randint(1, 40) * q
        given = [r for r in w["reservations"] if (r.end > w["now"] and r.start < until) or rng.random() < 0.3]
        kw = dict(blackouts=w["blackouts"], policy=w["policy"], gpus=w["gpus"], now=w["now"], load=w["load"])
        try:
            want = [o for o in recommend(req, reservations=w["reservations"], **kw) if not o.queued]
        except BkError as e:
            want = e
        try:
            got = options_now(req, reservations=given, complete_until=until, **kw)
        except BkError as e:
            assert isinstance(want, BkError) and (type(e), e.details.get("rule")) == (
                type(want), want.details.get("rule")), f"seed {seed}: {e} but recommend gave {want}"
            continue
        if got is None:
            unknown += 1
            continue
        assert got == want, f"seed {seed}: options_now {got} != recommend's options now {want}"
        told += 1
    assert told > 300 and unknown > 100, (told, unknown)
