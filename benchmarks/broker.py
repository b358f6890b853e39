"""Broker benchmark: what the broker adds to a booking, and how it scales.

    python3 benchmarks/broker.py [--bookings N] [--quick] [--json [PATH]]

Latency.  The same booking (1 GPU, 5 minutes, queued to the earliest free
start) is made alternately in private mode (``Service.book`` on a private
ledger, in this process) and through the broker (``Service.remote(...).book``: a
Unix socket round trip to a broker process that runs the same service on a
shared ledger).  Alternating keeps the two ledgers the same size, so the
difference of the medians is the broker's own cost: framing, JSON, the
socket, a thread switch, rebuilding the result.

Throughput.  1, 4 and 16 client processes book as fast as they can against
a fresh broker and a fresh ledger each time (the same number of bookings in
total, so every level commits to ledgers of the same sizes).

Targets (issue #6): the broker adds under 5 ms per booking; 16 clients get
at least the throughput of one.  Both modes fsync; run it on the file system
a real data directory would use (``--dir``; default a temporary directory
under /tmp).  Runs as any user: the broker here serves a ledger owned by the
current account, configured in code rather than by a trusted file.

``--json`` alone also prints a summary as JSON after the tables.  ``--json
PATH`` instead writes every cell of both tables to PATH for
``benchmarks/ab.py``: ``{"benchmark": "broker", "format": 1, "settings":
{...}, "cells": {NAME: {"value": v, "unit": "s", "stat": ..., "samples":
[...]}}}``.  Latency cells are in seconds with every booking's time as the
samples: ``latency private median``, ``latency private p90``, ``latency
broker median``, ``latency broker p90``, ``latency broker adds`` (difference
of the medians).  Throughput cells are seconds per booking (unit
``s/booking``: 1 / the bookings/s of the table, so lower is better like every
other cell; one sample each): ``throughput 1 client``, ``throughput 4
clients``, ``throughput 16 clients``;
the "vs 1" column is ``throughput 4 clients vs 1`` etc. (unit ``ratio``,
``"better": "higher"``).  The file is written (atomically) whenever both
tables were measured, whether the targets were met or not.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bk import clock  # noqa: E402
from bk.gpu.sim import CountBackend  # noqa: E402
from bk.ipc.client import BrokerClient  # noqa: E402
from bk.service.app import Service  # noqa: E402
from bk.service.requests import BookRequest  # noqa: E402
from bk.service.telemetry import Telemetry  # noqa: E402
from bk.store.config import KEYS, Settings  # noqa: E402
from bk.store.paths import Locations  # noqa: E402

GPUS = 8
# ``again``: every booking is a real one.  Without it the second identical
# booking within five minutes is answered "exists" with the first (the
# repeat rule) and nothing would be committed, or measured.
REQUEST = BookRequest(count=1, duration=300, again=True)
WIRE = {"count": 1, "duration": 300, "again": True}


def settings(base: str, mode: str) -> Settings:
    data = os.path.join(base, "data")
    values = {k: key.default for k, key in KEYS.items()}
    values.update(gpu_count=GPUS, socket=os.path.join(base, "b.sock"), service_uid=os.geteuid(),
                  data_dir=data, queue_search_hours=8784, booking_horizon_days=366)
    return Settings(Locations(mode, data, None, mode == "shared", base), values, None)


def telemetry() -> Telemetry:
    return Telemetry(lambda: CountBackend(GPUS), clock=clock.now)


def serve(base: str) -> None:
    """The broker process (``--serve-broker BASE``)."""
    from bk.broker.handlers import Dispatcher
    from bk.broker.server import Broker, Plan

    s = settings(base, "shared")
    service = Service.local(s, telemetry(), owner_uid=os.geteuid())
    plan = Plan("benchmark", s.data_dir, s["socket"], os.geteuid(), "all", None)
    Broker(plan, Dispatcher(service), log=lambda line: None).serve()


class BrokerProcess:
    def __init__(self, root: str, name: str):
        self.base = os.path.join(root, name)
        os.makedirs(os.path.join(self.base, "data"), mode=0o755)
        os.chmod(self.base, 0o755)
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve-broker", self.base])
        self.socket = os.path.join(self.base, "b.sock")
        deadline = time.monotonic() + 30
        while True:
            try:
                BrokerClient(self.socket).call("ping")
                return
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the broker did not start") from None
                time.sleep(0.02)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)


def latency(root: str, n: int) -> tuple[list[float], list[float]]:
    private_base = os.path.join(root, "private")
    os.makedirs(os.path.join(private_base, "data"), mode=0o700)
    local = Service.local(settings(private_base, "private"), telemetry())
    broker = BrokerProcess(root, "latency")
    try:
        remote = Service.remote(settings(broker.base, "shared"), telemetry())
        remote.book(REQUEST)                          # warm both paths up
        local.book(REQUEST)
        priv, rem = [], []
        for _ in range(n):
            t = time.perf_counter()
            local.book(REQUEST)
            priv.append(time.perf_counter() - t)
            t = time.perf_counter()
            remote.book(REQUEST)
            rem.append(time.perf_counter() - t)
        return priv, rem
    finally:
        broker.stop()


def _client(socket_path: str, count: int, start, out) -> None:
    client = BrokerClient(socket_path)
    start.wait()
    for _ in range(count):
        client.call("book", WIRE)
    out.put(count)


def throughput(root: str, clients: int, total: int) -> float:
    broker = BrokerProcess(root, f"tp{clients}")
    try:
        ctx = multiprocessing.get_context("fork")
        start = ctx.Barrier(clients + 1)
        out = ctx.Queue()
        each = total // clients
        procs = [ctx.Process(target=_client, args=(broker.socket, each, start, out)) for _ in range(clients)]
        for p in procs:
            p.start()
        start.wait()
        t = time.perf_counter()
        done = sum(out.get(timeout=600) for _ in procs)
        elapsed = time.perf_counter() - t
        for p in procs:
            p.join(60)
            if p.exitcode != 0:
                raise RuntimeError(f"a client process failed (exit {p.exitcode})")
        return done / elapsed
    finally:
        broker.stop()


def ms(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return 1000 * xs[min(len(xs) - 1, int(q * len(xs)))]


def cells(priv: list[float], rem: list[float], overhead: float, rates: dict[int, float]) -> dict:
    """Every cell of the two tables, named as in the module docstring."""
    out = {}
    for name, xs in (("private", priv), ("broker", rem)):
        for stat, q in (("median", .5), ("p90", .9)):
            out[f"latency {name} {stat}"] = {"value": ms(xs, q) / 1000, "unit": "s", "stat": stat,
                                             "samples": list(xs)}
    out["latency broker adds"] = {"value": overhead, "unit": "s", "stat": "difference of medians",
                                  "samples": [r - p for p, r in zip(priv, rem, strict=True)]}
    for k, rate in rates.items():
        label = f"throughput {k} client{'s' if k != 1 else ''}"
        out[label] = {"value": 1 / rate, "unit": "s/booking", "stat": "1 / bookings per second",
                      "samples": [1 / rate]}
        if k != 1:
            out[f"{label} vs 1"] = {"value": rate / rates[1], "unit": "ratio", "better": "higher",
                                    "stat": "bookings/s over 1 client's", "samples": [rate / rates[1]]}
    return out


def write_cells(path: str, cells: dict, settings: dict) -> None:
    from cells import write_cells as write

    write(path, "broker", cells, settings)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bookings", type=int, default=300, help="bookings per latency series and "
                    "per throughput level (default 300)")
    ap.add_argument("--dir", help="where to put the ledgers (default: a temporary directory)")
    ap.add_argument("--quick", action="store_true", help="100 bookings (for CI)")
    ap.add_argument("--json", nargs="?", const="-", metavar="PATH",
                    help="alone: print the numbers as JSON too; with PATH: write every cell "
                         "(with the raw samples) to PATH for benchmarks/ab.py")
    ap.add_argument("--serve-broker", metavar="BASE", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_broker:
        serve(args.serve_broker)
        return 0
    n = 100 if args.quick else args.bookings
    root = tempfile.mkdtemp(prefix="bkb", dir=args.dir or "/tmp")   # short: socket paths <= 107 bytes
    try:
        priv, rem = latency(root, n)
        rates = {k: throughput(root, k, n if k == 1 else max(n, k * 16)) for k in (1, 4, 16)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    overhead = statistics.median(rem) - statistics.median(priv)
    print(f"Booking latency ({n} bookings each, alternating; both fsync; {GPUS} GPUs)")
    print(f"{'mode':<28}{'median ms':>10}{'p90 ms':>10}")
    print(f"{'private (in-process)':<28}{ms(priv, .5):>10.2f}{ms(priv, .9):>10.2f}")
    print(f"{'through the broker':<28}{ms(rem, .5):>10.2f}{ms(rem, .9):>10.2f}")
    verdict = "ok" if overhead < 0.005 else "MISSED"
    print(f"{'broker adds':<28}{overhead * 1000:>10.2f}{'':>10}   target < 5 ms: {verdict}")
    print()
    print("Throughput through the broker (fresh ledger per level)")
    print(f"{'clients':<10}{'bookings/s':>12}{'vs 1':>8}")
    for k, rate in rates.items():
        print(f"{k:<10}{rate:>12.1f}{rate / rates[1]:>8.2f}")
    verdict2 = "ok" if rates[16] >= rates[1] else "MISSED"
    print(f"target: 16 clients >= 1 client: {verdict2}")
    if args.json == "-":
        print(json.dumps({"private_ms": ms(priv, .5), "broker_ms": ms(rem, .5),
                          "overhead_ms": overhead * 1000, "throughput": rates}))
    elif args.json:
        write_cells(args.json, cells(priv, rem, overhead, rates), {"bookings": n, "gpus": GPUS})
    return 0 if verdict == verdict2 == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
