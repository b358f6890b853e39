"""Cluster benchmark: ``bk c rec 2 1h`` over three loopback nodes (issue 16).

    sudo python3 benchmarks/cluster.py [--runs 7] [--hang-timeout 3]

Needs root and openssh-server: it makes a throwaway user with a key and
starts three sshd on 127.0.0.2-4 (tests/helpers_sshd.py), each its own bk
node (its own data directory and GPU count), with the built archive on both
ends.  It measures, as whole-process wall times of the client (median and
max of ``--runs``):

* each node alone: ``bk c rec 2 1h`` with a catalog of that node only (one
  ssh round trip and the node's ``bk slots``);
* ``bk c rec 2 1h`` over the three, queried in parallel.  Target: the
  slowest single node plus under 100 ms.  The three nodes' bk processes
  share this machine's cores, so on a small machine the parallel time also
  shows their contention for the CPU (printed: the core count);
* the same with a fourth node whose bk hangs: bounded by that node's
  ``timeout_s`` (``--hang-timeout``), the others' answers still shown.

Prints the numbers; asserts nothing.  Stops every sshd and removes the user.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers_broker import Accounts, make_base  # noqa: E402
from tests.helpers_sshd import Lab, have_sshd, write_catalog  # noqa: E402


def timed(lab: Lab, cat: Path, *argv: str) -> tuple[float, int]:
    t = time.perf_counter()
    p = lab.bk(cat, *argv)
    return time.perf_counter() - t, p.returncode


def series(lab, cat, runs, *argv) -> list[float]:
    out = []
    for _ in range(runs):
        s, _code = timed(lab, cat, *argv)
        out.append(s)
    return out


def row(name: str, xs: list[float]) -> str:
    return f"{name:<42} median {statistics.median(xs) * 1000:7.0f} ms   max {max(xs) * 1000:7.0f} ms"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--hang-timeout", type=float, default=3.0)
    args = ap.parse_args(argv)
    if os.geteuid() != 0 or not have_sshd():
        print("needs root and openssh-server (sshd, ssh, ssh-keygen)", file=sys.stderr)
        return 2
    build = Path(tempfile.mkdtemp(prefix="bk-bench-cluster-"))
    pyz = build / "bk.pyz"
    subprocess.run([sys.executable, str(ROOT / "build.py"), "--output", str(pyz)], check=True,
                   capture_output=True, cwd=ROOT)
    base = make_base()
    accounts = Accounts(base)
    lab = Lab(base, pyz, accounts.user())
    try:
        nodes = {name: lab.sshd(name, f"127.0.0.{i + 2}", gpus=4 + 2 * i) for i, name in enumerate("abc")}
        entries = {name: s.entry() for name, s in nodes.items()}
        cat = write_catalog(base / "three.json", entries)
        hang = dict(entries["c"], id="d-" + "9" * 24, remote_command=[f"{lab.bin}/bk-hang"],
                    timeout_s=args.hang_timeout)
        cat_hang = write_catalog(base / "hang.json", {**entries, "hang": hang})
        lab.bk(cat, "c", "check")                               # warm: page cache, host keys
        print(f"bk c rec 2 1h over 3 loopback sshd nodes, {args.runs} runs each (whole client process); "
              f"{os.cpu_count()} CPU cores shared by the client and the three nodes")
        singles = {}
        for name in nodes:
            one = write_catalog(base / f"one-{name}.json", {name: entries[name]})
            singles[name] = series(lab, one, args.runs, "c", "rec", "2", "1h")
            print(row(f"one node alone: bk c rec 2 1h ({name})", singles[name]))
        slowest = max(statistics.median(x) for x in singles.values())
        par = series(lab, cat, args.runs, "c", "rec", "2", "1h")
        print(row("bk c rec 2 1h (3 nodes, parallel)", par))
        print(f"{'  over the slowest single node':<42} {(statistics.median(par) - slowest) * 1000:+7.0f} ms "
              "(target < +100 ms)")
        hung = series(lab, cat_hang, max(1, args.runs // 2), "c", "rec", "2", "1h")
        print(row(f"with a hanging node (timeout {args.hang_timeout:g} s)", hung))
        code = timed(lab, cat_hang, "c", "rec", "2", "1h")[1]
        print(f"{'  exit status with the hanging node':<42} {code} (1: partial, the others answered)")
    finally:
        lab.stop()
        accounts.cleanup()
        subprocess.run(["rm", "-rf", str(base), str(build)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
