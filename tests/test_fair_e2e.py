"""Issue 27 through the built bk.pyz: privately (a fresh process per
command as a real throwaway user, the fixed clock of helpers_admin; root
has no limits, so the user is not root), then on a shared server with real
throwaway accounts and the broker (helpers_broker): limits set with bk
admin gpu-policy and enforced by the broker with refusals that explain, a
queued booking moved earlier by another user's cancellation in the same
commit, and a booking shared with a group that its members run on and only
its owner changes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from helpers_admin import Private
from helpers_broker import SYSTEM_PYTHON, Accounts, make_base, needs_root, poll, site

pytestmark = [pytest.mark.slow, needs_root, pytest.mark.root]


class AsUser(Private):
    """``helpers_admin.Private`` run as ``account`` (its home the root), or
    as root with ``as_root=True`` (``bk admin`` on the user's files)."""

    def __init__(self, pyz, account):
        super().__init__(pyz, __import__("pathlib").Path(account.home))
        self.account = account

    def run(self, *argv, as_root: bool = False, **kw) -> subprocess.CompletedProcess:
        if not as_root:
            kw = dict(python=SYSTEM_PYTHON, user=self.account.uid, group=self.account.gid, extra_groups=[], **kw)
        return super().run(*argv, **kw)


@pytest.fixture
def bk(pyz):
    base = make_base()
    accounts = Accounts(base)
    try:
        ada = accounts.user()
        archive = base / "bk.pyz"
        shutil.copy(pyz, archive)
        os.chmod(archive, 0o644)
        yield AsUser(archive, ada)
    finally:
        accounts.cleanup()
        shutil.rmtree(base, ignore_errors=True)


def write_config(bk, **values) -> None:
    """The user's own configuration (private mode reads it)."""
    bk.run("config", "--json")                        # bk makes its directories as the user
    bk.config.parent.mkdir(parents=True, exist_ok=True)
    bk.config.write_text(json.dumps(values))
    for p in (bk.config, bk.config.parent, bk.config.parent.parent):
        os.chown(p, bk.account.uid, bk.account.gid)


def test_private_limit_refusal_through_the_pyz_names_the_numbers_and_the_commands(bk):
    write_config(bk, limits={"*": {"gpu_hours": 24}})
    bk.book("2", "10h", "-t", "11:00")
    p = bk.run("2", "4h", "-t", "12:00", code=3)
    assert "you hold 20 of 24 future GPU-hours" in p.stderr and "this needs 8" in p.stderr
    assert "hint: run: bk 2 2h --start 2026-07-13T12:00:00Z" in p.stderr
    err = bk.json("2", "4h", "-t", "12:00", code=3)["error"]
    assert err["details"]["rule"] == "limit_gpu_hours" and err["details"]["fits"]["duration"] == 7200
    bk.run(*err["details"]["commands"][0].split()[1:])
    info = bk.data_of("info")["your_limits"]
    assert info["limits"]["gpu_hours"]["value"] == 24
    assert "24 GPU-hours booked ahead" in bk.run("info").stdout


def test_private_advance_after_bk_d_through_the_pyz(bk):
    wall = bk.book("x", "4", "1h")
    queued = bk.data_of("1", "30m", "--advance")
    assert queued["status"] == "queued" and queued["reservation"]["advance"]["latest_start"] == "2026-07-13T11:40:00Z"
    listed = bk.data_of("l")["reservations"]
    assert [r["advance"]["position"] if r["advance"] else None for r in listed] == [None, 1]
    bk.run("d", wall["short_id"])
    moved = bk.data_of("l")["reservations"]
    assert [(r["id"], r["start"], r["advance"]) for r in moved] == [
        (queued["reservation"]["id"], "2026-07-13T10:40:00Z", None)]
    assert "moved earlier" in bk.run("n").stdout
    assert any(e["action"] == "booking_advanced" for e in bk.data_of("lg", "-n", "10")["entries"])


def test_gpu_policy_on_a_shared_server_lists_the_bookings_a_change_would_break():
    """root changes the limits of a running shared server: a dry run and a
    refused change name the real user's booking the new limit breaks (and
    keep the file), --force keeps the booking and the broker enforces the
    new limits from the next request."""
    with site() as srv:
        alice = srv.accounts.user()
        assert srv.init().returncode == 0
        srv.start_broker()
        rc, env = srv.run_json(alice, "3", "2h")
        assert rc == 0, env
        three = env["data"]["reservation"]
        before = srv.config.read_bytes()
        rc, env = srv.run_json(None, "admin", "gpu-policy", "--limit", "*:gpus=2", "--dry-run")
        assert rc == 0 and env["data"]["status"] == "dry_run", env
        assert [v["reservation"]["id"] for v in env["data"]["violations"]] == [three["id"]], env
        assert "takes its owner to 3 GPUs at once" in env["data"]["violations"][0]["why"], env
        p = srv.run(None, "admin", "gpu-policy", "--limit", "*:gpus=2")
        assert p.returncode == 3 and three["short_id"] in p.stdout + p.stderr, (p.stdout, p.stderr)
        rc, env = srv.run_json(None, "admin", "gpu-policy", "--limit", "*:gpus=2")
        assert rc == 3 and env["error"]["details"]["violations"] == [three["id"]], env
        assert srv.config.read_bytes() == before
        rc, env = srv.run_json(None, "admin", "gpu-policy", "--limit", "*:gpus=2", "--tier",
                               f"students={alice.name}", "--limit", "students:booking_hours=4", "--force")
        assert rc == 0 and env["data"]["status"] == "changed", env
        doc = json.loads(srv.config.read_text())
        assert doc["limits"] == {"*": {"gpus": 2}, "students": {"booking_hours": 4}}
        assert doc["limit_tiers"] == {"students": [alice.name]}
        rc, env = srv.run_json(alice, "l")
        assert [r["id"] for r in env["data"]["reservations"]] == [three["id"]], env     # kept, never cancelled
        rc, env = srv.run_json(alice, "1", "30m", "-t", "+1h")
        assert rc == 3 and env["error"]["details"]["rule"] == "limit_gpus", env
        rc, env = srv.run_json(alice, "1", "5h", "-t", "+3h")
        assert rc == 3 and env["error"]["details"]["rule"] == "limit_booking_hours", env
        assert "of the students tier" in env["error"]["message"], env
        rc, env = srv.run_json(None, "admin", "gpu-policy")
        shown = env["data"]["policy"]
        assert shown["limits"] == doc["limits"] and shown["limit_tiers"] == {"students": [alice.name]}, env
        rc, env = srv.run_json(None, "admin", "gpu-policy", "--limit", "*:gpus=unset", "--advance-default", "on",
                               "--fair-share", "on")
        assert rc == 0, env
        doc = json.loads(srv.config.read_text())
        assert doc["limits"] == {"students": {"booking_hours": 4}} and doc["advance_default"] and doc["fair_share"]
        rc, env = srv.run_json(alice, "1", "30m", "-t", "+1h")
        assert rc == 0, env
        rc, env = srv.run_json(None, "admin", "gpu-policy", "--limit", "*:gpus=0")
        assert rc == 2 and env["error"]["message"].startswith("--limit: limits.*.gpus must be a whole number"), env


META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}


def mcp(srv, user, *calls) -> list[dict]:
    """One ``bk mcp`` session of ``user`` (as tests/test_mcp_broker.py):
    each (name, arguments) a tools/call; the envelopes."""
    lines = [json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                         "params": {"name": n, "arguments": a, "_meta": META}})
             for i, (n, a) in enumerate(calls, 1)]
    p = srv.run(user, "mcp", input="".join(x + "\n" for x in lines))
    assert p.returncode == 0, p.stderr
    return [json.loads(x)["result"]["structuredContent"] for x in p.stdout.splitlines()]


def test_shared_server_limits_advances_and_shared_bookings_with_real_users():
    with site() as srv:
        team, _ = srv.accounts.group()
        alice, bob, carol = srv.accounts.user(), srv.accounts.user((team,)), srv.accounts.user()
        assert srv.init().returncode == 0
        srv.start_broker()

        # Limits, set by root, enforced by the broker for real users.
        rc, env = srv.run_json(None, "admin", "gpu-policy", "--limit", "*:gpus=2", "--tier", f"team=@{team}",
                               "--limit", "team:booking_hours=2")
        assert rc == 0, env
        rc, env = srv.run_json(alice, "x", "2", "1h")
        assert rc == 0, env
        wall = env["data"]["reservation"]
        rc, env = srv.run_json(alice, "1", "1h")
        assert rc == 3 and env["error"]["details"]["rule"] == "limit_gpus", env
        assert "you may hold at most 2 GPUs at once" in env["error"]["message"]
        assert env["error"]["details"]["commands"], env          # the broker's reply keeps the details
        # Her agent gets the same refusal, fields and all, and sees her limits in its context.
        made, ctx = mcp(srv, alice, ("create", {"count": 1, "duration": 3600, "operation_id": "f-1"}),
                        ("context", {}))
        # A booking from now: the window moved on by the second between the two asks.
        moving = ("from", "until")
        assert not made["ok"] and all(k in made["error"]["details"] for k in moving), made
        assert ({k: v for k, v in made["error"]["details"].items() if k not in moving}
                == {k: v for k, v in env["error"]["details"].items() if k not in moving}), made
        assert made["error"]["message"] == env["error"]["message"]
        assert ctx["data"]["policy"]["your_limits"]["limits"]["gpus"]["value"] == 2, ctx
        rc, env = srv.run_json(bob, "1", "3h")
        assert rc == 3 and env["error"]["details"]["rule"] == "limit_booking_hours", env
        assert "of the team tier" in env["error"]["message"]

        # carol fills the other two GPUs; bob's booking waits and asks to advance.
        rc, env = srv.run_json(carol, "x", "2", "1h")
        assert rc == 0, env
        rc, env = srv.run_json(bob, "1", "30m", "--advance")
        assert rc == 0 and env["data"]["status"] == "queued", env
        waiting = env["data"]["reservation"]
        rc, env = srv.run_json(carol, "d", "1")                 # carol's cancel makes room
        assert rc == 0, env
        rc, env = srv.run_json(bob, "l")
        mine = [r for r in env["data"]["reservations"] if r["id"] == waiting["id"]][0]
        assert mine["start"] < waiting["start"] and mine["advance"] is None, (mine, waiting)
        rc, env = srv.run_json(bob, "n")
        assert any("moved earlier" in n["text"] for n in env["data"]["notices"]), env
        rc, env = srv.run_json(bob, "lg", "-n", "20")
        adv = [e for e in env["data"]["entries"] if e["action"] == "booking_advanced"]
        assert adv and adv[0]["uid"] == carol.uid, env

        # alice shares her running booking with the team: bob runs on it, carol may not.
        rc, env = srv.run_json(alice, "e", wall["short_id"], "--with", f"@{team}")
        assert rc == 0 and env["data"]["reservation"]["shared_with"] == [f"@{team}"], env
        rc, env = srv.run_json(bob, "l")
        shared = [r for r in env["data"]["reservations"] if r["id"] == wall["id"]]
        assert shared and shared[0]["shared_with_you"] and shared[0]["number"] is None, env
        listed, ctx = mcp(srv, bob, ("list", {}), ("context", {}))
        assert [(r["id"], r["shared_with_you"]) for r in listed["data"]["reservations"]
                if r["id"] == wall["id"]] == [(wall["id"], True)], listed
        assert [r["id"] for r in ctx["data"]["shared_with_you"]] == [wall["id"]], ctx
        p = srv.run(bob, "run", "-r", wall["short_id"], "--", "/bin/sh", "-c", "echo $CUDA_VISIBLE_DEVICES")
        assert p.returncode == 0, (p.stdout, p.stderr)
        p = srv.run(carol, "--json", "run", "-r", wall["short_id"], "--", "/bin/true")
        assert p.returncode == 5 and json.loads(p.stdout)["error"]["code"] == "permission_denied", p.stdout
        for argv in (["d", wall["short_id"]], ["e", wall["short_id"], "-d", "+30m"]):
            rc, env = srv.run_json(bob, *argv)
            assert rc == 5 and env["error"]["code"] == "permission_denied", (argv, env)
        rc, env = srv.run_json(alice, "e", wall["short_id"], "--with", "nosuchuser27")
        assert rc == 2 and "does not know" in env["error"]["message"], env
        poll(lambda: srv.broker.poll() is None, 1, "the broker to keep running")
