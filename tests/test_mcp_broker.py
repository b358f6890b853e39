"""``bk mcp`` and ``bk agent`` on a shared server: real accounts, the built
archive, the broker running as its service account.  The agent is the
process's user, as the kernel tells the broker (SO_PEERCRED): its bookings
are its own, another user's are out of its reach, and the local reads
(list, context) never become broker operations."""

from __future__ import annotations

import json

import pytest
from helpers_broker import frame, needs_root, read_reply, site

pytestmark = [needs_root, pytest.mark.root]

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}


@pytest.fixture(scope="module")
def srv():
    with site() as s:
        s.users = (s.accounts.user(), s.accounts.user())
        p = s.init()
        assert p.returncode == 0, p.stderr
        s.start_broker()
        yield s


def mcp(srv, user, *calls) -> list[dict]:
    """One ``bk mcp`` session of ``user``: each (name, arguments) a tools/call."""
    lines = [json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                         "params": {"name": n, "arguments": a, "_meta": META}})
             for i, (n, a) in enumerate(calls, 1)]
    p = srv.run(user, "mcp", input="".join(x + "\n" for x in lines))
    assert p.returncode == 0, p.stderr
    replies = [json.loads(x) for x in p.stdout.splitlines()]
    assert [r["id"] for r in replies] == list(range(1, len(calls) + 1)), p.stdout
    return [r["result"]["structuredContent"] for r in replies]


@pytest.mark.slow
def test_an_agent_books_as_its_user_through_the_broker(srv):
    alice, bob = srv.users
    made, again, listed = mcp(srv, alice, ("create", {"count": 1, "duration": 1800, "operation_id": "a-1"}),
                              ("create", {"count": 1, "duration": 1800, "operation_id": "a-1"}),
                              ("list", {}))
    res = made["data"]["reservation"]
    assert made["ok"] and res["uid"] == alice.uid and res["user"] == alice.name
    assert again["data"]["status"] == "exists" and again["data"]["reservation"]["id"] == res["id"]
    assert [r["id"] for r in listed["data"]["reservations"]] == [res["id"]]
    assert [r.id for r in srv.ledger().state.reservations if r.uid == alice.uid] == [res["id"]]

    # Bob's agent sees the booking, but may not touch it; his cleanup finds nothing of his.
    cancel, cleanup, everyone = mcp(srv, bob, ("cancel", {"ref": res["id"]}), ("cleanup", {"all": True}),
                                    ("list", {"scope": "all"}))
    assert not cancel["ok"] and cancel["error"]["code"] == "permission_denied"
    assert cleanup["data"]["status"] == "nothing"
    assert [r["id"] for r in everyone["data"]["reservations"]] == [res["id"]]

    # bk agent is the same door: alice's cleanup releases what her session tagged.
    p = srv.run(alice, "agent", "operation", "cleanup", json.dumps({"op_id_prefix": "a-"}))
    assert p.returncode == 0, p.stderr
    done = json.loads(p.stdout)["data"]
    assert done["status"] == "cancelled" and [r["id"] for r in done["reservations"]] == [res["id"]]


@pytest.mark.slow
def test_local_reads_are_unknown_to_the_broker(srv):
    import socket

    for name in ("list", "context", "recommend", "usage", "job_log"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(str(srv.socket))
        try:
            s.sendall(frame({"op": name, "fields": {}}))
            reply = read_reply(s)
        finally:
            s.close()
        assert reply["error"]["code"] == "invalid_input" and "unknown operation" in reply["error"]["message"]


def test_another_users_job_log_is_refused_like_a_retry(srv):
    """Issue 30: ``bk j log ID`` for another user's booking said "no output"
    with exit 0 (its log lives in the owner's state directory, not the
    caller's), and MCP ``job_log`` said ok; both are refused (exit 5)."""
    alice, bob = srv.users
    rc, env = srv.run_json(alice, "1", "30m", "--note", "job-log-test", "--", "echo", "private")
    assert rc == 0, env
    res = env["data"]["reservation"]
    for action in ("log", "retry"):
        rc, env = srv.run_json(bob, "j", action, res["id"])
        assert rc == 5 and env["error"]["code"] == "permission_denied", (action, env)
        assert alice.name in env["error"]["message"]
    p = srv.run(bob, "j", "log", res["short_id"])
    assert p.returncode == 5 and "no output" not in p.stdout + p.stderr, (p.stdout, p.stderr)
    (log,) = mcp(srv, bob, ("job_log", {"ref": res["id"]}))
    assert not log["ok"] and log["error"]["code"] == "permission_denied", log
    rc, env = srv.run_json(alice, "j", "log", res["id"])                # the owner is not refused
    assert rc == 0 and env["data"]["job"]["status"] == "pending", env
