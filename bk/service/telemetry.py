"""The service's view of the GPUs, taken only when a command needs it.

Commands declare what they need: the inventory (``bk l`` needs memory
totals for the effective-memory column) or a live snapshot (``bk st``,
``bk g``, placement).  The backend is opened on the first question, and the
inventory comes from the cache keyed by the backend's fingerprint when it
can, so a command that needs nothing live never initialises a driver.  The
broker passes ``fixed`` snapshots its refresher took, so no request waits
for the GPUs.

A live snapshot comes from the monitor's file (``bk.store.snapshot``) when
one is fresh (younger than three of its sample intervals), every reading in
it is in range, and it describes the same GPUs as this process would see:

* its inventory fingerprint equals the backend's cheap one (a ``stat`` or
  two, no driver), and its GPUs are the inventory's, count and UUIDs, one
  by one.  The inventory is the cached one (keyed by that fingerprint), so
  this costs one look at the backend per boot and user, and one per broker
  life; the monitor's file is never the source of the inventory it is
  checked against.  An inventory that is a stand-in (the driver did not
  answer this process: ``reason`` set) knows less than the monitor, whose
  account may open the devices: then the fingerprint decides.
* or the backend is a count-only simulation of as many GPUs (whose UUIDs
  are invented, so only the count can agree);
* and, where the configuration fixes ``gpu_count``, it has that many.

A snapshot of 2 of 4 GPUs is never used in part.  Only otherwise is the
backend asked.  So with ``bk m`` running, no ``bk st`` after the first of a
boot and no broker refresh after its first takes a look of its own.
"""

from __future__ import annotations

from bk.core.telemetry import Inventory, Snapshot, identities

TYPE_CHECKING = False
if TYPE_CHECKING:   # annotations only: collections.abc would import collections
    from collections.abc import Callable


class Telemetry:
    def __init__(self, open_backend: Callable[[], object], *, clock: Callable[[], int],
                 cache_dir: str | None = None, monitor: object = None):
        self._open = open_backend
        self._clock = clock
        self._cache_dir = cache_dir
        # Where the monitor publishes and whose files to believe: settings
        # (resolved on the first live look, so that commands that take none
        # import nothing for it), a (dir, owner uid) pair, or None: never
        # read a monitor's snapshot.
        self._monitor = monitor
        self._expected: int | None = None       # the configuration's gpu_count, when it fixes one
        self._cached = False                    # whether the inventory came from the cache
        self.from_monitor = False              # whether the last snapshot was the monitor's
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
                self._inventory, self._cached = hit, True
                return hit
        inv = backend.inventory()
        self._remember(inv, print_)
        return inv

    def snapshot(self) -> Snapshot:
        """This command's one look at the live GPUs (never one per row)."""
        if self._snapshot is None:
            backend = self.backend
            snap = self._monitor_snapshot(backend)
            self.from_monitor = snap is not None
            self._snapshot = snap if snap is not None else backend.snapshot(self._clock())
            if self._inventory is None:
                free = backend.static_inventory()
                print_ = backend.fingerprint() if self._cache_dir and free is None else None
                self._remember(free or _inventory_of(self._snapshot, backend), print_)
        return self._snapshot

    def _monitor_where(self) -> tuple[str, int] | None:
        if self._monitor is not None and not isinstance(self._monitor, tuple):
            from bk.store.snapshot import monitor_dir, monitor_owner

            count = self._monitor["gpu_count"]
            self._expected = count if isinstance(count, int) and not isinstance(count, bool) else None
            self._monitor = (monitor_dir(self._monitor), monitor_owner(self._monitor))
        return self._monitor

    def _monitor_snapshot(self, backend) -> Snapshot | None:
        """The monitor's snapshot when it describes the GPUs this process
        would see (the module's rules); None otherwise."""
        where = self._monitor_where()
        if where is None:
            return None
        from bk.store.snapshot import read_snapshot_file

        got = read_snapshot_file(where[0], self._clock(), owner=where[1])
        if got is None:
            return None
        snap = got.snapshot
        if self._expected is not None and len(snap.gpus) != self._expected:
            return None
        free = backend.static_inventory()
        if free is not None and getattr(backend, "simulated", False):
            return snap if free.count == len(snap.gpus) else None
        print_ = backend.fingerprint()
        if print_ is None or got.fingerprint != print_:
            return None
        known = self.inventory()
        if known.reason is None and identities(known.gpus) != identities(snap.gpus) and self._cached:
            # The cache may be what is out of date (a GPU changed within the
            # boot): one look at the backend settles it, and is remembered.
            self._cached = False
            known = backend.inventory()
            self._remember(known, print_ if self._cache_dir else None)
        if known.reason is None and identities(known.gpus) != identities(snap.gpus):
            return None
        return snap

    def heartbeat(self):
        """The monitor's heartbeat now (``bk.store.snapshot.Heartbeat``);
        ``absent`` when this telemetry reads no monitor."""
        from bk.store.snapshot import ABSENT_HEARTBEAT, read_heartbeat

        where = self._monitor_where()
        if where is None:
            return ABSENT_HEARTBEAT
        return read_heartbeat(where[0], self._clock(), owner=where[1])

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

    def heartbeat(self):
        from bk.store.snapshot import ABSENT_HEARTBEAT

        return ABSENT_HEARTBEAT


def monitor_json(telemetry) -> dict:
    """``data.monitor`` of ``bk st --json``: the heartbeat of the monitor
    this telemetry reads (``absent`` for one that reads none)."""
    beat = getattr(telemetry, "heartbeat", None)
    if beat is None:
        from bk.store.snapshot import ABSENT_HEARTBEAT

        return ABSENT_HEARTBEAT.to_json()
    return beat().to_json()


def _inventory_of(snap: Snapshot, backend) -> Inventory:
    from bk.core.models import GpuInfo

    return Inventory(snap.source, tuple(GpuInfo(g.index, g.uuid, g.name, mem_total_mib=g.mem_total_mib)
                                        for g in snap.gpus),
                     bool(getattr(backend, "simulated", True)), getattr(backend, "reason", None))
