"""Paths and the configuration loader: locations, strictness, defaults."""

from __future__ import annotations

import json
import os

import pytest

from bk.core.errors import ConfigError
from bk.store import config
from bk.store.paths import SYSTEM_CONFIG, locate


def env_for(tmp_path, **extra):
    env = {"HOME": str(tmp_path / "home")}
    env.update(extra)
    return env


def test_private_mode_under_xdg_data_home(tmp_path):
    loc = locate(env_for(tmp_path, XDG_DATA_HOME=str(tmp_path / "xdg")))
    if os.path.exists(SYSTEM_CONFIG):
        pytest.skip("a system config exists on this machine")
    assert loc.mode == "private"
    assert loc.data_dir == str(tmp_path / "xdg" / "bk")


@pytest.mark.parametrize("value", ["relative/dir", "", "./x"])
def test_relative_xdg_values_are_ignored(tmp_path, value):
    if os.path.exists(SYSTEM_CONFIG):
        pytest.skip("a system config exists on this machine")
    loc = locate(env_for(tmp_path, XDG_DATA_HOME=value, XDG_CONFIG_HOME=value))
    assert loc.data_dir == str(tmp_path / "home" / ".local" / "share" / "bk")
    assert loc.config_file == str(tmp_path / "home" / ".config" / "bk" / "config.json")


def test_bk_data_dir_forces_private_mode(tmp_path):
    loc = locate(env_for(tmp_path, BK_DATA_DIR=str(tmp_path / "d"), BK_CONFIG_FILE="/x/c.json"))
    assert (loc.mode, loc.data_dir, loc.config_file, loc.config_is_system) == \
        ("private", str(tmp_path / "d"), "/x/c.json", False)


def test_bk_data_dir_must_be_absolute(tmp_path):
    with pytest.raises(ConfigError, match="absolute"):
        locate(env_for(tmp_path, BK_DATA_DIR="rel"))


def test_bk_config_file_means_shared_mode(tmp_path):
    loc = locate(env_for(tmp_path, BK_CONFIG_FILE=str(tmp_path / "c.json")))
    assert loc.mode == "shared" and loc.config_is_system


def write_user_config(tmp_path, doc) -> dict:
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return env_for(tmp_path, BK_DATA_DIR=str(tmp_path / "d"), BK_CONFIG_FILE=str(path))


def test_defaults_without_a_file(tmp_path):
    s = config.load(locate(env_for(tmp_path, BK_DATA_DIR=str(tmp_path / "d"))))
    assert s.source is None
    assert s["slot_minutes"] == 5 and s["max_shared_users"] == 2
    assert s["shared_memory_reserve_mb"] == 512 and s["booking_horizon_days"] == 30
    assert s["max_booking_hours"] == 720 and s["queue_search_hours"] == 168
    assert s["ledger_retention_days"] == 90 and s["backup_keep"] == 10
    assert s["lock_timeout_seconds"] == 10.0
    p = s.policy(gpu_count=4)
    assert p.gpu_count == 4 and p.slot_seconds == 300


def test_values_are_read_and_normalised(tmp_path):
    env = write_user_config(tmp_path, {"slot_minutes": 10, "disabled_gpus": [3, 1, 3],
                                       "gpu_priority": {"2": 5}, "lock_timeout_seconds": 2})
    s = config.load(locate(env))
    assert s["slot_minutes"] == 10 and s["disabled_gpus"] == [1, 3]
    assert s["lock_timeout_seconds"] == 2.0
    p = s.policy(gpu_count=4)
    assert p.disabled_gpus == frozenset({1, 3}) and p.priority(2) == 5 and p.priority(0) == 0


@pytest.mark.parametrize("doc, message, hint", [
    ({"slot_minute": 5}, "unknown setting 'slot_minute'", "did you mean 'slot_minutes'"),
    ({"max_shared_user": 3}, "unknown setting", "max_shared_users"),
    ({"zzzz": 1}, "unknown setting 'zzzz'", "gpubk-config"),
    ({"slot_minutes": "5"}, "slot_minutes must be a whole number", None),
    ({"slot_minutes": 7}, "a divisor of 60", None),
    ({"slot_minutes": 0}, "between 1 and 60", None),
    ({"max_shared_users": True}, "a whole number", None),
    ({"require_shared_memory": 1}, "true or false", None),
    ({"booking_horizon_days": 1000}, "between 1 and 366", None),
    ({"disabled_gpus": [-1]}, "list of GPU indices", None),
    ({"disabled_gpus": "0,1"}, "list of GPU indices", None),
    ({"gpu_priority": {"a": 1}}, "GPU indices", None),
    ({"gpu_priority": {"1": 1000}}, "priorities between", None),
    ({"lock_timeout_seconds": 0}, "between 0.1 and 600", None),
    ({"data_dir": "/srv/x"}, "accepted only from the trusted system file", "/etc/gpubk/config.json"),
    ({"service_uid": 1000}, "only from the trusted system file", None),
    ([1, 2], "expected a JSON object", None),
    ("{not json", "not valid JSON", "json.tool"),
])
def test_bad_configs_are_refused(tmp_path, doc, message, hint):
    env = write_user_config(tmp_path, doc)
    with pytest.raises(ConfigError) as info:
        config.load(locate(env))
    assert message in info.value.message
    assert info.value.exit_code == 78
    if hint:
        assert hint in (info.value.hint or "")


def test_security_keys_accepted_from_a_system_document():
    out = config.parse_document({"data_dir": "/srv/gpubk/", "access": "group", "group": "gpu"},
                                "/etc/gpubk/config.json", allow_security=True)
    assert out == {"data_dir": "/srv/gpubk", "access": "group", "group": "gpu"}
    with pytest.raises(ConfigError, match="no group is named"):
        config.parse_document({"access": "group"}, "x", allow_security=True)
    with pytest.raises(ConfigError, match="absolute path"):
        config.parse_document({"socket": "run/x.sock"}, "x", allow_security=True)


def test_every_key_has_documentation_and_a_valid_default():
    for name, key in config.KEYS.items():
        assert key.doc.strip(), name
        if key.default is not None:
            assert config.check_value(key, key.default, "defaults") == key.default


def test_simulated_gpus_needs_a_count():
    from bk.store.config import parse_document

    with pytest.raises(ConfigError) as e:
        parse_document({"simulated_gpus": True}, "cfg", allow_security=True)
    assert "gpu_count" in e.value.message
    assert parse_document({"simulated_gpus": True, "gpu_count": 8}, "cfg", allow_security=True) == {
        "simulated_gpus": True, "gpu_count": 8}
