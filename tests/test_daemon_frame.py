"""The daemons' frame (``bk/daemon.py``), with real signals sent to a real
child process and real lock contention from a second process.

Each child is a small Python program over ``bk.daemon`` alone: it says
``ready`` through ``daemon.ready`` once its handlers are installed, and the
test acts only after reading that line, so nothing waits on a timer.  A
child that blocks in ``Stop.wait(None)`` (no timeout at all) and still
exits on a signal proves the point of the pipe: Python retries a
``select`` a signal interrupted (PEP 475), so only the byte the handler
writes ends that wait.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bk import daemon
from bk.core.errors import EXIT_TEMPFAIL, EXIT_WRONG_ACCOUNT, Busy, ConfigError, WrongAccount

ROOT = Path(__file__).resolve().parent.parent


def child(script: str, *args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, **kw)


def said(p: subprocess.Popen, want: str) -> None:
    line = p.stdout.readline()
    assert line == want + "\n", (line, p.stderr.read() if p.poll() is not None else "")


def finish(p: subprocess.Popen) -> tuple[str, str]:
    """The rest of a child's output once it exits.  Not ``communicate``: it
    reads the pipes' descriptors, past what ``readline`` already buffered."""
    p.stdin.close()
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()                             # ours: never left behind
        p.wait()
        raise
    return p.stdout.read(), p.stderr.read()


# ------------------------------------------------------------------ signals

STOPPED_BY = """
import signal, sys
from bk import daemon
which = tuple(signal.Signals[n] for n in sys.argv[1].split(","))
before = {s: signal.getsignal(s) for s in which}
with daemon.Stop() as stop:
    with stop.signals(which):
        daemon.ready(lambda line: print(line, flush=True), "ready")
        stop.wait(None)
        inside = all(signal.getsignal(s) != before[s] for s in which)
    back = all(signal.getsignal(s) == before[s] for s in which)
    print(signal.Signals(stop.signum).name, stop.is_set(), inside, back, flush=True)
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_stop_signal_ends_a_wait_with_no_timeout_and_the_old_handlers_come_back(sig):
    which = "SIGTERM,SIGINT" if sig != "SIGHUP" else "SIGHUP"
    p = child(STOPPED_BY, which)
    said(p, "ready")
    p.send_signal(getattr(signal, sig))
    out, err = finish(p)
    assert p.returncode == 0, err
    assert out == f"{sig} True True True\n"


def test_a_signal_the_frame_was_not_asked_for_keeps_its_own_effect():
    # SIGHUP's default, even when this run was started with it ignored (nohup).
    p = child("import signal\nsignal.signal(signal.SIGHUP, signal.SIG_DFL)\n" + STOPPED_BY, "SIGTERM")
    said(p, "ready")
    p.send_signal(signal.SIGHUP)             # not a stop signal here: the default, death by signal
    finish(p)
    assert p.returncode == -signal.SIGHUP


def test_a_second_signal_while_stopping_is_harmless():
    """The handler takes no lock, so signals back to back cannot deadlock it."""
    script = STOPPED_BY.replace('daemon.ready(lambda line: print(line, flush=True), "ready")',
                                'daemon.ready(lambda line: print(line, flush=True), "ready")\n'
                                '        import os\n'
                                '        for _ in range(50): os.kill(os.getpid(), signal.SIGTERM)')
    p = child(script, "SIGTERM")
    said(p, "ready")
    out, err = finish(p)
    assert (p.returncode, out) == (0, "SIGTERM True True True\n"), err


def test_set_from_another_thread_wakes_the_wait_and_a_thread_installs_no_handler():
    with daemon.Stop() as stop:
        ended = []

        def serve():
            with stop.signals():             # not the main thread: nothing installed, no error
                ended.append(stop.wait(None))

        before = signal.getsignal(signal.SIGTERM)
        th = threading.Thread(target=serve)
        th.start()
        stop.set()
        th.join(30)
        assert not th.is_alive() and ended == [[]]
        assert signal.getsignal(signal.SIGTERM) is before
        assert stop.is_set() and stop.signum is None
        assert stop.wait(None) == []         # final: every later wait returns at once


def test_wait_returns_the_descriptors_that_are_ready():
    r, w = os.pipe()
    try:
        with daemon.Stop() as stop:
            assert stop.wait(0, [r]) == []
            os.write(w, b"x")
            assert stop.wait(None, [r]) == [r]
            assert not stop.is_set()
    finally:
        os.close(r)
        os.close(w)


def test_set_after_close_writes_nowhere():
    stop = daemon.Stop()
    stop.close()
    stop.set()                               # the pipe's numbers may be another file's by now
    assert stop.is_set()


# ------------------------------------------------------------------ one instance

HOLDER = """
import sys
from bk import daemon
from bk.core.errors import Busy
try:
    fd = daemon.instance_lock(sys.argv[1], "x.lock", what="the test's lock", create_mode=0o700,
                              busy=daemon.refusal("another test daemon is running here", "stop it first",
                                                  sys.argv[1] + "/x.lock"))
except Busy as e:
    print("busy", e.message, e.details["holder_pid"], e.exit_code, flush=True)
    sys.exit(e.exit_code)
print("held", flush=True)
sys.stdin.read()
"""


def test_a_second_instance_is_refused_at_once_naming_the_first(tmp_path):
    where = tmp_path / "run"
    first = child(HOLDER, str(where))
    try:
        said(first, "held")
        lock = where / "x.lock"
        st = os.lstat(lock)
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
        assert stat.S_IMODE(os.lstat(where).st_mode) == 0o700

        second = child(HOLDER, str(where))
        out, err = finish(second)
        assert second.returncode == EXIT_TEMPFAIL, err
        assert out == f"busy another test daemon is running here (pid {first.pid}) {first.pid} 75\n"

        # In this process too, with the refusal's details.
        with pytest.raises(Busy) as got:
            daemon.instance_lock(str(where), "x.lock", what="the test's lock",
                                 busy=daemon.refusal("another one runs", "wait", str(lock)))
        assert got.value.message == f"another one runs (pid {first.pid})"
        assert got.value.details == {"path": str(lock), "holder_pid": first.pid}
    finally:
        first.stdin.close()
        first.wait(30)
    # The kernel let go when the first one exited: the next start gets it.
    fd = daemon.instance_lock(str(where), "x.lock", what="the test's lock", busy=daemon.refusal("x", "y", "z"))
    os.close(fd)


def test_a_lock_file_others_could_open_is_replaced_and_the_log_says_so(tmp_path):
    where = tmp_path / "run"
    where.mkdir(mode=0o755)
    lock = where / "x.lock"
    lock.write_text("")
    os.chmod(lock, 0o644)                    # as an older bk made the enforcer's
    old = os.lstat(lock).st_ino
    lines: list[str] = []
    fd = daemon.instance_lock(str(where), "x.lock", what="the test's lock", log=lines.append,
                              busy=daemon.refusal("x", "y", str(lock)))
    try:
        st = os.lstat(lock)
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_ino != old
        assert os.fstat(fd).st_ino == st.st_ino
        assert len(lines) == 1 and lines[0].startswith(f"<4>{lock} had mode 0644, so other accounts could open it")
        # Held now: a second process of ours is refused.
        second = child(HOLDER, str(where))
        out, _ = finish(second)
        assert second.returncode == EXIT_TEMPFAIL and out.startswith("busy ")
    finally:
        os.close(fd)


def test_a_missing_directory_is_made_only_when_asked(tmp_path):
    where = tmp_path / "none"
    with pytest.raises(ConfigError, match="the socket directory"):
        daemon.instance_lock(str(where), "x.lock", what="w", busy=daemon.refusal("x", "y", "z"),
                             missing=ConfigError("the socket directory is missing"))
    assert not where.exists()
    os.close(daemon.instance_lock(str(where), "x.lock", what="w", busy=daemon.refusal("x", "y", "z"),
                                  create_mode=0o750))
    assert stat.S_IMODE(os.lstat(where).st_mode) == 0o750


# ------------------------------------------------------------------ the account

def test_the_account_check_names_both_accounts_and_how_to_start_it():
    me = os.geteuid()
    daemon.check_account(me, command="bk m", role="monitor account")      # the right one: nothing
    other = 2_000_000_001                     # no account has it
    with pytest.raises(WrongAccount) as got:
        daemon.check_account(other, command="bk broker", role="service account")
    mine = daemon.account_name(me)
    assert got.value.message == (f"bk broker must run as the service account uid {other} (uid {other}), "
                                 f"not as {mine} (uid {me})")
    assert got.value.hint == f"systemd: User=uid {other}; by hand: sudo -u uid {other} bk broker"
    assert got.value.exit_code == EXIT_WRONG_ACCOUNT


def test_root_only_refuses_everyone_else():
    script = ("import os, sys\nfrom bk import daemon\nfrom bk.core.errors import WrongAccount\n"
              "os.setresuid(65534, 65534, 65534)\n"
              "try:\n    daemon.check_root('the test must run as root', hint='sudo it')\n"
              "except WrongAccount as e:\n    print(e.message, '|', e.hint, flush=True); sys.exit(e.exit_code)\n")
    if os.geteuid() != 0:
        pytest.skip("needs root to become another account")
    daemon.check_root("the test must run as root", hint="sudo it")
    p = child(script)
    out, err = finish(p)
    assert (p.returncode, out) == (EXIT_WRONG_ACCOUNT, "the test must run as root | sudo it\n"), err


# ------------------------------------------------------------------ log lines and readiness

LOGS = """
from bk import daemon
from bk.core import journal
log = daemon.stderr_log("bk test")
log("plain")
log(journal.warning("careful"))
"""


def test_log_lines_carry_their_priority_only_on_the_journal(tmp_path):
    plain = child(LOGS)
    _, err = plain.communicate(timeout=30)
    assert err == "bk test: plain\nbk test: careful\n"

    out = tmp_path / "journal"
    with open(out, "w") as f:
        st = os.fstat(f.fileno())
        p = subprocess.run([sys.executable, "-c", LOGS], stderr=f, cwd=ROOT, timeout=30,
                           env={**os.environ, "PYTHONPATH": str(ROOT), "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
    assert p.returncode == 0
    assert out.read_text() == "<6>bk test: plain\n<4>bk test: careful\n"


def test_ready_logs_the_first_line_then_tells_systemd():
    name = f"bk-test-notify-{os.getpid()}-{os.urandom(4).hex()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        s.settimeout(30)
        lines: list[str] = []
        env = {"NOTIFY_SOCKET": "@" + name}
        daemon.ready(lines.append, "listening", env)
        assert lines == ["listening"]
        assert s.recv(64) == b"READY=1"
        daemon.stopping(env)
        assert s.recv(64) == b"STOPPING=1"
    daemon.ready(lines.append, "again", {})          # no NOTIFY_SOCKET: nothing sent, no error
    daemon.notify("READY=1", {"NOTIFY_SOCKET": "@" + name})    # nobody listening: silent
    assert lines == ["listening", "again"]


def test_a_daemon_in_a_child_tells_readiness_to_the_socket_it_inherits():
    name = f"bk-test-notify-{os.getpid()}-{os.urandom(4).hex()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        s.settimeout(30)
        p = child(STOPPED_BY, "SIGTERM", env={"NOTIFY_SOCKET": "@" + name})
        said(p, "ready")
        assert s.recv(64) == b"READY=1"
        p.send_signal(signal.SIGTERM)
        out, err = finish(p)
        assert (p.returncode, out) == (0, "SIGTERM True True True\n"), err


INTRUDER = """
import fcntl, os, sys
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


def test_a_lock_another_account_holds_is_replaced_and_the_holder_named():
    """The enforcer's case: root's lock in a directory everyone may search,
    held by a process of another account that opened it while it was 0644."""
    if os.geteuid() != 0:
        pytest.skip("needs root to be another account")
    import shutil
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="bk-frame-"))
    try:
        os.chmod(where, 0o755)
        lock = where / "x.lock"
        lock.write_text("")
        os.chmod(lock, 0o644)
        p = child(INTRUDER, str(lock))
        try:
            said(p, "held")
            lines: list[str] = []
            fd = daemon.instance_lock(str(where), "x.lock", uid=0, what="the test's lock", log=lines.append,
                                      busy=daemon.refusal("another one runs", "wait", str(lock)))
            os.close(fd)
            assert len(lines) == 1 and lines[0].startswith(f"<4>{lock} was held by pid {p.pid} of uid 65534"), lines
            st = os.lstat(lock)
            assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0
        finally:
            finish(p)
    finally:
        shutil.rmtree(where)
