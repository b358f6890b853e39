"""``bk t``: the time to render one frame, and the CPU an idle screen costs.

    python3 build.py && python3 benchmarks/tui.py [--frames 200] [--idle-seconds 20] [--sizes 2,1000]

Frame render: ``bk.tui.render.render`` (the grid, the table, the header and
panes: everything but curses' own output) of a world with 8 GPUs and 1,000
shared 30-minute bookings, all of them inside the window shown, at 160x48
(15 minutes a column, 38 hours) and at 80x24 (30 minutes a column, 36
hours); median and 95th percentile of ``--frames`` renders, and the same
with a booking form open (the draft overlay).  Target (issue 14): under
10 ms.

Idle CPU: the built ``dist/bk.pyz t`` in a detached tmux of 120x40 on a
private simulated 8-GPU server seeded with N live bookings (the ledger
``benchmarks/cli.py`` seeds), left alone for ``--idle-seconds``; its user
plus system CPU time from ``/proc/PID/stat`` over that time, as a share of
one core.  It refreshes the world once a second (a read of the committed
ledger) and wakes every 200 ms for keys.  Target: under 1% of a core.
This is a report, not a test: it prints a table.
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
from datetime import timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

RENDER_TARGET_MS = 10.0
IDLE_TARGET_PCT = 1.0


def big_world(n: int = 1000, gpus: int = 8):
    from bk.core.models import Policy, Reservation
    from bk.tui.world import World

    now = 1_783_939_290
    first = now - now % 1800
    res = []
    for i in range(n):
        # GPU i % 8; each GPU's two share slots taken in turn, half an hour
        # each: 125 bookings a GPU fill 31 hours.
        g, k = i % gpus, i // gpus
        start = first + (k // 2) * 1800 + (k % 2) * 900
        uid, user = (1000, "ada") if i % 100 == 0 else (20000 + i % 17, f"user{i % 17}")
        res.append(Reservation(id=str(uuid.UUID(int=i + 1, version=4)), uid=uid, user=user, mode="shared",
                               gpus=(g,), share=1, start=start, end=start + 1800, created=now - 10))
    return World(now=now, tz=timezone.utc, policy=Policy(gpu_count=gpus), actor_uid=1000, actor_user="ada",
                 reservations=tuple(res), monitor={"state": "running"}, seq=1)


def time_frames(frames: int) -> list[tuple[str, float, float, int]]:
    from bk.tui import keys, render, theme

    w = big_world()
    rows = []
    for size, step in (((160, 48), 900), ((80, 24), 1800)):
        for form in (False, True):
            st = keys.ViewState(width=size[0], height=size[1], step=step)
            if form:
                st, _ = keys.handle(st, "a", w)
            frm, n, _ = keys.window(st, w)
            in_view = sum(1 for r in w.reservations if r.start < frm + n * step and r.end > frm)
            th = theme.THEMES["dark"]
            render.render(st, w, size, th, theme.UNICODE)           # warm-up
            times = []
            for _ in range(frames):
                t0 = time.perf_counter()
                render.render(st, w, size, th, theme.UNICODE)
                times.append((time.perf_counter() - t0) * 1000)
            times.sort()
            label = f"{size[0]}x{size[1]}{' form' if form else ''}"
            rows.append((label, statistics.median(times), times[int(len(times) * 0.95) - 1], in_view))
    return rows


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])          # utime, stime (fields 14 and 15)


def idle_cpu(pyz: str, python: str, bookings: int, seconds: float) -> float:
    from cli import seed

    tmp = tempfile.mkdtemp(prefix="bk-tui-bench-")
    sock = f"bk-tui-bench-{uuid.uuid4().hex[:8]}"
    try:
        cfg = Path(tmp, "cfg", "bk")
        cfg.mkdir(parents=True)
        (cfg / "config.json").write_text(json.dumps({"booking_horizon_days": 60}))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "LANG": "C.UTF-8",
               "LC_ALL": "C.UTF-8", "BK_DATA_DIR": os.path.join(tmp, "data"), "BK_GPU_COUNT": "8",
               "XDG_CONFIG_HOME": os.path.join(tmp, "cfg"), "XDG_STATE_HOME": os.path.join(tmp, "state"),
               "TZ": "UTC", "TERM": "screen"}
        seed(env, bookings)
        envs = [f"{k}={v}" for k, v in env.items()]
        subprocess.run(["tmux", "-L", sock, "-f", "/dev/null", "new-session", "-d", "-x", "120", "-y", "40",
                        "env", "-i", *envs, python, pyz, "t"], check=True)
        pid = int(subprocess.run(["tmux", "-L", sock, "display", "-p", "#{pane_pid}"], check=True,
                                 capture_output=True, text=True).stdout)
        deadline = time.monotonic() + 30
        while True:
            screen = subprocess.run(["tmux", "-L", sock, "capture-pane", "-p"], capture_output=True,
                                    text=True).stdout
            if "the tour" in screen:
                subprocess.run(["tmux", "-L", sock, "send-keys", "q"], check=True)
            elif "Bookings:" in screen:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"bk t did not start:\n{screen}")
            time.sleep(0.1)
        time.sleep(2)                                 # past start-up and the first loads
        t0, c0 = time.monotonic(), cpu_ticks(pid)
        time.sleep(seconds)
        t1, c1 = time.monotonic(), cpu_ticks(pid)
        return (c1 - c0) / os.sysconf("SC_CLK_TCK") / (t1 - t0) * 100
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="bk t frame time and idle CPU (see the module docstring).")
    p.add_argument("--frames", type=int, default=200, help="renders per cell (default 200)")
    p.add_argument("--idle-seconds", type=float, default=20.0, help="idle measurement (default 20)")
    p.add_argument("--sizes", default="2,1000", help="live bookings for the idle runs (default 2,1000)")
    p.add_argument("--python", default=sys.executable, help="interpreter for the archive")
    p.add_argument("--pyz", default=str(ROOT / "dist" / "bk.pyz"), help="the archive (default dist/bk.pyz)")
    args = p.parse_args(argv)
    print("frame render, 8 GPUs, 1,000 bookings (ms)")
    print(f"{'screen':<14} {'median':>7} {'p95':>7} {'in view':>8}  target < {RENDER_TARGET_MS:g} ms")
    for label, med, p95, n in time_frames(args.frames):
        print(f"{label:<14} {med:7.2f} {p95:7.2f} {n:8d}  {'ok' if p95 < RENDER_TARGET_MS else 'OVER'}")
    if shutil.which("tmux") is None or not os.path.exists(args.pyz):
        print("idle CPU: skipped (needs tmux and dist/bk.pyz: python3 build.py)")
        return 0
    print(f"\nidle CPU of bk t in tmux over {args.idle_seconds:g} s (% of one core)")
    for n in (int(x) for x in args.sizes.split(",")):
        pct = idle_cpu(args.pyz, args.python, n, args.idle_seconds)
        print(f"{n:>6} bookings  {pct:6.2f}%  {'ok' if pct < IDLE_TARGET_PCT else 'OVER'} (target < "
              f"{IDLE_TARGET_PCT:g}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
