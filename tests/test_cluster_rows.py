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


def test_an_older_node_is_refused_a_row_before_it_is_sent(base, pyz):
    """A node whose bk reports a release older than the rows: the client
    learns its version from its first reply and never sends the write."""
    entry, data = real_node(base, "old", pyz)
    log = base / "node-argv.log"
    # The real bk, reporting an older release, logging each command line it gets.
    old = base / "old-bk.py"
    old.write_text("import sys\n"
                   f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                   f"sys.path.insert(0, {str(pyz)!r})\n"
                   "import bk\nbk.__version__ = '0.0.9'\n"
                   "from bk.cli.main import main\nsys.exit(main())\n")
    entry["remote_command"] = [*entry["remote_command"][:-1], str(old)]
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
