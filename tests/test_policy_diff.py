"""Policy binding: one pure rule (``bk.core.policy.policy_diff``), and the
store, the broker's preflight and ``bk doctor`` agreeing on it."""

from __future__ import annotations

import json

import pytest
from helpers_cli import bk_fixture

from bk.core import ledgerdoc
from bk.core.errors import EXIT_CONFIG, ConfigError
from bk.core.models import Policy
from bk.core.policy import PolicyDiff, policy_diff, same

BOUND = Policy(gpu_count=4).bound()


# ------------------------------------------------------------- the rule

def test_equal_policies_have_nothing_to_say():
    assert policy_diff(dict(BOUND), dict(BOUND)) == PolicyDiff({}, {})


def test_a_different_value_is_a_conflict():
    got = policy_diff(dict(BOUND, max_shared_users=3), BOUND)
    assert got.conflicts == {"max_shared_users": {"ledger": 3, "config": BOUND["max_shared_users"]}}
    assert got.additions == {}
    assert got.describe() == f"max_shared_users: ledger 3, configuration {BOUND['max_shared_users']!r}"


def test_a_key_missing_from_the_ledger_is_an_addition_not_a_conflict():
    bound = {k: v for k, v in BOUND.items() if k != "shared_memory_reserve_mb"}
    got = policy_diff(bound, BOUND)
    assert got.conflicts == {}
    assert got.additions == {"shared_memory_reserve_mb": BOUND["shared_memory_reserve_mb"]}
    assert got.describe_additions() == f"shared_memory_reserve_mb={BOUND['shared_memory_reserve_mb']}"


@pytest.mark.parametrize("ledger, config", [(True, 1), (1, True), (0, False), (5, 5.0), ("5", 5),
                                            ([1], [True]), ({"a": 1}, {"a": 1.0})])
def test_a_value_of_another_type_is_a_conflict(ledger, config):
    got = policy_diff({"k": ledger}, {"k": config})
    assert got.conflicts == {"k": {"ledger": ledger, "config": config}} and got.additions == {}
    assert not same(ledger, config)


def test_nothing_bound_yet_means_everything_is_an_addition():
    assert policy_diff(None, BOUND) == PolicyDiff({}, dict(BOUND))
    assert policy_diff(None, {}) == PolicyDiff({}, {})


def test_keys_only_the_ledger_has_are_ignored():
    assert policy_diff(dict(BOUND, from_a_newer_bk=7), BOUND) == PolicyDiff({}, {})


# ------------------------------------------------------------- end to end

@pytest.fixture
def bk(monkeypatch, capsys):
    yield from bk_fixture(monkeypatch, capsys)


def edit_bound_policy(bk, change) -> None:
    path = bk.data_dir / "ledger.json"
    doc = json.loads(path.read_bytes())
    change(doc["policy"])
    path.write_bytes(ledgerdoc.dumps(doc))


def policy_check(bk) -> dict:
    return {c["name"]: c for c in bk.data("doctor")["checks"]}["policy"]


def preflight(bk):
    from bk.broker.server import _check_store

    return _check_store(bk.service())[0]


def test_a_key_deleted_from_the_ledger_is_ok_everywhere_and_the_next_booking_restores_it(bk):
    bk.ok("1", "1h")
    key = "shared_memory_reserve_mb"
    wanted = json.loads((bk.data_dir / "ledger.json").read_bytes())["policy"][key]
    edit_bound_policy(bk, lambda p: p.pop(key))
    check = policy_check(bk)
    assert check["ok"], check
    assert f"{key}={wanted}" in check["detail"] and "next write adds" in check["detail"]
    assert bk.data("doctor")["ok"]
    assert preflight(bk).startswith("valid")
    bk.ok("1", "30m")                                           # the store agrees: it books
    assert json.loads((bk.data_dir / "ledger.json").read_bytes())["policy"][key] == wanted
    assert "next write adds" not in policy_check(bk)["detail"]


@pytest.mark.parametrize("key, value", [("max_shared_users", 3),          # another value
                                        ("require_shared_memory", 0)])    # another type
def test_a_conflicting_bound_value_fails_everywhere(bk, key, value):
    bk.ok("1", "1h")
    edit_bound_policy(bk, lambda p: p.__setitem__(key, value))
    check = policy_check(bk)
    assert not check["ok"] and f"{key}: ledger {value!r}" in check["detail"], check
    assert not bk.data("doctor")["ok"]
    with pytest.raises(ConfigError, match=f"{key}: ledger {value!r}") as e:
        preflight(bk)
    assert key in e.value.details["differences"]
    r = bk.json("1", "30m")
    assert r.code == EXIT_CONFIG and r.error["code"] == "config"
    assert f"{key}: ledger {value!r}" in r.error["message"]
    assert r.error["details"]["differences"][key]["ledger"] == value
