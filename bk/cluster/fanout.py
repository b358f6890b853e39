"""Ask every node, at most ``parallel`` at a time, each within its own deadline.

The facts.  Asking a node costs this machine one process while it runs
(ssh, or the node's bk for a ``local`` node): a fork and an exec, for ssh a
key exchange (OpenSSH 9's default one costs the client about 130 ms of CPU,
docs/CLUSTER.md "Scaling"), two pipes and a few MiB of memory; reading and
checking the reply costs this process 2 to 3 ms more.  The rest of a node's
time is the network and the node's own work, which costs nothing here.
One thread per node, all started at once, is as fast as the slowest node
while the nodes are few; with many it is a burst of handshakes competing
for a login node's two cores, one process, one thread and three descriptors
per node (the usual limit of 1,024 descriptors is gone at about 300), and
every waiting thread waking to poll.

The decision.  A pool of ``parallel`` worker threads (the configuration key
``cluster_parallel``, default 128) takes the nodes in catalog order, so at
most that many processes run at once.  128 is past what two cores need to
stay busy when handshakes are the cost (each is CPU-bound, so more at once
only spreads the same CPU), and asks 100 nodes that mostly wait in one wave:
with 64 the last 36 waited for the first to answer, a second round trip
(the benchmark: `bk c check` on 100 nodes 1.97x the time of 10 with 64,
1.74x with 128; 32 costs them about 40 % more).  Its descriptors, three per node, stay far
below the usual limit of 1,024.
Every node has its own deadline, its catalog ``timeout_s``, counted from
when its worker starts it (time spent queued is not the node's): the runner
kills its process there.  The fan-out holds the same deadline as a
backstop: a row still running ``grace_s`` after it (a runner that did not
kill, a job stuck outside the runner) is reported ``timeout``, its node is
cancelled (its runner kills the process on its next poll), and a fresh
worker takes that worker's place.  So a node that hangs holds one worker
for its own deadline while the others go through the rest of the nodes,
and the command never waits longer for a node than that node's deadline.

A node's failure is its row's result, never an exception for the others;
rows come back in the order of ``nodes``.  Ctrl-C sets the shared
``cancel`` event; every runner polls it and kills its process by PID, so no
process outlives the command.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from bk.cluster.catalog import NodeEntry
from bk.cluster.node import NodeClient, NodeFailure, timed_out

DEFAULT_PARALLEL = 128
# Past a node's deadline the runner kills its process and reaps it (ssh.run
# allows one second for that); the backstop waits this much longer.
GRACE_S = 2.0


def fan_out(nodes: Sequence[NodeEntry], job: Callable[[NodeClient], object], *,
            make_client: Callable[..., NodeClient] = NodeClient,
            cancel: threading.Event | None = None, parallel: int = DEFAULT_PARALLEL,
            grace_s: float = GRACE_S,
            monotonic: Callable[[], float] = time.monotonic) -> list[tuple[NodeEntry, object]]:
    """``[(node, job's result or NodeFailure)]`` in the order of ``nodes``."""
    cancel = cancel or threading.Event()
    results: dict[int, object] = {}
    running: dict[int, tuple[float, threading.Event]] = {}    # index -> (started, that node's cancel)
    lock = threading.Condition()
    queue = list(enumerate(nodes))[::-1]                      # pop() takes them in catalog order

    def ask(entry: NodeEntry, mine: threading.Event) -> object:
        def cancelled() -> bool:
            return cancel.is_set() or mine.is_set()
        try:
            return job(make_client(entry, cancelled=cancelled))
        except NodeFailure as f:
            return f
        except Exception as exc:     # a bug in one row must not hide the others
            return NodeFailure(entry.name, "error", f"{type(exc).__name__}: {exc}")

    def worker() -> None:
        while True:
            with lock:
                if not queue or cancel.is_set():
                    return
                i, entry = queue.pop()
                mine = threading.Event()
                running[i] = (monotonic(), mine)
            got = ask(entry, mine)
            with lock:
                if running.pop(i, None) is None:      # the backstop gave up on it: the row is written
                    return                            # and another worker has taken this one's place
                results[i] = got
                lock.notify_all()

    def start_worker() -> None:
        threading.Thread(target=worker, name="bk-fan-out", daemon=True).start()

    for _ in range(max(1, min(int(parallel), len(nodes)))):
        start_worker()
    try:
        with lock:
            while len(results) < len(nodes):
                now = monotonic()
                for i, (started, mine) in list(running.items()):
                    if now >= started + nodes[i].timeout_s + grace_s:
                        del running[i]
                        mine.set()
                        results[i] = timed_out(nodes[i], nodes[i].timeout_s, now - started)
                        if queue:
                            start_worker()
                if cancel.is_set() and not running:
                    break                     # cancelled: the nodes not started stay "cancelled"
                wake = min((t + nodes[i].timeout_s + grace_s for i, (t, _) in running.items()), default=now + 0.5)
                # Short waits: Ctrl-C is seen between them on every platform.
                lock.wait(max(0.01, min(wake - now, 0.5)))
    except KeyboardInterrupt:
        cancel.set()
        end = monotonic() + 2.0
        with lock:
            while running and monotonic() < end:
                lock.wait(0.1)
        raise
    return [(n, results.get(i, NodeFailure(n.name, "cancelled", "cancelled"))) for i, n in enumerate(nodes)]
