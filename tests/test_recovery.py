"""Nothing acknowledged is forgotten silently (issue 10, item 1), through the
built archive: a ledger that fell back to an older backup, or vanished with
its backups, is reported by every reader, refused by every writer (the audit
log witnesses the missing commits, named with their bookings and owners), and
failed by bk doctor, until the loss is restored or accepted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers_cli import NOW_ISO


def bk(env, *argv, code=None):
    p = subprocess.run([sys.executable, env["PYZ"], *argv], capture_output=True, text=True, env=env, timeout=60)
    if code is not None:
        assert p.returncode == code, (argv, p.returncode, p.stdout, p.stderr)
    return p


@pytest.fixture
def env(tmp_path, pyz):
    e = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "BK_DATA_DIR": str(tmp_path / "data"),
         "BK_GPU_COUNT": "4", "BK_NOW": NOW_ISO, "TZ": "UTC", "XDG_CONFIG_HOME": str(tmp_path / "c"),
         "XDG_STATE_HOME": str(tmp_path / "s"), "XDG_CACHE_HOME": str(tmp_path / "k"), "PYZ": str(pyz)}
    return e


def booked_id(env, *argv):
    return json.loads(bk(env, *argv, "--json", code=0).stdout)["data"]["reservation"]["id"]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["newest backup garbled", "all gone"])
def test_a_writer_refuses_to_forget_and_every_reader_reports(env, how):
    first = booked_id(env, "1", "1h")
    second = booked_id(env, "1", "1h", "-t", "12:00")
    data = env["BK_DATA_DIR"]
    backups = os.path.join(data, "backups")
    if how == "newest backup garbled":
        with open(os.path.join(data, "ledger.json"), "w") as f:
            f.write("{garbage")
        newest = sorted(os.listdir(backups))[-1]
        with open(os.path.join(backups, newest), "w") as f:
            f.write("{}")
    else:
        os.unlink(os.path.join(data, "ledger.json"))
        for n in os.listdir(backups):
            os.unlink(os.path.join(backups, n))
    # A writer: refused, told exactly what is missing, nothing written.
    before = sorted(os.listdir(data))
    w = bk(env, "1", "30m", code=74)
    assert "audit log records commits" in w.stderr and second[:8] in w.stderr
    assert "bk admin data recover" in w.stderr
    j = json.loads(bk(env, "1", "30m", "--json", code=74).stdout)
    assert j["error"]["code"] == "lost_commits" and second in j["error"]["details"]["reservations"]
    assert sorted(os.listdir(data)) == before
    # Readers say what they read.
    if how == "newest backup garbled":
        r = bk(env, "l", "--json", code=0)
        got = json.loads(r.stdout)
        assert [x["id"] for x in got["data"]["reservations"]] == [first]
        assert any("THE LEDGER" in w for w in got["warnings"])
        assert "THE LEDGER" in bk(env, "l", code=0).stderr
        assert "THE LEDGER" in w.stderr              # the refused writer said what it read, too
    # Doctor fails it.
    doc = json.loads(bk(env, "doctor", "--json", code=0).stdout)["data"]
    audit = next(c for c in doc["checks"] if c["name"] == "audit log")
    assert not doc["ok"] and not audit["ok"] and "commits the ledger lacks" in audit["detail"]
    plain = bk(env, "doctor", code=0).stdout            # not a terminal: every word of the details
    assert "writes are refused until they are restored or the loss is accepted" in " ".join(plain.split())


@pytest.mark.slow
@pytest.mark.parametrize("how", ["newest backup garbled", "all gone"])
def test_recover_replays_what_the_audit_log_holds_and_writes_go_on(env, how):
    first = booked_id(env, "1", "1h", "-m", "4g")
    second = booked_id(env, "x", "1", "1h", "-t", "12:00", "-g", "2")
    bk(env, "e", "2", "-d", "2h", code=0)
    data, backups = env["BK_DATA_DIR"], os.path.join(env["BK_DATA_DIR"], "backups")
    want = {r["id"]: r for r in json.loads(bk(env, "l", "--json", code=0).stdout)["data"]["reservations"]}
    os.unlink(os.path.join(data, "ledger.json"))
    names = sorted(os.listdir(backups))
    for n in (names if how == "all gone" else names[-2:]):      # keep only commit 1's backup
        os.unlink(os.path.join(backups, n))
    dry = json.loads(bk(env, "admin", "data", "recover", "--dry-run", "--json", code=0).stdout)["data"]
    assert dry["status"] == "lost" and second in {b["reservation"] for b in dry["bookings"]}
    assert bk(env, "admin", "data", "recover", code=2).stderr.count("--yes")    # no terminal: no silent yes
    done = json.loads(bk(env, "admin", "data", "recover", "--replay", "-y", "--json", code=0).stdout)["data"]
    assert done["status"] == "recovered" and second in done["replayed"]
    got = {r["id"]: r for r in json.loads(bk(env, "l", "--json", code=0).stdout)["data"]["reservations"]}
    assert set(got) == {first, second}
    for rid in got:                      # what the audit records carry came back exactly
        for k in ("gpus", "mode", "share", "mem_mib", "start", "end", "user"):
            assert got[rid][k] == want[rid][k], (rid, k)
    bk(env, "1", "30m", code=0)                                   # writes go on
    doc = json.loads(bk(env, "doctor", "--json", code=0).stdout)["data"]
    assert next(c for c in doc["checks"] if c["name"] == "audit log")["ok"]
    log = json.loads(bk(env, "lg", "--json", "-n", "20", code=0).stdout)["data"]["entries"]
    assert any(e["action"] == "recover" and e["result"] == "accepted_loss" for e in log)


def test_nothing_to_recover_says_so(env):
    booked_id(env, "1", "1h")
    out = bk(env, "admin", "data", "recover", "-y", code=0).stdout
    assert "nothing is lost" in out


def test_a_recovery_that_archives_again_writes_no_second_record(env):
    """Issue 30, item 20: the restored ledger still holds a booking that was
    archived since; the recovering commit archives it again, but its record
    is not written twice."""
    env = dict(env)
    old = booked_id(env, "1", "30m")
    env["BK_NOW"] = "2026-07-15T10:41:30Z"                      # two days on: a commit archives it
    booked_id(env, "1", "30m")
    data = env["BK_DATA_DIR"]
    archive = os.path.join(data, "archive")

    def records() -> list[str]:
        out = []
        for name in sorted(os.listdir(archive)):
            with open(os.path.join(archive, name)) as f:
                out += [json.loads(line)["reservation"]["id"] for line in f if line.strip()]
        return out
    assert records() == [old]
    os.unlink(os.path.join(data, "ledger.json"))
    backups = os.path.join(data, "backups")
    os.unlink(os.path.join(backups, sorted(os.listdir(backups))[-1]))   # back to commit 1: it holds old
    done = json.loads(bk(env, "admin", "data", "recover", "--replay", "-y", "--json", code=0).stdout)["data"]
    assert done["status"] == "recovered"
    bk(env, "1", "20m", code=0)
    assert records() == [old]                                     # once, not once per archiving
    hist = json.loads(bk(env, "l", "--history", "--json", code=0).stdout)["data"]["reservations"]
    assert [r["id"] for r in hist] == [old]


def test_a_commit_killed_after_archiving_leaves_one_record_once_repeated(env):
    env = dict(env)
    old = booked_id(env, "1", "30m")
    env["BK_NOW"] = "2026-07-15T10:41:30Z"
    killed = bk({**env, "BK_TEST_CRASH_AT": "archived"}, "1", "30m")
    assert killed.returncode == -9                               # after the archive append, before the commit
    archive = os.path.join(env["BK_DATA_DIR"], "archive")
    (month,) = os.listdir(archive)
    bk(env, "1", "30m", code=0)                                  # archives the same booking again
    with open(os.path.join(archive, month)) as f:
        assert [json.loads(line)["reservation"]["id"] for line in f] == [old]
