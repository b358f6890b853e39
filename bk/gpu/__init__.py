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
     not answer then, that backend stands in for the simulation below with
     the reason "no NVML driver answered";
  4. a simulation of ``fallback_count`` GPUs, reported as such.
"""

from __future__ import annotations

from bk.core.errors import ConfigError
from bk.core.telemetry import Inventory, Snapshot


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


def open_backend(env: dict, fallback_count: int | None = None, *, proc_root: str = "/proc") -> Backend:
    from bk.gpu import sim

    path = env.get("BK_GPU_SIM_FILE")
    if path:
        return sim.FileBackend(path)
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
    if _nvml_possible(proc_root):
        from bk.gpu.nvml import NvmlBackend

        return NvmlBackend(fallback_count or 4, proc_root=proc_root)
    return sim.CountBackend(fallback_count or 4, reason="no GPU backend available; simulating")


def _nvml_possible(proc_root: str) -> bool:
    """A driver is loaded and pynvml is installed: two cheap looks, no import
    of pynvml and no NVML call."""
    import os

    if not os.path.exists(os.path.join(proc_root, "driver/nvidia/version")):
        return False
    from importlib.util import find_spec

    try:
        return find_spec("pynvml") is not None
    except (ImportError, ValueError):
        return False
