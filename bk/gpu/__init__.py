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
  3. NVML (``pynvml``), when importable and a driver answers (a later issue);
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


def open_backend(env: dict, fallback_count: int | None = None) -> Backend:
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
    return sim.CountBackend(fallback_count or 4, reason="no GPU backend available; simulating")
