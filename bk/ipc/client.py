"""Talking to the broker from a bk client.

One connection per call: connect, send one request frame, read one reply
frame, close.  Every step has a deadline, so a hung broker costs a client
seconds, not forever.

The client checks the broker too.  ``SO_PEERCRED`` works in both directions:
on the connected socket the kernel reports which account is listening.  When
the trusted config names the service UID, a listener of any other account is
refused before a byte is sent, so a socket planted at the broker's path (only
possible if its directory were misconfigured) learns nothing.

Errors map to the exit-code table: no broker (no socket, nobody listening,
no answer) is ``Unavailable`` (69) with the hint to ask systemd; a socket we
may not connect to (``access: group`` and not a member) is
``PermissionDenied`` (5); an error reply is rebuilt as the same error class
the broker raised, message and hint intact.
"""

from __future__ import annotations

import socket
import struct
import time

from bk.core import errors
from bk.core.envelope import is_envelope
from bk.ipc import protocol

HINT = "is the broker running? systemctl status gpubk-broker, or ask the administrator (bk info)"
FULL = "max_clients"          # bk.broker.server.FULL (not imported: clients stay light)
NO_BROKER = "no_broker"      # Unavailable details["reason"]: nothing listens, nothing was sent
CONNECT_TIMEOUT = 5.0
# The broker may wait up to lock_timeout_seconds (default 10) for the ledger
# lock and then run the placement; give it that and a margin.
REPLY_TIMEOUT = 30.0

def error_from(envelope: dict) -> errors.BkError:
    """The BkError an error envelope describes (the one code map: bk.core.errors)."""
    err = envelope.get("error") or {}
    if not isinstance(err, dict):
        err = {}
    message = err.get("message") if isinstance(err.get("message"), str) else "the broker refused"
    return errors.error_from(err.get("code"), message, err.get("hint"), err.get("details"))


def group_hint(group: str | None) -> str:
    named = f"group {group}" if group else "the group the administrator chose"
    return f"bk on this server is for members of {named}; ask the administrator (bk info) to add you"


class BrokerClient:
    def __init__(self, socket_path: str, *, service_uid: int | None = None,
                 group: str | None = None, connect_timeout: float = CONNECT_TIMEOUT,
                 reply_timeout: float = REPLY_TIMEOUT):
        self.socket_path = socket_path
        self.service_uid = service_uid
        self.group = group
        self.connect_timeout = connect_timeout
        self.reply_timeout = reply_timeout

    def _unavailable(self, why: str, reason: str = "unreachable") -> errors.Unavailable:
        # reason NO_BROKER: nothing listens, so nothing was sent (bk admin
        # gpu-policy then binds on the host itself).
        return errors.Unavailable(f"the gpubk broker is not reachable at {self.socket_path}: {why}; "
                                  "nothing was changed", hint=HINT, details={"reason": reason})

    def _connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        s.settimeout(self.connect_timeout)
        try:
            s.connect(self.socket_path)
        except FileNotFoundError:
            s.close()
            raise self._unavailable("no socket (is the broker running?)", NO_BROKER) from None
        except ConnectionRefusedError:
            s.close()
            raise self._unavailable("nobody is listening (the broker stopped)", NO_BROKER) from None
        except PermissionError:
            s.close()
            raise errors.PermissionDenied(
                f"you may not use the gpubk broker at {self.socket_path} (its socket is limited to a group)",
                hint=group_hint(self.group)) from None
        except OSError as e:               # includes TimeoutError
            s.close()
            raise self._unavailable(getattr(e, "strerror", None) or "connection timed out") from None
        if self.service_uid is not None:
            pid, uid, gid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                             struct.calcsize("3i")))
            if uid != self.service_uid:
                s.close()
                raise errors.Unavailable(
                    f"the process listening at {self.socket_path} runs as uid {uid}, not as the "
                    f"service account (uid {self.service_uid}); refusing to talk to it",
                    hint="tell the administrator; " + HINT)
        return s

    def call_envelope(self, op: str, fields: dict | None = None) -> dict:
        """Send one request and return the reply envelope (ok or not).

        A broker at its client limit answers ``busy`` before reading the
        request, so nothing was done and retrying is safe: it is retried
        for up to ``connect_timeout`` seconds with a growing pause."""
        frame = protocol.encode(protocol.request(op, fields))
        deadline = time.monotonic() + self.connect_timeout
        pause = 0.01
        while True:
            reply = self._exchange(frame)
            err = reply.get("error") if not reply["ok"] else None
            full = isinstance(err, dict) and err.get("code") == "busy" and \
                isinstance(err.get("details"), dict) and err["details"].get("reason") == FULL
            if not full or time.monotonic() + pause > deadline:
                return reply
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    def _exchange(self, frame: bytes) -> dict:
        s = self._connect()
        try:
            try:
                protocol.send_frame(s, frame, self.reply_timeout)
            except (OSError, protocol.FrameTimeout):
                pass   # a refusing broker may have answered and closed already: read its reply
            try:
                body = protocol.recv_frame(s, idle_timeout=self.reply_timeout,
                                           frame_timeout=self.reply_timeout)
            except protocol.FrameTimeout:
                raise errors.Unavailable(f"the gpubk broker did not answer within {self.reply_timeout:g} s; "
                                         "the request may or may not have been applied",
                                         hint="check with: bk l; then " + HINT) from None
            except (protocol.ConnectionEnded, protocol.FrameTooLarge, OSError):
                body = None
            if body is None:
                raise errors.Unavailable("the gpubk broker closed the connection without answering; "
                                         "the request may or may not have been applied",
                                         hint="check with: bk l; then " + HINT)
            try:
                reply = protocol.decode(body)
            except errors.BkError:
                reply = None
            if not is_envelope(reply):
                raise errors.Internal("the gpubk broker sent a malformed reply",
                                      hint="client and broker may be different bk versions; " + HINT)
            return reply
        finally:
            s.close()

    def call(self, op: str, fields: dict | None = None) -> tuple[dict, list[str]]:
        """``(data, warnings)`` of a successful reply; an error reply raises its BkError."""
        reply = self.call_envelope(op, fields)
        if not reply["ok"]:
            raise error_from(reply)
        return reply["data"], [w for w in reply["warnings"] if isinstance(w, str)]
