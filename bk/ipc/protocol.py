"""The broker's wire format: frames of length-prefixed JSON.

The facts.  A Unix stream socket delivers bytes, not messages: one ``recv``
may return part of a frame or parts of two, so every message carries its
length.  A reader that trusted that length would allocate whatever a client
announced, and a reader without a clock would wait forever for a client that
sent half a frame and stopped.

The format.  Each message is a 4-byte big-endian unsigned length followed by
that many bytes of UTF-8 JSON, at most ``MAX_FRAME`` (1 MiB).  A request is
``{"v": 1, "op": "book", "fields": {...}}`` and nothing else; a reply is the
JSON envelope of SPEC 6.3, the same object ``bk --json`` prints.

The limits, and what breaks a connection.  A frame must arrive whole within
``frame_timeout`` seconds of its first byte (a client that stalls mid-frame
is cut off); between frames a connection may idle for ``idle_timeout``.  An
announced length above the limit ends the connection after one error reply,
because the stream cannot be resynchronised without reading the junk.  A
frame that arrives whole but holds bad JSON, or JSON of the wrong shape, is
answered with an ``invalid_input`` error and the connection stays usable:
the framing told us exactly where it ended.
"""

from __future__ import annotations

import json
import socket
import struct
import time

from bk.core.errors import InvalidInput

HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 20
VERSION = 1
REQUEST_KEYS = ("v", "op", "fields")
_MAX_OP = 64


class ConnectionEnded(Exception):
    """The peer closed the stream.  ``partial``: it did so inside a frame."""

    def __init__(self, partial: bool):
        super().__init__("connection closed inside a frame" if partial else "connection closed")
        self.partial = partial


class FrameTimeout(Exception):
    """The peer did not send (or take) a whole frame in time."""


class FrameTooLarge(Exception):
    """A frame above ``MAX_FRAME``: announced by a peer, or about to be sent."""

    def __init__(self, size: int, limit: int = MAX_FRAME):
        super().__init__(f"frame of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


# ------------------------------------------------------------- encoding

def encode(obj: object, limit: int = MAX_FRAME) -> bytes:
    """One frame: header plus compact UTF-8 JSON.  Raises FrameTooLarge.

    A Python string may hold a lone surrogate (JSON's ``\\ud800`` escape
    makes one, and so does ``surrogateescape``), which no UTF-8 encoder
    writes.  Such text is refused at the edge, but a ledger written before
    that rule may still hold it, and a reply that cannot be encoded after a
    commit would tell the caller that a booking which exists failed.  So it
    is written as the same JSON escape (``backslashreplace`` can only meet
    it inside a JSON string, where ``\\udXXX`` is exactly that escape): the
    frame is always valid UTF-8 and decodes to the same string."""
    body = json.dumps(obj, ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False).encode("utf-8", "backslashreplace")
    if len(body) > limit:
        raise FrameTooLarge(len(body), limit)
    return HEADER.pack(len(body)) + body


def _no_constants(name: str):
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: list) -> dict:
    # A duplicated key ({"op": "ping", "op": "cancel"}) means different things
    # to different parsers; refuse it rather than pick one.
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def decode(body: bytes) -> object:
    """Strict JSON from one frame's body: UTF-8, no NaN/Infinity, no duplicate
    keys.  Raises InvalidInput (the connection may go on)."""
    try:
        text = body.decode("utf-8")
        return json.loads(text, parse_constant=_no_constants, object_pairs_hook=_unique_keys)
    except UnicodeDecodeError:
        raise InvalidInput("the frame is not UTF-8") from None
    except RecursionError:
        raise InvalidInput("the frame's JSON is nested too deeply") from None
    except ValueError as e:          # JSONDecodeError, int digit limits, the hooks above
        raise InvalidInput(f"the frame is not valid JSON: {e}") from None


def request(op: str, fields: dict | None = None) -> dict:
    return {"v": VERSION, "op": op, "fields": dict(fields or {})}


def parse_request(obj: object) -> tuple[str, dict]:
    """``(op, fields)`` from a decoded request, checking its shape only (the
    handlers check which operations and fields exist)."""
    if not isinstance(obj, dict):
        raise InvalidInput("a request must be a JSON object")
    extra = sorted(k for k in obj if k not in REQUEST_KEYS)
    if extra:
        raise InvalidInput(f"unknown request key {extra[0]!r}; a request has only "
                           + ", ".join(REQUEST_KEYS))
    v = obj.get("v", VERSION)
    if type(v) is not int or v != VERSION:
        raise InvalidInput(f"unsupported protocol version {v!r}; this broker speaks {VERSION}",
                           hint="client and broker come from different bk versions; upgrade both")
    op = obj.get("op")
    if not isinstance(op, str) or not 0 < len(op) <= _MAX_OP:
        raise InvalidInput("the request has no operation name ('op')")
    fields = obj.get("fields", {})
    if not isinstance(fields, dict):
        raise InvalidInput("'fields' must be an object")
    return op, fields


# ------------------------------------------------------------- socket I/O

def _recv_exact(sock: socket.socket, n: int, deadline: float, got_some: bool) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    pos = 0
    while pos < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise FrameTimeout(f"no complete frame after waiting; {pos} of {n} bytes arrived")
        sock.settimeout(left)
        try:
            k = sock.recv_into(view[pos:], n - pos)
        except TimeoutError:
            raise FrameTimeout(f"no complete frame in time; {pos} of {n} bytes arrived") from None
        if k == 0:
            raise ConnectionEnded(partial=got_some or pos > 0)
        pos += k
    return bytes(buf)


def recv_frame(sock: socket.socket, *, idle_timeout: float, frame_timeout: float,
               limit: int = MAX_FRAME) -> bytes | None:
    """The body of the next frame, or None when the peer closed cleanly
    between frames.  Raises FrameTimeout, ConnectionEnded, FrameTooLarge.

    ``idle_timeout`` bounds the wait for a frame's first byte,
    ``frame_timeout`` the time from that byte to the frame's last.
    """
    sock.settimeout(idle_timeout)
    try:
        first = sock.recv(HEADER.size)
    except TimeoutError:
        raise FrameTimeout("the connection was idle for too long") from None
    if not first:
        return None
    deadline = time.monotonic() + frame_timeout
    header = first + _recv_exact(sock, HEADER.size - len(first), deadline, True) \
        if len(first) < HEADER.size else first
    (size,) = HEADER.unpack(header)
    if size > limit:
        raise FrameTooLarge(size, limit)
    return _recv_exact(sock, size, deadline, True)


def send_frame(sock: socket.socket, frame: bytes, timeout: float) -> None:
    """Send one encoded frame within ``timeout`` seconds (a peer that does
    not read its replies cannot hold a broker thread for longer)."""
    deadline = time.monotonic() + timeout
    view = memoryview(frame)
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            raise FrameTimeout("the peer did not take the reply in time")
        sock.settimeout(left)
        try:
            sent = sock.send(view)
        except TimeoutError:
            raise FrameTimeout("the peer did not take the reply in time") from None
        view = view[sent:]
