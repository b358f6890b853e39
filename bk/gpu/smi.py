"""The nvidia-smi backend: device readings when NVML cannot be used from
Python (``pynvml`` not installed) but the driver's own tool answers.

``nvidia-smi --query-gpu=... --format=csv,noheader,nounits`` prints one line
per GPU, fields separated by ", ", with ``[N/A]`` or ``[Not Supported]``
(older drivers: ``N/A``) where a device cannot tell; those become None.  It
lists no processes in this form (``--query-compute-apps`` exists but gives
no owner and races with the device query), so every snapshot carries the
gap "processes" and ``processes`` is None: "cannot tell", never "none".

The tool is run with a short timeout and its output is bounded: a hung
driver (nvidia-smi can block for tens of seconds on a GPU that fell off the
bus) or a broken binary must not hang ``bk st``.  A failure (not on PATH,
exit status, timeout, output that does not parse) makes this look unknown;
when nvidia-smi never answered in this process, the backend stands in for a
count-only simulation with the reason, as the NVML backend does, and asks
again after ``retry_s``.
"""

from __future__ import annotations

import os
import time

from bk.core.models import GpuInfo
from bk.core.telemetry import Inventory, Snapshot
from bk.gpu import Backend

QUERY = "index,uuid,name,memory.total,memory.used,utilization.gpu,temperature.gpu"
TIMEOUT_S = 3.0
MAX_OUTPUT = 256 * 1024
CAPABILITIES = ("uuid", "memory", "utilisation", "temperature")
GAPS = ("processes",)
NO_ANSWER = "nvidia-smi did not answer"
LIVE_GAPS = ("memory", "processes", "temperature", "utilisation")


class SmiError(Exception):
    """nvidia-smi failed; the message says how."""


def run_query(exe: str = "nvidia-smi", *, timeout_s: float = TIMEOUT_S, env: dict | None = None) -> str:
    """The tool's output for QUERY, or SmiError.  Reads at most MAX_OUTPUT
    bytes and waits at most ``timeout_s`` in all, then kills it."""
    import selectors
    import subprocess

    try:
        proc = subprocess.Popen([exe, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    except OSError as e:
        raise SmiError(f"{exe}: {e.strerror}") from None
    deadline = time.monotonic() + timeout_s
    chunks, size, why = [], 0, None
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    why = f"no answer within {timeout_s:g} s"
                    break
                if not sel.select(left):
                    continue
                data = os.read(proc.stdout.fileno(), 65536)
                if not data:
                    break
                chunks.append(data)
                size += len(data)
                if size > MAX_OUTPUT:
                    why = f"more than {MAX_OUTPUT} bytes of output"
                    break
        if why is None:
            try:
                rc = proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                why = f"did not exit within {timeout_s:g} s"
            else:
                if rc != 0:
                    why = f"exit status {rc}"
    finally:
        # It runs in a session of its own: a wrapper script and whatever it
        # started go with it, not only the direct child.  Only while it is
        # unreaped: until then its PID, and so its group ID, cannot be reused.
        if proc.poll() is None:
            import signal

            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                proc.kill()
            proc.wait()
        proc.stdout.close()
    if why:
        raise SmiError(f"{exe}: {why}")
    return b"".join(chunks).decode("utf-8", "replace")


def _value(text: str) -> int | None:
    t = text.strip()
    if not t or t.startswith("[") or t.upper() in ("N/A", "NOT SUPPORTED", "UNKNOWN ERROR"):
        return None
    try:
        return int(float(t))
    except ValueError:
        raise SmiError(f"not a number: {t[:40]!r}") from None


def parse(text: str) -> list[GpuInfo]:
    """The GPUs in the tool's CSV (QUERY's seven fields); SmiError when a
    line does not have them.  A GPU name with a comma in it is kept whole:
    index and UUID come first and the four readings last."""
    gpus = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 7:
            raise SmiError(f"line {n}: expected 7 fields, got {len(parts)}")
        index = _value(parts[0])
        if index is None or index < 0:
            raise SmiError(f"line {n}: no GPU index")
        uuid = parts[1] if parts[1] and not parts[1].startswith("[") else f"smi-index-{index}"
        name = ", ".join(parts[2:-4]) or "NVIDIA GPU"
        total, used, util, temp = (_value(p) for p in parts[-4:])
        gpus.append(GpuInfo(index, uuid, name[:64], mem_total_mib=total, mem_used_mib=used,
                            util=util, temperature=temp, processes=None))
    if not gpus:
        raise SmiError("no GPUs listed")
    gpus.sort(key=lambda g: g.index)
    if [g.index for g in gpus] != list(range(len(gpus))):
        raise SmiError("GPU indices are not 0..N-1")
    return gpus


def _gaps(gpus) -> tuple[str, ...]:
    gaps = set(GAPS)
    for g in gpus:
        if g.mem_used_mib is None or g.mem_total_mib is None:
            gaps.add("memory")
        if g.util is None:
            gaps.add("utilisation")
        if g.temperature is None:
            gaps.add("temperature")
        if g.uuid.startswith("smi-index-"):
            gaps.add("uuid")
    return tuple(sorted(gaps))


class SmiBackend(Backend):
    """nvidia-smi when it answers, else a reported count-only simulation."""

    def __init__(self, fallback_count: int = 4, *, exe: str = "nvidia-smi", proc_root: str = "/proc",
                 reason: str | None = None, clock=time.monotonic, retry_s: float = 5.0,
                 timeout_s: float = TIMEOUT_S):
        self.name = "nvidia-smi"
        self.simulated = False
        self.reason = reason
        self._why = reason              # why nvidia-smi rather than NVML
        self._exe = exe
        self._proc_root = proc_root
        self._fallback_count = fallback_count
        self._clock, self._retry_s, self._timeout_s = clock, retry_s, timeout_s
        self._inventory: Inventory | None = None
        self._next_try = None
        self._fallback = None

    def fingerprint(self) -> str | None:
        from bk.gpu.nvml import driver_fingerprint

        got = driver_fingerprint(self._proc_root)
        return None if got is None else "smi" + got[4:]

    def _look(self) -> list[GpuInfo] | None:
        now = self._clock()
        if self._next_try is not None and now < self._next_try:
            return None             # failed moments ago: do not wait on it again yet
        try:
            gpus = parse(run_query(self._exe, timeout_s=self._timeout_s))
        except SmiError as e:
            self._next_try = now + self._retry_s
            self._settle(str(e))
            return None
        if self._inventory is None or len(self._inventory.gpus) == len(gpus):
            self._inventory = Inventory("nvidia-smi", tuple(
                GpuInfo(g.index, g.uuid, g.name, mem_total_mib=g.mem_total_mib) for g in gpus), False, None)
        self._settle(None)
        return gpus

    def _settle(self, error: str | None) -> None:
        if self._inventory is not None:
            self.name, self.simulated, self.reason, self._fallback = "nvidia-smi", False, self._why, None
            return
        from bk.gpu import sim

        why = f"{NO_ANSWER} ({error})" if error else NO_ANSWER
        self._fallback = sim.CountBackend(self._fallback_count, reason=why)
        self.name, self.simulated, self.reason = "sim-count", True, why

    def inventory(self) -> Inventory:
        if self._inventory is None:
            self._look()
        return self._inventory if self._inventory is not None else self._fallback.inventory()

    def snapshot(self, now: int) -> Snapshot:
        gpus = self._look()
        if gpus is None:
            if self._inventory is None:
                snap = self._fallback.snapshot(now)
                return Snapshot(now, snap.source, snap.gpus, snap.gaps, True, self.reason)
            gpus = [GpuInfo(g.index, g.uuid, g.name, mem_total_mib=g.mem_total_mib) for g in self._inventory.gpus]
            return Snapshot(now, "nvidia-smi", tuple(gpus), tuple(sorted(set(LIVE_GAPS) | set(GAPS))), False,
                            self.reason, CAPABILITIES)
        return Snapshot(now, "nvidia-smi", tuple(gpus), _gaps(gpus), False, self.reason, CAPABILITIES)
