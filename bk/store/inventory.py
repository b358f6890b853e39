"""The cached GPU inventory: one small file in the user's cache directory
(``$XDG_CACHE_HOME/bk``: deleting it only costs the next command a look).

The inventory (count, UUIDs, names, memory totals) changes only when the
hardware or the simulation does, so commands that need nothing live
(``bk l``, ``bk d``) read it from here instead of opening the GPU backend.
The file is keyed by the backend's fingerprint; a different fingerprint is
a miss.  A damaged or foreign file is a miss too, never an error: the cache
only saves time.
"""

from __future__ import annotations

import json

from bk.core.errors import BkError
from bk.core.telemetry import Inventory
from bk.store.presets import StateDir

NAME = "inventory.json"


def load(state_dir: str, fingerprint: str) -> Inventory | None:
    try:
        with StateDir(state_dir, create=False) as d:
            data = d.read(NAME)
    except (BkError, OSError):
        return None
    if data is None:
        return None
    try:
        doc = json.loads(data)
        if doc.get("fingerprint") != fingerprint:
            return None
        return Inventory.from_dict(doc["inventory"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def save(state_dir: str, fingerprint: str, inventory: Inventory) -> None:
    """Best effort: a read-only home must not fail the command that looked."""
    doc = {"fingerprint": fingerprint, "inventory": inventory.to_dict()}
    try:
        with StateDir(state_dir, create=True) as d:
            d.replace(NAME, json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    except (BkError, OSError):
        pass
