"""Framing, request shape and the operation allowlist, without a server.

Sockets here are real (``socket.socketpair``); the service behind the
dispatcher is a small fake that records what it was asked.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import pytest

from bk.broker.handlers import Dispatcher, Latest, Peer
from bk.core.envelope import is_envelope
from bk.core.errors import InvalidInput, PermissionDenied
from bk.core.models import Reservation
from bk.gpu.sim import CountBackend
from bk.ipc import protocol
from bk.service import ops
from bk.service.fields import MAX_WIRE_INT
from bk.service.requests import BookRequest, CancelRequest, EditRequest

_ROWS = {BookRequest: "book", EditRequest: "edit", CancelRequest: "cancel"}


def decode_request(cls, fields):
    """The broker's decoder for a request type: its operation row."""
    return ops.get(_ROWS[cls]).decode(fields)


@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield a, b
    a.close()
    b.close()


# ------------------------------------------------------------- framing

def test_encode_decode_round_trip(pair):
    a, b = pair
    msg = {"v": 1, "op": "book", "fields": {"note": "héllo ✓", "count": 2}}
    a.sendall(protocol.encode(msg))
    body = protocol.recv_frame(b, idle_timeout=5, frame_timeout=5)
    assert protocol.decode(body) == msg
    assert struct.unpack(">I", protocol.encode(msg)[:4])[0] == len(body)


def test_frames_arrive_in_pieces(pair):
    a, b = pair
    data = protocol.encode({"op": "ping"}) + protocol.encode({"op": "book"})

    def trickle():
        for i in range(len(data)):
            a.send(data[i:i + 1])
    t = threading.Thread(target=trickle)
    t.start()
    got = [protocol.decode(protocol.recv_frame(b, idle_timeout=5, frame_timeout=5)) for _ in range(2)]
    t.join()
    assert got == [{"op": "ping"}, {"op": "book"}]


def test_clean_close_between_frames_is_none_and_inside_is_an_error(pair):
    a, b = pair
    a.sendall(protocol.encode({"op": "ping"})[:-1])
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(protocol.ConnectionEnded) as e:
        protocol.recv_frame(b, idle_timeout=5, frame_timeout=5)
    assert e.value.partial
    c, d = socket.socketpair()
    c.close()
    assert protocol.recv_frame(d, idle_timeout=5, frame_timeout=5) is None
    d.close()


def test_announced_size_over_the_limit_is_refused_before_reading(pair):
    a, b = pair
    a.sendall(struct.pack(">I", protocol.MAX_FRAME + 1))
    with pytest.raises(protocol.FrameTooLarge) as e:
        protocol.recv_frame(b, idle_timeout=5, frame_timeout=5)
    assert e.value.size == protocol.MAX_FRAME + 1
    with pytest.raises(protocol.FrameTooLarge):
        protocol.encode({"x": "y" * protocol.MAX_FRAME})


def test_a_stalled_half_frame_times_out_by_the_frame_deadline(pair):
    a, b = pair
    a.sendall(protocol.encode({"op": "ping"})[:3])
    t0 = time.monotonic()
    with pytest.raises(protocol.FrameTimeout):
        protocol.recv_frame(b, idle_timeout=5, frame_timeout=0.3)
    assert time.monotonic() - t0 < 3


def test_a_trickling_client_cannot_stretch_the_frame_deadline(pair):
    """One byte every 0.1 s never trips a per-recv timeout; the deadline
    counts from the first byte."""
    a, b = pair
    data = protocol.encode({"op": "ping", "fields": {"pad": "x" * 200}})
    stop = threading.Event()

    def trickle():
        for i in range(len(data)):
            if stop.wait(0.1):
                return
            try:
                a.send(data[i:i + 1])
            except OSError:
                return
    t = threading.Thread(target=trickle)
    t.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(protocol.FrameTimeout):
            protocol.recv_frame(b, idle_timeout=5, frame_timeout=0.5)
        assert time.monotonic() - t0 < 3
    finally:
        stop.set()
        t.join()


@pytest.mark.parametrize("body", [b"{", b"", b"\xff", b'{"a": NaN}', b'{"a": Infinity}',
                                  b'{"op": "ping", "op": "book"}', b"[" * 50000])
def test_decode_refuses_bad_json_as_invalid_input(body):
    with pytest.raises(InvalidInput):
        protocol.decode(body)


@pytest.mark.parametrize("obj", [[], "ping", {"op": "ping", "uid": 0}, {"v": 2, "op": "ping"},
                                 {"v": True, "op": "ping"}, {"op": ""}, {"op": 5}, {"op": "x" * 65},
                                 {"op": "ping", "fields": []}, {"fields": {}}])
def test_parse_request_shape(obj):
    with pytest.raises(InvalidInput):
        protocol.parse_request(obj)


def test_parse_request_accepts_the_minimal_form():
    assert protocol.parse_request({"op": "ping"}) == ("ping", {})
    assert protocol.parse_request(protocol.request("book", {"count": 1})) == ("book", {"count": 1})


# ------------------------------------------------------------- field decoding

@pytest.mark.parametrize("fields", [
    {"count": None, "duration": 1800}, {"count": 1, "duration": 1800, "queue": None},
    {"count": True, "duration": 1800}, {"count": 1.0, "duration": 1800}, {"count": "1", "duration": 1800},
    {"count": 1, "duration": MAX_WIRE_INT + 1}, {"count": 1, "duration": -300},
    {"count": 1, "duration": 1800, "pinned": [64]}, {"count": 1, "duration": 1800, "pinned": [True]},
    {"count": 1, "duration": 1800, "excluded": [-1]}, {"count": 1, "duration": 1800, "uid": 0},
    {"count": 1, "duration": 1800, "note": "x" * 1001}, {"duration": 1800},
    {"count": 1, "duration": 1800, "mode": "greedy"},
    {"count": 1, "duration": 1800, "note": "\x1b]0;owned\x07"}, {"count": 1, "duration": 1800, "note": "a\nb"},
    {"count": 1, "duration": 1800, "note": "abc\u202edcba"}, {"count": 1, "duration": 1800, "op_id": "k\x00"},
])
def test_decode_request_refuses(fields):
    with pytest.raises(InvalidInput):
        decode_request(BookRequest, fields)


def test_decode_request_builds_typed_requests():
    req = decode_request(BookRequest, {"count": 2, "duration": 3600, "pinned": [0, 1], "mem_mib": None})
    assert req == BookRequest(count=2, duration=3600, pinned=(0, 1))
    assert decode_request(BookRequest, {"count": 1, "duration": 60, "note": "Ümlaut ✓ 模型"}).note == "Ümlaut ✓ 模型"
    assert decode_request(EditRequest, {"ref": "abcd", "excluded": None}).excluded is None
    assert decode_request(CancelRequest, {"ref": "abcd", "reason": "r"}).reason == "r"


# ------------------------------------------------------------- the dispatcher


class CountingBackend(CountBackend):
    def __init__(self, n):
        super().__init__(n)
        self.snapshots = 0

    def snapshot(self, now):
        self.snapshots += 1
        return super().snapshot(now)


@pytest.fixture
def svc(tmp_path, monkeypatch):
    """A real local service on a temporary ledger; ``raise_next`` makes the
    next booking's apply raise (a refusal or a bug)."""
    from bk.service import open_app

    env = {"BK_DATA_DIR": str(tmp_path / "data"), "HOME": str(tmp_path),
           "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    backend = CountingBackend(2)
    service = open_app(env, backend=backend, clock_fn=lambda: 1_800_000_000)
    service.backend_for_test = backend
    real = ops.OPERATIONS["book"]
    box = {"next": None}

    def apply(state, req, call):
        if box["next"] is not None:
            exc, box["next"] = box["next"], None
            raise exc
        return real.apply(state, req, call)
    from bk.core.record import replace

    monkeypatch.setitem(ops.OPERATIONS, "book", replace(real, apply=apply))
    service.box = box
    return service


PEER = Peer(pid=1234, uid=4242, gid=4242)


def test_dispatch_book_uses_the_peer_identity_and_returns_an_envelope(svc):
    d = Dispatcher(svc)
    reply = d.dispatch({"v": 1, "op": "book", "fields": {"count": 1, "duration": 1800}}, PEER)
    assert is_envelope(reply) and reply["ok"] and reply["command"] == "book"
    state = svc.ledger()
    assert state.reservations[0].uid == 4242
    data = reply["data"]
    assert data["status"] == "created" and data["reservation"]["uid"] == 4242 and data["reservation"]["mine"]
    assert Reservation.from_dict(data["record"]).id == data["reservation"]["id"]
    json.dumps(reply)


def test_unknown_operation_and_bad_frames_are_error_envelopes(svc):
    d = Dispatcher(svc)
    for obj in ({"op": "shutdown"}, {"op": "__class__"}, {"op": "book", "fields": {"count": "x"}}):
        reply = d.dispatch(obj, PEER)
        assert is_envelope(reply) and not reply["ok"] and reply["error"]["code"] == "invalid_input"
    reply = d.dispatch_frame(b"{nope", PEER)
    assert not reply["ok"] and reply["command"] == "broker"


def test_an_unexpected_exception_is_internal_and_the_next_request_works(svc):
    lines = []
    d = Dispatcher(svc, log=lines.append)
    svc.box["next"] = ZeroDivisionError("boom")
    reply = d.dispatch({"op": "book", "fields": {"count": 1, "duration": 1800}}, PEER)
    assert reply["error"]["code"] == "internal" and "boom" not in reply["error"]["message"]
    assert lines and "ZeroDivisionError" in lines[0]
    assert d.dispatch({"op": "book", "fields": {"count": 1, "duration": 1800}}, PEER)["ok"]


def test_bk_errors_keep_their_code_and_hint(svc):
    svc.box["next"] = PermissionDenied("not yours", hint="ask the owner")
    reply = Dispatcher(svc).dispatch({"op": "book", "fields": {"count": 1, "duration": 1800}}, PEER)
    assert reply["error"] == {"code": "permission_denied", "message": "not yours", "hint": "ask the owner"}


def test_notice_publish_fields_are_checked_and_identity_decides(svc):
    d = Dispatcher(svc)
    for fields in ({"text": ""}, {"text": 5}, {"text": "\x1b[2J"}, {"text": "x", "level": "loud"}, {"text": "x", "until": "soon"},
                   {"text": "x", "until": 1}, {"text": "x", "uid": 0}, {"text": "x" * 2001}):
        assert d.dispatch({"op": "notice_publish", "fields": fields}, Peer(1, 0, 0))["error"]["code"] \
            == "invalid_input", fields
    assert d.dispatch({"op": "notice_publish", "fields": {"text": "hi"}}, PEER)["error"]["code"] \
        == "permission_denied"
    reply = d.dispatch({"op": "notice_publish", "fields": {"text": "hi", "level": "warning"}}, Peer(1, 0, 0))
    assert reply["ok"] and reply["data"]["notice"]["level"] == "warning"


def test_ping_reports_the_peer_as_the_kernel_gave_it(svc):
    reply = Dispatcher(svc).dispatch({"op": "ping"}, Peer(77, 0, 0))
    assert reply["data"]["peer"] == {"pid": 77, "uid": 0, "user": "root", "admin": True}
    assert Dispatcher(svc).dispatch({"op": "ping", "fields": {"uid": 1}}, PEER)["ok"] is False


def test_requests_never_query_the_gpus_the_refresher_does(svc):
    """The broker answers from the latest snapshot: no request (and so no
    request under the lock) asks the backend; ``Latest.refresh`` does."""
    t = [100.0]
    latest = Latest(svc.telemetry, monotonic=lambda: t[0])
    latest.refresh()
    d = Dispatcher(svc, latest=latest)
    backend = svc.backend_for_test
    taken = backend.snapshots
    book = {"op": "book", "fields": {"count": 1, "duration": 1800}}
    for _ in range(3):
        assert d.dispatch(book, PEER)["ok"]
    assert backend.snapshots == taken
    assert not latest.stale()
    t[0] += 2.5
    assert latest.stale()
    latest.refresh()
    assert backend.snapshots == taken + 1 and not latest.stale()
