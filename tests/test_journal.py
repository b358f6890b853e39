"""The daemons' journal priorities (``bk.core.journal``), and what the broker
says about damage to its data (issue 30, item 17; issue 23, item 7).

systemd sets ``JOURNAL_STREAM=DEV:INODE`` for a service whose stderr is the
journal; a line that starts ``<N>`` gets priority N there, so ``journalctl -p
err`` finds the errors.  The tests play that for real: the daemon (the built
``bk.pyz``, as the service account) writes into a file, and JOURNAL_STREAM
names that file's device and inode, as systemd would name its stream.  Each
check reads the file as journald would: priority from the prefix, the rest
the message.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from helpers_broker import SYSTEM_PYTHON, needs_root, poll, site

from bk.core import journal

# ------------------------------------------------------------- the helper itself


def test_markers_lines_and_the_journal_test():
    assert journal.split(journal.error("x")) == (3, "x") and journal.split("plain") == (6, "plain")
    assert journal.split(journal.warning("<3>y")) == (4, "<3>y")
    assert journal.lines("bk m", journal.error("a\nb"), True) == "<3>bk m: a\n<3>bk m: b\n"
    assert journal.lines("bk m", journal.error("a"), False) == "bk m: a\n"
    f = io.StringIO()
    journal.write(f, "bk broker", journal.notice("hi"), {}, os.fstat)
    assert f.getvalue() == "bk broker: hi\n"


def test_the_prefix_is_written_only_to_the_stream_systemd_named(tmp_path):
    path = tmp_path / "log"
    with open(path, "w") as f:
        st = os.fstat(f.fileno())
        here = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        journal.write(f, "bk m", journal.warning("on the journal"), here, os.fstat)
        journal.write(f, "bk m", journal.warning("elsewhere"), {"JOURNAL_STREAM": "1:2"}, os.fstat)
        journal.write(f, "bk m", "unset", {}, os.fstat)
    assert path.read_text() == "<4>bk m: on the journal\nbk m: elsewhere\nbk m: unset\n"


def test_every_store_report_has_a_priority():
    from bk.broker.handlers import REPORT_PRIORITY
    from bk.store.ledger import REPORTS

    assert set(REPORTS) == set(REPORT_PRIORITY)


# ------------------------------------------------------------- the daemons, for real

def journal_env(fd: int) -> dict:
    st = os.fstat(fd)
    return {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}


def records(text: str) -> list[tuple[int, str]]:
    """(priority, message) per line, as journald stores a stream's lines."""
    out = []
    for line in text.splitlines():
        assert line[:1] == "<" and line[2:3] == ">", f"a line without its priority: {line!r}"
        out.append((int(line[1]), line[3:]))
    return out


def errors(text: str) -> list[str]:
    """What ``journalctl -p err`` shows."""
    return [m for p, m in records(text) if p <= 3]


@pytest.fixture
def srv():
    with site() as s:
        assert s.init().returncode == 0
        s.user = s.accounts.user()
        s.start_broker(env=journal_env)
        yield s


def _replace_as_service(srv, path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".test-new")
    tmp.write_bytes(data)
    os.chown(tmp, srv.service.uid, srv.service.gid)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


@needs_root
@pytest.mark.root
@pytest.mark.slow
def test_the_broker_logs_lost_commits_and_their_recovery_with_the_files_and_the_fix(srv):
    for _ in range(3):
        rc, env = srv.run_json(srv.user, "1", "30m", "--again")
        assert rc == 0, env
    assert records(srv.log())[0][0] == 6                    # "ledger: ..." at start: info
    backups = sorted((srv.data / "backups").iterdir())
    _replace_as_service(srv, srv.data / "ledger.json", backups[-2].read_bytes())   # one commit older
    rc, env = srv.run_json(srv.user, "1", "30m", "--again")
    assert rc == 74 and env["error"]["code"] == "lost_commits", env
    said = [m for m in errors(srv.log()) if "a write was refused" in m]
    assert len(said) == 1, srv.log()
    assert str(srv.data / "ledger.json") in said[0] and "fix: " in said[0] and "bk admin data recover" in said[0]
    rc, env = srv.run_json(srv.user, "1", "30m", "--again")            # refused again: said once
    assert rc == 74
    assert len([m for m in errors(srv.log()) if "a write was refused" in m]) == 1

    rc, env = srv.run_json(None, "admin", "data", "recover", "-y")
    assert rc == 0 and env["data"]["status"] == "recovered", env
    warned = [m for p, m in records(srv.log()) if p == 4 and "accepted as lost" in m]
    assert warned and "by root (uid 0)" in warned[0] and str(srv.data / "audit.jsonl") in warned[0], srv.log()


@needs_root
@pytest.mark.root
@pytest.mark.slow
def test_the_broker_logs_a_damaged_ledger_rebuilt_from_a_backup_and_one_it_cannot_rebuild(srv):
    for _ in range(2):
        rc, env = srv.run_json(srv.user, "1", "30m", "--again")
        assert rc == 0, env
    _replace_as_service(srv, srv.data / "ledger.json", b'{"format": "gpubk.ledger", "torn')
    rc, env = srv.run_json(srv.user, "1", "30m", "--again")
    assert rc == 0, env
    said = [m for m in errors(srv.log()) if "rebuilt it from the newest valid backup" in m]
    assert len(said) == 1, srv.log()
    kept = [n for n in os.listdir(srv.data) if n.startswith("ledger.json.damaged-")]
    assert kept and str(srv.data / kept[0]) in said[0] and "bk admin data recover --dry-run" in said[0]

    # Every copy damaged: the write is refused, and the journal says what to do.
    _replace_as_service(srv, srv.data / "ledger.json", b"garbage")
    for b in (srv.data / "backups").iterdir():
        _replace_as_service(srv, b, b"garbage")
    rc, env = srv.run_json(srv.user, "1", "30m", "--again")
    assert rc == 74, env
    said = [m for m in errors(srv.log()) if m.startswith("bk broker: no valid ledger")]
    assert said and "fix: inspect the files" in said[0] and str(srv.data / "ledger.json") in said[0], srv.log()
    # A broker started on it says so at once, at error priority, from the command line's error lines.
    assert srv.stop_broker() == 0
    srv.start_broker(env=journal_env, wait=False)
    assert srv.broker.wait(60) == 74
    assert any(m.startswith("error: no valid ledger") for m in errors(srv.log())), srv.log()
    assert any(m.startswith("hint: ") for m in errors(srv.log())), srv.log()


@needs_root
@pytest.mark.root
@pytest.mark.slow
def test_monitor_and_worker_lines_carry_their_priority(srv):
    sim = srv.base / "sim.json"
    sim.write_text(json.dumps({"gpus": [{"name": "H100", "mem_total_mib": 81559, "util": 0, "processes": []}]}))
    os.chmod(sim, 0o644)
    log = srv.base / "monitor.log"
    with open(log, "wb") as f:
        m = subprocess.Popen([SYSTEM_PYTHON, str(srv.pyz), "m", "--interval", "0.5"],
                             env={**srv.env(srv.service), "BK_GPU_SIM_FILE": str(sim), **journal_env(f.fileno())},
                             stdout=f, stderr=subprocess.STDOUT, cwd=srv.base, **srv.popen_args(srv.service))
    try:
        poll(lambda: b"sampling" in log.read_bytes(), 60, "the monitor's first line")
    finally:
        m.send_signal(signal.SIGTERM)
        assert m.wait(30) == 0
    got = records(log.read_text())
    assert got and all(p == 6 for p, _ in got) and got[0][1].startswith("bk m: pid ")

    # A worker of the user's own, in private mode.
    home = srv.base / "worker-home"
    home.mkdir()
    shutil.chown(home, srv.user.uid, srv.user.gid)
    wlog = srv.base / "worker.log"
    with open(wlog, "wb") as f:
        os.chown(wlog, srv.user.uid, srv.user.gid)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "TZ": "UTC",
               "BK_DATA_DIR": str(home / "data"), "BK_CONFIG_FILE": str(home / "none.json"),
               "BK_GPU_COUNT": "2", **journal_env(f.fileno())}
        w = subprocess.Popen([SYSTEM_PYTHON, str(srv.pyz), "w", "start"], env=env, stdout=f,
                             stderr=subprocess.STDOUT, cwd=home, **srv.popen_args(srv.user))
    try:
        def started():
            if w.poll() is not None:
                raise AssertionError(f"bk w start exited with {w.returncode}: {wlog.read_text()}")
            return b"started" in wlog.read_bytes()
        poll(started, 60, "the worker's first line")
    finally:
        w.send_signal(signal.SIGTERM)
        w.wait(30)
    priority, first = records(wlog.read_text().splitlines()[0])[0]
    assert priority == 6 and first.startswith("bk worker: started (pid "), wlog.read_text()
