"""The one GPU gateway.  Nothing outside bk/gpu looks at GPUs.

A backend answers two questions of different cost (``bk.core.telemetry``):
``inventory()``, the stable facts (count, UUIDs, names, memory totals), and
``snapshot(now)``, the live view with its source and its gaps.  Unknown
values are ``None``, never 0 and never an exception: a GPU whose telemetry
failed is still a GPU that can be booked.  ``fingerprint()`` names the
hardware (or simulation) cheaply, without initialising a driver, so that a
cached inventory can be trusted until it changes.

Opening a backend does no I/O; the first question does.

Choice of backend (``open_backend``):
  1. ``BK_GPU_SIM_FILE=path.json``: simulated GPUs with live data (docs/SIMULATION.md);
  2. ``BK_GPU_COUNT=N``: N simulated GPUs with unknown live data;
  3. NVML (``bk.gpu.nvml``), when the NVIDIA driver is loaded (its
     /proc/driver/nvidia/version exists) and ``pynvml`` can be found; nothing
     is imported or initialised until the first question, and when NVML does
     not answer then, that backend stands in for the next one with the
     reason "no NVML driver answered";
  4. ``nvidia-smi`` (``bk.gpu.smi``), when the driver is loaded and the
     tool is on PATH (after NVML failed, or without pynvml): device readings
     without a process list (the gap "processes"); when it does not answer
     either, it stands in for the simulation below, with the reason;
  5. a simulation of ``fallback_count`` GPUs, reported as such.

``simulated=True`` (the configuration's ``simulated_gpus``: a trial or CI
server without GPUs, said at install time) takes the place of 3-5: a
count-only simulation of ``fallback_count`` GPUs chosen on purpose, with no
``reason``, so nothing reads it as a fault; the driver is never looked for.

Every backend that lists processes fills in their owner, label, start and
container from /proc under ``proc_root`` (``bk.gpu.procinfo``).
"""

from __future__ import annotations

from bk.core.errors import ConfigError
from bk.core.telemetry import Inventory, Snapshot

# The fallback's reason on a machine without the NVIDIA kernel driver (no
# tool can answer there); doctor recognises it to name the real fix.
# The source name of a server's GPUs simulated on purpose (simulated_gpus).
SIMULATED = "simulated"
NO_DRIVER_LOADED = "no NVIDIA driver is loaded: no /proc/driver/nvidia/version; simulating"


class Backend:
    """What every backend provides (a plain base class rather than a
    typing.Protocol: importing typing costs every command start-up time)."""

    name: str = "none"        # "sim-file", "sim-count", "nvml", ...
    simulated: bool = True
    reason: str | None = None  # why this backend was chosen, when it is a fallback

    def fingerprint(self) -> str | None:
        """A cheap identity of what this backend sees; None: cannot tell
        without asking (then an inventory is never taken from a cache)."""
        return None

    def static_inventory(self) -> Inventory | None:
        """The inventory when knowing it costs nothing (no I/O, no driver:
        a count-only simulation); None otherwise."""
        return None

    def inventory(self) -> Inventory:
        raise NotImplementedError

    def snapshot(self, now: int) -> Snapshot:
        raise NotImplementedError


def open_backend(env: dict, fallback_count: int | None = None, *, simulated: bool = False,
                 proc_root: str = "/proc") -> Backend:
    from bk.gpu import sim

    path = env.get("BK_GPU_SIM_FILE")
    if path:
        return sim.FileBackend(path, proc_root=proc_root)
    count = env.get("BK_GPU_COUNT")
    if count is not None:
        try:
            n = int(count)
        except ValueError:
            n = -1
        if not 1 <= n <= 64:
            raise ConfigError(f"BK_GPU_COUNT must be a whole number from 1 to 64, got {count!r}",
                              hint="export BK_GPU_COUNT=4")
        return sim.CountBackend(n)
    n = fallback_count or 4
    if simulated:
        return sim.CountBackend(n, name=SIMULATED)
    # Without the kernel driver neither NVML nor nvidia-smi can answer, and
    # a machine without one is told so by one stat, not by running a tool.
    if not _driver_loaded(proc_root):
        return sim.CountBackend(n, reason=NO_DRIVER_LOADED)
    if _pynvml_installed():
        from bk.gpu.nvml import NO_DRIVER, NvmlBackend

        def after_nvml() -> Backend:
            """NVML did not answer: nvidia-smi if it is on PATH (looked up
            only now), else the simulation."""
            smi = _smi_path(env)
            if smi is None:
                return sim.CountBackend(n, reason=NO_DRIVER)
            from bk.gpu.smi import SmiBackend

            return SmiBackend(n, exe=smi, proc_root=proc_root)
        return NvmlBackend(n, proc_root=proc_root, fallback=after_nvml)
    smi = _smi_path(env)
    if smi is not None:
        from bk.gpu.smi import SmiBackend

        return SmiBackend(n, exe=smi, proc_root=proc_root, reason="pynvml is not installed")
    return sim.CountBackend(n, reason="the NVIDIA driver is loaded, but pynvml is not installed "
                                      "and nvidia-smi is not on PATH; simulating")


def _smi_path(env: dict) -> str | None:
    """nvidia-smi on the caller's PATH (a lookup, no run)."""
    import shutil

    return shutil.which("nvidia-smi", path=env.get("PATH", "/usr/bin:/bin"))


def _driver_loaded(proc_root: str) -> bool:
    import os

    return os.path.exists(os.path.join(proc_root, "driver/nvidia/version"))


def _pynvml_installed() -> bool:
    from importlib.util import find_spec

    try:
        return find_spec("pynvml") is not None
    except (ImportError, ValueError):
        return False
