"""Issue 26 end to end: a shared server as it runs in production (the built
bk.pyz, the broker as its service account, the monitor, each user's worker
as that user), throwaway users whose terminals are ``os.openpty()`` pairs
owned by them, a mail relay and a webhook receiver on loopback, and one
clock for every process (``BK_NOW=@FILE``) that the test moves.

Every message a terminal receives is read from its pty master, so "another
user's terminal never receives anything" and "exactly one 15-minute
warning across a SIGKILL of the deliverer" are checked on what arrived,
not on what bk says it did."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from helpers_broker import SYSTEM_PYTHON, Accounts, build_pyz, make_base, needs_root, poll, supplementary
from helpers_notify import HookCapture, SmtpSink

from bk.core.models import parse_iso

pytestmark = needs_root

C0 = parse_iso("2027-03-01T08:00:00Z")


class Tty:
    """A terminal of ``account``: the pty's slave is theirs (0620, or 0600
    for ``mesg n``), held open by a process of theirs; the test reads the
    master.  ``extra``: more terminals that the same process holds."""

    def __init__(self, account, *, mesg: bool = True, env: dict | None = None, hold=()):
        self.master, slave = os.openpty()
        self.path = os.ttyname(slave)
        os.fchown(slave, account.uid, -1)
        os.fchmod(slave, 0o620 if mesg else 0o600)
        self.data = b""
        self.lock = threading.Lock()
        fds = [f.slave for f in hold]
        self.slave = slave
        self.holder = subprocess.Popen(
            [SYSTEM_PYTHON, "-c", "import time; time.sleep(900)"], stdin=slave, stdout=slave, stderr=slave,
            user=account.uid, group=account.gid, extra_groups=supplementary(account), pass_fds=fds,
            env={"PATH": "/usr/bin:/bin", "TERM": "xterm-256color", **(env or {})}, start_new_session=True)
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            with self.lock:
                self.data += chunk

    def text(self) -> str:
        with self.lock:
            return self.data.decode("utf-8", "replace")

    def count(self, needle: str) -> int:
        """How many message lines (``[bk HH:MM] TEXT``) start with ``needle``
        (a pop-up repeats the text inside its escape; it is not counted)."""
        return self.text().count("] " + needle)

    def close(self) -> None:
        self.holder.kill()
        self.holder.wait()
        for fd in (self.slave, self.master):
            try:
                os.close(fd)
            except OSError:
                pass


class Server:
    def __init__(self, base: Path, accounts: Accounts, sink: SmtpSink, hook: HookCapture):
        self.base, self.accounts = base, accounts
        self.pyz = build_pyz(base)
        self.service = accounts.user()
        self.config = base / "etc" / "config.json"
        self.clock = base / "clock"
        self.sim = base / "sim.json"
        self.set_clock(C0)
        self.procs: list[subprocess.Popen] = []
        env = {"PATH": "/usr/bin:/bin", "HOME": str(base), "LANG": "C.UTF-8", "TZ": "UTC"}
        p = subprocess.run([SYSTEM_PYTHON, str(self.pyz), "admin", "init", "--service-user", self.service.name,
                            "--config-file", str(self.config), "--data-dir", str(base / "data"),
                            "--socket", str(base / "run" / "broker.sock"), "--simulated-gpus", "1",
                            "--access", "all", "--yes"], capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == 0, p.stderr
        doc = json.loads(self.config.read_text())
        doc.update(notify_smtp_host="127.0.0.1", notify_smtp_port=sink.port, notify_mail_from="bk@lab.example",
                   notify_webhook_allow_private=True, notify_timeout_seconds=3)
        self.config.write_text(json.dumps(doc))
        os.chmod(self.config, 0o644)

    def set_clock(self, t: int) -> None:
        tmp = self.clock.with_suffix(".tmp")
        tmp.write_text(str(t))
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.clock)

    def env(self, account=None) -> dict:
        return {"PATH": "/usr/bin:/bin", "HOME": account.home if account else str(self.base), "LANG": "C.UTF-8",
                "TZ": "UTC", "BK_CONFIG_FILE": str(self.config), "BK_NOW": f"@{self.clock}",
                "BK_GPU_SIM_FILE": str(self.sim)}

    def _as(self, account) -> dict:
        return {} if account is None else {"user": account.uid, "group": account.gid,
                                           "extra_groups": supplementary(account)}

    def bk(self, account, *args, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        p = subprocess.run([SYSTEM_PYTHON, str(self.pyz), *args], capture_output=True, text=True,
                           env=self.env(account), cwd=self.base, timeout=timeout, **self._as(account))
        if check:
            assert p.returncode == 0, (args, p.returncode, p.stdout, p.stderr)
        return p

    def json(self, account, *args, **kw) -> dict:
        p = self.bk(account, "--json", *args, **kw)
        return json.loads(p.stdout)

    def daemon(self, account, *args, log: str) -> subprocess.Popen:
        out = open(self.base / log, "ab")
        p = subprocess.Popen([SYSTEM_PYTHON, str(self.pyz), *args], stdout=out, stderr=subprocess.STDOUT,
                             env=self.env(account), cwd=self.base, **self._as(account))
        out.close()
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def server():
    base = make_base()
    accounts = Accounts(base)
    sink, hook = SmtpSink(), HookCapture()
    s = None
    try:
        s = Server(base, accounts, sink, hook)
        s.sink, s.hook = sink, hook
        yield s
    finally:
        for log in sorted(base.glob("*.log")):          # pytest shows it when the test failed
            print(f"----- {log.name}\n{log.read_text(errors='replace')[-4000:]}")
        if s is not None:
            s.stop()
        sink.close()
        hook.close()
        accounts.cleanup()
        shutil.rmtree(base, ignore_errors=True)


def mails(sink: SmtpSink, fragment: str) -> list:
    out = []
    for m in list(sink.messages):
        part = next(p for p in m.walk() if p.get_content_type() == "application/json")
        doc = json.loads(part.get_payload(decode=True))
        if fragment in doc["id"]:
            out.append((m["Message-ID"], doc))
    return out


def hooks(hook: HookCapture, fragment: str) -> list:
    return [b for _, _, b in list(hook.hits) if fragment in b.get("id", "")]


def test_every_event_reaches_every_channel_once_and_only_its_owners_terminals(server):
    s = server
    alice, bob = s.accounts.user(), s.accounts.user()
    # Bob's process, on the GPU alice will book, without a booking of bob's there.
    intruder = subprocess.Popen([SYSTEM_PYTHON, "-c", "import time; time.sleep(900)"], user=bob.uid,
                                group=bob.gid, extra_groups=supplementary(bob))
    s.sim.write_text(json.dumps({"proc": True, "gpus": [
        {"name": "sim", "mem_total_mib": 40960, "processes": [{"pid": intruder.pid, "mem_mib": 1234}]}]}))
    os.chmod(s.sim, 0o644)
    bob_tty = Tty(bob)
    bob_quiet = Tty(bob, mesg=False)
    # Alice's terminal shows pop-ups (iTerm2: OSC 9); her shell also holds bob's terminal open.
    alice_tty = Tty(alice, env={"TERM_PROGRAM": "iTerm.app"}, hold=[bob_tty])
    ttys = [alice_tty, bob_tty, bob_quiet]
    try:
        s.daemon(s.service, "broker", log="broker.log")
        poll(lambda: (s.base / "run" / "broker.sock").exists(), 30, "the broker's socket")
        s.daemon(s.service, "m", "--interval", "0.5", log="monitor.log")
        s.bk(alice, "notify", "set", "--channels", "terminal,desktop,email,webhook",
             "--email", "alice@lab.example", "--webhook", s.hook.url)
        assert s.sink.messages == [] and s.hook.hits == []            # checking sent nothing
        a = s.json(alice, "x", "1", "1h", "--start", "2027-03-01T09:00:00Z")["data"]["reservation"]
        b = s.json(bob, "x", "1", "1h", "--start", "2027-03-01T09:00:00Z", "--queue")["data"]
        assert b["status"] == "queued" and b["reservation"]["start"] == "2027-03-01T10:00:00Z"
        b = b["reservation"]
        aw = s.daemon(alice, "w", "start", log="alice-worker.log")
        s.daemon(bob, "w", "start", log="bob-worker.log")
        poll(lambda: s.json(alice, "notify")["data"]["deliverer"]["state"] == "running", 30, "alice's deliverer")
        poll(lambda: s.json(bob, "notify")["data"]["deliverer"]["state"] == "running", 30, "bob's deliverer")
        aid = a["short_id"]

        # T-10 min: the line, the pop-up, the mail and the webhook.
        s.set_clock(C0 + 50 * 60)
        poll(lambda: alice_tty.count(f"booking {aid} starts in 10 min (09:00)") == 1, 20, "the 10-minute line")
        assert f"\x1b]9;bk: booking {aid} starts in 10 min" in alice_tty.text()
        poll(lambda: mails(s.sink, ":starts_soon-10:") and hooks(s.hook, ":starts_soon-10:"), 20,
             "the 10-minute mail and webhook")
        # Started; bob's process is on alice's GPU: she is told who and what.
        s.set_clock(C0 + 60 * 60)
        poll(lambda: alice_tty.count(f"booking {aid} has started") == 1, 20, "the start")
        poll(lambda: f"is in use by {bob.name}'s python3 (pid {intruder.pid}, 1234 MiB)" in alice_tty.text(),
             30, "the intrusion line")
        # T-30: bob's booking follows on the only GPU, so no extension is offered.
        s.set_clock(C0 + 90 * 60)
        poll(lambda: alice_tty.count(f"booking {aid} ends in 30 min") == 1, 20, "the 30-minute line")
        assert "it cannot be extended" in alice_tty.text()

        # The deliverer is SIGKILLed between T-16 and T-14: exactly one 15-minute warning.
        s.set_clock(C0 + 104 * 60)
        aw.kill()
        aw.wait()
        s.set_clock(C0 + 105 * 60 + 30)
        aw = s.daemon(alice, "w", "start", log="alice-worker.log")
        poll(lambda: alice_tty.count(f"booking {aid} ends in 15 min") == 1, 30, "the late 15-minute line")
        poll(lambda: hooks(s.hook, ":ends_soon-15:") and mails(s.sink, ":ends_soon-15:"), 20, "its mail and webhook")
        # Killed again right after the 5-minute line reached the terminal: not repeated on restart.
        s.set_clock(C0 + 115 * 60)
        poll(lambda: alice_tty.count(f"booking {aid} ends in 5 min") == 1, 20, "the 5-minute line")
        aw.kill()
        aw.wait()
        s.set_clock(C0 + 116 * 60)
        aw = s.daemon(alice, "w", "start", log="alice-worker.log")
        poll(lambda: len(mails(s.sink, ":ends_soon-5:")) >= 1, 20, "the 5-minute mail (at least once)")
        assert len({mid for mid, _ in mails(s.sink, ":ends_soon-5:")}) == 1     # one Message-ID for every try

        # The administrator cancels alice's booking: she is told why; bob's queued one can start now.
        s.bk(None, "admin", "cancel", a["id"], "--reason", "GPU reset", "--yes")
        poll(lambda: "was cancelled by the administrator: GPU reset" in alice_tty.text(), 20, "the cancellation")
        poll(lambda: f"booking {b['short_id']} can start earlier" in bob_tty.text(), 20, "bob's earlier start")
        assert f"bk e {b['short_id']} -t now" in bob_tty.text()
        poll(lambda: mails(s.sink, ":changed-cancelled:") and hooks(s.hook, ":changed-cancelled:"), 20,
             "the cancellation's mail and webhook")

        # Exactly once, everywhere, across two SIGKILLs and restarts.
        assert alice_tty.count(f"booking {aid} ends in 15 min") == 1
        assert len(hooks(s.hook, ":ends_soon-15:")) == 1 and len(mails(s.sink, ":ends_soon-15:")) == 1
        assert alice_tty.count(f"booking {aid} ends in 5 min") == 1
        # Nobody else's terminal got a byte of alice's, and mesg n is respected.
        assert aid not in bob_tty.text() and bob_quiet.text() == ""
        assert b["short_id"] not in alice_tty.text()
        log = s.json(alice, "notify", "log")["data"]["deliveries"]
        assert any(bob_tty.path in (d["channels"]["terminal"]["detail"] or "") for d in log), \
            "alice's deliverer did not even meet bob's terminal: the test proves nothing"
        assert s.sink.messages and all(m["To"] == "alice@lab.example" for m in s.sink.messages)
        # The addresses are alice's alone: nothing shared holds them.
        for p in (s.base / "data").rglob("*"):
            if p.is_file():
                assert b"alice@lab.example" not in p.read_bytes() and s.hook.url.encode() not in p.read_bytes(), p
    finally:
        intruder.kill()
        intruder.wait()
        for t in ttys:
            t.close()


def test_a_hanging_webhook_does_not_delay_a_booking_and_a_failing_one_shows_in_doctor(server):
    s = server
    alice, bob = s.accounts.user(), s.accounts.user()
    s.sim.write_text(json.dumps({"gpus": [{"name": "sim", "mem_total_mib": 40960, "processes": []}]}))
    os.chmod(s.sim, 0o644)
    alice_tty = Tty(alice)
    try:
        s.daemon(s.service, "broker", log="broker.log")
        poll(lambda: (s.base / "run" / "broker.sock").exists(), 30, "the broker's socket")
        s.bk(alice, "notify", "set", "--channels", "terminal,webhook", "--webhook", s.hook.url, "--preset", "slack")
        s.hook.hang = True
        a = s.json(alice, "1", "1h", "--start", "2027-03-01T09:00:00Z")["data"]["reservation"]
        s.daemon(alice, "w", "start", log="alice-worker.log")
        poll(lambda: s.json(alice, "notify")["data"]["deliverer"]["state"] == "running", 30, "alice's deliverer")
        s.set_clock(C0 + 50 * 60)
        poll(lambda: s.hook.connected == 1, 20, "the webhook to be called and hang")
        assert alice_tty.count(f"booking {a['short_id']} starts in 10 min") == 1       # the line did not wait
        booked = s.json(bob, "1", "30m")
        assert booked["ok"] and booked["data"]["status"] == "created"
        assert s.hook.connected == 1, "the webhook stopped hanging before the booking committed"
        assert s.hook.hits[0][2] == {"text": f"bk: booking {a['short_id']} starts in 10 min (09:00) on GPU 0"}
        s.hook.release()
        # A webhook that answers 500: bk notify test says so (exit 1), and bk doctor reports the channel.
        s.hook.hang, s.hook.status = False, 500
        p = s.bk(alice, "notify", "test", "--channel", "webhook", check=False)
        assert p.returncode == 1 and "HTTP 500" in p.stdout
        doc = json.loads(s.bk(alice, "--json", "doctor", check=False).stdout)
        (check,) = [c for c in doc["data"]["checks"] if c["name"] == "notifications"]
        assert check["status"] == "fail" and "HTTP 500" in check["detail"]
        s.hook.status = 200
        p = s.bk(alice, "notify", "test")
        assert "terminal: ok: written to " + alice_tty.path in p.stdout and "webhook: ok: HTTP 200" in p.stdout
        poll(lambda: "test notification from bk" in alice_tty.text(), 10, "the test line")
        doc = json.loads(s.bk(alice, "--json", "doctor", check=False).stdout)
        assert [c["status"] for c in doc["data"]["checks"] if c["name"] == "notifications"] == ["ok"]
    finally:
        alice_tty.close()
