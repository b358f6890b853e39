"""The everyday commands' short roads (issue 29) give what a whole decode gives.

On a sealed ledger ``bk g`` first builds only yours and the bookings of the
coming day (``scheduler.options_now``: the options now, or None when a
reason reaches past that day or nothing is free now, and then every live
booking), ``bk n`` does not even parse the bookings
(``ledgerdoc._loads_skipping``), ``bk e`` and ``bk d`` name their booking
from yours and the ones with its ID prefix, and a write checks and encodes
only what it changed (``ledgercheck.trusted``, ``ledgerdoc.Framed``).

The whole decode is what an unsealed copy of the same ledger gets (every
record built and checked, a write checks and encodes everything), so the
same command lines through the built ``bk.pyz`` at a fixed ``BK_NOW`` must
print the same bytes and exit the same on both, on ledgers of 1,000 and
10,000 bookings of every kind: shared and exclusive, one and two GPUs,
cancelled, ended, running, to come, yours and others', memory figures,
runs of back-to-back bookings that end within the day and one that lasts
longer (its "until" is found only among the later bookings), notices and a
blackout.  A write is made on fresh copies of both: the two ledgers after
it hold the same state (a new booking's random ID aside), and the sealed
copy's bytes are the full encoder's.  Whether the short roads are taken at
all is checked in process."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import uuid

import pytest

from bk.core import ledgercheck, ledgerdoc
from bk.core.models import Blackout, Notice, Reservation

pytestmark = pytest.mark.slow

NOW = 1_800_000_000 - 1_800_000_000 % 300 + 53
SEED = int(os.environ.get("BK_TEST_SEED") or random.randrange(1 << 30))
GPUS = 8


def _sim(tmp) -> str:
    gpus = [{"name": "NVIDIA H100 80GB HBM3", "mem_total_mib": 81559, "mem_used_mib": 1024, "util": 10 * g,
             "processes": [{"pid": 1000 + g, "uid": 20000 + g, "user": f"user{g}", "label": "train.py",
                            "mem_mib": 512}]} for g in range(GPUS)]
    path = tmp / "sim.json"
    path.write_text(json.dumps({"gpus": gpus}))
    return str(path)


def _env(tmp, data) -> dict:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp), "LANG": "C.UTF-8",
            "BK_DATA_DIR": str(data), "BK_GPU_SIM_FILE": _sim(tmp), "BK_NOW": str(NOW), "TZ": "UTC",
            "COLUMNS": "120", "XDG_CONFIG_HOME": str(tmp / "cfg"), "XDG_STATE_HOME": str(tmp / "state")}


def _seed(env: dict, n: int, *, extra: bool) -> None:
    from bk.core.models import Mutation
    from bk.service import open_app

    rng = random.Random(SEED)
    app = open_app(env)
    call = app.call()
    me, my_name = call.actor.uid, call.actor.user
    first = NOW - NOW % 1800

    def apply(state):
        rs = state.reservations
        for i in range(n):
            # GPUs 0-5, one booking each half hour from six hours ago on; some
            # take the next GPU too (that one is then full for the half hour).
            g = i % 6
            start = first - 6 * 3600 + (i // 12) * 3600 + ((i % 12) // 6) * 1800
            uid, user = (me, my_name) if i % 97 == 0 and start > NOW else (20000 + i % 7, f"user{i % 7}")
            k = rng.randrange(10)
            gpus = (g, g + 1) if k == 2 and g % 2 == 0 else (g,)
            r = Reservation(str(uuid.UUID(int=i + 1, version=4)), uid, user, "shared", gpus, 1,
                            start, start + 1800, NOW - 7 * 3600, mem_mib=rng.choice((None, None, 8192)))
            if k == 1:
                r = r.replace(cancelled_at=NOW - 60, cancelled_by=uid, cancel_reason="changed plans")
            rs.append(r)
        # Exclusive runs by others: GPU 7 from before now for 30 hours (past
        # bk g's first day), GPU 6 from 1 hour on for 5 hours.
        for g, t0, pieces in ((7, first - 1800, 60), (6, first + 3600, 10)):
            for j in range(pieces):
                rs.append(Reservation(str(uuid.UUID(int=10**9 + g * 1000 + j, version=4)), 20000 + j % 3,
                                      f"user{j % 3}", "exclusive", (g,), 2, t0 + 1800 * j, t0 + 1800 * (j + 1),
                                      NOW - 3600))
        # Yours running now.
        rs.append(Reservation(str(uuid.UUID(int=4 * 10**9, version=4)), me, my_name, "shared", (0,), 1,
                              first - 600, first + 1200, NOW - 3600))
        state.blackouts.append(Blackout("b" * 32, first + 40 * 3600, first + 42 * 3600, "maintenance"))
        state.notices += [Notice("n" * 31 + "1", NOW - 600, "GPU 3 is slow today", level="warning"),
                          Notice("n" * 31 + "2", NOW - 7200, "your booking was cancelled", uid=me),
                          Notice("n" * 31 + "3", NOW - 86400, "old news", until=NOW - 3600),
                          Notice("n" * 31 + "4", NOW - 90000, "archived", archived=True)]
        if extra:
            # A top-level key bk does not know, after the bookings, holding
            # the bytes the skipping parse looks for: it parses whole.
            state.extra["x_later"] = {"a": 1, "seq": 2}
        return Mutation(True, [{"action": "seed", "result": "seeded"}])
    app.store.transact(apply, policy=call.policy.bound(), actor_uid=me, actor=my_name)


def _unsealed(data, to):
    """A copy of the ledger without its seal: read, checked and written whole."""
    shutil.copytree(data, to)
    raw = (data / "ledger.json").read_bytes()
    assert ledgerdoc.sealed(raw) is True
    (to / "ledger.json").write_bytes(raw[:raw.rindex(b',"digest":')] + b"}\n")
    shutil.rmtree(to / "backups")
    return to


def _run(pyz, env, *args) -> tuple[int, bytes]:
    p = subprocess.run([sys.executable, str(pyz), *args], env=env, capture_output=True, timeout=120)
    return p.returncode, p.stdout + b"\0" + p.stderr


def _state(data) -> tuple[dict, dict]:
    """The ledger as plain facts (not its commit token), and the reservations by ID."""
    doc = json.loads((data / "ledger.json").read_bytes())
    doc.pop("digest", None)
    doc.pop("commit", None)
    return doc, {r["id"]: r for r in doc["reservations"]}


def _canonical(raw: bytes) -> bytes:
    state, meta, problems = ledgerdoc.decode(json.loads(raw))
    assert not problems
    return ledgerdoc.seal(ledgerdoc.dumps(ledgerdoc.encode(
        state, commit=meta.commit, written_at=meta.written_at, journal=meta.journal)))


READS = [("n",), ("n", "--all"), ("n", "--json"), ("g",), ("g", "--json"), ("g", "1"), ("g", "1", "--json"),
         ("g", "1", "-e", "7"), ("g", "1", "-e", "7", "--json"), ("g", "2", "-d", "2h", "-e", "7"),
         ("g", "1", "-m", "20g", "-e", "6,7", "--json"), ("g", "1", "-g", "7"), ("g", "1", "-g", "7", "--json"),
         ("g", "2", "-d", "4h", "--mode", "exclusive", "-e", "7"), ("g", "1", "-d", "3h", "-g", "6"),
         ("d", "1", "--dry-run"), ("e", "2", "-d", "1h", "--dry-run"), ("e", "1", "--json", "-d", "45m", "--dry-run"),
         # Another user's booking by its ID, one of GPU 7's run, an ambiguous prefix, no such booking.
         ("d", "00000000-0000-4000-8000-000000000005", "--dry-run"), ("e", "00000000-0000-4000-8000-00003b9ae558",
                                                                      "-d", "1h"),
         ("d", "0000", "--dry-run"), ("d", "ffff", "--dry-run"), ("d", "9", "--dry-run")]
WRITES = [("1", "30m"), ("x", "1", "1h", "-e", "7"), ("e", "1", "-d", "1h"), ("e", "2", "-t", "+1h"),
          ("d", "2"), ("d", "1", "-y")]


@pytest.mark.parametrize("n,extra", [(1000, True), (10_000, False)], ids=["1000-extra", "10000"])
def test_everyday_commands_show_and_write_what_a_whole_decode_does(pyz, tmp_path, monkeypatch, n, extra):
    data = tmp_path / "data"
    env = _env(tmp_path, data)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    _seed(env, n, extra=extra)
    whole = _unsealed(data, tmp_path / "whole")
    env_w = {**env, "BK_DATA_DIR": str(whole)}
    for args in READS:
        a, b = _run(pyz, env, *args), _run(pyz, env_w, *args)
        assert a == b, f"seed {SEED}: bk {' '.join(args)} differs"
    for args in WRITES:
        ours, theirs = tmp_path / "w-sealed", tmp_path / "w-whole"
        shutil.rmtree(ours, ignore_errors=True)
        shutil.rmtree(theirs, ignore_errors=True)
        shutil.copytree(data, ours)
        shutil.copytree(whole, theirs)
        a = _run(pyz, {**env, "BK_DATA_DIR": str(ours)}, *args)
        b = _run(pyz, {**env, "BK_DATA_DIR": str(theirs)}, *args)
        (doc_a, by_a), (doc_b, by_b) = _state(ours), _state(theirs)
        new_a, new_b = set(by_a) - set(by_b), set(by_b) - set(by_a)
        assert len(new_a) == len(new_b) <= 1, f"seed {SEED}: bk {' '.join(args)}"
        if new_a:
            # A new booking's ID is random: the same facts under one name.
            (ia,), (ib,) = new_a, new_b
            b = (b[0], b[1].replace(ib[:8].encode(), ia[:8].encode()))
            doc_b = json.loads(json.dumps(doc_b).replace(ib, ia))
        assert a == b, f"seed {SEED}: bk {' '.join(args)} differs"
        assert a[0] == 0 and doc_a == doc_b, f"seed {SEED}: bk {' '.join(args)} wrote another ledger"
        raw = (ours / "ledger.json").read_bytes()
        assert _canonical(raw) == raw, f"seed {SEED}: bk {' '.join(args)}: not the full encoder's bytes"


def test_the_short_roads_are_taken(tmp_path, monkeypatch, capsys):
    """In process, at 1,000: what each command builds, parses, checks and encodes."""
    data = tmp_path / "data"
    env = _env(tmp_path, data)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    _seed(env, 1000, extra=False)
    from bk.cli.main import main
    from bk.service.app import Service

    reads, seen = [], {"check_state": 0, "encoded": 0, "skipped": 0}
    real_ledger, real_check, real_encode, real_skip = (Service.ledger, ledgercheck.check_state,
                                                       ledgerdoc.reservation_to_dict, ledgerdoc._loads_skipping)

    def ledger(self, *, call=None, keep=None):
        state = real_ledger(self, call=call, keep=keep)
        reads.append(len(state.reservations))
        return state

    def count(name, real):
        def fn(*a, **k):
            seen[name] += 1
            return real(*a, **k)
        return fn

    def skipping(raw):
        doc = real_skip(raw)
        seen["skipped"] += doc is not None
        return doc
    monkeypatch.setattr(Service, "ledger", ledger)
    monkeypatch.setattr(ledgercheck, "check_state", count("check_state", real_check))
    monkeypatch.setattr(ledgerdoc, "reservation_to_dict", count("encoded", real_encode))
    monkeypatch.setattr(ledgerdoc, "_loads_skipping", skipping)
    live = sum(1 for r in _state(data)[0]["reservations"] if "cancelled_at" not in r
               and r["end"] > ledgerdoc.format_utc(NOW))

    def run(*args) -> list[int]:
        reads.clear()
        assert main(list(args)) == 0, args
        capsys.readouterr()
        return list(reads)
    assert run("n") == [0] and seen["skipped"] == 1
    built = run("g", "1", "-e", "7")
    assert len(built) == 1 and built[0] < live * 0.6, (built, live)      # the day's, not every live one
    built = run("g", "1")                                                 # GPU 7's run lasts past the day
    assert len(built) == 2 and built[1] >= live, (built, live)
    built = run("d", "1", "--dry-run")
    assert built[0] < 30, built                                           # yours, not every booking
    seen.update(check_state=0, encoded=0)
    run("1", "30m")
    # The new booking (encoded for its bytes and its audit summary), nothing else.
    assert seen["check_state"] == 0 and seen["encoded"] <= 2, seen
    raw = (data / "ledger.json").read_bytes()
    assert _canonical(raw) == raw
    seen.update(check_state=0, encoded=0)
    run("e", "1", "-d", "1h")
    assert seen["check_state"] == 0 and seen["encoded"] <= 3, seen       # found by its bytes, the edit's
    raw = (data / "ledger.json").read_bytes()
    assert _canonical(raw) == raw
    assert re.search(rb'"digest":"crc32:[0-9a-f]{8}"}\n$', raw)
