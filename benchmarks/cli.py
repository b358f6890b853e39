"""Whole-process timings of everyday commands of the built ``dist/bk.pyz``.

    python3 build.py && python3 benchmarks/cli.py [--runs 10] [--sizes 0,1000,10000] [--json [PATH]]

Each cell is the median wall time of ``--runs`` runs of
``/usr/bin/python3 dist/bk.pyz ARGS`` (after one warm-up run), next to the
bare interpreter (``python3 -c pass``) measured in the same loop, so the
"over python" column is what bk itself costs on this machine.

The ledger: a fresh private data directory per size (``BK_DATA_DIR``,
``BK_GPU_COUNT=8``, ``booking_horizon_days`` 60 from a user config) seeded
with N live bookings in one transaction through the store: 30-minute
shared bookings spread over the coming weeks on all 8 GPUs, leaving one
share slot of every GPU free at any time (so a shared request fits now
but has the whole ledger to check), all from other users except ten of
yours (a real ``bk l`` lists a handful, not thousands).
``1 30m`` runs with ``--dry-run``, so the ledger keeps its size while it is
measured (the placement and the transaction's lock and re-read still run).

Targets (issue #5): ``--version`` within 10 ms of the bare interpreter;
everyday commands within 60 ms whole-process (the ``bk`` column, interpreter
start-up included) with 1,000 live bookings and within 150 ms with 10,000.  This is a report, not a test: it prints a table.

``--json`` alone also prints the rows as JSON (milliseconds) after the table.
``--json PATH`` instead writes every cell of the table to PATH for
``benchmarks/ab.py``: ``{"benchmark": "cli", "format": 1, "settings": {...},
"cells": {NAME: {"value": s, "unit": "s", "stat": ..., "samples": [s, ...]}}}``,
seconds throughout.  NAME is ``"<bookings> <command> [bk]"`` (median of the
samples), ``"... [python]"`` (the bare interpreter, median) and ``"... [over]"``
(the difference of the two medians, as in the table; its samples are the
paired differences of the interleaved runs), e.g. ``"1000 l --json [bk]"``.
The file is written (atomically) only once every cell was measured.
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
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COMMANDS = [
    ("--version",), ("l",), ("l", "--json"), ("st", "--json"), ("1", "30m", "--dry-run"),
    ("slots", "2", "1h"), ("g",),
]
TARGETS = {0: 60.0, 1000: 60.0, 10000: 150.0}     # ms whole-process
VERSION_TARGET = 10.0
OWN = 10                                          # bookings of the benchmark's own user


def seed(env: dict, n: int) -> None:
    """Write ``n`` live bookings into the ledger of ``env`` in one transaction."""
    from bk.core.models import Reservation
    from bk.service import open_app
    from bk.store.ledger import Mutation

    app = open_app(env)
    call = app.call()
    now = call.now
    slot = call.policy.slot_seconds
    first = now - now % slot + 3600
    me = call.actor
    gpus, lanes = call.policy.gpu_count, call.policy.max_shared_users
    own_every = max(1, n // OWN) if n else 1

    def apply(state):
        for i in range(n):
            k, rest = divmod(i, gpus * lanes)
            lane = rest // gpus
            # Each share slot ("lane") is booked half of every hour, the two
            # lanes alternating: one slot of every GPU is always free.
            start = first + k * 3600 + (lane % 2) * 1800
            mine = i % own_every == 0 and i // own_every < OWN
            uid, user = (me.uid, me.user) if mine else (20000 + i % 17, f"user{i % 17}")
            state.reservations.append(Reservation(
                id=str(uuid.UUID(int=i + 1, version=4)), uid=uid, user=user, mode="shared",
                gpus=(rest % gpus,), share=1, start=start, end=start + 1800, created=now))
        return Mutation(True, [{"action": "seed", "reservation": None, "op_id": None, "before": None,
                                "after": {"count": n}, "result": "seeded"}], None)
    if n:
        app.store.transact(apply, policy=call.policy.bound(), actor_uid=me.uid, actor=me.user)


def timed(argv: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    elapsed = (time.perf_counter() - t0) * 1000
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return elapsed


def measure(python: str, pyz: str, env: dict, args: tuple, runs: int) -> tuple[list[float], list[float]]:
    """(ms of each run of bk ARGS, ms of each run of the bare interpreter), interleaved."""
    bare_cmd = [python, "-c", "pass"]
    cmd = [python, pyz, *args]
    timed(cmd, env)
    timed(bare_cmd, env)
    bk_times, bare_times = [], []
    for _ in range(runs):
        bare_times.append(timed(bare_cmd, env))
        bk_times.append(timed(cmd, env))
    return bk_times, bare_times


def write_cells(path: str, cells: dict, settings: dict) -> None:
    from cells import write_cells as write

    write(path, "cli", cells, settings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time everyday bk commands (see the module docstring).")
    parser.add_argument("--runs", type=int, default=10, help="measured runs per cell (default 10)")
    parser.add_argument("--sizes", default="0,1000,10000", help="live bookings per ledger (default 0,1000,10000)")
    parser.add_argument("--python", default="/usr/bin/python3", help="interpreter (default /usr/bin/python3)")
    parser.add_argument("--pyz", default=str(ROOT / "dist" / "bk.pyz"), help="the archive (default dist/bk.pyz)")
    parser.add_argument("--json", nargs="?", const="-", metavar="PATH",
                        help="alone: print the results as JSON too; with PATH: write every cell "
                             "(seconds, with the raw samples) to PATH for benchmarks/ab.py")
    args = parser.parse_args(argv)
    if not os.path.exists(args.pyz):
        print(f"error: {args.pyz} does not exist\nhint: python3 build.py", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.sizes.split(",")]
    results = []
    cells: dict[str, dict] = {}
    print(f"{args.python} {args.pyz}: median of {args.runs} runs after a warm-up, milliseconds")
    print(f"{'bookings':>8}  {'command':<20} {'bk':>7} {'python':>7} {'over':>7}  target")
    failed = 0
    for n in sizes:
        tmp = tempfile.mkdtemp(prefix="bk-bench-")
        try:
            cfg = Path(tmp, "cfg", "bk")
            cfg.mkdir(parents=True)
            (cfg / "config.json").write_text(json.dumps({"booking_horizon_days": 60}))
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "LANG": "C.UTF-8",
                   "BK_DATA_DIR": os.path.join(tmp, "data"), "BK_GPU_COUNT": "8",
                   "XDG_CONFIG_HOME": os.path.join(tmp, "cfg"), "XDG_STATE_HOME": os.path.join(tmp, "state"),
                   "TZ": os.environ.get("TZ", "UTC")}
            t0 = time.perf_counter()
            seed(env, n)
            seeded = (time.perf_counter() - t0) * 1000
            if n:
                print(f"{n:>8}  (seeded in {seeded:.0f} ms)")
            for cmd in COMMANDS:
                bk_runs, bare_runs = measure(args.python, args.pyz, env, cmd, args.runs)
                bk_ms, bare_ms = statistics.median(bk_runs), statistics.median(bare_runs)
                over = bk_ms - bare_ms
                target = VERSION_TARGET if cmd == ("--version",) else TARGETS.get(n, TARGETS[10000])
                # --version is judged against the bare interpreter; the
                # everyday commands whole-process, start-up included.
                ok = (over if cmd == ("--version",) else bk_ms) <= target
                failed += not ok
                name = " ".join(cmd)
                print(f"{n:>8}  {name:<20} {bk_ms:7.1f} {bare_ms:7.1f} {over:7.1f}  "
                      f"{'ok' if ok else 'OVER'} (<= {target:.0f})")
                results.append({"bookings": n, "command": name, "bk_ms": round(bk_ms, 1),
                                "python_ms": round(bare_ms, 1), "over_ms": round(over, 1),
                                "target_ms": target, "ok": ok})
                cells[f"{n} {name} [bk]"] = {"value": bk_ms / 1000, "unit": "s", "stat": "median",
                                             "samples": [t / 1000 for t in bk_runs]}
                cells[f"{n} {name} [python]"] = {"value": bare_ms / 1000, "unit": "s", "stat": "median",
                                                 "samples": [t / 1000 for t in bare_runs]}
                cells[f"{n} {name} [over]"] = {
                    "value": over / 1000, "unit": "s", "stat": "difference of medians",
                    "samples": [(b - p) / 1000 for b, p in zip(bk_runs, bare_runs, strict=True)]}
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json == "-":
        print(json.dumps(results, indent=1))
    elif args.json:
        write_cells(args.json, cells, {"runs": args.runs, "sizes": sizes, "python": args.python,
                                       "pyz": args.pyz})
    print(f"{len(results) - failed}/{len(results)} within target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
