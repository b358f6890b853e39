"""``bk mcp``: the stdio MCP server for agent clients (``bk.mcp``)."""

from __future__ import annotations

import argparse

from bk.cli.render import Output
from bk.core.errors import UsageError

EPILOG = """Connect an agent client by adding bk as a stdio server to its MCP
configuration (the file and the top-level key vary by client; most take
this shape):

  {
    "mcpServers": {
      "bk": {"command": "bk", "args": ["mcp"]}
    }
  }

Use the full path (see: command -v bk) if the client does not run a login
shell. The server books as the user who starts it, under the same rules as
bk; on a shared server its writes go through the broker like every bk
command.

Protocol: JSON-RPC 2.0, one message per line on stdin and stdout, at most
1 MiB a message; MCP revisions 2025-06-18 and 2025-11-25 (initialize) and
2026-07-28 (server/discover). Tools: context, recommend, create, list, edit,
cancel, usage, job_log, cleanup; resource: bk://context. It exits at the
end of its input; diagnostics go to stderr.

Examples:
  bk mcp                 serve one client on stdin/stdout
  bk mcp --tools         list the tools, their hints and input schemas
  bk mcp --tools --json  the same as JSON (what tools/list describes)
"""


def register(sub) -> None:
    p = sub.add_parser("mcp", help="serve bk's tools to an agent client (MCP over stdio)",
                       description="Run a Model Context Protocol server on stdin and stdout, so an "
                       "agent client can plan, book, retry safely and cancel, as you.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tools", action="store_true", help="list the tools and exit (serves nothing)")
    p.set_defaults(handler=run, command="mcp")


def run(args, ctx) -> Output:
    from bk.mcp import tools

    app = ctx.app()
    if args.tools:
        listed = [tools.describe(t) for t in tools.Host(app).tool_table()]

        def human(term) -> str:
            lines = []
            for t in listed:
                a = t["annotations"]
                hint = ("read-only" if a["readOnlyHint"] else "writes") + \
                    (", destructive" if a["destructiveHint"] else "") + \
                    (", idempotent" if a["idempotentHint"] else "")
                args_ = ", ".join(t["inputSchema"]["properties"]) or "no arguments"
                lines += [f"{t['name']} ({hint}): {t['description']}", f"    {args_}"]
            return "\n".join(lines)
        return Output("mcp", {"tools": listed}, human)
    if ctx.json:
        raise UsageError("bk mcp speaks JSON-RPC on stdout already; --json goes with --tools",
                         hint="bk mcp --tools --json")
    from bk.mcp import server

    if ctx.stdin_tty:        # a person ran it by hand: say what it is waiting for
        import sys

        sys.stderr.write("bk mcp: serving MCP (JSON-RPC, one message per line) on this terminal; it is "
                         "meant for agent clients (bk mcp --help shows how to connect one). Ctrl-D ends.\n")
    code = server.serve(app)
    return Output("mcp", {"served": True}, None, exit_code=code)
