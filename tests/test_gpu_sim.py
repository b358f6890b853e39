"""The GPU seam and its simulated backends."""

from __future__ import annotations

import json

import pytest

from bk.core.errors import ConfigError
from bk.gpu import open_backend


def test_count_backend():
    b = open_backend({"BK_GPU_COUNT": "3"})
    devs = b.snapshot(0).gpus
    assert b.simulated and b.inventory().count == 3
    assert [d.index for d in devs] == [0, 1, 2]
    assert len({d.uuid for d in devs}) == 3
    assert all(d.mem_total_mib is None and d.processes is None for d in devs)
    assert devs[0].live_state() == "unknown"


@pytest.mark.parametrize("value", ["0", "65", "x", "-1", ""])
def test_bad_gpu_count(value):
    with pytest.raises(ConfigError, match="BK_GPU_COUNT"):
        open_backend({"BK_GPU_COUNT": value})


def test_fallback_is_a_reported_simulation(tmp_path):
    b = open_backend({}, fallback_count=2, proc_root=str(tmp_path))     # a machine without a driver
    assert b.inventory().count == 2 and b.simulated and b.reason


def test_sim_file(tmp_path):
    path = tmp_path / "sim.json"
    path.write_text(json.dumps({"gpus": [
        {"name": "H100", "mem_total_mib": 81559, "mem_used_mib": 1000, "util": 50,
         "processes": [{"pid": 42, "mem_mib": 900, "sm": 40, "uid": 1000, "label": "python"}]},
        {"name": "H100", "mem_total_mib": 81559, "util": 0, "processes": []},
    ]}))
    b = open_backend({"BK_GPU_SIM_FILE": str(path), "BK_GPU_COUNT": "8"})
    devs = b.snapshot(0).gpus
    assert b.inventory().count == 2
    assert devs[0].processes[0].pid == 42 and devs[0].live_state() == "busy"
    assert devs[1].live_state() == "idle"
    # The file is read on every call so demos can change the "live" state.
    before = b.fingerprint()
    path.write_text(json.dumps({"gpus": [{"util": 99}]}))
    assert b.snapshot(0).gpus[0].util == 99
    assert b.fingerprint() != before      # an edited file is a new inventory


@pytest.mark.parametrize("doc, message", [
    ({}, "non-empty list"),
    ({"gpus": []}, "non-empty list"),
    ({"gpus": [1]}, "expected an object"),
    ({"gpus": [{"util": -1}]}, "util must be a whole number"),
    ({"gpus": [{"mem_total_mib": 0}]}, "mem_total_mib"),
    ({"gpus": [{"processes": [{"mem_mib": 1}]}]}, "integer pid"),
    ({"gpus": [{"processes": {}}]}, "must be a list"),
])
def test_bad_sim_files(tmp_path, doc, message):
    path = tmp_path / "sim.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=message):
        open_backend({"BK_GPU_SIM_FILE": str(path)}).snapshot(0)


def test_missing_or_garbage_sim_file(tmp_path):
    with pytest.raises(ConfigError, match="No such file"):
        open_backend({"BK_GPU_SIM_FILE": str(tmp_path / "nope.json")}).snapshot(0)
    (tmp_path / "g.json").write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        open_backend({"BK_GPU_SIM_FILE": str(tmp_path / "g.json")}).snapshot(0)


def test_gpus_simulated_on_purpose_are_no_fallback(tmp_path):
    """simulated_gpus: no driver is looked for and nothing calls it a fault;
    without it, a machine with no driver gets the reported stand-in."""
    from bk import gpu

    b = gpu.open_backend({"PATH": "/usr/bin:/bin"}, 3, simulated=True, proc_root=str(tmp_path))
    snap = b.snapshot(0)
    assert b.name == snap.source == gpu.SIMULATED and b.reason is None and snap.reason is None
    assert snap.simulated and len(snap.gpus) == 3 and b.fingerprint() == "simulated:3"
    fallback = gpu.open_backend({"PATH": "/usr/bin:/bin"}, 3, proc_root=str(tmp_path))
    assert fallback.name == "sim-count" and fallback.reason == gpu.NO_DRIVER_LOADED
    # The test variables still win over the configuration.
    assert gpu.open_backend({"BK_GPU_COUNT": "2"}, 3, simulated=True).name == "sim-count"


def test_power_and_energy_in_a_simulation_file(tmp_path):
    """The readings the activity state and the energy history use: given,
    they are read; left out, they are unknown (None), never 0, and not a gap."""
    import json

    (tmp_path / "g.json").write_text(json.dumps({"gpus": [
        {"util": 0, "processes": [], "power_mw": 71000, "power_limit_mw": 700000, "energy_mj": 123},
        {"util": 0, "processes": []}]}))
    snap = open_backend({"BK_GPU_SIM_FILE": str(tmp_path / "g.json")}).snapshot(0)
    assert [(g.power_mw, g.power_limit_mw, g.energy_mj) for g in snap.gpus] == [(71000, 700000, 123),
                                                                               (None, None, None)]
    assert "power" not in snap.gaps and "energy" not in snap.gaps
    (tmp_path / "g.json").write_text(json.dumps({"gpus": [{"energy_mj": -1}]}))
    with pytest.raises(ConfigError, match="energy_mj must be a whole number"):
        open_backend({"BK_GPU_SIM_FILE": str(tmp_path / "g.json")}).snapshot(0)
