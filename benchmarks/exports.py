"""What the exports cost at 1,000 bookings: ``bk export prom|ics|html`` and
the monitor's export of every minute.

    python3 build.py -o /tmp/bk.pyz && python3 benchmarks/exports.py [--pyz /tmp/bk.pyz] [--runs 5] [-n 1000]

The ledger: ``-n`` one-hour shared bookings back to back in the 16 share
lanes of 8 GPUs, half of them behind now and half ahead (so all are in a
calendar's 14 days and most in the page's week), a private server with a
simulated count of GPUs.  Three tables:

1. In process, median of ``--runs``: the service's ``export`` row (one
   ledger read, the archive, the live look, today's history) and each
   renderer on its record, with the output's size.
2. Whole process, median of ``--runs`` runs of ``python3 PYZ export ...``
   (interpreter start-up included).
3. The monitor's export (``bk.monitor.exporter.Exporter.step``, all three
   directories set, one user's feed per booking owner): the first minute
   (today's history and the archive read, every file written) and a steady
   minute (assembled from memory; only files whose bytes changed written:
   the textfile and the page, whose "now" moved).

This is a report, not a test: it prints tables.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def seed(env: dict, n: int) -> None:
    import uuid

    from bk.core.models import Mutation, Reservation
    from bk.service import open_app

    app = open_app(env)
    call = app.call()
    now = call.now - call.now % 3600
    lanes = call.policy.gpu_count * call.policy.max_shared_users
    per_lane = -(-n // lanes)
    first = now - (per_lane // 2) * 3600

    def apply(state):
        for i in range(n):
            lane, k = divmod(i, per_lane)
            start = first + k * 3600
            state.reservations.append(Reservation(
                id=str(uuid.UUID(int=i + 1, version=4)), uid=20000 + i % 23, user=f"user{i % 23}", mode="shared",
                gpus=(lane % call.policy.gpu_count,), share=1, start=start, end=start + 3600, created=start - 86400,
                note=f"run {i}"))
        return Mutation(True, [{"action": "seed", "result": "seeded", "after": {"count": n}}], None)
    app.store.transact(apply, policy=call.policy.bound(), actor_uid=call.actor.uid, actor=call.actor.user)


def median_ms(fn, runs: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), out


def in_process(env: dict, runs: int) -> list[tuple[str, float, int | None]]:
    from bk.clock import describe_zone
    from bk.export import html, ics, prom
    from bk.service import open_app
    from bk.service.exports import ExportRequest, week_start

    rows = []
    for kind in ("prom", "ics", "html"):
        def row(kind=kind):
            app = open_app(env)
            return app.run("export", ExportRequest(kind), call=app.call())
        ms, got = median_ms(row, runs)
        rows.append((f"export row ({kind}): read and assemble", ms, len(got.data.bookings)))
        call = open_app(env).call()
        if kind == "prom":
            ms, text = median_ms(lambda got=got: prom.render(got.data), runs)
        elif kind == "ics":
            ms, text = median_ms(lambda got=got: ics.render(got.data, name="x"), runs)
        else:
            ms, text = median_ms(lambda got=got, call=call: html.render(got.data, tz=call.tz,
                                                            zone_name=describe_zone(call.tz)["name"],
                                                            week_start=week_start(call.now, call.tz)), runs)
        rows.append((f"render {kind}", ms, len(text)))
    return rows


def whole(pyz: Path, env: dict, runs: int, out: Path) -> list[tuple[str, float]]:
    rows = []
    for args in (("export", "prom"), ("export", "ics"), ("export", "html", str(out))):
        def run(args=args):
            p = subprocess.run([sys.executable, str(pyz), *args], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
            assert p.returncode == 0, p.stderr
        ms, _ = median_ms(run, runs)
        rows.append(("bk " + " ".join(args[:2]), ms))
    return rows


def monitor_minute(env: dict, base: Path, runs: int) -> list[tuple[str, float]]:
    from bk.clock import local_tz
    from bk.core.telemetry import attribute_all
    from bk.monitor.exporter import Exporter
    from bk.service import open_app
    from bk.store.usage import UsageStore

    app = open_app(env)
    call = app.call()
    state = app.store.read().state
    snap = call.telemetry.snapshot()
    atts = attribute_all(snap, state.reservations, call.now)
    s = dict(app.settings.values)

    class S(dict):
        def policy(self, count):
            return app.settings.policy(count)

    rows = []
    for i in range(runs):
        out = base / f"m{i}"
        settings = S({**s, "prometheus_textfile_dir": str(out / "prom"), "calendar_dir": str(out / "cal"),
                      "html_dir": str(out / "www")})
        ex = Exporter(settings, usage=UsageStore.for_settings(app.settings), store=app.store, tz=local_tz())
        t0 = time.perf_counter()
        problems = ex.step(call.now, state=state, snapshot=snap, attributions=atts, activity=None, heartbeat=None,
                           policy=call.policy)
        first = (time.perf_counter() - t0) * 1000
        assert problems == [], problems
        t0 = time.perf_counter()
        ex.step(call.now + 60, state=state, snapshot=snap, attributions=atts, activity=None, heartbeat=None,
                policy=call.policy)
        steady = (time.perf_counter() - t0) * 1000
        rows.append((first, steady, sum(1 for _ in (out / "cal" / "users").iterdir())))
    return [("monitor export, first minute (history, archive, every file written)",
             statistics.median(r[0] for r in rows)),
            ("monitor export, a steady minute (from memory, changed files only)",
             statistics.median(r[1] for r in rows)),
            ("  per-user feeds kept", rows[0][2])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pyz", type=Path, help="a built bk.pyz (default: build one)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("-n", type=int, default=1000, help="bookings (default 1000)")
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bk-bench-exports-"))
    try:
        pyz = args.pyz
        if pyz is None:
            pyz = base / "bk.pyz"
            subprocess.run([sys.executable, str(ROOT / "build.py"), "-o", str(pyz)], check=True,
                           stdout=subprocess.DEVNULL)
        env = {**os.environ, "BK_DATA_DIR": str(base / "data"), "BK_GPU_COUNT": "8", "HOME": str(base),
               "XDG_CACHE_HOME": str(base / "cache"), "TZ": "Europe/Berlin"}
        env.pop("BK_CONFIG_FILE", None)
        os.environ.update({k: env[k] for k in ("BK_DATA_DIR", "BK_GPU_COUNT", "HOME", "XDG_CACHE_HOME", "TZ")})
        seed(env, args.n)
        print(f"{args.n} bookings on 8 GPUs, median of {args.runs}")
        print(f"\n{'in process':<62} {'ms':>8} {'size':>9}")
        for name, ms, size in in_process(env, args.runs):
            print(f"{name:<62} {ms:8.1f} {size if size is not None else '':>9}")
        print(f"\n{'whole process (python3 bk.pyz ...)':<62} {'ms':>8}")
        for name, ms in whole(pyz, env, args.runs, base / "www"):
            print(f"{name:<62} {ms:8.1f}")
        print(f"\n{'the monitor, once a minute':<62} {'ms':>8}")
        for name, ms in monitor_minute(env, base, args.runs):
            print(f"{name:<62} {ms:8.1f}" if isinstance(ms, float) else f"{name:<62} {ms:8}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
