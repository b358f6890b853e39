"""The cluster against real sshd: two loopback "hosts" (127.0.0.2 and
127.0.0.3, each an sshd with its own host key, config and bk data
directory), a throwaway user with a key, the built bk.pyz on both ends.

Covered: probe prints the add command and the add command works; check;
rec; book on the best node (earliest start, then priority); edit and cancel
NODE/ID; bk @NODE; a node down; a node with a wrong identity; a node that
answers with another node's identity, prints garbage, prints a huge reply
or hangs past its timeout (reported for that node while the others go on);
a reply lost after the remote commit (recovered through the op-id, no
second booking); the agent's cluster_create."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

from tests.helpers_broker import Accounts, make_base
from tests.helpers_sshd import Lab, free_port, have_sshd, write_catalog

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root (test users, sshd)"),
              pytest.mark.skipif(not have_sshd(), reason="needs openssh-server and openssh-client"),
              pytest.mark.root]


@pytest.fixture(scope="module")
def lab(pyz):
    base = make_base()
    accounts = Accounts(base)
    lab = Lab(base, pyz, accounts.user())
    try:
        lab.a = lab.sshd("a", "127.0.0.2", gpus=2)
        lab.b = lab.sshd("b", "127.0.0.3", gpus=4)
        yield lab
    finally:
        lab.stop()
        accounts.cleanup()
        subprocess.run(["rm", "-rf", str(base)], check=False)


def catalog(lab, name: str, **nodes) -> object:
    return write_catalog(lab.base / f"{name}.json", nodes)


def mine(lab, node: str, cat) -> list[dict]:
    code, env = lab.bk_json(cat, f"@{node}", "l")
    assert code == 0, env
    return env["data"]["reservations"]


def cancel_all(lab, cat, node: str) -> None:
    for r in mine(lab, node, cat):
        code, env = lab.bk_json(cat, "c", "d", f"{node}/{r['short_id']}", "-y")
        assert code == 0, env


def test_probe_prints_the_add_command_that_works(lab):
    empty = catalog(lab, "empty")
    p = lab.bk(empty, "c", "probe", "gpu-a", "127.0.0.2", "--port", str(lab.a.port),
               "--known-hosts", str(lab.known_hosts))
    assert p.returncode == 0, p.stderr
    cmd = p.stdout.strip().splitlines()[-1].strip()
    words = shlex.split(cmd)
    assert words[:6] == ["sudo", "bk", "admin", "cluster", "add", "gpu-a"]
    assert words[words.index("--id") + 1] == lab.a.node_id()
    # Run it as root (without sudo: we are root), on a fresh catalog.
    path = lab.base / "probed.json"
    env = {"PATH": "/usr/bin:/bin", "BK_CLUSTER_FILE": str(path), "HOME": "/root"}
    done = subprocess.run(["/usr/bin/python3", str(lab.pyz), *words[2:], "--json"], capture_output=True,
                          text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(path.read_text())
    assert doc["nodes"]["gpu-a"]["id"] == lab.a.node_id()
    assert os.stat(path).st_uid == 0 and os.stat(path).st_mode & 0o777 == 0o644
    code, env = lab.bk_json(path, "c", "check")
    assert code == 0 and env["data"]["ok"], env


def test_probe_refuses_an_unknown_host_key(lab):
    empty = catalog(lab, "empty2")
    unknown = lab.base / "no_known_hosts"
    unknown.write_text("")
    os.chmod(unknown, 0o644)
    code, env = lab.bk_json(empty, "c", "probe", "gpu-a", "127.0.0.2", "--port", str(lab.a.port),
                            "--known-hosts", str(unknown))
    assert code != 0 and env["error"]["details"]["state"] == "unreachable"
    assert "host key" in env["error"]["message"].lower() or "host key" in (env["error"]["hint"] or "")


def test_check_every_node(lab):
    cat = catalog(lab, "two", a=lab.a.entry(), b=lab.b.entry(priority=1))
    code, env = lab.bk_json(cat, "c", "check")
    assert code == 0, env
    rows = {n["name"]: n for n in env["data"]["nodes"]}
    for name in ("a", "b"):
        checks = {c["name"]: c for c in rows[name]["checks"]}
        assert all(c["ok"] for c in checks.values()), checks
        assert set(checks) >= {"reachable", "identity", "clock", "version", "capabilities", "worker"}
    assert rows["a"]["id"] != rows["b"]["id"]


def test_rec_book_edit_cancel_and_at_node(lab):
    cat = catalog(lab, "two-b", a=lab.a.entry(), b=lab.b.entry(priority=1))
    code, env = lab.bk_json(cat, "c", "rec", "2", "1h")
    assert code == 0, env
    assert env["data"]["best"]["node"] == "a"          # both free now: priority decides
    # Exclusive on a (its 2 GPUs): now the earliest start is on b.
    code, first = lab.bk_json(cat, "c", "x", "2", "1h")
    assert code == 0 and first["data"]["node"] == "a" and first["data"]["status"] == "created", first
    code, second = lab.bk_json(cat, "c", "x", "2", "1h")
    assert code == 0 and second["data"]["node"] == "b", second
    a_ids = [r["id"] for r in mine(lab, "a", cat)]
    assert a_ids == [first["data"]["reservation"]["id"]]
    assert [r["id"] for r in mine(lab, "b", cat)] == [second["data"]["reservation"]["id"]]
    # Edit and cancel by NODE/ID.
    ref = "b/" + second["data"]["reservation"]["short_id"]
    code, env = lab.bk_json(cat, "c", "e", ref, "-d", "+30m")
    assert code == 0 and env["data"]["status"] == "updated", env
    assert env["data"]["reservation"]["end"] > second["data"]["reservation"]["end"]
    code, env = lab.bk_json(cat, "c", "d", ref)
    assert code == 0 and env["data"]["status"] == "cancelled", env
    assert mine(lab, "b", cat) == []
    # @NODE: any command, human text as the node prints it.
    p = lab.bk(cat, "@a", "l")
    assert p.returncode == 0 and first["data"]["reservation"]["short_id"] in p.stdout, p.stdout + p.stderr
    # bk c: every node's bookings.
    code, env = lab.bk_json(cat, "c")
    assert code == 0 and [x["node"] for x in env["data"]["reservations"]] == ["a"]
    cancel_all(lab, cat, "a")


def test_book_with_a_command_and_dry_run(lab):
    cat = catalog(lab, "two-c", a=lab.a.entry(), b=lab.b.entry(priority=1))
    code, env = lab.bk_json(cat, "c", "1", "30m", "--dry-run")
    assert code == 0 and env["data"]["dry_run"] and env["data"]["node"] == "a"
    assert mine(lab, "a", cat) == []
    code, env = lab.bk_json(cat, "c", "1", "30m", "--note", "a; rm -rf / #")
    assert code == 0, env
    assert env["data"]["reservation"]["note"] == "a; rm -rf / #"      # one word on the node's shell
    code, env = lab.bk_json(cat, "c", "1", "30m", "-t", "+2h", "--", "echo", "hi there; exit 3")
    assert code == 0 and env["data"]["recovered"] is False, env
    code, jobs = lab.bk_json(cat, "@a", "j")
    assert [j["summary"] for j in jobs["data"]["jobs"]] == ["echo +1 arg"], jobs
    code, chk = lab.bk_json(cat, "c", "check", "--jobs")
    rows = {n["name"]: n for n in chk["data"]["nodes"]}
    assert [j["summary"] for j in rows["a"]["jobs"]] == ["echo +1 arg"] and rows["b"]["jobs"] == []
    cancel_all(lab, cat, "a")


def test_a_node_down_is_reported_and_the_others_go_on(lab):
    dead_port = free_port("127.0.0.4")
    cat = catalog(lab, "down", a=lab.a.entry(),
                  down={"id": "d-" + "0" * 24, "target": "127.0.0.4", "port": dead_port,
                        "known_hosts": str(lab.known_hosts), "timeout_s": 5})
    code, env = lab.bk_json(cat, "c", "check")
    assert code == 1, env
    rows = {n["name"]: n for n in env["data"]["nodes"]}
    assert rows["a"]["ok"] and not rows["down"]["ok"] and rows["down"]["state"] == "unreachable"
    reach = next(c for c in rows["down"]["checks"] if c["name"] == "reachable")
    assert reach["detail"].startswith("ssh: connect to host 127.0.0.4") and "ssh: ssh:" not in reach["detail"]
    code, env = lab.bk_json(cat, "c", "1", "30m")
    assert code == 0 and env["data"]["node"] == "a", env
    cancel_all(lab, cat, "a")


def test_a_node_with_a_wrong_identity_never_gets_the_write(lab):
    # The catalog says b's address is node "a2" with a's id: the node refuses.
    cat = catalog(lab, "wrong", a2=lab.b.entry(id=lab.a.node_id()))
    code, env = lab.bk_json(cat, "c", "1", "30m")
    assert code != 0 and "wrong_identity" in json.dumps(env["error"]), env
    good = catalog(lab, "good", a=lab.a.entry(), b=lab.b.entry())
    assert mine(lab, "b", good) == [] and mine(lab, "a", good) == []


def test_bad_replies_are_per_node(lab):
    bin_ = str(lab.bin)
    cat = catalog(lab, "bad", a=lab.a.entry(),
                  garbage=lab.b.entry(id="d-" + "1" * 24, remote_command=[f"{bin_}/bk-garbage"]),
                  huge=lab.b.entry(id="d-" + "2" * 24, remote_command=[f"{bin_}/bk-huge"]),
                  hang=lab.b.entry(id="d-" + "3" * 24, remote_command=[f"{bin_}/bk-hang"], timeout_s=3),
                  liar=lab.b.entry(id="d-" + "4" * 24, remote_command=[f"{bin_}/bk-liar"]))
    code, env = lab.bk_json(cat, "c", "rec", "1", "30m")
    assert code == 1, env
    rows = {n["name"]: n for n in env["data"]["nodes"]}
    assert rows["a"]["state"] == "ok" and rows["a"]["options"]
    assert rows["garbage"]["state"] == "bad_reply"
    assert rows["huge"]["state"] == "too_large"
    assert rows["hang"]["state"] == "timeout"
    assert rows["liar"]["state"] == "wrong_identity"
    assert env["data"]["best"]["node"] == "a"
    # And a booking goes to the one good node.
    code, env = lab.bk_json(cat, "c", "1", "30m")
    assert code == 0 and env["data"]["node"] == "a", env
    cancel_all(lab, catalog(lab, "only-a", a=lab.a.entry()), "a")


def test_a_reply_lost_after_the_commit_books_once(lab):
    marker = lab.scratch / "lose-marker"
    marker.write_text("")
    os.chown(marker, lab.user.uid, lab.user.gid)
    cat = catalog(lab, "lose", lossy=lab.b.entry(remote_command=[f"{lab.bin}/bk-lose"]))
    code, env = lab.bk_json(cat, "c", "x", "1", "30m")
    assert code == 0, env
    assert not marker.exists(), "the write did not go through the lossy node"
    lost = json.loads((lab.scratch / "lost-reply.json").read_text())     # what the node did say
    assert lost["ok"] and lost["data"]["reply"]["data"]["status"] == "created"
    assert env["data"]["recovered"] is True and env["data"]["status"] == "exists"
    made = lost["data"]["reply"]["data"]["reservation"]["id"]
    assert env["data"]["reservation"]["id"] == made
    good = catalog(lab, "good-b", b=lab.b.entry())
    assert [r["id"] for r in mine(lab, "b", good)] == [made]         # one booking, not two
    # The op-id lookup the client used is a command of its own.
    code, op = lab.bk_json(good, "@b", "c", "op", env["data"]["op_id"])
    assert code == 0 and op["data"]["found"] and op["data"]["reservation"]["id"] == made
    cancel_all(lab, good, "b")


def test_cluster_create_books_once_over_sshd(lab):
    """The agent's cluster_create (bk agent, as bk mcp runs it) books on the
    best node with the rows bk c sends, and books once per operation_id."""
    cat = catalog(lab, "agent", a=lab.a.entry(priority=1), b=lab.b.entry())
    args = json.dumps({"count": 1, "duration": "30m", "note": "agent; run", "operation_id": "agent-7"})
    code, env = lab.bk_json(cat, "agent", "operation", "cluster_create", args)
    assert code == 0 and env["data"]["node"] == "b" and env["data"]["status"] == "created", env
    made = env["data"]["reservation"]
    assert made["note"] == "agent; run" and made["op_id"] == "agent-7"
    assert env["data"]["recommendation"]["best"]["node"] == "b"
    code, again = lab.bk_json(cat, "agent", "operation", "cluster_create", args)
    assert code == 0 and again["data"]["status"] == "exists" and again["data"]["reservation"]["id"] == made["id"]
    assert [r["id"] for r in mine(lab, "b", cat)] == [made["id"]] and mine(lab, "a", cat) == []
    cancel_all(lab, cat, "b")


def test_at_node_json_is_the_nodes_envelope(lab):
    cat = catalog(lab, "two-d", a=lab.a.entry(), b=lab.b.entry())
    code, env = lab.bk_json(cat, "@b", "info")
    assert code == 0 and env["command"] == "info" and env["data"]["gpu_count"] == 4
    code, env = lab.bk_json(cat, "@b", "e", "9999", "-d", "+1h")
    assert code == 4 and env["error"]["code"] == "not_found"
    # A write through @NODE gets an op-id too; -q prints only the ID, as on the node.
    p = lab.bk(cat, "@b", "1", "30m", "-q")
    assert p.returncode == 0, p.stderr
    (made,) = mine(lab, "b", cat)
    assert p.stdout.strip() == made["short_id"] and made["op_id"].startswith("c-")
    cancel_all(lab, cat, "b")


def test_an_sshd_whose_port_was_taken_meanwhile_takes_another(lab, monkeypatch):
    # free_port's answer is only a guess on a shared machine: here another
    # program binds it before sshd does.
    import socket

    import tests.helpers_sshd as hs

    squatter = socket.create_server(("127.0.0.5", 0))
    taken = squatter.getsockname()[1]
    answers = iter([taken])
    real = hs.free_port
    monkeypatch.setattr(hs, "free_port", lambda addr: next(answers, None) or real(addr))
    try:
        c = lab.sshd("c", "127.0.0.5", gpus=1)
    finally:
        squatter.close()
    try:
        assert c.port != taken and c.proc.poll() is None
        assert f"[127.0.0.5]:{c.port} " in lab.known_hosts.read_text()
    finally:
        lab.sshds.remove(c)
        c.stop()
