"""``bk st`` builds only what it shows (issue 29): without ``-v`` a read
builds your bookings, the running ones and those on GPUs this machine
lacks; every later booking is only summarised as the JSON parser makes it
(``DocKeep(holds=True)``: start, end, GPUs), which is all each GPU's next
free time needs.  The output must stay what a whole decode gives.

The whole decode is what an unsealed copy of the same ledger gets (every
record built and checked), so ``bk st``, ``bk st -v`` and ``bk st --json``
through the built ``bk.pyz`` at a fixed ``BK_NOW`` must print the same bytes
on both, on ledgers of 1,000 and 10,000 bookings of every kind: shared and
exclusive, one and several GPUs, cancelled, ended, running, to come, yours
and others', chains of back-to-back bookings that keep a GPU busy for hours
(found only through the summaries), a blackout, and processes, one a root container process credited to its booker."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import uuid

import pytest

from bk.core import ledgerdoc
from bk.core.models import Blackout, Reservation

pytestmark = pytest.mark.slow

NOW = 1_800_000_000 - 1_800_000_000 % 300 + 41
SEED = int(os.environ.get("BK_TEST_SEED") or random.randrange(1 << 30))
GPUS = 8


def _sim(tmp) -> str:
    """Eight GPUs with processes: yours, others', a root container process on GPU 6."""
    gpus = []
    for g in range(GPUS):
        procs = [{"pid": 1000 + g, "uid": 20000 + g, "user": f"user{g}", "label": "train.py", "mem_mib": 512}]
        if g == 6:
            procs.append({"pid": 4444, "uid": 0, "user": "root", "label": "python", "mem_mib": 256,
                          "container": "c0ffee"})
        gpus.append({"name": "NVIDIA H100 80GB HBM3", "mem_total_mib": 81559, "mem_used_mib": 768, "util": 10 * g,
                     "processes": procs})
    path = tmp / "sim.json"
    path.write_text(json.dumps({"gpus": gpus}))
    return str(path)


def _env(tmp, data) -> dict:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp), "LANG": "C.UTF-8",
            "BK_DATA_DIR": str(data), "BK_GPU_SIM_FILE": _sim(tmp), "BK_NOW": str(NOW), "TZ": "UTC",
            "COLUMNS": "120", "XDG_CONFIG_HOME": str(tmp / "cfg"), "XDG_STATE_HOME": str(tmp / "state")}


def _seed(env: dict, n: int) -> None:
    from bk.service import open_app
    from bk.store.ledger import Mutation

    rng = random.Random(SEED)
    app = open_app(env)
    call = app.call()
    me, my_name = call.actor.uid, call.actor.user
    first = NOW - NOW % 1800

    def apply(state):
        rs = state.reservations
        for i in range(n):
            # GPUs 0-5, one booking each half hour from six hours ago on: some
            # ended, some run, most are to come; some take the next GPU too
            # (from an even one: never more than two share slots in use).
            g = i % 6
            start = first - 6 * 3600 + (i // 12) * 3600 + ((i % 12) // 6) * 1800
            uid, user = (me, my_name) if i % 97 == 0 else (20000 + i % 7, f"user{i % 7}")
            k = rng.randrange(10)
            gpus = (g, g + 1) if k == 2 and g % 2 == 0 else (g,)
            r = Reservation(str(uuid.UUID(int=i + 1, version=4)), uid, user, "shared", gpus, 1,
                            start, start + 1800, NOW - 7 * 3600)
            if k == 1:
                r = r.replace(cancelled_at=NOW - 60, cancelled_by=uid, cancel_reason="changed plans")
            rs.append(r)
        # Chains of exclusive bookings by others: GPU 7 busy from before now
        # for 5 hours in 10-minute pieces (only the first runs now; the
        # blackout carries it an hour further), GPU 6 from 1 hour on.
        for g, t0, pieces in ((7, NOW - 120, 30), (6, NOW + 3600, 12)):
            for j in range(pieces):
                rs.append(Reservation(str(uuid.UUID(int=10**9 + g * 1000 + j, version=4)), 20000 + j % 3,
                                      f"user{j % 3}", "exclusive", (g,), 2, t0 + 600 * j, t0 + 600 * (j + 1),
                                      NOW - 3600))
        # GPU 6: one booker running now, for the root container process.
        rs.append(Reservation(str(uuid.UUID(int=2 * 10**9, version=4)), 20004, "user4", "shared", (6,), 1,
                              NOW - 300, NOW + 900, NOW - 3600))
        # One of yours running now.
        rs.append(Reservation(str(uuid.UUID(int=4 * 10**9, version=4)), me, my_name, "shared", (0,), 1,
                              NOW - 600, NOW + 600, NOW - 3600))
        state.blackouts.append(Blackout("b" * 32, NOW + 5 * 3600 - 600, NOW + 6 * 3600, "maintenance"))
        return Mutation(True, [{"action": "seed", "result": "seeded"}])
    app.store.transact(apply, policy=call.policy.bound(), actor_uid=me, actor=my_name)


def _unsealed_copy(tmp, data):
    """The same ledger without its seal: a reader decodes and checks it whole."""
    other = tmp / "unsealed"
    shutil.copytree(data, other)
    raw = (data / "ledger.json").read_bytes()
    assert ledgerdoc.sealed(raw) is True
    (other / "ledger.json").write_bytes(raw[:raw.rindex(b',"digest":')] + b"}\n")
    shutil.rmtree(other / "backups")
    return other


def _run(pyz, env, *args) -> bytes:
    p = subprocess.run([sys.executable, str(pyz), *args], env=env, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout + b"\0" + p.stderr


@pytest.mark.parametrize("n", [1000, 10_000])
def test_bk_st_shows_what_a_whole_decode_shows(pyz, tmp_path, monkeypatch, n):
    data = tmp_path / "data"
    env = _env(tmp_path, data)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    _seed(env, n)
    unsealed = _unsealed_copy(tmp_path, data)
    env_u = {**env, "BK_DATA_DIR": str(unsealed)}
    for args in (("st",), ("st", "-v"), ("st", "--json"), ("st", "-v", "--json")):
        a, b = _run(pyz, env, *args), _run(pyz, env_u, *args)
        assert a == b, f"seed {SEED}: bk {' '.join(args)} differs"
    st = json.loads(_run(pyz, env, "st", "--json").split(b"\0")[0])["data"]
    free = {g["index"]: g["next_free"] for g in st["gpus"]}
    print(f"seed {SEED}: next free {free}")
    # Chains through later bookings (the summaries) decide some GPUs' time.
    later = ledgerdoc.format_utc(NOW + 3600)
    assert sum(1 for t in free.values() if t > later) >= 2, free
    p4 = [p for g in st["gpus"] if g["index"] == 6 for p in g["processes"] if p["pid"] == 4444]
    assert p4 and p4[0]["identity"] == "inferred" and p4[0]["user"] == "user4"


def test_bk_st_builds_only_yours_and_the_running_ones(tmp_path, monkeypatch, capsys):
    """In process: the read of ``bk st`` holds a few records and the
    summaries; one of ``bk st -v`` builds every live booking."""
    data = tmp_path / "data"
    env = _env(tmp_path, data)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    _seed(env, 1000)
    from bk.cli.main import main
    from bk.service.app import Service

    seen = []
    real = Service.ledger

    def spy(self, *, call=None, keep=None):
        state = real(self, call=call, keep=keep)
        seen.append((len(state.reservations), len(state.holds)))
        return state
    monkeypatch.setattr(Service, "ledger", spy)
    assert main(["st", "--json"]) == 0
    built, held = seen[-1]
    assert built < 40 and held > 700, seen
    assert main(["st", "-v", "--json"]) == 0
    built, held = seen[-1]
    assert built > 700 and held == 0, seen
    capsys.readouterr()
