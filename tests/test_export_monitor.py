"""The monitor's exports: the built ``bk m`` writes the textfile, the feeds
and the page when the configuration names their directories; today's
counters come from the history and advance with each closed minute;
unchanged feeds are not rewritten; a user whose bookings are gone gets an
empty feed; a directory others can write degrades the heartbeat; and on a
real system with real accounts each per-user feed is readable by its user
alone (or by everyone, when published)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers_broker import SYSTEM_PYTHON, Accounts, make_base, needs_root, poll
from helpers_export import H, booking, rid

from bk.core.models import GpuInfo, LedgerState, Policy
from bk.core.telemetry import Snapshot
from bk.core.usage import MinuteRecord, Use
from bk.export.prom import lint
from bk.monitor.exporter import Exporter, feed_name
from bk.store.publish import readers_of

T = 1_796_127_836
SIM = {"gpus": [
    {"name": "H100", "mem_total_mib": 81559, "mem_used_mib": 4096, "util": 37, "power_mw": 250000,
     "processes": [{"pid": 4242, "uid": 1000, "user": "ada", "label": "python", "mem_mib": 4000, "sm": 30}]},
    {"name": "H100", "mem_total_mib": 81559, "mem_used_mib": 0, "util": 0, "processes": []},
]}


def settings(**kw) -> dict:
    base = {"prometheus_textfile_dir": None, "calendar_dir": None, "html_dir": None,
            "prometheus_user_label": False, "calendar_publish_users": False}
    base.update(kw)

    class S(dict):
        def policy(self, n):
            return Policy(gpu_count=n)
    return S(base)


def snapshot(t: int) -> Snapshot:
    return Snapshot(t, "fake", tuple(GpuInfo(i, f"GPU-{i}", "Fake", processes=[]) for i in range(2)))


class FakeUsage:
    def __init__(self, records=()):
        self.records = list(records)

    def summary(self, since, until):
        from bk.core.usage import summarise

        return summarise([r for r in self.records if since <= r.t < until])


def export(ex: Exporter, t: int, reservations) -> list[str]:
    return ex.step(t, state=LedgerState(1, None, list(reservations)), snapshot=snapshot(t), attributions={},
                   activity=None, heartbeat=None, policy=Policy(gpu_count=2))


# ------------------------------------------------------------- the built monitor

@pytest.mark.slow
def test_the_built_monitor_writes_all_three(pyz, tmp_path):
    sim = tmp_path / "sim.json"
    sim.write_text(json.dumps(SIM))
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"prometheus_textfile_dir": str(tmp_path / "prom"),
                               "calendar_dir": str(tmp_path / "cal"), "html_dir": str(tmp_path / "www")}))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "TZ": "Europe/Berlin",
           "BK_DATA_DIR": str(tmp_path / "data"), "BK_GPU_SIM_FILE": str(sim), "BK_CONFIG_FILE": str(cfg)}
    made = subprocess.run([sys.executable, str(pyz), "1", "1h", "-g", "1"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    p = subprocess.Popen([sys.executable, str(pyz), "m", "--interval", "0.2"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        me = __import__("pwd").getpwuid(os.getuid()).pw_name
        files = [tmp_path / "prom" / "gpubk.prom", tmp_path / "cal" / "all.ics",
                 tmp_path / "cal" / "users" / feed_name(me, os.getuid()), tmp_path / "www" / "index.html"]
        poll(lambda: all(f.exists() for f in files) or p.poll() is not None, 60, "the monitor's exports")
        assert p.poll() is None, p.stderr.read()
        text = files[0].read_text()
        assert lint(text) == []
        assert 'gpubk_monitor_state{state="running"} 1' in text
        assert 'gpubk_gpu_unreserved_processes{gpu="0",UUID=' in text     # ada's process, no booking on GPU 0
        assert 'gpubk_bookings{status="active"} 1' in text
        if shutil.which("promtool"):
            got = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
            assert got.returncode == 0 and got.stdout == "" and got.stderr == "", got
        icalendar = pytest.importorskip("icalendar")
        for f in files[1:3]:
            (ev,) = icalendar.Calendar.from_ical(f.read_bytes()).walk("VEVENT")
            assert str(ev["STATUS"]) == "CONFIRMED"
        assert readers_of(str(files[2])) == [os.getuid()] and files[2].stat().st_mode & 0o077 == 0o040
        assert files[1].stat().st_mode & 0o777 == 0o644 and files[3].stat().st_mode & 0o777 == 0o644
        assert b'data-gpu="1"' in files[3].read_bytes()
    finally:
        p.terminate()
        assert p.wait(30) == 0, p.stderr.read()


# ------------------------------------------------------------- the exporter on a fake clock

def test_todays_counters_come_from_the_history_and_advance(tmp_path):
    day = T - T % 86400
    past = [MinuteRecord(day + 60 * i, 0, 60, uses=[Use(1000, rid(1), "shared", booked_s=60, active_s=30,
                                                        energy_mj=60_000)], energy_mj=60_000) for i in range(3)]
    yesterday = MinuteRecord(day - 60, 0, 60, uses=[Use(1000, rid(1), "shared", booked_s=60)], energy_mj=1)
    ex = Exporter(settings(prometheus_textfile_dir=str(tmp_path / "prom")), usage=FakeUsage([*past, yesterday]),
                  tz=None)
    r = booking(1, start=day, end=T + H)
    assert export(ex, T, [r]) == []
    text = (tmp_path / "prom" / "gpubk.prom").read_text()
    assert 'gpubk_gpu_booked_seconds_total{gpu="0",UUID="GPU-0"} 180' in text
    assert 'gpubk_gpu_energy_joules_total{gpu="0",UUID="GPU-0"} 180' in text
    # The next minute closes: folded in, not read again.
    ex.usage = None
    ex.fold([MinuteRecord(T - T % 60, 0, 60, uses=[Use(1000, rid(1), "shared", booked_s=60, active_s=60,
                                                         energy_mj=30_500)], energy_mj=30_500)])
    assert not ex.due(T + 30) and ex.due(T + 60)
    export(ex, T + 60, [r])
    text = (tmp_path / "prom" / "gpubk.prom").read_text()
    assert 'gpubk_gpu_booked_seconds_total{gpu="0",UUID="GPU-0"} 240' in text
    assert 'gpubk_gpu_active_seconds_total{gpu="0",UUID="GPU-0"} 150' in text
    assert 'gpubk_gpu_energy_joules_total{gpu="0",UUID="GPU-0"} 210.5' in text
    assert f'gpubk_booking_energy_joules_total{{reservation="{rid(1)}"}} 210.5' in text
    # Midnight: the counters start again from the new day's history.
    export(ex, day + 86400 + 10, [r])
    assert 'gpubk_gpu_booked_seconds_total{gpu="0",UUID="GPU-0"} 0' in (tmp_path / "prom" / "gpubk.prom").read_text()


def test_feeds_are_rewritten_only_when_they_change_and_emptied_when_bookings_go(tmp_path):
    import pwd

    me = pwd.getpwuid(os.getuid())
    cal = tmp_path / "cal"
    ex = Exporter(settings(calendar_dir=str(cal), calendar_publish_users=True), tz=None)
    r = booking(1, uid=me.pw_uid, user=me.pw_name, start=T + H, end=T + 2 * H, created=T - 60)
    assert export(ex, T, [r]) == []
    mine = cal / "users" / feed_name(me.pw_name, me.pw_uid)
    first = mine.stat()
    assert mine.read_bytes().count(b"BEGIN:VEVENT") == 1 and first.st_mode & 0o777 == 0o644
    (cal / "users" / "nobody-such-user-x1.ics").write_bytes(b"stale")       # an account that no longer exists
    export(ex, T + 60, [r])
    assert mine.stat().st_ino == first.st_ino                              # the same bytes: not rewritten
    assert not (cal / "users" / "nobody-such-user-x1.ics").exists()
    export(ex, T + 120, [])                                                # the booking left the ledger
    assert b"BEGIN:VEVENT" not in mine.read_bytes() and b"BEGIN:VCALENDAR" in mine.read_bytes()


def test_a_directory_others_can_write_degrades_the_heartbeat(tmp_path):
    from test_monitor import FakeBackend, Ledger, make

    bad = tmp_path / "prom"
    bad.mkdir()
    os.chmod(bad, 0o777)
    ex = Exporter(settings(prometheus_textfile_dir=str(bad)), tz=None)
    m, clock = make(tmp_path, FakeBackend(), Ledger([]), exporter=ex)
    m.step()
    from bk.store import snapshot as sf

    hb = sf.read_heartbeat(m.directory, clock.t, alive=lambda pid: True)
    assert hb.state == "degraded" and "cannot write the Prometheus textfile" in hb.detail
    assert "writable by group or others" in hb.detail and not (bad / "gpubk.prom").exists()
    os.chmod(bad, 0o755)
    clock.t += 60
    m.step()
    assert sf.read_heartbeat(m.directory, clock.t, alive=lambda pid: True).state == "running"
    assert lint((bad / "gpubk.prom").read_text()) == []


# ------------------------------------------------------------- real accounts

READ = "import sys\ntry:\n    open(sys.argv[1], 'rb').read()\n    print('read')\nexcept PermissionError:\n    print('denied')\n"


@needs_root
@pytest.mark.slow
@pytest.mark.parametrize("published", [False, True])
def test_each_users_feed_is_readable_by_that_user_alone(pyz, published):
    base = make_base()
    accounts = Accounts(base)
    try:
        mon, alice, bob, carol = (accounts.user() for _ in range(4))
        cal = base / "cal"
        cal.mkdir(mode=0o755)
        os.chown(cal, mon.uid, mon.gid)
        pyz_copy = base / "bk.pyz"
        shutil.copy(pyz, pyz_copy)
        os.chmod(pyz_copy, 0o644)
        # The monitor account writes the feeds with the exporter of the built archive.
        script = f"""
import sys
sys.path.insert(0, {str(pyz_copy)!r})
from bk.core.models import LedgerState, Policy, Reservation
from bk.monitor.exporter import Exporter
s = {{"prometheus_textfile_dir": None, "calendar_dir": {str(cal)!r}, "html_dir": None,
     "prometheus_user_label": False, "calendar_publish_users": {published!r}}}
ex = Exporter(s, tz=None)
T = {T}
rs = [Reservation(f"5eed0000-0000-4000-8000-00000000000{{i}}", uid, name, "shared", (0,), 1, T + 3600, T + 7200, T)
      for i, (uid, name) in enumerate((({alice.uid}, {alice.name!r}), ({bob.uid}, {bob.name!r})))]
print(ex.step(T, state=LedgerState(1, None, rs), snapshot=None, attributions={{}}, activity=None, heartbeat=None,
              policy=Policy(gpu_count=1)))
"""
        got = subprocess.run([SYSTEM_PYTHON, "-c", script], user=mon.uid, group=mon.gid, extra_groups=[],
                             capture_output=True, text=True, timeout=120, cwd="/")
        assert got.returncode == 0 and got.stdout.strip() == "[]", got
        feeds = {a.name: cal / "users" / f"{a.name}.ics" for a in (alice, bob)}

        def can_read(who, path) -> bool:
            out = subprocess.run([SYSTEM_PYTHON, "-c", READ, str(path)], user=who.uid, group=who.gid,
                                 extra_groups=[], capture_output=True, text=True, timeout=60, cwd="/")
            assert out.returncode == 0, out
            return out.stdout.strip() == "read"

        for owner in (alice, bob):
            path = feeds[owner.name]
            assert path.stat().st_uid == mon.uid
            for reader in (alice, bob, carol):
                assert can_read(reader, path) == (published or reader is owner), (owner.name, reader.name)
            assert readers_of(str(path)) == ([] if published else [owner.uid])
            assert path.read_bytes().count(b"BEGIN:VEVENT") == 1 and owner.name.encode() in path.read_bytes()
        assert all(can_read(who, cal / "all.ics") for who in (alice, bob, carol))
    finally:
        accounts.cleanup()
        shutil.rmtree(base, ignore_errors=True)


def test_feed_names_are_plain_file_names():
    assert feed_name("ada", 1000) == "ada.ics"
    assert feed_name("../etc", 7) == "uid-7.ics" and feed_name(".hidden", 8) == "uid-8.ics"
    assert feed_name("a/b", 9) == "uid-9.ics" and feed_name("ok.", 10) == "uid-10.ics"
