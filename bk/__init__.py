# General layout of the bk package (read this first).
#
#   bk/core/     pure logic: errors, time grammar, models, policy, scheduler,
#                the JSON envelope.  No os/time/socket/fcntl/subprocess/curses:
#                the clock and the time zone are arguments.
#   bk/store/    the only code that opens state files: paths, config, atomic
#                writes and locks, the ledger, the audit log, archives.
#   bk/gpu/      the one GPU gateway: backend protocol, simulated backend
#                (NVML comes later).  Nothing else looks at GPUs.
#   bk/service/  the application API every front end calls; returns result
#                objects, never prints.
#   bk/cli/      the command-line front end (argparse, rendering).
#   bk/broker/   the shared-server daemon: Unix socket, SO_PEERCRED identity.
#
# Front ends (cli, broker handlers) never import bk.store or bk.gpu directly;
# tests/test_layers.py enforces that and the purity of bk.core.
"""gpubk: book GPUs on shared Linux servers."""

__version__ = "0.1.0"
