"""Group commit: several callers' writes in one transaction.

``Service.write_batch`` must behave exactly like separate transactions (a
refused write is rolled back alone, each audit record names its own caller),
and the broker's ``GroupCommit`` must hand every caller its own outcome
while committing writes that queued up together."""

from __future__ import annotations

import threading

import pytest

from bk.broker.handlers import GroupCommit
from bk.core.errors import BkError, Conflict, PermissionDenied
from bk.gpu.sim import CountBackend
from bk.service import open_app
from bk.service.requests import Actor, BookRequest, CancelRequest

ALICE, BOB = Actor(3001, "alice"), Actor(3002, "bob")
T0 = 1_790_000_000 - 1_790_000_000 % 300


@pytest.fixture
def svc(tmp_path):
    env = {"HOME": str(tmp_path), "BK_DATA_DIR": str(tmp_path / "data"), "XDG_STATE_HOME": str(tmp_path / "s")}
    return open_app(env, backend=CountBackend(2), clock_fn=lambda: T0, actor=ALICE)


def test_a_refused_write_is_rolled_back_alone(svc):
    start = T0 + 3600
    full = BookRequest(count=2, duration=3600, mode="exclusive", start=start)
    first = svc.run("book", full, call=svc.call(BOB))
    items = [
        ("book", BookRequest(count=1, duration=1800, op_id="a1"), svc.call(ALICE)),
        ("book", BookRequest(count=1, duration=1800, start=start), svc.call(ALICE)),      # conflicts
        ("cancel", CancelRequest(ref=first.reservation.id), svc.call(ALICE)),            # not hers
        ("book", BookRequest(count=1, duration=1800, op_id="b1"), svc.call(BOB)),
        ("book", BookRequest(count=1, duration=1800, op_id="a1"), svc.call(ALICE)),      # replay within the batch
    ]
    seq_before = svc.ledger().seq
    out = svc.write_batch(items)
    assert out[0].status == "created"
    assert isinstance(out[1], Conflict)
    assert isinstance(out[2], PermissionDenied)
    assert out[3].status == "created"
    assert out[4].status == "exists" and out[4].reservation.id == out[0].reservation.id
    state = svc.ledger()
    assert state.seq == seq_before + 1                       # one commit for the whole batch
    ids = {r.id for r in state.reservations}
    assert {out[0].reservation.id, out[3].reservation.id, first.reservation.id} == ids
    tail = svc.store.audit_tail(limit=10).entries
    creates = [e for e in tail if e["seq"] == state.seq and e["action"] == "create"]
    assert [(e["uid"], e["user"]) for e in creates] == [(ALICE.uid, "alice"), (BOB.uid, "bob")]


def test_a_failing_transaction_answers_every_item(svc, monkeypatch):
    def busy(*a, **k):
        from bk.core.errors import Busy

        raise Busy("lock busy")
    monkeypatch.setattr(svc.store, "transact", busy)
    out = svc.write_batch([("book", BookRequest(count=1, duration=1800), svc.call(ALICE)) for _ in range(3)])
    assert [e.code for e in out] == ["busy"] * 3


def test_group_commit_batches_waiting_callers_and_answers_each():
    started, release = threading.Event(), threading.Event()
    batches: list[list] = []

    def run_batch(items):
        batches.append(list(items))
        if len(batches) == 1:              # hold the first commit until the others queue up
            started.set()
            assert release.wait(30)
        return [("ok", i) if i % 5 else BkError(f"no {i}") for i in items], [f"w{len(batches)}"]

    gc = GroupCommit(run_batch, max_batch=4)
    results: dict[int, tuple] = {}

    def caller(i):
        results[i] = gc.submit(i)

    first = threading.Thread(target=caller, args=(0,))
    first.start()
    assert started.wait(30)
    others = [threading.Thread(target=caller, args=(i,)) for i in range(1, 10)]
    for t in others:
        t.start()
    # Poll (with a deadline) until all nine wait in the queue, then let the first commit finish.
    import time

    deadline = time.monotonic() + 30
    while len(gc._queue) < 9:
        assert time.monotonic() < deadline, "callers did not queue"
        time.sleep(0.005)
    release.set()
    for t in [first, *others]:
        t.join(30)
    assert sorted(results) == list(range(10))
    for i, (outcome, warnings) in results.items():
        if i % 5:
            assert outcome == ("ok", i)
        else:
            assert isinstance(outcome, BkError) and outcome.message == f"no {i}"
        assert warnings and warnings[0].startswith("w")
    assert batches[0] == [0]
    assert sum(len(b) for b in batches) == 10
    assert all(len(b) <= 4 for b in batches) and len(batches) <= 4   # 1 + ceil(9 / 4)


def test_a_bug_in_a_batch_reaches_its_callers_and_the_next_caller_still_leads():
    calls = []

    def run_batch(items):
        calls.append(items)
        if len(calls) == 1:
            raise RuntimeError("bug")
        return [("ok", i) for i in items], []

    gc = GroupCommit(run_batch)
    outcome, _ = gc.submit(1)
    assert isinstance(outcome, RuntimeError)
    assert gc.submit(2) == (("ok", 2), [])


def test_one_callers_many_writes_do_not_crowd_another_out_of_the_next_batch():
    """``per_key``: while more than one key waits, a batch takes at most that
    many writes of each (the broker passes the caller's UID), so one user's
    sixteen queued writes cost another user's write two of theirs, not
    sixteen (issue 22); alone, one user's writes fill a batch."""
    started, release = threading.Event(), threading.Event()
    batches: list[list] = []

    def run_batch(items):
        batches.append(list(items))
        if len(batches) == 1:
            started.set()
            assert release.wait(30)
        return [("ok", i) for i in items], []

    gc = GroupCommit(run_batch, max_batch=64, per_key=2)
    first = threading.Thread(target=gc.submit, args=(("a", 0), "a"))
    first.start()
    assert started.wait(30)
    threads = [threading.Thread(target=gc.submit, args=(("a", i), "a")) for i in range(1, 17)]
    for t in threads:
        t.start()
    import time

    deadline = time.monotonic() + 30
    while len(gc._queue) < 16:
        assert time.monotonic() < deadline, "callers did not queue"
        time.sleep(0.005)
    victim = threading.Thread(target=gc.submit, args=(("b", 0), "b"))
    victim.start()
    while len(gc._queue) < 17:
        assert time.monotonic() < deadline, "the other caller did not queue"
        time.sleep(0.005)
    release.set()
    for t in [first, victim, *threads]:
        t.join(30)
    second = batches[1]
    assert ("b", 0) in second and sum(1 for k, _ in second if k == "a") == 2
    assert sorted(x for b in batches for x in b) == sorted([("a", i) for i in range(17)] + [("b", 0)])
    # With nobody else waiting, one caller's writes fill a batch again.
    assert len(batches) == 3 and len(batches[2]) == 14
