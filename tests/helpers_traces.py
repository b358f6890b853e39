"""Replay the activity traces (tests/traces/*.jsonl) through the monitor:
the real NVML backend and the real ``nvidia-ml-py`` bindings against the
fake ``libnvidia-ml.so.1`` (tests/helpers_nvml.py, in its file-driven mode),
a fake /proc that the process owners, labels and CPU ticks are read from
(``bk.gpu.procinfo``: ``ProcInfo`` and ``CpuTrees``), and a fake clock.

It must run in a process whose ``LD_LIBRARY_PATH`` names the fake library,
so tests/test_activity_traces.py runs it as a script::

    LD_LIBRARY_PATH=DIR python3 tests/helpers_traces.py OUT.json TRACE.jsonl...

and reads the results from OUT.json.  Run by hand without OUT.json (``-``)
it prints the corpus table (what the closing note of issue 25 quotes)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

T0 = 1_800_000_000 - 1_800_000_000 % 3600
BTIME = T0 - 86400


def _fake_proc(proc: Path, sample: dict, known: set) -> set:
    """Lay out /proc for this sample's processes; remove the ones gone."""
    live = set()
    for pid, ppid, uid, ticks, label, _gpu, _mem, _sm in sample["p"]:
        if uid < 0:
            continue                   # the driver still lists it; /proc no longer has it
        live.add(pid)
        d = proc / str(pid)
        d.mkdir(exist_ok=True)
        comm = label.split()[0][:15]
        rest = ["S", str(ppid)] + ["0"] * 9 + [str(ticks), "0", "0", "0", "20", "0", "1", "0",
                                               str(100 * (1000 + pid % 997))] + ["0"] * 20
        (d / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)}\n")
        if pid not in known:
            (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
            (d / "cmdline").write_bytes(b"\0".join(w.encode() for w in label.split()) + b"\0")
            (d / "comm").write_text(comm + "\n")
            (d / "cgroup").write_text("0::/user.slice\n")
    for pid in known - live:
        shutil.rmtree(proc / str(pid), ignore_errors=True)
    return live


def _state(sample: dict, head: dict, k: int) -> str:
    from helpers_nvml import state_text

    gpus = [{"util": u, "mem_total": head["mem_total_mib"], "mem_used": m, "temp": 50, "power": p,
             "limit": head["limit_mw"], "energy": e, "ts": (k + 1) * 1_000_000} for u, m, p, e in sample["g"]]
    procs = [(gpu, pid, mem, sm) for pid, _pp, _uid, _t, _l, gpu, mem, sm in sample["p"] if gpu >= 0]
    return state_text(gpus, procs)


class _Ledger:
    def __init__(self, reservations):
        self.reservations = reservations
        self.policy = {"max_shared_users": 2}

    def __call__(self):
        return self


class _Usage:
    def __init__(self):
        self.records = []

    def append(self, records):
        self.records.extend(records)


def replay(path: Path, work: Path) -> dict:
    """One trace: what the monitor said about each booking, sample by sample."""
    from bk.core.activity import Tracker
    from bk.core.models import Reservation
    from bk.core.usage import Folder
    from bk.gpu.nvml import NvmlBackend
    from bk.gpu.procinfo import CpuTrees
    from bk.monitor.daemon import Monitor

    lines = path.read_text().splitlines()
    head, samples = json.loads(lines[0]), [json.loads(x) for x in lines[1:]]
    interval = head["interval_s"]
    proc, state, mon = work / "proc", work / "nvml.state", work / "monitor"
    proc.mkdir(parents=True)
    (proc / "stat").write_text(f"cpu 1 2 3 4\nbtime {BTIME}\n")
    os.environ["FAKE_NVML_STATE"] = str(state)
    reservations = [Reservation(id=b["id"], uid=b["uid"], user=f"u{b['uid']}", gpus=tuple(b["gpus"]),
                                start=T0 + b["start"], end=T0 + b["end"], mode=b["mode"], share=b["share"],
                                created=T0, extra={"idle_release_minutes": b["release_after_min"]})
                    for b in head["bookings"]]
    now = [T0]
    mono = [0.0]
    usage = _Usage()
    m = Monitor(NvmlBackend(proc_root=str(proc), clock=lambda: mono[0]), _Ledger(reservations), str(mon),
                clock=lambda: now[0], interval_s=float(interval), folder=Folder(60, interval, capacity=2),
                usage=usage, log=lambda line: None, pid=os.getpid(), tracker=Tracker(float(interval)),
                cpu_trees=CpuTrees(str(proc), rescan_s=0), keep_activity=True)
    out = {b["id"]: {"release": None, "nudge30": None, "nudge45": None, "reasons": [], "states": {},
                     "max_idle_s": 0} for b in head["bookings"]}
    known: set = set()
    deltas = 0
    prev = None
    for k, s in enumerate(samples):
        known = _fake_proc(proc, s, known)
        state.write_text(_state(s, head, k))
        now[0], mono[0] = T0 + s["t"], float(s["t"])
        m.step()
        energies = [g[3] for g in s["g"]]
        if prev is not None:
            deltas += sum(e - p for e, p in zip(energies, prev, strict=True))
        prev = energies
        for row in (m.activity_doc or {}).get("bookings", []):
            o = out[row["reservation"]]
            t = s["t"]
            if row["release_due"] and o["release"] is None:
                o["release"] = t
            for n in (30, 45):
                if n in row["nudges"] and o[f"nudge{n}"] is None:
                    o[f"nudge{n}"] = t
            if row["reason"] not in o["reasons"]:
                o["reasons"].append(row["reason"])
            o["states"][row["state"]] = o["states"].get(row["state"], 0) + 1
            o["max_idle_s"] = max(o["max_idle_s"], row["idle_s"])
    m.finish()
    recs = usage.records
    snapshot = json.loads((mon / "snapshot.json").read_text())
    kept = json.loads((mon / "activity.json").read_text())
    return {"head": head, "bookings": out,
            "energy": {"recorded": sum(r.energy_mj or 0 for r in recs), "counter": deltas,
                       "balanced": all(r.energy_mj is None or
                                       sum(u.energy_mj for u in r.uses) + r.energy_other_mj == r.energy_mj
                                       for r in recs),
                       "by_booking": {b["id"]: sum(u.energy_mj or 0 for r in recs for u in r.uses
                                                   if u.reservation == b["id"]) for b in head["bookings"]}},
            "snapshot_has_activity": isinstance(snapshot.get("activity"), dict),
            "kept": sorted(kept.get("bookings", {}))}


def main(argv: list[str]) -> int:
    target, paths = argv[0], [Path(p) for p in argv[1:]]
    base = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else None   # no fsync cost per sample
    results = {}
    for p in paths:
        work = Path(tempfile.mkdtemp(prefix="bk-trace-", dir=base))
        try:
            results[p.stem] = replay(p, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if target == "-":
        print(table(results))
    else:
        Path(target).write_text(json.dumps(results))
    return 0


def verdict(booking: dict, got: dict) -> tuple[str, str]:
    """(kind, outcome) of one booking: ``keep`` or ``idle``, and ``ok``,
    ``false-release``, ``false-nudge``, ``missed-idle``, ``early`` or ``late``."""
    expect = booking["expect"]
    if expect == "keep":
        if got["release"] is not None:
            return "keep", "false-release"
        if got["nudge30"] is not None:
            return "keep", "false-nudge"
        return "keep", "ok"
    due = expect["idle_from"] + booking["release_after_min"] * 60
    if got["release"] is None:
        return "idle", "missed-idle"
    if got["release"] < due:
        return "idle", "early"
    if got["release"] > due + 120:
        return "idle", "late"
    return "idle", "ok"


def table(results: dict) -> str:
    rows = [f"{'trace':<24}{'booking':<8}{'expect':<7}{'outcome':<14}{'release after idle':>19}"
            f"{'reasons':>30}"]
    for name, r in results.items():
        for b in r["head"]["bookings"]:
            got = r["bookings"][b["id"]]
            kind, outcome = verdict(b, got)
            when = "-" if got["release"] is None or kind == "keep" else \
                f"{(got['release'] - b['expect']['idle_from']) / 60:.1f} min"
            rows.append(f"{name:<24}{b['id']:<8}{kind:<7}{outcome:<14}{when:>19}{','.join(got['reasons']):>30}")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
