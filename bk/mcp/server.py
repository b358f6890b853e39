"""The stdio loop: one JSON-RPC message per line in, one reply per line out.

How the pipes behave decides the shape:

* MCP's stdio transport delimits messages by newlines (a message never
  contains one), so ``readline`` frames them.  ``readline(limit)`` on a
  buffered pipe returns at a newline, at EOF, or after ``limit`` bytes, so a
  line longer than the stated limit is noticed after reading just past the
  limit: it is answered -32600, and the rest of it is read and thrown away
  in bounded chunks until its newline, without ever holding it whole.
* A client that closes stdin part-way through a line leaves bytes with no
  newline before EOF: an incomplete message, never executed (it may be the
  first half of a booking).  The server says so on stderr and exits 0, as
  it does at a clean EOF.
* stdout carries protocol messages only.  The loop writes to its own
  duplicate of fd 1 and points ``sys.stdout`` at stderr meanwhile, so a
  stray print anywhere cannot corrupt the stream.  Each reply is written and
  flushed whole before the next line is read; a reader that went away
  (EPIPE) ends the server quietly.
* Requests run one at a time, in order; a bug in a tool is answered with
  the internal error envelope, one anywhere else -32603,
  and the server goes on.
"""

from __future__ import annotations

import os
import sys

from bk.mcp import protocol
from bk.mcp.tools import Host, stderr_log

CHUNK = 1 << 16


def read_messages(stream, limit: int = protocol.MAX_MESSAGE_BYTES, *, log=stderr_log):
    """Yield each line's bytes (newline stripped), or an int (the size read
    so far) for a line over ``limit``; stop at EOF."""
    while True:
        line = stream.readline(limit + 1)
        if not line:
            return
        if line.endswith(b"\n"):
            body = line[:-1]
            if len(body) > limit:
                yield len(body)
            elif body.strip():
                yield body
            continue
        if len(line) <= limit:          # EOF inside a line: an incomplete message
            log(f"stdin closed in the middle of a message ({len(line)} bytes): not run")
            return
        size = len(line)
        while True:                     # drop the rest of the oversized line
            rest = stream.readline(CHUNK)
            size += len(rest) - rest.endswith(b"\n")
            if not rest or rest.endswith(b"\n"):
                break
        yield size
        if not rest:
            return


def serve(app, stdin=None, stdout=None, *, log=stderr_log) -> int:
    """Serve one client on ``stdin``/``stdout`` (binary) until EOF."""
    stdin = stdin if stdin is not None else sys.stdin.buffer
    own_out = stdout is None
    if own_out:
        stdout = os.fdopen(os.dup(1), "wb")
    saved, sys.stdout = sys.stdout, sys.stderr
    session = protocol.Session(Host(app, log=log))
    try:
        for item in read_messages(stdin, log=log):
            if isinstance(item, int):
                reply = session.too_large(item)
            else:
                try:
                    reply = session.handle_line(item)
                except Exception as exc:       # a bug outside any tool: one reply, the server goes on
                    log(f"internal error: {type(exc).__name__}: {exc}")
                    reply = protocol.error_reply(None, protocol.INTERNAL_ERROR, "internal error")
            if reply is not None:
                try:
                    stdout.write(protocol.encode(reply))
                    stdout.flush()
                except BrokenPipeError:
                    return 0
        return 0
    finally:
        sys.stdout = saved
        if own_out:
            try:
                stdout.close()
            except OSError:
                pass
