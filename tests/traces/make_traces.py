"""Write the activity trace corpus (tests/traces/*.jsonl) that
tests/test_activity_traces.py replays through the fake NVML.

    python3 tests/traces/make_traces.py        # rewrites every trace; seeded, so the same bytes

Each trace is what a monitor sampling every ``interval_s`` would have seen
on one server: per sample, each GPU's utilisation, memory used, power and
energy counter, and every process of interest with its parent, owner, CPU
ticks so far, label and, for a GPU process, its GPU, memory and SM sample.
They are modelled on how the workloads behave (an H100's idle draw near
70 W, a training step's 550-650 W, a data loader's CPU, a notebook kernel's
heartbeat ticks), with seeded noise, not recorded on hardware:
benchmarks/gpu_activity.py checks the model's main figures on a real GPU
when one is lent.

Format: the first line is the header (``trace``, ``description``,
``interval_s``, ``gpus``, ``limit_mw``, ``mem_total_mib``, ``bookings``:
``id``, ``uid``, ``gpus``, ``mode``, ``share``, ``start``, ``end`` in
seconds from the trace's start, ``release_after_min``, ``expect``: ``keep``
or ``{"idle_from": s}``, and ``reasons``: reasons the monitor must give at
least once).  Every other line is a sample: ``t``; ``g``, per GPU
``[util, mem_used_mib, power_mw, energy_mj]`` (null: not supported); ``p``,
per process ``[pid, ppid, uid, cpu_ticks, label, gpu, mem_mib, sm]``, where
``gpu`` -1 is a process not on a GPU, ``sm`` -1 means no SM sample since the
last look, and ``uid`` -1 a process the driver still lists but /proc no
longer has.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
HZ = 100
INTERVAL = 15
LIMIT = 700_000
MEM_TOTAL = 81559
PRE_MIN = 5                  # every trace starts with the GPUs quiet and unbooked: what the monitor saw before
RELEASE_MIN = 60


class Proc:
    def __init__(self, pid, uid, label, *, ppid=1, gpu=-1, mem=0):
        self.pid, self.uid, self.label, self.ppid, self.gpu, self.mem = pid, uid, label, ppid, gpu, mem
        self.ticks = 0


class Trace:
    def __init__(self, name, description, seed, minutes, *, gpus=1):
        self.name, self.description = name, description
        self.rng = random.Random(seed)
        self.n = gpus
        self.minutes = minutes
        self.energy = [self.rng.randint(10**9, 10**10) for _ in range(gpus)]
        self.idle_w = [self.rng.uniform(66, 72) for _ in range(gpus)]
        self.bookings = []
        self.lines = []

    def book(self, bid, uid, gpus, *, mode="exclusive", share=None, start_min=PRE_MIN, end_min=None,
             expect="keep", reasons=()):
        self.bookings.append({"id": bid, "uid": uid, "gpus": list(gpus), "mode": mode,
                              "share": share or (2 if mode == "exclusive" else 1), "start": start_min * 60,
                              "end": (end_min or self.minutes + 60) * 60, "release_after_min": RELEASE_MIN,
                              "expect": expect if expect == "keep" else {"idle_from": int(expect * 60)},
                              "reasons": list(reasons)})

    # -- noise

    def watts(self, lo, hi):
        return self.rng.uniform(lo, hi)

    def idle(self, g, extra=0.0):
        return self.idle_w[g] + extra + self.rng.uniform(-1.5, 1.5)

    def sm(self, lo, hi):
        return self.rng.randint(lo, hi)

    def run(self, world):
        """``world(minute, trace) -> (gpus, procs)``: per GPU (util, watts),
        and (Proc, cpu share of one core, sm or None) for every live process."""
        for k in range(self.minutes * 60 // INTERVAL + 1):
            t = k * INTERVAL
            gpus, procs = world(t / 60, self)
            g_out = []
            for i, (util, w) in enumerate(gpus):
                true_mj = w * 1000 * INTERVAL
                self.energy[i] += int(true_mj)
                used = sum(p.mem for p, _, _ in procs if p.gpu == i)
                # the power reading is an average over part of the interval: noisier than the counter
                g_out.append([util, used + (300 if used else 0), int(w * 1000 * self.rng.uniform(0.96, 1.04)),
                              self.energy[i]])
            p_out = []
            for p, cpu, sm in procs:
                if p.uid >= 0:
                    p.ticks += max(0, round(cpu * INTERVAL * HZ + self.rng.gauss(0, 0.6)))
                p_out.append([p.pid, p.ppid, p.uid, p.ticks, p.label, p.gpu, p.mem,
                              -1 if sm is None else int(sm)])
            self.lines.append({"t": t, "g": g_out, "p": p_out})

    def write(self):
        head = {"trace": self.name, "description": self.description, "interval_s": INTERVAL, "gpus": self.n,
                "limit_mw": LIMIT, "mem_total_mib": MEM_TOTAL, "bookings": self.bookings}
        text = "\n".join(json.dumps(x, separators=(",", ":")) for x in [head] + self.lines) + "\n"
        (HERE / f"{self.name}.jsonl").write_text(text)


ALICE, BOB, ROOT = 41001, 41002, 0


def pre(m):
    return m < PRE_MIN


def dataloader_stall():
    tr = Trace("dataloader_stall", "training, then a 30-minute data-loader stall (GPU idle, loader workers "
               "busy on the CPU), then training again", 1, 95)
    tr.book("b1", ALICE, (0,), reasons=("sm", "cpu"))
    main = Proc(5000, ALICE, "python train.py", gpu=0, mem=30000)
    workers = [Proc(5001 + i, ALICE, "python train.py", ppid=5000) for i in range(4)]

    def world(m, t):
        if pre(m):
            return [(0, t.idle(0, -3))], []
        if 20 <= m < 50:                                    # the stall: nothing on the GPU, loaders grind
            return [(0, t.idle(0, 6))], [(main, 0.02, None)] + [(w, t.watts(0.6, 1.0), None) for w in workers]
        return ([(t.sm(88, 99), t.watts(540, 650))],
                [(main, t.watts(1.0, 1.3), t.sm(85, 99))] + [(w, t.watts(0.3, 0.6), None) for w in workers])
    tr.run(world)
    return tr


def dataset_download():
    tr = Trace("dataset_download", "a shared booking whose program holds a CUDA context while it downloads "
               "its data set for two hours (a few % of one core), then trains", 2, 140)
    tr.book("b1", BOB, (0,), mode="shared", reasons=("cpu", "sm"))
    p = Proc(6000, BOB, "python fetch_and_train.py", gpu=0, mem=1500)

    def world(m, t):
        if pre(m):
            return [(0, t.idle(0, -3))], []
        if m < 125:
            return [(0, t.idle(0, 4))], [(p, t.watts(0.04, 0.15), None)]
        return [(t.sm(70, 95), t.watts(400, 520))], [(p, t.watts(1.0, 1.2), t.sm(70, 95))]
    tr.run(world)
    return tr


def checkpoint_write():
    tr = Trace("checkpoint_write", "training with a checkpoint every 25 minutes: three minutes of "
               "serialising and compressing on the CPU with the GPU idle", 3, 110)
    tr.book("b1", ALICE, (0,), reasons=("sm", "cpu"))
    main = Proc(7000, ALICE, "python train.py", gpu=0, mem=45000)
    gz = Proc(7100, ALICE, "pigz", ppid=7000)

    def world(m, t):
        if pre(m):
            return [(0, t.idle(0, -3))], []
        if (m - PRE_MIN) % 25 >= 22:
            return [(0, t.idle(0, 5))], [(main, t.watts(0.7, 1.0), None), (gz, t.watts(2.0, 3.5), None)]
        return [(t.sm(90, 99), t.watts(580, 660))], [(main, t.watts(1.0, 1.2), t.sm(90, 99))]
    tr.run(world)
    return tr


def cpu_evaluation():
    tr = Trace("cpu_evaluation", "an evaluation that runs on the CPU for 90 minutes while its process "
               "keeps 6 GB on the GPU", 4, 100)
    tr.book("b1", BOB, (0,), mode="shared", reasons=("cpu",))
    p = Proc(8000, BOB, "python evaluate.py", gpu=0, mem=6000)

    def world(m, t):
        if pre(m):
            return [(0, t.idle(0, -3))], []
        return [(0, t.idle(0, 3))], [(p, t.watts(0.95, 1.0), None)]
    tr.run(world)
    return tr


def idle_notebook():
    tr = Trace("idle_notebook", "a notebook kernel that ran cells for ten minutes and then sits idle "
               "holding 8 GB (its heartbeat costs a few CPU ticks a minute)", 5, 90)
    tr.book("b1", ALICE, (0,), mode="shared", expect=PRE_MIN + 10, reasons=("sm", "memory-held"))
    k = Proc(9000, ALICE, "python -m ipykernel_launcher", gpu=0, mem=8192)

    def world(m, t):
        if pre(m):
            return [(0, t.idle(0, -3))], []
        if m < PRE_MIN + 10:
            return [(t.sm(30, 70), t.watts(250, 380))], [(k, t.watts(0.9, 1.0), t.sm(30, 70))]
        return [(0, t.idle(0, 4))], [(k, t.watts(0.001, 0.004), None)]
    tr.run(world)
    return tr


def spin_kernel():
    tr = Trace("spin_kernel", "a fake load: one block spinning in a loop shows 100 % utilisation and "
               "100 % SM while the board stays near its idle draw; the host sleeps between launches", 6, 80)
    tr.book("b1", BOB, (0,), expect=PRE_MIN, reasons=("spin",))
    p = Proc(9500, BOB, "python keepbusy.py", gpu=0, mem=500)

    def world(m, t):
        if pre(m):
            return [(0, t.idle(0, -3))], []
        return [(100, t.idle(0, t.watts(18, 30)))], [(p, t.watts(0.0, 0.003), 100)]
    tr.run(world)
    return tr


def stuck_utilisation():
    tr = Trace("stuck_utilisation", "the owner's job is gone and the GPU's utilisation reads 100 % with no "
               "process at all (a stuck counter)", 7, 80)
    tr.book("b1", ALICE, (0,), expect=PRE_MIN, reasons=("no-process",))

    def world(m, t):
        if pre(m):
            return [(0, t.idle(0, -3))], []
        return [(100, t.idle(0, 1))], []
    tr.run(world)
    return tr


def reserved_memory():
    tr = Trace("reserved_memory", "a framework that reserves 75 GB up front trains for 40 minutes, then "
               "waits for input holding it all", 8, 120)
    tr.book("b1", BOB, (0,), expect=PRE_MIN + 40, reasons=("sm", "memory-held"))
    p = Proc(10000, BOB, "python jax_train.py", gpu=0, mem=76800)

    def world(m, t):
        if pre(m):
            return [(0, t.idle(0, -3))], []
        if m < PRE_MIN + 40:
            return [(t.sm(60, 92), t.watts(450, 600))], [(p, t.watts(1.0, 1.5), t.sm(60, 92))]
        return [(0, t.idle(0, 6))], [(p, 0.0, None)]
    tr.run(world)
    return tr


def true_idle_exclusive():
    tr = Trace("true_idle_exclusive", "an exclusive booking that nothing ever uses", 9, 75)
    tr.book("b1", ALICE, (0,), expect=PRE_MIN, reasons=("no-process",))

    def world(m, t):
        return [(0, t.idle(0, -3))], []
    tr.run(world)
    return tr


def true_idle_shared_slot():
    tr = Trace("true_idle_shared_slot", "two shared bookings on one GPU: one trains, the other holds "
               "2 GB and does nothing (the board's power and utilisation are the neighbour's)", 10, 80)
    tr.book("b1", ALICE, (0,), mode="shared", reasons=("sm",))
    tr.book("b2", BOB, (0,), mode="shared", expect=PRE_MIN, reasons=("memory-held",))
    a = Proc(11000, ALICE, "python train.py", gpu=0, mem=30000)
    b = Proc(11001, BOB, "python", gpu=0, mem=2048)

    def world(m, t):
        if pre(m):
            return [(0, t.idle(0, -3))], []
        return [(t.sm(80, 98), t.watts(480, 600))], [(a, t.watts(1.0, 1.2), t.sm(80, 98)), (b, 0.0, None)]
    tr.run(world)
    return tr


def process_gone():
    tr = Trace("process_gone", "training crashes after 30 minutes; the driver lists the dead PID with "
               "its memory for two more minutes, then nothing", 11, 105)
    tr.book("b1", BOB, (0,), expect=PRE_MIN + 30, reasons=("sm", "no-process"))
    p = Proc(12000, BOB, "python train.py", gpu=0, mem=40000)

    def world(m, t):
        if pre(m):
            return [(0, t.idle(0, -3))], []
        if m < PRE_MIN + 30:
            return [(t.sm(85, 99), t.watts(520, 640))], [(p, t.watts(1.0, 1.2), t.sm(85, 99))]
        if m < PRE_MIN + 32:
            p.uid = -1
            return [(0, t.idle(0, 8))], [(p, 0.0, None)]
        return [(0, t.idle(0, 1))], []
    tr.run(world)
    return tr


def mps_client():
    tr = Trace("mps_client", "two shared bookings as clients of an MPS server, which the driver credits "
               "with all the SM: one trains for 100 minutes, the other's client exits after 40", 12, 110)
    tr.book("b1", ALICE, (0,), mode="shared", reasons=("power",))
    tr.book("b2", BOB, (0,), mode="shared", expect=PRE_MIN + 40, reasons=("power", "no-process"))
    server = Proc(13000, ROOT, "nvidia-cuda-mps-server", gpu=0, mem=300)
    a = Proc(13001, ALICE, "python train.py", gpu=0, mem=20000)
    b = Proc(13002, BOB, "python train.py", gpu=0, mem=20000)

    def world(m, t):
        if pre(m):
            return [(0, t.idle(0, -3))], [(server, 0.0, None)]
        procs = [(server, t.watts(0.0, 0.01), t.sm(80, 99)), (a, t.watts(1.0, 1.2), None)]
        if m < PRE_MIN + 40:
            procs.append((b, t.watts(1.0, 1.2), None))
        return [(t.sm(80, 99), t.watts(450, 620))], procs
    tr.run(world)
    return tr


TRACES = (dataloader_stall, dataset_download, checkpoint_write, cpu_evaluation, idle_notebook, spin_kernel,
          stuck_utilisation, reserved_memory, true_idle_exclusive, true_idle_shared_slot, process_gone,
          mps_client)


def main() -> None:
    for make in TRACES:
        make().write()


if __name__ == "__main__":
    main()
