"""The usage store killed (SIGKILL) after every step of its write protocol:
afterwards every acknowledged record is readable exactly once, no day reads
as tampered, and finishing the work (the rest appended, maintenance run)
gives the totals of a store that never crashed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_usage_store import DAY, T0, world

from bk.core import usage
from bk.store.usage import SEAL_GRACE, STEPS, UsageStore

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
SEED = 21

WRITER = """
import os, signal, sys
sys.path[:0] = [{root!r}, {tests!r}]
from test_usage_store import world, T0, DAY
from bk.store.usage import UsageStore, SEAL_GRACE
target, nth, d = sys.argv[1], int(sys.argv[2]), sys.argv[3]
hits = [0]
def step(name):
    if name == target:
        hits[0] += 1
        if hits[0] >= nth:
            os.kill(os.getpid(), signal.SIGKILL)
s = UsageStore(d, raw_days=1, step=step)
with open(d + ".acks", "a") as acks:
    for r in world({seed}, days=3, step=3600):
        s.append([r])
        acks.write(f"{{r.t}} {{r.gpu}}\\n")
        acks.flush()
s.maintain(T0 + 3 * DAY + SEAL_GRACE)
"""


def keys(records):
    return [(r.t, r.gpu) for r in records]


@pytest.mark.parametrize("nth", [1, 2])
@pytest.mark.parametrize("target", STEPS)
def test_kill_at_every_step(tmp_path, target, nth):
    d = str(tmp_path / "usage")
    code = WRITER.format(root=str(ROOT), tests=str(TESTS), seed=SEED)
    p = subprocess.run([sys.executable, "-c", code, target, str(nth), d], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == -signal.SIGKILL, (target, nth, p.returncode, p.stderr)     # the step was reached
    everything = world(SEED, days=3, step=3600)
    acked = set()
    if os.path.exists(d + ".acks"):
        acked = {tuple(map(int, ln.split())) for ln in open(d + ".acks") if ln.strip()}
    store = UsageStore(d, raw_days=1)
    found = keys(store.records())
    assert len(found) == len(set(found)), f"a record reads twice after a kill at {target}:{nth}"
    assert acked <= set(found) <= set(keys(everything))
    assert not [c.to_json() for c in store.verify() if c.state not in ("ok", "unsealed")]
    # Finish the work: what is missing is appended late, maintenance catches up.
    have = set(found)
    store.append([r for r in everything if (r.t, r.gpu) not in have], now=T0 + 3 * DAY)
    store.maintain(T0 + 3 * DAY + SEAL_GRACE)
    assert {c.state for c in store.verify()} == {"ok"}
    got = store.summary()
    want = usage.summarise(everything)
    for part in ("by_uid", "by_gpu", "by_reservation"):
        g, w = getattr(got, part), getattr(want, part)
        assert {k: (t.booked_s, t.active_s, t.unreserved_s, t.sm_n, t.mem_peak_mib) for k, t in g.items()} == \
            {k: (t.booked_s, t.active_s, t.unreserved_s, t.sm_n, t.mem_peak_mib) for k, t in w.items()}, part
    assert all(r.period_s == 3600 for r in store.records(T0, T0 + 2 * DAY))
