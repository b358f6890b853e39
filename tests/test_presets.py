"""Presets (``bk p``), learned defaults, the preset suggestion, and the
private state files behind them.  Commands run in-process through
``bk.cli.app.run`` with a fixed clock (BK_NOW) and simulated GPUs."""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest

from bk import clock
from bk.cli.app import run
from bk.core.errors import IOFailure
from bk.service import Empty, Preset, PresetHintRequest, PresetSaveRequest, open_app
from bk.service.requests import BookRequest
from bk.store.presets import HistoryFile, PresetFile

NOW = "2026-07-13T10:41:00Z"


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("BK_NOW", NOW)
    monkeypatch.setenv("TZ", "UTC")
    clock.local_tz.cache_clear()
    e = {"HOME": str(tmp_path), "BK_DATA_DIR": str(tmp_path / "data"), "BK_GPU_COUNT": "4",
         "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
         "TZ": "UTC", "NO_COLOR": "1", "BK_NOW": NOW}     # the clock is the env's (issue 24 item 6)
    yield e
    clock.local_tz.cache_clear()


def bk(env, capsys, *argv):
    capsys.readouterr()
    rc = run(list(argv), env)
    out = capsys.readouterr()
    return rc, out.out, out.err


def bk_json(env, capsys, *argv):
    rc, out, _ = bk(env, capsys, "--json", *argv)
    return rc, json.loads(out)


def state_dir(env) -> str:
    # BK_DATA_DIR is set: the presets live beside that data, not in XDG_STATE_HOME.
    return os.path.join(env["BK_DATA_DIR"], "state")


# ------------------------------------------------------------- the command

def test_save_list_show_use_delete(env, capsys):
    rc, out, err = bk(env, capsys, "p", "save", "train", "2", "1h30m", "12g", "--note", "nightly")
    assert rc == 0, err
    assert "saved preset train" in out and "bk p train" in out

    rc, doc = bk_json(env, capsys, "p")
    assert rc == 0 and doc["command"] == "preset"
    [p] = doc["data"]["presets"]
    assert (p["name"], p["count"], p["duration"], p["duration_text"], p["mode"], p["mem_mib"],
            p["pinned"], p["excluded"], p["note"], p["command"]) == \
        ("train", 2, 5400, "1h30m", "shared", 12288, None, [], "nightly", "bk 2 1h30m 12g --note nightly")

    rc, out, _ = bk(env, capsys, "preset", "show", "train")
    assert rc == 0 and "bk 2 1h30m 12g --note nightly" in out

    rc, doc = bk_json(env, capsys, "p", "train")          # bk p NAME books it
    assert rc == 0, doc
    r = doc["data"]["reservation"]
    assert doc["data"]["preset"] == "train"
    assert (len(r["gpus"]), r["mem_mib"], r["note"], r["start"], r["end"]) == \
        (2, 12288, "nightly", "2026-07-13T10:40:00Z", "2026-07-13T12:10:00Z")

    rc, out, _ = bk(env, capsys, "p", "delete", "train")
    assert rc == 0 and "deleted preset train" in out
    rc, _, err = bk(env, capsys, "p", "delete", "train")
    assert rc == 4 and "no preset named 'train'" in err


def test_use_flags_pass_through(env, capsys):
    assert bk(env, capsys, "p", "save", "solo", "1", "2h", "-x", "-g", "3")[0] == 0
    rc, doc = bk_json(env, capsys, "p", "solo", "-t", "20:00", "--dry-run")
    assert rc == 0 and doc["data"]["dry_run"] is True
    r = doc["data"]["reservation"]
    assert (r["mode"], r["gpus"], r["start"]) == ("exclusive", [3], "2026-07-13T20:00:00Z")
    rc, doc = bk_json(env, capsys, "l")
    assert doc["data"]["reservations"] == []                 # the dry run booked nothing
    rc, doc = bk_json(env, capsys, "p", "use", "solo", "--op-id", "k1")
    rc2, doc2 = bk_json(env, capsys, "p", "solo", "--op-id", "k1")
    assert rc == rc2 == 0 and doc2["data"]["status"] == "exists"
    assert doc["data"]["reservation"]["id"] == doc2["data"]["reservation"]["id"]


@pytest.mark.parametrize("argv, code, words", [
    (["p", "save", "list", "1", "1h"], 2, "sub-command"),
    (["p", "save", "9lives", "1", "1h"], 2, "not allowed"),
    (["p", "save", "big", "5", "1h"], 2, "4 GPUs"),
    (["p", "save", "odd", "1", "7m"], 2, "5-minute"),
    (["p", "save", "pin", "2", "1h", "-g", "1"], 2, "names 1 GPU but"),
    (["p", "save", "xs", "1", "1h", "-x", "-s", "2"], 2, "exclusive"),
    (["p", "show", "nothing"], 4, "no preset named"),
    (["p", "nothing"], 4, "no preset named"),
])
def test_refusals(env, capsys, argv, code, words):
    rc, _, err = bk(env, capsys, *argv)
    assert rc == code and words in err, err
    assert not os.path.exists(os.path.join(state_dir(env), "presets.json"))


def test_resave_replaces_and_reports_unchanged(env, capsys):
    bk(env, capsys, "p", "save", "t", "1", "1h")
    rc, doc = bk_json(env, capsys, "p", "save", "t", "1", "1h")
    assert doc["data"]["status"] == "unchanged"
    rc, doc = bk_json(env, capsys, "p", "save", "t", "2", "1h")
    assert doc["data"]["status"] == "replaced" and doc["data"]["preset"]["count"] == 2


def test_require_shared_memory_at_save(env, capsys):
    cfg = os.path.join(env["XDG_CONFIG_HOME"], "bk")
    os.makedirs(cfg)
    with open(os.path.join(cfg, "config.json"), "w") as f:
        json.dump({"require_shared_memory": True}, f)
    rc, _, err = bk(env, capsys, "p", "save", "t", "1", "1h")
    assert rc == 2 and "memory" in err
    assert bk(env, capsys, "p", "save", "t", "1", "1h", "8g")[0] == 0
    assert bk(env, capsys, "p", "save", "u", "1", "1h", "-x")[0] == 0


def test_close_name_is_suggested(env, capsys):
    bk(env, capsys, "p", "save", "train", "1", "1h")
    rc, _, err = bk(env, capsys, "p", "trian")
    assert rc == 4 and "did you mean 'train'" in err


# ------------------------------------------------------------- the files

def test_modes_and_atomic_layout(env, capsys):
    bk(env, capsys, "p", "save", "t", "1", "1h")
    d = state_dir(env)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(d, "presets.json")).st_mode) == 0o600
    assert sorted(os.listdir(d)) == ["presets.json", "state.lock"]    # no temp file left behind
    doc = json.load(open(os.path.join(d, "presets.json")))
    assert doc["schema"] == "gpubk.presets.v1" and set(doc["presets"]) == {"t"}


def test_damaged_file_is_reported_not_dropped(env, capsys):
    bk(env, capsys, "p", "save", "t", "1", "1h")
    path = os.path.join(state_dir(env), "presets.json")
    with open(path, "w") as f:
        f.write("{not json")
    rc, _, err = bk(env, capsys, "p")
    assert rc == 74 and path in err and "hint:" in err
    rc, _, _ = bk(env, capsys, "p", "save", "u", "1", "1h")
    assert rc == 74
    assert open(path).read() == "{not json"                     # never overwritten


def test_unknown_fields_round_trip(env, capsys):
    bk(env, capsys, "p", "save", "t", "1", "1h")
    path = os.path.join(state_dir(env), "presets.json")
    doc = json.load(open(path))
    doc["presets"]["t"]["future_field"] = {"x": 1}
    with open(path, "w") as f:
        json.dump(doc, f)
    bk(env, capsys, "p", "save", "u", "2", "1h")
    assert json.load(open(path))["presets"]["t"]["future_field"] == {"x": 1}


def test_symlink_and_loose_modes_are_refused(env, capsys, tmp_path):
    d = state_dir(env)
    os.makedirs(d, mode=0o700)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('{"schema": "gpubk.presets.v1", "presets": {}}')
    os.symlink(elsewhere, os.path.join(d, "presets.json"))
    rc, _, err = bk(env, capsys, "p")
    assert rc == 78 and "symbolic link" in err
    os.unlink(os.path.join(d, "presets.json"))
    os.chmod(d, 0o777)
    rc, _, err = bk(env, capsys, "p", "save", "t", "1", "1h")
    assert rc == 78 and "writable by group or others" in err


def test_concurrent_saves_lose_nothing(env):
    errors = []

    def save(i: int) -> None:
        try:
            app = open_app(env)
            app.run("preset_save", PresetSaveRequest(Preset(f"p{i}", 1, 3600)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=save, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert set(PresetFile(state_dir(env)).read()) == {f"p{i}" for i in range(8)}


def test_history_file_is_bounded_and_private(tmp_path):
    h = HistoryFile(str(tmp_path / "st"), limit=5)
    assert h.read() == []
    h.write([f"l {i}" for i in range(12)] + ["", "  "])
    assert h.read() == [f"l {i}" for i in range(7, 12)]
    assert stat.S_IMODE(os.stat(tmp_path / "st" / "prompt_history").st_mode) == 0o600


def test_damaged_preset_record(env, capsys):
    d = state_dir(env)
    os.makedirs(d, mode=0o700)
    path = os.path.join(d, "presets.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, json.dumps({"schema": "gpubk.presets.v1",
                             "presets": {"t": {"count": "two", "duration": 3600}}}).encode())
    os.close(fd)
    with pytest.raises(IOFailure, match="count"):
        open_app(env).run("presets", Empty())


# ------------------------------------------------------------- learning

def hint(app, booked=None):
    return app.run("preset_hint", PresetHintRequest(booked)).suggestion


def _book(app, count, dur, **kw):
    # again: the same shape booked in one instant on purpose, not a repeat.
    return app.run("book", BookRequest(count=count, duration=dur, again=True, **kw)).reservation


def test_suggest_after_the_third_matching_booking(env, capsys):
    app = open_app(env)
    r1 = _book(app, 2, 3600)
    assert hint(app, r1) is None
    _book(app, 1, 1800)                                   # another shape does not count
    r2 = _book(app, 2, 3600)
    assert hint(app, r2) is None
    r3 = _book(app, 2, 3600)
    s = hint(app, r3)
    assert s == {"times": 3, "command": "bk p save NAME 2 1h",
                 "hint": "you booked this 3 times; save it: bk p save NAME 2 1h"}
    r4 = _book(app, 2, 3600)
    assert hint(app, r4) is None            # said once, not after every booking
    # Without an argument it looks at the latest booking.
    assert hint(app) is None


def test_no_suggestion_when_a_preset_has_that_shape(env, capsys):
    app = open_app(env)
    app.run("preset_save", PresetSaveRequest(Preset("x2", 1, 7200, mode="exclusive")))
    for _ in range(2):
        _book(app, 1, 7200, mode="exclusive")
    assert hint(app, _book(app, 1, 7200, mode="exclusive")) is None


def test_exclusive_suggestion_command(env):
    app = open_app(env)
    for _ in range(2):
        _book(app, 1, 7200, mode="exclusive")
    s = hint(app, _book(app, 1, 7200, mode="exclusive"))
    assert s["command"] == "bk p save NAME 1 2h -x"


def test_learned_defaults(env):
    app = open_app(env)
    assert app.run("defaults", Empty()).to_json() == {"count": 1, "duration": 3600, "mode": "shared",
                                         "mem_mib": None, "learned": 0}
    _book(app, 2, 1800, mem_mib=4096)
    _book(app, 2, 1800, mem_mib=4096)
    _book(app, 1, 3600)
    d = app.run("defaults", Empty()).to_json()
    assert (d["count"], d["duration"], d["mode"], d["mem_mib"], d["learned"]) == \
        (2, 1800, "shared", 4096, 3)
