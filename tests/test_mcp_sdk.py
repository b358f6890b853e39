"""The official MCP Python SDK client (``mcp``, a test dependency only)
drives the built ``bk.pyz mcp`` over stdio: once in its default mode (it
probes ``server/discover`` and settles on 2026-07-28) and once with the
handshake forced (``mode="legacy"``: ``initialize``, 2025-11-25), and once
through ``stdio_client`` and a bare ``ClientSession``.  An agent's
whole round: list the tools, ask for advice, book with an operation id,
retry it (the same booking, nothing new), list, cancel.  The SDK also checks
each structuredContent against the tool's outputSchema."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import pytest

mcp = pytest.importorskip("mcp")
anyio = pytest.importorskip("anyio")

from mcp import StdioServerParameters  # noqa: E402
from mcp.client.client import Client  # noqa: E402

NOW_ISO = "2026-07-13T10:41:30Z"


def server_params(pyz: Path, tmp_path: Path) -> StdioServerParameters:
    # The SDK starts servers with a minimal environment of its own; bk's
    # private data directory and fixed clock are passed explicitly.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "TZ": "UTC",
           "BK_DATA_DIR": str(tmp_path / "data"), "BK_GPU_COUNT": "4", "BK_NOW": NOW_ISO,
           "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "XDG_STATE_HOME": str(tmp_path / "state"),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    return StdioServerParameters(command=sys.executable, args=[str(pyz), "mcp"], env=env, cwd=str(tmp_path))


@contextlib.asynccontextmanager
async def connected(params: StdioServerParameters, mode: str):
    """``Client`` in ``mode``, or for "session" the lower-level pair the SDK
    documents for stdio servers: ``stdio_client`` and a ``ClientSession``
    that runs the ``initialize`` handshake itself."""
    if mode != "session":
        async with Client(params, mode=mode) as c:
            yield c
        return
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def agent_round(params: StdioServerParameters, mode: str) -> dict:
    seen: dict = {}
    async with connected(params, mode) as c:
        seen["version"] = c.protocol_version
        seen["server"] = c.server_info.name if c.server_info else None
        listed = await c.list_tools()
        seen["tools"] = {t.name: t for t in listed.tools}

        async def call(name: str, arguments: dict) -> tuple[bool, dict]:
            r = await c.call_tool(name, arguments)
            assert json.loads(r.content[0].text) == r.structured_content
            return bool(r.is_error), r.structured_content

        seen["recommend"] = await call("recommend", {"count": 2, "duration": 3600})
        seen["create"] = await call("create", {"count": 2, "duration": 3600, "operation_id": f"agent-{mode}-1"})
        seen["retry"] = await call("create", {"count": 2, "duration": 3600, "operation_id": f"agent-{mode}-1"})
        seen["list"] = await call("list", {})
        rid = seen["create"][1]["data"]["reservation"]["id"]
        seen["cancel"] = await call("cancel", {"ref": rid[:8], "operation_id": f"agent-{mode}-2"})
        seen["cancel_retry"] = await call("cancel", {"ref": rid[:8], "operation_id": f"agent-{mode}-2"})
        seen["after"] = await call("list", {})
        seen["bad"] = await call("create", {"count": "two", "duration": 3600})
        seen["context"] = json.loads((await c.read_resource("bk://context")).contents[0].text)
    return seen


@pytest.mark.parametrize("mode, version", [("auto", "2026-07-28"), ("legacy", "2025-11-25"),
                                           ("session", "2025-11-25")])
def test_official_client_plans_books_retries_and_cancels(pyz, tmp_path, mode, version):
    seen = anyio.run(agent_round, server_params(pyz, tmp_path), mode)
    assert seen["version"] == version and seen["server"] == "gpubk"

    tools = seen["tools"]
    assert {"context", "recommend", "create", "list", "edit", "cancel", "usage", "job_log", "cleanup"} <= set(tools)
    assert tools["recommend"].annotations.read_only_hint is True
    assert tools["cancel"].annotations.destructive_hint is True
    assert tools["create"].annotations.idempotent_hint is False
    assert "operation_id" in tools["create"].input_schema["properties"]
    assert tools["create"].output_schema["properties"]["schema"] == {"const": "gpubk.v1"}

    err, rec = seen["recommend"]
    assert not err and rec["ok"] and rec["data"]["options"][0]["gpus"] == [0, 1]
    err, made = seen["create"]
    assert not err and made["data"]["status"] == "created"
    res = made["data"]["reservation"]
    assert res["op_id"] == f"agent-{mode}-1" and res["gpus"] == [0, 1] and res["status"] == "active"

    err, again = seen["retry"]
    assert not err and again["data"]["status"] == "exists"
    assert again["data"]["reservation"]["id"] == res["id"]

    _, listed = seen["list"]
    assert listed["data"]["total"] == 1                       # the retry booked nothing
    assert listed["data"]["reservations"][0]["id"] == res["id"]

    _, cancelled = seen["cancel"]
    assert cancelled["data"]["status"] == "cancelled" and cancelled["data"]["reservation"]["id"] == res["id"]
    _, cancelled_again = seen["cancel_retry"]
    assert cancelled_again["data"]["status"] == "exists"
    assert seen["after"][1]["data"]["reservations"] == []

    err, bad = seen["bad"]
    assert err and bad["error"]["code"] == "invalid_input"
    assert seen["context"]["data"]["now"] == NOW_ISO and len(seen["context"]["data"]["gpus"]) == 4
