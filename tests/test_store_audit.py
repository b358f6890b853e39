"""The audit log: reverse reader, tolerance of damage, bounds, repair."""

from __future__ import annotations

import json
import os
import random

import pytest

from bk.store import audit

SEED = int(os.environ.get("BK_TEST_SEED", "11"))


def rec(seq, index=0, uid=1000, **kw):
    return dict({"time": "2026-07-13T18:00:00Z", "seq": seq, "index": index, "uid": uid,
                 "user": "ada", "action": "create"}, **kw)


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "audit.jsonl"

    def make(data: bytes):
        path.write_bytes(data)
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
        opened.append(fd)
        return fd
    opened: list[int] = []
    yield make
    for fd in opened:
        os.close(fd)


def test_backwards_matches_forward_split(log, monkeypatch):
    rng = random.Random(SEED)
    for trial in range(200):
        monkeypatch.setattr(audit, "BLOCK", rng.choice((1, 2, 3, 7, 64)))
        lines = [bytes(rng.choice(b"ab{}") for _ in range(rng.randint(0, 9)))
                 for _ in range(rng.randint(0, 12))]
        data = b"\n".join(lines) + (b"\n" if rng.random() < 0.6 and lines else b"")
        fd = log(data)
        got = list(audit.Backwards(fd, len(data)))
        want, off = [], 0
        for i, line in enumerate(data.split(b"\n")):
            last = i == data.count(b"\n")
            if not (last and line == b""):
                want.append((off, line, not last))
            off += len(line) + 1
        assert got == want[::-1], (SEED, trial, data)


def test_tail_tolerates_torn_and_malformed_lines(log):
    data = audit.encode([rec(1), rec(2)]) + b"not json\n" + b"[1, 2]\n" + audit.encode([rec(3)])
    data += b'{"seq": 4, "ind'
    out = audit.read_tail(log(data), limit=10)
    assert [e["seq"] for e in out.entries] == [1, 2, 3]
    assert len(out.problems) == 3 and "incomplete" in out.problems[2]      # in file order
    assert "not JSON" in out.problems[0] and "not a JSON object" in out.problems[1]
    assert out.complete


def test_tail_dedups_limits_filters_and_merges_pending(log):
    data = audit.encode([rec(1, uid=1), rec(2, uid=2, owner=1), rec(2, uid=2, owner=1),
                         rec(3, 0, uid=3), rec(3, 1, uid=3)])
    fd = log(data)
    assert [(e["seq"], e["index"]) for e in audit.read_tail(fd, limit=10).entries] == [
        (1, 0), (2, 0), (3, 0), (3, 1)]
    assert [e["seq"] for e in audit.read_tail(fd, limit=10, uid=1).entries] == [1, 2]
    assert [(e["seq"], e["index"]) for e in audit.read_tail(fd, limit=1).entries] == [(3, 1)]
    pending = [rec(3, 1, uid=3), rec(3, 2, uid=3), rec(2, 5)]
    got = audit.read_tail(fd, limit=10, pending=pending).entries
    assert [(e["seq"], e["index"]) for e in got] == [(1, 0), (2, 0), (3, 0), (3, 1), (3, 2)]


def test_tail_is_bounded(log):
    data = audit.encode([rec(i, uid=i % 2) for i in range(1, 5001)])
    fd = log(data)
    out = audit.read_tail(fd, limit=5, uid=7, max_bytes=50_000)
    assert out.entries == [] and not out.complete
    out = audit.read_tail(fd, limit=3, uid=1, max_bytes=50_000)
    assert [e["seq"] for e in out.entries] == [4995, 4997, 4999] and out.complete


def test_repair_appends_what_the_journal_has_and_the_log_lacks(log):
    journal = [rec(5, 0), rec(5, 1), rec(5, 2)]
    base = audit.encode([rec(4)])
    for tail, appended in [
        (b"", 3),                                              # append lost entirely
        (audit.encode(journal[:1]), 2),                        # append cut between records
        (audit.encode(journal[:1]) + b'{"seq":5,"in', 2),      # ... and in the middle of one
        (audit.encode(journal), 0),                            # nothing missing
    ]:
        fd = log(base + tail)
        newest, changed = audit.repair(fd, 5, journal)
        assert newest == 5 and changed == (appended > 0 or tail.endswith(b"in"))
        lines = os.pread(fd, 1 << 20, 0)
        records = [json.loads(x) for x in lines.splitlines()]
        assert [(r["seq"], r["index"]) for r in records] == [(4, 0), (5, 0), (5, 1), (5, 2)]


def test_repair_leaves_a_log_that_went_past_the_ledger(log):
    data = audit.encode([rec(5), rec(6), rec(7)])
    fd = log(data)
    assert audit.repair(fd, 5, [rec(5, 0), rec(5, 1)]) == (7, False)
    assert os.fstat(fd).st_size == len(data)
    assert audit.repair(log(b""), None, []) == (0, False)


def test_make_records_sets_time_seq_index_and_the_callers_identity():
    out = audit.make_records([{"action": "cancel", "seq": 99, "owner": 1000, "zeta": 1}],
                             seq=4, time="T", uid=1000, user="ada")
    assert out == [{"time": "T", "seq": 4, "index": 0, "uid": 1000, "user": "ada",
                    "action": "cancel", "reservation": None, "op_id": None, "before": None,
                    "after": None, "result": None, "owner": 1000, "zeta": 1}]
    # A group commit carries several callers' writes: each item names its own.
    both = audit.make_records([{"action": "create"}, {"action": "create", "uid": 7, "user": "bob"}],
                              seq=5, time="T", uid=1000, user="ada")
    assert [(r["uid"], r["user"], r["index"]) for r in both] == [(1000, "ada", 0), (7, "bob", 1)]
    assert list(out[0])[:11] == list(audit.FIELDS)


def test_a_filtered_backwards_scan_yields_exactly_the_matching_lines_of_a_full_one(tmp_path):
    """``Backwards(needle=...)`` finds lines with ``bytes.rfind`` instead of
    splitting every line out: on random files, block sizes and budgets it
    yields the newest ``head`` lines and then exactly the lines of a plain
    scan that contain the needle, with the same offsets, termination,
    completeness and bytes read.  Seeded; the seed is in the message."""
    seed = 20260713
    rng = random.Random(seed)
    path = tmp_path / "log"
    for trial in range(300):
        lines = [bytes(rng.choice(b"abXY") for _ in range(rng.randrange(0, 9)))
                 for _ in range(rng.randrange(0, 12))]
        data = (b"\n" if rng.random() < 0.2 else b"") + b"\n".join(lines)
        if data and rng.random() < 0.6:
            data += b"\n"
        path.write_bytes(data)
        block, budget = rng.randrange(1, 12), rng.choice([None, rng.randrange(0, 40)])
        needle, head = rng.choice([b"X", b"XY", b"a"]), rng.randrange(0, 3)
        fd = os.open(path, os.O_RDONLY)
        try:
            plain = audit.Backwards(fd, len(data), budget, block=block)
            want, left = [], head
            for off, line, terminated in plain:
                if left or needle in line:
                    want.append((off, line, terminated))
                    left -= bool(left and line)
            found = audit.Backwards(fd, len(data), budget, needle=needle, head=head, block=block)
            got = list(found)
        finally:
            os.close(fd)
        why = f"seed {seed}, trial {trial}: {data!r} block {block} budget {budget} needle {needle!r} head {head}"
        assert got == want, why
        assert (found.complete, found.read) == (plain.complete, plain.read), why
