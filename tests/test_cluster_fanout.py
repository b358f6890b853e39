"""The bounded fan-out (issue 29, item 4): at most ``cluster_parallel``
nodes asked at once, each within its own deadline counted from when it is
asked, rows in catalog order (by name), and one node that never answers costs only
its own deadline.

The end-to-end tests run the built bk.pyz against ``local`` catalog nodes
whose program is a real child process (tests/helpers_cluster.py's fake
node, wrapped by a script that records when it ran and how many nodes ran
with it).  Timing is never asserted: only outcomes and the order of events,
with deadlines far from what the nodes take."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers_cluster import FakeNode, write_catalog

from bk.cluster import catalog as cat
from bk.cluster.fanout import fan_out
from bk.cluster.node import NodeFailure

# The wrapper around a fake node: a file in running/ while it runs, the
# number of nodes running at its start and (after waiting, up to 1 s, for
# one more than LIMIT to show up) at its end in seen, its start time in
# started/NAME; then the fake node's canned reply, after SLOW seconds.
WRAP = """#!/bin/sh
d='{dir}'
touch "$d/running/$$"
ls "$d/running" | wc -l >> "$d/seen"
date +%s.%N > "$d/started/{name}"
i=0
while [ $i -lt {polls} ] && [ "$(ls "$d/running" | wc -l)" -le {limit} ]; do sleep 0.05; i=$((i + 1)); done
ls "$d/running" | wc -l >> "$d/seen"
rm -f "$d/running/$$"
sleep {slow}
exec /bin/sh '{fake}' "$@"
"""
HANG = "#!/bin/sh\necho $$ > '{dir}/hang.pid'\ndate +%s.%N > '{dir}/started/{name}'\nexec sleep 600\n"


class Lab:
    def __init__(self, base: Path, pyz: Path):
        self.base, self.pyz = base, pyz
        for d in ("running", "started"):
            (base / d).mkdir()
        (base / "seen").write_text("")
        self.nodes: dict[str, dict] = {}

    def node(self, name: str, *, limit: int = 1 << 20, polls: int = 0, slow: float = 0, **over) -> None:
        fake = FakeNode(self.base, name, f"d-{name.encode().hex():0<24}"[:26])
        wrap = self.base / f"wrap-{name}"
        wrap.write_text(WRAP.format(dir=self.base, name=name, limit=limit, polls=polls, slow=slow, fake=fake.script))
        os.chmod(wrap, 0o755)
        self.nodes[name] = fake.entry(**{"remote_command": ["/bin/sh", str(wrap)], "timeout_s": 60, **over})

    def hanging(self, name: str, timeout_s: float) -> None:
        script = self.base / f"hang-{name}"
        script.write_text(HANG.format(dir=self.base, name=name))
        os.chmod(script, 0o755)
        self.nodes[name] = {"id": "d-" + "9" * 24, "target": "local", "remote_command": ["/bin/sh", str(script)],
                            "timeout_s": timeout_s}

    def bk(self, *argv: str, parallel: int | None = None) -> tuple[int, dict]:
        home = self.base / "home"
        if parallel is not None:
            (home / ".config" / "bk").mkdir(parents=True, exist_ok=True)
            (home / ".config" / "bk" / "config.json").write_text(json.dumps({"cluster_parallel": parallel}))
        catalog = write_catalog(self.base / "cluster.json", self.nodes)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "TZ": "UTC",
               "BK_CLUSTER_FILE": str(catalog), "BK_DATA_DIR": str(self.base / "client"), "BK_GPU_COUNT": "1"}
        p = subprocess.run([sys.executable, str(self.pyz), *argv, "--json"], capture_output=True, text=True,
                           env=env, timeout=300)
        try:
            return p.returncode, json.loads(p.stdout)
        except ValueError:
            raise AssertionError(f"not one envelope (exit {p.returncode}): {p.stdout!r} {p.stderr!r}") from None

    def started(self, name: str) -> float:
        return float((self.base / "started" / name).read_text())

    def seen(self) -> list[int]:
        return [int(x) for x in (self.base / "seen").read_text().split()]

    def stop(self) -> None:
        pid = self.base / "hang.pid"
        if pid.exists():
            try:
                os.kill(int(pid.read_text()), 9)
            except (ProcessLookupError, ValueError):
                pass


@pytest.fixture
def lab(tmp_path, pyz):
    if os.geteuid() != 0:
        pytest.skip("the cluster catalog must be root's")
    os.chmod(tmp_path, 0o755)
    lab = Lab(tmp_path, pyz)
    yield lab
    lab.stop()


@pytest.mark.slow
def test_no_more_than_cluster_parallel_nodes_run_at_once(lab):
    """Every node waits (up to 1 s) for a third to run beside it: with
    cluster_parallel 2 none ever sees three; asking all six at once (the
    fan-out of one thread per node) lets them see up to six."""
    for i in range(6):
        lab.node(f"n{i}", limit=2, polls=20)
    code, out = lab.bk("c", "rec", "1", "30m", parallel=2)
    assert code == 0, out
    assert [n["name"] for n in out["data"]["nodes"]] == [f"n{i}" for i in range(6)]
    assert all(n["state"] == "ok" for n in out["data"]["nodes"])
    seen = lab.seen()
    assert len(seen) == 12 and max(seen) == 2, seen


@pytest.mark.slow
def test_a_node_that_never_answers_costs_only_its_own_deadline(lab):
    """One worker is held by the hanging node until its deadline; the other
    goes through every other node meanwhile: all of them start before the
    hanging node's deadline, answer, and keep their catalog order."""
    lab.node("a")
    lab.hanging("b-hang", timeout_s=8)
    for name in ("c", "d", "e", "f"):
        lab.node(name)
    code, out = lab.bk("c", "rec", "1", "30m", parallel=2)
    nodes = out["data"]["nodes"]
    assert [n["name"] for n in nodes] == ["a", "b-hang", "c", "d", "e", "f"]
    assert [n["state"] for n in nodes] == ["ok", "timeout", "ok", "ok", "ok", "ok"]
    assert nodes[1]["error"]["message"] == "no reply within 8 s (killed)"
    assert code == 1 and out["data"]["best"]["node"] == "a"
    deadline = lab.started("b-hang") + 8
    assert all(lab.started(name) < deadline for name in "cdef")


@pytest.mark.slow
def test_a_slow_node_within_its_deadline_is_kept_and_queueing_is_not_its_time(lab):
    """With one place, ``b`` (deadline 3 s) waits behind ``a``, which takes
    about 4 s: its deadline counts from when it is asked, so both answer."""
    lab.node("a", slow=4)
    lab.node("b", timeout_s=3)
    code, out = lab.bk("c", "check", parallel=1)
    assert [(n["name"], n["state"]) for n in out["data"]["nodes"]] == [("a", "ok"), ("b", "ok")], out
    assert lab.started("b") > lab.started("a")


def test_an_out_of_range_cluster_parallel_is_refused(lab):
    lab.node("a")
    code, out = lab.bk("c", "check", parallel=0)
    assert code == 78 and out["error"]["code"] == "config" and "cluster_parallel" in out["error"]["message"]


# ------------------------------------------------------------- in process

def entry(name: str, timeout_s: float = 60) -> cat.NodeEntry:
    return cat.NodeEntry(name, "d-" + name.encode().hex().ljust(24, "0")[:24], "local", timeout_s=timeout_s)


class Client:
    def __init__(self, entry, cancelled=None):
        self.entry, self.cancelled = entry, cancelled


def test_rows_keep_the_catalog_order_when_the_nodes_answer_in_reverse():
    """Node k answers only after node k+1 has: the last answers first."""
    nodes = [entry(f"n{i}") for i in range(5)]
    done = {n.name: threading.Event() for n in nodes}

    def job(c):
        i = int(c.entry.name[1:])
        if i + 1 < len(nodes):
            assert done[f"n{i + 1}"].wait(30)
        done[c.entry.name].set()
        return c.entry.name
    got = fan_out(nodes, job, make_client=Client, parallel=5)
    assert [(n.name, r) for n, r in got] == [(f"n{i}", f"n{i}") for i in range(5)]


def test_a_job_stuck_past_its_deadline_is_reported_and_cancelled():
    """A job that ignores its runner's deadline (here: waits for its cancel
    alone) is given up at the node's deadline plus the grace: its row says
    ``timeout``, its node is cancelled, the others are kept."""
    released = threading.Event()

    def job(c):
        if c.entry.name != "stuck":
            return "ok"
        end = time.monotonic() + 60
        while not c.cancelled() and time.monotonic() < end:
            time.sleep(0.01)
        released.set()
        return "answered after all"
    nodes = [entry("a"), entry("stuck", timeout_s=0.2), entry("b")]
    got = fan_out(nodes, job, make_client=Client, parallel=2, grace_s=0.1)
    assert [n.name for n, _ in got] == ["a", "stuck", "b"]
    assert got[0][1] == "ok" and got[2][1] == "ok"
    stuck = got[1][1]
    assert isinstance(stuck, NodeFailure) and stuck.state == "timeout", stuck
    assert stuck.message == "no reply within 0.2 s (killed)"
    assert released.wait(30)


def test_a_cancelled_fan_out_asks_no_more_nodes():
    cancel = threading.Event()
    asked = []

    def job(c):
        asked.append(c.entry.name)
        cancel.set()
        return "ok"
    got = fan_out([entry("a"), entry("b"), entry("c")], job, make_client=Client, cancel=cancel, parallel=1)
    assert asked == ["a"]
    assert got[0][1] == "ok" and all(isinstance(r, NodeFailure) and r.state == "cancelled" for _, r in got[1:])


def test_the_configured_default_is_the_fan_out_s():
    from bk.cluster.fanout import DEFAULT_PARALLEL
    from bk.store.config import KEYS

    assert KEYS["cluster_parallel"].default == DEFAULT_PARALLEL
