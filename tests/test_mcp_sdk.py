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
import subprocess
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


async def words_round(params: StdioServerParameters) -> dict:
    seen: dict = {}
    async with connected(params, "auto") as c:
        seen["tools"] = {t.name: t for t in (await c.list_tools()).tools}

        async def call(name: str, arguments: dict) -> tuple[bool, dict]:
            r = await c.call_tool(name, arguments)
            return bool(r.is_error), r.structured_content

        seen["30m"] = await call("create", {"count": 1, "duration": "30m", "operation_id": "words-1"})
        seen["later"] = await call("create", {"count": 1, "duration": "1h30m", "start": "+2h",
                                              "mem_mib": "12g", "operation_id": "words-2"})
        seen["tomorrow"] = await call("recommend", {"count": 2, "duration": "2h", "start": "tomorrow 09:00"})
        seen["iso"] = await call("recommend", {"count": 1, "duration": 1800, "start": "2026-07-13T18:00Z"})
        seen["off_grid"] = await call("create", {"count": 1, "duration": "30m", "start": "10:43",
                                                 "operation_id": "words-3"})
        seen["bad_words"] = await call("create", {"count": 1, "duration": "half an hour",
                                                  "operation_id": "words-4"})
        seen["extend"] = await call("edit", {"ref": "2", "duration": "+30m", "operation_id": "words-5"})
        seen["usage"] = await call("usage", {"since": "7d"})
    return seen


def test_the_official_client_books_30m_as_a_person_writes_it(pyz, tmp_path):
    """Issue 24 item 5: an agent passes the words its person used.  The
    official SDK client sends "30m", "+2h", "12g", "tomorrow 09:00" and ISO
    8601; bk reads them with the CLI's grammar, refuses what the CLI refuses
    with the CLI's message and hint, and every structuredContent validates
    against the tool's own outputSchema (the SDK checks it)."""
    from bk.core.models import parse_iso

    params = server_params(pyz, tmp_path)
    seen = anyio.run(words_round, params)
    slice_ = parse_iso(NOW_ISO) - parse_iso(NOW_ISO) % 300

    duration = seen["tools"]["create"].input_schema["properties"]["duration"]
    assert {s["type"] for s in duration["anyOf"]} == {"integer", "string"} and "30m" in duration["description"]
    data = seen["tools"]["create"].output_schema["properties"]["data"]
    assert {"status", "reservation", "placement", "dry_run"} <= set(data["properties"])
    assert "mem_mib_effective" in data["properties"]["reservation"]["properties"]

    err, made = seen["30m"]
    assert not err and made["data"]["status"] == "created", made
    r = made["data"]["reservation"]
    assert parse_iso(r["end"]) - parse_iso(r["start"]) == 1800 and parse_iso(r["start"]) == slice_

    err, later = seen["later"]
    assert not err, later
    r = later["data"]["reservation"]
    assert (parse_iso(r["start"]), parse_iso(r["end"]) - parse_iso(r["start"]), r["mem_mib"]) == \
        (slice_ + 7200, 5400, 12288)

    err, rec = seen["tomorrow"]
    assert not err and rec["data"]["request"]["start"] == "2026-07-14T09:00:00Z", rec      # TZ=UTC
    assert rec["data"]["request"]["duration"] == 7200
    err, rec = seen["iso"]
    assert not err and rec["data"]["request"]["start"] == "2026-07-13T18:00:00Z"

    # The same refusals as the command line, word for word.
    env = {**params.env, "PYTHONPATH": ""}
    cli = subprocess.run([sys.executable, str(pyz), "--json", "1", "30m", "-t", "10:43"], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=60)
    want = json.loads(cli.stdout)["error"]
    err, refused = seen["off_grid"]
    assert err and refused["error"]["code"] == want["code"] == "invalid_input"
    assert (refused["error"]["message"], refused["error"].get("hint")) == (want["message"], want.get("hint"))
    assert "10:40" in want["message"] and "10:45" in want["message"]
    cli = subprocess.run([sys.executable, str(pyz), "--json", "1", "half an hour"], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=60)
    want = json.loads(cli.stdout)["error"]
    err, refused = seen["bad_words"]
    assert err and (refused["error"]["message"], refused["error"].get("hint")) == (want["message"], want.get("hint"))

    # edit's duration takes what bk e -d takes: +30m moves the end.
    err, extended = seen["extend"]
    assert not err and extended["data"]["status"] == "updated", extended
    before, after = extended["data"]["before"], extended["data"]["reservation"]
    assert parse_iso(after["end"]) - parse_iso(before["end"]) == 1800 and after["start"] == before["start"]
    err, usage = seen["usage"]
    assert not err and usage["data"]["period"]["since"] == "2026-07-06T10:41:30Z", usage
