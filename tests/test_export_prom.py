"""Prometheus metrics: ``promtool check metrics`` finds nothing in what bk
writes, the in-repo lint of the naming rules passes on it and fails on
every broken example, label values survive hostile names, user names
appear only when the administrator allows them, the shipped Grafana
dashboard asks only for metrics bk exports, and a writer killed by SIGKILL
at random moments leaves the old textfile or the new one, never half."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers_export import rich, rid, world

from bk.export import prom
from bk.export.prom import BY_NAME, METRICS, lint, name_problems

ROOT = Path(__file__).resolve().parent.parent
NOW = 1_796_127_836
DASHBOARD = ROOT / "install" / "grafana-gpubk.json"


def _promtool(text: str) -> subprocess.CompletedProcess:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus; .ci/run installs it)")
    return subprocess.run([exe, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("user_names", [False, True])
def test_promtool_reports_nothing(user_names):
    text = prom.render(rich(NOW), user_names=user_names)
    got = _promtool(text)
    assert got.returncode == 0 and got.stdout == "" and got.stderr == "", (got, text)


def test_promtool_can_fail():
    """The check is real: promtool does complain about a counter without
    _total (so an empty report above means something)."""
    got = _promtool("# HELP gpubk_x A thing.\n# TYPE gpubk_x counter\ngpubk_x 1\n")
    assert got.returncode != 0 and "_total" in got.stdout + got.stderr


@pytest.mark.parametrize("user_names", [False, True])
def test_what_bk_writes_keeps_the_naming_rules(user_names):
    text = prom.render(rich(NOW), user_names=user_names)
    assert lint(text) == []
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")}
    assert names <= set(BY_NAME)
    # Every family of the rich world is there (a metric the renderer never
    # writes would be a documented lie), except the personal ones without names.
    expected = set(BY_NAME) - ({"gpubk_user_booked_gpus", "gpubk_user_booked_seconds_total",
                                 "gpubk_user_active_seconds_total", "gpubk_user_unreserved_seconds_total",
                                 "gpubk_user_energy_joules_total"} if not user_names else set())
    assert names == expected, sorted(expected - names)


def test_every_metric_of_the_table_has_a_good_name():
    for m in METRICS:
        assert name_problems(m.name, m.type) == [], m.name
        assert m.help.endswith(".") or m.help.endswith(")."), m.name


@pytest.mark.parametrize(("text", "expected"), [
    ("# HELP gpubk_x_seconds A.\n# TYPE gpubk_x_seconds counter\ngpubk_x_seconds 1\n", "without the _total"),
    ("# HELP gpubk_x_total A.\n# TYPE gpubk_x_total gauge\ngpubk_x_total 1\n", "ends with _total but is a gauge"),
    ("# HELP gpubk_mem_mib A.\n# TYPE gpubk_mem_mib gauge\ngpubk_mem_mib 1\n", "unit 'mib'"),
    ("# HELP gpubk_util_percent A.\n# TYPE gpubk_util_percent gauge\ngpubk_util_percent 1\n", "unit 'percent'"),
    ("# HELP gpubk_energy_mj_total A.\n# TYPE gpubk_energy_mj_total counter\ngpubk_energy_mj_total 1\n",
     "unit 'mj'"),
    ("# HELP gpubk_wait_milliseconds A.\n# TYPE gpubk_wait_milliseconds gauge\ngpubk_wait_milliseconds 1\n",
     "milliseconds"),
    ("# HELP gpubk_seconds_idle A.\n# TYPE gpubk_seconds_idle gauge\ngpubk_seconds_idle 1\n", "inside the name"),
    ("# HELP gpubk_start_timestamp A.\n# TYPE gpubk_start_timestamp gauge\ngpubk_start_timestamp 1\n",
     "_timestamp_seconds"),
    ("# HELP gpubk_x_ratio A.\n# TYPE gpubk_x_ratio gauge\ngpubk_x_ratio 1.5\n", "outside 0..1"),
    ("# HELP other_x A.\n# TYPE other_x gauge\nother_x 1\n", "application prefix"),
    ("# HELP gpubk_fooBar A.\n# TYPE gpubk_fooBar gauge\ngpubk_fooBar 1\n", "snake_case"),
    ("# TYPE gpubk_x gauge\ngpubk_x 1\n", "no HELP"),
    ("# HELP gpubk_x A.\ngpubk_x 1\n", "no TYPE"),
    ("gpubk_x 1\n", "without HELP and TYPE"),
    ('# HELP gpubk_x A.\n# TYPE gpubk_x gauge\ngpubk_x{a="1"} 1\ngpubk_x{a="1"} 2\n', "same series twice"),
    ('# HELP gpubk_x A.\n# TYPE gpubk_x gauge\ngpubk_x{a="\\t"} 1\n', "unknown escape"),
    ('# HELP gpubk_x A.\n# TYPE gpubk_x gauge\ngpubk_x{__a="1"} 1\n', "not a label name"),
    ('# HELP gpubk_x A.\n# TYPE gpubk_x gauge\ngpubk_x{a=1} 1\n', "not quoted"),
    ("# HELP gpubk_a A.\n# TYPE gpubk_a gauge\ngpubk_a 1\n# HELP gpubk_b B.\n# TYPE gpubk_b gauge\ngpubk_b 1\n"
     "gpubk_a 2\n", "not together"),
    ("# HELP gpubk_x A.\n# TYPE gpubk_x gauge\ngpubk_x 1", "does not end with a line feed"),
    ("# HELP gpubk_x A.\n# TYPE gpubk_x gauge\ngpubk_x one\n", "not a sample line"),
    ("# HELP gpubk_x_count A.\n# TYPE gpubk_x_count gauge\ngpubk_x_count 1\n", "histograms and summaries own"),
])
def test_the_lint_catches_each_rule(text, expected):
    problems = lint(text)
    assert any(expected in p for p in problems), problems


def _unescape(raw: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "\\": "\\", '"': '"'}[m.group(1)], raw)


def test_hostile_label_values_round_trip():
    hostile = 'eve "\\evil"\nnext} 1\ngpubk_fake 2'
    text = prom.render(rich(NOW, hostile=hostile), user_names=True)
    assert lint(text) == []
    assert "\ngpubk_fake" not in text                    # no injected sample
    from bk.export.prom import _parse_sample

    users = {_unescape(v) for line in text.splitlines() if line.startswith("gpubk_booking_info")
             for k, v in _parse_sample(line)[1] if k == "user"}
    assert hostile in users


def test_user_names_only_where_the_administrator_allows_them():
    plain = prom.render(rich(NOW))
    assert 'user="' not in plain and "gpubk_user_" not in plain
    assert "ada" not in plain and "bob" not in plain and "mallory" not in plain
    named = prom.render(rich(NOW), user_names=True)
    assert f'gpubk_booking_info{{reservation="{rid(1)}",user="ada",mode="shared"}} 1' in named
    assert 'gpubk_user_unreserved_seconds_total{user="mallory"} 600' in named


def test_values_are_base_units_and_join_on_dcgm_labels():
    text = prom.render(rich(NOW), user_names=True)
    uuid0 = "GPU-5133d000-0000-4000-8000-000000000000"
    # Joules from millijoules; the shared GPU half booked by each of two bookings.
    assert f'gpubk_gpu_energy_joules_total{{gpu="0",UUID="{uuid0}"}} 3600000.5' in text
    assert f'gpubk_gpu_booked_ratio{{gpu="0",UUID="{uuid0}"}} 1' in text
    assert f'gpubk_gpu_used_ratio{{gpu="0",UUID="{uuid0}"}} 0.5' in text       # one of the two is active
    assert f'gpubk_gpu_unreserved_processes{{gpu="0",UUID="{uuid0}"}} 1' in text
    assert f'gpubk_booking_idle_seconds{{reservation="{rid(2)}",user="bob"}} 2110' in text
    assert 'gpubk_bookings{status="active"} 3' in text and 'gpubk_bookings{status="upcoming"} 1' in text
    assert f"gpubk_gpu_next_booking_timestamp_seconds{{gpu=\"1\",UUID=\"{uuid0[:-1]}1\"}} {NOW + 5 * 3600}" in text
    assert 'gpubk_monitor_state{state="running"} 1' in text
    assert "gpubk_maintenance_active 0" in text


def test_without_a_history_the_counters_are_left_out():
    text = prom.render(world(NOW))
    assert "_seconds_total{" not in text and "energy_joules_total" not in text
    assert lint(text) == []


# ------------------------------------------------------------- the dashboard

def _exprs(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "expr" and isinstance(v, str):
                yield v
            else:
                yield from _exprs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _exprs(v)


def test_the_grafana_dashboard_uses_exactly_the_exported_metrics():
    doc = json.loads(DASHBOARD.read_text())
    exprs = list(_exprs(doc))
    assert exprs, "the dashboard has no queries"
    used = set()
    for e in exprs:
        # Metric names: anything that starts like bk's, and any selector NAME{...}
        # (a DCGM or node series would be one; label names never stand before a brace).
        names = set(re.findall(r"\b(gpubk_[a-z_]+)\b", e)) | set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{", e))
        for n in names:
            assert n in BY_NAME, f"the dashboard asks for {n}, which bk does not export: {e}"
            used.add(n)
    core = {"gpubk_gpu_booked_ratio", "gpubk_gpu_used_ratio", "gpubk_bookings", "gpubk_booking_idle_seconds",
            "gpubk_gpu_unreserved_processes", "gpubk_gpu_energy_joules_total", "gpubk_monitor_state"}
    assert core <= used, sorted(core - used)
    assert doc.get("uid") and doc.get("title")


def test_telemetry_md_lists_exactly_the_metrics_bk_exports():
    """docs/TELEMETRY.md section 7's table is what an administrator reads to
    write a query: every metric, its type, labels and meaning, and no other."""
    from bk.export.prom import METRICS

    text = (Path(__file__).resolve().parents[1] / "docs" / "TELEMETRY.md").read_text(encoding="utf-8")
    rows = {}
    for line in text.splitlines():
        m = re.fullmatch(r"\| `(gpubk_[a-z_]+)` \| (gauge|counter) \| ([^|]*) \| (.*) \|", line)
        if m:
            rows[m.group(1)] = (m.group(2), tuple(re.findall(r"`([A-Za-z_]+)`", m.group(3))), m.group(4))
    assert set(rows) == {m.name for m in METRICS}, set(rows) ^ {m.name for m in METRICS}
    for metric in METRICS:
        kind, labels, meaning = rows[metric.name]
        assert kind == metric.type and meaning == metric.help, metric.name
        assert set(metric.labels) <= set(labels) and (set(labels) - set(metric.labels) <= {"user"}), metric.name
        assert ("user" in labels) == ("user" in metric.labels or metric.personal), metric.name


# ------------------------------------------------------------- SIGKILL

WRITER = r"""
import sys
sys.path.insert(0, sys.argv[1])
from bk.store.publish import publish
directory, versions = sys.argv[2], [open(p, "rb").read() for p in sys.argv[3:]]
print("ready", flush=True)
i = 0
while True:
    publish(directory, "gpubk.prom", versions[i % len(versions)])
    i += 1
"""


@pytest.mark.slow
def test_sigkill_during_the_write_leaves_the_old_file_or_the_new(tmp_path):
    seed = int(os.environ.get("BK_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"seed {seed} (BK_TEST_SEED={seed} replays it)")
    # Versions of different sizes (one big: a write takes long enough to be cut).
    versions = [prom.render(rich(NOW + i), user_names=bool(i % 2)).encode() for i in range(3)]
    versions.append(versions[0] * 40)
    paths = []
    for i, v in enumerate(versions):
        p = tmp_path / f"v{i}"
        p.write_bytes(v)
        paths.append(str(p))
    out = tmp_path / "textfile"
    out.mkdir(mode=0o755)
    target = out / "gpubk.prom"
    for round_ in range(25):
        w = subprocess.Popen([sys.executable, "-c", WRITER, str(ROOT), str(out), *paths], stdout=subprocess.PIPE,
                             text=True)
        try:
            assert w.stdout.readline().strip() == "ready"
            deadline = time.monotonic() + rng.uniform(0.0, 0.05)
            while time.monotonic() < deadline:       # readers meanwhile see whole versions only
                if target.exists():
                    assert target.read_bytes() in versions
            w.send_signal(signal.SIGKILL)
            w.wait(30)
        finally:
            if w.poll() is None:
                w.kill()
                w.wait(30)
        if target.exists():
            got = target.read_bytes()
            assert got in versions, f"round {round_} (seed {seed}): a file that is no version"
            assert lint(got.decode()) == [] or got == versions[3]
    # The killed writers' temp files are never *.prom (node_exporter skips
    # them), and the next writer's first write clears them.
    left = [n for n in os.listdir(out) if n != "gpubk.prom"]
    assert all(n.startswith(".gpubk.prom.tmp-") and not n.endswith(".prom") for n in left)
    from bk.store.publish import clear_leftovers

    clear_leftovers(str(out), ("gpubk.prom",))
    assert os.listdir(out) in ([], ["gpubk.prom"])


# ------------------------------------------------------------- bk export prom --listen

@pytest.mark.slow
def test_listen_serves_the_metrics_on_loopback_and_refuses_elsewhere(pyz, tmp_path):
    import urllib.error
    import urllib.request

    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "TZ": "UTC",
           "BK_DATA_DIR": str(tmp_path / "d"), "BK_GPU_COUNT": "2", "XDG_CACHE_HOME": str(tmp_path / "c")}
    made = subprocess.run([sys.executable, str(pyz), "1", "1h"], env=env, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    refused = subprocess.run([sys.executable, str(pyz), "--json", "export", "prom", "--listen", "0.0.0.0:0"],
                             env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--allow-remote" in json.loads(refused.stdout)["error"]["hint"]
    p = subprocess.Popen([sys.executable, str(pyz), "export", "prom", "--listen", "127.0.0.1:0"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", line)
        assert m, line
        url = f"http://127.0.0.1:{m.group(1)}"
        with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
            assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            first = r.read().decode()
        assert lint(first) == [] and 'gpubk_bookings{status="active"} 1' in first
        # A second scrape is made afresh (its own timestamp line, same families).
        with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
            assert lint(r.read().decode()) == []
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url + "/other", timeout=30)
        assert e.value.code == 404
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(30)
