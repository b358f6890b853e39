"""The activity state and the energy counter on a real GPU (issue 25): the
checks that need hardware, for a machine with an NVIDIA GPU, its driver
and ``nvidia-ml-py``.

    python3 benchmarks/gpu_activity.py [--gpu 0] [--seconds 20] [--backend auto|torch|cuda]
                                       [--record trace.jsonl]

It runs four phases on one GPU, each ``--seconds`` long, with a workload in
a child process of its own (so the driver lists it under its own PID, owned
by you), and samples the GPU once a second through bk's NVML backend, the
monitor's /proc reader and the activity tracker, judging a booking of yours
on that GPU:

  idle    no workload: the board's idle draw (it teaches the baseline); the
          booking must be ``empty``
  held    a CUDA context holding 1 GiB, doing nothing: ``idle-held`` (memory-held)
  spin    one thread spinning in a kernel, the host asleep: the GPU's own
          judgement must be ``idle-held`` (spin): 100 % SM at idle power
  burn    every SM doing FMAs: ``active`` (sm)

and then reads the energy counter as fast as NVML answers for three seconds
(how often it moves), compares it with the power readings during the burn
phase (the counter's average must be within 25 % of the power's), and folds
the burn phase into usage records with an exclusive booking (its energy must
be the counter's delta, exactly).  It prints a table of what it measured and
PASS or FAIL per check; exit 0 when all pass, 1 when one fails, 2 when it
cannot run (no GPU, no nvidia-ml-py, no way to run a kernel).

The workload uses PyTorch when it is installed (``torch.cuda._sleep`` is
the spin kernel; a matmul loop the burn), else the CUDA driver API through
ctypes (``libcuda.so.1``, shipped with the driver) with two small PTX
kernels JIT-compiled by the driver, and a context that sleeps while it
waits (``CU_CTX_SCHED_BLOCKING_SYNC``), so that the host uses no CPU.
``--record PATH`` writes the samples in the format of tests/traces (one
trace of the four phases), for the corpus.

A report, not a test.  It writes nothing but ``--record``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PHASES = ("idle", "held", "spin", "burn")

PTX = rb"""
.version 6.0
.target sm_50
.address_size 64

.visible .entry spin(.param .u64 spin_cycles)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [spin_cycles];
    mov.u64 %rd2, %clock64;
$L_spin:
    mov.u64 %rd3, %clock64;
    sub.s64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p1, %rd4, %rd1;
    @%p1 bra $L_spin;
    ret;
}

.visible .entry burn(.param .u64 burn_out, .param .u32 burn_iters)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<5>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [burn_out];
    ld.param.u32 %r1, [burn_iters];
    mov.u32 %r2, %tid.x;
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mad.lo.s32 %r5, %r3, %r4, %r2;
    cvt.rn.f32.s32 %f1, %r5;
    mov.f32 %f2, 0f3F800000;
    mov.f32 %f3, 0f3F000000;
$L_burn:
    fma.rn.f32 %f1, %f1, %f3, %f2;
    fma.rn.f32 %f2, %f2, %f3, %f1;
    sub.s32 %r1, %r1, 1;
    setp.ne.s32 %p1, %r1, 0;
    @%p1 bra $L_burn;
    add.f32 %f4, %f1, %f2;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.s32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.f32 [%rd4], %f4;
    ret;
}
""" + b"\0"


# ---------------------------------------------------------------- the workload (a child process)

def _ready() -> None:
    print("ready", flush=True)


def work_torch(mode: str, seconds: float) -> None:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device")
    held = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")      # noqa: F841 - held on purpose
    stream = torch.cuda.current_stream()
    if mode == "burn":
        a = torch.randn(8192, 8192, device="cuda")
    torch.cuda.synchronize()
    _ready()
    end = time.monotonic() + seconds
    try:
        rate_hz = torch.cuda.clock_rate() * 1e6            # MHz, through NVML
    except Exception:       # noqa: BLE001 - an older torch, or no pynvml there: a typical clock
        rate_hz = 1.5e9
    while time.monotonic() < end:
        if mode == "held":
            time.sleep(0.2)
            continue
        if mode == "spin":
            torch.cuda._sleep(int(rate_hz * 0.5))
        else:
            for _ in range(8):
                a = a @ a
                a = a / a.norm()
        while not stream.query():          # poll asleep: the host must not burn a CPU while it waits
            time.sleep(0.01)


def work_cuda(mode: str, seconds: float) -> None:
    cu = ctypes.CDLL("libcuda.so.1")

    def check(rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} failed: CUDA error {rc}")
    check(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(cu.cuCtxCreate_v2(ctypes.byref(ctx), 0x04, dev), "cuCtxCreate")     # BLOCKING_SYNC
    held = ctypes.c_uint64()
    check(cu.cuMemAlloc_v2(ctypes.byref(held), ctypes.c_size_t(1 << 30)), "cuMemAlloc")
    check(cu.cuMemsetD8_v2(held, ctypes.c_ubyte(1), ctypes.c_size_t(1 << 30)), "cuMemsetD8")
    mod = ctypes.c_void_p()
    check(cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(PTX)), "cuModuleLoadData (the PTX)")
    fn = ctypes.c_void_p()
    check(cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"spin" if mode == "spin" else b"burn"),
          "cuModuleGetFunction")
    cu.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3

    def attr(n):
        v = ctypes.c_int()
        check(cu.cuDeviceGetAttribute(ctypes.byref(v), n, dev), f"cuDeviceGetAttribute {n}")
        return v.value
    khz, sms = attr(13), attr(16)                 # CLOCK_RATE (kHz), MULTIPROCESSOR_COUNT
    blocks, threads = sms * 8, 256
    out = ctypes.c_uint64()
    check(cu.cuMemAlloc_v2(ctypes.byref(out), ctypes.c_size_t(blocks * threads * 4)), "cuMemAlloc")
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    _ready()
    end = time.monotonic() + seconds
    iters = 1 << 16
    while time.monotonic() < end:
        if mode == "held":
            time.sleep(0.2)
            continue
        if mode == "spin":
            cycles = ctypes.c_uint64(int(khz * 1000 * 0.5))
            params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(cycles), ctypes.c_void_p))
            check(cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, None, params, None), "cuLaunchKernel spin")
        else:
            n = ctypes.c_uint32(iters)
            params = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.pointer(out), ctypes.c_void_p),
                                           ctypes.cast(ctypes.pointer(n), ctypes.c_void_p))
            t0 = time.monotonic()
            check(cu.cuLaunchKernel(fn, blocks, 1, 1, threads, 1, 1, 0, None, params, None), "cuLaunchKernel burn")
        check(cu.cuCtxSynchronize(), "cuCtxSynchronize")        # sleeps: blocking sync
        if mode == "burn" and time.monotonic() - t0 < 0.2 and iters < 1 << 30:
            iters *= 2                                           # grow the kernel to about 0.2-0.4 s


def worker(mode: str, seconds: float, backend: str) -> int:
    try:
        if backend == "torch":
            work_torch(mode, seconds)
        else:
            work_cuda(mode, seconds)
    except Exception as e:                          # the parent shows it
        print(f"error: {type(e).__name__}: {e}", flush=True)
        return 1
    return 0


# ---------------------------------------------------------------- the sampler (this process)

def choose_backend(want: str) -> str:
    if want != "auto":
        return want
    try:
        import torch

        if torch.cuda.is_available():
            return "torch"
    except Exception:       # noqa: BLE001 - any import trouble: the driver API
        pass
    return "cuda"


class Phase:
    def __init__(self, name):
        self.name = name
        self.rows = []             # (t, power_mw, util, our sm, our mem, state, reason, gpu state, gpu reason, cpu%)
        self.error = None


def run_phase(name, args, be, gpu, uuid, res, tracker, trees, folder, records, lines, t0):
    from bk.core import activity as A
    from bk.core.telemetry import attribute_all

    ph = Phase(name)
    child = None
    if name != "idle":
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=uuid, CUDA_DEVICE_ORDER="PCI_BUS_ID")
        child = subprocess.Popen([sys.executable, __file__, "--worker", name, "--seconds", str(args.seconds + 5),
                                  "--backend", args.backend], env=env, stdout=subprocess.PIPE, text=True)
        import select

        first = ""
        if select.select([child.stdout], [], [], 180)[0]:
            first = child.stdout.readline().strip()
        if first != "ready":
            child.kill()
            child.wait(30)
            ph.error = first or f"the workload exited with {child.returncode}"
            return ph
        time.sleep(2)                                # let the readings settle
    try:
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            now = int(time.time())
            snap = be.snapshot(now)
            g = snap.by_index()[gpu]
            atts = attribute_all(snap, [res], now)
            roots = tracker.roots(snap, atts, [res], now)
            cpu = trees.advance(roots)
            tracker.observe(now, snap, atts, [res], cpu)
            act = tracker.bookings[res.id]
            base = tracker.baselines.get(uuid)
            gstate, greason, own = A.gpu_judgement(g, res.uid, atts, base,
                                                   sm_readable="process_sm" not in snap.gaps)
            records += folder.add(now, snap, atts, [res], baselines=tracker.baselines_by_index(snap))
            ev = act.judgement.evidence()
            ph.rows.append((now, g.power_mw, g.util, ev["sm_max"], ev["mem_mib"], act.state, act.reason,
                            gstate, greason, ev["cpu_pct"], g.energy_mj))
            if lines is not None:
                lines.append({"t": now - t0, "g": [[g.util, g.mem_used_mib, g.power_mw, g.energy_mj]],
                              "p": [[p.pid, 1, res.uid, 0, p.label or "?", gpu, p.mem_mib or 0,
                                     -1 if p.sm is None else p.sm] for p in own]})
            time.sleep(max(0.0, 1.0 - (time.time() - now)))
    finally:
        if child is not None:
            child.kill()
            child.wait(30)
    return ph


def counter_period(gpu: int, seconds: float = 3.0) -> tuple[float | None, float]:
    """How often the energy counter moves (median ms between changes) and
    how long one read takes (ms), read with pynvml directly in a tight loop."""
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(gpu)
        last, changes, reads = None, [], 0
        t_end = time.perf_counter() + seconds
        t_last = None
        while time.perf_counter() < t_end:
            v = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
            reads += 1
            t = time.perf_counter()
            if last is not None and v != last:
                if t_last is not None:
                    changes.append(t - t_last)
                t_last = t
            last = v
        period = statistics.median(changes) * 1000 if changes else None
        return period, seconds * 1000 / max(reads, 1)
    finally:
        pynvml.nvmlShutdown()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--backend", choices=("auto", "torch", "cuda"), default="auto")
    ap.add_argument("--record", type=Path)
    ap.add_argument("--worker", choices=PHASES[1:], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.seconds, args.backend)

    try:
        import pynvml  # noqa: F401
    except ImportError:
        print("nvidia-ml-py is not installed: pip install nvidia-ml-py")
        return 2
    from bk.core.activity import Tracker, margin_mw
    from bk.core.models import Reservation
    from bk.core.usage import Folder
    from bk.gpu.nvml import NvmlBackend
    from bk.gpu.procinfo import CpuTrees

    be = NvmlBackend(proc_root="/proc")
    inv = be.inventory()
    if inv.source != "nvml" or not inv.gpus:
        print(f"no GPU through NVML ({be.reason or inv.source})")
        return 2
    if not 0 <= args.gpu < inv.count:
        print(f"no GPU {args.gpu}: NVML sees {inv.count}")
        return 2
    args.backend = choose_backend(args.backend)
    g = inv.gpus[args.gpu]
    first = be.snapshot(int(time.time())).by_index()[args.gpu]
    others = [p.pid for p in first.processes or ()]
    print(f"GPU {args.gpu}: {g.name} {g.uuid}, workload through {args.backend}, {args.seconds:g} s a phase")
    if others:
        print(f"warning: GPU {args.gpu} already runs processes {others}: the idle phase is not idle")
    now = int(time.time())
    res = Reservation(id="device-check", uid=os.getuid(), user="you", gpus=(args.gpu,), mode="exclusive",
                      share=2, start=now - 60, end=now + 86400, created=now - 60)
    tracker = Tracker(1.0)
    trees = CpuTrees(rescan_s=5)
    folder = Folder(60, 1, capacity=2)
    records: list = []
    lines = [] if args.record else None
    phases = {}
    for name in PHASES:
        print(f"  {name} ...", flush=True)
        phases[name] = run_phase(name, args, be, args.gpu, g.uuid, res, tracker, trees, folder, records, lines, now)
    records += folder.flush()
    period, read_ms = counter_period(args.gpu)

    checks = []

    def check(name, ok, detail):
        checks.append((name, bool(ok), detail))

    print(f"\n{'phase':<6}{'power W':>9}{'util %':>8}{'SM %':>6}{'MiB':>7}{'CPU %':>7}  {'booking':<22}{'GPU alone':<20}")
    for name, ph in phases.items():
        if ph.error:
            print(f"{name:<6}  could not run: {ph.error}")
            check(f"{name}: workload runs", False, ph.error)
            continue
        rows = ph.rows[2:] or ph.rows                    # the first samples still see the change
        pw = statistics.median(r[1] for r in rows if r[1] is not None) / 1000 if any(r[1] for r in rows) else None
        util = statistics.median(r[2] for r in rows if r[2] is not None) if rows else None
        sm = max((r[3] for r in rows if r[3] is not None), default=None)
        mem = max((r[4] for r in rows if r[4] is not None), default=None)
        cpu = max((r[9] for r in rows if r[9] is not None), default=None)
        states = {f"{r[5]}/{r[6]}" for r in rows}
        gstates = {f"{r[7]}/{r[8]}" for r in rows}
        print(f"{name:<6}{pw if pw is None else round(pw, 1)!s:>9}{util!s:>8}{sm!s:>6}{mem!s:>7}{cpu!s:>7}  "
              f"{','.join(sorted(states)):<22}{','.join(sorted(gstates)):<20}")
        if name == "spin":
            # without per-process SM the power alone says the same: idle-held (memory-held)
            check("spin: the GPU's own judgement is idle-held (spin), not fooled",
                  gstates <= {"idle-held/spin", "idle-held/memory-held"} and gstates, gstates)
        elif name == "burn":
            check("burn: the booking is active", {s.split("/")[0] for s in states} == {"active"}, states)
        else:
            want = {"idle": "empty/no-process", "held": "idle-held/memory-held"}[name]
            check(f"{name}: the booking is {want}", states == {want}, states)
        if name == "held":
            check("held: its 1 GiB is listed", mem is not None and mem >= 1024, mem)
    base = tracker.baselines.get(g.uuid)
    check("the idle baseline was learned", base is not None, base)
    if base is not None:
        limit = first.power_limit_mw
        print(f"\nidle baseline {base / 1000:.1f} W; work threshold {(base + margin_mw(limit)) / 1000:.1f} W "
              f"(power limit {limit / 1000 if limit else None} W)")
    burn = phases["burn"].rows[2:]
    if len(burn) >= 3 and all(r[10] is not None for r in burn):
        e = (burn[-1][10] - burn[0][10]) / 1000                   # J
        secs = burn[-1][0] - burn[0][0]
        mean_w = statistics.mean(r[1] for r in burn) / 1000
        ratio = (e / secs) / mean_w if secs and mean_w else None
        print(f"burn: counter {e / secs:.1f} W average over {secs} s; power readings {mean_w:.1f} W "
              f"(ratio {ratio:.3f})")
        check("the counter's average agrees with the power readings (25 %)", ratio and 0.75 <= ratio <= 1.25, ratio)
    else:
        check("the energy counter is readable", False, "no counter during the burn phase")
    print(f"energy counter moves every {period if period is None else round(period, 1)} ms "
          f"(a read takes {read_ms:.3f} ms)")
    check("the energy counter moves", period is not None, period)
    mine = [(r.energy_mj, sum(u.energy_mj or 0 for u in r.uses if u.reservation == res.id))
            for r in records if r.gpu == args.gpu and r.energy_mj is not None and
            any(u.reservation == res.id for u in r.uses)]
    check("the exclusive booking gets the counter's delta exactly", mine and all(a == b for a, b in mine), mine[:3])
    if lines is not None:
        head = {"trace": args.record.stem, "description": f"recorded on {g.name} by benchmarks/gpu_activity.py "
                f"({args.backend}): " + ", ".join(PHASES), "interval_s": 1, "gpus": 1,
                "limit_mw": first.power_limit_mw, "mem_total_mib": g.mem_total_mib, "bookings": []}
        args.record.write_text("\n".join(json.dumps(x, separators=(",", ":")) for x in [head] + lines) + "\n")
        print(f"recorded {len(lines)} samples in {args.record}")
    print()
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}" + ("" if ok else f"  ({detail})"))
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
