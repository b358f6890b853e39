"""JSON-RPC 2.0 and the two eras of MCP, as a pure session: a parsed message
in, a reply (or nothing) out.  No I/O here; ``bk.mcp.server`` reads the
lines and writes the replies.

How a client talks to us decides the era, once per connection:

* The handshake era (2025-06-18, 2025-11-25): ``initialize`` with the
  client's ``protocolVersion``; we answer with that version when we speak
  it, else with our newest handshake version (the client then decides
  whether to go on).  ``notifications/initialized`` follows; after that,
  plain requests.  ``ping`` works at any time.
* The stateless revision (2026-07-28): no handshake.  Every request carries
  ``_meta["io.modelcontextprotocol/protocolVersion"]`` and
  ``_meta["io.modelcontextprotocol/clientCapabilities"]``; ``server/discover``
  says which versions we speak.  Every result has ``resultType``; the
  cacheable ones (discover, the lists, a resource read) also ``ttlMs`` and
  ``cacheScope``.  ``ping`` no longer exists there.

The official Python SDK client (``mode="auto"``, its default) probes
``server/discover`` at 2026-07-28 first and falls back to ``initialize`` on
any error except -32022 naming only versions it does not know; with
``mode="legacy"`` it goes straight to ``initialize``.  So the first request
decides: an enveloped request other than ``initialize`` opens a 2026
connection; ``initialize`` opens a handshake one.  The other era is then
refused: ``initialize`` on a 2026 connection gets -32022 with the versions
we speak, an enveloped request on a handshake connection -32600.

Errors: -32700 the line is not JSON; -32600 not a JSON-RPC request (a
batch, a missing or null id, a wrong ``jsonrpc``, a message too large);
-32601 no such method; -32602 bad params (an unknown tool, arguments that
are not an object, a missing version where one is required); -32022 a
protocol version we do not speak (data: ``supported``, ``requested``);
-32002 no such resource.  A tool that fails for a reason of bk's (a
conflict, bad argument values) is not a protocol error: it answers
``isError: true`` with the error envelope, so the model can read it and
correct itself.
"""

from __future__ import annotations

import json

HANDSHAKE_VERSIONS = ("2025-06-18", "2025-11-25")
MODERN_VERSIONS = ("2026-07-28",)
SUPPORTED_VERSIONS = HANDSHAKE_VERSIONS + MODERN_VERSIONS
MAX_MESSAGE_BYTES = 1 << 20        # one request line, newline excluded (stated in bk mcp --help)

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = \
    -32700, -32600, -32601, -32602, -32603
UNSUPPORTED_VERSION = -32022
RESOURCE_NOT_FOUND = -32002

META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"

HANDSHAKE, MODERN = "handshake", "modern"

# Which methods exist in which era (None: both).
METHODS = {"initialize": HANDSHAKE, "ping": HANDSHAKE, "server/discover": MODERN, "tools/list": None,
           "tools/call": None, "resources/list": None, "resources/read": None}
CACHEABLE = ("server/discover", "tools/list", "resources/list", "resources/read")


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: object = None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


def error_reply(rid, code: int, message: str, data: object = None) -> dict:
    err = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": rid, "error": err}


def encode(reply: dict) -> bytes:
    """One line: ASCII JSON (escapes keep any text, even a lone surrogate,
    on one line and encodable), then the newline that ends a message."""
    return json.dumps(reply, ensure_ascii=True, separators=(",", ":")).encode("ascii") + b"\n"


def _valid_id(rid: object) -> bool:
    return (isinstance(rid, str) or type(rid) is int) and rid is not None


class Session:
    """One client connection.  ``host`` answers the MCP questions:
    ``server_info() -> dict``, ``instructions() -> str``, ``tools(version)
    -> [tool dict]``, ``call_tool(name, arguments) -> (envelope, is_error)``
    (``None`` for an unknown tool), ``resources() -> [resource dict]`` and
    ``read_resource(uri) -> (mime, text)`` (``None`` when unknown)."""

    def __init__(self, host):
        self.host = host
        self.era: str | None = None
        self.version: str | None = None         # the handshake's
        self.initialized = False

    # -- entry points ---------------------------------------------------------

    def handle_line(self, line: bytes) -> dict | None:
        try:
            msg = json.loads(line)
        except (ValueError, UnicodeDecodeError) as e:
            return error_reply(None, PARSE_ERROR, f"parse error: {str(e)[:200]}")
        return self.handle(msg)

    def too_large(self, size: int) -> dict:
        return error_reply(None, INVALID_REQUEST,
                           f"request too large ({size} bytes or more; at most {MAX_MESSAGE_BYTES})")

    def handle(self, msg: object) -> dict | None:
        if isinstance(msg, list):
            return error_reply(None, INVALID_REQUEST, "batches are not supported: send one request per line")
        if not isinstance(msg, dict):
            return error_reply(None, INVALID_REQUEST, "a message must be a JSON object")
        rid = msg.get("id")
        method = msg.get("method")
        if msg.get("jsonrpc") != "2.0":
            return error_reply(rid if _valid_id(rid) else None, INVALID_REQUEST, 'jsonrpc must be "2.0"')
        if method is None and ("result" in msg or "error" in msg):
            return None                       # a reply to a request we never send: nothing to do
        if not isinstance(method, str):
            return error_reply(rid if _valid_id(rid) else None, INVALID_REQUEST, "method must be a string")
        if "id" not in msg:
            self._notification(method, msg.get("params"))
            return None
        if not _valid_id(rid):
            return error_reply(None, INVALID_REQUEST, "id must be a string or an integer")
        try:
            result = self._request(method, msg.get("params"))
        except RpcError as e:
            return error_reply(rid, e.code, e.message, e.data)
        return {"jsonrpc": "2.0", "id": rid, "result": result}

    # -- the eras -------------------------------------------------------------

    def _notification(self, method: str, params) -> None:
        if method == "notifications/initialized" and self.era == HANDSHAKE:
            self.initialized = True
        # notifications/cancelled: requests run one at a time and are answered
        # before the next line is read, so there is never one to cancel.

    def _request(self, method: str, params) -> dict:
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise RpcError(INVALID_PARAMS, "params must be an object")
        if method not in METHODS:
            raise RpcError(METHOD_NOT_FOUND, f"method not found: {method[:80]}", method[:80])
        meta = params.get("_meta")
        enveloped = isinstance(meta, dict) and META_VERSION in meta
        if method == "initialize":
            return self._initialize(params)
        if enveloped:
            version = self._modern(meta)
        elif method == "server/discover":
            raise RpcError(INVALID_PARAMS, f"server/discover needs _meta[{META_VERSION!r}]",
                           {"supported": list(SUPPORTED_VERSIONS)})
        elif self.era == MODERN:
            raise RpcError(INVALID_PARAMS, f"every request must carry _meta[{META_VERSION!r}] "
                           f"(protocol {MODERN_VERSIONS[-1]})")
        elif self.era is None and method != "ping":
            raise RpcError(INVALID_REQUEST, "not initialized: send initialize first, or carry "
                           f"_meta[{META_VERSION!r}] ({MODERN_VERSIONS[-1]})")
        else:
            version = self.version or HANDSHAKE_VERSIONS[-1]
        era = MODERN if version in MODERN_VERSIONS else HANDSHAKE
        if METHODS[method] not in (None, era):
            raise RpcError(METHOD_NOT_FOUND, f"method not found at protocol {version}: {method}", method)
        result = getattr(self, "_" + method.replace("/", "_"))(params, version)
        if era == MODERN:
            result["resultType"] = "complete"
            if method in CACHEABLE:
                result.setdefault("ttlMs", 0)
                result.setdefault("cacheScope", "private")
        return result

    def _initialize(self, params: dict) -> dict:
        if self.era == MODERN:
            raise RpcError(UNSUPPORTED_VERSION, f"this connection speaks {MODERN_VERSIONS[-1]}, which has "
                           "no initialize handshake", {"supported": list(SUPPORTED_VERSIONS),
                                                        "requested": str(params.get("protocolVersion"))[:40]})
        asked = params.get("protocolVersion")
        if not isinstance(asked, str):
            raise RpcError(INVALID_PARAMS, "initialize needs protocolVersion (a string)")
        if not isinstance(params.get("capabilities", {}), dict):
            raise RpcError(INVALID_PARAMS, "capabilities must be an object")
        # A version we do not speak is answered with our newest handshake
        # one; a 2026 version asked for by initialize likewise (2026 has no
        # handshake).  The client decides whether it can go on with it.
        self.version = asked if asked in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[-1]
        self.era = HANDSHAKE
        return {"protocolVersion": self.version, "capabilities": self._capabilities(),
                "serverInfo": self.host.server_info(), "instructions": self.host.instructions()}

    def _modern(self, meta: dict) -> str:
        if self.era == HANDSHAKE:
            raise RpcError(INVALID_REQUEST, "this connection used the initialize handshake; requests "
                           f"carrying _meta[{META_VERSION!r}] are not accepted on it")
        version = meta.get(META_VERSION)
        if version not in MODERN_VERSIONS:
            raise RpcError(UNSUPPORTED_VERSION, f"unsupported protocol version {str(version)[:40]!r}",
                           {"supported": list(SUPPORTED_VERSIONS), "requested": str(version)[:40]})
        if not isinstance(meta.get(META_CAPABILITIES), dict):
            raise RpcError(INVALID_PARAMS, f"missing _meta[{META_CAPABILITIES!r}] (an object)")
        self.era = MODERN
        return version

    def _capabilities(self) -> dict:
        return {"tools": {"listChanged": False}, "resources": {"subscribe": False, "listChanged": False}}

    # -- the methods ----------------------------------------------------------

    def _ping(self, params: dict, version: str) -> dict:
        return {}

    def _server_discover(self, params: dict, version: str) -> dict:
        return {"supportedVersions": list(SUPPORTED_VERSIONS), "capabilities": self._capabilities(),
                "instructions": self.host.instructions(), "_meta": {META_SERVER_INFO: self.host.server_info()}}

    def _tools_list(self, params: dict, version: str) -> dict:
        _no_cursor(params)
        return {"tools": self.host.tools(version)}

    def _tools_call(self, params: dict, version: str) -> dict:
        name, args = params.get("name"), params.get("arguments")
        if not isinstance(name, str):
            raise RpcError(INVALID_PARAMS, "tools/call needs name (a string)")
        if args is not None and not isinstance(args, dict):
            raise RpcError(INVALID_PARAMS, "arguments must be an object")
        got = self.host.call_tool(name, args or {})
        if got is None:
            raise RpcError(INVALID_PARAMS, f"unknown tool {name[:80]!r}",
                           {"tools": [t["name"] for t in self.host.tools(version)]})
        envelope, is_error = got
        return {"content": [{"type": "text", "text": json.dumps(envelope, ensure_ascii=False)}],
                "structuredContent": envelope, "isError": is_error}

    def _resources_list(self, params: dict, version: str) -> dict:
        _no_cursor(params)
        return {"resources": self.host.resources()}

    def _resources_read(self, params: dict, version: str) -> dict:
        uri = params.get("uri")
        if not isinstance(uri, str):
            raise RpcError(INVALID_PARAMS, "resources/read needs uri (a string)")
        got = self.host.read_resource(uri)
        if got is None:
            raise RpcError(RESOURCE_NOT_FOUND, f"resource not found: {uri[:200]}", {"uri": uri[:200]})
        mime, text = got
        return {"contents": [{"uri": uri, "mimeType": mime, "text": text}]}


def _no_cursor(params: dict) -> None:
    if params.get("cursor") is not None:
        raise RpcError(INVALID_PARAMS, "invalid cursor: every list fits one page")
