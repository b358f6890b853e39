"""The per-call context: who asks, when, in which zone, under which policy,
seeing which GPUs, and where warnings go.

Every service call takes one ``Call``.  A front end gets one from
``Service.call()`` (the process's identity and clock) and uses the same one
to build its request (``bk.service.builders``) and to read the result, so
"now" is one instant for the whole command.  The broker builds one per
request from the kernel's peer credentials and its latest GPU snapshot; the
shared service object holds no per-request state.
"""

from __future__ import annotations

import os

from bk.core.models import Policy
from bk.core.record import dataclass, field


@dataclass(frozen=True)
class Actor:
    """Who is asking.  Always from the kernel: the process UID, or
    SO_PEERCRED in the broker; never from a field a client sent."""

    uid: int
    user: str

    @property
    def is_admin(self) -> bool:
        return self.uid == 0


@dataclass(frozen=True)
class Call:
    actor: Actor
    now: int
    tz: object
    policy: Policy
    telemetry: object                      # .inventory() and .snapshot(), taken on demand
    warnings: list[str] = field(default_factory=list, compare=False)
    peer_pid: int | None = None            # the broker's caller, as the kernel saw it
    make_id: object = None                 # () -> str: deterministic IDs for tests; None: random
    ids: dict = field(default_factory=dict, compare=False)
    limits: object = None                  # bk.core.ledgerlimits.LedgerLimits on a shared server; None: none

    def warn(self, *lines: str) -> None:
        for w in lines:
            if w not in self.warnings:
                self.warnings.append(w)

    def new_id(self, key: str = "id") -> str:
        """A random (version 4) UUID, the same for one key within this call,
        so a write that is applied twice (a retried transaction) makes the
        same record.  Built from os.urandom: the uuid module imports
        platform and _uuid, a few milliseconds on every booking."""
        if key not in self.ids and self.make_id is not None:
            self.ids[key] = self.make_id()
        if key not in self.ids:
            b = bytearray(os.urandom(16))
            b[6] = (b[6] & 0x0F) | 0x40      # version 4
            b[8] = (b[8] & 0x3F) | 0x80      # RFC 4122 variant
            h = b.hex()
            self.ids[key] = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
        return self.ids[key]

    def gpu_mem(self) -> dict[int, int | None]:
        """Memory totals per GPU, from the inventory (no live look)."""
        return self.telemetry.inventory().mem_totals()
