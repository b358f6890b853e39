"""Every everyday command, in-process, on a simulated 4-GPU server with a
fixed clock (2026-07-13 10:41:30 UTC; the current slice starts 10:40)."""

from __future__ import annotations

import re
import shlex

import pytest
from helpers_cli import BOB, ME, NOW, ROOT, SLICE, bk_fixture

from bk.core.models import iso, parse_iso
from bk.service.requests import BookRequest, CancelRequest, NoticeRequest

H = 3600


@pytest.fixture
def bk(monkeypatch, capsys):
    yield from bk_fixture(monkeypatch, capsys)


def _book(bk, *argv) -> dict:
    return bk.data(*argv)["reservation"]


# ------------------------------------------------------------------- book

def test_book_shorthand_starts_in_the_current_slice(bk):
    r = bk.ok("1", "30m")
    assert re.fullmatch(r"booked 1 GPU \(0\) shared 07-13 10:40–11:10 \[[0-9a-f]{8}\]\n"
                        r"starts now: from 10:40, the current 5-minute slice\n", r.out)
    res = bk.data("l")["reservations"][0]
    assert (res["start"], res["end"], res["gpus"], res["number"]) == (iso(SLICE), iso(SLICE + 1800), [0], 1)


def test_book_memory_exclusive_and_aliases(bk):
    a = _book(bk, "2", "1h30m", "12g")
    assert (a["mem_mib"], len(a["gpus"]), a["mode"]) == (12288, 2, "shared")
    x = _book(bk, "x", "1", "2h")
    assert (x["mode"], x["share"], x["capacity"]) == ("exclusive", 2, 2)
    s = _book(bk, "s", "1", "-d", "1h", "512m")        # the words after a flag still count
    assert (s["mem_mib"], parse_iso(s["end"]) - parse_iso(s["start"])) == (512, H)
    assert bk.json("book", "1", "30m").envelope["command"] == "book"
    assert bk.json("exclusive", "1", "30m").envelope["command"] == "exclusive"


def test_book_at_a_clock_time_rolls_to_tomorrow_and_says_so(bk):
    r = bk.ok("1", "1h", "-t", "20:00")
    assert "07-13 20:00–21:00" in r.out and "tomorrow" not in r.out
    r = bk.ok("1", "1h", "-t", "9:00")
    assert "07-14 09:00–10:00" in r.out and r.out.rstrip().endswith("(tomorrow)")
    exact = _book(bk, "1", "1h", "--start", "2026-07-13T18:00:00Z")
    assert exact["start"] == "2026-07-13T18:00:00Z"


def test_full_now_is_queued_but_an_exact_time_is_a_conflict(bk):
    bk.ok("x", "4", "1h")
    r = bk.ok("1", "30m")
    assert "queued: starts at 11:40" in r.out
    d = bk.data("1", "30m", "--again")
    assert d["status"] == "queued" and d["reservation"]["start"] == "2026-07-13T11:40:00Z"
    r = bk.json("1", "30m", "-t", "11:00")
    assert r.code == 3 and r.error["code"] == "conflict"
    # The refusal names the nearest start that fits, with the command.
    assert "the nearest start that fits is 11:40" in r.error["hint"]
    assert "-t '2026-07-13 11:40'" in r.error["hint"]
    assert r.error["details"]["nearest_start"] == "2026-07-13T11:40:00Z"
    q = bk.data("1", "30m", "-t", "11:00", "--queue", "--again")   # else: the same as the last one
    assert q["status"] == "queued" and q["reservation"]["start"] >= "2026-07-13T11:40:00Z"


def test_book_dry_run_op_id_quiet_verbose(bk):
    r = bk.ok("2", "1h", "--dry-run")
    assert r.out.startswith("would book 2 GPUs") and "[" not in r.out
    assert bk.data("l")["reservations"] == []
    rid = bk.ok("1", "1h", "--op-id", "k1", "-q").out.strip()
    assert re.fullmatch(r"[0-9a-f]{8}", rid)
    again = bk.data("1", "1h", "--op-id", "k1")
    assert again["status"] == "exists" and again["reservation"]["short_id"] == rid
    assert len(bk.data("l")["reservations"]) == 1
    assert bk.json("1", "2h", "--op-id", "k1").code == 2
    v = bk.ok("1", "1h", "-v")
    assert "GPU 0: " in v.out and "GPU 3: " in v.out


def test_book_usage_errors(bk):
    assert bk("1").code == 2
    r = bk("1", "30m", "1g", "2g")
    assert r.code == 2 and "unexpected words" in r.err
    assert bk("x", "1", "1h", "-s", "2").code == 2
    r = bk("1", "7m")
    assert r.code == 2 and "5-minute" in r.err
    assert bk("1", "30m", "-t", "20:00", "--start", "2026-07-13T18:00:00Z").code == 2


# ------------------------------------------------------------------- list

def test_list_numbers_all_and_history(bk):
    bk.ok("1", "1h", "-t", "12:00")
    bk.ok("1", "1h")
    bk.service(BOB).run("book", BookRequest(count=1, duration=H))
    mine = bk.data("l")["reservations"]
    assert [r["number"] for r in mine] == [1, 2] and mine[0]["start"] == iso(SLICE)
    everyone = bk.data("ls", "--all")["reservations"]
    assert {r["user"] for r in everyone} == {"ada", "bob"}
    assert [r["number"] for r in everyone if not r["mine"]] == [None]
    assert "bob" in bk.ok("list", "--all").out
    bk.ok("d", "1")
    hist = bk.data("l", "--history")["reservations"]
    assert [r["status"] for r in hist] == ["cancelled"]
    assert len(bk.data("l", "-n", "1")["reservations"]) == 1


def test_a_cut_list_says_how_much_it_left_out(bk):
    for at in ("12:00", "13:00", "14:00"):
        bk.ok("1", "1h", "-t", at)
    bk.service(BOB).run("book", BookRequest(count=1, duration=H))
    d = bk.data("l", "-n", "2")
    assert d["total"] == 3 and len(d["reservations"]) == 2
    assert "showing 2 of 3 (bk l -n 0 for all)" in bk.ok("l", "-n", "2").out
    assert "showing" not in bk.ok("l").out and bk.data("l")["total"] == 3
    assert "showing 1 of 4 (bk l --all -n 0 for all)" in bk.ok("l", "--all", "-n", "1").out
    assert bk.data("l", "--all", "-n", "1")["total"] == 4


def test_list_empty(bk):
    assert "no current or upcoming bookings" in bk.ok("l").out


# ------------------------------------------------------------------- edit

def test_edit_upcoming_everything(bk):
    bk.ok("1", "1h", "-t", "20:00")
    d = bk.data("e", "1", "-d", "2h")
    assert (d["status"], d["reservation"]["end"]) == ("updated", "2026-07-13T22:00:00Z")
    assert d["before"]["end"] == "2026-07-13T21:00:00Z"
    d = bk.data("edit", "1", "-t", "21:00", "-d", "+30m")       # relative: 30 minutes longer
    r = d["reservation"]
    assert (r["start"], r["end"]) == ("2026-07-13T21:00:00Z", "2026-07-13T23:30:00Z")
    r = bk.data("e", "1", "-g", "3", "-m", "20g", "--note", "eval")["reservation"]
    assert (r["gpus"], r["mem_mib"], r["note"]) == ([3], 20480, "eval")
    assert bk.data("e", "1", "-m", "auto")["reservation"]["mem_mib"] is None
    assert bk.data("e", "1", "--mode", "exclusive")["reservation"]["mode"] == "exclusive"
    dry = bk.data("e", "1", "-d", "1h", "--dry-run")
    assert dry["dry_run"] and bk.data("l")["reservations"][0]["end"] == "2026-07-13T23:30:00Z"
    out = bk.ok("e", "1", "-d", "1h").out
    assert out.startswith("updated ") and "\nwas " in out


def test_edit_active_moves_only_the_end(bk):
    bk.ok("1", "1h")                                   # 10:40-11:40, running
    assert bk.data("e", "1", "-d", "+30m")["reservation"]["end"] == "2026-07-13T12:10:00Z"
    assert bk.data("e", "1", "-d", "-15m")["reservation"]["end"] == "2026-07-13T11:55:00Z"
    assert bk.data("e", "1", "-d", "13:00")["reservation"]["end"] == "2026-07-13T13:00:00Z"
    assert bk.data("e", "1", "-d", "total 2h")["reservation"]["end"] == "2026-07-13T12:40:00Z"
    assert bk.data("e", "1", "--duration", "-15m")["reservation"]["end"] == "2026-07-13T12:25:00Z"
    r = bk.json("e", "1", "-t", "12:00")
    assert r.code == 2 and "only its end" in r.error["message"]


def test_edit_without_flags_is_a_usage_error_off_a_terminal(bk):
    bk.ok("1", "1h")
    r = bk("e", "1")
    assert r.code == 2 and "-d 2h" in r.err


def test_edit_not_found_and_unchanged(bk):
    assert bk("e", "7", "-d", "1h").code == 4
    bk.ok("1", "1h", "-t", "20:00")
    assert bk.data("e", "1", "-d", "1h")["status"] == "unchanged"


# ------------------------------------------------------------------- cancel

def test_cancel_by_number_and_prefix_dry_run_op_id(bk):
    a = _book(bk, "1", "1h", "-t", "20:00")
    bk.ok("1", "1h", "-t", "21:00")
    dry = bk.data("d", a["short_id"][:5], "--dry-run")
    assert dry["dry_run"] and len(bk.data("l")["reservations"]) == 2
    d = bk.data("rm", "1", "--op-id", "c1")
    assert d["status"] == "cancelled" and d["reservation"]["status"] == "cancelled"
    assert d["reservation"]["id"] == a["id"]
    again = bk.data("cancel", a["id"], "--op-id", "c1")
    assert again["status"] == "exists"
    assert bk.ok("del", "1").out.startswith("cancelled 1 GPU")
    assert bk.data("l")["reservations"] == []


def test_cancel_active_asks_at_a_terminal_only(bk):
    bk.ok("1", "1h")
    bk.stdin_tty("n")
    r = bk("d", "1")
    assert r.code == 1 and r.out.startswith("kept") and "stop it now" in r.err
    assert len(bk.data("l")["reservations"]) == 1       # --json never asks
    bk.stdin_tty("y")
    bk.ok("1", "1h", "--again")
    assert bk.ok("d", "1").out.startswith("cancelled")
    assert bk.ok("d", "1", "-y").out.startswith("cancelled")


def test_cancel_without_a_terminal_proceeds(bk):
    bk.ok("1", "1h")
    assert bk.ok("d", "1").out.startswith("cancelled")


# ------------------------------------------------------------------- status

def test_status_table_and_json(bk):
    bk.sim()
    bk.ok("2", "1h", "-g", "0,1")
    bk.service(BOB).run("book", BookRequest(count=1, duration=2 * H, pinned=(0,)))
    d = bk.data("st")
    g0 = d["gpus"][0]
    assert (g0["name"], g0["util"], g0["mem_total_mib"], g0["share_used"], g0["capacity"]) == \
        ("NVIDIA H100 80GB HBM3", 37, 81559, 2, 2)
    assert g0["next_free"] == "2026-07-13T12:40:00Z" and d["gpus"][3]["next_free"] == iso(NOW)
    assert {p["pid"]: p["state"] for p in g0["processes"]} == {4242: "ok", 77: "system"}
    assert d["gpus"][2]["processes"][0]["state"] == "wrong-gpu"     # bob booked GPU 0, runs on 2
    assert d["gpus"][3]["processes"] is None
    assert d["monitor"]["state"] == "absent" and d["monitor"]["pid"] is None    # no bk m ran here
    assert [r["user"] for r in d["reservations"]] == ["ada"]
    assert {r["user"] for r in bk.data("status", "-v")["reservations"]} == {"ada", "bob"}
    out = bk.ok("st").out
    assert "NEXT FREE" in out and "12:40" in out and "1/2" in out and "your bookings:" in out
    verbose = bk.ok("st", "-v").out
    assert "pid 4242 ada python" in verbose and "bob" in verbose


def test_status_disabled_gpu_and_notices(bk):
    bk.config(disabled_gpus=[3])
    bk.service(ROOT).run("notice_publish", NoticeRequest("maintenance on Friday", level="warning"))
    d = bk.data("st")
    assert d["gpus"][3]["state"] == "disabled" and d["gpus"][3]["next_free"] is None
    assert d["notices"][0]["text"] == "maintenance on Friday"
    out = bk.ok("st").out
    assert "WARNING: maintenance on Friday" in out and "never" in out


def test_bare_bk_shows_status_and_a_hint(bk):
    r = bk.ok()
    assert "GPU" in r.out and "bk help" in r.out
    assert bk.json().envelope["command"] == "status"


# ------------------------------------------------------------------- timeline

def test_timeline_marks_own_others_full_and_now(bk):
    bk.ok("1", "1h", "-g", "0")
    bk.service(BOB).run("book", BookRequest(count=1, duration=H, pinned=(1,)))
    bk.service(BOB).run("book", BookRequest(count=1, duration=H, mode="exclusive", pinned=(2,)))
    d = bk.data("tl", "--from", "now", "--window", "2h", "--step", "10m")
    assert (d["from"], d["to"], d["step"]) == ("2026-07-13T10:40:00Z", "2026-07-13T12:40:00Z", 600)
    cells = {g["index"]: g["cells"] for g in d["gpus"]}
    assert len(cells[0]) == 12
    assert cells[0][0]["mine"] and cells[0][0]["used"] == 1
    assert cells[1][0]["others"] and not cells[1][0]["mine"]
    assert cells[2][0]["used"] == 2 and cells[3][0]["used"] == 0
    assert cells[0][6]["used"] == 0                        # 11:40, after the end
    out = bk.ok("timeline", "--from", "now", "--window", "2h", "--step", "10m").out
    rows = {line[:5]: line[6:] for line in out.splitlines() if line.startswith("GPU ")}
    assert rows["GPU 0"].startswith("aaaaaa·") and rows["GPU 1"].startswith("111111·")
    assert rows["GPU 2"].startswith("██████·") and set(rows["GPU 3"]) == {"·"}
    assert "▼ now" in out and "a  yours:" in out


def test_timeline_shows_every_own_booking_even_where_two_overlap(bk):
    bk.ok("1", "1h", "-g", "0")
    bk.ok("1", "30m", "-g", "0", "-t", "+20m")          # inside the first, same GPU
    out = bk.ok("timeline", "--from", "now", "--window", "2h", "--step", "10m").out
    row = next(line[6:] for line in out.splitlines() if line.startswith("GPU 0"))
    assert row.startswith("aa&&&a·"), row                # the second is drawn, not hidden behind a
    assert "&: two or more of yours" in " ".join(out.split())
    d = bk.data("tl", "--from", "now", "--window", "2h", "--step", "10m")
    assert len(d["gpus"][0]["cells"][2]["mine"]) == 2


def test_timeline_window_word_gpus_and_limits(bk):
    d = bk.data("tl", "24h", "-g", "1,2")
    assert [g["index"] for g in d["gpus"]] == [1, 2]
    assert parse_iso(d["to"]) - parse_iso(d["from"]) >= 24 * H
    past = bk.data("tl", "--from", "-2h", "--window", "3h")
    assert parse_iso(past["from"]) <= NOW - 2 * H
    assert bk("tl", "12h", "--step", "5m").code == 2          # 144 columns in 80
    assert bk("tl", "-g", "9").code == 2


# ------------------------------------------------------------------- slots and g

def test_slots_commands_book_exactly_what_they_offer(bk):
    bk.ok("x", "2", "1h", "-g", "0,1")
    d = bk.data("slots", "4", "1h")
    assert len(d["options"]) == 3
    first = d["options"][0]
    assert first["start"] == "2026-07-13T11:40:00Z" and first["gpus"] == [0, 1, 2, 3]
    assert first["command"] == "bk 4 1h -g 0,1,2,3 --start 2026-07-13T11:40:00Z"
    now_opt = bk.data("slots", "2", "30m", "12g")["options"][0]
    assert now_opt["command"] == "bk 2 30m 12g -g 2,3"          # now: no --start
    booked = bk.data(*shlex.split(first["command"])[1:])["reservation"]
    assert (booked["start"], booked["gpus"]) == (first["start"], first["gpus"])
    assert len(bk.data("slots", "1", "1h", "-n", "5", "--mode", "exclusive")["options"]) == 5
    human = bk.ok("slots", "2", "1h").out
    assert "options for 2 GPUs" in human and "   bk 2 1h -g" in human


def test_slots_nothing_found_exits_3(bk):
    r = bk.json("slots", "5", "1h")
    assert r.code == 3 and r.error["code"] == "conflict"


def test_gpu_recommends_then_shows_current(bk):
    d = bk.data("g")
    assert d["current"] == [] and d["options"][0]["gpus"] == [0] and d["export"] is None
    assert d["options"][0]["command"] == "bk 1 1h -g 0"
    bk.ok("2", "1h", "-g", "1,2")
    d = bk.data("gpu")
    assert [r["gpus"] for r in d["current"]] == [[1, 2]]
    assert d["export"].endswith("CUDA_VISIBLE_DEVICES=1,2")
    assert "export CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1,2" in bk.ok("g").out
    four = bk.data("g", "2")                          # an explicit N always recommends
    assert four["options"] and four["current"]


def test_gpu_nothing_free_now_shows_the_earliest_and_succeeds(bk):
    """bk g asks where to run: "not now, but at 12:40, with this command" is
    an answer (exit 0), not an error; exit 3 only when nothing fits at all."""
    bk.ok("x", "1", "2h", "-g", "3")
    d = bk.data("g", "4")
    assert d["free_now"] is False and d["options"][0]["start"] == "2026-07-13T12:40:00Z"
    assert d["options"][0]["command"].endswith("--start 2026-07-13T12:40:00Z")     # exact, for programs
    r = bk.ok("g", "4")
    assert "nothing free now" in r.out and "12:40" in r.out
    assert "bk 4 1h -g 0,1,2,3 -t '2026-07-13 12:40'" in r.out                  # local, for people
    booked = bk.data("4", "1h", "-g", "0,1,2,3", "-t", "2026-07-13 12:40")      # and it books that slot
    assert booked["reservation"]["start"] == "2026-07-13T12:40:00Z"
    assert bk.json("g", "5").code == 3                                           # never fits here


def test_gpu_exits_3_only_when_nothing_fits_within_the_search_window(bk):
    bk.config(queue_search_hours=1)
    bk.ok("x", "4", "3h")
    r = bk.json("g", "1")
    assert r.code == 3 and "queue_search_hours" in r.error["message"]


# ------------------------------------------------------------------- notices, history, log

def test_notices(bk):
    assert bk.data("n")["notices"] == [] and bk.ok("notices").out.strip() == "no notices"
    bk.service(ROOT).run("notice_publish", NoticeRequest("new drivers tonight"))
    n = bk.data("n")["notices"]
    assert [x["text"] for x in n] == ["new drivers tonight"] and n[0]["scope"] == "everyone"


def test_admin_cancel_notice_reaches_the_owner(bk):
    rid = _book(bk, "1", "1h", "-t", "20:00")["id"]
    bk.service(ROOT).run("cancel", CancelRequest(ref=rid, reason="maintenance"))
    n = bk.data("n")["notices"]
    assert n[0]["scope"] == "you" and "maintenance" in n[0]["text"]


def test_history_shows_the_lifecycle(bk):
    rid = _book(bk, "1", "1h", "-t", "20:00")["id"]
    bk.ok("e", "1", "-d", "2h")
    bk.ok("d", "1")
    d = bk.data("history", rid[:6])
    assert [e["action"] for e in d["events"]] == ["create", "edit", "cancel"]
    assert d["source"] == "audit" and d["reservation"]["status"] == "cancelled"
    out = bk.ok("history", rid[:6]).out
    assert "booked by ada" in out and "end 07-13 21:00 → 07-13 22:00" in out and "cancelled by ada" in out


def test_log_is_my_trail(bk):
    bk.ok("1", "1h")
    bk.ok("1", "1h", "--op-id", "x")
    bk.service(BOB).run("book", BookRequest(count=1, duration=H))
    d = bk.data("lg")
    assert [e["action"] for e in d["entries"]] == ["create", "create"] and d["complete"]
    assert len(bk.data("log", "-n", "1")["entries"]) == 1
    assert "booked by ada" in bk.ok("lg").out


# ------------------------------------------------------------------- info, login, config

def test_info(bk):
    bk.config(admin_contact="GPU team <gpu@example.org>", slot_minutes=10)
    d = bk.data("info")
    assert d["admin"] == {"contact": "GPU team <gpu@example.org>", "source": "config", "account": None}
    assert d["policy"]["slot_minutes"] == 10 and d["gpu_count"] == 4 and d["mode"] == "private"
    assert "GPU team" in bk.ok("info").out


def test_login_is_silent_when_there_is_nothing_to_say(bk):
    r = bk.ok("login")
    assert (r.out, r.err) == ("", "")
    assert bk.data("login") == {"now": iso(NOW), "notices": [], "reservations": []}
    bk.ok("1", "1h", "-t", "20:00")                    # not within the hour: still silent
    assert bk.ok("login").out == ""
    bk.ok("1", "30m", "-t", "11:30")
    assert "within the hour" in bk.ok("login").out
    assert len(bk.data("login")["reservations"]) == 1


def test_config_names_every_source(bk):
    bk.config(slot_minutes=10)
    d = bk.data("config")
    s = d["settings"]
    assert s["slot_minutes"] == {"value": 10, "source": "file", "security": False,
                                 "doc": s["slot_minutes"]["doc"]}
    assert s["max_shared_users"]["source"] == "default"
    assert s["gpu_count"] == {**s["gpu_count"], "value": 4, "source": "environment"}   # BK_GPU_COUNT
    assert d["config_read"] == str(bk.config_file)
    assert "slot_minutes" in bk.ok("config").out


# ------------------------------------------------------------------- doctor, tutorial, help

def test_doctor_passes_then_strict_fails(bk):
    bk.ok("1", "1h")
    d = bk.data("doctor")
    assert d["ok"] and {"config", "ledger", "policy", "gpu_backend"} <= {c["name"] for c in d["checks"]}
    bk.data_dir.chmod(0o755)
    r = bk.json("doctor")
    assert r.code == 0 and not r.data["ok"]
    assert bk("doctor", "--strict").code == 1
    assert "FAIL" in bk("doctor").out


def test_tutorial_follows_the_policy(bk):
    bk.config(slot_minutes=10, max_shared_users=3)
    d = bk.data("tutorial")
    assert d["policy"]["slot_minutes"] == 10
    out = bk.ok("tutorial").out
    assert "10-minute slices" in out and "3 share slots" in out and "$ bk 1 30m" in out
    assert bk.data("l")["reservations"] == []           # read-only


def test_help_and_unknown_commands(bk):
    assert "bk help COMMAND" in bk.ok("help").out
    assert "usage" in bk.ok("help", "slots").out.lower()
    r = bk("stauts")
    assert r.code == 2 and "bk status" in r.err


def test_other_users_bookings_are_theirs(bk):
    other = bk.service(BOB).run("book", BookRequest(count=1, duration=H)).reservation
    r = bk.json("e", other.id[:8], "-d", "2h")
    assert r.code == 5 and r.error["code"] == "permission_denied"
    assert ME.uid != other.uid


MY_COMMANDS = ("book", "exclusive", "list", "edit", "cancel", "status", "timeline", "slots", "gpu",
               "notices", "history", "log", "info", "login", "config", "doctor", "tutorial")


def _parses(line: str) -> None:
    from bk.cli.app import _strip_json, parse_argv

    words = shlex.split(re.split(r"\s{2,}|\s\(|\s\|", line)[0])      # drop comments and pipes
    assert words[0] == "bk", line
    parse_argv(_strip_json(words[1:])[0])


@pytest.mark.slow
def test_tutorial_and_help_examples_are_real_commands(bk):
    for step in bk.data("tutorial")["steps"]:
        for command in step["commands"]:
            _parses(command)
    for name in MY_COMMANDS:
        text = bk.data("help", name)["text"]
        examples = text.split("Examples:", 1)[1].split("\n\n")[0]
        for line in examples.strip().splitlines():
            _parses(line.strip())


def test_doctor_probe_tries_the_writes_a_booking_needs(bk):
    bk.ok("1", "30m")
    report = bk.data("doctor", "--probe", "--strict")
    names = {c["name"]: c["ok"] for c in report["checks"]}
    assert report["probe"] is True and names["atomic replace"] and names["locking"]
    assert "atomic replace" not in {c["name"] for c in bk.data("doctor")["checks"]}


def test_a_cancellation_notice_is_shown_for_a_week_then_expires(bk):
    from bk.service.requests import Actor

    booked = bk.data("1", "30m")["reservation"]
    bk.service(actor=Actor(0, "root")).run("cancel", CancelRequest(ref=booked["id"], reason="node reboot"))
    mine = bk.data("n")["notices"]
    assert [n["text"] for n in mine] == [f"Your booking {booked['short_id']} was cancelled by the "
                                         "administrator: node reboot"]
    assert parse_iso(mine[0]["until"]) == parse_iso(mine[0]["at"]) + 7 * 86400
    bk.mp.setenv("BK_NOW", iso(NOW + 8 * 86400))      # a week and a day later
    assert bk.data("n")["notices"] == []
    assert len(bk.data("n", "--all")["notices"]) == 1


def test_log_all_is_for_the_administrator(bk):
    bk.ok("1", "30m")
    r = bk.json("lg", "--all")           # the fake user is ada (uid 1000), not root
    assert r.code == 5 and r.error["code"] == "permission_denied"


def test_booking_a_gpu_someone_uses_without_a_booking_warns(bk):
    bk.sim()
    # GPU 0: ada's own process and Xorg (no warning); GPU 2: bob's train.py, no booking.
    r = bk.json("x", "1", "1h", "-g", "0")
    assert r.envelope["warnings"] == []
    r = bk.json("x", "1", "1h", "-g", "2")
    assert r.envelope["warnings"] == ["GPU 2 is in use right now by a process of bob without a "
                                      "booking there (2048 MiB)"]
    bk.service().run("book", BookRequest(count=1, duration=3600, pinned=(1,)))        # bob books GPU 1 ...
    assert bk.json("1", "1h", "-g", "1").envelope["warnings"] == []           # ... no process there


def test_placement_prefers_the_less_loaded_gpu_among_equals(bk):
    doc = {"gpus": [{"util": 80, "processes": [{"pid": 1, "uid": 1000}]},
                    {"util": 20, "processes": [{"pid": 2, "uid": 1000}]}]}
    bk.sim(doc)
    placed = bk.data("1", "30m")
    assert placed["reservation"]["gpus"] == [1], placed["placement"]
    assert "load 0.20" in placed["placement"]["gpus"]["1"]


def test_same_start_bookings_keep_booking_order_even_within_one_second(bk):
    # BK_NOW is fixed: all three are created in the same second.
    ids = [bk.data(*argv)["reservation"]["id"] for argv in (["1", "30m"], ["2", "1h30m", "12g"],
                                                             ["x", "1", "2h"])]
    assert [r["id"] for r in bk.data("l")["reservations"]] == ids


def test_the_administrators_all_view_lists_notices_to_users(bk):
    from helpers_cli import ROOT as ROOT_ACTOR

    booked = bk.data("1", "30m")["reservation"]
    root = bk.service(actor=ROOT_ACTOR)
    root.run("cancel", CancelRequest(ref=booked["id"], reason="reboot"))
    from bk.service import NoticesRequest

    assert [n.uid for n in root.run("notices", NoticesRequest()).notices] == []     # not addressed to root
    assert [n.uid for n in root.run("notices", NoticesRequest(all=True)).notices] == [ME.uid]
    assert [n.uid for n in bk.service().run("notices", NoticesRequest(all=True)).notices] == []   # bob: not his


def test_a_machine_with_fewer_gpus_than_the_ledger_warns_and_shows_every_booked_gpu(bk):
    bk.ok("1", "1h", "-g", "6", BK_GPU_COUNT="8")     # the ledger is bound to 8 GPUs
    r = bk.json("st")                                 # now the machine shows 4
    assert any("this machine has 4 GPUs but the ledger was made for 8" in w for w in r.envelope["warnings"])
    rows = {g["index"]: g for g in r.data["gpus"]}
    assert sorted(rows) == [0, 1, 2, 3, 6] and rows[6]["state"] == "absent" and rows[6]["share_used"] == 1
    assert "this machine has 4 GPUs" in bk.ok("l").err
    tl = bk.data("tl", "--from", "now", "--window", "1h", "--step", "10m")
    assert [g["index"] for g in tl["gpus"]] == [0, 1, 2, 3, 6] and tl["gpus"][4]["cells"][0]["mine"]
    assert "GPU 6" in bk.ok("tl", "--from", "now", "--window", "1h", "--step", "10m").out
    assert bk.json("1", "30m").code == 78             # writes refuse the mismatch (policy binding)


def test_info_shows_the_admin_contact_escaped(bk):
    bk.config(admin_contact="Ada \x1b]0;owned\x07 <ada@lab>")
    out = bk.ok("info").out
    assert "\x1b" not in out and "\x07" not in out and "\\x1b]0;owned\\x07" in out
