"""The broker's sharing out of its own work between UIDs (issue 22, item 3),
with real threads and no timing: ``Turns`` (a few requests at once, the next
turn to the UID that has waited longest) and ``ReadSlots`` (two reads of one
UID at once, the rest wait; other UIDs never wait for them)."""

from __future__ import annotations

import threading
import time

import pytest

from bk.broker.handlers import ReadSlots, Turns
from bk.core.errors import Busy


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def test_a_uid_with_many_waiting_requests_and_one_with_a_single_one_alternate():
    turns = Turns(width=1)
    order: list[str] = []
    turns.enter(0)                                         # a request in progress holds the only turn

    def request(uid: int, label: str) -> None:
        turns.enter(uid)
        order.append(label)
        turns.leave()

    flood = [threading.Thread(target=request, args=(1, f"a{i}")) for i in range(6)]
    for i, t in enumerate(flood):
        t.start()
        wait_for(lambda i=i: len(turns._waiting.get(1, [])) == i + 1, "the flood to queue")
    single = threading.Thread(target=request, args=(2, "b"))
    single.start()
    wait_for(lambda: 2 in turns._waiting, "the other UID to queue")
    turns.leave()
    for t in [*flood, single]:
        t.join(30)
    # UID 1 began to wait first, so it goes first; then it is UID 2's turn, not UID 1's second.
    assert order == ["a0", "b", "a1", "a2", "a3", "a4", "a5"]


def test_turns_let_width_requests_in_at_once():
    turns = Turns(width=3)
    for uid in (1, 1, 2):
        turns.enter(uid)
    got = threading.Event()
    t = threading.Thread(target=lambda: (turns.enter(3), got.set()))
    t.start()
    wait_for(lambda: 3 in turns._waiting, "the fourth request to wait")
    assert not got.is_set()
    turns.leave()
    t.join(30)
    assert got.is_set()


def test_read_slots_are_per_uid():
    slots = ReadSlots(per_uid=2, wait=30.0)
    slots.acquire(7)
    slots.acquire(7)
    slots.acquire(8)                                       # another UID is not kept waiting
    assert (slots.held(7), slots.held(8)) == (2, 1)
    third = threading.Thread(target=slots.acquire, args=(7,))
    third.start()
    wait_for(lambda: third.is_alive(), "the third read to start")
    assert slots.held(7) == 2                              # it waits for one of the two
    slots.release(7)
    third.join(30)
    assert not third.is_alive() and slots.held(7) == 2


def test_a_read_that_waited_too_long_is_refused_busy():
    ticks = iter(range(0, 1000, 10))                       # every look at the clock: 10 s later
    slots = ReadSlots(per_uid=1, wait=5.0, monotonic=lambda: float(next(ticks)))
    slots.acquire(7)
    with pytest.raises(Busy) as e:
        slots.acquire(7)
    assert e.value.details == {"reason": "read_slots", "limit": 1, "uid": 7}
    assert e.value.exit_code == 75

