"""The service seams (issue 9): what each command asks of the GPUs, the
operation table as the one list of operations, and the broker's JSON as the
private service's JSON."""

from __future__ import annotations

import os

import pytest
from helpers_cli import BOB, SIM_GPUS, bk_fixture

from bk.core.errors import InvalidInput
from bk.gpu import sim
from bk.service import ops
from bk.service.requests import BookRequest


@pytest.fixture
def bk(monkeypatch, capsys):
    yield from bk_fixture(monkeypatch, capsys)


class Counting:
    """Wraps the real backend ``open_backend`` returns and counts the
    questions that cost a driver call (inventory, snapshot)."""

    calls: list[str] = []

    def __init__(self, inner):
        self.inner = inner
        self.name, self.simulated, self.reason = inner.name, inner.simulated, inner.reason

    def fingerprint(self):
        return self.inner.fingerprint()

    def static_inventory(self):          # free by contract: no I/O, no driver
        return self.inner.static_inventory()

    def inventory(self):
        Counting.calls.append("inventory")
        return self.inner.inventory()

    def snapshot(self, now):
        Counting.calls.append("snapshot")
        return self.inner.snapshot(now)


@pytest.fixture
def counted(bk, monkeypatch):
    import bk.gpu as gpu

    real = gpu.open_backend
    monkeypatch.setattr(gpu, "open_backend", lambda env, *a, **kw: Counting(real(env, *a, **kw)))
    Counting.calls = []
    return Counting.calls


@pytest.mark.parametrize("sim_file", [False, True], ids=["count", "sim-file"])
def test_reads_that_need_nothing_live_never_ask_the_backend(bk, counted, sim_file):
    if sim_file:
        bk.sim(SIM_GPUS)
    bk.ok("1", "1h", "-m", "8g")          # a booking takes a snapshot (placement), and caches the inventory
    bk.ok("1", "30m", "-t", "+2h")
    assert "snapshot" in counted
    bk.service(BOB).run("book", BookRequest(count=1, duration=3600))
    counted.clear()
    listed = bk.data("l")
    assert counted == [], "bk l asked the GPU backend"
    if sim_file:   # memory totals still come through, from the cached inventory
        assert listed["reservations"][0]["mem_mib_effective"] == 8192
        assert listed["reservations"][1]["mem_mib_effective"] is not None
    bk.ok("l", "--all")
    bk.ok("e", "2", "-d", "1h")
    bk.ok("e", "1", "-d", "+30m")
    bk.ok("history", "1")
    bk.ok("n")
    bk.ok("d", "2")
    assert counted == [], f"a read or an edit asked the GPU backend: {counted}"
    bk.ok("st")
    assert counted == ["snapshot"]          # one look per command, never one per row


def test_an_edited_simulation_is_a_new_inventory(bk, counted):
    path = bk.sim(SIM_GPUS)
    bk.ok("st")
    doc = {"gpus": [dict(g, mem_total_mib=40960) for g in SIM_GPUS["gpus"]]}
    path.write_text(__import__("json").dumps(doc) + " " * 7)     # another size: another fingerprint
    bk.ok("1", "1h")
    counted.clear()
    assert bk.data("l")["reservations"][0]["mem_mib_effective"] is not None
    assert counted == []


# ----------------------------------------------------------- the operation table

SERVED = {"book", "edit", "cancel", "notice_publish", "notice_archive", "job_state", "data_lost", "data_recover",
          "audit", "probe", "ping",
          # the administrator's (bk.cli.cmd_admin_maintain, _notice, _policy run them with Service.run)
          "blackout_add", "blackout_end", "notice_edit", "policy_bind",
          # the agent's write (bk.agent's cleanup tool)
          "cleanup"}
# The reads every front end makes, and changes to the caller's own private
# files: run in the caller's own process, never by the broker.
LOCAL = {"list", "notices", "status", "login", "context", "timeline", "info", "config", "doctor", "resolve",
         "op_lookup", "history", "recommend", "gpu", "usage", "usage_users", "usage_samples", "usage_events",
         "usage_verify", "jobs", "job_log", "job_retry", "worker_status", "presets", "preset", "preset_delete",
         "defaults", "prompt_history", "blackouts", "notice_list", "data_backup", "data_verify", "data_clear",
         "data_restore",
         # the caller's own notification settings, terminals and log (bk.service.notify)
         "notify_show", "notify_set", "notify_test", "notify_log",
         # bk export (bk.service.exports)
         "export"}
# Of those, the ones that change something: notify_set writes the caller's
# own settings file, as preset_delete their presets (no ledger, no broker).
LOCAL_WRITES = {"job_retry", "preset_delete", "data_backup", "data_clear", "data_restore", "notify_set"}
# Rows that take this process's environment, run a program, or carry
# in-process values: no field spec, never sent to a broker.  A cluster node
# serves one of them, book_job, finishing its request itself (below).
IN_PROCESS = {"book_job", "run_target", "run_now", "worker", "worker_hint", "adopt", "screen", "export_page",
              "preset_save", "preset_hint", "prompt_history_save", "policy", "policy_write", "policy_rebind"}


def test_every_row_is_complete():
    from bk.core import record

    assert set(ops.OPERATIONS) == SERVED | LOCAL | IN_PROCESS
    assert {n for n, op in ops.OPERATIONS.items() if op.served} == SERVED
    assert {n for n, op in ops.OPERATIONS.items() if op.fields is None} == IN_PROCESS
    # A local row that changes something is a WRITE: the caller's own
    # private files (a preset, the notification settings, a retried job's
    # state through its own worker) or the data directory as a whole; every
    # other local row only reads.
    assert {n for n in LOCAL if ops.OPERATIONS[n].access == ops.WRITE} == LOCAL_WRITES
    for op in ops.OPERATIONS.values():
        assert op.access in (ops.READ, ops.WRITE) and op.who in (ops.ANYONE, ops.OWNER, ops.ADMIN, ops.HOST)
        if op.served and op.access == ops.WRITE:
            assert op.apply is not None and op.serve is None, op.name
        else:        # a host's read, or a local row (read or write): served here or in the caller
            assert op.serve is not None and op.apply is None, op.name
        if op.who in (ops.ADMIN, ops.HOST):
            assert op.admin_hint, op.name
        assert not op.accepts_loss or op.access == ops.WRITE
        assert op.result is not None and callable(getattr(op.result, "to_json", None)), op.name
        if op.fields is None:
            with pytest.raises(InvalidInput, match="runs only in the caller's own process"):
                op.decode({})
            continue
        spec = {f.name for f in op.fields}
        assert spec == {f.name for f in record.fields(op.request)}, f"{op.name}: spec and request differ"
        schema = op.schema()
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        assert set(schema["properties"]) == spec


def test_a_cluster_node_serves_everyday_rows_and_finishes_only_book_job_itself():
    """A node's rows are the caller's everyday ones; of those only book_job
    has no field spec (the node makes it from the book row's fields, the
    command and its own directory: bk.cluster.serve), and each names the
    release since which nodes serve it."""
    from bk.cluster.serve import NODE_ROWS
    from bk.service import ROWS_SINCE, version_tuple

    assert NODE_ROWS <= set(ops.OPERATIONS) and not NODE_ROWS & (SERVED - {"book", "edit", "cancel"})
    assert {n for n in NODE_ROWS if ops.OPERATIONS[n].fields is None} == {"book_job"}
    assert all(version_tuple(ops.OPERATIONS[n].since) >= version_tuple(ROWS_SINCE) for n in NODE_ROWS)


def test_every_service_write_is_a_row(tmp_path):
    """The Service's write methods are nothing but rows: a recording gateway
    sees each one's operation by name."""
    from bk.service import open_app
    from bk.service.requests import (
        AuditRequest,
        CancelRequest,
        EditRequest,
        Empty,
        NoticeArchiveRequest,
        NoticeRequest,
    )

    env = {"BK_DATA_DIR": str(tmp_path / "d"), "HOME": str(tmp_path), "BK_GPU_COUNT": "2",
           "XDG_CACHE_HOME": str(tmp_path / "c")}
    app = open_app(env)
    seen = []

    class Recorder:
        def run(self, op, req, call):
            seen.append((op.name, type(req)))
            if op.name == "data_lost":
                from bk.service.results import LostResult

                return LostResult(0, 0, (), "nothing_lost")
    app.gateway = Recorder()
    app.run("book", BookRequest(1, 60))
    app.run("edit", EditRequest("x" * 8))
    app.run("cancel", CancelRequest("x" * 8))
    app.run("notice_publish", NoticeRequest("hi"))
    app.run("notice_archive", NoticeArchiveRequest("abcd"))
    app.run("audit", AuditRequest())
    assert [n for n, _ in seen] == ["book", "edit", "cancel", "notice_publish", "notice_archive", "audit"]
    assert all(ops.OPERATIONS[n].request is t for n, t in seen)
    app.run("data_lost", Empty())
    assert seen[-1][0] == "data_lost"
    # job_state: the worker's row, which bk.service.jobs runs with Service.run.
    # The administrator's maintenance, notice edit and policy binding rows, likewise.
    assert {op.name for op in ops.writes() if op.served} == {n for n, _ in seen[:5]} | {"data_recover", "job_state"} \
        | {"blackout_add", "blackout_end", "notice_edit", "policy_bind", "cleanup"}


def test_a_write_without_a_row_cannot_be_dispatched(tmp_path, monkeypatch):
    from bk.broker.handlers import Dispatcher, Peer
    from bk.service import open_app

    env = {"BK_DATA_DIR": str(tmp_path / "d"), "HOME": str(tmp_path), "BK_GPU_COUNT": "2",
           "XDG_CACHE_HOME": str(tmp_path / "c")}
    app = open_app(env)
    d = Dispatcher(app)
    peer = Peer(1, os.geteuid(), os.getegid())
    assert d.dispatch({"op": "book", "fields": {"count": 1, "duration": 1800}}, peer)["ok"]
    monkeypatch.delitem(ops.OPERATIONS, "book")
    reply = d.dispatch({"op": "book", "fields": {"count": 1, "duration": 1800}}, peer)
    assert reply["error"]["code"] == "invalid_input" and "unknown operation" in reply["error"]["message"]
    with pytest.raises(InvalidInput, match="unknown operation"):
        app.run("book", BookRequest(1, 1800))
    assert len(app.ledger().reservations) == 1


def test_admin_rows_are_refused_centrally_for_everyone_else(tmp_path):
    from bk.core.errors import PermissionDenied
    from bk.service import open_app
    from bk.service.requests import NoticeRequest

    env = {"BK_DATA_DIR": str(tmp_path / "d"), "HOME": str(tmp_path), "BK_GPU_COUNT": "2",
           "XDG_CACHE_HOME": str(tmp_path / "c")}
    app = open_app(env, actor=BOB)
    with pytest.raises(PermissionDenied, match="only the administrator") as e:
        app.run("notice_publish", NoticeRequest("hello"))
    assert e.value.hint == ops.OPERATIONS["notice_publish"].admin_hint


def test_encode_decode_round_trip_through_the_spec():
    req = BookRequest(count=2, duration=3600, pinned=(0, 1), note="n", op_id="k")
    op = ops.get("book")
    assert op.decode(op.encode(req)) == req
    with pytest.raises(InvalidInput):
        op.encode(ops.get("cancel").decode({"ref": "abcd"}))


def test_sim_count_inventory_and_snapshot_say_what_they_lack():
    b = sim.CountBackend(2)
    snap = b.snapshot(5)
    assert snap.taken_at == 5 and snap.source == "sim-count" and "processes" in snap.gaps
    assert b.inventory().count == 2 and b.fingerprint() == "sim-count:2"


def test_open_app_takes_injected_telemetry(tmp_path):
    """A fixed snapshot stands in for the GPUs: no backend is ever opened."""
    from bk.core.models import GpuInfo, GpuProcess
    from bk.core.telemetry import Inventory, Snapshot
    from bk.service import StatusRequest, open_app
    from bk.service.telemetry import Fixed

    gpus = (GpuInfo(0, "GPU-a", "Test", mem_total_mib=1024, util=50,
                    processes=[GpuProcess(7, mem_mib=100, uid=4321, user="eve", label="python")]),
            GpuInfo(1, "GPU-b", "Test", mem_total_mib=1024, util=0, processes=[]))
    fixed = Fixed(Snapshot(5, "test", gpus), Inventory("test", gpus, simulated=False))
    env = {"BK_DATA_DIR": str(tmp_path / "d"), "HOME": str(tmp_path), "BK_GPU_SIM_FILE": "/nonexistent",
           "XDG_CACHE_HOME": str(tmp_path / "c")}
    app = open_app(env, telemetry=fixed, actor=BOB)
    call = app.call()
    got = app.run("book", BookRequest(count=1, duration=1800, pinned=(0,)), call=call)
    assert got.reservation.gpus == (0,)
    # One attribution for both: the booking warns about eve's process, and
    # status calls it unreserved (eve has no booking).
    assert call.warnings == ["GPU 0 is in use right now by a process of eve without a booking there (100 MiB)"]
    view = app.run("status", StatusRequest()).to_json()
    assert view["backend"] == {"name": "test", "simulated": True}
    assert [p["state"] for p in view["gpus"][0]["processes"]] == ["unreserved"]


def test_a_fallback_inventory_is_never_cached(tmp_path):
    """When the driver does not answer, the stand-in must not outlive it."""
    from bk.core.telemetry import Inventory, Snapshot
    from bk.service.telemetry import Telemetry
    from bk.store import inventory as cache

    class Flaky:
        name, simulated, reason = "nvml", False, None

        def fingerprint(self):
            return "nvml:driver-1:boot-1"

        def static_inventory(self):
            return None

        def inventory(self):
            return Inventory("sim-count", (), True, "no NVML driver answered")

        def snapshot(self, now):
            return Snapshot(now, "sim-count", (), ("gpus",))

    t = Telemetry(lambda: Flaky(), clock=lambda: 0, cache_dir=str(tmp_path))
    assert t.inventory().reason and cache.load(str(tmp_path), "nvml:driver-1:boot-1") is None
