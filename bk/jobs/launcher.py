"""Starting and stopping job processes.

How the kernel behaves, and what follows:

* ``setsid()`` (``start_new_session``) makes the child the leader of a new
  session and of a new process group whose id is its pid, with no
  controlling terminal.  Everything it starts inherits that group unless it
  asks otherwise, so ``killpg(pid, SIGTERM)`` reaches a shell script and its
  children, not just the script.  A worker's jobs run this way.
* ``bk run -- CMD`` must keep the terminal (REPLs, editors, progress bars):
  the child gets its own process group in the *same* session (``setpgid``)
  and is made the terminal's foreground group (``tcsetpgrp``), so Ctrl-C
  (the terminal sends SIGINT to its foreground group) reaches the command
  and not bk, and the command may read the terminal without SIGTTIN.
  ``tcsetpgrp`` from a background group raises SIGTTOU, so it is called
  with SIGTTOU ignored, in the child before exec and in bk afterwards to
  take the terminal back.  Signals bk itself receives (``kill -INT``, a
  hang-up) are forwarded to the command's group.
* A process whose parent died is re-parented (to init or a subreaper) and
  keeps running.  Its ``/proc/PID/environ`` (readable by the same user)
  still holds the environment it was started with: the exact marker entry
  ``BK_JOB_MARKER=gpubk-job:ID`` finds it (``find_marked``).  Its exit can
  then no longer be waited for, only observed (``alive``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable

from bk.core.jobs import MARKER_VAR, marker_entry


def launch(argv, *, cwd: str, env: dict, log_fd: int) -> subprocess.Popen:
    """Start a worker's job: no shell, a new session, stdin from /dev/null,
    stdout and stderr on ``log_fd``.  Raises OSError when it cannot start."""
    return subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log_fd,
                            stderr=log_fd, start_new_session=True, close_fds=True)


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to a process group; False when it is gone."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:      # not ours (a recycled id): never touch it
        return False


def alive(pid: int, proc_root: str = "/proc") -> bool:
    """Running (not a zombie nobody reaped yet)."""
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # The state follows the command name in parentheses, which may itself hold ") ".
    state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]
    return state not in (b"Z", b"X", b"")


def find_marked(uid: int, job_ids, proc_root: str = "/proc") -> dict[str, list[int]]:
    """The processes of ``uid`` whose environment holds the exact marker of
    one of ``job_ids``: ``{job id: [pid, ...]}``."""
    wanted = {marker_entry(j): j for j in job_ids}
    out: dict[str, list[int]] = {}
    if not wanted:
        return out
    try:
        names = os.listdir(proc_root)
    except OSError:
        return out
    prefix = MARKER_VAR.encode() + b"="
    for name in names:
        if not name.isdigit():
            continue
        path = os.path.join(proc_root, name)
        try:
            if os.stat(path).st_uid != uid:
                continue
            with open(os.path.join(path, "environ"), "rb") as f:
                env = f.read()
        except OSError:
            continue
        if prefix not in env:
            continue
        for entry in env.split(b"\0"):
            job = wanted.get(entry)
            if job is not None and alive(int(name), proc_root):
                out.setdefault(job, []).append(int(name))
    return out


def stop_orphans(pids: list[int], *, grace: float, proc_root: str = "/proc",
                 monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
    """TERM the process groups of ``pids``, KILL what is left after ``grace``."""
    groups = set()
    for pid in pids:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            continue
    for g in groups:
        signal_group(g, signal.SIGTERM)
    deadline = monotonic() + grace
    while any(alive(p, proc_root) for p in pids) and monotonic() < deadline:
        sleep(0.05)
    for g in groups:
        signal_group(g, signal.SIGKILL)


def _stdin_tty() -> int | None:
    try:
        return 0 if os.isatty(0) else None
    except OSError:
        return None


def _take_terminal(fd: int | None, pgid: int) -> None:
    if fd is None:
        return
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, pgid)
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)


FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def run_foreground(argv, *, cwd: str, env: dict, term_in: float, kill_in: float,
                   monotonic: Callable[[], float] = time.monotonic,
                   stdout: int | None = None) -> tuple[int, str | None]:
    """Run ``argv`` on this terminal until it exits; TERM its group after
    ``term_in`` seconds, KILL after ``kill_in``.  ``stdout``: a descriptor
    for the command's standard output instead of bk's (``bk run --json``
    gives it stderr, keeping stdout for the envelope).  Returns
    ``(returncode as subprocess reports it, "end" when bk stopped it,
    "signal" when bk forwarded a signal it received, else None)``."""
    tty = _stdin_tty()

    def child_setup():          # runs in the child between fork and exec
        os.setpgid(0, 0)
        _take_terminal(tty, os.getpgrp())

    start = monotonic()
    proc = subprocess.Popen(list(argv), cwd=cwd, env=env, preexec_fn=child_setup, stdout=stdout)
    pgid = proc.pid
    try:
        os.setpgid(pgid, pgid)      # the same, from this side: no window where it is ours
    except OSError:
        pass
    stopped: list[str] = []

    def forward(signum, _frame):
        stopped.append("signal")
        signal_group(pgid, signum)

    saved = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        termed = False
        while True:
            left = (kill_in if termed else term_in) - (monotonic() - start)
            try:
                proc.wait(timeout=max(0.0, left))
                break
            except subprocess.TimeoutExpired:
                pass
            if not termed:
                termed = True
                stopped.append("end")
                signal_group(pgid, signal.SIGTERM)
            else:
                signal_group(pgid, signal.SIGKILL)
                proc.wait()
                break
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
        _take_terminal(tty, os.getpgrp())
    why = "end" if "end" in stopped else ("signal" if stopped else None)
    return proc.returncode, why
