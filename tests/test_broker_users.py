"""The shared server with real accounts: who may do what through the broker.

One module-scoped site: a service account and three users made with
``useradd``, ``bk admin init`` into a temporary root-owned directory, and the
broker started as the service account with ``/usr/bin/python3 bk.pyz
broker`` and ``BK_CONFIG_FILE``, as a systemd unit would.  Every client is a
real process of a real user; identity comes from the kernel only.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import textwrap

import pytest
from helpers_broker import SYSTEM_PYTHON, capacity_problems, needs_root, poll, site

pytestmark = [pytest.mark.slow, needs_root, pytest.mark.root]


@pytest.fixture(scope="module")
def srv():
    with site() as s:
        a, b, c = s.accounts.user(), s.accounts.user(), s.accounts.user()
        s.users = (a, b, c)
        p = s.init()
        assert p.returncode == 0, p.stderr
        s.start_broker("--frame-timeout", "3")
        yield s


def book(srv, user, *args):
    rc, env = srv.run_json(user, "1", "30m", *args)
    assert rc == 0, env
    return env["data"]["reservation"]


# ------------------------------------------------------------- set-up

def test_init_made_a_trusted_config_and_owned_directories(srv):
    st = os.lstat(srv.config)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o644)
    doc = json.loads(srv.config.read_text())
    assert doc["service_uid"] == srv.service.uid and doc["socket"] == str(srv.socket)
    for d in (srv.data, srv.socket.parent):
        st = os.lstat(d)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (srv.service.uid, 0o755)
    sock = os.lstat(srv.socket)
    assert stat.S_ISSOCK(sock.st_mode) and stat.S_IMODE(sock.st_mode) == 0o666
    assert sock.st_uid == srv.service.uid


def test_rerunning_init_with_the_same_options_changes_nothing(srv):
    p = srv.init("--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["data"]["status"] == "unchanged"


# ------------------------------------------------------------- ownership

def test_owner_only_edit_and_cancel_then_admin_cancel_with_notice(srv):
    a, b, _ = srv.users
    res = book(srv, a, "--note", "mine")
    assert res["uid"] == a.uid and res["user"] == a.name
    for args in (["d", res["id"], "-y"], ["e", res["id"], "-d", "1h"]):
        rc, env = srv.run_json(b, *args)
        assert rc == 5 and env["error"]["code"] == "permission_denied", env
    # B cannot reach it through admin commands either: the broker, not the CLI, decides.
    rc, env = srv.run_json(b, "admin", "cancel", res["id"], "--reason", "x", "-y")
    assert rc == 5 and env["error"]["code"] == "permission_denied"

    rc, env = srv.run_json(None, "admin", "cancel", res["id"][:8], "--reason", "GPU 0 needs a reboot", "-y")
    assert rc == 0 and env["data"]["status"] == "cancelled", env
    rc, env = srv.run_json(a, "n")
    assert rc == 0
    mine = [n for n in env["data"]["notices"] if n["reservation"] == res["id"]]
    assert mine and "GPU 0 needs a reboot" in mine[0]["text"] and mine[0]["scope"] == "you"
    rc, env = srv.run_json(b, "n")
    assert not [n for n in env["data"]["notices"] if n["reservation"] == res["id"]]


def test_audit_trail_and_history_come_through_the_broker(srv):
    """The audit log is 0640: users see their own trail (and what root did to
    their bookings) through the broker, never another user's records."""
    a, b, _ = srv.users
    res = book(srv, a, "--note", "trail")
    rc, env = srv.run_json(None, "admin", "cancel", res["id"], "--reason", "driver update", "-y")
    assert rc == 0, env
    mine = book(srv, b)
    rc, env = srv.run_json(a, "lg", "-n", "50")
    assert rc == 0, env
    about = [e for e in env["data"]["entries"] if e["reservation"] == res["id"]]
    assert [e["action"] for e in about] == ["create", "admin_cancel"]
    assert not [e for e in env["data"]["entries"] if e["reservation"] == mine["id"]]
    assert all(e["uid"] == a.uid or e.get("owner") == a.uid for e in env["data"]["entries"])
    rc, env = srv.run_json(None, "lg", "--all", "-n", "200")            # root sees everyone's
    assert rc == 0 and mine["id"] in {e["reservation"] for e in env["data"]["entries"]}, env
    rc, env = srv.run_json(b, "history", res["id"][:8])
    assert rc == 0, env
    assert [e["action"] for e in env["data"]["events"]] == ["create", "admin_cancel"]
    audit = srv.data / "audit.jsonl"
    if audit.exists():
        assert stat.S_IMODE(os.lstat(audit).st_mode) & 0o004 == 0   # not world-readable


READ_COMMANDS = [["l"], ["l", "--all"], ["l", "--history"], ["st"], ["st", "-v"], ["tl"],
                 ["slots", "1", "30m"], ["g"], ["n"], ["lg"], ["info"], ["login"], ["config"],
                 ["doctor"], ["tutorial"], ["p"], ["help"]]


@pytest.mark.parametrize("args", READ_COMMANDS, ids=" ".join)
def test_every_read_command_works_for_an_ordinary_user(srv, args):
    a, _, _ = srv.users
    book(srv, a)
    rc, env = srv.run_json(a, *args)
    assert env["ok"] is True and rc == 0, env
    if args == ["doctor"]:
        # Files only the service account may read are not faults for a user.
        bad = [c for c in env["data"]["checks"] if not c["ok"]]
        assert not bad, bad


def test_doctor_probe_goes_through_the_broker_for_an_ordinary_user(srv):
    a, _, _ = srv.users
    rc, env = srv.run_json(a, "doctor", "--probe", "--strict")     # the deployment check passes
    assert rc == 0, env
    checks = {c["name"]: c for c in env["data"]["checks"]}
    assert env["data"]["probe"] is True
    for name in ("broker", "atomic replace", "locking"):
        assert checks[name]["ok"], checks[name]
    assert f"uid {a.uid}" in checks["broker"]["detail"]
    assert not list(srv.data.glob(".ledger.json.tmp-probe-*"))      # the probe cleans up


FORGER = textwrap.dedent('''
    import json, socket, struct, sys
    path, frames = sys.argv[1], json.loads(sys.stdin.read())
    def reply(s):
        buf = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return None
            buf += chunk
            if len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
                return json.loads(buf[4:4 + struct.unpack(">I", buf[:4])[0]])
    for f in frames:
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        body = json.dumps(f).encode()
        s.sendall(struct.pack(">I", len(body)) + body)
        print(json.dumps(reply(s)))
        s.close()
''')


def test_forged_identity_over_a_raw_socket_changes_nothing(srv):
    a, b, _ = srv.users
    res = book(srv, a)
    rid = res["id"]
    frames = [
        {"v": 1, "op": "cancel", "fields": {"ref": rid}},
        {"v": 1, "op": "cancel", "fields": {"ref": rid, "uid": a.uid}},
        {"v": 1, "op": "cancel", "fields": {"ref": rid, "user": a.name, "reason": "x"}},
        {"v": 1, "op": "cancel", "uid": a.uid, "fields": {"ref": rid}},
        {"v": 1, "op": "cancel", "actor": {"uid": 0, "user": "root"}, "fields": {"ref": rid, "reason": "x"}},
        {"v": 1, "op": "edit", "fields": {"ref": rid, "end": 4102444800, "uid": a.uid}},
        {"v": 1, "op": "edit", "fields": {"ref": rid, "note": "hijacked"}},
        {"v": 1, "op": "notice_publish", "fields": {"text": "free GPUs for all", "uid": 0}},
        {"v": 1, "op": "notice_publish", "fields": {"text": "free GPUs for all"}},
    ]
    p = subprocess.run([SYSTEM_PYTHON, "-c", FORGER, str(srv.socket)], input=json.dumps(frames),
                       capture_output=True, text=True, timeout=60, **srv.popen_args(b))
    assert p.returncode == 0, p.stderr
    replies = [json.loads(line) for line in p.stdout.splitlines()]
    assert len(replies) == len(frames)
    codes = [r["error"]["code"] for r in replies]
    assert all(r["ok"] is False for r in replies)
    assert codes == ["permission_denied", "invalid_input", "invalid_input", "invalid_input", "invalid_input",
                     "invalid_input", "permission_denied", "invalid_input", "permission_denied"]
    rc, env = srv.run_json(a, "l", "-n", "0")
    row = next(r for r in env["data"]["reservations"] if r["id"] == rid)
    assert row["status"] != "cancelled" and row["note"] is None
    assert not [n for n in srv.ledger().state.notices if "free GPUs" in n.text]


def test_users_cannot_publish_announcements_but_root_can(srv):
    a = srv.users[0]
    rc, env = srv.run_json(a, "admin", "notice", "publish", "hello")
    assert rc == 5
    rc, env = srv.run_json(None, "admin", "notice", "publish", "Maintenance at 18:00", "--level",
                           "warning", "--until", "+2h")
    assert rc == 0, env
    rc, env = srv.run_json(a, "n")
    texts = [(n["text"], n["level"], n["scope"]) for n in env["data"]["notices"]]
    assert ("Maintenance at 18:00", "warning", "everyone") in texts


def test_root_archives_an_announcement_and_users_stop_seeing_it(srv):
    a = srv.users[0]
    rc, env = srv.run_json(None, "admin", "notice", "publish", "Disk full on /scratch")
    assert rc == 0, env
    nid = env["data"]["notice"]["id"]
    rc, env = srv.run_json(a, "admin", "notice", "archive", nid[:8])
    assert rc == 5
    rc, env = srv.run_json(None, "admin", "notice", "archive", nid[:8])
    assert rc == 0 and env["data"]["status"] == "archived", env
    rc, env = srv.run_json(a, "n")
    assert nid not in {n["id"] for n in env["data"]["notices"]}
    rc, env = srv.run_json(a, "n", "--all")
    assert [n["archived"] for n in env["data"]["notices"] if n["id"] == nid] == [True]


# ------------------------------------------------------------- concurrency

def test_three_users_thirty_concurrent_bookings_each(srv):
    procs = []
    for user in srv.users:
        for _ in range(30):
            procs.append((user, subprocess.Popen(
                [SYSTEM_PYTHON, str(srv.pyz), "--json", "1", "30m", "--again"], stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, env=srv.env(user), cwd=srv.base,
                **srv.popen_args(user))))
    acked = {}
    for user, p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, (out, err)
        env = json.loads(out)
        assert env["ok"] and env["data"]["status"] in ("created", "queued")
        r = env["data"]["reservation"]
        assert r["uid"] == user.uid
        acked[r["id"]] = user.uid
    assert len(acked) == 90
    got = srv.ledger()
    assert got.source == "ledger" and not got.warnings
    by_id = {r.id: r for r in got.state.reservations}
    assert all(by_id[i].uid == uid for i, uid in acked.items())
    assert capacity_problems(got.state.reservations, 2) == []


# ------------------------------------------------------------- the broker's own rules

def test_a_second_broker_and_a_wrong_account_are_refused(srv):
    a = srv.users[0]
    p = srv.run(srv.service, "broker")
    assert p.returncode == 75 and "another broker" in p.stderr, p.stderr
    p = srv.run(srv.service, "broker", "--check")
    assert p.returncode == 75
    p = srv.run(a, "broker")
    assert p.returncode == 77 and "service account" in p.stderr
    assert srv.broker.poll() is None


def test_broker_down_reads_work_writes_fail_69_then_restart(srv):
    a = srv.users[0]
    res = book(srv, a)
    assert srv.stop_broker(signal.SIGTERM) == 0
    assert not srv.socket.exists()
    assert "stopped after" in srv.log()
    rc, env = srv.run_json(a, "l", "-n", "0")       # this module's users have more than 20 by now
    assert rc == 0 and res["id"] in [r["id"] for r in env["data"]["reservations"]]
    p = srv.run(a, "1", "30m")
    assert p.returncode == 69 and "systemctl status gpubk-broker" in p.stderr, p.stderr
    rc, env = srv.run_json(a, "d", res["id"], "-y")
    assert rc == 69 and env["error"]["code"] == "unavailable"
    p = srv.run(srv.service, "broker", "--check")
    assert p.returncode == 0, p.stderr
    srv.start_broker("--frame-timeout", "3")
    rc, env = srv.run_json(a, "d", res["id"], "-y")
    assert rc == 0


def test_group_access_refuses_non_members(srv):
    a, b, _ = srv.users
    with site(access="group") as g:
        group, _gid = g.accounts.group()
        member = g.accounts.user(groups=(group,))
        outsider = g.accounts.user()
        g.group = group
        p = g.init()
        assert p.returncode == 0, p.stderr
        g.start_broker()
        assert stat.S_IMODE(os.lstat(g.socket).st_mode) == 0o660
        assert stat.S_IMODE(os.lstat(g.socket.parent).st_mode) == 0o2750
        rc, env = g.run_json(member, "1", "30m")
        assert rc == 0, env
        rc, env = g.run_json(outsider, "1", "30m")
        assert rc == 5 and env["error"]["code"] == "permission_denied", env
        assert f"group {group}" in env["error"]["hint"], env
        rc, env = g.run_json(outsider, "l")            # the ledger is 0750: not an I/O error
        assert rc == 5 and env["error"]["code"] == "permission_denied", env
        assert f"group {group}" in env["error"]["hint"], env
        poll(lambda: g.stop_broker() == 0, 30, "the group broker to stop")


def test_the_broker_applies_a_policy_edit_without_a_restart(srv):
    """Clients read the config on every run; the broker must enforce the same policy."""
    a = srv.users[0]
    original = srv.config.read_bytes()
    doc = json.loads(original)
    doc["max_booking_hours"] = 1
    srv.config.write_text(json.dumps(doc))
    try:
        rc, env = srv.run_json(a, "1", "2h")
        assert rc == 3 and env["error"]["code"] == "policy", env
        assert "at most 1 h" in env["error"]["message"] or "1 hours" in env["error"]["message"], env
    finally:
        srv.config.write_bytes(original)
    rc, env = srv.run_json(a, "1", "2h")
    assert rc == 0, env


def test_a_config_that_disagrees_with_the_bound_policy_is_refused_at_start(srv):
    original = srv.config.read_bytes()
    doc = json.loads(original)
    doc["gpu_count"] = 8
    srv.config.write_text(json.dumps(doc))
    try:
        p = srv.run(srv.service, "broker", "--check")
        assert p.returncode == 78 and "gpu_count: ledger 4, configuration 8" in p.stderr, p.stderr
    finally:
        srv.config.write_bytes(original)
    assert srv.run(srv.service, "broker", "--check").returncode == 75   # back to: one already runs
