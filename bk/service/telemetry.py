"""The service's view of the GPUs, taken only when a command needs it.

Commands declare what they need: the inventory (``bk l`` needs memory
totals for the effective-memory column) or a live snapshot (``bk st``,
``bk g``, placement).  The backend is opened on the first question, and the
inventory comes from the cache keyed by the backend's fingerprint when it
can, so a command that needs nothing live never initialises a driver.  The
broker passes ``fixed`` snapshots its refresher took, so no request waits
for the GPUs.
"""

from __future__ import annotations

from collections.abc import Callable

from bk.core.telemetry import Inventory, Snapshot


class Telemetry:
    def __init__(self, open_backend: Callable[[], object], *, clock: Callable[[], int],
                 cache_dir: str | None = None):
        self._open = open_backend
        self._clock = clock
        self._cache_dir = cache_dir
        self._backend = None
        self._inventory: Inventory | None = None
        self._snapshot: Snapshot | None = None

    @property
    def backend(self):
        if self._backend is None:
            self._backend = self._open()
        return self._backend

    def inventory(self) -> Inventory:
        if self._inventory is not None:
            return self._inventory
        if self._snapshot is not None:
            self._inventory = _inventory_of(self._snapshot, self.backend)
            return self._inventory
        backend = self.backend
        free = backend.static_inventory()
        if free is not None:            # a count-only simulation: cheaper than any cache
            self._inventory = free
            return free
        print_ = backend.fingerprint() if self._cache_dir else None
        if print_ is not None:
            from bk.store import inventory as cache

            hit = cache.load(self._cache_dir, print_)
            if hit is not None:
                self._inventory = hit
                return hit
        inv = backend.inventory()
        self._remember(inv, print_)
        return inv

    def snapshot(self) -> Snapshot:
        """This command's one look at the live GPUs (never one per row)."""
        if self._snapshot is None:
            backend = self.backend
            self._snapshot = backend.snapshot(self._clock())
            if self._inventory is None:
                free = backend.static_inventory()
                print_ = backend.fingerprint() if self._cache_dir and free is None else None
                self._remember(free or _inventory_of(self._snapshot, backend), print_)
        return self._snapshot

    def _remember(self, inv: Inventory, print_: str | None) -> None:
        self._inventory = inv
        # A fallback (the driver did not answer this time) is not the
        # hardware's inventory: caching it under the driver's fingerprint
        # would keep the stand-in until the next reboot.
        if print_ is not None and inv.reason is None:
            from bk.store import inventory as cache

            if cache.load(self._cache_dir, print_) != inv:
                cache.save(self._cache_dir, print_, inv)

    def refresh(self) -> None:
        """Forget the snapshot: the next question looks again.  The
        inventory is kept (it is stable for a boot), so a caller that needs
        only it, such as the broker reloading its policy, never waits for
        the next look."""
        self._snapshot = None


class Fixed:
    """Telemetry that answers from one snapshot taken elsewhere (the broker's
    refresher); never touches a backend."""

    def __init__(self, snapshot: Snapshot, inventory: Inventory):
        self._snapshot, self._inventory = snapshot, inventory

    def inventory(self) -> Inventory:
        return self._inventory

    def snapshot(self) -> Snapshot:
        return self._snapshot


def _inventory_of(snap: Snapshot, backend) -> Inventory:
    from bk.core.models import GpuInfo

    return Inventory(snap.source, tuple(GpuInfo(g.index, g.uuid, g.name, mem_total_mib=g.mem_total_mib)
                                        for g in snap.gpus),
                     bool(getattr(backend, "simulated", True)), getattr(backend, "reason", None))
