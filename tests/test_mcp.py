"""``bk mcp`` spoken to over raw pipes: the JSON-RPC framing and both
protocol eras, the errors a client can provoke, and what the server does
when the input ends or grows past the limit.  The official SDK client
drives it in test_mcp_sdk.py.

Each test runs the server as a real process (the tree's ``python -m bk``,
a private data directory, a fixed clock), writes its lines, closes stdin
and reads every reply: the server answers each request before it reads the
next line, and exits at the end of its input, so no test waits on time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bk.mcp import protocol

ROOT = Path(__file__).resolve().parent.parent
NOW_ISO = "2026-07-13T10:41:30Z"
MODERN = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}


def env_for(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update({"HOME": str(tmp_path), "BK_DATA_DIR": str(tmp_path / "data"), "BK_GPU_COUNT": "2",
                "BK_NOW": NOW_ISO, "TZ": "UTC", "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
                "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
                "PYTHONPATH": str(ROOT)})
    return env


def serve(tmp_path: Path, *lines, raw: bytes | None = None) -> tuple[int, list[dict], str]:
    """Run ``bk mcp`` on ``lines`` (objects are sent as JSON, bytes as
    they are), then EOF; return its exit status, replies and stderr."""
    data = raw if raw is not None else b"".join(
        (x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines)
    proc = subprocess.run([sys.executable, "-m", "bk", "mcp"], input=data, capture_output=True,
                          env=env_for(tmp_path), cwd=tmp_path, timeout=60)
    out = proc.stdout.decode()
    assert out == "" or out.endswith("\n"), "a reply was written half"
    replies = [json.loads(line) for line in out.splitlines()]
    return proc.returncode, replies, proc.stderr.decode()


def req(rid, method, params=None, *, meta: dict | None = None):
    msg = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None or meta is not None:
        msg["params"] = dict(params or {}, **({"_meta": meta} if meta is not None else {}))
    return msg


INIT = req(0, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                             "clientInfo": {"name": "t", "version": "1"}})
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def by_id(replies):
    return {r.get("id"): r for r in replies}


def test_handshake_era_lists_and_calls_tools(tmp_path):
    code, replies, _ = serve(tmp_path, INIT, INITIALIZED, req(1, "tools/list"), req(2, "ping"),
                             req(3, "tools/call", {"name": "create", "arguments":
                                                   {"count": 1, "duration": 3600, "operation_id": "k1"}}),
                             req(4, "resources/list"), req(5, "resources/read", {"uri": "bk://context"}))
    assert code == 0
    r = by_id(replies)
    assert len(replies) == 6                      # the notification is not answered
    init = r[0]["result"]
    assert init["protocolVersion"] == "2025-11-25" and init["serverInfo"]["name"] == "gpubk"
    assert set(init["capabilities"]) == {"tools", "resources"}
    tools = {t["name"]: t for t in r[1]["result"]["tools"]}
    assert set(tools) == {"context", "recommend", "create", "list", "edit", "cancel", "usage", "job_log",
                          "cleanup"}
    assert "resultType" not in r[1]["result"]     # a 2026 field, not in this era
    assert r[2]["result"] == {}
    call = r[3]["result"]
    assert call["isError"] is False
    env = call["structuredContent"]
    assert env["schema"] == "gpubk.v1" and env["command"] == "create" and env["ok"]
    assert json.loads(call["content"][0]["text"]) == env
    assert env["data"]["reservation"]["op_id"] == "k1"
    assert [x["uri"] for x in r[4]["result"]["resources"]] == ["bk://context"]
    ctx = json.loads(r[5]["result"]["contents"][0]["text"])
    assert ctx["ok"] and ctx["data"]["reservations"][0]["op_id"] == "k1"


def test_tools_are_the_operation_table(tmp_path):
    """Schemas and hints come from the rows: create is book's spec with
    op_id spelled operation_id and no job fields; hints follow the columns."""
    from bk.service import ops

    _, replies, _ = serve(tmp_path, INIT, req(1, "tools/list"))
    tools = {t["name"]: t for t in by_id(replies)[1]["result"]["tools"]}
    create = tools["create"]
    book = ops.get("book").schema()
    assert create["inputSchema"]["properties"]["operation_id"] == book["properties"]["op_id"]
    assert "op_id" not in create["inputSchema"]["properties"]
    assert not {"job_id", "job_digest", "job_summary"} & set(create["inputSchema"]["properties"])
    assert create["inputSchema"]["required"] == ["count", "duration"]
    assert create["inputSchema"]["additionalProperties"] is False
    hints = {n: (t["annotations"]["readOnlyHint"], t["annotations"]["destructiveHint"],
                 t["annotations"]["idempotentHint"]) for n, t in tools.items()}
    assert hints["create"] == (False, False, False)
    assert hints["cancel"] == (False, True, True)
    assert hints["cleanup"] == (False, True, True)
    assert hints["edit"] == (False, False, False)
    for name in ("context", "recommend", "list", "usage", "job_log"):
        assert hints[name][0] is True, name
    for t in tools.values():
        assert t["outputSchema"]["properties"]["command"] == {"const": t["name"]}
        assert t["inputSchema"]["type"] == "object"


def test_modern_era_discover_and_per_request_meta(tmp_path):
    code, replies, _ = serve(tmp_path, req(1, "server/discover", meta=META),
                             req(2, "tools/list", meta=META),
                             req(3, "tools/call", {"name": "list", "arguments": {}}, meta=META),
                             req(4, "tools/list"),                     # no envelope on a 2026 connection
                             req(5, "ping", meta=META),                # gone in 2026-07-28
                             req(6, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}}),
                             req(7, "tools/list", meta={**META, "io.modelcontextprotocol/protocolVersion":
                                                        "2099-01-01"}),
                             req(8, "tools/list", meta={"io.modelcontextprotocol/protocolVersion": MODERN}))
    assert code == 0
    r = by_id(replies)
    d = r[1]["result"]
    assert d["supportedVersions"] == ["2025-06-18", "2025-11-25", MODERN]
    assert d["resultType"] == "complete" and d["ttlMs"] == 0 and d["cacheScope"] == "private"
    assert d["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "gpubk"
    assert r[2]["result"]["resultType"] == "complete" and "ttlMs" in r[2]["result"]
    assert r[3]["result"]["resultType"] == "complete" and r[3]["result"]["structuredContent"]["ok"]
    assert "ttlMs" not in r[3]["result"]                  # a tool call is not cacheable
    assert r[4]["error"]["code"] == protocol.INVALID_PARAMS
    assert r[5]["error"]["code"] == protocol.METHOD_NOT_FOUND
    assert r[6]["error"]["code"] == protocol.UNSUPPORTED_VERSION
    assert r[7]["error"]["code"] == protocol.UNSUPPORTED_VERSION
    assert r[7]["error"]["data"] == {"supported": ["2025-06-18", "2025-11-25", MODERN], "requested": "2099-01-01"}
    assert r[8]["error"]["code"] == protocol.INVALID_PARAMS   # clientCapabilities is required


def test_handshake_connection_refuses_the_envelope_and_negotiates_versions(tmp_path):
    _, replies, _ = serve(tmp_path, req(1, "tools/list"),              # before initialize
                          req(2, "initialize", {"protocolVersion": "2024-11-05", "capabilities": {}}),
                          req(3, "tools/list", meta=META),
                          req(4, "initialize", {"capabilities": {}}))
    r = by_id(replies)
    assert r[1]["error"]["code"] == protocol.INVALID_REQUEST and "initialize" in r[1]["error"]["message"]
    assert r[2]["result"]["protocolVersion"] == "2025-11-25"      # our newest, not an echo
    assert r[3]["error"]["code"] == protocol.INVALID_REQUEST
    assert r[4]["error"]["code"] == protocol.INVALID_PARAMS
    _, replies, _ = serve(tmp_path, req(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}}))
    assert replies[0]["result"]["protocolVersion"] == "2025-06-18"


def test_malformed_messages_get_errors_and_the_server_goes_on(tmp_path):
    code, replies, _ = serve(tmp_path, INIT, b"{not json", b"[1, 2]", b'"text"',
                             {"id": 5, "method": "ping"},                       # no jsonrpc
                             {"jsonrpc": "2.0", "id": None, "method": "ping"},  # null id
                             {"jsonrpc": "2.0", "id": 1.5, "method": "ping"},
                             {"jsonrpc": "2.0", "id": 6, "method": 7},
                             {"jsonrpc": "2.0", "method": "no/such/notification"},
                             {"jsonrpc": "2.0", "id": 99, "result": {}},        # a stray reply
                             b"", b"   ",
                             req(7, "no/such/method"), {"jsonrpc": "2.0", "id": 8, "method": "tools/list", "params": [1]},
                             req(9, "ping"))
    assert code == 0
    errors = [r["error"]["code"] for r in replies[1:-1]]
    assert errors == [protocol.PARSE_ERROR, protocol.INVALID_REQUEST, protocol.INVALID_REQUEST,
                      protocol.INVALID_REQUEST, protocol.INVALID_REQUEST, protocol.INVALID_REQUEST,
                      protocol.INVALID_REQUEST, protocol.METHOD_NOT_FOUND, protocol.INVALID_PARAMS]
    assert [r["id"] for r in replies[1:-1]] == [None, None, None, 5, None, None, 6, 7, 8]
    assert replies[-1] == {"jsonrpc": "2.0", "id": 9, "result": {}}


def test_tool_errors(tmp_path):
    """An unknown tool and arguments that are not an object are protocol
    errors; wrong argument values are the tool's own error (isError, the
    failure envelope), which a model can read and correct."""
    def call(rid, name, arguments):
        return req(rid, "tools/call", {"name": name, "arguments": arguments})

    _, replies, _ = serve(tmp_path, INIT, call(1, "rm_rf", {}), call(2, "create", [1]),
                          call(3, "create", {"count": "2", "duration": 3600}),
                          call(4, "create", {"count": True, "duration": 3600}),
                          call(5, "create", {"count": 1, "duration": 3600, "uid": 0}),
                          call(6, "create", {"count": 1}),
                          call(7, "cancel", {"ref": "9"}),
                          call(8, "create", {"count": 1, "duration": 3600, "operation_id": "bad id!"}),
                          call(9, "list", {"scope": "everything"}),
                          req(10, "tools/call", {"arguments": {}}))
    r = by_id(replies)
    assert r[1]["error"]["code"] == protocol.INVALID_PARAMS and "rm_rf" in r[1]["error"]["message"]
    assert r[2]["error"]["code"] == protocol.INVALID_PARAMS
    assert r[10]["error"]["code"] == protocol.INVALID_PARAMS
    for rid, code, words in ((3, "invalid_input", "must be an integer"), (4, "invalid_input", "integer"),
                             (5, "invalid_input", "unknown argument 'uid'"), (6, "invalid_input", "duration"),
                             (7, "not_found", "number 9"), (8, "invalid_input", "operation_id"),
                             (9, "invalid_input", "one of")):
        res = r[rid]["result"]
        assert res["isError"] is True, rid
        env = res["structuredContent"]
        assert not env["ok"] and env["error"]["code"] == code, (rid, env)
        assert words in env["error"]["message"] or words in json.dumps(env), (rid, env)


def test_an_oversized_request_is_refused_and_the_next_one_answered(tmp_path):
    big = json.dumps(req(1, "tools/call", {"name": "create", "arguments": {
        "count": 1, "duration": 3600, "note": "x" * (protocol.MAX_MESSAGE_BYTES + 10)}})).encode()
    code, replies, _ = serve(tmp_path, INIT, big, req(2, "tools/call", {"name": "list", "arguments": {}}))
    assert code == 0
    assert replies[1]["id"] is None and replies[1]["error"]["code"] == protocol.INVALID_REQUEST
    assert "too large" in replies[1]["error"]["message"]
    assert replies[2]["id"] == 2 and replies[2]["result"]["structuredContent"]["data"]["reservations"] == []
    # Exactly at the limit is not too large (it is a request, whatever it says).
    edge = b'{"jsonrpc":"2.0","id":3,"method":"ping","params":{"pad":"'
    edge += b"x" * (protocol.MAX_MESSAGE_BYTES - len(edge) - 3) + b'"}}'
    assert len(edge) == protocol.MAX_MESSAGE_BYTES
    _, replies, _ = serve(tmp_path, INIT, edge)
    assert replies[1] == {"jsonrpc": "2.0", "id": 3, "result": {}}


def test_stdin_closed_mid_request_runs_nothing_and_exits_cleanly(tmp_path):
    create = json.dumps(req(1, "tools/call", {"name": "create", "arguments":
                                              {"count": 1, "duration": 3600, "operation_id": "half"}})).encode()
    code, replies, err = serve(tmp_path, raw=json.dumps(INIT).encode() + b"\n" + create)   # no newline
    assert code == 0
    assert [r["id"] for r in replies] == [0]
    assert "in the middle of a message" in err
    _, replies, _ = serve(tmp_path, INIT, req(2, "tools/call", {"name": "list", "arguments": {}}))
    assert replies[1]["result"]["structuredContent"]["data"]["reservations"] == []     # nothing booked
    # An oversized line cut by EOF: refused, nothing run, a clean exit.
    code, replies, _ = serve(tmp_path, raw=json.dumps(INIT).encode() + b"\n" + b"x" * (protocol.MAX_MESSAGE_BYTES + 5))
    assert code == 0 and replies[-1]["error"]["code"] == protocol.INVALID_REQUEST


def test_stdout_carries_protocol_only(tmp_path):
    """Warnings and diagnostics go to stderr or into the envelope; every
    stdout line is a JSON-RPC reply (serve() parses each one)."""
    code, replies, _ = serve(tmp_path, req(1, "server/discover", meta=META),
                             req(2, "tools/call", {"name": "context", "arguments": {}}, meta=META))
    assert code == 0 and all(r["jsonrpc"] == "2.0" for r in replies)
    ctx = replies[1]["result"]["structuredContent"]["data"]
    assert ctx["now"] == NOW_ISO and ctx["you"]["uid"] == os.getuid() and len(ctx["gpus"]) == 2


# ------------------------------------------------------------ the session, in-process

class FakeHost:
    def __init__(self):
        self.calls = []

    def server_info(self):
        return {"name": "fake", "version": "0"}

    def instructions(self):
        return "none"

    def tools(self, version):
        return [{"name": "echo", "inputSchema": {"type": "object"}}]

    def call_tool(self, name, arguments):
        if name != "echo":
            return None
        self.calls.append(arguments)
        return {"ok": True, "args": arguments}, False

    def resources(self):
        return []

    def read_resource(self, uri):
        return None


def test_session_unknown_resource_and_cursor():
    s = protocol.Session(FakeHost())
    s.handle(INIT)
    assert s.handle(req(1, "resources/read", {"uri": "bk://nope"}))["error"]["code"] == protocol.RESOURCE_NOT_FOUND
    assert s.handle(req(2, "tools/list", {"cursor": "abc"}))["error"]["code"] == protocol.INVALID_PARAMS
    assert s.handle(req(3, "tools/call", {"name": "echo"}))["result"]["structuredContent"] == \
        {"ok": True, "args": {}}


def test_session_string_ids_and_notifications_are_silent():
    host = FakeHost()
    s = protocol.Session(host)
    assert s.handle({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "echo"}}) is None
    assert host.calls == []                   # a notification never runs a tool
    assert s.handle(dict(INIT, id="a-1"))["id"] == "a-1"


@pytest.mark.parametrize("line", [b"\xff\xfe", b"{\"a\":", b"nan"])
def test_session_parse_errors(line):
    reply = protocol.Session(FakeHost()).handle_line(line)
    assert reply["error"]["code"] == protocol.PARSE_ERROR and reply["id"] is None


def test_reader_frames_lines_and_bounds_them():
    import io

    from bk.mcp.server import read_messages

    said = []
    got = list(read_messages(io.BufferedReader(io.BytesIO(b"a\n\nbb\r\n" + b"c" * 20 + b"\nd\ne")), 10,
                             log=said.append))
    assert got == [b"a", b"bb\r", 20, b"d"]
    assert said and "middle" in said[0]


def test_a_start_at_the_schemas_maximum_gets_hints_inside_the_horizon(pyz, tmp_path):
    """Issue 30 item 13: a start at the schema's maximum (not on a slice
    boundary) was answered "nearest valid starts: 4147-08-20T07:30:00Z or
    ...", thousands of years past the booking horizon."""
    import re

    from bk.core.models import parse_iso

    lines = [INIT, req(1, "tools/list")]
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    proc = subprocess.run([sys.executable, str(pyz), "mcp"], input=data, capture_output=True,
                          env=env_for(tmp_path), cwd=tmp_path, timeout=60)
    tools = {t["name"]: t for t in by_id([json.loads(x) for x in proc.stdout.decode().splitlines()])[1]
             ["result"]["tools"]}
    top = tools["create"]["inputSchema"]["properties"]["start"]["anyOf"][0]["maximum"]
    assert top % 300, "the maximum is not on a slice boundary (the test needs one that is not)"
    calls = [INIT] + [req(i, "tools/call", {"name": name, "arguments": {"count": 1, "duration": 3600, "start": s}})
                      for i, (name, s) in enumerate((("create", top), ("recommend", top),
                                                     ("create", top - 10 ** 9)), 1)]
    data = b"".join(json.dumps(x).encode() + b"\n" for x in calls)
    proc = subprocess.run([sys.executable, str(pyz), "mcp"], input=data, capture_output=True,
                          env=env_for(tmp_path), cwd=tmp_path, timeout=60)
    r = by_id([json.loads(x) for x in proc.stdout.decode().splitlines()])
    horizon_end = parse_iso(NOW_ISO) + 30 * 86400
    for rid in (1, 2, 3):
        env = r[rid]["result"]["structuredContent"]
        assert not env["ok"] and env["error"]["details"]["field"] == "start", env
        hint = env["error"]["hint"]
        times = re.findall(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", hint)
        assert times and all(parse_iso(t) + 3600 <= horizon_end for t in times), hint
        assert "horizon" in hint, hint
