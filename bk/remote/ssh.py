"""The one place that runs ``ssh`` (and, for a catalog's ``local`` node, the
node's ``bk`` directly).

The facts:

* ``ssh TARGET WORDS...`` joins WORDS with spaces and hands the string to
  the remote user's login shell, which splits it again.  So every word is
  quoted here (``shlex.quote``); a booking note with a ``;`` in it stays one
  word on the node instead of becoming a second command.
* ``BatchMode=yes`` makes ssh fail instead of asking for a password or a
  passphrase (there is nobody to answer: the client may run in threads, or
  under an MCP server).  ``StrictHostKeyChecking=yes`` makes an unknown or
  changed host key a failure instead of a question or a silent trust: the
  node's identity starts with its host key.  ``ConnectTimeout`` bounds only
  the TCP connect and the key exchange; a node that accepts and then hangs
  is bounded by our own deadline, which kills the process.
* ``-T``: no terminal on the node, so the remote ``bk`` sees a pipe (no
  prompts, no colour) and its stdout arrives byte for byte.
* A reply is read with a bound: a broken or hostile node could send an
  endless stream; past ``max_bytes`` the process is killed and the result
  says ``too_large``.  stderr is bounded the same way (it carries ssh's own
  diagnostics: "Host key verification failed.").
* The child gets its own session (``start_new_session``), so Ctrl-C at the
  terminal reaches us and not ssh (we decide what to kill), and killing
  goes to its process group, by its PID, which also ends a ``ProxyCommand``
  ssh started.

Nothing here decodes JSON: ``run`` returns the bytes, the exit status and
how it ended; ``bk.cluster.node`` reads the envelope.
"""

from __future__ import annotations

import os
import selectors
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Sequence

from bk.core.record import dataclass

MAX_REPLY_BYTES = 4 << 20
MAX_STDERR_BYTES = 64 << 10
# How often a waiting runner looks at ``cancelled()``: how soon Ctrl-C (or
# the fan-out's backstop) kills its process.  Each look wakes the thread and
# takes the GIL; with a hundred nodes waiting, 50 ms looks cost the client a
# measurable share of a core (benchmarks/cluster.py).
POLL_S = 0.2


@dataclass(frozen=True)
class Outcome:
    """How one remote command ended.  ``ended`` is ``exit`` (it exited with
    ``rc``), ``timeout`` (killed at the deadline), ``too_large`` (killed
    past the output bound), ``cancelled`` (killed on request) or
    ``not_started`` (the program could not be run; ``stderr`` says why)."""

    ended: str
    rc: int | None
    stdout: bytes
    stderr: bytes
    seconds: float

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace").strip()


def ssh_argv(target: str, remote: Sequence[str], *, port: int | None = None,
             connect_timeout: int = 10, known_hosts: str | None = None,
             identity_file: str | None = None, tty: bool = False) -> list[str]:
    """The exact ssh command line for ``remote`` (already split into words)
    on ``target``.  ``target`` names a host only: the user is always the
    caller (``bk.cluster.catalog`` refuses ``user@host``), and ``--`` keeps
    a target that looks like an option from being read as one.  ``tty``
    (``bk c tui``) asks for a terminal on the node instead of a pipe."""
    argv = ["ssh", "-t" if tty else "-T", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"ConnectTimeout={int(connect_timeout)}", "-o", "LogLevel=ERROR"]
    if port is not None:
        argv += ["-p", str(int(port))]
    if known_hosts:
        argv += ["-o", f"UserKnownHostsFile={known_hosts}"]
    if identity_file:
        argv += ["-i", identity_file, "-o", "IdentitiesOnly=yes"]
    return [*argv, "--", target, " ".join(shlex.quote(w) for w in remote)]


def run(argv: Sequence[str], *, timeout: float, max_bytes: int = MAX_REPLY_BYTES,
        cancelled: Callable[[], bool] | None = None, env: dict | None = None,
        monotonic: Callable[[], float] = time.monotonic) -> Outcome:
    """Run ``argv`` with stdin from /dev/null and both outputs bounded;
    kill it at ``timeout`` seconds, past ``max_bytes`` of stdout, or when
    ``cancelled()`` turns true (polled every ``POLL_S``)."""
    start = monotonic()
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, env=env)
    except OSError as e:
        return Outcome("not_started", None, b"", f"cannot run {argv[0]}: {e.strerror}".encode(),
                       monotonic() - start)
    out, err = bytearray(), bytearray()
    ended = "exit"
    sel = selectors.DefaultSelector()
    try:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        deadline = start + timeout
        while sel.get_map():
            left = deadline - monotonic()
            if left <= 0:
                ended = "timeout"
                break
            if cancelled is not None and cancelled():
                ended = "cancelled"
                break
            for key, _ in sel.select(min(left, POLL_S)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = key.data
                buf += chunk
                if buf is out and len(out) > max_bytes:
                    ended = "too_large"
                    break
                if buf is err and len(err) > MAX_STDERR_BYTES:
                    del err[MAX_STDERR_BYTES:]
            if ended != "exit":
                break
    finally:
        sel.close()
        if ended != "exit":
            _kill(proc)
        rc = _reap(proc, deadline=max(0.0, start + timeout - monotonic()) + 1.0)
        proc.stdout.close()
        proc.stderr.close()
    return Outcome(ended, rc if ended == "exit" else None, bytes(out[:max_bytes]), bytes(err),
                   monotonic() - start)


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (its PID: it leads the session we
    gave it), then the child itself in case it left the group."""
    for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass


def _reap(proc: subprocess.Popen, deadline: float) -> int | None:
    """Both pipes are at EOF (or it was killed): wait for the exit status.
    A child that closed its outputs but keeps running is killed too."""
    try:
        return proc.wait(timeout=deadline)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return proc.wait()
