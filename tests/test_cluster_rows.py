"""The cluster speaks rows (issue 24, item 4): a node answers ``bk c node
--row NAME --fields JSON`` with the row's wire JSON, a client refuses a row
newer than the node before anything is sent, and ``bk c`` and the agent's
``cluster_create`` build the booking with one function.

The nodes are ``local`` catalog nodes running the built bk.pyz as a real
child process (tests/helpers_cluster.py); the agent's booking over real sshd
is in test_cluster_sshd.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers_cluster import NOW, iso, real_node, write_catalog

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="the cluster catalog must be root's")]


@pytest.fixture
def base(tmp_path):
    os.chmod(tmp_path, 0o755)
    return tmp_path


def run(pyz, env, *argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(pyz), *argv], capture_output=True, text=True, env=env, timeout=120)


def node_env(base, data) -> dict:
    return {"PATH": "/usr/bin:/bin", "HOME": str(base), "LANG": "C.UTF-8", "BK_DATA_DIR": str(data),
            "BK_GPU_COUNT": "2"}


def client_env(base, catalog) -> dict:
    return {"PATH": "/usr/bin:/bin", "HOME": str(base), "LANG": "C.UTF-8", "TZ": "UTC", "COLUMNS": "200",
            "BK_CLUSTER_FILE": str(catalog), "BK_DATA_DIR": str(base / "client"), "BK_GPU_COUNT": "1"}


def test_a_node_answers_a_row_with_its_wire_json_and_refuses_others_by_name(base, pyz):
    entry, data = real_node(base, "a", pyz)
    env = node_env(base, data)
    assert run(pyz, env, "1", "1h", "-t", "+2h", "-q").returncode == 0
    node = run(pyz, env, "c", "node", "--expect", entry["id"], "--json", "--row", "list",
               "--fields", json.dumps({"scope": "all"}))
    assert node.returncode == 0, node.stderr
    reply = json.loads(node.stdout)["data"]["reply"]
    own = json.loads(run(pyz, env, "l", "--all", "--json").stdout)
    assert reply["ok"] and reply["command"] == "list" and reply["data"] == own["data"]
    # A person's words are read on the node's own grid (5-minute slices), as its CLI reads them.
    node = run(pyz, env, "c", "node", "--json", "--row", "recommend",
               "--fields", json.dumps({"count": 1, "duration": "31m", "limit": 1}))
    reply = json.loads(node.stdout)["data"]["reply"]
    assert not reply["ok"] and "5-minute" in reply["error"]["message"]
    for name in ("data_clear", "policy_write", "no_such_row"):
        node = run(pyz, env, "c", "node", "--json", "--row", name, "--fields", "{}")
        reply = json.loads(node.stdout)["data"]["reply"]
        assert not reply["ok"] and repr(name) in reply["error"]["message"], reply


def logged_node(base, name: str, pyz, version: str | None = None) -> tuple[dict, object, object]:
    """A real node whose bk logs each command line it gets (and, with
    ``version``, reports that release): its catalog entry, data directory
    and log."""
    entry, data = real_node(base, name, pyz)
    log = base / f"{name}-argv.log"
    prog = base / f"{name}-bk.py"
    prog.write_text("import sys\n"
                    f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                    f"sys.path.insert(0, {str(pyz)!r})\n"
                    "import bk\n" + (f"bk.__version__ = {version!r}\n" if version else "")
                    + "from bk.cli.main import main\nsys.exit(main())\n")
    entry["remote_command"] = [*entry["remote_command"][:-1], str(prog)]
    return entry, data, log


def test_an_older_node_is_refused_a_row_before_it_is_sent(base, pyz):
    """A node whose bk reports a release older than the rows: the client
    learns its version from its first reply and never sends the write."""
    entry, data, log = logged_node(base, "old", pyz, version="0.0.9")
    cat = write_catalog(base / "cluster.json", {"old": entry})
    env = client_env(base, cat)
    p = run(pyz, env, "c", "1", "30m", "--json")
    out = json.loads(p.stdout)
    assert p.returncode != 0 and not out["ok"], out
    msg = out["error"]["message"]
    assert "old: its bk 0.0.9 cannot serve the book row" in msg and "nothing was sent" in msg, msg
    sent = log.read_text()
    assert "--row recommend" in sent and "--row book" not in sent, sent
    assert json.loads(run(pyz, node_env(base, data), "l", "--json").stdout)["data"]["reservations"] == []
    # The reads it can serve still answer, and say which release it runs.
    p = run(pyz, env, "c", "check", "--json")
    assert json.loads(p.stdout)["data"]["nodes"][0]["version"] == "0.0.9"
    # Edit, cancel and a booking with a command are refused the same way, by name.
    assert run(pyz, node_env(base, data), "1", "1h", "-t", "+2h", "-q").returncode == 0
    for argv, row in ((("c", "e", "old/1", "-d", "+30m"), "edit"), (("c", "d", "old/1"), "cancel"),
                      (("c", "1", "30m", "--json", "--", "echo", "hi"), "book_job")):
        log.write_text("")
        p = run(pyz, env, *argv, *(() if "--json" in argv else ("--json",)))
        out = json.loads(p.stdout)
        assert p.returncode == 69 and out["error"]["details"]["state"] == "unsupported", out
        assert f"old: its bk 0.0.9 cannot serve the {row} row (bk 0.1.0 or later); nothing was sent" \
            == out["error"]["message"]
        assert f"--row {row} " not in log.read_text() and " -- " not in log.read_text(), log.read_text()
    (kept,) = json.loads(run(pyz, node_env(base, data), "l", "--json").stdout)["data"]["reservations"]
    assert kept["status"] == "upcoming" and kept["edits"] == 0


def test_edit_cancel_and_a_booking_with_a_command_go_as_rows(base, pyz):
    """``bk c N DUR -- CMD``, ``bk c e NODE/ID`` and ``bk c d NODE/ID`` send
    rows (book_job, edit, cancel), never words; their JSON and lines are
    what they were."""
    entry, data, log = logged_node(base, "a", pyz)
    cat = write_catalog(base / "cluster.json", {"a": entry})
    env = client_env(base, cat)
    p = run(pyz, env, "c", "1", "30m", "-t", "+2h", "--json", "--", "echo", "hi there; exit 3")
    booked = json.loads(p.stdout)
    assert p.returncode == 0 and booked["data"]["status"] == "created", booked
    res = booked["data"]["reservation"]
    assert res["job"]["summary"] == "echo +1 arg" and res["op_id"] == booked["data"]["op_id"]
    ref = f"a/{res['short_id']}"
    p = run(pyz, env, "c", "e", ref, "-d", "+30m", "--note", "longer")
    assert p.returncode == 0 and p.stdout.startswith(f"updated on a: {res['short_id']} "), p.stdout + p.stderr
    p = run(pyz, env, "c", "e", "a/1", "-m", "auto", "--json")
    edited = json.loads(p.stdout)["data"]
    assert set(edited) >= {"node", "op_id", "recovered", "retried", "status", "reservation", "before"}, edited
    assert (edited["node"], edited["recovered"], edited["retried"]) == ("a", False, False)
    assert edited["reservation"]["note"] == "longer" and edited["reservation"]["end"] > res["end"]
    p = run(pyz, env, "c", "d", ref, "--json")
    gone = json.loads(p.stdout)
    assert p.returncode == 0 and gone["command"] == "cluster cancel" and gone["data"]["status"] == "cancelled"
    sent = log.read_text()
    assert " -- " not in sent, sent
    rows = [line.split("--row ")[1].split()[0] for line in sent.splitlines() if "--row " in line]
    assert rows == ["recommend", "book_job", "edit", "edit", "cancel"], rows
    # The command is the node's private spec; its ledger has the summary only.
    assert "hi there" not in (data / "ledger.json").read_text()
    p = run(pyz, env, "c", "e", "a/1", "--json")
    assert p.returncode == 2 and "say what to change" in json.loads(p.stdout)["error"]["message"]


def test_the_booking_of_an_ended_slice_asks_for_the_earliest_from_now():
    """The one booking request of bk c and cluster_create: a best option
    "now" whose slice ended while the slowest node answered books queued
    from now, not at the past start (which a node refuses)."""
    from bk.cluster.client import booking_request

    asked = {"count": 1, "duration": "30m", "mode": "shared", "limit": 1, "start": "+1h"}
    passed = booking_request(asked, {"start": iso(NOW - 600)}, exact=False, note="n")
    assert passed == {"count": 1, "duration": "30m", "mode": "shared", "queue": True, "note": "n"}
    later = booking_request(asked, {"start": iso(NOW + 7200)}, exact=False)
    assert later["start"] == iso(NOW + 7200) and later["queue"] is True
    exact = booking_request(asked, {"start": iso(NOW - 600)}, exact=True)
    assert exact["start"] == iso(NOW - 600) and "queue" not in exact
