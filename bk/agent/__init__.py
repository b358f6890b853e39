"""The agent surface: bk for programs (``bk mcp``, ``bk agent``).

A front end like the CLI and the TUI: its tools are rows of the operation
table (``bk.service``), each tool's input schema the row's field spec and
its result the row's typed result; the cluster's tools (``cluster``) are
composed with them when a catalog exists.  ``tools`` is the table,
``call_tool`` runs one and returns its ``gpubk.v1`` envelope.
"""

from __future__ import annotations

from bk.agent.surface import (  # noqa: F401
    SCHEMA,
    AgentTool,
    Data,
    builtin_tools,
    call_tool,
    describe,
    find,
    invoke,
    register_provider,
    server_version,
    tools,
)

__all__ = ["SCHEMA", "AgentTool", "Data", "builtin_tools", "call_tool", "describe", "find", "invoke",
           "register_provider", "server_version", "tools"]
