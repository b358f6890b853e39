"""What hard enforcement costs and how fast it switches (issue 31).

    sudo python3 benchmarks/enforce.py [--runs 5] [--users 100] [--bookings 1000] [--seconds 60]

Root only: it loads real cgroup device programs and attaches them to a
private cgroup subtree (``bk-enforce-bench-<random>`` below the cgroup v2
root, removed at the end), and judges them by opening device nodes made
with ``mknod`` (char 195:N) in a temporary directory: ENXIO means allowed
(no driver answers), EPERM refused.  Nothing else of the machine is touched.

1. Switch at a booking boundary.  A booking of GPU 0 that ends (or starts)
   at the next whole second but one; the enforcer (``bk.enforce.daemon``,
   in this process) attaches its program once; a prober process in the
   user's slice opens the node in a tight loop and notes the wall clock of
   the first refused (allowed) open.  The latency is that time minus the
   boundary: the program compares the boot clock itself, so no process has
   to wake.  ``--runs`` of each, median and worst.
2. Switch on a ledger change.  A real ledger (private mode, a temporary
   data directory) written by ``bk.pyz`` (``bk 1 10m -g 0``, then ``bk d 1
   -y``) while the enforcer loop (``serve``, with inotify on the data
   directory) runs in a thread; the latency is the prober's first allowed
   (refused) open minus the new ledger file's modification time.
3. The enforcer's CPU.  ``serve`` in a child process governing ``--users``
   slices with ``--bookings`` bookings spread over them and 8 GPUs, left
   alone for ``--seconds``: user + system CPU from ``/proc/PID/stat`` over
   that time, as a share of one core (it wakes every 2 s to rescan and
   renews every program every 20 s).  Also one renewal pass (every program
   regenerated, loaded and swapped in), and one pass with nothing to do.

A report, not a test: it prints a table.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bk import daemon as frame  # noqa: E402
from bk.core import enforce as rule  # noqa: E402
from bk.core.models import Reservation  # noqa: E402
from bk.enforce import cgroups, daemon, kernel  # noqa: E402

GPUS = 8
UID = 60_000

PROBE = r"""
import errno, os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
path, want, deadline = sys.argv[2], sys.argv[3], time.time() + float(sys.argv[4])
print("ready", flush=True)
while time.time() < deadline:
    try:
        os.close(os.open(path, os.O_RDWR)); r = "opened"
    except OSError as e:
        r = errno.errorcode[e.errno]
    if r == want:
        print(time.time_ns(), flush=True)
        break
else:
    print("none", flush=True)
"""


def res(uid: int, gpus, start: int, end: int) -> Reservation:
    return Reservation(id=secrets.token_hex(16), uid=uid, user=f"u{uid}", mode="shared", gpus=tuple(gpus),
                       share=1, start=start, end=end, created=start)


class Tree:
    def __init__(self):
        self.mount = cgroups.find_root()
        self.path = Path(self.mount) / f"bk-enforce-bench-{secrets.token_hex(4)}"
        self.path.mkdir()

    def make(self, rel: str) -> Path:
        p = self.path / rel
        p.mkdir(parents=True, exist_ok=True)
        return p

    def cleanup(self) -> None:
        for d, _subdirs, files in sorted(os.walk(self.path), key=lambda x: -x[0].count("/")):
            if "cgroup.procs" in files:
                for pid in Path(d, "cgroup.procs").read_text().split():
                    try:
                        os.kill(int(pid), 9)
                    except ProcessLookupError:
                        pass
        deadline = time.monotonic() + 10
        for d, _subdirs, _files in sorted(os.walk(self.path), key=lambda x: -x[0].count("/")):
            while True:
                try:
                    os.rmdir(d)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)


def node(tmp: Path, minor: int) -> Path:
    p = tmp / f"nvidia{minor}"
    os.mknod(p, 0o666 | 0o020000, os.makedev(195, minor))
    os.chmod(p, 0o666)
    return p


def options(tree: Tree, state: Path, **kw) -> daemon.Options:
    return daemon.Options(root=str(tree.path), state_dir=str(state), fail_open=True, links=True, **kw)


def prober(leaf: Path, path: Path, want: str, seconds: float) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", PROBE, str(leaf / "cgroup.procs"), str(path), want, str(seconds)],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def first(p: subprocess.Popen) -> int | None:
    out = p.stdout.readline().strip()
    p.wait()
    return None if out == "none" else int(out)


def boundary(tree: Tree, tmp: Path, runs: int) -> dict:
    """The program's own switch at a booking's end and start."""
    leaf = tree.make(f"user.slice/user-{UID}.slice/session-1.scope")
    nv0 = node(tmp, 0)
    out = {"end": [], "start": []}
    for kind in ("end", "start"):
        for _ in range(runs):
            t = int(time.time()) + 2
            book = [res(UID, [0], t - 600, t)] if kind == "end" else [res(UID, [0], t, t + 600)]
            e = daemon.Enforcer(options(tree, tmp / "state"), devices=rule.index_map(GPUS),
                                read_ledger=lambda b=book: b, log=lambda line: None)
            e.step()
            p = prober(leaf, nv0, "EPERM" if kind == "end" else "ENXIO", 10)
            seen = first(p)
            e.shutdown(detach=True)
            if seen is not None:
                out[kind].append((seen - t * 1_000_000_000) / 1e6)
    return out


def ledger_change(tree: Tree, tmp: Path, runs: int, pyz: Path) -> dict:
    """From the ledger's new file to the program that follows it."""
    from bk.store.ledger import Store

    leaf = tree.make(f"user.slice/user-{UID}.slice/session-2.scope")
    nv1 = node(tmp, 1)
    data = tmp / "data"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp), "BK_DATA_DIR": str(data), "BK_GPU_COUNT": str(GPUS),
           "XDG_STATE_HOME": str(tmp / "xdg"), "TZ": "UTC", "LANG": "C.UTF-8"}
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    subprocess.run([py, str(pyz), "l"], env=env, check=True, capture_output=True)
    store = Store(str(data), private=True, owner_uid=0)
    # The bookings are root's (this process books them); the slice is UID's: the
    # reader hands the enforcer root's bookings as UID's.
    memo = {}

    def read():
        st = os.stat(store.paths.ledger) if os.path.exists(store.paths.ledger) else None
        stamp = st and (st.st_ino, st.st_mtime_ns)
        if stamp is None or memo.get("stamp") != stamp:
            rs = store.read().state.reservations
            memo["stamp"], memo["value"] = stamp, [r.replace(uid=UID) for r in rs]
        return memo.get("value", [])

    e = daemon.Enforcer(options(tree, tmp / "state2"), devices=rule.index_map(GPUS), read_ledger=read,
                        log=lambda line: None)
    watch = daemon.Watch([str(tree.path), str(data)])
    stop = frame.Stop()
    th = threading.Thread(target=daemon.serve, args=(e, watch, stop), daemon=True)
    th.start()
    out = {"book": [], "cancel": []}
    try:
        for run in range(runs + 1):                     # the first round makes the data directory: not counted
            for kind, argv, want in (("book", ["1", "10m", "-g", "1"], "ENXIO"), ("cancel", ["d", "1", "-y"], "EPERM")):
                p = prober(leaf, nv1, want, 20)
                subprocess.run([py, str(pyz), *argv], env=env, check=True, capture_output=True)
                mtime = os.stat(store.paths.ledger).st_mtime_ns
                seen = first(p)
                if seen is not None and run:
                    out[kind].append((seen - mtime) / 1e6)
    finally:
        stop.set()
        th.join(10)
        e.shutdown(detach=True)
        watch.close()
        stop.close()
    return out


def world(users: int, bookings: int, seed: int = 7) -> list[Reservation]:
    rng = random.Random(seed)
    now = int(time.time()) // 60 * 60
    out = []
    for _ in range(bookings):
        start = now + rng.randrange(-6, 48) * 3600
        out.append(res(UID + rng.randrange(users), rng.sample(range(GPUS), rng.choice([1, 1, 2, 4])), start,
                       start + rng.choice([1, 2, 4, 8]) * 3600))
    return out


def cpu(tree: Tree, tmp: Path, users: int, bookings: int, seconds: float) -> dict:
    for u in range(users):
        tree.make(f"user.slice/user-{UID + u}.slice")
    book = world(users, bookings)
    e = daemon.Enforcer(options(tree, tmp / "state3"), devices=rule.index_map(GPUS), read_ledger=lambda: book,
                        log=lambda line: None)
    t0 = time.perf_counter()
    e.step()
    first_pass = time.perf_counter() - t0
    t0 = time.perf_counter()
    e.step()
    idle_pass = time.perf_counter() - t0
    e.expiry_s = None                                     # force a renewal: every program regenerated
    t0 = time.perf_counter()
    e.step()
    renewal = time.perf_counter() - t0
    e.shutdown(detach=True)

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        e2 = daemon.Enforcer(options(tree, tmp / "state4"), devices=rule.index_map(GPUS),
                             read_ledger=lambda: book, log=lambda line: None)
        watch = daemon.Watch([str(tree.path), str(tree.path / "user.slice")])
        stop = frame.Stop()

        def stopper():
            os.read(r, 1)
            stop.set()

        threading.Thread(target=stopper, daemon=True).start()
        daemon.serve(e2, watch, stop)
        e2.shutdown(detach=True)
        os._exit(0)
    os.close(r)

    def ticks() -> int:
        f = Path(f"/proc/{pid}/stat").read_text()
        rest = f[f.rindex(")") + 2:].split()
        return int(rest[11]) + int(rest[12])

    time.sleep(3)                                         # the first pass and the first attachments
    a, t_a = ticks(), time.monotonic()
    time.sleep(seconds)
    b, t_b = ticks(), time.monotonic()
    os.write(w, b"x")
    os.waitpid(pid, 0)
    os.close(w)
    hz = os.sysconf("SC_CLK_TCK")
    return {"first_pass_ms": first_pass * 1e3, "idle_pass_ms": idle_pass * 1e3, "renewal_ms": renewal * 1e3,
            "cpu_pct": 100 * (b - a) / hz / (t_b - t_a), "seconds": t_b - t_a, "targets": len(e.slots) or users}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--users", type=int, default=100)
    ap.add_argument("--bookings", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--pyz", default=str(ROOT / "dist" / "bk.pyz"))
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root: it loads and attaches BPF programs", file=sys.stderr)
        return 2
    support = kernel.probe()
    if not support.ok or cgroups.find_root() is None:
        print(f"cannot run here: {support.detail}", file=sys.stderr)
        return 2
    if not os.path.exists(args.pyz):
        subprocess.run([sys.executable, str(ROOT / "build.py"), "--output", args.pyz], check=True)
    tmp = Path(tempfile.mkdtemp(prefix="bk-enforce-bench-"))
    os.chmod(tmp, 0o755)
    tree = Tree()
    try:
        print(f"kernel: {support.detail}")
        b = boundary(tree, tmp, args.runs)
        c = ledger_change(tree, tmp, args.runs, Path(args.pyz))
        u = cpu(tree, tmp, args.users, args.bookings, args.seconds)
    finally:
        tree.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)

    def row(name, xs):
        if not xs:
            return f"| {name} | (not seen) | |"
        return f"| {name} | {statistics.median(xs):.2f} | {max(xs):.2f} |"

    print(f"\nswitch latency, ms ({args.runs} runs each)\n")
    print("| event | median | worst |\n|---|---:|---:|")
    print(row("booking ends (the program's own clock)", b["end"]))
    print(row("booking starts (the program's own clock)", b["start"]))
    print(row("booking made (ledger file -> program)", c["book"]))
    print(row("booking cancelled (ledger file -> program)", c["cancel"]))
    print(f"\nthe enforcer with {args.users} user slices, {args.bookings} bookings, {GPUS} GPUs\n")
    print("| measure | value |\n|---|---:|")
    print(f"| first pass (every program loaded and attached) | {u['first_pass_ms']:.1f} ms |")
    print(f"| a pass with nothing to change | {u['idle_pass_ms']:.1f} ms |")
    print(f"| a renewal pass (every program regenerated and swapped) | {u['renewal_ms']:.1f} ms |")
    print(f"| CPU left alone for {u['seconds']:.0f} s | {u['cpu_pct']:.3f} % of one core |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
