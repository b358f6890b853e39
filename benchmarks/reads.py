"""Where a read's time goes, and what whole commands cost, at 1,000 and 10,000 bookings.

    python3 build.py -o /tmp/bk.pyz && python3 benchmarks/reads.py [--pyz /tmp/bk.pyz] [--runs 5]

Two tables per ledger size (N live 30-minute shared bookings
spread over the coming weeks on 8 GPUs, ten of them yours):

1. In process, median of ``--runs`` reads: the phases of one unlocked read
   (the file's bytes, ``json.loads``, building the records, the digest a
   reader compares, the full invariant check that a matching digest lets it
   skip) and one commit that changes one booking (fsync included).
2. Whole process, median of ``--runs`` runs of ``python3 PYZ ARGS``: ``l``,
   ``st``, ``g``, ``tl``, a real booking ``1 30m`` (cancelled again between
   runs, so the ledger keeps its size) and ``doctor`` with ten backups.

This is a report, not a test: it prints tables.  Issue 17's target for
``doctor`` at 10,000 bookings is under one second.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COMMANDS = [("l",), ("l", "--all"), ("st",), ("g",), ("tl",), ("doctor",)]


def seed(env: dict, n: int, own: int = 10) -> None:
    """``n`` live 30-minute shared bookings on 8 GPUs in one transaction, one
    share slot of every GPU left free at any time, ``own`` of them yours."""
    import uuid

    from bk.core.models import Mutation, Reservation
    from bk.service import open_app

    app = open_app(env)
    call = app.call()
    now, me = call.now, call.actor
    first = now - now % call.policy.slot_seconds + 3600
    gpus, lanes = call.policy.gpu_count, call.policy.max_shared_users
    own_every = max(1, n // own)

    def apply(state):
        for i in range(n):
            k, rest = divmod(i, gpus * lanes)
            start = first + k * 3600 + ((rest // gpus) % 2) * 1800
            mine = i % own_every == 0 and i // own_every < own
            uid, user = (me.uid, me.user) if mine else (20000 + i % 17, f"user{i % 17}")
            state.reservations.append(Reservation(
                id=str(uuid.UUID(int=i + 1, version=4)), uid=uid, user=user, mode="shared",
                gpus=(rest % gpus,), share=1, start=start, end=start + 1800, created=now))
        return Mutation(True, [{"action": "seed", "result": "seeded", "after": {"count": n}}], None)
    app.store.transact(apply, policy=call.policy.bound(), actor_uid=me.uid, actor=me.user)


def _median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def phases(env: dict, runs: int) -> list[tuple[str, float]]:
    from bk.core import ledgercheck, ledgerdoc
    from bk.core.models import Mutation
    from bk.service import open_app
    from bk.store.ledger import Store

    app = open_app(env)
    path = app.store.paths.ledger
    data = Path(path).read_bytes()
    doc = ledgerdoc.loads(data)
    state, _meta, _p = ledgerdoc.decode(doc)
    out = [("ledger bytes (KiB)", len(data) / 1024),
           ("read file", _median_ms(lambda: Path(path).read_bytes(), runs)),
           ("json.loads", _median_ms(lambda: ledgerdoc.loads(data), runs)),
           ("decode (records)", _median_ms(lambda: ledgerdoc.decode(doc), runs)),
           ("check_state (invariants)", _median_ms(lambda: ledgercheck.check_state(state), runs))]
    if hasattr(ledgerdoc, "sealed"):
        out.append(("digest check", _median_ms(lambda: ledgerdoc.sealed(data), runs)))
    if hasattr(ledgerdoc, "DocKeep"):
        keep = ledgerdoc.DocKeep(uid=app.call().actor.uid)
        out.append(("decode, yours only (DocKeep)", _median_ms(lambda: ledgerdoc.decode(doc, keep), runs)))
    out.append(("encode + dumps (a commit's bytes)", _median_ms(lambda: ledgerdoc.dumps(ledgerdoc.encode(
        state, commit="0" * 16, written_at=0, journal=[])), runs)))
    out.append(("Store.read, fresh Store", _median_ms(
        lambda: Store(app.store.paths.data_dir).read(), runs)))
    call = app.call()
    mine = [r.id for r in state.reservations if r.uid == call.actor.uid]

    def commit():
        def apply(st):
            st.reservations = [r.replace(note=f"n{time.perf_counter_ns()}") if r.id == mine[0] else r
                               for r in st.reservations]
            return Mutation(True, [{"action": "edit", "result": "ok"}], None)
        Store(app.store.paths.data_dir).transact(apply, policy=call.policy.bound(),
                                                 actor_uid=call.actor.uid, actor=call.actor.user)
    # At least ten commits: backups/ then holds its ten (backup_keep) for doctor.
    out.append(("commit one change, fresh Store", _median_ms(commit, max(runs, 10))))
    return out


def timed(argv: list[str], env: dict) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True)
    elapsed = (time.perf_counter() - t0) * 1000
    if proc.returncode not in (0, 1):      # doctor exits 1 on a warning
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return elapsed, proc.stdout


def whole(python: str, pyz: str, env: dict, runs: int) -> list[tuple[str, float]]:
    out = [("python3 -c pass", statistics.median(timed([python, "-c", "pass"], env)[0]
                                                 for _ in range(runs)))]
    for cmd in COMMANDS:
        timed([python, pyz, *cmd], env)
        out.append((" ".join(cmd), statistics.median(timed([python, pyz, *cmd], env)[0]
                                                     for _ in range(runs))))
    book = []
    for _ in range(runs):
        ms, stdout = timed([python, pyz, "1", "30m", "--json"], env)
        book.append(ms)
        rid = json.loads(stdout)["data"]["reservation"]["id"]
        timed([python, pyz, "d", rid, "-q"], env)
    out.append(("1 30m (a real booking)", statistics.median(book)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per cell (default 5)")
    parser.add_argument("--sizes", default="1000,10000", help="live bookings (default 1000,10000)")
    parser.add_argument("--python", default="/usr/bin/python3", help="interpreter (default /usr/bin/python3)")
    parser.add_argument("--pyz", default=str(ROOT / "dist" / "bk.pyz"), help="the archive (default dist/bk.pyz)")
    args = parser.parse_args(argv)
    for n in (int(s) for s in args.sizes.split(",")):
        tmp = tempfile.mkdtemp(prefix="bk-reads-")
        try:
            cfg = Path(tmp, "cfg", "bk")
            cfg.mkdir(parents=True)
            (cfg / "config.json").write_text(json.dumps({"booking_horizon_days": 60}))
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "LANG": "C.UTF-8",
                   "BK_DATA_DIR": os.path.join(tmp, "data"), "BK_GPU_COUNT": "8",
                   "XDG_CONFIG_HOME": os.path.join(tmp, "cfg"), "XDG_STATE_HOME": os.path.join(tmp, "state"),
                   "TZ": os.environ.get("TZ", "UTC")}
            seed(env, n)
            saved = dict(os.environ)
            os.environ.update(env)
            try:
                rows = phases(env, args.runs)        # its commits also fill backups/
            finally:
                os.environ.clear()
                os.environ.update(saved)
            print(f"\n{n} live bookings, in process (ms, median of {args.runs})")
            for name, v in rows:
                print(f"  {name:<34} {v:9.1f}")
            if os.path.exists(args.pyz):
                print(f"{n} live bookings, whole process {args.pyz} (ms, median of {args.runs})")
                for name, v in whole(args.python, args.pyz, env, args.runs):
                    print(f"  {name:<34} {v:9.1f}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
