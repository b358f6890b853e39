"""Worker benchmark: how late a scheduled command starts, and what an idle
worker costs.

    python3 benchmarks/worker.py [--samples N] [--idle SECONDS] [--dir DIR]

Launch latency.  A private data directory with one-minute slots; a real
``bk w start`` process (``python -m bk``); a booking made for the next
minute with a command attached: ``/bin/sh -c 'date +%s.%N > FILE'``, whose
first instruction writes the wall-clock time.  Latency is that time minus
the booking's start.  Each sample waits for the next minute boundary, so
``--samples 3`` takes about three minutes.  Target (issue 13): under 2 s.

Idle CPU.  The same worker, with one job pending an hour ahead, for
``--idle`` seconds: its user plus system time from ``/proc/PID/stat``
divided by the wall time, as a percentage of one core.  Target: under 0.1%.

Log pump.  What a job's log writer (``bk.jobs.logpump``) costs: starting
one (``logs.start_pump``, median of 10), and ``--pump-mib`` MiB of output
written through it into 8 MiB segments, against the same written straight
into a file.

Prints the numbers; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def log_pump(where: Path, mib: int) -> None:
    sys.path.insert(0, str(ROOT))
    from bk.jobs import logs

    jobs = str(where / "jobs")
    starts = []
    for i in range(10):
        t = time.perf_counter()
        w, pump = logs.start_pump(jobs, f"{i:032x}")
        starts.append(time.perf_counter() - t)
        os.close(w)
        pump.wait()
    print(f"log pump start: median {sorted(starts)[5] * 1000:.1f} ms")
    writer = ["head", "-c", str(mib << 20), "/dev/zero"]
    w, pump = logs.start_pump(jobs, "f" * 32)
    t = time.perf_counter()
    subprocess.run(writer, stdout=w, check=True)
    os.close(w)
    pump.wait()
    through = time.perf_counter() - t
    fd = os.open(where / "direct.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    t = time.perf_counter()
    subprocess.run(writer, stdout=fd, check=True)
    os.close(fd)
    direct = time.perf_counter() - t
    kept = sum(os.path.getsize(os.path.join(jobs, "logs", n)) for n in os.listdir(os.path.join(jobs, "logs"))
               if n.startswith("f" * 32))
    print(f"log pump: {mib} MiB in {through:.2f} s ({mib / through:.0f} MiB/s; straight into a file "
          f"{mib / direct:.0f} MiB/s), {kept >> 20} MiB kept")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1, help="launches to time (each waits for a minute boundary)")
    ap.add_argument("--idle", type=float, default=30.0, help="seconds of idle worker to measure")
    ap.add_argument("--dir", help="where the trial data directory goes (default: a temporary one)")
    ap.add_argument("--pump-mib", type=int, default=256, help="MiB of output through the log pump")
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bk-bench-worker-", dir=args.dir))
    log_pump(base / "pump", args.pump_mib)
    (base / "cfg" / "bk").mkdir(parents=True)
    (base / "cfg" / "bk" / "config.json").write_text(json.dumps({"slot_minutes": 1}))
    env = {"BK_DATA_DIR": str(base / "data"), "BK_GPU_COUNT": "4", "HOME": str(base),
           "XDG_CONFIG_HOME": str(base / "cfg"), "XDG_CACHE_HOME": str(base / "cache"),
           "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT), "TZ": "UTC"}

    def bk(*words: str) -> dict:
        p = subprocess.run([sys.executable, "-m", "bk", "--json", *words], env=env, capture_output=True,
                           text=True, cwd=base, timeout=60)
        if p.returncode != 0:
            raise SystemExit(f"bk {' '.join(words)} failed: {p.stdout} {p.stderr}")
        return json.loads(p.stdout)["data"]

    worker = subprocess.Popen([sys.executable, "-m", "bk", "w", "start"], env=env, cwd=base,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        lat = []
        for i in range(args.samples):
            out = base / f"t{i}"
            now = time.time()
            start = int(now) - int(now) % 60 + 60
            if start - now < 5:                        # too close to book before it starts
                start += 60
            r = bk("run", "1", "1m", "--start", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
                   "--", "/bin/sh", "-c", f"date +%s.%N > {out}")["reservation"]
            assert r["start"].endswith(":00Z"), r
            deadline = start + 30
            while not (out.exists() and out.read_text().strip()) and time.time() < deadline:
                time.sleep(0.05)
            if not out.exists():
                raise SystemExit("the job did not start within 30 s of its booking's start")
            lat.append(float(out.read_text()) - start)
            print(f"launch {i + 1}: {lat[-1] * 1000:.0f} ms after the booking's start")
        print(f"launch latency: median {sorted(lat)[len(lat) // 2] * 1000:.0f} ms, max {max(lat) * 1000:.0f} ms "
              f"over {len(lat)} (target under 2000 ms)")
        bk("run", "1", "1m", "-t", "+1h", "--", "true")     # something pending, nothing due
        time.sleep(1.0)
        c0, t0 = cpu_seconds(worker.pid), time.monotonic()
        time.sleep(args.idle)
        c1, t1 = cpu_seconds(worker.pid), time.monotonic()
        pct = 100 * (c1 - c0) / (t1 - t0)
        print(f"idle worker CPU: {pct:.3f}% of one core over {t1 - t0:.0f} s "
              f"({(c1 - c0) * 1000:.0f} ms of CPU; target under 0.1%)")
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
