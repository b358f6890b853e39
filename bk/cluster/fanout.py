"""Ask every node at once, each within its own timeout.

One thread per node: the work is waiting on ssh processes, so threads cost
nothing and the whole call takes as long as the slowest node (bounded by its
``timeout_s``), not the sum.  A node's failure is its row's result, never an
exception for the others.  Ctrl-C sets the shared ``cancel`` event; every
runner polls it and kills its ssh by PID, so no process outlives the command.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from bk.cluster.catalog import NodeEntry
from bk.cluster.node import NodeClient, NodeFailure


def fan_out(nodes: Sequence[NodeEntry], job: Callable[[NodeClient], object], *,
            make_client: Callable[..., NodeClient] = NodeClient,
            cancel: threading.Event | None = None) -> list[tuple[NodeEntry, object]]:
    """``[(node, job's result or NodeFailure)]`` in the order of ``nodes``."""
    cancel = cancel or threading.Event()
    results: dict[int, object] = {}

    def work(i: int, entry: NodeEntry) -> None:
        try:
            results[i] = job(make_client(entry, cancelled=cancel.is_set))
        except NodeFailure as f:
            results[i] = f
        except Exception as exc:     # a bug in one row must not hide the others
            results[i] = NodeFailure(entry.name, "error", f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(i, n), name=f"bk-node-{n.name}", daemon=True)
               for i, n in enumerate(nodes)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.1)
    except KeyboardInterrupt:
        cancel.set()
        for t in threads:
            t.join(2.0)
        raise
    return [(n, results.get(i, NodeFailure(n.name, "cancelled", "cancelled"))) for i, n in enumerate(nodes)]
