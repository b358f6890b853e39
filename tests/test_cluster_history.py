"""Usage history across nodes: ``bk c export`` copies a node's sealed,
verified days into its own namespace (incrementally), and ``bk c history``
reads every namespace with the catalog's names and people."""

from __future__ import annotations

import json
import os
import time

import pytest

from bk.cli import app as cli_app
from bk.cluster import catalog as cat
from bk.cluster import history
from bk.core.usage import DAY, MinuteRecord, Use
from bk.store import usage as su
from bk.store.usage import UsageStore

T0 = int(time.time()) // DAY * DAY - 10 * DAY          # a UTC midnight ten days ago


def records(day: int, uid: int, minutes: int, active: int) -> list[MinuteRecord]:
    return [MinuteRecord(day + 60 * i, 0, 60, 60, 60, 50.0, 1, 100, 0,
                         (Use(uid, f"r{uid}", "shared", 60, active, 0, 50.0, 1, 100),))
            for i in range(minutes)]


def seed(data_dir, uid: int, minutes: int) -> UsageStore:
    store = UsageStore(str(data_dir / "usage"))
    store.append(records(T0, uid, minutes, 60) + records(T0 + DAY, uid, minutes, 0) + records(T0 + 2 * DAY, uid, 1, 0),
                 now=T0 + 2 * DAY + su.SEAL_GRACE)
    store.maintain(T0 + 2 * DAY + su.SEAL_GRACE)
    return store


def run_bk(capsys, *argv, env):
    capsys.readouterr()
    code = cli_app.run([*argv, "--json"], env)
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture
def env_of(tmp_path):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}

    def make(name: str) -> dict:
        d = tmp_path / name
        d.mkdir(mode=0o700)
        return {**base, "BK_DATA_DIR": str(d), "BK_GPU_COUNT": "2", "HOME": str(tmp_path)}
    return make


def test_export_is_verified_incremental_and_per_node(capsys, env_of, tmp_path):
    a, b = env_of("a"), env_of("b")
    seed(tmp_path / "a", 1000, 30)
    seed(tmp_path / "b", 1001, 90)
    shared = tmp_path / "shared"
    shared.mkdir()
    code, out = run_bk(capsys, "c", "export", str(shared), env=a)
    assert code == 0, out
    a_id = out["data"]["node_id"]
    assert sorted(out["data"]["copied"]) == [f"raw/{su.day_name(T0)}", f"raw/{su.day_name(T0 + DAY)}"]
    code, out = run_bk(capsys, "c", "export", str(shared), env=a)
    assert code == 0 and out["data"]["copied"] == [] and out["data"]["unchanged"] == 2
    code, out = run_bk(capsys, "c", "export", str(shared), env=b)
    b_id = out["data"]["node_id"]
    assert a_id != b_id and sorted(os.listdir(shared)) == sorted([a_id, b_id])
    meta = json.loads((shared / a_id / "node.json").read_text())
    assert meta["id"] == a_id and meta["exported_at"]
    # A day tampered with on the node is not exported (again).
    day = tmp_path / "b" / "usage" / "raw" / f"{su.day_name(T0)}.jsonl"
    day.write_bytes(day.read_bytes().replace(b'"active_s":60', b'"active_s":61', 1))
    os.remove(shared / b_id / "usage" / "raw" / f"{su.day_name(T0)}.seal")
    code, out = run_bk(capsys, "c", "export", str(shared), env=b)
    assert code == 1 and out["data"]["refused"][0]["day"] == f"raw/{su.day_name(T0)}"
    assert not (shared / b_id / "usage" / "raw" / f"{su.day_name(T0)}.seal").exists()


def test_history_reads_every_namespace_with_names_and_people(capsys, env_of, tmp_path):
    a, b = env_of("a"), env_of("b")
    seed(tmp_path / "a", 1000, 30)
    seed(tmp_path / "b", 1001, 90)
    shared = tmp_path / "shared"
    shared.mkdir()
    ids = [run_bk(capsys, "c", "export", str(shared), env=e)[1]["data"]["node_id"] for e in (a, b)]
    catalog = cat.parse({"nodes": {"gpu-a": {"id": ids[0], "target": "a"}, "gpu-b": {"id": ids[1], "target": "b"}},
                         "people": {"gpu-a": {"1000": "alice"}, "gpu-b": {"1001": "alice"}}}, "test")
    h = history.read(str(shared), catalog, T0, T0 + 2 * DAY).to_json()
    rows = {(u["node"], u["uid"]): u for u in h["users"]}
    assert rows[("gpu-a", 1000)]["booked_s"] == 2 * 30 * 60 and rows[("gpu-a", 1000)]["active_s"] == 30 * 60
    assert rows[("gpu-b", 1001)]["booked_s"] == 2 * 90 * 60
    (alice,) = h["people"]
    assert alice["person"] == "alice" and alice["booked_s"] == 2 * 120 * 60
    assert sorted(alice["nodes"]) == ["gpu-a", "gpu-b"]
    assert all(n["problems"] == [] for n in h["nodes"])


def test_history_command_needs_a_directory(capsys, env_of, tmp_path):
    e = {**env_of("c"), "BK_CLUSTER_FILE": str(tmp_path / "none.json")}
    code, out = run_bk(capsys, "c", "history", env=e)
    assert code == 2 and "export directory" in out["error"]["message"]
    shared = tmp_path / "shared"
    shared.mkdir()
    code, out = run_bk(capsys, "c", "history", str(shared), "--since", "30d", env=e)
    assert code == 0 and out["data"]["users"] == []
