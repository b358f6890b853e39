"""Whole-process timings of everyday commands of the built ``dist/bk.pyz``.

    python3 build.py && python3 benchmarks/cli.py [--runs 10] [--sizes 0,1000,10000]
                                                  [--reference VENV] [--json [PATH]]

Each cell is the median wall time of ``--runs`` runs of
``/usr/bin/python3 dist/bk.pyz ARGS`` (after one warm-up run), next to the
bare interpreter (``python3 -c pass``) measured in the same loop, so the
"over" column (over the bare interpreter) is what bk itself costs on this
machine.

The commands: the everyday ones of issue 17 (``l``, ``st``, ``g``, ``n``, a
booking, ``e``, ``d``, ``slots``, ``tl``), ``l --json`` and ``st --json``,
and ``--version``.  A booking, an edit and a cancellation are real writes,
each run its own: ``1 30m`` books (the ledger grows by one booking a run),
``e ID -d 1h`` and ``-d 30m`` alternate on one booking of yours, and each
run of ``d ID`` cancels a booking of yours made for it.  Those bookings are
added once the read-only commands have been measured, so on a size-0 ledger
every read runs on an empty ledger.

The ledger: a fresh private data directory per size (``BK_DATA_DIR``,
``BK_GPU_COUNT=8``, ``booking_horizon_days`` 60 from a user config) seeded
with N live bookings in one transaction through the store: 30-minute
shared bookings spread over the coming weeks on all 8 GPUs, leaving one
share slot of every GPU free at any time (so a shared request fits now
but has the whole ledger to check), all from other users except ten of
yours (a real ``bk l`` lists a handful, not thousands).

Targets (issues 17 and 29): on an empty ledger every everyday command within
10 ms of the bare interpreter (the "over" column), ``--version`` too; issue 5's
whole-process targets stay: within 60 ms (the "bk" column, start-up included)
at 1,000 bookings and within 150 ms at 10,000.  This is a report, not a
test: it prints a table.

Where the start-up goes (issue 29 item 1; empty ledger, ``/usr/bin/python3``
3.11 on the 2-core build machine, where ``python3 -c pass`` takes 8-13 ms).
Instruction counts (valgrind's callgrind, "Ir") are quoted beside the times:
they do not move with the machine's load, which the times do.

* The floor, before any bk code runs: running a zipapp imports runpy, and
  with it importlib.util, contextlib, collections and functools (3 ms), and
  zipimport reads the archive's directory, 486 entries (1-2 ms).  A
  one-entry zipapp that does nothing is 4 ms over ``python3 -c pass``, an
  empty one with bk's entries 5.7 ms; ``bk --version`` is 4-6.5 ms over
  (26.5 M instructions).  Every everyday command pays this.
* Each module bk imports from the archive: about 0.25 M instructions
  (50 us) of import machinery even when empty (the archive's ``__main__``
  already reads each .pyc once instead of zipimport's twice), then
  unmarshalling its bytecode, about 3 us a kilobyte: ``bk l`` loads 34
  modules, 630 kB of bytecode (13 % of it docstrings), a booking 50 modules.
* What was cut (before -> after, Ir over ``python3 -c pass``: ``l`` 105.5 ->
  55.7 M, ``st`` 119.6 -> 61.4 M, ``1 30m`` 153.5 -> 80.3 M): ``re`` and
  ``json`` (4 ms: bk.core.jsonfast on ``_json``, scanners for durations and
  memory sizes, bk.core.textfold for textwrap, lazy patterns elsewhere);
  ``datetime.py`` (1 ms: its classes from ``_datetime``); zipimport's second
  read of every module (bk.admin.pyzfile.MAIN_PY); the cyclic collector,
  about ten collections while the modules load (1.5 ms: paused) and full
  passes at shutdown (2 ms: the archive's ``__main__`` freezes the heap);
  compiling each record class's ``__init__`` on its first instance (2.7 ms
  of ``bk l``, 6 ms of a booking: a generic method serves a class's first
  32 instances); the lock module on reads.  bk l, st and n now import
  nothing of the standard library beyond C modules (_json, _datetime, errno,
  gc, pwd, zlib); tests/test_lazy_imports.py holds every command to its list.
* What stands between a command and 10 ms: the floor (4-6 ms), its modules'
  import machinery (34 for ``l``: 1.7 ms) and bytecode (2-3 ms), and the
  classes and tables they build (the records of bk.core.models, the
  configuration's 66 keys, the operation table, the exception classes:
  about 1.5 ms); a write adds 16 more modules (the scheduler, the
  requests and results, the audit log), a placement, and the fsyncs of its
  commit (the ledger, its directory, the audit log), which no instruction
  count shows.

Side by side with the reference implementation.  ``--reference VENV``, where
VENV is a virtual environment with ``pip install gpubk==0.2.8`` (made with
the same interpreter as ``--python``, so both sides start the same Python),
builds the same ledger for the reference: the same bookings (IDs, users,
GPUs, times) written in one transaction through the reference's own store
API, in a child process of VENV's interpreter (the reference's data
directory and its binding of the ledger to the policy are its own; it runs
with ``BK_DATA_DIR`` and ``BK_GPU_COUNT`` as ours does).  Each command of
both then runs in one loop, alternately (ours, reference; then reference,
ours; ...), with the bare interpreter in the same loop, and the table adds
the reference's median and ours/reference: the median of the paired
ratios (run i of ours over run i of the reference, made back to back), so a
busy moment of a shared machine weighs on both sides of each ratio.  The reference has no
``st --json``, ``--dry-run`` or ``--version`` timing of interest, so only
the commands both have are compared (``st`` in its human form).  Targets:
ours/reference at most 0.15 at 1,000 bookings and 0.1 at 10,000.

Measured (issue 29 item 2), ours/reference before and after the everyday
commands stopped building what they do not show, one run each back to back
on the 2-core build machine while others used it (a ratio moves by a few
hundredths from one run to the next)::

    bookings   g     n     1 30m  e     d     l     st
    1,000      0.34  0.28  0.23   0.26  0.29  0.24  0.31   before
               0.29  0.31  0.21   0.24  0.25  0.25  0.29   after
    10,000     0.19  0.22  0.09   0.17  0.17  0.09  0.11   before
               0.10  0.16  0.09   0.10  0.13  0.08  0.12   after

At 10,000 a command's own work is now one JSON parse of the 2 MB ledger
(about 17 ms) and what it builds: ``g`` your bookings and those of the
coming day (about 400), ``n`` none (it does not parse the bookings), ``e``
and ``d`` yours and those with the ID prefix to name their booking, then
every booking in their transaction (about 15 ms), which checks and encodes
only what it changed; ``e`` and ``d`` parse the ledger twice (name, then
write).  In instructions (valgrind) at 10,000: ``g`` 769M to 389M, ``n``
316M to 149M, a booking 1,322M to 693M, ``e`` 1,868M to 878M, ``d`` 1,792M
to 792M, where ``python3 -c pass`` is 32M.  What is left over the targets is
start-up: ``n`` costs at 10,000 what it costs at 1,000, and at 1,000 each
command spends most of its time importing (about 100 modules, 30-45 ms under
``-X importtime``) against the reference's 140-300 ms in all, so 0.15 there
is item 1's work (the imports), not the ledger's.

``--json`` alone also prints the rows as JSON (milliseconds) after the table.
``--json PATH`` instead writes every cell of the table to PATH for
``benchmarks/ab.py``: ``{"benchmark": "cli", "format": 1, "settings": {...},
"cells": {NAME: {"value": s, "unit": "s", "stat": ..., "samples": [s, ...]}}}``,
seconds throughout.  NAME is ``"<bookings> <command> [bk]"`` (median of the
samples), ``"... [python]"`` (the bare interpreter, median), ``"... [over]"``
(the difference of the two medians, as in the table; its samples are the
paired differences of the interleaved runs) and, with ``--reference``,
``"... [reference]"`` and ``"... [ratio]"`` (ours/reference, the median of the paired ratios, unit ``x``),
e.g. ``"1000 l --json [bk]"``.  The file is written (atomically) only once
every cell was measured.
"""

from __future__ import annotations

import argparse
import hashlib
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

OWN = 10                                          # bookings of the benchmark's own user
OVER_TARGET = 10.0                                # ms over the bare interpreter, empty ledger
TARGETS = {1000: 60.0, 10000: 150.0}              # ms whole-process (issue 5)
RATIO_TARGETS = {1000: 0.15, 10000: 0.1}          # ours/reference (issue 17)


class Cmd:
    """One row: ``words(run)`` are the arguments of run ``run`` (0 is the
    warm-up) for ``side`` ("bk" or "reference"); ``write`` rows need the
    bookings of ``specials`` first."""

    def __init__(self, name: str, words=None, *, ours_only=False, write=False):
        self.name, self.ours_only, self.write = name, ours_only, write
        self._words = words or (lambda side, run: tuple(name.split()))

    def words(self, side: str, run: int) -> tuple[str, ...]:
        return tuple(self._words(side, run))


def victim_id(run: int) -> str:
    """The booking run ``run`` of ``d`` cancels: IDs whose first 8 hex digits differ."""
    return str(uuid.UUID(bytes=hashlib.sha256(b"bk-bench-victim-%d" % run).digest()[:16], version=4))


EDIT_ID = str(uuid.UUID(bytes=hashlib.sha256(b"bk-bench-edit").digest()[:16], version=4))

COMMANDS = [
    Cmd("--version", ours_only=True),
    Cmd("l"), Cmd("l --json"), Cmd("st"), Cmd("st --json", ours_only=True), Cmd("g"), Cmd("n"),
    Cmd("slots 2 1h"), Cmd("tl"),
    Cmd("1 30m", write=True),
    Cmd("e ID -d 1h|30m", lambda side, run: ("e", EDIT_ID[:8], "-d", "1h" if run % 2 else "30m"), write=True),
    Cmd("d ID", lambda side, run: ("d", victim_id(run)[:8]), write=True),
]


def env_for(tmp: str, data: str) -> dict:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "LANG": "C.UTF-8",
            "BK_DATA_DIR": data, "BK_GPU_COUNT": "8",
            "XDG_CONFIG_HOME": os.path.join(tmp, "cfg"), "XDG_STATE_HOME": os.path.join(tmp, "state"),
            "TZ": os.environ.get("TZ", "UTC")}


def bulk(n: int, now: int, slot: int, me: tuple[int, str], gpus: int = 8, lanes: int = 2) -> list[dict]:
    """The ``n`` seeded bookings, as plain facts both implementations can write."""
    first = now - now % slot + 3600
    own_every = max(1, n // OWN) if n else 1
    out = []
    for i in range(n):
        k, rest = divmod(i, gpus * lanes)
        lane = rest // gpus
        # Each share slot ("lane") is booked half of every hour, the two
        # lanes alternating: one slot of every GPU is always free.
        start = first + k * 3600 + (lane % 2) * 1800
        mine = i % own_every == 0 and i // own_every < OWN
        uid, user = me if mine else (20000 + i % 17, f"user{i % 17}")
        out.append({"id": str(uuid.UUID(int=i + 1, version=4)), "uid": uid, "user": user,
                    "gpu": rest % gpus, "start": start, "end": start + 1800})
    return out


def specials(n: int, runs: int, now: int, slot: int, me: tuple[int, str], gpus: int = 8,
             lanes: int = 2) -> list[dict]:
    """Your bookings for the write rows, an hour apart on the last GPU after
    the seeded ones: one to edit (it may grow to an hour) and one per run of ``d``."""
    first = now - now % slot + 3600
    after = first + (-(-n // (gpus * lanes)) + 2) * 3600
    ids = [EDIT_ID] + [victim_id(r) for r in range(runs + 1)]
    return [{"id": b, "uid": me[0], "user": me[1], "gpu": gpus - 1, "start": after + j * 3600,
             "end": after + j * 3600 + 1800} for j, b in enumerate(ids)]


def seed_ours(env: dict, facts: list[dict], now: int) -> None:
    """Write ``facts`` into the ledger of ``env`` in one transaction through our store."""
    from bk.core.models import Mutation, Reservation
    from bk.service import open_app

    app = open_app(env)
    call = app.call()

    def apply(state):
        for f in facts:
            state.reservations.append(Reservation(
                id=f["id"], uid=f["uid"], user=f["user"], mode="shared", gpus=(f["gpu"],), share=1,
                start=f["start"], end=f["end"], created=now))
        return Mutation(True, [{"action": "seed", "reservation": None, "op_id": None, "before": None,
                                "after": {"count": len(facts)}, "result": "seeded"}], None)
    if facts:
        app.store.transact(apply, policy=call.policy.bound(), actor_uid=call.actor.uid, actor=call.actor.user)


# Run by the reference's interpreter: the same facts through its ledger store's
# transaction (learned from what its CLI writes: one record per booking, times
# as ISO-8601 UTC).  Its first CLI command makes and binds the data directory.
REFERENCE_SEED = r"""
import json, sys, uuid
from datetime import datetime, timezone
from pathlib import Path
from bk.storage import LedgerStore

facts, now, data = json.load(sys.stdin), int(sys.argv[1]), Path(sys.argv[2])
iso = lambda t: datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

def add(ledger):
    for f in facts:
        ledger["reservations"].append({
            "id": f["id"], "uid": f["uid"], "username": f["user"], "mode": "shared",
            "gpus": [f["gpu"]], "share_units": 1, "start_at": iso(f["start"]), "end_at": iso(f["end"]),
            "created_at": iso(now), "updated_at": iso(now), "status": "active",
            "op_id": str(uuid.uuid4())})
    return ledger, len(facts), [], True

LedgerStore(data).transaction(add)
"""


def seed_reference(venv: str, env: dict, facts: list[dict], now: int) -> None:
    python = os.path.join(venv, "bin", "python")
    if not facts:
        return
    # -I: the working directory (this tree, with our own bk package) is not on its path.
    proc = subprocess.run([python, "-I", "-c", REFERENCE_SEED, str(now), env["BK_DATA_DIR"]], env=env,
                          input=json.dumps(facts), capture_output=True, text=True, cwd=env["HOME"])
    if proc.returncode != 0:
        raise SystemExit(f"seeding the reference failed: {proc.stderr[-800:]}")


def timed(argv: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    elapsed = (time.perf_counter() - t0) * 1000
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return elapsed


def measure(sides: dict, cmd: Cmd, runs: int, python: str) -> dict[str, list[float]]:
    """ms of each run per side (and of the bare interpreter, "python"),
    the sides alternating their order from run to run."""
    bare = [python, "-c", "pass"]
    order = [s for s in sides if not (cmd.ours_only and s == "reference")]
    for side in order:                                   # warm-up
        argv, env = sides[side]
        timed([*argv, *cmd.words(side, 0)], env)
    timed(bare, sides["bk"][1])
    times: dict[str, list[float]] = {s: [] for s in ["python", *order]}
    for run in range(1, runs + 1):
        times["python"].append(timed(bare, sides["bk"][1]))
        for side in (order if run % 2 else order[::-1]):
            argv, env = sides[side]
            times[side].append(timed([*argv, *cmd.words(side, run)], env))
    return times


def write_cells(path: str, cells: dict, settings: dict) -> None:
    from cells import write_cells as write

    write(path, "cli", cells, settings)


def _cell(value: float, samples: list[float], stat: str = "median", unit: str = "s") -> dict:
    return {"value": value, "unit": unit, "stat": stat, "samples": samples}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time everyday bk commands (see the module docstring).")
    parser.add_argument("--runs", type=int, default=10, help="measured runs per cell (default 10)")
    parser.add_argument("--sizes", default="0,1000,10000", help="live bookings per ledger (default 0,1000,10000)")
    parser.add_argument("--python", default="/usr/bin/python3", help="interpreter (default /usr/bin/python3)")
    parser.add_argument("--pyz", default=str(ROOT / "dist" / "bk.pyz"), help="the archive (default dist/bk.pyz)")
    parser.add_argument("--reference", metavar="VENV",
                        help="also time the reference implementation installed in VENV "
                             "(pip install gpubk==0.2.8), side by side on the same ledgers")
    parser.add_argument("--json", nargs="?", const="-", metavar="PATH",
                        help="alone: print the results as JSON too; with PATH: write every cell "
                             "(seconds, with the raw samples) to PATH for benchmarks/ab.py")
    args = parser.parse_args(argv)
    if not os.path.exists(args.pyz):
        print(f"error: {args.pyz} does not exist\nhint: python3 build.py", file=sys.stderr)
        return 2
    ref_bk = os.path.join(args.reference, "bin", "bk") if args.reference else None
    if ref_bk and not os.path.exists(ref_bk):
        print(f"error: {ref_bk} does not exist\nhint: python3 -m venv {args.reference} && "
              f"{args.reference}/bin/pip install gpubk==0.2.8", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.sizes.split(",")]
    results = []
    cells: dict[str, dict] = {}
    print(f"{args.python} {args.pyz}: median of {args.runs} runs after a warm-up, milliseconds"
          + (f"; reference: {ref_bk}, alternating" if ref_bk else ""))
    print(f"{'bookings':>8}  {'command':<16} {'bk':>7} {'python':>7} {'over':>6}"
          + (f" {'ref':>7} {'bk/ref':>6}" if ref_bk else "") + "  target")
    failed = 0
    for n in sizes:
        tmp = tempfile.mkdtemp(prefix="bk-bench-")
        try:
            cfg = Path(tmp, "cfg", "bk")
            cfg.mkdir(parents=True)
            (cfg / "config.json").write_text(json.dumps({"booking_horizon_days": 60}))
            env = env_for(tmp, os.path.join(tmp, "data"))
            sides = {"bk": ([args.python, args.pyz], env)}
            from bk.service import open_app

            call = open_app(env).call()
            now, slot, me = call.now, call.policy.slot_seconds, (call.actor.uid, call.actor.user)
            facts = bulk(n, now, slot, me)
            t0 = time.perf_counter()
            seed_ours(env, facts, now)
            seeded = (time.perf_counter() - t0) * 1000
            if ref_bk:
                ref_env = env_for(tmp, os.path.join(tmp, "ref-data"))
                # VENV's python (a link to the same interpreter) so that the venv's packages are seen.
                ref_argv = [os.path.join(args.reference, "bin", "python"), ref_bk]
                timed([*ref_argv, "l"], ref_env)            # makes its data directory
                seed_reference(args.reference, ref_env, facts, now)
                sides["reference"] = (ref_argv, ref_env)
            if n:
                print(f"{n:>8}  (seeded in {seeded:.0f} ms)")
            extra_seeded = False
            for cmd in COMMANDS:
                if cmd.write and not extra_seeded:
                    more = specials(n, args.runs, now, slot, me)
                    seed_ours(env, more, now)
                    if ref_bk:
                        seed_reference(args.reference, sides["reference"][1], more, now)
                    extra_seeded = True
                times = measure(sides, cmd, args.runs, args.python)
                bk_ms, bare_ms = statistics.median(times["bk"]), statistics.median(times["python"])
                over = bk_ms - bare_ms
                ref_ms = statistics.median(times["reference"]) if "reference" in times else None
                # Paired: run i of ours against run i of the reference, made
                # back to back, so a busy moment of the machine hits both.
                ratio = statistics.median(b / r for b, r in zip(
                    times["bk"], times["reference"], strict=True)) if ref_ms else None
                checks = []
                if n == 0:
                    checks.append(("over", over, OVER_TARGET))
                elif cmd.name != "--version":
                    checks.append(("bk", bk_ms, TARGETS.get(n, TARGETS[10000])))
                if ratio is not None and n in RATIO_TARGETS:
                    checks.append(("bk/ref", ratio, RATIO_TARGETS[n]))
                ok = all(v <= t for _, v, t in checks)
                failed += not ok
                target = ", ".join(f"{what} <= {t:g}" for what, _, t in checks)
                line = f"{n:>8}  {cmd.name:<16} {bk_ms:7.1f} {bare_ms:7.1f} {over:6.1f}"
                if ref_bk:
                    line += (f" {ref_ms:7.1f} {ratio:6.2f}" if ref_ms else f" {'-':>7} {'-':>6}")
                print(line + (f"  {'ok' if ok else 'OVER'} ({target})" if checks else ""))
                results.append({"bookings": n, "command": cmd.name, "bk_ms": round(bk_ms, 1),
                                "python_ms": round(bare_ms, 1), "over_ms": round(over, 1),
                                "reference_ms": round(ref_ms, 1) if ref_ms else None,
                                "ratio": round(ratio, 3) if ratio else None, "ok": ok})
                key = f"{n} {cmd.name}"
                cells[f"{key} [bk]"] = _cell(bk_ms / 1000, [t / 1000 for t in times["bk"]])
                cells[f"{key} [python]"] = _cell(bare_ms / 1000, [t / 1000 for t in times["python"]])
                cells[f"{key} [over]"] = _cell(
                    over / 1000, [(b - p) / 1000 for b, p in zip(times["bk"], times["python"], strict=True)],
                    "difference of medians")
                if ref_ms:
                    cells[f"{key} [reference]"] = _cell(ref_ms / 1000, [t / 1000 for t in times["reference"]])
                    cells[f"{key} [ratio]"] = _cell(ratio, [b / r for b, r in zip(
                        times["bk"], times["reference"], strict=True)], "median of paired ratios", "x")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json == "-":
        print(json.dumps(results, indent=1))
    elif args.json:
        write_cells(args.json, cells, {"runs": args.runs, "sizes": sizes, "python": args.python,
                                       "pyz": args.pyz, "reference": args.reference})
    print(f"{len(results) - failed}/{len(results)} within target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
