"""The MCP view of the agent surface (``bk.agent``): tool
descriptions with input schemas from the operation table, hints from its
read/write, destructive and idempotent columns, each tool's output schema
(the ``gpubk.v1`` envelope whose ``data`` is that tool's own, from its
row's result type), and the ``bk://context`` resource.

``Host`` is what ``bk.mcp.protocol.Session`` asks; it holds the Service,
opened for this process exactly as the CLI opens it, and makes one call
context per tool call (the clock read then, the GPUs looked at again).
"""

from __future__ import annotations

import json
import sys
import traceback

CONTEXT_URI = "bk://context"
SERVER_NAME = "gpubk"

INSTRUCTIONS = (
    "bk books GPUs on this machine for the user who started this server, under the same rules as the "
    "bk command. Call context first (the GPUs, the rules, your bookings, the time). Use recommend to see "
    "when and where GPUs are free, create to book (always give an operation_id, and retry with the same "
    "one after an error or a timeout: a retry returns the first result and books nothing more), list, "
    "edit and cancel to manage bookings, cleanup to release what you booked under an op-id prefix. Every "
    "result is a gpubk.v1 envelope: ok, data or error {code, message, hint}, warnings. Arguments take "
    "times as epoch seconds (UTC) or as a person writes them (now, +2h, 20:00, tomorrow 09:00, ISO 8601), "
    "durations in seconds or as 30m, 1h30m, and memory in MiB per GPU or as 12g.")


def output_schema(command: str, data: dict | None = None) -> dict:
    """The envelope (SPEC 6.3) as a JSON Schema: ``data`` on success (the
    tool's own, ``data``), ``error`` on failure, ``command`` the tool's name."""
    return {
        "type": "object",
        "properties": {
            "schema": {"const": "gpubk.v1"},
            "command": {"const": command},
            "ok": {"type": "boolean"},
            "data": data or {"type": "object"},
            "error": {"type": "object", "properties": {"code": {"type": "string"},
                                                        "message": {"type": "string"}},
                      "required": ["code", "message"]},
            "warnings": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["schema", "command", "ok", "warnings"],
    }


def describe(tool) -> dict:
    """One agent tool as an MCP tool."""
    title = tool.name.replace("_", " ")
    return {
        "name": tool.name, "title": title, "description": tool.summary[:1].upper() + tool.summary[1:] + ".",
        "inputSchema": tool.schema, "outputSchema": output_schema(tool.name, tool.output),
        "annotations": {"title": title, "readOnlyHint": tool.read_only,
                        "destructiveHint": tool.destructive and not tool.read_only,
                        "idempotentHint": tool.idempotent, "openWorldHint": False},
    }


class Host:
    def __init__(self, app, *, log=None):
        self.app = app
        self.log = log or (lambda line: None)
        self._tools = None

    def _agent(self):
        from bk import agent

        return agent

    def tool_table(self) -> list:
        if self._tools is None:
            self._tools = self._agent().tools(self.app)
        return self._tools

    def server_info(self) -> dict:
        return {"name": SERVER_NAME, "title": "bk: GPU bookings", "version": self._agent().server_version()}

    def instructions(self) -> str:
        return INSTRUCTIONS

    def tools(self, version: str) -> list[dict]:
        return [describe(t) for t in self.tool_table()]

    def _call(self):
        return self.app.call(fresh=True)       # each call looks at the GPUs afresh

    def call_tool(self, name: str, arguments: dict):
        tool = next((t for t in self.tool_table() if t.name == name), None)
        if tool is None:
            return None
        envelope = self._run(tool, arguments)
        return envelope, not envelope["ok"]

    def _run(self, tool, arguments) -> dict:
        from bk.core.envelope import failure
        from bk.core.errors import BkError, Internal

        try:
            return self._agent().call_tool(self.app, tool, arguments, self._call())
        except BkError as e:         # opening the call itself failed (the ledger, the clock's zone)
            return failure(tool.name, e)
        except Exception as exc:     # a bug: said once on stderr, the server goes on
            self.log(f"internal error in {tool.name}: {type(exc).__name__}: {exc}\n"
                     + traceback.format_exc().rstrip())
            return failure(tool.name, Internal(f"unexpected error: {type(exc).__name__}: {exc}",
                                               hint="the server's stderr has the details"))

    def resources(self) -> list[dict]:
        return [{"uri": CONTEXT_URI, "name": "context", "title": "bk context",
                 "description": "who you are, the rules, every GPU and its live state, your bookings, the time",
                 "mimeType": "application/json"}]

    def read_resource(self, uri: str):
        if uri != CONTEXT_URI:
            return None
        tool = next(t for t in self.tool_table() if t.name == "context")
        return "application/json", json.dumps(self._run(tool, {}), ensure_ascii=False)


def stderr_log(line: str) -> None:
    try:
        sys.stderr.write(f"bk mcp: {line}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass
