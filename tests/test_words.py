"""The words bk prints, through the built ``bk.pyz`` as a user reads them:
counted nouns in the right number (one helper, ``bk.core.timegrid.counted``,
for every sentence that counts), and the small wording fixes of issue 30
item 20 and issue 23 item 8."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOW_ISO = "2026-07-13T10:41:30Z"


@pytest.fixture
def run(pyz, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update(BK_DATA_DIR=str(tmp_path / "data"), BK_GPU_COUNT="4", BK_NOW=NOW_ISO, TZ="UTC",
               HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"), COLUMNS="100", NO_COLOR="1")

    def bk(*argv: str, code: int = 0, **more) -> subprocess.CompletedProcess:
        p = subprocess.run([sys.executable, str(pyz), *argv], env={**env, **more}, capture_output=True,
                           stdin=subprocess.DEVNULL, text=True, timeout=60)
        assert p.returncode == code, (argv, p.returncode, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr
        return p
    bk.tmp = tmp_path
    bk.env = env
    return bk


def _config(run, **keys) -> str:
    path = run.tmp / "bk.json"
    path.write_text(json.dumps(keys))
    os.chmod(path, 0o644)
    return str(path)


# ------------------------------------------------------------- counted nouns

def test_counted_is_the_one_way_to_count():
    from bk.core.timegrid import counted

    assert [counted(n, "second") for n in (0, 1, 2)] == ["0 seconds", "1 second", "2 seconds"]
    assert counted(1, "process", "processes") == "1 process" and counted(3, "process", "processes") == "3 processes"


# A sentence that counts in its own way ("{n} GPU{'s' if ...}") or puts a
# plural noun after a number that may be 1 ("{n} minutes") is the slip this
# test keeps out; constants in capitals (REPEAT_MINUTES) and fractions
# ("{used}/{cap} slots") are not counts of one.
AD_HOC = re.compile(r"""\{['"](?:s|es)['"] if |['"]s (?:were|break)['"] if |== 1 else ['"]s['"]""")
NOUNS = ("seconds|minutes|hours|days|GPUs|bookings|slots|share slots|samples|files|paths|records|backups|"
         "connections|clients|reservations|processes|checks|warnings|lines|jobs|users|columns|problems")
PLURAL_AFTER_COUNT = re.compile(r"(?<!/)\{([^{}]+)\} (?:" + NOUNS + r")\b")
# Counts that cannot be 1 where they are printed (a message about two or more).
CANNOT_BE_ONE = {("bk/service/booking.py", "len(hits)"), ("bk/store/ledger.py", "len(bad)"),
                 ("bk/core/telemetry.py", "len(gpus)"), ("bk/cli/guided.py", "n"),
                 ("bk/service/timeline.py", "ncols"), ("bk/cli/cmd_cluster.py", "mode"),
                 ("bk/cli/cmd_cluster.py", "res.get('short_id')"), ("bk/cli/cmd_cluster.py", "short"),
                 ("bk/cli/cmd_export.py", "req.gpu")}              # "GPU 3 bookings": an index, not a count


def test_no_sentence_counts_by_hand():
    slips = []
    for path in sorted((ROOT / "bk").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if AD_HOC.search(line) and "def counted" not in line:
                slips.append(f"{rel}:{i}: {line.strip()}")
            for m in PLURAL_AFTER_COUNT.finditer(line):
                expr = m.group(1).split(":")[0].strip()
                if not re.fullmatch(r"[A-Z_]+", expr) and (rel, expr) not in CANNOT_BE_ONE:
                    slips.append(f"{rel}:{i}: {m.group(0)}")
    assert not slips, "count with bk.core.timegrid.counted:\n" + "\n".join(slips)


def test_pyz_info_says_one_minute_one_slot_one_day(run):
    cfg = _config(run, slot_minutes=1, max_shared_users=1, booking_horizon_days=1, max_booking_hours=1,
                  gpu_count=1)
    out = run("info", BK_CONFIG_FILE=cfg, BK_GPU_COUNT="1").stdout
    assert re.search(r"slices +1 minute\n", out), out
    assert "1 share slot per GPU" in out and "ending within 1 day" in out
    tour = run("tutorial", "--json", BK_CONFIG_FILE=cfg, BK_GPU_COUNT="1").stdout
    assert "This server has 1 GPU." in tour and "within 1 day and last at most 1 hour." in tour
    assert "1 share slot of each GPU" in tour
    err = run("1", "1h", "-t", "2026-07-14T11:00:00Z", code=3, BK_CONFIG_FILE=cfg, BK_GPU_COUNT="1").stderr
    assert "within 1 day of now" in err and "1 days" not in err


def test_pyz_a_repeated_booking_counts_its_seconds(run):
    first = run("1", "30m", "-q").stdout.strip()
    again = run("1", "30m", "-q")
    assert again.stdout.strip() == first and "you made this same booking just now:" in again.stderr
    later = run("1", "30m", "-q", BK_NOW="2026-07-13T10:41:31Z")
    assert "you made this same booking 1 second ago:" in later.stderr
    assert "2 seconds ago" in run("1", "30m", "-q", BK_NOW="2026-07-13T10:41:32Z").stderr
    assert "3 minutes ago" in run("1", "30m", "-q", BK_NOW="2026-07-13T10:44:30Z").stderr


# ------------------------------------------------------------- issue 30, item 20

def test_pyz_a_cancelled_or_ended_booking_is_said_so(run):
    rid = run("1", "30m", "-q").stdout.strip()
    run("d", rid, "-y")
    again = run("d", rid, "-y", code=2).stderr
    assert f"reservation {rid} was already cancelled" in again and "has already cancelled" not in again
    edit = run("e", rid, "-d", "+5m", code=2).stderr
    assert f"reservation {rid} was cancelled; it can no longer be edited" in edit
    later = run("1", "30m", "-t", "11:00", "-q").stdout.strip()
    gone = run("d", later, "-y", code=2, BK_NOW="2026-07-13T12:00:00Z").stderr
    assert f"reservation {later} has already ended" in gone


# ------------------------------------------------------------- jobs and lists

def test_pyz_retrying_a_job_that_succeeded_says_there_is_nothing_to_retry(run):
    run("1", "30m", "--", "true")
    run("w", "once")
    job = json.loads(run("j", "--json").stdout)["data"]["jobs"][0]
    assert job["status"] == "succeeded"
    err = run("j", "retry", job["reservation"][:8], code=2).stderr    # its booking ended with it
    assert "succeeded: there is nothing to retry" in err and "bk run N DUR -- CMD" in err
    assert "only a job that ended" not in err            # a job that succeeded ended too


def test_pyz_jobs_and_history_are_in_the_order_of_bk_l(run):
    run("1", "4h", "--", "true")                                 # 10:40-14:40, now: ends last
    run("1", "30m", "-t", "11:00", "--", "true")                 # 11:00-11:30, starts last
    for at in ("21:00", "12:00", "15:00"):
        run("1", "30m", "-t", at, "--", "true")
    at_noon = {"BK_NOW": "2026-07-13T11:50:00Z"}                 # 11:00's has ended, the 4-hour one runs
    listed = [r["id"] for r in json.loads(run("l", "--json", **at_noon).stdout)["data"]["reservations"]]
    jobs = [j["reservation"] for j in json.loads(run("j", "--json", **at_noon).stdout)["data"]["jobs"]]
    assert len(listed) == 4 and jobs[:4] == listed and len(jobs) == 5
    table = run("j", **at_noon).stdout.splitlines()
    assert [ln.split()[0] for ln in table[1:5]] == ["1", "2", "3", "4"]     # numbers count down the page
    later = {"BK_NOW": "2026-07-13T23:00:00Z"}
    hist = json.loads(run("l", "--history", "--json", **later).stdout)["data"]["reservations"]
    starts = [r["start"] for r in hist]
    assert starts == sorted(starts, reverse=True) and starts[-2:] == ["2026-07-13T11:00:00Z",
                                                                      "2026-07-13T10:40:00Z"]
    jobs = [j["reservation"] for j in json.loads(run("j", "--json", **later).stdout)["data"]["jobs"]]
    assert jobs == [r["id"] for r in hist]


def test_pyz_the_worker_advice_is_given_once_a_session(run, pyz):
    first = run("1", "30m", "-t", "21:00", "--", "true").stderr
    assert "systemctl --user enable --now bk-worker" in first
    for argv in (("j",), ("w",), ("j",)):
        p = run(*argv)
        assert "systemctl --user" not in p.stdout + p.stderr, argv
    assert "no worker is running for you; jobs: 1 pending" in run("w").stdout
    again = run("1", "30m", "-t", "22:00", "--", "true").stderr
    assert "no bk worker is running for you: the command starts once one runs" in again
    assert "systemctl --user" not in again
    other = subprocess.run([sys.executable, str(pyz), "w"], env=run.env, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=60, start_new_session=True)
    assert "systemctl --user enable --now bk-worker" in other.stdout      # another terminal is told too
    assert "systemctl --user" not in run("w").stdout                        # and this one still not again


def _bob_books(run, **req) -> None:
    """A booking of another user (bob, uid 2000) in this private ledger."""
    from bk.core.models import parse_iso
    from bk.service import open_app
    from bk.service.requests import Actor, BookRequest

    app = open_app({**run.env}, actor=Actor(2000, "bob"), clock_fn=lambda: parse_iso(NOW_ISO))
    app.run("book", BookRequest(**req))


def test_pyz_timeline_upper_case_only_while_the_booking_holds_a_full_gpu(run):
    from bk.core.models import parse_iso

    run("1", "10m", "-g", "0")                                   # 10:40-10:50
    _bob_books(run, count=1, duration=600, start=parse_iso("2026-07-13T10:50:00Z"), pinned=(0,),
               mode="exclusive")                                  # 10:50-11:00: full after mine left
    lane = next(ln for ln in run("tl", "--from", "10:30", "--step", "15m", "2h").stdout.splitlines()
                if ln.startswith("GPU 0"))
    assert "a" in lane and "A" not in lane, lane
    _bob_books(run, count=1, duration=300, start=parse_iso("2026-07-13T10:40:00Z"), pinned=(0,))
    lane = next(ln for ln in run("tl", "--from", "10:30", "--step", "15m", "2h").stdout.splitlines()
                if ln.startswith("GPU 0"))
    assert "A" in lane, lane                                     # 10:40-10:45 both slots, mine among them


def test_pyz_bk_g_exports_only_the_gpus_the_machine_has(run):
    run("2", "30m", "-g", "1,3")                                 # booked on four GPUs
    assert "CUDA_VISIBLE_DEVICES=1,3" in run("g").stdout
    two = run("g", BK_GPU_COUNT="2")                             # GPU 3 is gone
    assert "CUDA_VISIBLE_DEVICES=1\n" in two.stdout and "1,3" not in two.stdout.splitlines()[-1]
    assert "GPU 3 of your booking is not on this machine now" in two.stderr
    one = run("g", "--json", BK_GPU_COUNT="1")                  # neither is here
    env = json.loads(one.stdout)
    assert env["data"]["export"] is None and any("GPUs 1,3 of your booking are not" in w for w in env["warnings"])
    assert "CUDA_VISIBLE_DEVICES" not in run("g", BK_GPU_COUNT="1").stdout


def test_pyz_a_booking_in_the_current_slice_says_it_starts_now(run):
    out = run("1", "30m").stdout.splitlines()
    assert out[0].startswith("booked 1 GPU (0) shared 07-13 10:40–11:10 [")
    assert out[1] == "starts now: from 10:40, the current 5-minute slice"
    assert "starts now" in run("1", "30m", "--dry-run", "--again").stdout
    assert "starts now" not in run("1", "30m", "-t", "11:00").stdout           # a later start needs no word
    assert "starts now" not in run("1", "30m", "--again", BK_NOW="2026-07-13T10:45:00Z").stdout  # on the dot
    cfg = _config(run, slot_minutes=15)
    other = run("1", "30m", BK_DATA_DIR=str(run.tmp / "d15"), BK_CONFIG_FILE=cfg).stdout
    assert "starts now: from 10:30, the current 15-minute slice" in other
