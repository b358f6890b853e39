"""``bk agent`` and the agent surface (``bk.agent``): compact JSON
in and out, the same rows as ``bk mcp``, the same results as the CLI, and
the table's local reads kept off the broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers_cli import ME, NOW_ISO, SLICE, bk_fixture

from bk import agent
from bk.agent import surface as agent_tools
from bk.core.models import iso
from bk.service import ops


@pytest.fixture
def bk(monkeypatch, capsys):
    yield from bk_fixture(monkeypatch, capsys)


def line(r) -> dict:
    """The one compact JSON line ``bk agent`` prints."""
    lines = r.out.splitlines()
    assert len(lines) == 1, r.out
    env = json.loads(lines[0])
    assert lines[0] == json.dumps(env, separators=(",", ":"), ensure_ascii=False)
    return env


def agent_call(bk, tool: str, arguments: dict | None = None, *extra):
    r = bk("agent", "operation", tool, json.dumps(arguments or {}), *extra)
    return r, line(r)


def test_context_says_who_when_and_what(bk):
    r = bk("agent", "context")
    assert r.code == 0
    env = line(r)
    assert env["schema"] == "gpubk.v1" and env["command"] == "context" and env["ok"]
    d = env["data"]
    assert d["agent_schema"] == agent.SCHEMA and d["now"] == NOW_ISO
    assert d["you"] == {"uid": ME.uid, "user": ME.user, "admin": False}
    assert [g["index"] for g in d["gpus"]] == [0, 1, 2, 3] and d["policy"]["gpu_count"] == 4
    assert d["tools"] == ["context", "recommend", "create", "list", "edit", "cancel", "usage", "job_log", "cleanup"]


def test_operation_lists_the_table_derived_tools(bk):
    r = bk("agent", "operation")
    d = line(r)["data"]
    by = {o["name"]: o for o in d["operations"]}
    assert by["create"]["input_schema"]["properties"]["operation_id"]["anyOf"][0]["pattern"].startswith("^")
    assert by["cancel"]["destructive"] and by["cancel"]["idempotent"] and not by["cancel"]["read_only"]
    assert by["list"]["read_only"] and by["list"]["input_schema"] == ops.get("list").schema()
    assert by["recommend"]["summary"] == ops.get("recommend").summary


def test_create_retry_edit_cancel_with_operation_ids(bk):
    _, made = agent_call(bk, "create", {"count": 2, "duration": 3600, "operation_id": "run-1"})
    res = made["data"]["reservation"]
    assert made["data"]["status"] == "created" and res["gpus"] == [0, 1] and res["start"] == iso(SLICE)
    _, again = agent_call(bk, "create", {"count": 2, "duration": 3600, "operation_id": "run-1"})
    assert again["data"]["status"] == "exists" and again["data"]["reservation"]["id"] == res["id"]
    assert len(bk.data("l")["reservations"]) == 1
    # The same op-id for another request is refused, not silently reused.
    r, other = agent_call(bk, "create", {"count": 1, "duration": 600, "operation_id": "run-1"})
    assert r.code == 2 and not other["ok"]

    r = bk("agent", "edit", json.dumps({"ref": "1", "duration": 7200, "operation_id": "run-1-x"}))
    edited = line(r)["data"]
    assert edited["status"] == "updated" and edited["reservation"]["end"] == iso(SLICE + 7200)
    r = bk("agent", "edit", json.dumps({"ref": "1", "duration": 7200, "operation_id": "run-1-x"}))
    assert line(r)["data"]["status"] == "exists"

    r = bk("agent", "cancel", json.dumps({"ref": res["id"][:6], "operation_id": "run-1-c"}))
    assert r.code == 0 and line(r)["data"]["status"] == "cancelled"
    # Retried after it is gone from the list: the op-id names the booking it cancelled.
    r = bk("agent", "cancel", json.dumps({"ref": "1", "operation_id": "run-1-c"}))
    assert r.code == 0 and line(r)["data"]["status"] == "exists"
    assert bk.data("l")["reservations"] == []


def test_the_same_booking_through_the_agent_and_the_cli_is_the_same_json(bk):
    cli = bk.data("1", "1h", "-m", "12g", "--op-id", "cli-1")["reservation"]
    bk.ok("d", "1")
    _, made = agent_call(bk, "create", {"count": 1, "duration": 3600, "mem_mib": 12288, "operation_id": "ag-1"})
    ours = made["data"]["reservation"]
    differ = {"id", "short_id", "op_id"}
    assert {k: v for k, v in ours.items() if k not in differ} == {k: v for k, v in cli.items() if k not in differ}
    # And the list is bk l's, number for number.
    assert agent_call(bk, "list", {})[1]["data"] == bk.data("l")
    assert agent_call(bk, "list", {"scope": "history"})[1]["data"] == bk.data("l", "--history")


def test_recommend_is_bk_slots(bk):
    env = line(bk("agent", "recommend", json.dumps({"count": 2, "duration": 3600, "limit": 2})))
    assert env["ok"]
    slots = bk.data("slots", "2", "1h", "-n", "2")
    assert env["data"]["options"] == slots["options"] and env["data"]["free_now"] is True


def test_cleanup_cancels_only_the_tagged_bookings_once(bk):
    for i in range(2):
        agent_call(bk, "create", {"count": 1, "duration": 3600, "operation_id": f"sess-a-{i}"})
    agent_call(bk, "create", {"count": 1, "duration": 3600, "operation_id": "other-1"})
    _, dry = agent_call(bk, "cleanup", {"op_id_prefix": "sess-a-", "dry_run": True})
    assert dry["data"]["status"] == "dry_run" and dry["data"]["count"] == 2
    assert len(bk.data("l")["reservations"]) == 3
    _, done = agent_call(bk, "cleanup", {"op_id_prefix": "sess-a-"})
    assert done["data"]["status"] == "cancelled"
    assert sorted(r["op_id"] for r in done["data"]["reservations"]) == ["sess-a-0", "sess-a-1"]
    assert all(r["status"] == "cancelled" for r in done["data"]["reservations"])
    _, again = agent_call(bk, "cleanup", {"op_id_prefix": "sess-a-"})
    assert again["data"] == {"status": "nothing", "dry_run": False, "reservations": [], "count": 0}
    assert [r["op_id"] for r in bk.data("l")["reservations"]] == ["other-1"]
    r, both = agent_call(bk, "cleanup", {})
    assert r.code == 2 and "op_id_prefix or all" in both["error"]["message"]


def test_cleanup_never_touches_another_users_booking(bk):
    from bk.service.requests import BookRequest

    bk.service().run("book", BookRequest(1, 3600, op_id="sess-a-bob"))
    _, done = agent_call(bk, "cleanup", {"all": True})
    assert done["data"]["status"] == "nothing"
    assert len(bk.data("l", "--all")["reservations"]) == 1


def test_errors_are_envelopes_with_the_exit_status(bk):
    r, env = agent_call(bk, "nope")
    assert r.code == 2 and env["error"]["code"] == "invalid_input" and "unknown operation" in env["error"]["message"]
    r = bk("agent", "recommend", "{not json")
    assert r.code == 2 and line(r)["error"]["message"].startswith("the arguments are not JSON")
    r = bk("agent", "recommend", "[1]")
    assert r.code == 2 and "JSON object" in line(r)["error"]["message"]
    r, env = agent_call(bk, "create", {"count": 1.5, "duration": 60})
    assert r.code == 2 and "integer" in env["error"]["message"]
    r = bk("agent", "cancel", json.dumps({"ref": "7"}))
    assert r.code == 4 and line(r)["error"]["code"] == "not_found"
    # With --json the failure is the CLI's own envelope, the same shape.
    r = bk("agent", "cancel", json.dumps({"ref": "7"}), "--json")
    assert r.code == 4 and r.error["code"] == "not_found"


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["plain", "json"])
def test_usage_errors_are_envelopes_whose_hint_works(pyz, tmp_path, json_flag):
    """Issue 30 item 7: usage errors hinted `bk help operation` (no such
    command) and, without --json, printed no envelope where every other
    failure of bk agent does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BK_")}
    env.update({"HOME": str(tmp_path), "BK_DATA_DIR": str(tmp_path / "d"), "BK_GPU_COUNT": "2",
                "XDG_CACHE_HOME": str(tmp_path / "c"), "COLUMNS": "80"})

    def run(*argv):
        return subprocess.run([sys.executable, str(pyz), *json_flag, *argv], capture_output=True, text=True,
                              env=env, timeout=60, stdin=subprocess.DEVNULL)

    for argv, path in ((["agent", "operation", "create", "{}", "x"], "agent operation"),
                       (["agent", "edit", "{}", "x"], "agent edit"), (["agent", "context", "--bogus"], "agent context"),
                       (["agent"], "agent"), (["agent", "nope"], "agent")):
        p = run(*argv)
        assert (p.returncode, p.stderr) == (2, ""), (argv, p.stderr)
        (out,) = p.stdout.splitlines()                        # one envelope, on stdout
        env_ = json.loads(out)
        assert env_["ok"] is False and env_["error"]["code"] == "invalid_input", argv
        assert env_["error"]["hint"] == f"see: bk help {path}", argv
        helped = run("help", *path.split())
        assert helped.returncode == 0, (path, helped.stdout, helped.stderr)
    # A failure past the words names the tool, with --json or without.
    p = run("agent", "operation", "create", "{not json")
    assert p.returncode == 2 and json.loads(p.stdout)["command"] == "create"


def test_arguments_from_stdin(bk, monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO('{"scope": "all"}'))
    r = bk("agent", "operation", "list", "-")
    assert r.code == 0 and line(r)["data"]["scope"] == "all"


def test_local_reads_are_not_broker_operations(tmp_path):
    """The broker's allowlist is the served rows: a local read is an
    unknown operation there; the agent's one write (cleanup) is served,
    for the caller the kernel names and no one else."""
    from bk.broker.handlers import Dispatcher, Peer
    from bk.service import open_app
    from bk.service.requests import BookRequest

    env = {"BK_DATA_DIR": str(tmp_path / "d"), "HOME": str(tmp_path), "BK_GPU_COUNT": "2",
           "XDG_CACHE_HOME": str(tmp_path / "c")}
    app = open_app(env)
    d = Dispatcher(app)
    me = Peer(1, os.geteuid(), os.getegid())
    for name in ("list", "context", "recommend", "usage", "job_log"):
        assert not ops.get(name).served
        reply = d.dispatch({"op": name, "fields": {}}, me)
        assert reply["error"]["code"] == "invalid_input" and "unknown operation" in reply["error"]["message"]
    assert "list" not in reply["error"]["hint"] and "cleanup" in reply["error"]["hint"]
    app.run("book", BookRequest(1, 3600, op_id="t-1"))
    other = Peer(2, 4242, 4242)
    assert d.dispatch({"op": "cleanup", "fields": {"all": True}}, other)["data"]["status"] == "nothing"
    reply = d.dispatch({"op": "cleanup", "fields": {"op_id_prefix": "t-"}}, me)
    assert reply["ok"] and reply["data"]["status"] == "cancelled" and reply["data"]["count"] == 1
    from bk.service import CleanupResult

    assert CleanupResult.from_wire(reply["data"]).cancelled[0].op_id == "t-1"


def test_a_tool_provider_adds_tools(bk):
    def provider(app):
        return [agent.AgentTool("cluster_ping", "say hello", {"type": "object", "properties": {}}, True, False,
                                True, lambda tool, app, arguments, call: agent.Data({"hello": True}))]

    agent.register_provider(provider)
    try:
        _, env = agent_call(bk, "cluster_ping")
        assert env["data"] == {"hello": True}
        assert "cluster_ping" in line(bk("agent", "context"))["data"]["tools"]
    finally:
        agent_tools._PROVIDERS.remove(provider)


@pytest.mark.slow
def test_mcp_help_prints_the_client_snippet_and_tools_list(pyz, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BK_")}
    env.update({"HOME": str(tmp_path), "BK_DATA_DIR": str(tmp_path / "d"), "BK_GPU_COUNT": "2",
                "XDG_CACHE_HOME": str(tmp_path / "c"), "COLUMNS": "80"})
    out = subprocess.run([sys.executable, str(pyz), "mcp", "--help"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0
    start = out.stdout.index("{")
    snippet = json.loads(out.stdout[start:out.stdout.index("\n  }\n", start) + 4])
    assert snippet == {"mcpServers": {"bk": {"command": "bk", "args": ["mcp"]}}}
    words = " ".join(out.stdout.split())
    assert "at most 1 MiB a message" in words and "2026-07-28 (server/discover)" in words
    listed = subprocess.run([sys.executable, str(pyz), "mcp", "--tools", "--json"], capture_output=True,
                            text=True, env=env, timeout=60)
    tools = json.loads(listed.stdout)["data"]["tools"]
    assert [t["name"] for t in tools][:3] == ["context", "recommend", "create"]
    served = subprocess.run([sys.executable, str(pyz), "mcp", "--json"], capture_output=True, text=True,
                            env=env, timeout=60, input="")
    assert served.returncode == 2 and json.loads(served.stdout)["error"]["code"] == "invalid_input"
    agent_out = subprocess.run([sys.executable, str(pyz), "agent", "context"], capture_output=True, text=True,
                               env=env, timeout=60)
    assert agent_out.returncode == 0 and json.loads(agent_out.stdout)["data"]["policy"]["gpu_count"] == 2


def test_create_with_a_command_attaches_a_job_once(bk, tmp_path):
    args = {"count": 1, "duration": 3600, "operation_id": "job-1", "command": ["/bin/true", "x"],
            "cwd": str(tmp_path)}
    _, made = agent_call(bk, "create", args)
    job = made["data"]["reservation"]["job"]
    assert made["ok"] and job["status"] == "pending" and job["summary"] == "true +1 arg"
    assert any("no bk worker is running" in w for w in made["warnings"])
    _, again = agent_call(bk, "create", args)
    assert again["data"]["status"] == "exists" and again["data"]["reservation"]["job"]["id"] == job["id"]
    specs = [p for p in bk.data_dir.rglob("*") if p.is_file() and "specs" in p.parts]
    assert len(specs) == 1 and job["id"] in specs[0].name, specs      # the retry left no second spec
    for bad, words in (({"command": []}, "list of 1-"), ({"command": ["a\0b"]}, "no NUL"),
                       ({"command": ["/bin/true"], "cwd": "rel"}, "absolute"), ({"cwd": "/"}, "goes with"),
                       ({"command": ["/no/such/program"]}, "no such file")):
        r, env = agent_call(bk, "create", {"count": 1, "duration": 60, **bad})
        assert r.code == 2 and words in env["error"]["message"], (bad, env)


@pytest.mark.slow
def test_an_agents_job_runs_and_its_log_reads_back(pyz, tmp_path):
    """Through the built archive: create with a command, the worker runs it
    (bk w once), job_log returns its output, bounded by max_bytes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update({"HOME": str(tmp_path), "BK_DATA_DIR": str(tmp_path / "d"), "BK_GPU_COUNT": "2",
                "XDG_CACHE_HOME": str(tmp_path / "c"), "TZ": "UTC"})

    def bk_(*args):
        p = subprocess.run([sys.executable, str(pyz), *args], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=120)
        return p.returncode, p.stdout

    code, out = bk_("agent", "operation", "create", json.dumps(
        {"count": 1, "duration": 600, "operation_id": "j-1", "command": ["/bin/echo", "hello from the agent"]}))
    made = json.loads(out)["data"]["reservation"]
    assert code == 0 and made["job"]["status"] == "pending"
    code, _ = bk_("w", "once")
    assert code == 0
    # by its ID: the booking ended with its command, so it has no list number any more
    code, out = bk_("agent", "operation", "job_log", json.dumps({"ref": made["id"]}))
    d = json.loads(out)["data"]
    assert code == 0 and d["job"]["status"] == "succeeded" and "hello from the agent" in d["log"]
    code, out = bk_("agent", "operation", "job_log", json.dumps({"ref": made["id"], "max_bytes": 5}))
    d = json.loads(out)["data"]
    assert len(d["log"].encode()) <= 5 and d["truncated"] is True


def test_a_failing_provider_leaves_the_builtin_tools(bk):
    from bk.core.errors import ConfigError

    def broken(app):
        raise ConfigError("the catalog is unreadable")

    agent.register_provider(broken)
    try:
        r = bk("agent", "context")
        assert r.code == 0 and line(r)["data"]["tools"][:9] == [t.name for t in agent.builtin_tools()]
    finally:
        agent_tools._PROVIDERS.remove(broken)


def test_bk_agent_takes_times_and_durations_as_a_person_writes_them(bk):
    """Issue 24 item 5, ``bk agent``'s side: the CLI's grammar for durations,
    starts, an edit's ``-d`` and a usage period, and the CLI's refusals."""
    r, env = agent_call(bk, "create", {"count": 1, "duration": "1h30m", "start": "+1h", "operation_id": "w-1"})
    assert r.code == 0 and env["data"]["status"] == "created", env
    res = env["data"]["reservation"]
    assert res["start"] == iso(SLICE + 3600) and res["end"] == iso(SLICE + 3600 + 5400)
    r, env = agent_call(bk, "edit", {"ref": "1", "duration": "-15m", "operation_id": "w-2"})
    assert r.code == 0 and env["data"]["reservation"]["end"] == iso(SLICE + 3600 + 4500), env
    r, env = agent_call(bk, "edit", {"ref": "1", "end": "+15m", "operation_id": "w-3"})
    assert r.code == 0 and env["data"]["reservation"]["end"] == iso(SLICE + 3600 + 5400), env
    r, env = agent_call(bk, "recommend", {"count": 1, "duration": 1800, "start": "2026-07-13T13:00+02:00"})
    assert r.code == 0 and env["data"]["request"]["start"] == "2026-07-13T11:00:00Z", env
    cli = bk.json("1", "30m", "-t", "tomorrow 25:00")
    r, env = agent_call(bk, "create", {"count": 1, "duration": "30m", "start": "tomorrow 25:00"})
    assert r.code == cli.code == 2
    assert (env["error"]["message"], env["error"]["hint"]) == (cli.error["message"], cli.error["hint"])
    r, env = agent_call(bk, "usage", {"since": "today"})
    assert r.code == 0 and env["data"]["period"]["since"] == "2026-07-13T00:00:00Z", env


def test_each_tools_output_schema_is_its_rows_result_and_holds_what_it_returns(bk):
    """Issue 24 item 5: a tool's output schema describes its own data (the
    row's result type's json_schema, plus what the tool adds), not just "an
    object"; every tool's real answer validates against it."""
    jsonschema = pytest.importorskip("jsonschema")
    listed = {o["name"]: o for o in line(bk("agent", "operation"))["data"]["operations"]}
    for tool in agent.builtin_tools():
        out = listed[tool.name]["output_schema"]
        base = ops.get(tool.row).result.json_schema()
        assert out.get("properties", {}).keys() >= base.get("properties", {}).keys(), tool.name
        assert out != {"type": "object"}, tool.name
    assert set(listed["recommend"]["output_schema"]["properties"]) == {"request", "options", "free_now"}
    answers = {
        "context": {}, "recommend": {"count": 1, "duration": "30m"},
        "create": {"count": 1, "duration": "30m", "operation_id": "o-1"}, "list": {"scope": "all"},
        "edit": {"ref": "1", "duration": "+30m"}, "usage": {}, "cancel": {"ref": "1", "dry_run": True},
        "cleanup": {"op_id_prefix": "o-", "dry_run": True},
    }
    for name, arguments in answers.items():
        r, env = agent_call(bk, name, arguments)
        assert r.code == 0, env
        jsonschema.validate(env["data"], listed[name]["output_schema"])
    r, env = agent_call(bk, "usage", {"reservation": env["data"]["reservations"][0]["id"]})
    jsonschema.validate(env["data"], listed["usage"]["output_schema"])
