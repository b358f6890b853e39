"""Limits, advances and fair share against brute force, on random worlds and histories.

Three properties, each on seeded random cases (a failure prints the seed and
the command that replays it; ``BK_TEST_SEED`` moves the base seed,
``BK_TEST_CASES`` the cases per chunk):

* every booking with limits (``bk.core.limits.place_booking``) gets the
  outcome of the slice scanner plus a slice-by-slice reading of the limits
  (``tests/reference_scheduler.reference_book``): the same start and GPUs,
  or the same rule refusing; and every change a limit refusal suggests
  (``details.fits``) passes that rule by brute force, the longest length
  one slice longer does not;
* every advance plan (``bk.core.advance.plan``) equals its brute-force
  twin (``reference_advance``) on worlds with advancing bookings, limits
  and fair share;
* in 10,000 random histories (arrivals, cancellations, early releases,
  edits, time passing), after every event and its advance (tried, as the
  service does, only where the event made room): the capacity invariants
  hold, no advancing booking starts later than the latest start it was
  guaranteed, no booking that does not advance changed, trying every
  advancing booking again moves none (and, every tenth history, each
  advance equals the brute force that tries them all).
"""

from __future__ import annotations

import os
import random
from datetime import timezone

import pytest

from bk.core import advance, fairshare
from bk.core import limits as L
from bk.core.capacity import check_invariants
from bk.core.errors import BkError, PolicyRefused
from bk.core.models import EXCLUSIVE, SHARED, Advance, GpuInfo, Policy, Reservation, parse_iso
from bk.core.scheduler import Request
from tests.reference_scheduler import (
    RULE_NAMES,
    SCALE,
    ref_breaks,
    reference_advance,
    reference_book,
)
from tests.test_scheduler_diff import EPOCH, random_world

BASE_SEED = int(os.environ.get("BK_TEST_SEED", "20261201"))
CHUNKS = 10
PER_CHUNK = int(os.environ.get("BK_TEST_CASES", "1000"))
UTC = timezone.utc


def replay(test: str, seed: int) -> str:
    return (f"seed {seed}; replay with: BK_TEST_SEED={seed} BK_TEST_CASES=1 python3 -m pytest "
            f"'tests/test_fair_oracle.py::{test}[0]'")


def random_bounds(rng: random.Random, q: int) -> dict:
    """A few limits, tight enough to refuse often."""
    out = {}
    if rng.random() < 0.5:
        out["gpus"] = rng.randint(1, 3)
    if rng.random() < 0.5:
        out["gpu_hours"] = rng.choice((0.5, 1, 2, 4, 8)) * q / 300
    if rng.random() < 0.3:
        out["booking_hours"] = rng.choice((1, 2, 4)) * q / 3600 * rng.randint(1, 4)
    if rng.random() < 0.3:
        out["ahead_hours"] = rng.choice((1, 2, 6)) * q / 3600 * rng.randint(1, 6)
    if rng.random() < 0.3:
        out["shared_vram_gib"] = rng.choice((2, 6, 10, 16))
    return out


def as_bounds(d: dict, user: str = "alice") -> L.Bounds:
    return L.Bounds(user, {k: L.Bound(k, v, "*", "everyone") for k, v in d.items()})


# ------------------------------------------------------------ bookings with limits

def booking_case(seed: int):
    rng = random.Random(seed)
    w = random_world(rng)
    q = w["policy"].slot_seconds
    bounds = random_bounds(rng, q)
    uid = rng.choice((1000, 1001, 1002))
    want = reference_book(w["req"], bounds, uid, w["reservations"], w["blackouts"], w["policy"], w["gpus"],
                          w["now"], w["load"])
    try:
        p = L.place_booking(w["req"], as_bounds(bounds), uid, reservations=w["reservations"],
                            blackouts=w["blackouts"], policy=w["policy"], gpus=w["gpus"], now=w["now"],
                            load=w["load"], tz=UTC)
        got, err = ("ok", p.start, p.gpus), None
    except BkError as e:
        got, err = ("error", type(e).__name__, e.details.get("rule")), e
    assert got == want, f"{replay('test_limit_refusals_agree_with_brute_force', seed)}\n{got} != {want}\n{w}\n{bounds}"
    if err is not None and isinstance(err, PolicyRefused) and err.details["rule"].startswith("limit_"):
        check_suggestions(err, w, bounds, uid, seed)
    return got


def check_suggestions(err, w, bounds, uid, seed) -> None:
    """Each change in ``fits`` passes the rule, measured by brute force."""
    d = err.details
    name = d["limit"]
    q, now, req = w["policy"].slot_seconds, w["now"], w["req"]
    held = [(r.start, r.end, tuple(r.gpus), None) for r in w["reservations"]
            if r.uid == uid and r.cancelled_at is None and r.end > now and r.id != req.ignore_id]
    where = replay("test_limit_refusals_agree_with_brute_force", seed)
    fits = d["fits"]
    assert d["rule"] == RULE_NAMES[name] and d["value"] == bounds[name]
    if name in ("booking_hours", "gpu_hours") and "duration" in fits:
        start = req.start if req.start is not None else now
        n = req.count
        new = (start, start + fits["duration"], tuple(range(n)), None)
        assert not ref_breaks(name, bounds[name], new, held, now, q), where
        if name == "booking_hours":
            longer = (start, start + fits["duration"] + q, tuple(range(n)), None)
            assert ref_breaks(name, bounds[name], longer, held, now, q), where + ": not the longest"
    if name == "gpu_hours" and "count" in fits:
        start = req.start if req.start is not None else now
        new = (start, start + req.duration, tuple(range(fits["count"])), None)
        assert not ref_breaks(name, bounds[name], new, held, now, q), where
    if name == "gpu_hours" and "book_from" in fits:
        t = parse_iso(fits["book_from"])
        new = (t, t + req.duration, tuple(range(req.count)), None)
        assert not ref_breaks(name, bounds[name], new, held, t, q), where
        if t - 60 > now:
            early = (t - 60, t - 60 + req.duration, tuple(range(req.count)), None)
            assert ref_breaks(name, bounds[name], early, held, t - 60, q), where + ": not the earliest"
    if name == "shared_vram_gib":
        assert fits["mem_mib"] == bounds[name] * SCALE[name]
    if name == "ahead_hours":
        if "latest_start" in fits:
            s = parse_iso(fits["latest_start"])
            assert s - now <= bounds[name] * 3600 < s + q - now, where
        t = parse_iso(fits["book_from"])
        start = now + d["ahead_s"]
        assert 0 <= start - t <= bounds[name] * 3600, where
    if name == "gpus":
        start, end = parse_iso(d["fits"]["start"]) if "start" in fits else None, None
        placed_gpus = None
        for key in ("count", "end", "start"):
            if key not in fits:
                continue
            # The placement is not in the error: rebuild it from the reference.
            out = reference_book(w["req"], {}, uid, w["reservations"], w["blackouts"], w["policy"],
                                 w["gpus"], now, w["load"])
            s0, placed_gpus = out[1], out[2]
            if key == "count":
                new = (s0, s0 + req.duration, placed_gpus[:fits["count"]], None)
            elif key == "end":
                end = parse_iso(fits["end"])
                new = (s0, end, placed_gpus, None)
            else:
                new = (start, start + req.duration, tuple(range(100, 100 + len(placed_gpus))), None)
            assert not ref_breaks(name, bounds[name], new, held, now, q), f"{where}: {key} {fits[key]}"


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_limit_refusals_agree_with_brute_force(chunk):
    first = BASE_SEED + chunk * PER_CHUNK
    for seed in range(first, first + PER_CHUNK):
        try:
            booking_case(seed)
        except AssertionError:
            raise
        except Exception as e:          # a crash in either: still name the seed
            raise AssertionError(f"{replay('test_limit_refusals_agree_with_brute_force', seed)}\n"
                                 f"{type(e).__name__}: {e}") from e


@pytest.mark.slow
def test_every_limit_refuses_somewhere():
    """The generator is only useful if each limit gets to refuse."""
    seen, want = set(), set(RULE_NAMES.values())
    for seed in range(BASE_SEED, BASE_SEED + 3000):
        out = booking_case(seed)
        if out[0] == "error":
            seen.add(out[2])
            if want <= seen:
                break
    assert set(RULE_NAMES.values()) <= seen, sorted(set(RULE_NAMES.values()) - seen)


# ------------------------------------------------------------ advances

def advancing_world(rng: random.Random) -> dict:
    """A small world where some bookings wait to move earlier and some
    capacity before them is free."""
    slot_minutes = rng.choice((5, 15, 60))
    q = slot_minutes * 60
    n = rng.randint(1, 3)
    cap = rng.randint(1, 2)
    policy = Policy(gpu_count=n, slot_minutes=slot_minutes, max_shared_users=cap,
                    booking_horizon_days=2, queue_search_hours=rng.choice((2, 48)) * q // 300)
    now = EPOCH + rng.randrange(0, 86400 // q) * q + rng.randrange(0, q)
    here = now - now % q
    gpus = [GpuInfo(g, f"GPU-{g}", "sim", mem_total_mib=rng.choice((None, 16384))) for g in range(n)]
    reservations = []
    for i in range(rng.randint(1, 10)):
        start = here + rng.randint(-3, 24) * q
        shared = rng.random() < 0.6
        uid = rng.choice((1000, 1001, 1002))
        r = Reservation(id=f"r{i:02d}", uid=uid, user=f"u{uid}", mode=SHARED if shared else EXCLUSIVE,
                        gpus=tuple(sorted(rng.sample(range(n), rng.randint(1, n)))),
                        share=rng.randint(1, cap) if shared else cap, start=start,
                        end=start + rng.randint(1, 8) * q, created=EPOCH + i,
                        mem_mib=rng.choice((None, None, 6000)) if shared else None)
        if start > here and rng.random() < 0.5:
            r = r.replace(advance=Advance(EPOCH + rng.randint(0, 50), here + rng.randint(-2, 6) * q,
                                          rng.random() < 0.2, tuple(g for g in range(n) if rng.random() < 0.1)))
        reservations.append(r)
    # Keep only a ledger that holds (what a real one is): drop what overfills.
    kept: list[Reservation] = []
    for r in reservations:
        if not check_invariants(kept + [r], (), policy, {g.index: g.mem_total_mib for g in gpus}):
            kept.append(r)
    usage = {u: rng.choice((0.0, 3600.0, 7200.0)) for u in (1000, 1001, 1002)} if rng.random() < 0.5 else None
    bounds = {u: random_bounds(rng, q) for u in (1000, 1001, 1002)} if rng.random() < 0.4 else None
    return dict(reservations=kept, policy=policy, gpus=gpus, now=now, usage=usage, bounds=bounds)


def fast_advance(w: dict) -> list[Reservation]:
    bounds = w["bounds"]
    moves = advance.plan(w["reservations"], (), w["policy"], w["gpus"], w["now"], usage=w["usage"],
                         bounds_of=(lambda r: as_bounds(bounds[r.uid], r.user)) if bounds else None)
    out = {r.id: r for r in w["reservations"]}
    for m in moves:
        assert m.before == out[m.after.id]
        assert m.after.start < m.before.start
        out[m.after.id] = m.after
    return list(out.values())


def advance_case(seed: int) -> int:
    w = advancing_world(random.Random(seed))
    got = fast_advance(w)
    want = reference_advance(w["reservations"], (), w["policy"], w["gpus"], w["now"], usage=w["usage"],
                             bounds_by_uid=w["bounds"])
    where = replay("test_advances_agree_with_brute_force", seed)
    assert [(r.id, r.start, r.gpus) for r in got] == [(r.id, r.start, r.gpus) for r in want], \
        f"{where}\n{w}"
    return sum(1 for a, b in zip(got, w["reservations"], strict=True) if a != b)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(4))
def test_advances_agree_with_brute_force(chunk):
    first = BASE_SEED + chunk * PER_CHUNK // 2
    for seed in range(first, first + PER_CHUNK // 2):
        advance_case(seed)


def test_advances_happen_in_the_generated_worlds():
    moved = sum(advance_case(seed) for seed in range(BASE_SEED, BASE_SEED + 200))
    assert moved > 20


# ------------------------------------------------------------ histories

class History:
    """One random history: a ledger that events change and advances follow."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.q = rng.choice((5, 15)) * 60
        n = rng.randint(1, 3)
        self.policy = Policy(gpu_count=n, slot_minutes=self.q // 60, max_shared_users=rng.randint(1, 2),
                             booking_horizon_days=2, queue_search_hours=48)
        self.gpus = [GpuInfo(g, f"GPU-{g}", "sim", mem_total_mib=rng.choice((None, 16384))) for g in range(n)]
        self.now = EPOCH + rng.randrange(0, 3600)
        self.res: list[Reservation] = []
        self.latest: dict[str, int] = {}            # advancing booking -> guaranteed latest start
        self.bounds = {u: random_bounds(rng, self.q) for u in (1000, 1001)} if rng.random() < 0.3 else None
        self.usage = {1000: rng.random() * 1e4, 1001: rng.random() * 1e4} if rng.random() < 0.5 else None
        self.n = 0
        self.moved = 0

    def mem(self):
        return {g.index: g.mem_total_mib for g in self.gpus}

    def book(self):
        rng, q = self.rng, self.q
        uid = rng.choice((1000, 1001))
        here = self.now - self.now % q
        start = None if rng.random() < 0.6 else here + rng.randint(0, 12) * q
        req = Request(count=rng.randint(1, self.policy.gpu_count), duration=rng.randint(1, 8) * q,
                      mode=SHARED if rng.random() < 0.7 else EXCLUSIVE, share=1, start=start,
                      queue=start is not None and rng.random() < 0.7)
        bounds = as_bounds(self.bounds[uid]) if self.bounds else None
        try:
            p = L.place_booking(req, bounds, uid, reservations=self.res, blackouts=(), policy=self.policy,
                                gpus=self.gpus, now=self.now, tz=UTC)
        except BkError:
            return
        self.n += 1
        wants = req.start if req.start is not None else here
        adv = None
        if p.start > wants and rng.random() < 0.7:
            adv = Advance(self.now, wants, False, ())
        r = Reservation(id=f"h{self.n:03d}", uid=uid, user=f"u{uid}", mode=req.mode, gpus=p.gpus,
                        share=self.policy.max_shared_users if req.mode == EXCLUSIVE else 1,
                        start=p.start, end=p.end, created=self.now, advance=adv)
        self.res.append(r)
        if adv is not None:
            self.latest[r.id] = r.start

    def live(self):
        return [r for r in self.res if r.cancelled_at is None and r.end > self.now]

    def cancel(self):
        live = self.live()
        if live:
            r = self.rng.choice(live)
            self.res[self.res.index(r)] = r.replace(cancelled_at=self.now)
            self.latest.pop(r.id, None)

    def release(self):
        """An early release: a running booking ends now (cancelled while active)."""
        running = [r for r in self.live() if r.start <= self.now]
        if running:
            r = self.rng.choice(running)
            self.res[self.res.index(r)] = r.replace(cancelled_at=self.now)

    def shorten(self):
        """The owner's edit: an end earlier (never taking anything new)."""
        live = [r for r in self.live() if r.end - max(r.start, self.now - self.now % self.q) > self.q]
        if live:
            r = self.rng.choice(live)
            self.res[self.res.index(r)] = r.replace(end=r.end - self.q)

    def tick(self):
        self.now += self.rng.choice((60, self.q, 2 * self.q))

    def step(self, seed: int) -> None:
        event = self.rng.choice((self.book, self.book, self.book, self.cancel, self.release, self.shorten,
                                 self.tick))
        earlier = list(self.res)
        event()
        before = {r.id: r for r in self.res}
        bounds = self.bounds
        # As the service runs it: only what the event made room for is tried.
        freed, changed = advance.freed_by(earlier, self.res, now=self.now)
        moves = advance.plan(self.res, (), self.policy, self.gpus, self.now, usage=self.usage,
                             bounds_of=(lambda r: as_bounds(bounds[r.uid])) if bounds else None,
                             freed=freed, changed=changed)
        where = f"{replay('test_random_histories_keep_their_promises', seed)}; event {event.__name__}"
        want = None
        if seed % 10 == 0:      # every tenth history: each plan against its brute-force twin, which tries all
            want = reference_advance(self.res, (), self.policy, self.gpus, self.now, usage=self.usage,
                                     bounds_by_uid=bounds)
        for m in moves:
            i = next(j for j, r in enumerate(self.res) if r.id == m.after.id)
            self.res[i] = m.after
        self.moved += len(moves)
        if want is not None:
            assert [(r.id, r.start, r.gpus) for r in want] == [(r.id, r.start, r.gpus) for r in self.res], where
        problems = check_invariants(self.res, (), self.policy, self.mem())
        assert not problems, f"{where}: {problems}"
        for r in self.res:
            old = before[r.id]
            if r.id not in self.latest or r.cancelled_at is not None:
                assert r == old, f"{where}: {r.id} does not advance but moved"
                continue
            assert r.start <= self.latest[r.id], f"{where}: {r.id} starts after its guaranteed latest start"
            assert r.end - r.start == old.end - old.start and r.start <= old.start, where
            self.latest[r.id] = r.start
        again = advance.plan(self.res, (), self.policy, self.gpus, self.now, usage=self.usage,
                             bounds_of=(lambda r: as_bounds(bounds[r.uid])) if bounds else None)
        assert not again, f"{where}: the advance did not settle: {again}"


# Eight events a history: the ledgers of longer ones grow, and each event
# costs more (16 events cost 3.5 times 8), while 10,000 short histories
# still reach every kind of contest (the count of moves below says so).
STEPS = 8


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_histories_keep_their_promises(chunk):
    first = BASE_SEED + chunk * PER_CHUNK
    moved = 0
    for seed in range(first, first + PER_CHUNK):
        h = History(random.Random(seed))
        for _ in range(STEPS):
            h.step(seed)
        moved += h.moved
    # Not vacuous: advances happen in these histories (about one in eight
    # moves a booking), so the promises above were put to the test.
    assert moved >= PER_CHUNK // 20, f"only {moved} advances in {PER_CHUNK} histories"


# ------------------------------------------------------------ fair share by hand

DAY, H = 86400, 3600


def test_decayed_usage_halves_every_half_life():
    now = EPOCH + 30 * DAY
    # uid 1000: 10 GPU-hours on the day that ended a week ago (its middle is
    # 7.5 days back): 10 * 2**(-7.5/7) = 4.76 GPU-hours today.  uid 1001:
    # 6 GPU-hours yesterday (middle 0.5 days back): 6 * 2**(-0.5/7) = 5.71.
    days = [(now - 8 * DAY, {1000: 10 * H}), (now - DAY, {1001: 6 * H})]
    got = fairshare.decayed(days, now, 7 * DAY)
    assert got[1000] / H == pytest.approx(4.758, abs=1e-3)
    assert got[1001] / H == pytest.approx(5.710, abs=1e-3)
    shares = fairshare.shares(got)
    assert shares[1000] == pytest.approx(4.758 / (4.758 + 5.710), abs=1e-3)
    assert sum(shares.values()) == pytest.approx(1)
    assert fairshare.shares({}) == {} and fairshare.shares({1: 0.0}) == {1: 0.0}


def test_today_counts_from_the_middle_of_what_has_passed():
    now = EPOCH + 6 * H                           # 06:00 of a UTC day
    got = fairshare.decayed([(EPOCH, {1000: 2 * H})], now, DAY)
    assert got[1000] == pytest.approx(2 * H * 2 ** (-3 * H / DAY))


def test_fair_share_orders_contested_advances_by_hand():
    """Two advancing bookings want the one GPU that is free now.  First come
    first served gives it to uid 1001, who asked first; fair share to uid
    1000, whose 10 GPU-hours a week ago decay to less than 1001's 6
    yesterday (4.76 against 5.71 GPU-hours, the test above)."""
    q = 300
    policy = Policy(gpu_count=1, slot_minutes=5, max_shared_users=1)
    now = EPOCH + 30 * DAY + 10 * H
    here = now - now % q

    def booking(rid, uid, start, since):
        return Reservation(rid, uid, f"u{uid}", SHARED, (0,), 1, start, start + H, EPOCH,
                           advance=Advance(since, here))

    ledger = [booking("a", 1000, here + 2 * H, EPOCH + 2), booking("b", 1001, here + 3 * H, EPOCH + 1)]
    fcfs = advance.plan(ledger, (), policy, [], now)
    assert sorted((m.after.id, m.after.start) for m in fcfs) == [("a", here + H), ("b", here)]
    usage = fairshare.decayed([(now - 8 * DAY, {1000: 10 * H}), (now - DAY, {1001: 6 * H})], now, 7 * DAY)
    fair = advance.plan(ledger, (), policy, [], now, usage=usage)
    assert sorted((m.after.id, m.after.start) for m in fair) == [("a", here), ("b", here + H)]
    assert advance.positions(ledger, now, q, usage) == {"a": 1, "b": 2}
    assert advance.positions(ledger, now, q) == {"b": 1, "a": 2}
    # Fair share only orders: neither starts later than it was.
    for m in fair:
        assert m.after.start <= m.before.start


def test_fair_share_never_moves_a_booking_later_or_refuses_one():
    """The user with the most use is last in line, but keeps the place
    they had."""
    policy = Policy(gpu_count=1, slot_minutes=5, max_shared_users=1)
    now = EPOCH
    a = Reservation("a", 1000, "heavy", SHARED, (0,), 1, now + H, now + 2 * H, now,
                    advance=Advance(now, now))
    assert advance.plan([a], (), policy, [], now, usage={1000: 1e9}) == [
        advance.Move(a, a.replace(start=now, end=now + H))]
    blocked = Reservation("x", 1001, "light", SHARED, (0,), 1, now, now + H, now)
    assert advance.plan([a, blocked], (), policy, [], now, usage={1000: 1e9, 1001: 0.0}) == []
