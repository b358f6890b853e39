"""Bad clients against the real broker process, and the broker killed.

The broker runs as a throwaway service account with ``--frame-timeout 2``.
Each test checks the same three things: the bad client is answered with an
error or cut off, another client is served meanwhile, and the ledger is
byte-for-byte unchanged.  The fuzz test sends at least 10,000 generated
frames (seeded; the seed is in the failure message), and the last test
kills the broker with SIGKILL in the middle of writes.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import threading
import time

import pytest
from helpers_broker import (
    SYSTEM_PYTHON,
    capacity_problems,
    connect,
    frame,
    fuzz_bodies,
    is_envelope,
    needs_root,
    ping,
    poll,
    raw_frame,
    read_reply,
    site,
)

pytestmark = [pytest.mark.slow, needs_root, pytest.mark.root]

FUZZ_SEED = int(os.environ.get("BK_FUZZ_SEED", "20260713"))
FUZZ_FRAMES = 10_000


@pytest.fixture(scope="module")
def srv():
    with site() as s:
        s.user = s.accounts.user()
        p = s.init()
        assert p.returncode == 0, p.stderr
        s.start_broker("--frame-timeout", "2", "--idle-timeout", "3")
        rc, env = s.run_json(s.user, "1", "30m")        # a ledger to keep unchanged
        assert rc == 0, env
        yield s


@pytest.fixture
def unchanged(srv):
    """The ledger is byte-for-byte the same after the test, and the broker
    still serves a fresh client."""
    before = srv.ledger_digest()
    yield
    assert ping(srv.socket)["ok"], srv.log()
    assert srv.broker.poll() is None, srv.log()
    assert srv.ledger_digest() == before
    assert "internal error" not in srv.log() and "Traceback" not in srv.log(), srv.log()


def ask(s: socket.socket, data: bytes) -> dict | None:
    s.sendall(data)
    return read_reply(s)


def test_malformed_json_wrong_types_unknown_operations(srv, unchanged):
    with connect(srv.socket) as s:
        bad = [raw_frame(b"{"), raw_frame(b""), raw_frame(b"\xff\xfe"), raw_frame(b"[1,2]"),
               raw_frame(b'{"op": "ping", "op": "book"}'), raw_frame(b'{"op": NaN}'),
               raw_frame(b"[" * 100000),
               frame({"v": 1, "op": "format_disk"}), frame({"v": 2, "op": "ping"}),
               frame({"v": 1, "op": "book", "fields": {"count": "1", "duration": 1800}}),
               frame({"v": 1, "op": "book", "fields": {"count": True, "duration": 1800}}),
               frame({"v": 1, "op": "book", "fields": {"count": 1, "duration": 1800, "start": 10**30}}),
               frame({"v": 1, "op": "book", "fields": {"count": 1, "duration": None}}),
               frame({"v": 1, "op": "cancel", "fields": ["ref"]}),
               frame({"v": 1, "op": "ping", "fields": {"x": 1}}),
               frame({"v": 1, "op": "notice_publish", "fields": {"text": 5}})]
        for data in bad:
            reply = ask(s, data)   # the same connection keeps working after each error
            assert is_envelope(reply) and reply["ok"] is False, reply
            assert reply["error"]["code"] == "invalid_input", reply


def test_oversized_frame_is_refused_and_the_connection_closed(srv, unchanged):
    with connect(srv.socket) as s:
        s.sendall(struct.pack(">I", (1 << 20) + 1))
        reply = read_reply(s)
        assert reply["ok"] is False and "limit" in reply["error"]["message"]
        assert read_reply(s) is None
    with connect(srv.socket) as s:   # exactly at the limit is read, then judged
        body = b'{"op": "ping", "fields": {"pad": "' + b"x" * ((1 << 20) - 40) + b'"}}'
        assert len(body) <= 1 << 20
        assert ask(s, raw_frame(body))["ok"] is False


def test_truncated_frame_then_close(srv, unchanged):
    with connect(srv.socket) as s:
        body = frame({"v": 1, "op": "book", "fields": {"count": 1, "duration": 1800}})
        s.sendall(body[:-5])
        s.shutdown(socket.SHUT_WR)
        assert read_reply(s) is None


def test_a_stalled_half_frame_is_cut_off_while_others_are_served(srv, unchanged):
    with connect(srv.socket, timeout=30) as stalled:
        stalled.sendall(frame({"v": 1, "op": "ping"})[:6])
        started = time.monotonic()
        for _ in range(5):
            assert ping(srv.socket)["ok"]
        assert read_reply(stalled) is None          # the broker hangs up (frame timeout 2 s)
        assert time.monotonic() - started < 20


def test_an_idle_connection_does_not_block_others(srv, unchanged):
    with connect(srv.socket, timeout=30) as idle:
        for _ in range(5):
            assert ping(srv.socket)["ok"]
        assert read_reply(idle) is None             # idle timeout 3 s


KILLED = """
import socket, struct, sys, os, json
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
body = json.dumps({"v": 1, "op": "book", "fields": {"count": 1, "duration": 1800, "dry_run": True}}).encode()
data = struct.pack(">I", len(body)) + body
s.sendall(data if sys.argv[2] == "whole" else data[:len(data) // 2])
print("sent", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("part", ["half", "whole"])
def test_a_client_killed_mid_request(srv, unchanged, part):
    p = subprocess.Popen([SYSTEM_PYTHON, "-c", KILLED, str(srv.socket), part], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, **srv.popen_args(srv.user))
    try:
        assert p.stdout.readline().strip() == "sent"
    finally:
        p.kill()
        p.wait()
    assert ping(srv.socket)["ok"]
    assert "Traceback" not in srv.log()


def test_ten_thousand_fuzzed_frames(srv, unchanged):
    other = connect(srv.socket, timeout=30)
    sent = closed = 0
    codes: dict[str, int] = {}
    s = connect(srv.socket)
    try:
        for i, body in enumerate(fuzz_bodies(FUZZ_SEED, FUZZ_FRAMES)):
            # Now and then a header announcing more than the limit: one error, then the broker hangs up.
            data = struct.pack(">I", (1 << 20) + 1 + i) if i % 997 == 996 else raw_frame(body)
            try:
                reply = ask(s, data)
            except (BrokenPipeError, ConnectionResetError):
                reply = None
            sent += 1
            if data[:4] != raw_frame(body)[:4]:
                assert reply is not None and "limit" in reply["error"]["message"]
                reply = read_reply(s)
            if reply is None:
                closed += 1
                s.close()
                s = connect(srv.socket)
                continue
            assert is_envelope(reply), f"seed {FUZZ_SEED}, frame {i}: {body[:200]!r} -> {reply!r}"
            if not reply["ok"]:
                codes[reply["error"]["code"]] = codes.get(reply["error"]["code"], 0) + 1
                assert reply["error"]["code"] != "internal", \
                    f"seed {FUZZ_SEED}, frame {i}: {body[:300]!r} -> {reply}"
            if i % 500 == 0:   # a well-behaved client on its own connection is served throughout
                assert ask(other, frame({"v": 1, "op": "ping"}))["ok"], f"seed {FUZZ_SEED}, frame {i}"
    finally:
        s.close()
        other.close()
    print(f"fuzz seed {FUZZ_SEED}: {sent} frames, {closed} closed connections, errors {codes}")
    assert sent >= FUZZ_FRAMES and closed >= FUZZ_FRAMES // 1000
    assert codes.get("invalid_input", 0) > FUZZ_FRAMES // 2, codes


def test_sigkill_during_writes_keeps_every_acknowledged_booking(srv):
    from bk.core.errors import BkError
    from bk.ipc.client import BrokerClient

    acked: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def writer():
        client = BrokerClient(str(srv.socket), service_uid=srv.service.uid, reply_timeout=10)
        while not stop.is_set():
            try:
                data, _ = client.call("book", {"count": 1, "duration": 300, "queue": False})
            except BkError:
                if srv.broker.poll() is not None:
                    return
                continue
            with lock:
                acked.append(data["record"]["id"])

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        poll(lambda: len(acked) >= 40, 60, "40 acknowledged bookings")
        srv.broker.send_signal(signal.SIGKILL)
        srv.broker.wait(10)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert srv.socket.exists()                     # a dead broker leaves its socket behind
    srv.start_broker("--frame-timeout", "2", "--idle-timeout", "3")   # replaces it: dead and ours
    got = srv.ledger()
    assert got.source == "ledger" and not got.warnings, got.warnings
    ids = {r.id for r in got.state.reservations}
    missing = [i for i in acked if i not in ids]
    assert not missing, f"{len(missing)} acknowledged bookings lost"
    assert capacity_problems(got.state.reservations, 2) == []
    rc, env = srv.run_json(srv.user, "1", "30m")
    assert rc == 0, env
