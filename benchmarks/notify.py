"""Notification benchmark: how late an event reaches a terminal, and what an
idle deliverer costs.

    python3 benchmarks/notify.py [--events N] [--per-second K] [--idle SECONDS] [--dir DIR]

Latency.  The real deliverer (``bk.notify.deliverer.Deliverer``: its timers,
the delivery log written with fsync before and after each event, the
terminal found through /proc and written like write(1)) with a host that
hands it ``--events`` events (200) due ``--per-second`` (5) at a time on the
next whole seconds of the real clock.  A pty owned by this user, held open
by a child process, is the terminal; a thread reads its master and notes
when each event's line arrived.  Latency is that instant minus the event's
due time.  Issue 26's bound: at most 5 s.

Idle CPU.  A real ``bk w start`` (the worker, whose deliverer thread runs in
it) on a private data directory with one booking an hour ahead, for
``--idle`` seconds: user plus system time from ``/proc/PID/stat`` divided by
the wall time, as a percentage of one core.

Prints the numbers; it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class StubHost:
    """The host side reduced to a list of due events (the rules are
    bk.core.notify's, measured in tests; this measures the delivery)."""

    def __init__(self, events):
        from datetime import timezone

        from bk.core import notify as N
        from bk.service.notify import Prefs

        self.events_ = events
        self.uid = os.getuid()
        self.tz = timezone.utc
        self._prefs = Prefs(tuple(N.ALL_EVENTS), ("terminal",), None, None, None, None, "json", (10,), (30,),
                            "off", {})

    def refresh(self):
        pass

    def now(self) -> int:
        return int(time.time())

    def time(self) -> float:
        return time.time()

    def prefs(self):
        return self._prefs

    def relay_set(self) -> bool:
        return False

    def events(self, now):
        return self.events_

    def confirm(self, ev, now):
        return ev

    def render(self, ev, now) -> str:
        return f"bench event {ev.key}"

    def doc(self, ev, text, now) -> dict:
        return {"id": ev.key, "title": "bench", "text": text, "host": "bench"}

    def clock_text(self, now) -> str:
        return time.strftime("%H:%M", time.gmtime(now))


def latency(where: Path, n: int, per_second: int) -> None:
    from bk.core import notify as N
    from bk.notify.deliverer import Deliverer
    from bk.notify.files import DeliveryLog

    master, slave = os.openpty()
    os.fchmod(slave, 0o620)
    holder = subprocess.Popen(["sleep", "600"], stdin=slave, stdout=slave, stderr=slave)
    arrived: dict[str, float] = {}
    buf = b""

    def read():
        nonlocal buf
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            t = time.time()
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if b"bench event " in line:
                    arrived.setdefault(line.split(b"bench event ", 1)[1].strip().decode(), t)
    threading.Thread(target=read, daemon=True).start()
    first = int(time.time()) + 2
    evs = [N.Event(N.TEST, f"bench:{i}:{first + i // per_second}", first + i // per_second, first + 3600,
                   os.getuid(), "bench") for i in range(n)]
    d = Deliverer(StubHost(evs), DeliveryLog(str(where / "notify")), senders={})
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    deadline = time.time() + n / per_second + 30
    while len(arrived) < n and time.time() < deadline:
        time.sleep(0.1)
    d.stop()
    holder.kill()
    holder.wait()
    lat = sorted(arrived[e.key] - e.due for e in evs if e.key in arrived)
    if not lat:
        print("latency: no event arrived")
        return

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))]
    print(f"delivery latency over {len(lat)} of {n} events ({per_second} due per second): "
          f"p50 {pct(0.5) * 1000:.0f} ms, p95 {pct(0.95) * 1000:.0f} ms, max {lat[-1] * 1000:.0f} ms")


def idle(where: Path, seconds: float) -> None:
    data = where / "idle"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(where), "BK_DATA_DIR": str(data), "BK_GPU_COUNT": "2",
           "XDG_CACHE_HOME": str(where / "cache"), "PYTHONPATH": str(ROOT), "TZ": "UTC"}
    subprocess.run([sys.executable, "-m", "bk", "1", "30m", "-t", "+1h"], env=env, check=True,
                   capture_output=True)
    p = subprocess.Popen([sys.executable, "-m", "bk", "w", "start"], env=env, stderr=subprocess.PIPE,
                         stdout=subprocess.DEVNULL)
    try:
        line = p.stderr.readline()               # "started"
        while b"notifications" not in line and line:
            line = p.stderr.readline()
        time.sleep(1.0)                          # let start-up settle before measuring
        c0, t0 = cpu_seconds(p.pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = cpu_seconds(p.pid), time.monotonic()
    finally:
        p.terminate()
        p.wait(20)
    print(f"idle worker with its deliverer: {100 * (c1 - c0) / (t1 - t0):.3f}% of one core "
          f"over {t1 - t0:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200)
    ap.add_argument("--per-second", type=int, default=5)
    ap.add_argument("--idle", type=float, default=30.0)
    ap.add_argument("--dir", help="work here (default: a temporary directory)")
    args = ap.parse_args()
    where = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bk-notify-bench-"))
    try:
        latency(where, args.events, args.per_second)
        idle(where, args.idle)
    finally:
        if not args.dir:
            shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
