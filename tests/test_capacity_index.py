"""The scheduler's kept hold index (``bk.core.capacity``): an index derived
from the last one by what changed holds exactly what one built afresh from
the same bookings holds, whatever the change (appends, replacements,
cancellations, removals, a list changed in place after the call, ``now``
moving on or back, other GPUs), and the placements made with it are those
made without it."""

from __future__ import annotations

import os
import random

import pytest

from bk.core import capacity
from bk.core.capacity import HoldIndex, index_holds
from bk.core.models import EXCLUSIVE, SHARED, Policy, Reservation
from bk.core.scheduler import Request, place

GPUS, CAP, Q = 4, 3, 300
SEED = int(os.environ.get("BK_TEST_SEED") or random.randrange(1 << 30))


def _res(rng: random.Random, i: int, now: int) -> Reservation:
    start = now - now % Q + rng.randrange(-12, 60) * Q
    mode = EXCLUSIVE if rng.random() < 0.2 else SHARED
    gpus = tuple(rng.sample(range(GPUS + 1), rng.randint(1, 2)))     # GPU 4: not in the index
    return Reservation(f"r{i}-{rng.randrange(1 << 20)}", 1000 + i % 5, f"u{i % 5}", mode, gpus,
                       rng.randint(1, CAP) if mode == SHARED else 1, start, start + rng.randint(1, 24) * Q,
                       now - 60, rng.choice([None, None, 1000, 4000]))


def _mutate(rng: random.Random, rs: list, i: int, now: int) -> None:
    k = rng.random()
    if k < 0.35 or not rs:
        rs.append(_res(rng, i, now))
    elif k < 0.55:
        j = rng.randrange(len(rs))
        rs[j] = rs[j].replace(start=rs[j].start - Q, gpus=(rng.randrange(GPUS),))
    elif k < 0.7:
        j = rng.randrange(len(rs))
        rs[j] = rs[j].replace(cancelled_at=now)
    elif k < 0.8:
        del rs[rng.randrange(len(rs))]
    elif k < 0.85:
        rs[:] = [_res(rng, i * 1000 + n, now) for n in range(rng.randint(0, 80))]   # many at once
    else:
        rs.append(rs[rng.randrange(len(rs))])        # one record twice (an invalid ledger)


def _view(ledgers: dict) -> dict:
    """What a query can see: per GPU, the holds that count, as a multiset."""
    out = {}
    for g, led in ledgers.items():
        out[g] = sorted((h[0], h[1], h[2], -1 if h[3] is None else h[3], id(h[4]))
                        for h in led.overlapping(-(1 << 40), 1 << 40))
    return out


@pytest.fixture(autouse=True)
def _fresh_memo():
    saved = capacity._last
    capacity._last = None
    yield
    capacity._last = saved


@pytest.mark.parametrize("overlay", [3, capacity.MAX_OVERLAY])
def test_derived_index_equals_a_fresh_one_after_every_random_change(monkeypatch, overlay):
    monkeypatch.setattr(capacity, "MAX_OVERLAY", overlay)      # the id map copied whole often, or seldom
    rng = random.Random(SEED)
    usable = {g: (16000 if g % 2 else None) for g in range(GPUS)}
    now, rs = 1_800_000_000, []
    for step in range(1500):
        _mutate(rng, rs, step, now)
        if rng.random() < 0.3:
            now += rng.choice([0, Q, 7, 4000, -Q])     # on, a little, past REBUILD_AFTER, back
        ignore = rng.choice(rs).id if rs and rng.random() < 0.3 else None
        kept = index_holds(rs, now=now, capacity=CAP, usable=usable, ignore_id=ignore)
        fresh = index_holds(rs, now=now, capacity=CAP, usable=usable, ignore_id=ignore, keep=False)
        assert _view(kept) == _view(fresh), f"seed {SEED}, step {step}"
        for g in fresh:
            lo = now + rng.randrange(-20, 60) * Q
            for need, mem in ((1, None), (CAP, None), (1, 9000), (2, 100)):
                assert kept[g].bad_runs(need, mem, lo, lo + 30 * Q) == fresh[g].bad_runs(need, mem, lo, lo + 30 * Q), \
                    f"seed {SEED}, step {step}"


def test_a_list_changed_in_place_after_the_call_is_not_trusted():
    rng = random.Random(SEED)
    now = 1_800_000_000
    rs = [_res(rng, i, now) for i in range(50)]
    usable = {g: None for g in range(GPUS)}
    index_holds(rs, now=now, capacity=CAP, usable=usable)
    assert capacity._last.source is not rs             # its own copy
    rs[3] = rs[3].replace(cancelled_at=now)
    rs.append(_res(rng, 99, now))
    kept = index_holds(rs, now=now, capacity=CAP, usable=usable)
    assert _view(kept) == _view(index_holds(rs, now=now, capacity=CAP, usable=usable, keep=False)), f"seed {SEED}"


def test_other_gpus_or_memory_build_afresh():
    rng = random.Random(SEED)
    now = 1_800_000_000
    rs = [_res(rng, i, now) for i in range(40)]
    a = {g: None for g in range(GPUS)}
    b = {g: 8000 for g in range(GPUS)}
    index_holds(rs, now=now, capacity=CAP, usable=a)
    first = capacity._last
    got = index_holds(rs, now=now, capacity=CAP, usable=b)
    assert capacity._last is not first and capacity._last.key != first.key
    assert _view(got) == _view(index_holds(rs, now=now, capacity=CAP, usable=b, keep=False))
    assert HoldIndex.build(rs, now=now, capacity=CAP, usable=b).key == capacity._last.key


def test_placements_with_the_kept_index_are_those_without_it():
    rng = random.Random(SEED)
    policy = Policy(gpu_count=GPUS, max_shared_users=CAP, slot_minutes=Q // 60)
    now, rs = 1_800_000_000, []
    for step in range(300):
        _mutate(rng, rs, step, now)
        rs = [r for r in rs if r.gpus and max(r.gpus) < GPUS]
        req = Request(count=rng.randint(1, 2), duration=rng.randint(1, 12) * Q,
                      mode=rng.choice([SHARED, EXCLUSIVE]), share=1, queue=True,
                      start=now - now % Q + rng.randrange(0, 30) * Q,
                      ignore_id=rng.choice(rs).id if rs and rng.random() < 0.3 else None)

        def one(req=req, rs=rs):
            try:
                p = place(req, reservations=rs, blackouts=[], policy=policy, gpus=None, now=now)
                return p.start, p.gpus
            except Exception as e:           # noqa: BLE001  (the same refusal either way)
                return type(e).__name__, str(e)
        kept = one()
        capacity._last = None
        assert one() == kept, f"seed {SEED}, step {step}"
