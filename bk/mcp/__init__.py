"""``bk mcp``: a stdio MCP server, written with the standard library.

``protocol`` is the JSON-RPC session (both eras of MCP, pure), ``tools`` the
MCP view of the agent surface (``bk.agent``), ``server`` the loop
that reads one request per line on stdin and writes one reply per line on
stdout.  Nothing here opens a state file: every tool is a row of the
operation table, run through the Service as the CLI runs it.
"""
