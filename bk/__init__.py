# General layout of the bk package (read this first): each unit and its role,
# the first words of its row in docs/ARCHITECTURE.md's layer table (which also
# says which unit may import which; tests/test_layers.py enforces both).
#
#   bk/__init__.py   the package root
#   bk/__main__.py   python -m bk
#   bk/core/         pure logic
#   bk/clock.py      the clock seam
#   bk/users.py      the account seam
#   bk/buildinfo.py  what this copy of bk is
#   bk/store/        the only code that opens state files
#   bk/daemon.py     the daemons' frame
#   bk/gpu/          the one GPU gateway
#   bk/ipc/          the broker's wire, shared by both ends so that neither
#                    the service nor the broker imports the other
#   bk/jobs/         scheduled commands' side effects for the service layer
#   bk/notify/       notifications' side effects for the service layer
#   bk/export/       the exports' renderers, pure like the core
#   bk/service/      the application API
#   bk/cli/          the command-line front end
#   bk/broker/       the shared-server daemon
#   bk/admin/        server set-up and lifecycle (bk admin init, install,
#                    uninstall, bk update)
#   bk/monitor/      the monitor daemon (bk m)
#   bk/tui/          the curses timeline (bk t)
#   bk/agent/        the agent surface, a front end
#   bk/mcp/          bk mcp, the stdio MCP server
#   bk/cluster/      several servers federated over SSH
#   bk/remote/       the one module that runs ssh (ssh)
#   bk/enforce/      opt-in hard enforcement (bk admin enforce,
#                    gpubk-enforcer.service)
"""gpubk: book GPUs on shared Linux servers."""

__version__ = "0.1.0"
