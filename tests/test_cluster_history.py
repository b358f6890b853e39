"""Usage history across nodes: ``bk c export`` copies a node's sealed,
verified days into its own namespace (incrementally), and ``bk c history``
reads every namespace with the catalog's names and people."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from bk.cli import app as cli_app
from bk.cluster import catalog as cat
from bk.cluster import history
from bk.core.errors import ConfigError
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


# ------------------------------------------- trust: owners and links (issue 22, item 8)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (real second accounts)")


@pytest.fixture
def people(pyz):
    """A root-owned 0755 base with the archive, an account that exports
    (``exporter``, with its own sealed history) and another user
    (``mallory``), and a shared directory anyone may write (sticky 1777)."""
    import shutil
    import subprocess

    from helpers_broker import Accounts, make_base

    base = make_base()
    accounts = Accounts(base)
    try:
        exporter, mallory = accounts.user(), accounts.user()
        shutil.copy(pyz, base / "bk.pyz")
        os.chmod(base / "bk.pyz", 0o644)
        data = base / "exporter-data"
        data.mkdir(mode=0o700)
        seed(data, 1000, 30)
        subprocess.run(["chown", "-R", f"{exporter.uid}:{exporter.gid}", str(data)], check=True)
        shared = base / "shared"
        shared.mkdir()
        os.chmod(shared, 0o1777)
        yield {"base": base, "exporter": exporter, "mallory": mallory, "data": data, "shared": shared}
    finally:
        accounts.cleanup()
        subprocess.run(["rm", "-rf", str(base)], check=False)


def as_user(people, who, *argv, env_extra=None):
    import subprocess

    u = people[who]
    env = {"PATH": "/usr/bin:/bin", "HOME": u.home, "LANG": "C.UTF-8", "BK_GPU_COUNT": "2",
           "BK_DATA_DIR": str(people["data"]) if who == "exporter" else f"{u.home}/data", **(env_extra or {})}
    p = subprocess.run(["/usr/bin/python3", str(people["base"] / "bk.pyz"), *argv, "--json"], capture_output=True,
                       text=True, env=env, user=u.uid, group=u.gid, extra_groups=[], cwd=u.home, timeout=120)
    return p.returncode, json.loads(p.stdout)


def _catalog(people, nid, owners):
    path = people["base"] / "cluster.json"
    path.write_text(json.dumps({"version": 1, "nodes": {"gpu-a": {"id": nid, "target": "a"}},
                                "history_owners": owners}))
    os.chmod(path, 0o644)
    return path


@needs_root
def test_history_counts_only_namespaces_its_exporters_own(people):
    import shutil
    import subprocess

    code, out = as_user(people, "exporter", "c", "export", str(people["shared"]))
    assert code == 0 and out["data"]["copied"], out
    nid = out["data"]["node_id"]
    exporter, mallory = people["exporter"], people["mallory"]
    cat_path = _catalog(people, nid, [exporter.name])
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))},
           "BK_CLUSTER_FILE": str(cat_path)}

    def history():
        p = subprocess.run([sys.executable, str(people["base"] / "bk.pyz"), "c", "history", str(people["shared"]),
                            "--since", "30d", "--json"], env=env, capture_output=True, text=True, timeout=120)
        return p.returncode, json.loads(p.stdout)["data"]

    code, h = history()
    assert code == 0 and [u["uid"] for u in h["users"]] == [1000], h
    # Mallory files a forged history (seals and all) under another node id
    # of the catalog, and replaces the genuine one she cannot change: an
    # owner the catalog does not name is reported and not counted.
    forged_id = "d-" + "f" * 24
    shutil.copytree(people["shared"] / nid, people["shared"] / forged_id)
    subprocess.run(["chown", "-R", f"{mallory.uid}:{mallory.gid}", str(people["shared"] / forged_id)], check=True)
    meta = people["shared"] / forged_id / "node.json"
    meta.write_text(meta.read_text().replace(nid, forged_id))
    cat_path.write_text(json.dumps({"version": 1, "nodes": {"gpu-a": {"id": nid, "target": "a"},
                                                            "gpu-f": {"id": forged_id, "target": "f"}},
                                    "history_owners": [exporter.name]}))
    code, h = history()
    rows = {n["id"]: n for n in h["nodes"]}
    assert code == 1 and [u["node"] for u in h["users"]] == ["gpu-a"], h
    assert f"owned by uid {mallory.uid}" in rows[forged_id]["problems"][0]
    # A link filed under a node id is not followed (here: to the genuine one).
    shutil.rmtree(people["shared"] / forged_id)
    os.symlink(people["shared"] / nid, people["shared"] / forged_id)
    os.lchown(people["shared"] / forged_id, mallory.uid, mallory.gid)
    code, h = history()
    rows = {n["id"]: n for n in h["nodes"]}
    assert code == 1 and "symbolic link" in rows[forged_id]["problems"][0]
    assert [u["node"] for u in h["users"]] == ["gpu-a"]
    # A genuine namespace filed under the wrong id (renamed by whoever can
    # write the shared directory) is not counted either.
    os.unlink(people["shared"] / forged_id)
    os.rename(people["shared"] / nid, people["shared"] / forged_id)
    code, h = history()
    assert code == 1 and h["users"] == [] and "holds the export of" in h["nodes"][0]["problems"][0], h
    os.rename(people["shared"] / forged_id, people["shared"] / nid)
    # Without the exporter in history_owners its namespace is not trusted.
    _catalog(people, nid, [])
    code, h = history()
    assert code == 1 and h["users"] == [] and "history_owners" in h["nodes"][0]["problems"][0]


@needs_root
def test_export_never_writes_through_a_link_or_a_namespace_someone_else_made(people):
    code, ident = as_user(people, "exporter", "c", "id")
    nid = ident["data"]["id"]
    shared, mallory, data = people["shared"], people["mallory"], people["data"]
    before = sorted(os.listdir(data))
    # Mallory points the exporter's namespace at the exporter's own data directory.
    os.symlink(data, shared / nid)
    os.lchown(shared / nid, mallory.uid, mallory.gid)
    code, out = as_user(people, "exporter", "c", "export", str(shared))
    assert code == 78 and "symbolic link" in out["error"]["message"], out
    assert sorted(os.listdir(data)) == before and not (data / "node.json").exists()
    os.unlink(shared / nid)
    # ... or makes the namespace herself, to fill it later.
    (shared / nid).mkdir()
    os.chown(shared / nid, mallory.uid, mallory.gid)
    code, out = as_user(people, "exporter", "c", "export", str(shared))
    assert code == 78 and f"owned by uid {mallory.uid}" in out["error"]["message"], out
    assert os.listdir(shared / nid) == []
    os.rmdir(shared / nid)
    # ... or hands it a path through a link of hers.
    link = people["base"] / "via-mallory"
    os.symlink(data, link)
    os.lchown(link, mallory.uid, mallory.gid)
    code, out = as_user(people, "exporter", "c", "export", str(link))
    assert code == 78 and "owned by uid" in out["error"]["message"], out
    assert sorted(os.listdir(data)) == before
    # The plain case still works, and a link root made is followed.
    os.symlink(shared, people["base"] / "via-root")
    code, out = as_user(people, "exporter", "c", "export", str(people["base"] / "via-root"))
    assert code == 0 and out["data"]["copied"], out
    assert os.stat(shared / nid).st_uid == people["exporter"].uid


def test_history_owners_in_the_catalog_are_checked_and_resolved():
    c = cat.parse({"nodes": {}, "history_owners": ["root", 4242, "no-such-account-here"]}, "test")
    assert c.history_owners == ("root", 4242, "no-such-account-here")
    assert c.history_owner_uids() == {0: "root", 4242: "4242"}
    assert cat.parse({"nodes": {}}, "test").history_owners is None     # the default: gpubk
    for bad in ("gpubk", ["a b"], [-1], [True], [{"name": "x"}]):
        with pytest.raises(ConfigError, match="history_owners"):
            cat.parse({"nodes": {}, "history_owners": bad}, "test")
    again = cat.parse(json.loads(json.dumps(c.to_json())), "test")
    assert again.history_owners == c.history_owners and again.with_node(
        cat.NodeEntry("a", "d-" + "a" * 24, "a")).history_owners == c.history_owners


@pytest.mark.skipif(os.geteuid() != 0, reason="writes a root-owned catalog")
def test_admin_cluster_init_sets_the_history_owners(capsys, tmp_path):
    os.chmod(tmp_path, 0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env["BK_CLUSTER_FILE"] = str(tmp_path / "etc" / "cluster.json")
    code, out = run_bk(capsys, "admin", "cluster", "init", "--history-dir", "/shared/h", "--history-owner", "root",
                       "--history-owner", "4242", "--yes", env=env)
    assert code == 0, out
    doc = json.loads((tmp_path / "etc" / "cluster.json").read_text())
    assert doc["history_owners"] == ["root", 4242] and doc["history_dir"] == "/shared/h"
    code, out = run_bk(capsys, "admin", "cluster", "init", "--yes", env=env)      # kept when not given
    assert json.loads((tmp_path / "etc" / "cluster.json").read_text())["history_owners"] == ["root", 4242]
    code, out = run_bk(capsys, "admin", "cluster", "init", "--history-owner", "Bad Name", env=env)
    assert code == 2 and "--history-owner 'Bad Name'" in out["error"]["message"]
