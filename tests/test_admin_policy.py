"""``bk admin gpu-policy`` through the built archive: the diff, refusals for
bookings that break the new rules, the configuration written atomically
and the ledger's binding updated with it; an interrupted change (config
written, binding not) is detected and repaired by running it again.  Then
on a shared server: the trusted config stays root's 0644 and the broker,
which re-reads it, enforces the new rule for a real user."""

from __future__ import annotations

import json
import os
import shutil
import stat

import pytest
from helpers_admin import as_nobody, private
from helpers_broker import needs_root, site

pytestmark = pytest.mark.slow


@pytest.fixture
def bk(pyz):
    yield from private(pyz)


def test_show_without_options_says_the_policy_and_that_the_binding_agrees(bk):
    bk.book("1", "30m")
    got = bk.data_of("admin", "gpu-policy")
    assert got["policy"]["gpu_count"] == 4 and got["policy"]["disabled_gpus"] == []
    assert got["mismatch"] == {} and got["changes"] == []
    assert "ledger binding: agrees" in bk.run("admin", "gpu-policy").stdout


def test_dry_run_shows_the_diff_and_changes_nothing(bk):
    got = bk.data_of("admin", "gpu-policy", "--disable", "3", "--priority", "3=1,2=5", "--max-hours", "48",
                     "--dry-run")
    assert got["status"] == "dry_run"
    assert {c["key"]: c["after"] for c in got["changes"]} == {
        "disabled_gpus": [3], "gpu_priority": {"2": 5, "3": 1}, "max_booking_hours": 48}
    assert not bk.config.exists()


def test_a_change_bookings_break_is_refused_and_listed_unless_forced(bk):
    on0 = bk.book("1", "1h")                     # placed on GPU 0
    assert on0["gpus"] == [0]
    env = bk.json("admin", "gpu-policy", "--disable", "0", code=3)
    assert on0["short_id"] in env["error"]["message"] and "--force" in env["error"]["hint"]
    assert env["error"]["details"]["violations"] == [on0["id"]]
    assert not bk.config.exists()
    long = bk.book("1", "30h", "-t", "12:00")
    env = bk.json("admin", "gpu-policy", "--max-hours", "24", code=3)
    assert env["error"]["details"]["violations"] == [long["id"]]
    got = bk.data_of("admin", "gpu-policy", "--disable", "0", "--force")
    assert got["status"] == "changed"
    assert json.loads(bk.config.read_text())["disabled_gpus"] == [0]
    # The kept booking stays; new ones avoid GPU 0.
    assert bk.book("1", "30m", "--again")["gpus"] == [1]
    assert bk.data_of("admin", "gpu-policy", "--enable", "0")["changes"][0]["after"] == []


def test_a_bound_key_changes_the_config_and_the_ledger_binding_together(bk):
    shared = bk.book("1", "1h")
    env = bk.json("admin", "gpu-policy", "--require-memory", code=3)
    assert env["error"]["details"]["violations"] == [shared["id"]]
    got = bk.data_of("admin", "gpu-policy", "--require-memory", "--reserve-mb", "1024", "--force")
    assert got["rebind"] and got["binding"]["status"] == "bound"
    assert got["binding"]["forced"] == [shared["id"]]
    policy = bk.ledger()["policy"]
    assert policy["require_shared_memory"] is True and policy["shared_memory_reserve_mb"] == 1024
    doc = json.loads(bk.config.read_text())
    assert doc["require_shared_memory"] is True and doc["shared_memory_reserve_mb"] == 1024
    assert bk.json("1", "30m", "--again", code=3)["error"]["details"]["rule"] == "require_shared_memory"
    bk.book("1", "30m", "4g")
    lg = bk.data_of("lg", "--all", "-n", "10")["entries"]
    bind = [e for e in lg if e["action"] == "policy_bind"]
    assert bind[0]["before"]["require_shared_memory"] is False


def test_an_interrupted_change_is_detected_and_rerunning_it_completes_it(bk):
    bk.book("1", "30m")
    # What a crash between the two steps leaves: the config says 2048, the ledger 512.
    bk.config.parent.mkdir(parents=True, exist_ok=True)
    bk.config.write_text(json.dumps({"shared_memory_reserve_mb": 2048}))
    assert bk.json("1", "1h", "--again", code=78)["error"]["code"] == "config"
    shown = bk.data_of("admin", "gpu-policy")
    assert shown["mismatch"] == {"shared_memory_reserve_mb": {"ledger": 512, "config": 2048}}
    assert "MISMATCH" in bk.run("admin", "gpu-policy").stdout
    got = bk.data_of("admin", "gpu-policy", "--reserve-mb", "2048")     # the same command again
    assert got["changes"] == [] and got["binding"]["status"] == "bound"
    assert bk.ledger()["policy"]["shared_memory_reserve_mb"] == 2048
    bk.book("1", "1h", "--again")


def test_rules_the_ledger_cannot_hold_are_refused_even_with_force(bk):
    sim = bk.root / "sim.json"          # GPUs whose memory is known: 80 GB each
    sim.write_text(json.dumps({"gpus": [{"name": "H100", "mem_total_mib": 81559} for _ in range(4)]}))
    del bk.env["BK_GPU_COUNT"]
    bk.env["BK_GPU_SIM_FILE"] = str(sim)
    for _ in range(2):
        bk.book("1", "1h", "40g", "--again", "-g", "0")
    env = bk.json("admin", "gpu-policy", "--reserve-mb", "60000", "--force", code=3)
    assert "cannot hold" in env["error"]["message"]
    assert bk.ledger()["policy"]["shared_memory_reserve_mb"] == 512


def test_bad_lists_are_usage_errors(bk):
    for argv in (["--disable", "9"], ["--priority", "3"], ["--disable", "0,1,2,3"], ["--disable", "1", "--enable", "1"]):
        env = bk.json("admin", "gpu-policy", *argv, code=2)
        assert env["error"]["code"] == "invalid_input", argv


@needs_root
@pytest.mark.root
def test_non_root_is_refused(pyz):
    p = as_nobody(pyz, "admin", "gpu-policy", "--disable", "1")
    assert p.returncode == 5 and json.loads(p.stdout)["error"]["hint"].startswith("sudo bk admin gpu-policy")


@needs_root
@pytest.mark.root
def test_shared_server_trusted_config_and_binding_through_the_broker():
    if not shutil.which("useradd"):
        pytest.skip("needs useradd")
    with site() as srv:
        ada = srv.accounts.user()
        assert srv.init().returncode == 0
        srv.start_broker()
        rc, env = srv.run_json(ada, "1", "1h")
        assert rc == 0, env
        rc, env = srv.run_json(ada, "admin", "gpu-policy", "--require-memory")
        assert rc == 5
        rc, env = srv.run_json(None, "admin", "gpu-policy", "--require-memory", "--force", "--max-hours", "12")
        assert rc == 0 and env["data"]["binding"]["status"] == "bound", env
        st = os.lstat(srv.config)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o644)
        doc = json.loads(srv.config.read_text())
        assert doc["require_shared_memory"] is True and doc["max_booking_hours"] == 12
        assert doc["service_uid"] == srv.service.uid                   # the rest is kept
        assert srv.ledger().state.policy["require_shared_memory"] is True
        rc, env = srv.run_json(ada, "1", "30m", "--again")
        assert rc == 3 and env["error"]["details"]["rule"] == "require_shared_memory", env   # the broker enforces it
        rc, env = srv.run_json(ada, "1", "13h", "8g")
        assert rc == 3 and env["error"]["code"] == "policy", env
        rc, env = srv.run_json(ada, "1", "30m", "8g")
        assert rc == 0, env
        rc, env = srv.run_json(ada, "doctor")
        assert rc == 0, env


@needs_root
@pytest.mark.root
def test_a_bound_key_changed_while_the_broker_is_stopped_is_bound_on_the_host():
    """Issue 30 item 2: in a maintenance stop the change used to write the
    config, fail "broker not reachable ... nothing was changed", and leave
    a broker that refused to start (78).  Now root binds the ledger itself,
    as the service account, and the broker starts with the new rule."""
    if not shutil.which("useradd"):
        pytest.skip("needs useradd")
    with site() as srv:
        ada = srv.accounts.user()
        assert srv.init().returncode == 0
        srv.start_broker()
        rc, env = srv.run_json(ada, "1", "1h", "8g")
        assert rc == 0, env
        srv.stop_broker()
        rc, env = srv.run_json(None, "admin", "gpu-policy", "--reserve-mb", "2048", "--require-memory")
        assert rc == 0, env
        assert env["data"]["binding"]["status"] == "bound"
        assert env["data"]["binding"]["after"]["shared_memory_reserve_mb"] == 2048
        policy = srv.ledger().state.policy
        assert policy["shared_memory_reserve_mb"] == 2048 and policy["require_shared_memory"] is True
        for p in srv.data.rglob("*"):            # every file is still the service account's
            assert p.lstat().st_uid == srv.service.uid, p
        # The interrupted state (a config written by hand, the binding not)
        # is completed by the same command, broker still stopped.
        doc = json.loads(srv.config.read_text())
        srv.config.write_text(json.dumps({**doc, "shared_memory_reserve_mb": 4096}))
        rc, env = srv.run_json(None, "admin", "gpu-policy", "--reserve-mb", "4096")
        assert rc == 0 and env["data"]["changes"] == [] and env["data"]["binding"]["status"] == "bound", env
        srv.start_broker()                        # it used to refuse: 78
        rc, env = srv.run_json(ada, "1", "30m", "--again")
        assert rc == 3 and env["error"]["details"]["rule"] == "require_shared_memory", env
        rc, env = srv.run_json(None, "lg", "--all", "-n", "20")
        assert rc == 0, env
        binds = [e for e in env["data"]["entries"] if e["action"] == "policy_bind"]
        assert len(binds) == 2 and {e["uid"] for e in binds} == {0}, binds


def test_bad_flag_values_are_usage_errors_naming_the_flag(bk):
    """Issue 30 item 13: they exited 78 (a broken configuration) with the
    bound as "1.04858e+06"."""
    for flag, value, bound in (("--reserve-mb", "-5", "between 0 and 1048576"),
                               ("--max-hours", "0", "between 1 and 8784"),
                               ("--horizon-days", "400", "between 1 and 366")):
        env = bk.json("admin", "gpu-policy", flag, value, code=2)
        assert env["error"]["code"] == "invalid_input"
        assert env["error"]["message"] == f"{flag} must be {bound}, got {value}", env
    assert not bk.config.exists()
