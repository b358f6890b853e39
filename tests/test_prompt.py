"""``bk`` alone: the status and the interactive ``bk> `` prompt.

The interactive tests run the real program in a pseudo-terminal (``pty``)
and read its output until the expected text appears or a deadline passes;
nothing sleeps.  ``Pty`` is also used by tests/test_guided.py.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import stat
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from bk.cli.app import Context
from bk.cli.prompt import dispatch_line

ROOT = Path(__file__).resolve().parent.parent
NOW = "2026-07-13T10:41:00Z"
# CSI/OSC sequences and the few two-byte escapes readline and xterm use.
_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[()][0-9A-Za-z]|[=>78])")


def bk_env(tmp: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update({"HOME": str(tmp), "BK_DATA_DIR": str(tmp / "data"), "BK_GPU_COUNT": "4",
                "XDG_STATE_HOME": str(tmp / "state"), "XDG_CONFIG_HOME": str(tmp / "cfg"),
                "BK_NOW": NOW, "TZ": "UTC", "NO_COLOR": "1", "TERM": "xterm",
                "INPUTRC": os.devnull, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"})
    env.pop("COLUMNS", None)
    env.update(extra)
    return env


def _controlling_tty() -> None:
    # In the child: a new session whose controlling terminal is the pty on
    # stdin, so that Ctrl-C typed there becomes SIGINT as in a real terminal.
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Pty:
    """A bk process on a pseudo-terminal, driven like a person would."""

    def __init__(self, args: list[str], env: dict, *, cols: int = 120, rows: int = 40,
                 timeout: float = 20.0):
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.proc = subprocess.Popen([sys.executable, "-m", "bk", *args], stdin=slave, stdout=slave,
                                     stderr=slave, env=env, cwd=ROOT, preexec_fn=_controlling_tty,
                                     close_fds=True)
        os.close(slave)
        self.raw = b""
        self.pos = 0
        self.eof = False
        self.timeout = timeout

    @property
    def text(self) -> str:
        return _ESCAPES.sub("", self.raw.decode("utf-8", "replace")).replace("\r", "")

    def _read(self, deadline: float) -> None:
        ready, _, _ = select.select([self.master], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return
        try:
            chunk = os.read(self.master, 65536)
        except OSError:          # EIO: every process closed the terminal
            chunk = b""
        if chunk:
            self.raw += chunk
        else:
            self.eof = True

    def expect(self, pattern: str, timeout: float | None = None) -> re.Match:
        """Wait for ``pattern`` (a regex) after the previous match."""
        deadline = time.monotonic() + (timeout or self.timeout)
        rx = re.compile(pattern)
        while True:
            m = rx.search(self.text, self.pos)
            if m:
                self.pos = m.end()
                return m
            if self.eof or time.monotonic() >= deadline:
                raise AssertionError(f"did not see {pattern!r}; output after the last match:\n"
                                     + self.text[self.pos:][-3000:])
            self._read(deadline)

    def send(self, text: str) -> None:
        os.write(self.master, text.encode())

    def wait_blocked_on_input(self, timeout: float | None = None) -> None:
        """Wait until the child sleeps in select()/poll() on the terminal.

        Needed before Ctrl-C: CPython's readline notices SIGINT only when
        select() returns EINTR, so a signal that lands while readline is
        still busy redrawing (a wide window on a loaded machine) waits for
        the next key press.  /proc/PID/wchan names the kernel function the
        process sleeps in."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{self.proc.pid}/wchan") as f:
                    wchan = f.read()
                with open(f"/proc/{self.proc.pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                return                       # no /proc here: fall back to sending at once
            if state == "S" and ("poll" in wchan or "select" in wchan):
                return
            time.sleep(0.01)
        raise AssertionError("the prompt never went back to waiting for input")

    def line(self, text: str = "") -> None:
        self.send(text + "\r")

    def wait(self, timeout: float | None = None) -> int:
        deadline = time.monotonic() + (timeout or self.timeout)
        while not self.eof and time.monotonic() < deadline:
            self._read(deadline)      # keep draining so the child never blocks on a full pty
        return self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        os.close(self.master)


@pytest.fixture
def term(tmp_path):
    sessions = []

    def start(*args: str, **env) -> Pty:
        p = Pty(list(args), bk_env(tmp_path, **env))
        sessions.append(p)
        return p
    yield start
    for p in sessions:
        p.close()


@pytest.mark.slow
def test_prompt_runs_commands_and_survives_errors(term, tmp_path):
    t = term()
    t.expect(r"GPU\s+MODEL")                       # the status comes first
    t.expect(r"bk> ")
    t.line("1 30m")
    t.expect(r"booked 1 GPU \(0\) shared 07-13 10:40–11:10")
    t.expect(r"bk> ")
    t.line("bk l")                                 # with or without the leading bk
    t.expect(r"1\s+\w{8}\s+0\s+shared")
    t.expect(r"bk> ")
    t.line("nonsense words")
    t.expect(r"error: .*nonsense")
    t.expect(r"bk> ")
    t.line("l -h")                                 # argparse's help "exits": not the prompt
    t.expect(r"usage: bk list")
    t.expect(r"bk> ")
    t.line('1 30m --note "unclosed')
    t.expect(r"error: cannot read that line")
    t.expect(r"bk> ")
    t.line("exit")
    assert t.wait() == 0
    history = tmp_path / "data" / "state" / "prompt_history"     # beside BK_DATA_DIR's data
    assert history.read_text().splitlines() == ["1 30m", "bk l", "nonsense words", "l -h",
                                                '1 30m --note "unclosed']
    assert stat.S_IMODE(history.stat().st_mode) == 0o600


def test_ctrl_c_clears_the_line_and_ctrl_d_leaves(term):
    t = term()
    t.expect(r"bk> ")
    t.send("half a line")
    t.expect(r"half a line")
    t.wait_blocked_on_input()
    t.send("\x03")                                 # Ctrl-C
    t.expect(r"bk> ")
    t.line("l")
    t.expect(r"no current or upcoming bookings|#\s+ID")
    t.expect(r"bk> ")
    t.send("\x04")                                 # Ctrl-D
    assert t.wait() == 0


@pytest.mark.slow
def test_history_recalls_previous_lines(term):
    pytest.importorskip("readline")
    t = term()
    t.expect(r"bk> ")
    t.line("help book")
    t.expect(r"usage: bk book")
    t.expect(r"bk> ")
    t.send("\x1b[A")                               # up arrow: the previous line
    t.line()
    t.expect(r"usage: bk book")                    # ran again
    t.expect(r"bk> ")
    t.line("quit")
    assert t.wait() == 0
    # A new prompt starts with the history of the last one.
    t2 = term()
    t2.expect(r"bk> ")
    t2.send("\x1b[A")
    t2.line()
    t2.expect(r"usage: bk book")
    t2.expect(r"bk> ")
    t2.line("exit")
    assert t2.wait() == 0


def test_without_a_terminal_prints_the_status_once(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bk"], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, env=bk_env(tmp_path), cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "GPU" in proc.stdout and "bk> " not in proc.stdout


def test_dispatch_line_in_process(tmp_path, capsys, monkeypatch):
    env = bk_env(tmp_path)
    monkeypatch.setenv("BK_NOW", NOW)
    ctx = Context(env=env, json=False, argv=[])
    assert dispatch_line("", ctx) == 0
    assert dispatch_line("bk", ctx) == 0                 # never a nested prompt
    assert dispatch_line("'open quote", ctx) == 2
    assert dispatch_line("l --bogus", ctx) == 2
    assert dispatch_line("help", ctx) == 0
    assert dispatch_line("--version", ctx) == 0          # SystemExit stays inside
    assert dispatch_line("p delete ghost", ctx) == 4
    capsys.readouterr()
    assert dispatch_line("--json", ctx) == 0             # alone: the status as JSON
    assert '"command": "status"' in capsys.readouterr().out
