"""Request latency of ``bk mcp``: one server process, many requests.

    python3 build.py && python3 benchmarks/mcp.py [--runs 200] [--bookings 1000]

Starts ``dist/bk.pyz mcp`` once on a fresh private data directory
(``BK_GPU_COUNT=8``) seeded with N live bookings of other users, speaks the
2026-07-28 revision to it over its pipes (one request, wait for its reply,
the next), and prints the median and 95th percentile wall time of each kind
of request: ``tools/list``, ``list``, ``recommend``, ``context`` and a
``create`` + ``cancel`` pair (real commits: lock, re-read, fsyncs), plus the
start-up (spawn to the first reply of ``server/discover``).  A report, not
a test.
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
META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}


def seed(data_dir: Path, n: int) -> None:
    sys.path.insert(0, str(ROOT))
    from bk.core.models import Mutation, Policy, Reservation
    from bk.store.ledger import Store

    now = int(time.time())
    start = now - now % 300 + 300
    store = Store(str(data_dir), private=True, capacity=2)

    def apply(state):
        for i in range(n):
            s = start + (i // 8) * 1800
            state.reservations.append(Reservation(id=f"{i:08x}-0000-4000-8000-{i:012x}", uid=50000 + i % 7,
                                                  user=f"u{i % 7}", mode="shared", gpus=(i % 8,), share=1,
                                                  mem_mib=None, start=s, end=s + 1800, created=now))
        return Mutation(True, [])

    store.transact(apply, policy=Policy(8).bound(), actor_uid=os.getuid(), actor="bench")


class Server:
    def __init__(self, pyz: Path, env: dict):
        self.proc = subprocess.Popen([sys.executable, str(pyz), "mcp"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)
        self.rid = 0

    def ask(self, method: str, params: dict | None = None) -> dict:
        self.rid += 1
        msg = {"jsonrpc": "2.0", "id": self.rid, "method": method, "params": {**(params or {}), "_meta": META}}
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        assert reply.get("id") == self.rid and "result" in reply, reply
        return reply["result"]

    def tool(self, name: str, arguments: dict) -> dict:
        env = self.ask("tools/call", {"name": name, "arguments": arguments})["structuredContent"]
        assert env["ok"], env
        return env["data"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--bookings", type=int, default=1000)
    p.add_argument("--pyz", default=str(ROOT / "dist" / "bk.pyz"))
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bk-bench-mcp-"))
    try:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp), "TZ": "UTC",
               "BK_DATA_DIR": str(tmp / "data"), "BK_GPU_COUNT": "8", "XDG_CACHE_HOME": str(tmp / "cache")}
        seed(tmp / "data", args.bookings)
        t0 = time.perf_counter()
        srv = Server(Path(args.pyz), env)
        srv.ask("server/discover")
        startup = time.perf_counter() - t0
        cells: dict[str, list[float]] = {}

        def timed(name, fn):
            t = time.perf_counter()
            fn()
            cells.setdefault(name, []).append(time.perf_counter() - t)

        for i in range(args.runs):
            timed("tools/list", lambda: srv.ask("tools/list"))
            timed("list", lambda: srv.tool("list", {}))
            timed("recommend 2x1h", lambda: srv.tool("recommend", {"count": 2, "duration": 3600}))
            timed("context", lambda: srv.tool("context", {}))

            def pair(i=i):
                made = srv.tool("create", {"count": 1, "duration": 1800, "operation_id": f"bench-{i}"})
                srv.tool("cancel", {"ref": made["reservation"]["id"]})
            timed("create+cancel", pair)
        srv.close()
        print(f"bk mcp, {args.bookings} live bookings, {args.runs} runs each (milliseconds)")
        print(f"  {'start-up to first reply':<26} {startup * 1000:8.1f}")
        print(f"  {'request':<26} {'median':>8} {'p95':>8}")
        for name, xs in cells.items():
            xs.sort()
            print(f"  {name:<26} {statistics.median(xs) * 1000:8.2f} {xs[int(len(xs) * 0.95) - 1] * 1000:8.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
