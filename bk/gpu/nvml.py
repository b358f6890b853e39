"""The NVML backend: the real GPUs, through ``pynvml`` (``nvidia-ml-py``).

The one module of bk that imports ``pynvml``, and only inside the first
question (``inventory()`` or ``snapshot()``): importing this module or
asking its ``fingerprint()`` touches no driver, so ``bk l`` with a cached
inventory makes no NVML call.

NVML is initialised once per process and its device handles are reused.  A
driver error (a GPU lost, the driver unloaded, a timeout) never reaches the
caller: the reading becomes unknown, the snapshot names the gap, and the next
question at least ``retry_s`` later shuts NVML down and initialises it again
(the handles rebuilt).  A call the device does not support is a gap, not an
error, and is not retried as one.  When NVML never answered in this process,
the backend stands in for its fallback (nvidia-smi when it is on PATH, else
a count-only simulation), reported as such ("no NVML driver answered"), and
tries NVML again after ``retry_s``.

Each process's owner, label, start and container come from /proc
(``bk.gpu.procinfo``), under the same injectable root.

Power and energy.  ``nvmlDeviceGetPowerUsage`` is the board's draw in
milliwatts, but on A100/H100 it is an average refreshed every so often that
covers only part of the time between two looks; ``nvmlDeviceGetTotalEnergy
Consumption`` is a counter of millijoules since the driver loaded (Volta and
later), which covers all of it, so energy is taken from the counter's
difference between looks, never from power times time.  Both, and the
enforced power limit, are None where the device cannot say (older GPUs,
MIG instances); they are not gaps, so a GPU without them reads as before.

Gaps this backend may report (besides the simulation's): ``nvml`` (the
driver failed during this look: some GPUs are unknown), ``uuid`` (a GPU did
not say its UUID: a stand-in is used), ``process_sm`` (no per-process SM
utilisation on some GPU), ``mig`` (some GPU runs in MIG mode: its name says
"MIG", its readings are the whole GPU's and its processes may be hidden).
"""

from __future__ import annotations

import os
import time

from bk.core.models import GpuInfo, GpuProcess
from bk.core.telemetry import Inventory, Snapshot
from bk.gpu import Backend

MIB = 1024 * 1024
LIVE_GAPS = ("utilisation", "memory", "processes", "temperature")
CAPABILITIES = ("uuid", "memory", "utilisation", "temperature", "processes", "process_sm",
                "process_owner", "mig", "power", "energy")
NO_DRIVER = "no NVML driver answered"

# NVML return codes that mean "this device cannot tell" rather than "the
# driver is in trouble" (pynvml's NVML_ERROR_* values, stable in the C API).
_FIELD_ERRORS = frozenset({
    2,   # INVALID_ARGUMENT
    3,   # NOT_SUPPORTED
    4,   # NO_PERMISSION
    6,   # NOT_FOUND
    7,   # INSUFFICIENT_SIZE
    13,  # FUNCTION_NOT_FOUND
    21,  # NO_DATA
    25,  # ARGUMENT_VERSION_MISMATCH
    26,  # DEPRECATED
})
_NOT_FOUND = 6


class _DriverError(Exception):
    """NVML failed in a way that calls for a rebuild."""


class _Unsupported(Exception):
    """This device cannot answer this question."""

    def __init__(self, code: int | None):
        super().__init__(code)
        self.code = code


def driver_fingerprint(proc_root: str = "/proc") -> str | None:
    """The loaded driver and the boot, read from /proc without NVML; None
    when either cannot be read (then nothing is taken from a cache)."""
    try:
        with open(os.path.join(proc_root, "driver/nvidia/version"), "rb") as f:
            version = f.readline().decode("utf-8", "replace").strip()
        with open(os.path.join(proc_root, "sys/kernel/random/boot_id"), "rb") as f:
            boot = f.read().decode("ascii", "replace").strip()
    except OSError:
        return None
    if not version or not boot:
        return None
    return f"nvml:{boot}:{' '.join(version.split())}"


class _Gpu:
    """One device: its handle and its stable facts."""

    __slots__ = ("index", "handle", "uuid", "name", "mem_total_mib", "mig", "lost", "sm_since")

    def __init__(self, index, handle, uuid, name, mem_total_mib, mig):
        self.index, self.handle, self.uuid, self.name = index, handle, uuid, name
        self.mem_total_mib, self.mig = mem_total_mib, mig
        self.lost = False
        self.sm_since = 0       # NVML's microsecond timestamp of the last SM sample read


class NvmlBackend(Backend):
    """NVML when a driver answers, else a reported count-only simulation."""

    def __init__(self, fallback_count: int = 4, *, proc_root: str = "/proc",
                 clock=time.monotonic, retry_s: float = 5.0, fallback=None):
        self.name = "nvml"
        self.simulated = False
        self.reason = None
        self._fallback_count = fallback_count
        self._proc_root = proc_root
        self._clock = clock
        self._retry_s = retry_s
        self._nv = None                 # the pynvml module, once imported
        self._up = False                # nvmlInit succeeded and not shut down since
        self._gpus: list[_Gpu] | None = None
        self._inventory: Inventory | None = None
        self._next_try = None           # monotonic time before which no (re)initialisation is tried
        self._broken = False            # a driver error asks for a rebuild
        self._fallback = None
        self._make_fallback = fallback  # () -> Backend; None: a count-only simulation
        self._procinfo = None
        self._lock = None

    # -- the seam ------------------------------------------------------

    def fingerprint(self) -> str | None:
        return driver_fingerprint(self._proc_root)

    def static_inventory(self) -> Inventory | None:
        return None

    def inventory(self) -> Inventory:
        with self._locked():
            self._ensure()
            if self._inventory is not None:
                return self._inventory
            inv = self._fallback.inventory()
            self._mirror()
            return inv

    def snapshot(self, now: int) -> Snapshot:
        with self._locked():
            self._ensure()
            if self._gpus is None:
                if self._inventory is not None:     # known GPUs, driver gone for now
                    return self._unknown(now)
                snap = self._fallback.snapshot(now)
                self._mirror()
                if snap.reason != self.reason:     # say why NVML is not the source, too
                    snap = Snapshot(snap.taken_at, snap.source, snap.gpus, snap.gaps, snap.simulated,
                                    self.reason, snap.capabilities)
                return snap
            gpus, gaps = [], set()
            for g in self._gpus:
                gpus.append(self._read(g, gaps))
            if any(g.mig for g in self._gpus):
                gaps.add("mig")
            if any(g.uuid.startswith("nvml-index-") for g in self._gpus):
                gaps.add("uuid")
            return Snapshot(now, "nvml", tuple(gpus), tuple(sorted(gaps)), False, None, CAPABILITIES)

    def close(self) -> None:
        with self._locked():
            self._shutdown()

    # -- initialisation, back-off, rebuild -----------------------------

    def _locked(self):
        if self._lock is None:
            import threading

            self._lock = threading.Lock()
        return self._lock

    def _ensure(self) -> None:
        """Make NVML ready if it is not and a try is due; never raises."""
        if self._up and not self._broken:
            return
        now = self._clock()
        if self._next_try is not None and now < self._next_try:
            return
        if self._broken:
            self._shutdown()
        self._next_try = now + self._retry_s
        self._broken = False
        try:
            self._init()
        except _DriverError:
            self._shutdown()
            self._gpus = None
        self._settle()

    def _settle(self) -> None:
        """Say what this backend is now: NVML, or the reported simulation."""
        if self._inventory is not None:
            self.name, self.simulated, self.reason, self._fallback = "nvml", False, None, None
            return
        if self._fallback is None:
            if self._make_fallback is not None:
                self._fallback = self._make_fallback()
            else:
                from bk.gpu import sim

                self._fallback = sim.CountBackend(self._fallback_count, reason=NO_DRIVER)
        self._mirror()

    def _mirror(self) -> None:
        """Standing in: say what the fallback is, and why."""
        fb = self._fallback
        why = fb.reason if fb.reason and fb.reason != NO_DRIVER else None
        self.name, self.simulated = fb.name, fb.simulated
        self.reason = f"{NO_DRIVER}; {why}" if why else NO_DRIVER

    def _init(self) -> None:
        if self._nv is None:
            try:
                import pynvml
            except ImportError:
                raise _DriverError("pynvml missing") from None
            self._nv = pynvml
        nv = self._nv
        self._call(nv.nvmlInit)
        self._up = True
        count = self._call(nv.nvmlDeviceGetCount)
        gpus = []
        for i in range(count):
            h = self._call(nv.nvmlDeviceGetHandleByIndex, i)
            uuid = _text(self._field(nv.nvmlDeviceGetUUID, h)) or f"nvml-index-{i}"
            name = _text(self._field(nv.nvmlDeviceGetName, h)) or "NVIDIA GPU"
            mem = self._field(nv.nvmlDeviceGetMemoryInfo, h)
            mig = self._field(nv.nvmlDeviceGetMigMode, h)
            is_mig = bool(mig and mig[0] == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1))
            if is_mig:
                name += " (MIG)"
            gpus.append(_Gpu(i, h, uuid, name, mem.total // MIB if mem is not None else None, is_mig))
        self._gpus = gpus
        self._inventory = Inventory("nvml", tuple(GpuInfo(g.index, g.uuid, g.name, mem_total_mib=g.mem_total_mib)
                                                  for g in gpus), False, None)

    def _shutdown(self) -> None:
        if self._up:
            self._up = False
            try:
                self._nv.nvmlShutdown()
            except Exception:       # noqa: BLE001 - a failing shutdown changes nothing for us
                pass
        self._gpus = None

    # -- calls ---------------------------------------------------------

    def _call(self, fn, *args):
        """``fn(*args)``; any NVML failure is a driver error."""
        try:
            return fn(*args)
        except Exception as e:      # noqa: BLE001 - NVMLError and ctypes trouble alike
            raise _DriverError(_code(e)) from None

    def _field(self, fn, *args):
        """``fn(*args)``, None when the device cannot say; a driver error
        propagates."""
        try:
            return self._ask(fn, *args)
        except _Unsupported:
            return None

    def _ask(self, fn, *args):
        try:
            return fn(*args)
        except Exception as e:      # noqa: BLE001
            code = _code(e)
            if code is None or code in _FIELD_ERRORS:
                raise _Unsupported(code) from None
            raise _DriverError(code) from None

    # -- one look --------------------------------------------------------

    def _read(self, g: _Gpu, gaps: set) -> GpuInfo:
        info = GpuInfo(g.index, g.uuid, g.name, mem_total_mib=g.mem_total_mib)
        if g.lost:
            gaps.update(LIVE_GAPS)
            gaps.add("nvml")
            return info
        nv = self._nv
        try:
            mem = self._field(nv.nvmlDeviceGetMemoryInfo, g.handle)
            if mem is not None:
                info.mem_total_mib, info.mem_used_mib = mem.total // MIB, mem.used // MIB
            else:
                gaps.add("memory")
            util = self._field(nv.nvmlDeviceGetUtilizationRates, g.handle)
            if util is not None:
                info.util = int(util.gpu)
            else:
                gaps.add("utilisation")
            temp = self._field(nv.nvmlDeviceGetTemperature, g.handle, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
            if temp is not None:
                info.temperature = int(temp)
            else:
                gaps.add("temperature")
            info.power_mw = _int(self._field(nv.nvmlDeviceGetPowerUsage, g.handle))
            info.power_limit_mw = _int(self._field(nv.nvmlDeviceGetEnforcedPowerLimit, g.handle))
            info.energy_mj = _int(self._field(nv.nvmlDeviceGetTotalEnergyConsumption, g.handle))
            info.processes = self._processes(g, gaps)
        except _DriverError:
            g.lost = True
            if not self._broken:        # back off from the first error, then rebuild
                self._broken = True
                self._next_try = self._clock() + self._retry_s
            gaps.update(LIVE_GAPS)
            gaps.add("nvml")
            return GpuInfo(g.index, g.uuid, g.name, mem_total_mib=g.mem_total_mib)
        return info

    def _processes(self, g: _Gpu, gaps: set) -> list[GpuProcess] | None:
        nv = self._nv
        compute = self._field(nv.nvmlDeviceGetComputeRunningProcesses, g.handle)
        graphics = self._field(nv.nvmlDeviceGetGraphicsRunningProcesses, g.handle)
        if compute is None and graphics is None:
            gaps.add("processes")
            return None
        mem: dict[int, int | None] = {}
        for p in (compute or []) + (graphics or []):
            used = p.usedGpuMemory // MIB if p.usedGpuMemory is not None else None
            if p.pid in mem:        # the same process in both lists: its memory once
                old = mem[p.pid]
                used = max(old, used) if old is not None and used is not None else (old if used is None else used)
            mem[p.pid] = used
        sm = self._sm(g, gaps) if mem else {}
        if self._procinfo is None:
            from bk.gpu.procinfo import ProcInfo

            self._procinfo = ProcInfo(self._proc_root)
        fill = self._procinfo.fill
        return [fill(GpuProcess(pid=pid, mem_mib=m, sm=sm.get(pid))) for pid, m in sorted(mem.items())]

    def _sm(self, g: _Gpu, gaps: set) -> dict[int, int]:
        """Per-process SM utilisation since the last look: the highest of the
        driver's samples since then, so that a burst between two looks is
        not lost behind a quiet last sample (the activity state counts any
        compute as use)."""
        try:
            samples = self._ask(self._nv.nvmlDeviceGetProcessUtilization, g.handle, g.sm_since)
        except _Unsupported as e:
            if e.code != _NOT_FOUND:    # NOT_FOUND: no sample since the last look
                gaps.add("process_sm")
            return {}
        out: dict[int, int] = {}
        for s in samples:
            ts, pid, sm = int(s.timeStamp), int(s.pid), int(s.smUtil)
            if sm > out.get(pid, -1):
                out[pid] = sm
            g.sm_since = max(g.sm_since, ts)
        return out

    def _unknown(self, now: int) -> Snapshot:
        gpus = tuple(GpuInfo(g.index, g.uuid, g.name, mem_total_mib=g.mem_total_mib)
                     for g in self._inventory.gpus)
        return Snapshot(now, "nvml", gpus, tuple(sorted(LIVE_GAPS + ("nvml",))), False, None, CAPABILITIES)


def _code(e: BaseException) -> int | None:
    v = getattr(e, "value", None)
    return v if isinstance(v, int) else None


def _int(v) -> int | None:
    """A reading as an int; None stays None, and so does anything the
    bindings return that is not a number."""
    if v is None or isinstance(v, bool):
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _text(v) -> str | None:
    if v is None:
        return None
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    return str(v).strip() or None
