"""The activity trace corpus (tests/traces/*.jsonl, written by
tests/traces/make_traces.py) replayed through the monitor with the real
NVML bindings against the fake libnvidia-ml.so.1, a fake /proc and a fake
clock (tests/helpers_traces.py): every booking that works is never
released nor nudged (0 false releases), every true idle is released (0
missed idles) within its threshold plus two minutes and never before, the
monitor gives the reasons each scenario is about, and the energy it
records is the counter's, shared without loss.

The table of outcomes: ``cd tests && LD_LIBRARY_PATH=DIR python3
helpers_traces.py - traces/*.jsonl`` (DIR: a build of the fake library)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import helpers_nvml
import pytest
from helpers_traces import verdict

HERE = Path(__file__).resolve().parent
TRACES = sorted((HERE / "traces").glob("*.jsonl"))

pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    if helpers_nvml.CC is None:
        pytest.skip("no C compiler")
    lib = helpers_nvml.build(tmp_path_factory.mktemp("fakenvml"))
    out = tmp_path_factory.mktemp("replay") / "results.json"
    env = dict(os.environ, LD_LIBRARY_PATH=str(lib), PYTHONPATH=str(HERE.parent))
    env.pop("FAKE_NVML_MODE", None)
    p = subprocess.run([sys.executable, str(HERE / "helpers_traces.py"), str(out), *map(str, TRACES)],
                       cwd=HERE, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(out.read_text())


def test_the_corpus_has_the_twelve_scenarios():
    names = {p.stem for p in TRACES}
    assert len(names) >= 12
    assert {"dataloader_stall", "dataset_download", "checkpoint_write", "cpu_evaluation", "idle_notebook",
            "spin_kernel", "stuck_utilisation", "reserved_memory", "true_idle_exclusive",
            "true_idle_shared_slot", "process_gone", "mps_client"} <= names


def test_the_traces_are_what_the_generator_writes(tmp_path):
    """The data files are the seeded generator's output, byte for byte (a
    hand edit of a trace would make its expectations a guess)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_traces", HERE / "traces" / "make_traces.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.HERE = tmp_path
    mod.main()
    for p in TRACES:
        assert (tmp_path / p.name).read_bytes() == p.read_bytes(), f"{p.name}: run tests/traces/make_traces.py"


@pytest.mark.parametrize("trace", [p.stem for p in TRACES])
def test_trace(results, trace):
    r = results[trace]
    for b in r["head"]["bookings"]:
        got = r["bookings"][b["id"]]
        kind, outcome = verdict(b, got)
        assert outcome == "ok", (trace, b["id"], kind, outcome, got)
        missing = set(b["reasons"]) - set(got["reasons"])
        assert not missing, (trace, b["id"], f"never said {sorted(missing)}", got["reasons"])
        if kind == "idle":
            nudge = b["expect"]["idle_from"] + 30 * 60
            assert nudge <= got["nudge30"] <= nudge + 120, (trace, b["id"], got)
            assert got["nudge45"] is not None and got["nudge45"] < got["release"], (trace, b["id"], got)
    e = r["energy"]
    assert e["balanced"], trace
    # every counter delta between two looks was recorded (the first look has none)
    assert e["recorded"] == e["counter"], (trace, e)
    assert r["snapshot_has_activity"], trace


def test_exclusive_bookings_get_their_gpus_energy(results):
    """true_idle_exclusive: one exclusive booking from minute 5: its energy
    is every delta from its start on (the first five minutes were nobody's)."""
    r = results["true_idle_exclusive"]["energy"]
    assert 0 < r["by_booking"]["b1"] < r["counter"]
    shared = results["true_idle_shared_slot"]["energy"]["by_booking"]
    assert shared["b1"] > 5 * shared["b2"] > 0           # the trainer pays for its work, the idle slot its share
