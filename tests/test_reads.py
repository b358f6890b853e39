"""Reads that cost what they show: ``bk l`` shows 20 rows unless told
otherwise, and a booking reads the ledger once (its preset suggestion
reuses the transaction's count)."""

from __future__ import annotations

import pytest
from helpers_cli import BOB, ME, ROOT, SLICE, bk_fixture

from bk.core.errors import BkError
from bk.service.requests import BookRequest, CancelRequest, NoticeRequest
from bk.service.results import BookResult
from bk.store.ledger import Store

H = 3600


@pytest.fixture
def bk(monkeypatch, capsys):
    yield from bk_fixture(monkeypatch, capsys)


@pytest.fixture
def loads(monkeypatch):
    """Every ledger load (unlocked reads and a transaction's re-read)."""
    calls = []
    real = Store._load

    def counting(self, dirfd, verify=False):
        calls.append(verify)
        return real(self, dirfd, verify)
    monkeypatch.setattr(Store, "_load", counting)
    return calls


def _fill(bk, n: int) -> None:
    svc = bk.service(ME)
    for i in range(n):
        svc.run("book", BookRequest(count=1, duration=H, start=SLICE + 3600 * (i + 1)))


def test_list_shows_twenty_by_default_and_says_how_many_there_are(bk):
    _fill(bk, 25)
    out = bk.ok("l").out
    rows = [line for line in out.splitlines() if line[:1].isdigit()]
    assert [int(r.split()[0]) for r in rows] == list(range(1, 21))
    assert "showing 20 of 25 (bk l -n 0 for all)" in out
    d = bk.data("l")
    assert d["total"] == 25 and len(d["reservations"]) == 20
    assert [r["number"] for r in d["reservations"]] == list(range(1, 21))
    everything = bk.ok("l", "-n", "0").out
    assert "showing" not in everything and everything.count("\n") == 26     # header and 25 rows
    assert len(bk.data("l", "-n", "0")["reservations"]) == 25
    assert len(bk.data("l", "-n", "7")["reservations"]) == 7


def test_list_all_is_cut_the_same_way(bk):
    _fill(bk, 12)
    bob = bk.service(BOB)
    for i in range(12):
        bob.run("book", BookRequest(count=1, duration=H, start=SLICE + 3600 * (i + 1)))
    out = bk.ok("l", "--all").out
    assert "showing 20 of 24 (bk l --all -n 0 for all)" in out
    assert bk.data("l", "--all")["total"] == 24


def test_list_limit_must_be_zero_or_more(bk):
    r = bk.json("l", "-n", "-1")
    assert r.code == 2 and "0 (all) or a positive number" in r.error["message"]
    r = bk.json("l", "-n", "many")
    assert r.code == 2 and "whole number" in r.error["message"]


def test_a_booking_reads_the_ledger_once_and_still_suggests_a_preset(bk, loads):
    outs = []
    for _ in range(3):
        loads.clear()
        outs.append(bk.ok("2", "1h", "--again").out)
        assert loads == [False]          # the transaction's read; no second read for the suggestion
    assert "save it: bk p save NAME 2 1h" not in outs[1]
    assert "you booked this 3 times; save it: bk p save NAME 2 1h" in outs[2]


def test_the_transaction_counts_the_shape_and_the_wire_carries_it(bk):
    svc = bk.service(ME)
    counts = [svc.run("book", BookRequest(count=1, duration=H, again=True)).same_shape for _ in range(2)]
    counts.append(svc.run("book", BookRequest(count=2, duration=H, again=True)).same_shape)
    assert counts == [1, 2, 1]
    assert svc.run("book", BookRequest(count=1, duration=H, again=True, dry_run=True)).same_shape is None
    r = svc.run("book", BookRequest(count=1, duration=H, again=True))
    wire = r.to_wire()
    back = BookResult.from_wire(wire)
    assert back.same_shape == 3 and "same_shape" not in back.to_json()
    assert "same_shape" not in r.to_json()
    old = {k: v for k, v in wire.items() if k != "same_shape"}          # a broker before the count
    assert BookResult.from_wire(old).same_shape is None


def test_the_shape_count_is_the_latest_bookings_whatever_the_order_and_ties():
    """``same_shape_count`` sorts only the bookings new enough to be among
    the window: the count is that of sorting every one of the user's."""
    import random

    from bk.core.models import Reservation
    from bk.service.booking import same_shape_count, shape_of

    def brute(reservations, uid, booked, window):
        recent = sorted((r for r in reservations if r.uid == uid and r.cancelled_at is None),
                        key=lambda r: (r.created, r.id), reverse=True)[:window]
        return sum(shape_of(r) == shape_of(booked) for r in recent) + (booked.id not in {r.id for r in recent})

    rng = random.Random(29)
    for case in range(300):
        res = [Reservation(f"r{i:04d}{rng.randrange(10)}", rng.choice((1, 2)), "u", "shared", (0,) * rng.choice((1, 2)),
                           1, 0, 300 * rng.choice((1, 2)), rng.randrange(rng.choice((1, 5, 1000))),
                           cancelled_at=rng.choice((None, None, None, 7)))
               for i in range(rng.randrange(0, 80))]
        rng.shuffle(res)
        booked = rng.choice(res) if res and rng.random() < 0.8 else Reservation("new", 1, "u", "shared", (0,), 1, 0, 300, 5)
        for window in (1, 3, 20):
            assert same_shape_count(res, 1, booked, window) == brute(res, 1, booked, window), (case, window)


# --------------------------------------------- reads that build only what they show

def _world(bk, seed: int) -> None:
    """Bookings of two users over two days, some cancelled, on a 4-GPU server."""
    import random

    rng = random.Random(seed)
    me, bob = bk.service(ME), bk.service(BOB)
    for _ in range(60):
        svc = me if rng.random() < 0.4 else bob
        start = SLICE + 300 * rng.randrange(0, 48 * 12)
        try:
            r = svc.run("book", BookRequest(count=rng.choice((1, 1, 2)), duration=300 * rng.randrange(1, 36),
                                     start=start, again=True))
        except BkError:             # a full slot: this world just has one booking fewer
            continue
        if rng.random() < 0.15:
            svc.run("cancel", CancelRequest(ref=r.reservation.id))


VIEWS = [("st",), ("st", "-v"), ("login",),
         ("l",), ("l", "--all"), ("l", "--history"), ("l", "--all", "-n", "0"),
         ("tl",), ("tl", "--from", "-3h", "--window", "6h"), ("tl", "24h", "--step", "1h"), ("tl", "-g", "1,3")]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_windowed_read_shows_what_a_whole_read_shows(bk, monkeypatch, seed):
    bk.sim()                    # GPUs with processes: attribution runs on what was read
    _world(bk, seed)
    # Later, when some have ended, some run and some are to come.  The clock
    # reads os.environ, so the time is set there (not as a command's env).
    monkeypatch.setenv("BK_NOW", "2026-07-14T09:02:10Z")
    print(f"seed {seed}")
    windowed = {v: (bk(*v).out, bk.data(*v)) for v in VIEWS}
    from bk.core import ledgerdoc

    monkeypatch.setattr(ledgerdoc, "sealed", lambda data: None)     # every read whole, checked
    for v in VIEWS:
        assert (bk(*v).out, bk.data(*v)) == windowed[v], v


def test_a_windowed_read_builds_only_the_window_and_yours(bk, monkeypatch):
    _fill(bk, 5)
    bob = bk.service(BOB)
    for i in range(30):
        bob.run("book", BookRequest(count=1, duration=H, start=SLICE + 3600 * (i + 1), again=True))
    from bk.service.app import Service

    seen = []
    real = Service.ledger

    def spy(self, *, call=None, keep=None):
        state = real(self, call=call, keep=keep)
        seen.append(len(state.reservations))
        return state
    monkeypatch.setattr(Service, "ledger", spy)
    bk.ok("l")
    bk.ok("tl", "3h", "--step", "15m")
    assert seen[0] == 5                         # yours only
    assert 5 <= seen[1] < 12                    # yours and bob's in the window
    # A ledger without a seal is checked whole, so it is built whole.
    from bk.core import ledgerdoc

    monkeypatch.setattr(ledgerdoc, "sealed", lambda data: None)
    bk.ok("l")
    assert seen[-1] == 35


def test_a_transaction_never_reads_part_of_the_ledger(bk):
    _fill(bk, 3)
    from bk.core.ledgerdoc import DocKeep

    store = bk.service(ME).reader.store
    part = store.read(keep=DocKeep(uid=BOB.uid))
    assert part.partial and part.state.reservations == []
    whole = store.read()
    assert not whole.partial and len(whole.state.reservations) == 3


# Notices and advice: bk n reads no booking at all, bk g and bk slots only
# yours and the live ones (what placement and attribution look at).
ADVICE = [("n",), ("n", "--all"), ("g",), ("g", "1"), ("g", "2", "-m", "4g"), ("g", "4"),
          ("g", "1", "--mode", "exclusive"), ("slots", "1", "30m"), ("slots", "2", "2h", "-n", "5"),
          ("slots", "1", "1h", "--mode", "exclusive", "-t", "+2h"), ("st",)]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [4, 5, 6])
def test_notices_and_advice_from_a_partial_read_match_a_whole_read(bk, monkeypatch, seed):
    import random

    bk.sim()
    _world(bk, seed)
    rng = random.Random(seed)
    admin = bk.service(ROOT)
    admin.run("notice_publish", NoticeRequest("new drivers tonight"))
    admin.run("notice_publish", NoticeRequest("later", level="warning", start=SLICE + 6 * H))
    admin.run("notice_publish", NoticeRequest("gone by now", until=SLICE + H))
    mine = [r for r in bk.service(ME).ledger().reservations if r.uid == ME.uid and r.cancelled_at is None]
    for r in rng.sample(mine, min(3, len(mine))):       # admin cancellations: notices to ada
        admin.run("cancel", CancelRequest(ref=r.id, reason=f"maintenance {r.id[:4]}"))
    # Some ended, some running, some to come.  The clock reads os.environ, so
    # the later time is set there rather than passed to one command.
    monkeypatch.setenv("BK_NOW", "2026-07-14T09:02:10Z")
    print(f"seed {seed}")
    partial = {v: (bk(*v), bk.json(*v)) for v in ADVICE}
    assert partial[("n",)][1].data["notices"], "the world has notices to compare"
    from bk.core import ledgerdoc

    monkeypatch.setattr(ledgerdoc, "sealed", lambda data: None)     # every read whole, checked
    for v in ADVICE:
        whole = (bk(*v), bk.json(*v))
        assert whole == partial[v], v


def test_notices_and_advice_build_only_what_they_look_at(bk, monkeypatch):
    _fill(bk, 5)
    bob = bk.service(BOB)
    for i in range(30):
        bob.run("book", BookRequest(count=1, duration=H, start=SLICE + 3600 * (i + 1), again=True))
    from bk.service.app import Service

    seen = []
    real = Service.ledger

    def spy(self, *, call=None, keep=None):
        state = real(self, call=call, keep=keep)
        seen.append(len(state.reservations))
        return state
    monkeypatch.setattr(Service, "ledger", spy)
    from bk.core.models import iso

    monkeypatch.setenv("BK_NOW", iso(SLICE + 23 * H + 1800))     # bob's from the 23rd on have not ended
    bk.ok("n")
    bk.ok("g", "1")
    bk.ok("slots", "1", "1h")
    assert seen == [0, 5 + 8, 5 + 8]        # none; yours, and bob's 8 not yet ended
