"""``bk u`` and its sub-commands, in-process (fixed clock 2026-07-13
10:41:30 UTC, user ada uid 1000) and through the built ``bk.pyz``, on a
history written by the real Folder and UsageStore."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers_cli import BOB, ME, NOW, NOW_ISO, bk_fixture

from bk.core.models import GpuInfo, GpuProcess, iso
from bk.core.telemetry import Snapshot
from bk.core.usage import DAY, Folder
from bk.service.requests import BookRequest
from bk.store.usage import UsageStore

H = 3600
TODAY = NOW - NOW % DAY


@pytest.fixture
def bk(monkeypatch, capsys):
    yield from bk_fixture(monkeypatch, capsys)


def history(bk) -> tuple[str, str]:
    """Two bookings: ada's on GPU 0 (09:00-10:30 today; her process ran the
    first 40 minutes), bob's on GPU 1 yesterday (2 h, used throughout); and
    bob on GPU 2 today without a booking (10:00-10:30).  Sampled every 10 s."""
    app_me, app_bob = bk.service(ME), bk.service(BOB)
    call = app_me.call()
    # Bookings in the past cannot be made; write the history against
    # reservations shaped like them, then book ada's real one for the ledger.
    mine = app_me.run("book", BookRequest(count=1, duration=H, start=NOW - NOW % 300 + 300, pinned=(0,)),
                       call=call).reservation
    ada = mine.replace(start=TODAY + 9 * H, end=TODAY + 10 * H + 30 * 60)
    bobs = app_bob.run("book", BookRequest(count=1, duration=H, start=NOW - NOW % 300 + 300, pinned=(1,)),
                        call=app_bob.call()).reservation
    bob = bobs.replace(start=TODAY - DAY + 12 * H, end=TODAY - DAY + 14 * H, gpus=(1,))
    folder = Folder(60, 10)
    recs = []
    for t in range(TODAY - DAY + 11 * H, NOW - 120, 10):
        gpus = []
        for g in range(4):
            procs = []
            if g == 0 and ada.start <= t < ada.start + 40 * 60:
                procs.append(GpuProcess(100, 9000, 70, ME.uid))
            if g == 1 and bob.start <= t < bob.end:
                procs.append(GpuProcess(200, 5000, 40, BOB.uid))
            if g == 2 and TODAY + 10 * H <= t < TODAY + 10 * H + 1800:
                procs.append(GpuProcess(300, 700, 10, BOB.uid))
            gpus.append(GpuInfo(g, f"GPU-{g}", "sim", 81920, sum(p.mem_mib for p in procs), 50 if procs else 0,
                                None, procs))
        recs += folder.add(t, Snapshot(t, "sim", tuple(gpus)), None, [ada, bob])
    recs += folder.flush()
    UsageStore(os.path.join(str(bk.data_dir), "usage")).append(recs, now=NOW)
    return mine.id, bobs.id


def test_no_history_says_how_to_start_the_monitor(bk):
    r = bk.ok("u")
    assert "no usage recorded yet" in r.out and "bk m" in r.out
    d = bk.data("u")
    assert d["history"] is False and d["totals"]["today"]["booked_s"] == 0 and "bk m" in d["hint"]
    for sub in ("users", "samples", "events"):
        assert bk.data("u", sub)["history"] is False
    assert bk.data("u", "verify") == {"ok": True, "partitions": []}


def test_dashboard(bk):
    rid, _ = history(bk)
    d = bk.data("u")
    assert d["history"] is True and d["user"] == "ada"
    today = d["totals"]["today"]
    assert (today["booked_s"], today["active_s"], today["idle_s"]) == (90 * 60, 40 * 60, 50 * 60)
    assert today["idle_share"] == 0.5556 and today["sm_avg"] == 70.0 and today["mem_peak_mib"] == 9000
    assert d["totals"]["7d"]["booked_s"] == d["totals"]["28d"]["booked_s"] == 5400
    assert len(d["days"]) == 7 and len(d["weeks"]) == 4
    assert d["days"][-1]["start"] == iso(TODAY) and d["days"][-1]["booked_s"] == 5400
    assert sum(w["booked_s"] for w in d["weeks"]) == 5400
    (b,) = d["bookings"]
    assert b["reservation"] == rid and b["gpus"] == [0] and b["booked_s"] == 5400
    assert b["status"] == "upcoming" and b["start"] is not None      # joined with the ledger's booking
    text = bk.ok("u").out
    assert "today     booked 1.5h, active 40m, idle 56% of it" in text
    assert "last 7 days:" in text and "last 4 weeks:" in text and "█" in text and "░" in text
    assert rid[:8] in text


@pytest.mark.slow
def test_users_table(bk):
    history(bk)
    d = bk.data("u", "users", "--since", "30d")
    rows = {u["user"]: u for u in d["users"]}
    assert rows["ada"]["booked_s"] == 5400 and rows["ada"]["active_s"] == 2400
    bob = rows["bob"]
    assert (bob["booked_s"], bob["active_s"], bob["unreserved_s"]) == (2 * H, 2 * H, 1800)
    assert bob["idle_share"] == 0.0 and bob["mem_peak_mib"] == 5000
    assert d["since"] == iso(NOW - 30 * DAY) and d["until"] == NOW_ISO
    gpus = {g["gpu"]: g for g in d["gpus"]}
    assert gpus[2]["unreserved_s"] == 1800 and gpus[0]["booked_s"] == 5400
    text = bk.ok("u", "users").out
    assert "USER" in text and "UNRESERVED" in text and "ada" in text and "56%" in text
    # --until before --since, and words that are not times
    assert bk.json("u", "users", "--since", "1d", "--until", "2d").code == 2
    assert bk.json("u", "users", "--since", "soon").error["code"] == "invalid_input"


def test_samples(bk):
    history(bk)
    d = bk.data("u", "samples", "--since", "2h", "-g", "2", "-n", "5")
    assert len(d["records"]) == 5 and d["total"] > 5
    assert {r["gpu"] for r in d["records"]} == {2}
    last = d["records"][-1]
    assert set(last) >= {"start", "end", "gpu", "period_s", "samples", "covered_s", "util_avg", "mem_peak_mib",
                         "blind_s", "uses"}
    rec = bk.data("u", "samples", "--since", iso(TODAY + 10 * H), "--until", iso(TODAY + 10 * H + 60), "-g", "2")
    assert rec["records"][0]["uses"] == [{"uid": BOB.uid, "reservation": None, "mode": None, "booked_s": 0,
                                          "active_s": 0, "unreserved_s": 60, "sm_avg": 10.0, "sm_n": 6,
                                          "mem_peak_mib": 700, "energy_mj": None}]     # no counter in this history
    assert "UID@BOOKING" in bk.ok("u", "samples", "-g", "0").out


@pytest.mark.slow
def test_events(bk):
    rid, _ = history(bk)
    d = bk.data("u", "events", "--since", "2d")
    kinds = [(e["kind"], e["user"], e["gpu"], e["start"], e["end"]) for e in d["events"]]
    assert ("unreserved", "bob", 2, iso(TODAY + 10 * H), iso(TODAY + 10 * H + 1800)) in kinds
    assert ("idle-booking", "ada", 0, iso(TODAY + 9 * H + 40 * 60), iso(TODAY + 10 * H + 30 * 60)) in kinds
    assert bk.data("u", "events", "--since", "2d", "--idle", "2h")["events"] == \
        [e for e in d["events"] if e["kind"] == "unreserved"]
    assert "idle-booking" in bk.ok("u", "events", "--since", "2d").out


@pytest.mark.slow
def test_verify_and_tampering(bk):
    history(bk)
    usage = os.path.join(str(bk.data_dir), "usage")
    UsageStore(usage).maintain(NOW)                            # yesterday is sealed
    d = bk.data("u", "verify")
    assert d["ok"] is True and {p["state"] for p in d["partitions"]} == {"ok", "unsealed"}
    day = [p["day"] for p in d["partitions"] if p["state"] == "ok"][0]
    path = os.path.join(usage, "raw", f"{day}.jsonl")
    data = open(path, "rb").read().replace(b'"active_s":60', b'"active_s":59', 1)
    open(path, "wb").write(data)
    r = bk.json("u", "verify")
    assert r.code == 1 and not r.data["ok"]
    assert "tampered" in bk("u", "verify").out


# ------------------------------------------------------------ the built archive

@pytest.fixture
def run(pyz, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update(BK_DATA_DIR=str(tmp_path / "data"), BK_GPU_COUNT="4", BK_NOW=NOW_ISO, TZ="UTC",
               HOME=str(tmp_path), COLUMNS="100", NO_COLOR="1")

    def bk(*argv: str, code: int = 0, **more) -> subprocess.CompletedProcess:
        p = subprocess.run([sys.executable, str(pyz), *argv], env={**env, **more}, capture_output=True,
                           stdin=subprocess.DEVNULL, text=True, timeout=60)
        assert p.returncode == code, (argv, p.returncode, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr
        return p
    bk.data_dir = tmp_path / "data"
    return bk


@pytest.mark.slow
def test_pyz_fresh_data_dir(run):
    r = run("u")
    assert "no usage recorded yet" in r.stdout and "bk m" in r.stdout
    env = json.loads(run("u", "users", "--since", "30d", "--json").stdout)
    assert env["ok"] and env["command"] == "usage users" and env["data"]["users"] == []
    assert "bk u users --since 30d" in run("help", "u").stdout


def test_pyz_chart_is_ascii_without_utf8(run):
    os.makedirs(run.data_dir, mode=0o700)
    recs = []
    folder = Folder(60, 30)
    from bk.core.models import Reservation

    r = Reservation("a" * 36, os.getuid(), "me", "shared", (0,), 1, TODAY + 8 * H, TODAY + 10 * H, TODAY)
    for t in range(TODAY + 8 * H, TODAY + 10 * H, 30):
        procs = [GpuProcess(1, 100, 50, os.getuid())] if t < TODAY + 9 * H else []
        recs += folder.add(t, Snapshot(t, "sim", (GpuInfo(0, "g", "sim", 1000, 0, 0, None, procs),)), None, [r])
    UsageStore(str(run.data_dir / "usage")).append(recs + folder.flush(), now=NOW)
    utf8 = run("u", PYTHONIOENCODING="utf-8").stdout
    ascii_ = run("u", PYTHONIOENCODING="ascii").stdout
    assert "█" in utf8 and "░" in utf8
    assert "#" in ascii_ and "=" in ascii_ and all(ord(c) < 128 for c in ascii_)
    assert "today     booked 2.0h, active 1.0h, idle 50% of it" in ascii_


def test_pyz_dashboard_takes_since_as_people_write_it(run):
    """Issue 30 item 13: `bk u --since 7d` failed as "invalid choice: '7d'"."""
    os.makedirs(run.data_dir, mode=0o700)
    from bk.core.models import Reservation

    folder, recs = Folder(60, 30), []
    old = Reservation("b" * 36, os.getuid(), "me", "shared", (0,), 1, TODAY - 3 * DAY + 8 * H, TODAY - 3 * DAY + 10 * H,
                      TODAY - 3 * DAY)
    new = Reservation("c" * 36, os.getuid(), "me", "shared", (0,), 1, TODAY + 8 * H, TODAY + 9 * H, TODAY)
    for r in (old, new):
        for t in range(r.start, r.end, 30):
            procs = [GpuProcess(1, 100, 50, os.getuid())] if t < r.start + H else []
            recs += folder.add(t, Snapshot(t, "sim", (GpuInfo(0, "g", "sim", 1000, 0, 0, None, procs),)), None, [r])
    UsageStore(str(run.data_dir / "usage")).append(recs + folder.flush(), now=NOW)
    week = json.loads(run("u", "--since", "7d", "--json").stdout)["data"]
    assert week["period"]["totals"]["booked_s"] == 3 * H and week["period"]["totals"]["active_s"] == 2 * H
    assert week["totals"]["7d"]["booked_s"] == 3 * H                    # the dashboard is all there too
    two = json.loads(run("u", "--since", "2d", "--json").stdout)["data"]["period"]
    assert two["totals"]["booked_s"] == H and two["until"] == NOW_ISO
    text = run("u", "--since", "2d").stdout
    assert "booked 1.0h, active 1.0h, idle 0% of it" in text and "today     " in text
    assert "--since" in run("u", "--until", "1d", code=2).stderr


def test_unreadable_history_is_a_permission_not_a_disk_error(bk, monkeypatch):
    import errno

    from bk.core.errors import IOFailure

    def denied(self, *a, **kw):
        raise IOFailure(f"cannot open {self.dir}", details={"path": self.dir, "errno": errno.EACCES})

    monkeypatch.setattr(UsageStore, "span", denied)
    r = bk.json("u")
    assert r.code == 5 and r.error["code"] == "permission_denied" and "usage history" in r.error["message"]
    monkeypatch.setattr(UsageStore, "span", lambda self: (_ for _ in ()).throw(
        IOFailure("disk on fire", details={"errno": errno.EIO})))
    assert bk.json("u").error["code"] == "io_error"


def test_an_empty_week_is_one_line(bk):
    os.makedirs(bk.data_dir / "usage", exist_ok=True)
    f = Folder(60, 2)
    f.add(NOW - 40 * DAY, Snapshot(NOW - 40 * DAY, "sim", (GpuInfo(0, "g", "sim"),)), None, [])
    UsageStore(str(bk.data_dir / "usage")).append(f.flush(), now=NOW - 40 * DAY + 60)
    text = bk.ok("u").out
    assert text.count("nothing booked\n") == 2 and "today     nothing booked or used" in text


def test_recent_bookings_keep_their_span_after_archiving(bk, monkeypatch):
    app = bk.service(ME)
    r = app.run("book", BookRequest(count=1, duration=H, pinned=(0,)), call=app.call()).reservation
    folder = Folder(60, 30)
    recs = []
    for t in range(r.start, r.end, 30):
        g = GpuInfo(0, "g", "sim", 1000, 0, 0, None, [GpuProcess(1, 10, 5, ME.uid)])
        recs += folder.add(t, Snapshot(t, "sim", (g,)), None, [r])
    UsageStore(str(bk.data_dir / "usage")).append(recs + folder.flush(), now=r.end)
    monkeypatch.setenv("BK_NOW", iso(NOW + 2 * DAY))
    app = bk.service(ME)
    app.run("book", BookRequest(count=1, duration=H), call=app.call())          # a commit archives the old one
    assert r.id not in {x.id for x in app.ledger().reservations}
    (b,) = bk.data("u")["bookings"]
    assert (b["reservation"], b["status"], b["start"], b["end"]) == (r.id, "ended", iso(r.start), iso(r.end))
    assert (b["booked_s"], b["active_s"]) == (H, H)


# ------------------------------------------------------------ damaged lines (issue 30, item 14)

def _two_hours(uid: int) -> list:
    """Two hours today (08:00-10:00) of one booking of ``uid`` on GPU 0, used the first hour."""
    from bk.core.models import Reservation

    r = Reservation("b" * 36, uid, "me", "shared", (0,), 1, TODAY + 8 * H, TODAY + 10 * H, TODAY)
    folder, recs = Folder(60, 30), []
    for t in range(TODAY + 8 * H, TODAY + 10 * H, 30):
        procs = [GpuProcess(1, 100, 50, uid)] if t < TODAY + 9 * H else []
        recs += folder.add(t, Snapshot(t, "sim", (GpuInfo(0, "g", "sim", 1000, 0, 40, None, procs),)), None, [r])
    return recs + folder.flush()


def _bad_line(owner: int, **change) -> bytes:
    rec = {"t": TODAY + 7 * H, "gpu": 0, "v": 1, "period_s": 60, "samples": 2, "covered_s": 60,
           "util_avg": 10.0, "util_n": 2, "mem_peak_mib": 100, "blind_s": 0,
           "uses": [{"uid": owner, "reservation": "c" * 36, "mode": "shared", "booked_s": 60, "active_s": 60,
                     "unreserved_s": 0, "sm_avg": 5.0, "sm_n": 2, "mem_peak_mib": 100}]}
    for k, v in change.items():
        (rec["uses"][0] if k in rec["uses"][0] and k != "mem_peak_mib" else rec)[k] = v
    return json.dumps(rec, separators=(",", ":")).encode() + b"\n"


@pytest.mark.parametrize("change", [
    {"booked_s": 10 ** 14}, {"active_s": -60}, {"util_avg": 10 ** 9}, {"mem_peak_mib": 10 ** 30},
    {"uid": -1}, {"gpu": 4096}, {"sm_avg": float("nan")}, {"t": TODAY + 7 * H + 1}, {"period_s": 7},
    {"mode": "everything"},
])
def test_pyz_skips_a_record_out_of_range_and_says_so(run, change):
    uid = os.getuid()
    store = UsageStore(str(run.data_dir / "usage"))
    os.makedirs(run.data_dir, mode=0o700)
    store.append(_two_hours(uid), now=NOW)
    path = run.data_dir / "usage" / "raw" / f"{iso(TODAY)[:10]}.jsonl"
    with open(path, "ab") as f:
        f.write(_bad_line(uid, **change))
    env = json.loads(run("u", "--json").stdout)
    today = env["data"]["totals"]["today"]
    assert (today["booked_s"], today["active_s"]) == (2 * H, H)        # the bad line counts nothing
    if "uid" not in change:         # bk u reads the caller's own lines (by uid) and names the bad ones
        assert any("line 121 is not a usage record" in w for w in env["warnings"]), env["warnings"]
        assert "line 121 is not a usage record" in run("u").stderr
    assert "line 121 is not a usage record" in run("u", "users").stderr
    users = json.loads(run("u", "users", "--json").stdout)["data"]
    assert [u["booked_s"] for u in users["users"]] == [2 * H]
    assert [(g["gpu"], g["booked_s"], g["sm_avg"], g["mem_peak_mib"]) for g in users["gpus"]] == [(0, 2 * H, 40.0, 0)]
    v = run("u", "verify", "--json", code=1)
    (part,) = json.loads(v.stdout)["data"]["partitions"]
    assert part["state"] == "damaged" and part["records"] == 120 and "line 121" in part["detail"]
    assert "damaged" in run("u", "verify", code=1).stdout


def test_pyz_dashboard_warns_about_a_line_that_is_not_json(run):
    """``bk u`` reads only the caller's lines (found by their uid before
    parsing); a line that is not a record at all is still named."""
    uid = os.getuid()
    os.makedirs(run.data_dir, mode=0o700)
    UsageStore(str(run.data_dir / "usage")).append(_two_hours(uid), now=NOW)
    path = run.data_dir / "usage" / "raw" / f"{iso(TODAY)[:10]}.jsonl"
    with open(path, "ab") as f:
        f.write(b"\x00\x00garbage\n")
    r = run("u")
    assert "booked 2.0h" in r.stdout and "line 121 is not valid JSON; skipped" in r.stderr
    assert run("u", "verify", code=1).returncode == 1


def test_pyz_a_sealed_day_with_a_bad_line_or_bad_totals_is_damaged(run):
    uid = os.getuid()
    os.makedirs(run.data_dir, mode=0o700)
    usage = run.data_dir / "usage"
    recs = [r.__class__(**{**{f: getattr(r, f) for f in ("t", "gpu", "period_s", "samples", "covered_s",
                                                           "util_avg", "util_n", "mem_peak_mib", "blind_s",
                                                           "uses")}, "t": r.t - DAY})
            for r in _two_hours(uid)]
    store = UsageStore(str(usage))
    store.append(recs, now=NOW - DAY)
    day = iso(TODAY - DAY)[:10]
    with open(usage / "raw" / f"{day}.jsonl", "ab") as f:
        f.write(_bad_line(uid, booked_s=10 ** 14).replace(b'"t":%d' % (TODAY + 7 * H), b'"t":%d' % (TODAY - DAY)))
    store.maintain(NOW)                                   # yesterday is sealed, over the bad line
    week = json.loads(run("u", "--json").stdout)["data"]["totals"]["7d"]
    assert week["booked_s"] == 2 * H
    assert json.loads(run("u", "users", "--since", "3d", "--json").stdout)["data"]["users"][0]["booked_s"] == 2 * H
    (part,) = json.loads(run("u", "verify", "--json", code=1).stdout)["data"]["partitions"]
    assert part["state"] == "damaged" and "booked_s 100000000000000" in part["detail"]
    # A seal whose totals were raised, its checksum kept: not believed either.
    os.unlink(usage / "raw" / f"{day}.seal")
    with open(usage / "raw" / f"{day}.jsonl", "rb") as f:
        good = b"".join(ln for ln in f.read().splitlines(keepends=True) if b"100000000000000" not in ln)
    with open(usage / "raw" / f"{day}.jsonl", "wb") as f:
        f.write(good)
    store.maintain(NOW)
    seal_path = usage / "raw" / f"{day}.seal"
    seal = json.loads(seal_path.read_text())
    assert json.loads(run("u", "verify", "--json").stdout)["data"]["ok"] is True
    seal["summary"]["by_uid"][str(uid)]["booked_s"] = 10 ** 14
    seal_path.write_text(json.dumps(seal))
    env = json.loads(run("u", "users", "--since", "3d", "--json").stdout)
    assert env["data"]["users"][0]["booked_s"] == 2 * H and "not a valid seal" in " ".join(env["warnings"])
    (part,) = json.loads(run("u", "verify", "--json", code=1).stdout)["data"]["partitions"]
    assert part["state"] == "damaged" and "seal" in part["detail"]
    seal["summary"]["by_uid"][str(uid)]["booked_s"] = 2 * H - 60     # in range, but not the records' sum
    seal_path.write_text(json.dumps(seal))
    (part,) = json.loads(run("u", "verify", "--json", code=1).stdout)["data"]["partitions"]
    assert part["state"] == "tampered" and "totals" in part["detail"]
