"""Connection limits: one user cannot hold the broker's slots against others.

The in-process tests run the socket server of test_broker_server.py as
whoever runs the tests (every connection is one UID) with short deadlines;
the last test runs the real broker from the built archive as a throwaway
service account, with an attacker and a victim that are two other throwaway
accounts (root only).
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import time

import pytest
from helpers_broker import SYSTEM_PYTHON, needs_root, site
from test_broker_server import Running, ask, raw, wait_for

from bk.broker.server import FULL, PER_UID, per_uid_limit
from bk.ipc import protocol

PING = {"v": 1, "op": "ping"}


@pytest.fixture
def base():
    import os
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="bkc", dir="/tmp")   # short: AF_UNIX names stop at 107 bytes
    os.chmod(d, 0o755)
    os.mkdir(os.path.join(d, "data"), 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def closes_within(s: socket.socket, seconds: float) -> float:
    """Seconds until the broker hangs up on ``s`` (reading nothing), or fail."""
    t0 = time.monotonic()
    s.settimeout(seconds)
    assert s.recv(1) == b"", "the broker sent something instead of closing"
    return time.monotonic() - t0


def test_the_default_quota_is_well_below_the_whole():
    assert per_uid_limit(64) == 16
    assert per_uid_limit(256) == 64
    assert per_uid_limit(16) == 4          # at least 4 ...
    assert per_uid_limit(2) == 2           # ... but never more than all


def test_a_uid_at_its_quota_is_told_busy_naming_the_quota_and_closed(base):
    with Running(base, max_clients=8, max_per_uid=2, arrival_timeout=30) as r:
        held = [raw(r.path), raw(r.path)]        # connected, silent: each holds a slot
        try:
            with raw(r.path) as third:
                reply = protocol.decode(protocol.recv_frame(third, idle_timeout=10, frame_timeout=10))
                assert reply["ok"] is False and reply["command"] == "broker"
                err = reply["error"]
                assert err["code"] == "busy"
                assert err["details"] == {"reason": FULL, "quota": PER_UID, "limit": 2, "uid": r.plan.service_uid}
                assert "max_per_uid 2 of max_clients 8" in err["message"] and "already has 2" in err["message"]
                assert err["hint"]
                assert closes_within(third, 10) >= 0      # refused before anything was read
            assert r.broker.stats.over_quota == 1 and r.broker.stats.refused == 1
            assert r.broker.held() == {r.plan.service_uid: 2}
            # The quota counts connections, not requests: give one back and the UID gets in again.
            held.pop().close()
            wait_for(lambda: r.broker.held() == {r.plan.service_uid: 1}, what="the slot to be released")
            with raw(r.path) as again:
                assert ask(again, PING)["ok"]
        finally:
            for s in held:
                s.close()


def test_the_whole_broker_full_still_says_max_clients(base):
    with Running(base, max_clients=2, max_per_uid=5, arrival_timeout=30) as r:
        assert r.broker.max_per_uid == 2                # never above the whole
        held = [raw(r.path), raw(r.path)]
        try:
            with raw(r.path) as third:
                err = protocol.decode(protocol.recv_frame(third, idle_timeout=10, frame_timeout=10))["error"]
                assert err["code"] == "busy" and err["details"]["reason"] == FULL
                assert err["details"]["quota"] == PER_UID     # the UID's quota is named first
        finally:
            for s in held:
                s.close()


def test_a_connection_that_sends_nothing_is_closed_after_the_arrival_deadline(base):
    with Running(base, arrival_timeout=0.5, idle_timeout=60, frame_timeout=60) as r:
        with raw(r.path) as idle:
            took = closes_within(idle, 10)
        assert 0.4 <= took < 5, took                    # the short deadline, not the 60 s idle one
        wait_for(lambda: r.broker.held() == {}, what="the slot to be released")


def test_a_started_frame_must_finish_within_the_arrival_deadline(base):
    """A long frame_timeout does not let a half-sent frame hold a slot longer."""
    with Running(base, arrival_timeout=0.5, idle_timeout=60, frame_timeout=60) as r:
        with raw(r.path) as stalled:
            stalled.sendall(protocol.encode(PING)[:5])
            took = closes_within(stalled, 10)
        assert took < 5, took


@pytest.mark.slow
def test_a_slow_but_progressing_client_within_the_limits_is_served(base):
    frame = protocol.encode(PING)
    with Running(base, arrival_timeout=2.0, idle_timeout=60) as r:
        with raw(r.path) as slow:
            time.sleep(0.5)                              # well inside the first-byte deadline
            for i in range(0, len(frame), 3):            # the frame in pieces over about 1 s
                slow.sendall(frame[i:i + 3])
                time.sleep(1.0 / (len(frame) / 3))
            reply = protocol.decode(protocol.recv_frame(slow, idle_timeout=10, frame_timeout=10))
            assert reply["ok"], reply


@pytest.mark.slow
def test_between_requests_a_connection_may_idle_while_the_broker_has_room(base):
    with Running(base, arrival_timeout=0.3, idle_timeout=60) as r:
        with raw(r.path) as s:
            assert ask(s, PING)["ok"]
            time.sleep(1.0)                              # three arrival deadlines, no crowd
            assert ask(s, PING)["ok"]


def test_idle_connections_give_way_once_the_broker_is_crowded(base):
    # 6 slots, 4 per UID: with 4 held only 2 are free, fewer than one quota.
    with Running(base, max_clients=6, arrival_timeout=0.3, idle_timeout=60) as r:
        assert r.broker.max_per_uid == 4
        conns = [raw(r.path) for _ in range(4)]
        try:
            for s in conns:
                assert ask(s, PING)["ok"]
            t0 = time.monotonic()
            # Idle connections are closed until a quota's worth of slots is free
            # again (which ones go first is a race between their threads).
            wait_for(lambda: sum(r.broker.held().values()) <= 6 - 4, timeout=10,
                     what="idle connections to give way")
            assert time.monotonic() - t0 < 5                    # not the 60 s idle timeout
            # The broker closed them (end of file, no error frame); it counts a
            # slot free only after closing, so these are already readable.
            gone = [s for s in conns if select.select([s], [], [], 0)[0]]
            assert len(gone) >= 2 and all(s.recv(1) == b"" for s in gone)
        finally:
            for s in conns:
                s.close()


# ------------------------------------------------------------- real users

HOARDER = r"""
import json, select, socket, struct, sys, time
path, n = sys.argv[1], int(sys.argv[2])
socks = []
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    socks.append(s)
print(json.dumps({"ready": time.monotonic()}), flush=True)
busy, closed = [], []
pending = set(socks)
deadline = time.monotonic() + 60
while pending and time.monotonic() < deadline:
    readable, _, _ = select.select(list(pending), [], [], 1)
    for s in readable:
        pending.discard(s)
        head = s.recv(4, socket.MSG_WAITALL)
        if len(head) < 4:
            closed.append(time.monotonic())
            continue
        (size,) = struct.unpack(">I", head)
        busy.append(json.loads(s.recv(size, socket.MSG_WAITALL))["error"])
print(json.dumps({"busy": busy, "closed": closed, "still_open": len(pending)}), flush=True)
"""


@pytest.mark.slow
@needs_root
@pytest.mark.root
def test_one_user_hoarding_connections_cannot_stop_another_users_booking():
    with site() as s:
        hoarder, victim = s.accounts.user(), s.accounts.user()
        assert s.init().returncode == 0
        s.start_broker()                                 # the defaults: 64 slots, 16 per UID, 5 s arrival
        p = subprocess.Popen([SYSTEM_PYTHON, "-c", HOARDER, str(s.socket), "70"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, **s.popen_args(hoarder))
        try:
            ready = json.loads(p.stdout.readline())["ready"]
            # The broker accepts in order: all 70 of the hoarder's connections
            # are judged before the victim's first.
            rc, env = s.run_json(victim, "1", "30m", timeout=30)
            booked = time.monotonic()
            out, err = p.communicate(timeout=90)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert rc == 0 and env["ok"] and env["data"]["status"] in ("created", "queued"), env
        got = json.loads(out.splitlines()[-1])
        assert got["still_open"] == 0, got
        assert len(got["busy"]) == 54 and len(got["closed"]) == 16, got
        for e in got["busy"]:
            assert e["code"] == "busy" and e["details"]["quota"] == PER_UID and e["details"]["limit"] == 16, e
            assert e["details"]["uid"] == hoarder.uid and "max_per_uid 16" in e["message"]
        # The victim got in while the hoarder still held its 16 (the quota let it
        # in, not the deadline), and those 16 were cut off after about 5 s.
        assert booked < min(got["closed"]), (booked - ready, [c - ready for c in got["closed"]])
        assert all(3.5 < c - ready < 15 for c in got["closed"]), [c - ready for c in got["closed"]]
        assert s.broker.poll() is None and "Traceback" not in s.log(), s.log()
