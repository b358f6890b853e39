# General layout of the bk package (read this first).
#
#   bk/core/     pure logic: errors, time grammar, models, policy, scheduler,
#                the JSON envelope.  No os/time/socket/fcntl/subprocess/curses:
#                the clock and the time zone are arguments.
#   bk/store/    the only code that opens state files: paths, config, atomic
#                writes and locks, the ledger, the audit log, archives.
#   bk/gpu/      the one GPU gateway: backend protocol, simulated backend
#                (NVML comes later).  Nothing else looks at GPUs.
#   bk/ipc/      the broker's wire: frames and the client, shared by both ends.
#   bk/service/  the application API: its one face (bk.service) is the
#                operation table every front end runs rows of, with typed
#                requests and results that own their JSON; never prints.
#   bk/export/   pure renderers of the exports: Prometheus, iCalendar, the
#                page of the week.
#   bk/cli/, bk/tui/, bk/agent/ (bk mcp, bk agent): the front ends, rows
#                plus renderers; bk/core/timegrid words a booking for both.
#   bk/broker/   the shared-server daemon: Unix socket, SO_PEERCRED identity.
#   bk/admin/    server set-up (bk admin init).
#
# Which package may import which is the table in docs/ARCHITECTURE.md;
# tests/test_layers.py enforces it, and the purity of bk.core.
"""gpubk: book GPUs on shared Linux servers."""

__version__ = "0.1.0"
