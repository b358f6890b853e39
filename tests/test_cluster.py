"""The cluster without sshd: the catalog's validation and trust check, the
ssh runner's bounds (real child processes), one node's reply decoding and
identity check (a fake runner standing in for ssh), the best-node rule,
the lost-reply protocol, the node half of ``bk c`` in-process, and
``sudo bk admin cluster``.  tests/test_cluster_sshd.py does it for real."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest

from bk.cli import app as cli_app
from bk.cluster import catalog as cat
from bk.cluster.client import Cluster, RecRow, best_row
from bk.cluster.node import NodeClient, NodeFailure
from bk.core.errors import ConfigError, Unavailable
from bk.remote import ssh

ROOT = Path(__file__).resolve().parent.parent
NODE_A = "d-" + "a" * 24
NODE_B = "d-" + "b" * 24


# ------------------------------------------------------------- catalog

def node_doc(**over) -> dict:
    return {"id": NODE_A, "target": "gpu-a.lab", **over}


def test_a_target_with_a_user_is_refused():
    with pytest.raises(ConfigError, match="names a user") as e:
        cat.parse({"nodes": {"gpu-a": node_doc(target="alice@gpu-a.lab")}}, "c.json")
    assert "'gpu-a.lab'" in e.value.hint


@pytest.mark.parametrize("target", ["-oProxyCommand=sh", "a b", "host;rm", "", "gpu-a.lab:22"])
def test_targets_that_are_not_hosts_are_refused(target):
    with pytest.raises(ConfigError, match="not a host"):
        cat.parse({"nodes": {"gpu-a": node_doc(target=target)}}, "c.json")


def test_unknown_keys_are_refused_with_did_you_mean():
    with pytest.raises(ConfigError, match="unknown key 'priorty'") as e:
        cat.parse({"nodes": {"gpu-a": node_doc(priorty=1)}}, "c.json")
    assert "did you mean 'priority'" in e.value.hint
    with pytest.raises(ConfigError, match="unknown key 'node'") as e:
        cat.parse({"node": {}}, "c.json")
    assert "did you mean 'nodes'" in e.value.hint


def test_ids_names_and_people_are_checked():
    with pytest.raises(ConfigError, match="not a node id"):
        cat.parse({"nodes": {"gpu-a": node_doc(id="gpu-a")}}, "c.json")
    with pytest.raises(ConfigError, match="same id"):
        cat.parse({"nodes": {"a": node_doc(), "b": node_doc(target="b")}}, "c.json")
    with pytest.raises(ConfigError, match="node name"):
        cat.parse({"nodes": {"GPU A": node_doc()}}, "c.json")
    with pytest.raises(ConfigError, match="not in nodes"):
        cat.parse({"nodes": {"a": node_doc()}, "people": {"b": {"1001": "alice"}}}, "c.json")
    c = cat.parse({"nodes": {"a": node_doc(port=2222, remote_command="/opt/gpubk/bin/bk")},
                   "people": {"a": {"1001": "alice"}}}, "c.json")
    assert c.get("a").remote_command == ("/opt/gpubk/bin/bk",) and c.person("a", 1001) == "alice"
    assert cat.parse(json.loads(json.dumps(c.to_json())), "again") == c.__class__(c.nodes, c.people, "again")


def _write(path, doc) -> str:
    path.write_text(json.dumps(doc))
    os.chmod(path, 0o644)
    return str(path)


def test_a_catalog_not_owned_by_root_is_refused(tmp_path):
    path = _write(tmp_path / "cluster.json", {"nodes": {"a": node_doc()}})
    if os.geteuid() == 0:
        os.chown(path, 1, 1)
    with pytest.raises(ConfigError, match="not root"):
        cat.load({"BK_CLUSTER_FILE": path})


@pytest.mark.skipif(os.geteuid() != 0, reason="root owns the file it checks")
def test_a_writable_catalog_is_refused_and_a_good_one_loads(tmp_path):
    os.chmod(tmp_path, 0o755)
    path = _write(tmp_path / "cluster.json", {"nodes": {"a": node_doc()}})
    assert cat.load({"BK_CLUSTER_FILE": path}).get("a").id == NODE_A
    os.chmod(path, 0o666)
    with pytest.raises(ConfigError, match="writable by group or others"):
        cat.load({"BK_CLUSTER_FILE": path})


def test_a_missing_catalog_says_how_to_make_one(tmp_path):
    with pytest.raises(ConfigError, match="no cluster catalog") as e:
        cat.load({"BK_CLUSTER_FILE": str(tmp_path / "none.json")})
    assert "bk c probe" in e.value.hint


# ------------------------------------------------------------- the runner

def test_ssh_argv_quotes_every_word_and_sets_the_safety_options():
    argv = ssh.ssh_argv("gpu-a", ["bk", "book", "1", "30m", "--note", "a; rm -rf / #"], port=2222,
                        connect_timeout=7, known_hosts="/etc/gpubk/known_hosts")
    assert argv[:2] == ["ssh", "-T"]
    for opt in ("BatchMode=yes", "StrictHostKeyChecking=yes", "ConnectTimeout=7",
                "UserKnownHostsFile=/etc/gpubk/known_hosts"):
        assert opt in argv
    assert argv[argv.index("--") + 1] == "gpu-a"
    assert argv[-1] == "bk book 1 30m --note 'a; rm -rf / #'"


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_the_runner_returns_output_and_status():
    out = ssh.run(py("import sys; print('hi'); sys.stderr.write('oops'); sys.exit(3)"), timeout=30)
    assert (out.ended, out.rc, out.stdout, out.stderr_text) == ("exit", 3, b"hi\n", "oops")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
def test_the_runner_kills_at_the_deadline(tmp_path):
    pidfile = tmp_path / "pid"
    code = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    out = ssh.run(py(code), timeout=1.0)
    assert out.ended == "timeout" and out.rc is None
    assert _gone(int(pidfile.read_text()))


def test_the_runner_bounds_the_reply():
    out = ssh.run(py("import sys\nwhile True: sys.stdout.write('x' * 65536)"), timeout=30, max_bytes=100_000)
    assert out.ended == "too_large" and len(out.stdout) == 100_000


def test_the_runner_can_be_cancelled():
    flag = threading.Event()
    threading.Timer(0.2, flag.set).start()
    out = ssh.run(py("import time; time.sleep(60)"), timeout=30, cancelled=flag.is_set)
    assert out.ended == "cancelled"


def test_a_missing_program_is_not_started():
    out = ssh.run(["/nonexistent/ssh"], timeout=5)
    assert out.ended == "not_started" and "cannot run" in out.stderr_text


# ------------------------------------------------------------- one node

def entry(name="a", nid=NODE_A, **over) -> cat.NodeEntry:
    return cat.parse_node(name, {"id": nid, "target": f"{name}.lab", "timeout_s": 5, **over}, "test")


def wrapped(nid: str, inner: dict, now: float = 1_000_000.0) -> bytes:
    return json.dumps({"schema": "gpubk.v1", "command": "cluster node", "ok": True, "warnings": [],
                       "data": {"node": {"id": nid, "hostname": "h", "version": "0.1.0", "now_epoch": now,
                                         "capabilities": ["node.v1"]}, "reply": inner}}).encode()


def ok(command: str, data: dict) -> dict:
    return {"schema": "gpubk.v1", "command": command, "ok": True, "data": data, "warnings": []}


class FakeSsh:
    """Answers each call with the next scripted Outcome; records the argv."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls: list[list[str]] = []

    def __call__(self, argv, *, timeout, cancelled=None, env=None):
        self.calls.append(list(argv))
        a = self.answers.pop(0)
        return a(argv) if callable(a) else a


def reply(stdout: bytes, rc: int = 0, stderr: bytes = b"", ended: str = "exit") -> ssh.Outcome:
    return ssh.Outcome(ended, rc if ended == "exit" else None, stdout, stderr, 0.01)


def client(fake, e=None) -> NodeClient:
    return NodeClient(e or entry(), runner=fake, wall=lambda: 1_000_000.0)


def test_a_good_reply_carries_identity_and_skew():
    fake = FakeSsh(reply(wrapped(NODE_A, ok("list", {"reservations": []}), now=1_000_002.5)))
    r = client(fake).call(["l"])
    assert r.ok and r.skew_s == 2.5 and r.node["id"] == NODE_A
    remote = fake.calls[0][-1]
    assert remote.startswith(f"bk c node --expect {NODE_A} --json -- l")


@pytest.mark.parametrize("answer, state", [
    (reply(b"Welcome to gpu-z!\n"), "bad_reply"),
    (reply(wrapped(NODE_B, ok("list", {}))), "wrong_identity"),
    (reply(b"", rc=255, stderr=b"Host key verification failed.\n"), "unreachable"),
    (reply(b"", rc=127, stderr=b"sh: 1: bk: not found\n"), "unsupported"),
    (reply(b"", ended="timeout"), "timeout"),
    (reply(b"x" * 10, ended="too_large"), "too_large"),
    (reply(json.dumps({"schema": "gpubk.v1", "command": "c", "ok": False, "warnings": [],
                       "error": {"code": "invalid_input", "message": "unknown command 'c'"}}).encode(), rc=2),
     "unsupported"),
    (reply(json.dumps({"schema": "gpubk.v1", "command": "cluster node", "ok": False, "warnings": [],
                       "error": {"code": "config", "message": "this is node d-...",
                                 "details": {"reason": "wrong_identity"}}}).encode(), rc=78),
     "wrong_identity"),
])
def test_bad_replies_are_named(answer, state):
    with pytest.raises(NodeFailure) as e:
        client(FakeSsh(answer)).call(["l"])
    assert e.value.state == state
    if state == "unreachable":
        assert "host key" in e.value.hint


def test_ssh_s_own_message_is_not_prefixed_twice():
    fake = FakeSsh(reply(b"", rc=255, stderr=b"ssh: connect to host a.lab port 22: Connection refused\r\n"))
    with pytest.raises(NodeFailure) as e:
        client(fake).call(["l"])
    assert e.value.message == "ssh: connect to host a.lab port 22: Connection refused"


def test_the_best_node_is_the_earliest_start_then_priority_then_name():
    def row(name, pri, start):
        opts = ({"start": start, "gpus": [0]},) if start else ()
        return RecRow(name, pri, opts, None if opts else "no option fits", {})

    rows = [row("c", 0, "2026-07-13T11:00:00Z"), row("b", 5, "2026-07-13T10:00:00Z"),
            row("a", 9, "2026-07-13T10:00:00Z"), row("d", -1, None)]
    assert best_row(rows).node == "b"
    rows.append(row("e", 5, "2026-07-13T10:00:00Z"))
    assert best_row(rows).node == "b"          # same start and priority: the name
    assert best_row([row("d", 0, None)]) is None


# ------------------------------------------------------------- lost replies

def res_json(rid="r-1", uid=1001, **over) -> dict:
    """A reservation as a node's JSON has it (bk.service.views)."""
    return {"id": rid, "short_id": rid[:8], "number": None, "uid": uid, "user": f"u{uid}", "mine": True,
            "mode": "shared", "gpus": [0], "share": 1, "capacity": 2, "mem_mib": None, "mem_mib_effective": None,
            "start": "2026-07-13T10:00:00Z", "end": "2026-07-13T10:30:00Z", "status": "upcoming",
            "created": "2026-07-13T09:00:00Z", "op_id": "K", "job": None, "note": None, "cancelled_at": None,
            "cancel_reason": None, "edits": 0, **over}


def booked(nid=NODE_A, status="created", rid="r-1"):
    return reply(wrapped(nid, ok("book", {"status": status, "reservation": res_json(rid)})))


def op_found(action="create", rid="r-1", found=True):
    return reply(wrapped(NODE_A, ok("cluster op", {"op_id": "K", "found": found, "action": action if found else None,
                                                   "reservation": res_json(rid) if found else None})))


def cluster_with(fake) -> Cluster:
    c = cat.Catalog((entry(),), {}, "test")
    return Cluster(c, make_client=lambda e, cancelled=None: NodeClient(e, runner=fake, wall=lambda: 1e6))


def who(nid=NODE_A, version="0.1.0"):
    """The node's answer to "who are you" (no row), asked before a first write."""
    return reply(wrapped(nid, None).replace(b'"0.1.0"', json.dumps(version).encode()))


def sent_row(argv: list[str]) -> tuple[str, dict]:
    """The row and fields a fake ssh was asked for (its last word is the remote command line)."""
    import shlex

    words = shlex.split(argv[-1])
    return words[words.index("--row") + 1], json.loads(words[words.index("--fields") + 1])


def edited(status="updated", rid="r-1"):
    return reply(wrapped(NODE_A, ok("edit", {"status": status, "reservation": res_json(rid)})))


def test_a_lost_reply_is_looked_up_before_anything_is_retried():
    fake = FakeSsh(who(), reply(b"", ended="timeout"), op_found())
    out = cluster_with(fake).write("a", "book", {"count": 1, "duration": "30m"}, "K")
    assert out.recovered and out.reply_data["reservation"]["id"] == "r-1"
    assert len(fake.calls) == 3 and "--row op_lookup --fields '{\"op_id\":\"K\"}'" in fake.calls[2][-1]
    assert sent_row(fake.calls[1]) == ("book", {"count": 1, "duration": "30m", "op_id": "K"})


def test_a_write_that_did_not_happen_is_sent_again_with_the_same_op_id():
    fake = FakeSsh(who(), reply(b"", rc=255, stderr=b"Connection reset by peer"), op_found(found=False), booked())
    fields = {"count": 1, "duration": "30m", "command": ["./train.sh", "--op-id", "x"]}
    out = cluster_with(fake).write("a", "book_job", fields, "K")
    assert out.retried and not out.recovered
    assert fake.calls[1][-1] == fake.calls[3][-1]
    assert sent_row(fake.calls[1]) == ("book_job", {**fields, "op_id": "K"})      # the command's own words kept


@pytest.mark.parametrize("row, fields, action", [
    ("edit", {"ref": "3f2a", "duration": "+30m"}, "edit"),
    ("cancel", {"ref": "1"}, "cancel"),
])
def test_an_edit_or_a_cancel_whose_reply_was_lost_is_recovered_or_sent_again(row, fields, action):
    """The lost-reply protocol of a write row, for edit and cancel: the
    op-id's lookup finds what the node did, and only a write the node did
    not make is sent again, with the same op-id and the ID as typed (the
    node resolves it again: a committed op-id names its booking)."""
    fake = FakeSsh(who(), reply(b"", ended="timeout"), op_found(action=action))
    out = cluster_with(fake).write("a", row, fields, "K")
    assert out.recovered and out.reply_data == {"status": "exists", "reservation": res_json(), "recovered": True}
    assert sent_row(fake.calls[1]) == (row, {**fields, "op_id": "K"})
    assert sent_row(fake.calls[2]) == ("op_lookup", {"op_id": "K"})
    # The op-id did something else there (it booked): not this write, which is sent again.
    fake = FakeSsh(who(), reply(b"", rc=255, stderr=b"Broken pipe"), op_found(action="create"), edited())
    out = cluster_with(fake).write("a", row, fields, "K")
    assert out.retried and not out.recovered and out.reply_data["status"] == "updated"
    assert [sent_row(c)[0] for c in fake.calls[1:]] == [row, "op_lookup", row]
    assert fake.calls[1][-1] == fake.calls[3][-1]


def test_when_the_node_cannot_say_the_outcome_is_unknown_with_the_op_id():
    fake = FakeSsh(who(), reply(b"", ended="timeout"), reply(b"", ended="timeout"))
    with pytest.raises(Unavailable) as e:
        cluster_with(fake).write("a", "cancel", {"ref": "3f2a"}, "K")
    assert e.value.details["state"] == "outcome_unknown" and "--op-id K" in e.value.hint


def test_a_wrong_identity_is_never_retried():
    fake = FakeSsh(reply(wrapped(NODE_B, ok("book", {}))))
    with pytest.raises(ConfigError):
        cluster_with(fake).write("a", "book", {"count": 1, "duration": "30m"}, "K")
    assert len(fake.calls) == 1


@pytest.mark.parametrize("row", ["book", "book_job", "edit", "cancel"])
def test_a_write_row_an_older_node_cannot_serve_is_refused_by_name_before_it_is_sent(row, monkeypatch):
    """The node says who it is first (no row); a release older than the
    row's is refused here, naming the row, and nothing else is sent."""
    from bk import service

    fake = FakeSsh(who(version="0.0.9"))
    with pytest.raises(Unavailable) as e:
        cluster_with(fake).write("a", row, {"ref": "1"}, "K")
    since = service.get(row).since
    assert e.value.message == (f"a: its bk 0.0.9 cannot serve the {row} row (bk {since} or later); "
                               "nothing was sent")
    assert e.value.details["state"] == "unsupported" and len(fake.calls) == 1
    assert "--row" not in fake.calls[0][-1]
    # A row newer than a node of today's release is refused the same way.
    from bk.core.record import replace

    monkeypatch.setitem(service.OPERATIONS, row, replace(service.get(row), since="9.0"))
    fake = FakeSsh(who())
    with pytest.raises(Unavailable, match=f"its bk 0.1.0 cannot serve the {row} row \\(bk 9.0 or later\\)"):
        cluster_with(fake).write("a", row, {"ref": "1"}, "K")
    assert len(fake.calls) == 1


def test_a_booking_with_a_command_is_the_book_job_row_and_without_one_the_book_row():
    """``bk c N DUR -- CMD`` sends the booking's fields and the command as
    one row; the best node gets it, nothing else is written."""
    opts = ok("recommend", {"options": [{"gpus": [0], "start": "2026-07-13T10:00:00Z",
                                          "end": "2026-07-13T10:30:00Z"}]})
    for command, row in ((["python3", "train.py", "--lr", "3e-4"], "book_job"), (None, "book")):
        fake = FakeSsh(reply(wrapped(NODE_A, opts)), booked())
        done = cluster_with(fake).book({"count": 1, "duration": "30m", "limit": 1},
                                       lambda o: {"count": 1, "duration": "30m", "start": o["start"]},
                                       command=command, op_id=None)
        assert done.result["status"] == "created" and done.op_id.startswith("c-")
        name, fields = sent_row(fake.calls[1])
        want = {"count": 1, "duration": "30m", "start": "2026-07-13T10:00:00Z", "op_id": done.op_id}
        assert name == row and fields == ({**want, "command": command} if command else want)


# ------------------------------------------------------------- the CLI

def test_at_node_and_cluster_shorthand_words():
    assert cli_app.normalise(["@gpu-a", "l", "--all"]) == ["c", "at", "gpu-a", "--", "l", "--all"]
    assert cli_app.normalise(["c", "2", "1h"]) == ["c", "book", "2", "1h"]
    assert cli_app.normalise(cli_app.normalise(["@gpu-a", "1", "30m"])) == ["c", "at", "gpu-a", "--", "1", "30m"]


def run_bk(capsys, *argv, env):
    capsys.readouterr()
    code = cli_app.run(list(argv), env)
    out = capsys.readouterr().out
    return code, json.loads(out)


@pytest.fixture
def node_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update({"BK_DATA_DIR": str(tmp_path / "data"), "BK_GPU_COUNT": "2", "HOME": str(tmp_path)})
    return env


def test_the_node_half_checks_its_identity_first(capsys, node_env):
    code, ident = run_bk(capsys, "c", "id", "--json", env=node_env)
    assert code == 0 and ident["data"]["id"].startswith("d-") and "node.v1" in ident["data"]["capabilities"]
    nid = ident["data"]["id"]
    code, env = run_bk(capsys, "c", "node", "--expect", NODE_B, "--json", "--", "1", "30m", env=node_env)
    assert code == 78 and env["error"]["details"]["reason"] == "wrong_identity"
    code, env = run_bk(capsys, "c", "node", "--expect", nid, "--json", "--", "1", "30m", "--op-id", "K",
                       env=node_env)
    assert code == 0 and env["data"]["node"]["id"] == nid
    assert env["data"]["reply"]["data"]["status"] == "created"
    code, env = run_bk(capsys, "c", "op", "K", "--json", env=node_env)
    assert env["data"]["found"] and env["data"]["action"] == "create"
    code, env = run_bk(capsys, "c", "op", "nope", "--json", env=node_env)
    assert code == 0 and env["data"]["found"] is False


def node_row(capsys, env, row: str, fields: dict) -> dict:
    """``bk c node --row ROW --fields JSON`` in-process: the row's envelope."""
    code, out = run_bk(capsys, "c", "node", "--json", "--row", row, "--fields", json.dumps(fields), env=env)
    assert code == 0, out
    return out["data"]["reply"]


def test_the_node_resolves_an_edit_or_a_cancel_as_its_own_bk_e_and_bk_d_would(capsys, node_env):
    """The ID as the person typed it (a list number, a prefix) and ``-d
    +30m`` are read on the node against its booking; the reply is what ``bk
    e``/``bk d --json`` print there, and a repeat of the op-id answers
    ``exists`` for the same booking though "1" now names another one."""
    code, first = run_bk(capsys, "1", "1h", "-t", "+2h", "--json", env=node_env)
    code, second = run_bk(capsys, "1", "1h", "-t", "+4h", "--json", env=node_env)
    one, two = first["data"]["reservation"], second["data"]["reservation"]
    edit = node_row(capsys, node_env, "edit", {"ref": "1", "duration": "+30m", "op_id": "E1"})
    assert edit["ok"] and edit["command"] == "edit" and edit["data"]["status"] == "updated", edit
    assert edit["data"]["reservation"]["id"] == one["id"] and edit["data"]["before"]["end"] == one["end"]
    code, own = run_bk(capsys, "e", "1", "-d", "+30m", "--op-id", "E1", "--json", env=node_env)
    assert own["data"] == {**edit["data"], "status": "exists", "before": own["data"]["before"]}
    cancel = node_row(capsys, node_env, "cancel", {"ref": one["short_id"][:6], "op_id": "D1"})
    assert cancel["ok"] and cancel["data"]["status"] == "cancelled" and cancel["data"]["reservation"]["id"] == one["id"]
    # "1" is the other booking by now; the op-id still names the first.
    again = node_row(capsys, node_env, "cancel", {"ref": "1", "op_id": "D1"})
    assert again["data"]["status"] == "exists" and again["data"]["reservation"]["id"] == one["id"]
    code, listed = run_bk(capsys, "l", "--json", env=node_env)
    assert [r["id"] for r in listed["data"]["reservations"]] == [two["id"]]
    # A prefix nobody has, and a change no node can read, are the node's refusals.
    gone = node_row(capsys, node_env, "edit", {"ref": "ffff", "duration": "+30m"})
    assert not gone["ok"] and gone["error"]["code"] == "not_found"
    bad = node_row(capsys, node_env, "edit", {"ref": "1", "duration": "soon"})
    assert not bad["ok"] and bad["error"]["code"] == "invalid_input"


def test_the_node_books_a_command_with_its_private_spec(capsys, node_env, tmp_path):
    """The book_job row: the booking's fields and the command; the node
    keeps the command in the caller's private spec (the ledger holds its
    digest and summary only) and says, as ``bk N DUR -- CMD`` does, that no
    worker runs to start it."""
    (tmp_path / "work").mkdir()
    argv = ["echo", "secret-token", "tab\there"]
    got = node_row(capsys, node_env, "book_job", {"count": 1, "duration": "30m", "start": "+2h",
                                                  "command": argv, "op_id": "J1"})
    assert got["ok"] and got["command"] == "book_job" and got["data"]["status"] == "created", got
    job = got["data"]["reservation"]["job"]
    assert job["summary"] == "echo +2 args" and job["status"] == "pending"
    assert any("no bk worker" in w for w in got["warnings"]), got["warnings"]
    ledger = (tmp_path / "data" / "ledger.json").read_text()
    assert "secret-token" not in ledger and job["digest"] in ledger
    (spec,) = (tmp_path / "data" / "state" / "jobs" / "specs").iterdir()
    assert json.loads(spec.read_text())["argv"] == argv and spec.stat().st_mode & 0o077 == 0
    again = node_row(capsys, node_env, "book_job", {"count": 1, "duration": "30m", "start": "+2h",
                                                    "command": argv, "op_id": "J1"})
    assert again["data"]["status"] == "exists" and len(list(spec.parent.iterdir())) == 1
    for fields, says in (({"count": 1, "duration": "30m"}, "takes a command"),
                         ({"count": 1, "duration": "30m", "command": []}, "field 'command' must be a list"),
                         ({"count": 1, "duration": "30m", "command": ["echo"], "job_digest": "0" * 64},
                          "field 'job_digest' is the node's own"),
                         ({"count": 1, "duration": "30m", "command": ["no-such-program-here"]}, "not found")):
        refused = node_row(capsys, node_env, "book_job", fields)
        assert not refused["ok"] and says in refused["error"]["message"], refused


@pytest.mark.parametrize("words", [["admin", "init"], ["w", "start"], ["broker"], ["c", "node", "--", "l"], ["m"]])
def test_the_node_half_runs_only_everyday_commands(capsys, node_env, words):
    code, env = run_bk(capsys, "c", "node", "--json", "--", *words, env=node_env)
    assert code == 2 and "does not run" in env["error"]["message"]


def test_the_stored_node_id_wins_over_the_derived_one(capsys, node_env, tmp_path):
    from bk.cluster import identity

    (tmp_path / "data").mkdir(mode=0o700)
    nid = identity.store_new(str(tmp_path / "data"), owner=None)
    assert nid.startswith("n-") and identity.store_new(str(tmp_path / "data"), owner=None) == nid
    code, env = run_bk(capsys, "c", "id", "--json", env=node_env)
    assert env["data"]["id"] == nid and env["data"]["id_source"] == "stored"


@pytest.mark.skipif(os.geteuid() != 0, reason="writes a root-owned catalog")
def test_admin_cluster_edits_the_catalog(capsys, node_env, tmp_path):
    os.chmod(tmp_path, 0o755)
    (tmp_path / "data").mkdir(mode=0o700)
    path = tmp_path / "etc" / "cluster.json"
    # A bk on PATH (the local node does not need one: it runs this bk).
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "bk").write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m bk \"$@\"\n")
    os.chmod(bindir / "bk", 0o755)
    env = {**node_env, "BK_CLUSTER_FILE": str(path), "PATH": f"{bindir}:{os.environ['PATH']}"}
    code, out = run_bk(capsys, "admin", "cluster", "init", "here", "--yes", "--json", env=env)
    assert code == 0, out
    assert out["data"]["catalog"]["nodes"]["here"]["target"] == "local"
    code, out = run_bk(capsys, "admin", "cluster", "add", "b", "gpu-b", "--id", NODE_B, "--port", "2222",
                       "--json", env=env)
    assert code == 0 and os.stat(path).st_mode & 0o777 == 0o644
    code, out = run_bk(capsys, "admin", "cluster", "add", "c", "bob@gpu-c", "--id", NODE_A, "--json", env=env)
    assert code == 78 and "names a user" in out["error"]["message"]
    code, out = run_bk(capsys, "admin", "cluster", "add", "b2", "gpu-b2", "--id", NODE_B, "--json", env=env)
    assert code == 2 and "already in the catalog" in out["error"]["message"]
    for argv in (("set", "b", "--priority", "3", "--timeout", "30"), ("disable", "b"), ("map", "b", "1001", "alice")):
        code, out = run_bk(capsys, "admin", "cluster", *argv, "--json", env=env)
        assert code == 0, out
    code, out = run_bk(capsys, "admin", "cluster", "set", "b", "--priority", "9", "--dry-run", "--json", env=env)
    assert out["data"]["dry_run"] and out["data"]["catalog"]["nodes"]["b"]["priority"] == 9
    doc = cat.load(env)
    b = doc.get("b")
    assert (b.priority, b.timeout_s, b.enabled, b.port, doc.person("b", 1001)) == (3, 30.0, False, 2222, "alice")
    # bk c: the disabled node is listed, not asked; the local one answers.
    code, out = run_bk(capsys, "c", "--json", env=env)
    assert code == 0, json.dumps(out["data"]["nodes"])
    states = {n["name"]: n["state"] for n in out["data"]["nodes"]}
    assert states == {"here": "ok", "b": "disabled"}
    for argv in (("unmap", "b", "1001"), ("remove", "b")):
        code, out = run_bk(capsys, "admin", "cluster", *argv, "--json", env=env)
        assert code == 0, out
    assert [n.name for n in cat.load(env).nodes] == ["here"]


def test_a_given_op_id_is_looked_for_on_every_node_before_booking():
    """A retry by a program (same op-id) must not book again on another
    node that has become the best one meanwhile."""
    fakes = {NODE_A: FakeSsh(op_found(found=False)),
             NODE_B: FakeSsh(reply(wrapped(NODE_B, ok("cluster op", {"op_id": "K", "found": True,
                                                                     "action": "create",
                                                                     "reservation": res_json("r-b")}))))}
    c = cat.Catalog((entry("a", NODE_A), entry("b", NODE_B)), {}, "test")
    cl = Cluster(c, make_client=lambda e, cancelled=None: NodeClient(e, runner=fakes[e.id], wall=lambda: 1e6))
    done = cl.book({"count": 1, "duration": "30m"}, lambda o: {"count": 1, "duration": "30m"}, op_id="K")
    assert (done.node, done.result["status"], done.result["reservation"]["id"]) == ("b", "exists", "r-b")
    assert all(not f.answers for f in fakes.values())       # one lookup each, no slots, no book


def test_a_given_op_id_books_nothing_while_a_node_cannot_say(monkeypatch):
    fakes = {NODE_A: FakeSsh(op_found(found=False)), NODE_B: FakeSsh(reply(b"", ended="timeout"))}
    c = cat.Catalog((entry("a", NODE_A), entry("b", NODE_B)), {}, "test")
    cl = Cluster(c, make_client=lambda e, cancelled=None: NodeClient(e, runner=fakes[e.id], wall=lambda: 1e6))
    with pytest.raises(Unavailable, match="cannot tell"):
        cl.book({"count": 1, "duration": "30m"}, lambda o: {"count": 1, "duration": "30m"}, op_id="K")


def test_the_cluster_tools_appear_only_with_a_catalog(monkeypatch, tmp_path):
    from bk import agent

    monkeypatch.setenv("BK_CLUSTER_FILE", str(tmp_path / "none.json"))
    assert not [t for t in agent.tools(None) if t.name.startswith("cluster_")]
    _write(tmp_path / "c.json", {"nodes": {}})
    monkeypatch.setenv("BK_CLUSTER_FILE", str(tmp_path / "c.json"))
    names = {t.name: t for t in agent.tools(None) if t.name.startswith("cluster_")}
    assert set(names) == {"cluster_context", "cluster_recommend", "cluster_create"}
    assert names["cluster_context"].read_only and not names["cluster_create"].read_only
    assert "operation_id" in names["cluster_create"].schema["required"]


def test_the_node_half_keeps_a_command_after_dash_dash_intact(capsys, node_env):
    code, env = run_bk(capsys, "c", "node", "--json", "--", "1", "30m", "-t", "+2h", "--", "echo", "hi",
                       env=node_env)
    assert code == 0 and env["data"]["reply"]["ok"], env
    code, jobs = run_bk(capsys, "j", "--json", env=node_env)
    assert [j["summary"] for j in jobs["data"]["jobs"]] == ["echo +1 arg"]


def test_at_node_and_bk_c_without_a_catalog_say_how_to_make_one(capsys, node_env, tmp_path):
    env = {**node_env, "BK_CLUSTER_FILE": str(tmp_path / "none.json")}
    for argv in (["@gpu-a", "1", "30m"], ["c"], ["c", "2", "1h"], ["c", "tui"]):
        code, out = run_bk(capsys, *argv, "--json", env=env)
        assert code == 78 and "no cluster catalog" in out["error"]["message"], out
        assert "bk c probe" in out["error"]["hint"]
    capsys.readouterr()
    assert cli_app.run(["help", "c"], env) == 0 and "bk c rec 2 1h" in capsys.readouterr().out


def test_bk_c_tui_without_a_terminal_view_prints_the_node_table(capsys, node_env, tmp_path):
    os.chmod(tmp_path, 0o755)
    code, ident = run_bk(capsys, "c", "id", "--json", env=node_env)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "bk").write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m bk \"$@\"\n")
    os.chmod(bindir / "bk", 0o755)
    path = _write(tmp_path / "c.json", {"nodes": {"here": {"id": ident["data"]["id"], "target": "local"}}})
    if os.geteuid() != 0:
        pytest.skip("the catalog must be root's")
    env = {**node_env, "BK_CLUSTER_FILE": path, "PATH": f"{bindir}:{os.environ['PATH']}"}
    code, out = run_bk(capsys, "c", "tui", "--json", env=env)
    assert code == 0 and out["command"] == "cluster" and out["data"]["nodes"][0]["state"] == "ok"
    assert any("full-screen" in w for w in out["warnings"])


def test_the_overview_names_people_and_keeps_going_past_a_failed_node():
    listing = ok("list", {"scope": "all", "reservations": [res_json("r-1")]})
    fakes = {NODE_A: FakeSsh(reply(wrapped(NODE_A, listing))), NODE_B: FakeSsh(reply(b"", ended="timeout"))}
    c = cat.Catalog((entry("a", NODE_A), entry("b", NODE_B)), {"a": {"1001": "alice"}}, "test")
    cl = Cluster(c, make_client=lambda e, cancelled=None: NodeClient(e, runner=fakes[e.id], wall=lambda: 1e6))
    ov = cl.overview().to_json()
    assert [(r["node"], r["person"]) for r in ov["reservations"]] == [("a", "alice")]
    assert [n["state"] for n in ov["nodes"]] == ["ok", "timeout"] and ov["complete"] is False


@pytest.mark.skipif(os.geteuid() != 0, reason="the catalog must be root's")
def test_the_local_node_is_this_bk_not_the_path_s_nor_the_working_directory_s(capsys, pyz, node_env, tmp_path,
                                                                              monkeypatch):
    """A ``local`` node with the default remote_command runs the bk that
    runs ``bk c`` (the archive, or this checkout), with no ``bk`` on PATH,
    and a ``bk/`` package in the working directory is never imported."""
    import subprocess

    os.chmod(tmp_path, 0o755)
    code, ident = run_bk(capsys, "c", "id", "--json", env=node_env)
    path = _write(tmp_path / "c.json", {"nodes": {"here": {"id": ident["data"]["id"], "target": "local"}}})
    planted = tmp_path / "cwd"
    (planted / "bk").mkdir(parents=True)
    marker = tmp_path / "planted-ran"
    (planted / "bk" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\nraise SystemExit(9)\n")
    (planted / "bk" / "__main__.py").write_text("")
    env = {**node_env, "BK_CLUSTER_FILE": path, "PATH": "/usr/bin:/bin"}
    # The built archive, run as python3 bk.pyz from the planted directory.
    p = subprocess.run([sys.executable, str(pyz), "c", "--json"], env=env, cwd=planted, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout)["data"]["nodes"][0]["state"] == "ok"
    # This checkout, in this process.
    monkeypatch.chdir(planted)
    code, out = run_bk(capsys, "c", "--json", env=env)
    assert code == 0 and out["data"]["nodes"][0]["state"] == "ok", out
    assert not marker.exists()


def test_a_node_with_no_option_reads_as_bk_slots_refuses_it():
    """The recommend row answers an empty list; the node's row says what
    ``bk slots`` said (a conflict naming the request, as the node read it)."""
    asked = {"count": 1, "duration": 1800, "mode": "shared", "share": 1, "mem_mib": None}
    fake = FakeSsh(reply(wrapped(NODE_A, ok("recommend", {"request": asked, "options": []}))))
    rec = cluster_with(fake).recommend({"count": 1, "duration": "30m", "limit": 1})
    (row,) = rec.rows
    assert rec.best is None and row.problem == "no option for 1 GPU, shared, 30m"
    assert row.info["state"] == "error" and row.info["error"]["code"] == "conflict"
    assert "--row recommend" in fake.calls[0][-1]
