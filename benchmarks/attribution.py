"""What reading /proc and judging the processes cost per monitor sample.

    python3 benchmarks/attribution.py [--procs 40] [--samples 200]

The monitor (issue 12: under 1 % of one core at a 2 s cadence for 8 GPUs and
40 processes) fills every GPU process from /proc (``bk.gpu.procinfo``) and
judges them against the ledger (``bk.core.telemetry.attribute_all``) on
every sample.  This measures those two steps alone, on ``--procs`` real
processes started here (``python3 script.py --secret ...``, sleeping):

1. ``fill``, warm: one ``ProcInfo`` kept across samples, as the monitor keeps
   its backend, so a known process costs one read of its ``stat``;
2. ``fill``, cold: a new ``ProcInfo`` every sample (every file of every
   process read, user names looked up), what a one-shot ``bk st`` on NVML pays;
3. ``attribute_all`` of 8 GPUs and the processes against 40 running bookings.

CPU time (``time.process_time``) per sample, and the share of one core at
the 2 s cadence.  A report, not a test: it prints a table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GPUS = 8
CADENCE_S = 2.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=40)
    ap.add_argument("--samples", type=int, default=200)
    args = ap.parse_args(argv)

    from bk.core.models import GpuInfo, GpuProcess, Reservation
    from bk.core.telemetry import Snapshot, attribute_all
    from bk.gpu.procinfo import ProcInfo

    tmp = Path(tempfile.mkdtemp(prefix="bk-bench-attr-"))
    script = tmp / "train.py"
    script.write_text("import sys, time\nsys.stdout.write('up\\n'); sys.stdout.flush()\ntime.sleep(600)\n")
    procs = []
    try:
        for i in range(args.procs):
            p = subprocess.Popen([sys.executable, str(script), "--secret", str(i)], stdout=subprocess.PIPE,
                                 stdin=subprocess.DEVNULL)
            procs.append(p)
        for p in procs:
            p.stdout.readline()
        pids = [p.pid for p in procs]

        def sample(info: ProcInfo) -> Snapshot:
            per = [pids[i::GPUS] for i in range(GPUS)]
            return Snapshot(0, "bench", tuple(GpuInfo(g, f"GPU-{g}", "G", util=50,
                                                      processes=[info.fill(GpuProcess(pid, mem_mib=1024))
                                                                 for pid in per[g]])
                                              for g in range(GPUS)), (), False)

        def per_sample(fn) -> float:
            fn()                                    # warm-up
            t0 = time.process_time()
            for _ in range(args.samples):
                fn()
            return (time.process_time() - t0) / args.samples

        warm = ProcInfo()
        warm_s = per_sample(lambda: sample(warm))
        cold_s = per_sample(lambda: sample(ProcInfo()))
        snap = sample(warm)
        now = int(time.time())
        uid = os.getuid()
        books = [Reservation(id=f"r{i}", uid=uid if i == 0 else 5000 + i, user=f"u{i}", mode="shared",
                             gpus=(i % GPUS,), share=1, start=now - 60, end=now + 3600, created=now - 60)
                 for i in range(40)]
        judge_s = per_sample(lambda: attribute_all(snap, books, now))
        labels = sorted({p.label for g in snap.gpus for p in g.processes})
    finally:
        for p in procs:
            p.kill()
            p.wait()
        script.unlink()
        tmp.rmdir()

    print(f"{args.procs} real processes on {GPUS} GPUs, {args.samples} samples each "
          f"(labels seen: {', '.join(labels)})")
    print(f"{'step':<34}{'CPU per sample':>16}{'of one core at 2 s':>22}")
    for name, s in (("fill from /proc, warm cache", warm_s), ("fill from /proc, cold", cold_s),
                    ("attribute_all, 40 bookings", judge_s)):
        print(f"{name:<34}{s * 1e3:>13.3f} ms{s / CADENCE_S * 100:>20.3f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
