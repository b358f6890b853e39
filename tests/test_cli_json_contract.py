"""The JSON contract (SPEC 6.3, docs/JSON.md): for every command, one
envelope on stdout and nothing on stderr, the canonical command name, and at
least the documented ``data`` keys, down to the shared shapes.  Failures and
usage errors are envelopes too.  Every key named here must be in docs/JSON.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers_cli import BOB, ROOT, bk_fixture

from bk.service.requests import BookRequest, NoticeRequest

DOC = (Path(__file__).resolve().parents[1] / "docs" / "JSON.md").read_text()

RESERVATION = {"id", "short_id", "number", "uid", "user", "mine", "mode", "gpus", "share", "capacity",
               "mem_mib", "mem_mib_effective", "start", "end", "status", "created", "op_id", "job",
               "note", "cancelled_at", "cancel_reason", "edits"}
NOTICE = {"id", "short_id", "at", "level", "text", "scope", "until", "reservation", "archived"}
GPU = {"index", "uuid", "name", "util", "mem_used_mib", "mem_total_mib", "temperature", "state",
       "share_used", "capacity", "processes", "next_free"}
PROCESS = {"pid", "uid", "user", "label", "mem_mib", "sm", "state", "identity", "since", "container"}
OPTION = {"gpus", "start", "end", "command", "queued", "mem_mib_effective", "reasons"}
CELL = {"used", "mine", "others", "blackout"}
CHECK = {"name", "ok", "detail"}
POLICY = {"gpu_count", "slot_minutes", "max_shared_users", "shared_memory_reserve_mb",
          "require_shared_memory", "booking_horizon_days", "max_booking_hours",
          "queue_search_hours", "disabled_gpus", "gpu_priority"}
BOOKING = {"status", "reservation", "placement", "dry_run"}

# command name in the envelope -> (argv, documented data keys)
COMMANDS = {
    "book": (["2", "1h", "12g"], BOOKING),
    "exclusive": (["x", "1", "30m"], BOOKING),
    "list": (["l"], {"scope", "reservations"}),
    "edit": (["e", "1", "-d", "+30m"], BOOKING | {"before"}),
    "cancel": (["d", "1"], {"status", "reservation", "dry_run"}),
    "status": (["st", "-v"], {"now", "backend", "telemetry", "gpus", "reservations", "usage", "notices",
                              "monitor"}),
    "timeline": (["tl"], {"from", "to", "step", "capacity", "now", "gpus", "blackouts", "reservations"}),
    "slots": (["slots", "1", "1h"], {"request", "options"}),
    "gpu": (["g"], {"current", "options", "export"}),
    "notices": (["n"], {"notices"}),
    "history": (["history", "1"], {"reservation", "events", "source"}),
    "log": (["lg"], {"entries", "complete"}),
    "info": (["info"], {"admin", "mode", "data_dir", "config_file", "gpu_count", "backend", "policy"}),
    "login": (["login"], {"now", "notices", "reservations"}),
    "config": (["config"], {"mode", "config_file", "config_read", "trusted", "data_dir", "state_dir",
                            "settings"}),
    "doctor": (["doctor"], {"ok", "strict", "checks"}),
    "tutorial": (["tutorial"], {"policy", "steps"}),
    "help": (["help"], {"topic", "text", "commands"}),
    "notify": (["notify"], {"settings", "file", "relay", "terminals", "deliverer", "health"}),
}


@pytest.fixture
def bk(monkeypatch, capsys):
    gen = bk_fixture(monkeypatch, capsys)
    b = next(gen)
    # A world in which every shape has something in it: GPUs with processes,
    # your running booking (number 1), someone else's, a notice.
    b.sim()
    b.ok("1", "1h", "-g", "0")
    b.service(BOB).run("book", BookRequest(count=1, duration=3600, pinned=(2,)))
    b.service(ROOT).run("notice_publish", NoticeRequest("hello"))
    yield b
    next(gen, None)


def _keys(obj: dict, want: set, where: str) -> None:
    missing = want - set(obj)
    assert not missing, f"{where} lacks {sorted(missing)}"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_envelope_and_data_keys(bk, command):
    argv, keys = COMMANDS[command]
    r = bk.json(*argv)
    assert r.code == 0, r.out
    assert r.err == "", "stderr must stay empty with --json"
    env = r.envelope
    assert env["command"] == command and env["schema"] == "gpubk.v1"
    data = env["data"]
    _keys(data, keys, command)
    for name in ("reservation", "before"):
        if data.get(name) is not None:
            _keys(data[name], RESERVATION, f"{command}.{name}")
    for item in data.get("reservations", []) + data.get("current", []):
        _keys(item, RESERVATION, f"{command} reservation")
    for n in data.get("notices", []):
        _keys(n, NOTICE, f"{command} notice")
    for o in data.get("options", []):
        _keys(o, OPTION, f"{command} option")
    if "policy" in data:
        _keys(data["policy"], POLICY, f"{command}.policy")


def test_nested_shapes_are_filled(bk):
    st = bk.data("st")
    assert st["reservations"] and st["notices"] and st["gpus"]
    for g in st["gpus"]:
        _keys(g, GPU, "status gpu")
        for p in g["processes"] or ():
            _keys(p, PROCESS, "status process")
    assert any(g["processes"] for g in st["gpus"])
    _keys(st["telemetry"], {"source", "simulated", "reason", "gaps", "capabilities"}, "status telemetry")
    tl = bk.data("tl")
    for g in tl["gpus"]:
        _keys(g, {"index", "disabled", "cells"}, "timeline gpu")
        for c in g["cells"]:
            _keys(c, CELL, "timeline cell")
    for c in bk.data("doctor")["checks"]:
        _keys(c, CHECK, "doctor check")
    for key in bk.data("config")["settings"].values():
        _keys(key, {"value", "source", "security", "doc"}, "config setting")
    _keys(bk.data("info")["admin"], {"contact", "source", "account"}, "info admin")
    for s in bk.data("tutorial")["steps"]:
        _keys(s, {"title", "text", "commands"}, "tutorial step")
    for e in bk.data("history", "1")["events"]:
        _keys(e, {"time", "action", "uid", "user", "before", "after", "result"}, "history event")


def test_every_command_of_the_contract_is_tested():
    assert {"book", "list", "edit", "cancel", "status", "timeline", "slots", "gpu", "notices",
            "history", "log", "info", "login", "config", "doctor", "tutorial"} <= set(COMMANDS)


def test_every_contract_key_is_documented():
    named = set(re.findall(r"`([a-z_]+)`", DOC))
    keys = set().union(RESERVATION, NOTICE, GPU, PROCESS, OPTION, CELL, CHECK, POLICY,
                       *(k for _, k in COMMANDS.values()))
    assert keys - named == set()
    for command in COMMANDS:
        assert f"`{command}`" in DOC


@pytest.mark.parametrize("argv", [["1"], ["frobnicate"], ["l", "--bogus"], ["help", "nosuch"],
                                  ["e", "1"], ["tl", "--step", "7m"]])
def test_usage_errors_are_envelopes(bk, argv):
    for placed in (["--json", *argv], [*argv, "--json"]):
        r = bk(*placed)
        assert r.code == 2 and r.err == ""
        assert r.error["code"] == "invalid_input" and r.error["message"]


def test_failure_envelope_carries_the_canonical_command(bk):
    r = bk.json("d", "9")
    assert r.envelope["command"] == "cancel" and r.error["code"] == "not_found"
    r = bk.json("x", "9", "1h")
    assert r.envelope["command"] == "exclusive" and r.error["code"] == "conflict"
    assert r.error["details"]["rule"] == "gpu_count"


def test_bare_json_is_the_status_envelope(bk):
    assert bk.json().envelope["command"] == "status"
