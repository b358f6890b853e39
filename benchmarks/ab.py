"""A/B comparison of two checkouts: ``benchmarks/cli.py`` and ``benchmarks/broker.py``.

    python3 benchmarks/ab.py --before DIR --after DIR [--rounds 3] [--quick]
                             [--bench cli] [--bench broker] [--keep DIR]
                             [--threshold-pct 5] [--threshold-ms 0.5]
                             [--cli-args "..."] [--broker-args "..."]

DIR is the root of a checkout of this project, e.g. the commit before a
change as a worktree next to the working tree with the change::

    git worktree add /tmp/bk-before 7fd836e
    python3 benchmarks/ab.py --before /tmp/bk-before --after .

What it runs.  First each tree's own ``python3 build.py`` (once per tree), so
that each ``dist/bk.pyz`` is built from that tree's sources.  Then, per round,
per benchmark, both trees one after the other: the tree's *own*
``benchmarks/<name>.py --json FILE`` as a subprocess with ``cwd`` set to that
tree, so each side measures its own code with its own benchmark script (the
broker benchmark imports the service API in-process, and that API may differ
between the two trees).  The order of the two sides flips every round
(before, after; after, before; ...), so a slow drift of the machine does not
favour one side.  ``PYTHONPATH`` is removed from the children's environment.

What it prints.  Per benchmark one table: every cell of that benchmark's own
table (see the ``--json PATH`` format in the docstrings of cli.py and
broker.py), before and after as the median of the per-round values, and the
change in per cent.  Times are shown in milliseconds.  Every cell is "lower
is better" except those marked ``"better": "higher"`` (the broker's "vs 1"
scaling ratios).  A cell is flagged ``<< SLOWER`` when after is worse than
before by more than ``--threshold-pct`` (default 5 %) *and*, for times, by
more than ``--threshold-ms`` (default 0.5 ms); both must hold, so that tiny
cells (the ``[over]`` and ``broker adds`` differences) do not flag on noise.
The absolute floor applies to whole times (unit ``s``) only: the broker's
throughput cells (seconds per booking, about 1-3 ms, one sample per round)
are judged by the per cent alone, so expect those to flag on noise with one
round.  The "vs 1" ratios are not speeds (the ratio drops when one client
gets faster): a drop beyond the per cent is marked ``(lower ratio)`` but not
counted as slower; the throughput cells they derive from are judged.  cli.py's ``[python]`` cells time the bare interpreter,
not bk: they show how much the machine itself drifted between the sides.
A cell only one side has is shown with ``-`` on the other and marked
``only before``/``only after``.  Run the same tree as both sides (an A/A
run) to see how much the cells move on noise alone on this machine.

``--quick`` runs ``cli.py --runs 5`` and ``broker.py --quick`` (100
bookings) instead of their defaults (10 runs; 300 bookings).
``--cli-args``/``--broker-args`` append further arguments (one string, split
like a shell would), e.g. ``--cli-args "--sizes 0,1000"``.  ``--keep DIR``
keeps every run's JSON and printed table as
``DIR/r<round>-<side>-<bench>.{json,txt}``.

Exit status: 0 when every run produced its cells, slow cells or not (this is
a report, not a gate); 2 on errors (a tree without the scripts, a failed
build, a benchmark that died or wrote no cells).  broker.py exits 1 when it
misses one of its own targets; that is reported but is not an error here.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

BENCHES = ("cli", "broker")
QUICK = {"cli": ["--runs", "5"], "broker": ["--quick"]}
SIDES = ("before", "after")


class Failed(Exception):
    """A run that gave no cells; the message says why."""


def child_env() -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def check_tree(label: str, root: str, benches: list[str]) -> str:
    root = os.path.realpath(root)
    missing = [p for p in ["build.py", *(f"benchmarks/{b}.py" for b in benches)]
               if not os.path.isfile(os.path.join(root, p))]
    if missing:
        raise Failed(f"--{label} {root}: no {', '.join(missing)} (not a checkout of this project?)")
    return root


def build(python: str, label: str, root: str) -> None:
    t0 = time.perf_counter()
    proc = subprocess.run([python, "build.py"], cwd=root, env=child_env(), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise Failed(f"{label}: python3 build.py in {root} exited {proc.returncode}:\n"
                     f"{(proc.stdout + proc.stderr)[-2000:]}")
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    print(f"built {label:<6} {root}: {last} ({time.perf_counter() - t0:.1f} s)", flush=True)


def run_bench(python: str, root: str, bench: str, extra: list[str], out: str, timeout: float
              ) -> tuple[dict, int, str, float]:
    """Run ``benchmarks/<bench>.py`` of ``root``; (its cells, exit status, stdout, seconds)."""
    if os.path.exists(out):
        os.unlink(out)
    cmd = [python, os.path.join("benchmarks", f"{bench}.py"), *extra, "--json", out]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=root, env=child_env(), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Failed(f"{root}: {shlex.join(cmd)} ran over {timeout:.0f} s") from None
    wall = time.perf_counter() - t0
    if not os.path.exists(out):
        hint = ""
        if "unrecognized arguments" in proc.stderr or "expected one argument" in proc.stderr:
            hint = "\nhint: that tree's script predates --json PATH; copy benchmarks/{cli,broker}.py over"
        raise Failed(f"{root}: {shlex.join(cmd)} exited {proc.returncode} and wrote no cells:\n"
                     f"{(proc.stdout + proc.stderr)[-2000:]}{hint}")
    with open(out) as f:
        doc = json.load(f)
    if doc.get("benchmark") != bench or not isinstance(doc.get("cells"), dict):
        raise Failed(f"{out}: not a {bench} cells file")
    return doc["cells"], proc.returncode, proc.stdout, wall


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.2f}" if unit in ("s", "s/booking") else f"{value:.2f}x"


def table(bench: str, rounds: dict[str, list[dict]], pct: float, abs_ms: float) -> tuple[list[str], int]:
    """The comparison table of one benchmark, and how many cells it flags."""
    names: list[str] = []
    for side in SIDES:
        for cells in rounds[side]:
            names.extend(n for n in cells if n not in names)
    rows, flagged = [], 0
    for name in names:
        meta = next(c[name] for side in SIDES for c in rounds[side] if name in c)
        unit, higher = meta.get("unit", "s"), meta.get("better", "lower") == "higher"
        med = {}
        for side in SIDES:
            values = [c[name]["value"] for c in rounds[side] if name in c]
            med[side] = statistics.median(values) if values else None
        b, a = med["before"], med["after"]
        change, flag = "", ""
        if b is None or a is None:
            flag = "only before" if a is None else "only after"
        else:
            if b:
                change = f"{(a - b) / abs(b) * 100:+.1f}%"
            worse = (b - a) if higher else (a - b)
            if worse > pct / 100 * abs(b) and (unit != "s" or worse > abs_ms / 1000):
                if unit == "ratio":
                    flag = "(lower ratio)"
                else:
                    flag = "<< SLOWER"
                    flagged += 1
        rows.append((name, fmt(b, unit), fmt(a, unit), change, flag))
    w = max([len("cell"), *(len(r[0]) for r in rows)])
    n = {side: len(rounds[side]) for side in SIDES}
    lines = [f"{bench}: median over {n['before']}/{n['after']} rounds (before/after); "
             f"times in ms, lower is better except ratios (x)",
             f"{'cell':<{w}}  {'before':>9}  {'after':>9}  {'change':>8}"]
    lines += [f"{r[0]:<{w}}  {r[1]:>9}  {r[2]:>9}  {r[3]:>8}  {r[4]}".rstrip() for r in rows]
    lines.append(f"{flagged} of {len(rows)} cells slower by more than {pct:g} %"
                 f" (and {abs_ms:g} ms for times)")
    return lines, flagged


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, metavar="DIR", help="root of the checkout before the change")
    ap.add_argument("--after", required=True, metavar="DIR", help="root of the checkout after the change")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each running both trees (default 3)")
    ap.add_argument("--quick", action="store_true", help="cli.py --runs 5, broker.py --quick")
    ap.add_argument("--bench", action="append", choices=BENCHES,
                    help="only this benchmark (repeatable; default: cli and broker)")
    ap.add_argument("--cli-args", default="", help="more arguments for cli.py (one string)")
    ap.add_argument("--broker-args", default="", help="more arguments for broker.py (one string)")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter for build.py and the benchmark scripts (default: this one)")
    ap.add_argument("--threshold-pct", type=float, default=5.0, help="flag cells worse by more (default 5)")
    ap.add_argument("--threshold-ms", type=float, default=0.5,
                    help="...and, for times, by more than this many ms (default 0.5)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per benchmark run (default 1800)")
    ap.add_argument("--keep", metavar="DIR", help="keep every run's JSON and output in DIR")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    benches = list(dict.fromkeys(args.bench or BENCHES))
    extra = {b: [*(QUICK[b] if args.quick else []), *shlex.split(getattr(args, f"{b}_args"))]
             for b in benches}
    work = args.keep or tempfile.mkdtemp(prefix="bk-ab-")
    os.makedirs(work, exist_ok=True)
    t_start = time.perf_counter()
    try:
        trees = {side: check_tree(side, getattr(args, side), benches) for side in SIDES}
        same = trees["before"] == trees["after"]
        if same:
            print(f"before and after are the same tree ({trees['before']}): an A/A run, the changes are noise")
        for side in SIDES[:1] if same else SIDES:
            build(args.python, side, trees[side])
        for b in benches:
            print(f"{b}.py args: {shlex.join(extra[b]) or '(defaults)'}")
        results: dict[str, dict[str, list[dict]]] = {b: {s: [] for s in SIDES} for b in benches}
        round_walls = []
        for r in range(1, args.rounds + 1):
            t_round = time.perf_counter()
            order = SIDES if r % 2 else SIDES[::-1]
            for b in benches:
                for side in order:
                    out = os.path.join(work, f"r{r}-{side}-{b}.json")
                    cells, rc, stdout, wall = run_bench(args.python, trees[side], b, extra[b], out,
                                                        args.timeout)
                    if args.keep:
                        with open(os.path.join(work, f"r{r}-{side}-{b}.txt"), "w") as f:
                            f.write(stdout)
                    results[b][side].append(cells)
                    note = f"; exit {rc} (missed one of its own targets)" if rc else ""
                    print(f"round {r}/{args.rounds}  {b:<6} {side:<6} {wall:6.1f} s, "
                          f"{len(cells)} cells{note}", flush=True)
            round_walls.append(time.perf_counter() - t_round)
            print(f"round {r}/{args.rounds} took {round_walls[-1]:.1f} s", flush=True)
    except Failed as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(f"before: {trees['before']}\nafter:  {trees['after']}")
    total = 0
    for b in benches:
        lines, flagged = table(b, results[b], args.threshold_pct, args.threshold_ms)
        total += flagged
        print()
        print("\n".join(lines))
    print()
    print(f"{total} cell{'s' if total != 1 else ''} flagged slower; {args.rounds} round"
          f"{'s' if args.rounds != 1 else ''} of {statistics.mean(round_walls):.1f} s each on average; "
          f"{time.perf_counter() - t_start:.0f} s in all")
    if args.keep:
        print(f"raw results in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
