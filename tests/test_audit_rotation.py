"""Audit log rotation: older commits sealed into audit.d/ with a SHA-256,
the live log left with the newest commit only, readers (bk lg, bk history,
lost-commit detection) across segments without duplicates, retention drops
old segments, a tampered segment is named by the health check, and a
writer killed between sealing and replacing the live log loses nothing."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import helpers_store as H
import pytest
from helpers_admin import private

from bk.store import health, segments
from bk.store.ledger import Store


def store(data, now=H.NOW, **kw) -> Store:
    kw.setdefault("audit_segment_bytes", 1500)
    return Store(str(data), clock=lambda: now, min_free_bytes=0, **kw)


def commits(s: Store, n: int, prefix: str = "c") -> None:
    for i in range(n):
        s.transact(H.op(H.tag_for(f"{prefix}{i}", 1)), policy=H.POLICY, actor_uid=1000, actor="tester")


def all_records(s: Store) -> list[dict]:
    return s.audit_tail(limit=100000).entries


@pytest.mark.slow
def test_segments_are_sealed_and_readers_see_every_record_once(tmp_path):
    s = store(tmp_path / "d")
    commits(s, 40)
    seg_dir = tmp_path / "d" / segments.SEGMENTS
    names = sorted(p.name for p in seg_dir.iterdir() if p.name.endswith(".jsonl"))
    assert len(names) >= 3
    for name in names:
        seal = (seg_dir / (name + segments.SEAL_SUFFIX)).read_text().split()
        assert seal == [hashlib.sha256((seg_dir / name).read_bytes()).hexdigest(), name]
    # The live log holds the commits since the last rotation (it began with the
    # commit that rotated it), under the segment size; every commit is somewhere, once.
    live = [json.loads(x) for x in (tmp_path / "d" / "audit.jsonl").read_text().splitlines()]
    assert max(r["seq"] for r in live) == 40 and (tmp_path / "d" / "audit.jsonl").stat().st_size < 1500
    newest = max(names)
    assert int(segments.SEGMENT.match(newest).group(2)) + 1 == min(r["seq"] for r in live)
    seqs = [r["seq"] for r in all_records(s)]
    assert seqs == list(range(1, 41))
    assert [r["seq"] for r in s.audit_tail(limit=5).entries] == [36, 37, 38, 39, 40]
    assert [r["seq"] for r in s.audit_tail(limit=50, uid=1000).entries] == list(range(1, 41))
    assert s.lost_commits() is None
    checks = {name: (ok, detail) for name, ok, detail in health.check(s)}
    assert checks["audit log"][0] and "every seal matches" in checks["audit log"][1], checks["audit log"]
    commits(s, 1, "after")                       # the repair step still finds the newest commit
    assert [r["seq"] for r in all_records(s)] == list(range(1, 42))


def test_a_tampered_segment_is_named(tmp_path):
    s = store(tmp_path / "d")
    commits(s, 20)
    seg = sorted((tmp_path / "d" / segments.SEGMENTS).glob("*.jsonl"))[0]
    with open(seg, "ab") as f:
        f.write(b'{"seq": 1, "index": 7}\n')
    checks = {name: (ok, detail) for name, ok, detail in health.check(s)}
    ok, detail = checks["audit log"]
    assert not ok and seg.name in detail and "seal" in detail


@pytest.mark.slow
def test_retention_drops_old_segments_but_keeps_the_newest(tmp_path):
    s = store(tmp_path / "d", audit_retention_days=10)
    commits(s, 30)
    before = sorted((tmp_path / "d" / segments.SEGMENTS).glob("*.jsonl"))
    later = store(tmp_path / "d", now=H.NOW + 11 * 86400, audit_retention_days=10)
    commits(later, 12, "later")
    after = sorted((tmp_path / "d" / segments.SEGMENTS).glob("*.jsonl"))
    assert not set(before) & set(after[:-1]) and after
    assert not [p for p in before if p.exists() and p != after[0]]
    seqs = [r["seq"] for r in all_records(later)]
    assert seqs == list(range(seqs[0], 43)) and seqs[0] > 1      # contiguous from the oldest kept


@pytest.mark.slow
def test_killed_between_sealing_and_replacing_the_live_log_loses_nothing(tmp_path):
    data = tmp_path / "d"
    commits(store(data), 8)
    env = dict(os.environ, BK_TEST_CRASH_AT="segment_written", BK_TEST_AUDIT_SEGMENT_BYTES="1500",
               PYTHONPATH=str(H.ROOT))
    code = ("import sys; sys.path.insert(0, 'tests'); import helpers_store as H\n"
            "from bk.store.ledger import Store\n"
            f"s = Store({str(data)!r}, clock=lambda: H.NOW, min_free_bytes=0)\n"
            "for i in range(50):\n"
            "    s.transact(H.op(H.tag_for(f'k{i}', 1)), policy=H.POLICY, actor_uid=1000, actor='tester')\n")
    p = subprocess.run([sys.executable, "-c", code], env=env, cwd=H.ROOT, capture_output=True, timeout=60)
    assert p.returncode == -9, p.stderr
    s = store(data)
    seq = s.read().state.seq
    assert [r["seq"] for r in all_records(s)] == list(range(1, seq + 1))     # duplicates folded
    commits(s, 10, "again")
    assert [r["seq"] for r in all_records(s)] == list(range(1, seq + 11))
    firsts = [segments.SEGMENT.match(p.name).group(1) for p in (data / segments.SEGMENTS).glob("*.jsonl")]
    assert len(firsts) == len(set(firsts))                # the interrupted segment was replaced


@pytest.fixture
def bk(pyz):
    yield from private(pyz)


@pytest.mark.slow
def test_bk_lg_and_history_read_across_segments_through_the_archive(bk):
    bk.env["BK_TEST_AUDIT_SEGMENT_BYTES"] = "2000"
    first = bk.book("1", "30m", "-t", "12:00")
    for i in range(12):
        bk.book("1", "30m", "-t", f"{13 + i % 8}:00", "--again")
    bk.data_of("e", first["short_id"], "-d", "1h")
    assert len(list((bk.data / segments.SEGMENTS).glob("*.jsonl"))) >= 2
    entries = bk.data_of("lg", "-n", "100")["entries"]
    assert [e["seq"] for e in entries] == list(range(1, 15))
    events = bk.data_of("history", first["short_id"])["events"]
    assert [e["action"] for e in events] == ["create", "edit"]
    assert "all checks passed" in bk.run("doctor").stdout
