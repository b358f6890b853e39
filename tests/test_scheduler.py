"""The scheduling rules of SPEC section 4, one table row per rule and per
refusal.  The clock is fixed: it is 2026-07-13 12:02 UTC, two minutes into
the 12:00 slice; times in messages are UTC because no zone is passed."""

from __future__ import annotations

import random
from datetime import timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bk.core.errors import Conflict, InvalidInput, PolicyRefused
from bk.core.models import EXCLUSIVE, SHARED, Blackout, GpuInfo, GpuProcess, Policy, Reservation
from bk.core.scheduler import (
    Placement,
    Request,
    check_invariants,
    effective_mem,
    place,
    recommend,
)

DAY0 = 1_783_900_800                 # 2026-07-13 00:00 UTC
NOW = DAY0 + 12 * 3600 + 120         # 12:02
H = 3600


def at(hhmm: str, day: int = 0) -> int:
    """2026-07-13 (plus ``day`` days) at ``hhmm`` UTC."""
    h, m = map(int, hhmm.split(":"))
    return DAY0 + day * 86400 + h * 3600 + m * 60


_ids = iter(range(10**6))


def res(user, gpus, start, end, mode=SHARED, share=1, mem=None, rid=None, cancelled=False):
    return Reservation(id=rid or f"r{next(_ids)}", uid=1000, user=user, mode=mode, gpus=tuple(gpus),
                       share=share, start=at(start), end=at(end), created=NOW - H, mem_mib=mem,
                       cancelled_at=NOW - 60 if cancelled else None)


def idle(g, mem=None):
    return GpuInfo(g, f"GPU-{g}", "sim", mem_total_mib=mem, util=0, processes=[])


def busy(g):
    return GpuInfo(g, f"GPU-{g}", "sim", util=90, processes=[GpuProcess(4242)])


def unknown(g, mem=None):
    return GpuInfo(g, f"GPU-{g}", "sim", mem_total_mib=mem)


def run(req, ledger=(), blackouts=(), gpus=None, load=None, now=NOW, **policy):
    pol = Policy(**{"gpu_count": 4, **policy})
    return place(req, reservations=list(ledger), blackouts=list(blackouts), policy=pol,
                 gpus=gpus, now=now, load=load)


def one(**kw):
    return Request(count=kw.pop("count", 1), duration=kw.pop("duration", H), **kw)


def mem16(n=1):
    return [idle(g, 16384) for g in range(n)]   # usable 15872 MiB after the 512 MiB reserve


# (id, request, ledger, blackouts, gpus, load, policy, start, gpus chosen, queued)
PLACEMENTS = [
    ("empty ledger: now's slice counts", one(), [], [], None, None, {}, "12:00", (0,), False),
    ("one free slot is enough", one(pinned=(0,)), [res("alice", [0], "12:00", "14:00")],
     [], None, None, {}, "12:00", (0,), False),
    ("full GPU: queued to its holder's end", one(pinned=(0,)),
     [res("alice", [0], "12:00", "13:00", share=2)], [], None, None, {}, "13:00", (0,), True),
    ("--share 2 needs both slots", one(share=2), [res("alice", [0, 1, 2], "12:00", "13:00")],
     [], None, None, {}, "12:00", (3,), False),
    ("--share 2 waits for a half-used GPU", one(share=2), [res("alice", [0], "12:00", "13:00")],
     [], None, None, {"gpu_count": 1}, "13:00", (0,), True),
    ("exclusive waits for a shared booking", one(mode=EXCLUSIVE), [res("alice", [0], "12:00", "12:30")],
     [], None, None, {"gpu_count": 1}, "12:30", (0,), True),
    ("shared avoids an exclusive booking", one(), [res("bob", [0], "12:00", "14:00", mode=EXCLUSIVE)],
     [], None, None, {"gpu_count": 2}, "12:00", (1,), False),
    ("slots per sub-interval: back-to-back bookings leave room",
     one(), [res("alice", [0], "12:00", "12:30"), res("bob", [0], "12:30", "13:00")],
     [], None, None, {"gpu_count": 1}, "12:00", (0,), False),
    ("slots per sub-interval: one full quarter hour blocks",
     one(), [res("alice", [0], "12:00", "12:30"), res("bob", [0], "12:15", "12:45")],
     [], None, None, {"gpu_count": 1}, "12:30", (0,), True),
    ("VRAM: explicit memory that just fits", one(mem_mib=3872),
     [res("alice", [0], "12:00", "13:00", mem=12000)], [], mem16(), None, {"gpu_count": 1},
     "12:00", (0,), False),
    ("VRAM: one MiB more queues", one(mem_mib=3873),
     [res("alice", [0], "12:00", "13:00", mem=12000)], [], mem16(), None, {"gpu_count": 1},
     "13:00", (0,), True),
    ("VRAM: default is usable * share / capacity", one(),
     [res("alice", [0], "12:00", "13:00", mem=12000)], [], mem16(), None, {"gpu_count": 1},
     "13:00", (0,), True),
    ("VRAM: without telemetry slots alone decide", one(mem_mib=9000),
     [res("alice", [0], "12:00", "13:00", mem=12000)], [], [unknown(0)], None, {"gpu_count": 1},
     "12:00", (0,), False),
    ("VRAM: reserve is configurable", one(mem_mib=4000),
     [res("alice", [0], "12:00", "13:00", mem=12000)], [], mem16(), None,
     {"gpu_count": 1, "shared_memory_reserve_mb": 0}, "12:00", (0,), False),
    ("cancelled bookings hold nothing", one(share=2),
     [res("alice", [0], "12:00", "13:00", share=2, cancelled=True)], [], None, None, {"gpu_count": 1},
     "12:00", (0,), False),
    ("an edited booking does not block itself", one(share=2, pinned=(0,), ignore_id="edit-me"),
     [res("alice", [0], "12:00", "13:00", share=2, rid="edit-me")], [], None, None, {},
     "12:00", (0,), False),
    ("blackout: queued past it", one(), [], [Blackout("b1", at("12:00"), at("13:00"), "upgrade")],
     None, None, {}, "13:00", (0,), True),
    ("blackout ending mid-slice: the next slice", one(), [],
     [Blackout("b1", at("12:00"), at("13:02"), "upgrade")], None, None, {}, "13:05", (0,), True),
    ("blackout ahead: the window may end where it starts", one(duration=1800), [],
     [Blackout("b1", at("12:30"), at("13:00"), "upgrade")], None, None, {}, "12:00", (0,), False),
    ("blackout ahead: a longer window goes after it", one(), [],
     [Blackout("b1", at("12:30"), at("13:00"), "upgrade")], None, None, {}, "13:00", (0,), True),
    ("priority: lower value first", one(), [], [], None, None, {"gpu_priority": ((0, 1), (1, 1))},
     "12:00", (2,), False),
    ("live state: idle first", one(), [], [], [busy(0), unknown(1), idle(2)], None, {"gpu_count": 3},
     "12:00", (2,), False),
    ("live state: unknown before busy", one(count=2), [], [], [busy(0), unknown(1), idle(2)], None,
     {"gpu_count": 3}, "12:00", (1, 2), False),
    ("live state: a GPU missing from the snapshot is unknown", one(), [], [], [busy(0)], None,
     {"gpu_count": 2}, "12:00", (1,), False),
    ("priority outranks live state", one(), [], [], [busy(0), unknown(1), idle(2)], None,
     {"gpu_count": 3, "gpu_priority": ((2, 1),)}, "12:00", (1,), False),
    ("lower recent load", one(), [], [], None, {0: 0.9, 1: 0.2}, {"gpu_count": 2}, "12:00", (1,), False),
    ("lower booking pressure", one(), [res("alice", [0], "12:00", "13:00")], [], None, None,
     {"gpu_count": 2}, "12:00", (1,), False),
    ("pressure counts only the window", one(), [res("alice", [0], "13:00", "15:00"),
                                                res("bob", [1], "12:00", "12:30")],
     [], None, None, {"gpu_count": 2}, "12:00", (0,), False),
    ("index breaks ties", one(count=2), [], [], None, None, {}, "12:00", (0, 1), False),
    ("pinned GPUs: all or nothing", one(count=2, pinned=(1, 2)),
     [res("alice", [2], "12:00", "13:00", share=2)], [], None, None, {}, "13:00", (1, 2), True),
    ("excluded GPUs are skipped", one(excluded=(0,)), [], [], None, None, {}, "12:00", (1,), False),
    ("disabled GPUs are skipped", one(), [], [], None, None, {"disabled_gpus": frozenset({0})},
     "12:00", (1,), False),
    ("explicit start that fits", one(start=at("14:00")), [], [], None, None, {}, "14:00", (0,), False),
    ("explicit start with --queue", one(start=at("14:00"), queue=True),
     [res("alice", [0], "14:00", "15:00", share=2)], [], None, None, {"gpu_count": 1},
     "15:00", (0,), True),
    ("candidate starts are the ends of bookings", one(count=2),
     [res("alice", [0], "12:00", "13:00", share=2), res("bob", [1], "12:00", "14:00", share=2),
      res("carol", [2], "12:00", "12:30", share=2)], [], None, None, {"gpu_count": 3},
     "13:00", (0, 2), True),
    ("the search reaches exactly queue_search_hours", one(),
     [res("alice", [0], "12:00", "14:00", share=2)], [], None, None,
     {"gpu_count": 1, "queue_search_hours": 2}, "14:00", (0,), True),
    ("horizon: a booking may end right at it", one(start=at("11:00", day=1)), [], [], None, None,
     {"booking_horizon_days": 1}, at("11:00", day=1), (0,), False),
    ("exclusive across several GPUs waits for the last", one(count=2, mode=EXCLUSIVE),
     [res("alice", [0], "12:00", "12:10"), res("bob", [1], "12:00", "12:20")], [], None, None,
     {"gpu_count": 2}, "12:20", (0, 1), True),
]


@pytest.mark.parametrize("req,ledger,blackouts,gpus,load,policy,start,chosen,queued",
                         [pytest.param(*row[1:], id=row[0]) for row in PLACEMENTS])
def test_placement(req, ledger, blackouts, gpus, load, policy, start, chosen, queued):
    p = run(req, ledger, blackouts, gpus, load, **policy)
    want = at(start) if isinstance(start, str) else start
    assert (p.start, p.gpus, p.queued) == (want, chosen, queued)
    assert p.end == p.start + req.duration
    assert set(p.reasons) == set(range(policy.get("gpu_count", 4)))


# (id, request, ledger, blackouts, gpus, policy, error, rule, phrases in the message or hint)
REFUSALS = [
    ("count below one", one(count=0), [], [], None, {}, InvalidInput, "input", ["GPU count"]),
    ("duration not whole slices", one(duration=7 * 60), [], [], None, {}, InvalidInput, "input",
     ["5-minute slices"]),
    ("share above capacity", one(share=3), [], [], None, {}, InvalidInput, "input",
     ["--share must be 1 to 2 (max_shared_users)"]),
    ("unknown mode", one(mode="both"), [], [], None, {}, InvalidInput, "input", ["unknown mode"]),
    ("memory not positive", one(mem_mib=0), [], [], None, {}, InvalidInput, "input", ["memory"]),
    ("start off the slice grid", one(start=at("12:07")), [], [], None, {}, InvalidInput, "input",
     ["5-minute boundary", "2026-07-13T12:05:00Z", "2026-07-13T12:10:00Z"]),
    ("start in the past", one(start=at("11:55")), [], [], None, {}, InvalidInput, "input",
     ["past", "2026-07-13T12:00:00Z"]),
    ("pinned GPU that does not exist", one(pinned=(7,)), [], [], None, {}, InvalidInput, "input",
     ["no GPU 7", "GPUs 0 to 3"]),
    ("pinned count differs", one(count=2, pinned=(0,)), [], [], None, {}, InvalidInput, "input",
     ["-g must name 2 different GPUs"]),
    ("pinned and excluded", one(pinned=(1,), excluded=(1,)), [], [], None, {}, InvalidInput, "input",
     ["both pinned (-g) and excluded (-e)"]),
    ("maximum length", one(duration=721 * H), [], [], None, {}, PolicyRefused, "max_length",
     ["at most 720 h (max_booking_hours)", "30d1h"]),
    ("memory required by policy", one(), [], [], None, {"require_shared_memory": True}, PolicyRefused,
     "require_shared_memory", ["require_shared_memory", "-m"]),
    ("horizon: must end within it", one(start=at("11:00", day=30), duration=2 * H), [], [], None, {},
     PolicyRefused, "horizon", ["within 30 days", "booking_horizon_days"]),
    ("horizon: queueing cannot help", one(duration=25 * H), [], [], None, {"booking_horizon_days": 1},
     PolicyRefused, "horizon", ["within 1 day of now"]),
    ("more GPUs than the server has", one(count=5), [], [], None, {}, Conflict, "gpu_count",
     ["this server has 4"]),
    ("pinning a disabled GPU", one(pinned=(1,)), [], [], None, {"disabled_gpus": frozenset({1})},
     PolicyRefused, "disabled_gpu", ["GPU 1 disabled by policy"]),
    ("disabled GPUs leave too few", one(count=4), [], [], None, {"disabled_gpus": frozenset({1})},
     PolicyRefused, "disabled_gpu", ["4 GPUs asked but only 3 can be booked", "GPU 1 disabled by policy"]),
    ("excluded GPUs leave too few", one(count=4, excluded=(0,)), [], [], None, {}, Conflict, "excluded",
     ["GPU 0 excluded (-e)"]),
    ("memory larger than any GPU", one(mem_mib=20000), [], [], mem16(4), {}, Conflict, "memory",
     ["20000 MiB asked, 15872 MiB usable (16384 MiB total - 512 MiB reserve)"]),
    ("exclusive memory larger than the GPU", one(mem_mib=20000, mode=EXCLUSIVE, pinned=(0,)), [], [],
     mem16(4), {}, Conflict, "memory", ["GPU 0 memory: 20000 MiB asked, the GPU has 16384 MiB"]),
    ("exact start in a blackout", one(start=at("14:30")), [],
     [Blackout("b1", at("14:00"), at("15:00"), "kernel upgrade")], None, {}, PolicyRefused, "blackout",
     ["maintenance window 14:00–15:00: kernel upgrade", "15:00"]),
    ("exact start: slots held", one(start=at("14:00"), pinned=(0,)),
     [res("alice", [0], "14:00", "15:00"), res("bob", [0], "13:00", "15:30")], [], None, {},
     Conflict, "capacity", ["14:00–15:00", "GPU 0 busy: 2/2 slots held by bob, alice until 15:00", "--queue"]),
    ("exact start: exclusive holder", one(start=at("14:00"), pinned=(0,)),
     [res("bob", [0], "14:00", "15:00", mode=EXCLUSIVE)], [], None, {}, Conflict, "capacity",
     ["GPU 0 busy: exclusive booking by bob until 15:00"]),
    ("exact start: busy later in the window", one(start=at("14:00"), pinned=(0,)),
     [res("alice", [0], "14:30", "15:30", share=2)], [], None, {}, Conflict, "capacity",
     ["GPU 0 busy from 14:30: 2/2 slots held by alice until 15:30"]),
    ("exact start: 'until' follows back-to-back holders", one(start=at("14:00"), pinned=(0,)),
     [res("alice", [0], "14:00", "15:00", share=2), res("bob", [0], "15:00", "16:00", share=2)], [], None, {},
     Conflict, "capacity", ["2/2 slots held by alice until 16:00"]),
    ("exact start: too few GPUs free", one(count=2, start=at("14:00")),
     [res("alice", [0, 1, 2], "14:00", "15:00", share=2)], [], None, {}, Conflict, "capacity",
     ["only 1 of 4 eligible GPUs free", "GPU 0 busy", "GPU 1 busy", "GPU 2 busy"]),
    ("exact start: memory short, slots free", one(start=at("14:00"), mem_mib=8000),
     [res("alice", [0], "14:00", "15:00", mem=12000)], [], mem16(), {"gpu_count": 1}, Conflict, "memory",
     ["GPU 0 memory: 12000 of 15872 MiB booked by alice until 15:00; this booking needs 8000 MiB"]),
    ("exact start: memory short first, slots later", one(start=at("14:00"), mem_mib=8000),
     [res("alice", [0], "14:00", "14:30", mem=12000), res("bob", [0], "14:30", "15:00", share=2)], [],
     mem16(), {"gpu_count": 1}, Conflict, "capacity",
     ["GPU 0 memory: 12000 of 15872 MiB booked by alice until 15:00"]),
    ("nothing within queue_search_hours", one(), [res("alice", [0], "12:00", "15:00", share=2)], [], None,
     {"gpu_count": 1, "queue_search_hours": 2}, Conflict, "capacity",
     ["no start from 12:00 up to 14:00", "2 h (queue_search_hours)"]),
    ("nothing before the horizon", one(), [res("alice", [0], "12:00", "13:00", share=2, rid="x")], [],
     None, {"gpu_count": 1, "booking_horizon_days": 1, "queue_search_hours": 0}, Conflict, "capacity",
     ["0 h (queue_search_hours)"]),
    ("the search names blackouts in its way", one(), [],
     [Blackout("b1", at("12:00"), at("15:00"), "move")], None, {"queue_search_hours": 2}, Conflict,
     "capacity", ["blackout 2026-07-13T12:00:00Z to 2026-07-13T15:00:00Z: move"]),
]


@pytest.mark.parametrize("req,ledger,blackouts,gpus,policy,error,rule,phrases",
                         [pytest.param(*row[1:], id=row[0]) for row in REFUSALS])
def test_refusal(req, ledger, blackouts, gpus, policy, error, rule, phrases):
    with pytest.raises(error) as info:
        run(req, ledger, blackouts, gpus, **policy)
    e = info.value
    assert type(e) is error
    assert e.details["rule"] == rule
    text = e.message + " | " + (e.hint or "")
    for phrase in phrases:
        assert phrase in text


def test_search_limited_by_the_horizon_says_so():
    ledger = [res("alice", [0], "12:00", "12:00", share=2)]
    ledger[0] = ledger[0].replace(end=NOW + 86400)
    with pytest.raises(Conflict) as info:
        run(one(), ledger, gpu_count=1, booking_horizon_days=1)
    assert info.value.details["limit"] == "horizon"
    assert "the 1-day booking horizon" in info.value.message


def test_exact_conflict_names_every_holder():
    ledger = [res("alice", [0], "14:00", "15:00", rid="a1"), res("bob", [0], "14:00", "16:00", rid="b1")]
    with pytest.raises(Conflict) as info:
        run(one(start=at("14:00"), pinned=(0,)), ledger)
    d = info.value.details
    assert (d["start"], d["end"]) == ("2026-07-13T14:00:00Z", "2026-07-13T15:00:00Z")
    assert {(h["gpu"], h["id"], h["user"]) for h in d["holders"]} == {(0, "a1", "alice"), (0, "b1", "bob")}
    assert d["gpus"] == {"0": "busy: 2/2 slots held by alice, bob until 15:00"}


def test_messages_use_the_given_zone_and_say_the_day():
    ledger = [res("alice", [0], "14:00", "12:00", share=2)]
    ledger[0] = ledger[0].replace(end=at("09:00", day=1))
    pol = Policy(gpu_count=1)
    with pytest.raises(Conflict) as info:
        place(one(start=at("14:00")), reservations=ledger, blackouts=[], policy=pol, gpus=None, now=NOW,
              tz=timezone(timedelta(hours=2)))
    assert "16:00–17:00" in info.value.message
    assert "until 07-14 11:00" in info.value.message


def test_reasons_explain_every_gpu():
    ledger = [res("alice", [1], "12:00", "13:00", share=2)]
    p = run(one(), ledger, gpus=[idle(0), idle(1), busy(2), idle(3)], disabled_gpus=frozenset({3}),
            gpu_priority=((0, 1),))
    assert p.gpus == (2,)
    assert p.reasons[0] == "free, not needed: priority 1, idle, load 0.00, 0 slot-min booked in the window"
    assert p.reasons[1] == "busy: 2/2 slots held by alice until 13:00"
    assert p.reasons[2] == "chosen: priority 0, busy, load 0.00, 0 slot-min booked in the window"
    assert p.reasons[3] == "disabled by policy"


def test_reasons_for_pinned_and_excluded():
    p = run(one(pinned=(1,), excluded=(0,)), [])
    assert p.reasons[0] == "not among the pinned GPUs (-g)"
    assert p.reasons[1].startswith("chosen")
    p = run(one(excluded=(0,)), [])
    assert p.reasons[0] == "excluded (-e)"


def test_effective_memory_of_the_placement():
    gpus = [idle(0, 16384), idle(1, 24576)]
    assert run(one(count=2), [], gpus=gpus, gpu_count=2).mem_mib_effective == 7936
    assert run(one(count=2, mem_mib=5000), [], gpus=gpus, gpu_count=2).mem_mib_effective == 5000
    assert run(one(), [], gpus=None).mem_mib_effective is None
    assert run(one(mode=EXCLUSIVE, count=2), [], gpus=gpus, gpu_count=2).mem_mib_effective == 16384


@pytest.mark.parametrize("mode,share,mem,total,want", [
    (SHARED, 1, None, 16384, 7936),
    (SHARED, 2, None, 16384, 15872),
    (SHARED, 1, 3000, 16384, 3000),
    (SHARED, 1, 3000, None, 3000),
    (SHARED, 1, None, None, None),
    (SHARED, 1, None, 256, 0),
    (EXCLUSIVE, 1, None, 16384, 16384),
    (EXCLUSIVE, 1, 4000, None, 4000),
])
def test_effective_mem(mode, share, mem, total, want):
    assert effective_mem(Request(1, H, mode=mode, share=share, mem_mib=mem), Policy(gpu_count=1), total) == want
    r = Reservation("x", 1, "u", mode, (0,), share, NOW, NOW + H, NOW, mem_mib=mem)
    assert effective_mem(r, Policy(gpu_count=1), total) == want


def test_edit_of_a_running_booking_keeps_its_start():
    mine = res("alice", [0], "11:00", "13:00", share=2, rid="mine")
    theirs = res("bob", [0], "14:00", "15:00", share=2)
    req = one(start=at("11:00"), duration=3 * H, pinned=(0,), share=2, ignore_id="mine")
    with pytest.raises(InvalidInput):
        run(req, [mine, theirs], gpu_count=1)
    pol = Policy(gpu_count=1)
    p = place(req, reservations=[mine, theirs], blackouts=[], policy=pol, gpus=None, now=NOW,
              allow_past_start=True)
    assert (p.start, p.end, p.queued) == (at("11:00"), at("14:00"), False)
    with pytest.raises(Conflict):
        place(one(start=at("11:00"), duration=4 * H, pinned=(0,), share=2, ignore_id="mine"),
              reservations=[mine, theirs], blackouts=[], policy=pol, gpus=None, now=NOW, allow_past_start=True)


# -- determinism ---------------------------------------------------------------

def busy_world(seed: int):
    rng = random.Random(seed)
    ledger = []
    for i in range(40):
        s = NOW - NOW % 300 + rng.randrange(0, 48) * 300
        ledger.append(Reservation(f"d{i}", 1000, f"user{i % 4}", rng.choice((SHARED, SHARED, EXCLUSIVE)),
                                  tuple(sorted(rng.sample(range(6), rng.randint(1, 3)))), rng.randint(1, 2),
                                  s, s + rng.randint(1, 12) * 300, NOW))
    return ledger


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_placement_is_deterministic(seed):
    ledger = busy_world(seed)
    req = one(count=2)
    pol = Policy(gpu_count=6)
    first = place(req, reservations=ledger, blackouts=[], policy=pol, gpus=None, now=NOW)
    shuffled = ledger[:]
    random.Random(seed).shuffle(shuffled)
    for ledger_order in (ledger, shuffled, list(reversed(ledger))):
        again = place(req, reservations=ledger_order, blackouts=[], policy=pol, gpus=None, now=NOW)
        assert again == first, f"seed {seed}"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_refusals_are_deterministic(seed):
    ledger = busy_world(seed)
    pol = Policy(gpu_count=6)
    req = one(count=6, start=NOW - NOW % 300 + 1800)
    seen = set()
    for order in (ledger, list(reversed(ledger)), random.Random(seed).sample(ledger, len(ledger))):
        with pytest.raises(Conflict) as info:
            place(req, reservations=order, blackouts=[], policy=pol, gpus=None, now=NOW)
        seen.add((info.value.message, repr(info.value.details)))
    assert len(seen) == 1, f"seed {seed}"


# -- recommend ------------------------------------------------------------------

def test_recommend_offers_other_gpus_then_later_starts():
    pol = Policy(gpu_count=4)
    opts = recommend(one(count=2), reservations=[], blackouts=[], policy=pol, gpus=None, now=NOW)
    assert [(o.start, o.gpus) for o in opts] == [(at("12:00"), (0, 1)), (at("12:00"), (2, 3)),
                                                 (at("13:00"), (0, 1))]
    assert [o.queued for o in opts] == [False, False, True]


def test_recommend_jumps_to_where_the_free_set_changes():
    pol = Policy(gpu_count=2)
    ledger = [res("alice", [1], "12:00", "12:30", share=2)]
    opts = recommend(one(duration=4 * H), reservations=ledger, blackouts=[], policy=pol, gpus=None,
                     now=NOW, alternatives=2)
    assert [(o.start, o.gpus) for o in opts] == [(at("12:00"), (0,)), (at("12:30"), (1,))]


def test_recommend_refuses_like_place():
    pol = Policy(gpu_count=1, queue_search_hours=1)
    ledger = [res("alice", [0], "12:00", "15:00", share=2)]
    with pytest.raises(Conflict):
        recommend(one(), reservations=ledger, blackouts=[], policy=pol, gpus=None, now=NOW)


# -- invariants -----------------------------------------------------------------

def test_invariants_hold_for_a_valid_ledger():
    pol = Policy(gpu_count=2)
    ledger = [res("alice", [0], "12:00", "13:00"), res("bob", [0], "12:00", "13:00"),
              res("carol", [1], "12:00", "13:00", mode=EXCLUSIVE),
              res("dan", [1], "13:00", "14:00", mode=EXCLUSIVE)]
    assert check_invariants(ledger, [], pol, {0: 16384, 1: None}) == []


@pytest.mark.parametrize("ledger,blackouts,phrase", [
    ([res("a", [0], "12:00", "13:00", share=2), res("b", [0], "12:30", "12:35", rid="b1")], [],
     "GPU 0 over capacity 2026-07-13T12:30:00Z to 2026-07-13T12:35:00Z: 3/2 slots"),
    ([res("a", [0], "12:00", "13:00", mode=EXCLUSIVE), res("b", [0], "12:55", "13:30")], [],
     "GPU 0 over capacity 2026-07-13T12:55:00Z to 2026-07-13T13:00:00Z: 3/2 slots"),
    ([res("a", [0], "12:00", "13:00", mem=10000), res("b", [0], "12:00", "13:00", mem=6000)], [],
     "16000/15872 MiB"),
    ([res("a", [0], "12:00", "13:00")], [Blackout("bk", at("12:55"), at("14:00"), "x")],
     "overlaps blackout bk"),
    ([res("a", [0], "12:00", "12:00")], [], "ends at or before its start"),
    ([res("a", [0], "12:01", "13:00")], [], "not aligned"),
    ([res("a", [0], "12:00", "13:00", share=3)], [], "share 3 outside 1..2"),
    ([res("a", [5], "12:00", "13:00")], [], "bad GPU list [5]"),
    ([res("a", [0], "12:00", "13:00", rid="same"), res("b", [1], "12:00", "13:00", rid="same")], [],
     "same: duplicate id"),
])
def test_invariant_violations_are_named(ledger, blackouts, phrase):
    problems = check_invariants(ledger, blackouts, Policy(gpu_count=2), {0: 16384})
    assert any(phrase in p for p in problems), problems


def test_invariants_ignore_cancelled_bookings():
    ledger = [res("a", [0], "12:00", "13:00", share=2), res("b", [0], "12:00", "13:00", cancelled=True)]
    assert check_invariants(ledger, [], Policy(gpu_count=1), {}) == []


# -- property: booking whatever place() returns never breaks the rules ----------

request_st = st.builds(
    lambda count, slices, exclusive, share, mem, offset, queue: Request(
        count=count, duration=slices * 300, mode=EXCLUSIVE if exclusive else SHARED, share=share,
        mem_mib=mem, start=None if offset is None else NOW - NOW % 300 + offset * 300, queue=queue),
    st.integers(1, 3), st.integers(1, 24), st.booleans(), st.integers(1, 2),
    st.sampled_from([None, None, 3000, 7000, 12000]), st.one_of(st.none(), st.integers(0, 36)),
    st.booleans())


@pytest.mark.slow
@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(request_st, min_size=1, max_size=25),
       st.lists(st.tuples(st.integers(0, 40), st.integers(1, 6), st.integers(0, 299)), max_size=2))
def test_booking_placements_keeps_every_invariant(requests, dark):
    pol = Policy(gpu_count=3, queue_search_hours=4)
    gpus = [idle(0, 16384), unknown(1), idle(2, 24576)]
    here = NOW - NOW % 300
    blackouts = [Blackout(f"b{i}", here + a * 300 + j, here + (a + n) * 300 + j, "x")
                 for i, (a, n, j) in enumerate(dark)]
    ledger: list[Reservation] = []
    for i, req in enumerate(requests):
        try:
            p: Placement = place(req, reservations=ledger, blackouts=blackouts, policy=pol, gpus=gpus, now=NOW)
        except (Conflict, PolicyRefused):
            continue
        if req.start is not None and not req.queue:
            assert p.start == req.start
        ledger.append(Reservation(f"p{i}", 1000, f"user{i}", req.mode, p.gpus, req.share, p.start, p.end,
                                  NOW, mem_mib=req.mem_mib))
        problems = check_invariants(ledger, blackouts, pol, {0: 16384, 2: 24576})
        assert problems == [], problems
