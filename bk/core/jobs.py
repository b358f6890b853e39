"""Scheduled commands, the pure part: job states, the safe summary the
shared ledger may hold, the environment a job starts with, the launch guard
and the stop times.

A job is a command attached to a booking.  The shared ledger knows only its
state and a short summary (``Reservation.job``, a ``bk.core.models.Job``
whose ``extra`` holds ``id``, ``digest``, ``reason``, ``exit_code``,
``updated``); the command line itself lives in the owner's private job spec
(``bk.jobs.specs``), bound to the booking by ``digest``.

Everything here takes its facts as arguments (``now``, the snapshot, the
environment), so the worker's decisions are tested without processes.
"""

from __future__ import annotations

import re

from bk.core.timegrid import counted

PENDING = "pending"          # waiting for the booking's start or for the GPUs to clear
RUNNING = "running"
SUCCEEDED = "succeeded"      # exited 0
FAILED = "failed"            # exited non-zero, or could not start (reason says why)
CANCELLED = "cancelled"      # the booking was cancelled (stopped, or never started)
MISSED = "missed"            # the booking ended before the job could start
TIMED_OUT = "timed-out"      # stopped at the booking's end
UNCERTAIN = "uncertain"      # its worker died while it ran; whether it finished is unknown
STATES = (PENDING, RUNNING, SUCCEEDED, FAILED, CANCELLED, MISSED, TIMED_OUT, UNCERTAIN)
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED, MISSED, TIMED_OUT, UNCERTAIN})
# States a retry may requeue (``bk j retry``): the job did not run to its end.
RETRYABLE = frozenset({UNCERTAIN, FAILED, TIMED_OUT, CANCELLED})

# Which state may follow which.  The worker writes pending -> running ->
# an end state; a retry writes an end state -> pending (RETRYABLE only).
NEXT: dict[str, frozenset[str]] = {
    PENDING: frozenset({PENDING, RUNNING, FAILED, CANCELLED, MISSED, UNCERTAIN}),
    RUNNING: frozenset({SUCCEEDED, FAILED, CANCELLED, TIMED_OUT, UNCERTAIN}),
}

# The exact entry a job's environment carries so that a later worker can
# find it among the user's processes after a crash (``/proc/PID/environ``).
MARKER_VAR = "BK_JOB_MARKER"
MARKER_PREFIX = "gpubk-job:"
JOB_ID = re.compile(r"[0-9a-f]{32}")
DIGEST = re.compile(r"[0-9a-f]{64}")

# The variables a job gets from bk; anything of that name inherited is replaced.
BK_VARS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "BK_RESERVATION_ID", "BK_RESERVED_GPUS",
           MARKER_VAR)
# What a worker passes on from its own environment (a systemd user unit has
# a small, known one).  The command line's PATH comes from the spec instead.
WORKER_PASS = ("HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR",
               "XDG_RUNTIME_DIR", "XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME",
               "XDG_CACHE_HOME", "BK_DATA_DIR", "BK_CONFIG_FILE", "BK_GPU_COUNT", "BK_GPU_SIM_FILE")

_SAFE_WORD = re.compile(r"[^A-Za-z0-9._+-]")


def summary_of(argv: list[str] | tuple[str, ...]) -> str:
    """The short, safe picture of a command others may see in the ledger:
    the program's base name (letters, digits, ``._+-`` only, cut at 32) and
    how many arguments followed, never the arguments themselves (they may
    hold paths, tokens, data set names)."""
    prog = (argv[0] if argv else "").rsplit("/", 1)[-1]
    prog = _SAFE_WORD.sub("_", prog)[:32] or "command"
    n = len(argv) - 1
    return prog if n <= 0 else f"{prog} +{counted(n, 'arg')}"


def digest_of(data: bytes) -> str:
    """The binding between a booking and its spec: sha256 of the spec's
    bytes, which hold a random salt (``bk.jobs.specs``): the ledger shows
    the digest to everyone, and the rest of a spec can be guessed."""
    import hashlib

    return hashlib.sha256(data).hexdigest()


def marker(job_id: str) -> str:
    return MARKER_PREFIX + job_id


def marker_entry(job_id: str) -> bytes:
    """The exact ``NAME=value`` entry of a job's environment, as bytes in
    ``/proc/PID/environ`` (NUL-separated entries)."""
    return f"{MARKER_VAR}={marker(job_id)}".encode()


def visible_devices(gpus, uuids: dict[int, str], simulated: bool) -> str:
    """``CUDA_VISIBLE_DEVICES``: the GPUs' UUIDs when the driver gave real
    ones (an index can name another GPU when a device is hidden or the
    enumeration order differs), indices in a simulation (its UUIDs name no
    device CUDA knows)."""
    if not simulated and all(uuids.get(g) for g in gpus):
        return ",".join(uuids[g] for g in gpus)
    return ",".join(str(g) for g in gpus)


def worker_base_env(env: dict) -> dict:
    """The part of a worker's environment every job gets."""
    return {k: v for k, v in env.items() if k in WORKER_PASS or k.startswith("LC_")}


def job_env(base: dict, *, reservation_id: str, gpus, uuids: dict[int, str], simulated: bool,
            path: str | None = None, job_id: str | None = None) -> dict:
    """The environment a job starts with: ``base`` (the caller's own for
    ``bk run -- CMD``, ``worker_base_env`` for the worker) with bk's
    variables set over anything inherited, ``PATH`` from the spec, and the
    crash-recovery marker for a worker's job."""
    env = {k: v for k, v in base.items() if k not in BK_VARS}
    if path is not None:
        env["PATH"] = path
    env["CUDA_VISIBLE_DEVICES"] = visible_devices(gpus, uuids, simulated)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["BK_RESERVATION_ID"] = reservation_id
    env["BK_RESERVED_GPUS"] = ",".join(str(g) for g in gpus)
    if job_id is not None:
        env[MARKER_VAR] = marker(job_id)
    return env


def stop_times(end: int, grace: int, start: int | None = None) -> tuple[int, int]:
    """``(TERM at, KILL at)``: TERM ``grace`` seconds before the end (never
    before the start, so a short booking still runs), KILL at the end."""
    term = end - max(0, grace)
    if start is not None:
        term = max(term, start)
    return term, end


def launch_blocker(snapshot, reservations, booking, now: int) -> str | None:
    """Why the job of ``booking`` must not start now, or None.

    Exclusive: any process on its GPUs that is not the owner's (system
    processes aside).  Shared: processes without a booking on that GPU
    (unreserved, unknown owner, or booked elsewhere), or less free memory
    than the booking's figure.  A source that cannot list processes (a
    count-only simulation, nvidia-smi) blocks nothing: the guard cannot
    see, and saying "waiting" forever would be a lie."""
    from bk.core import telemetry

    reasons = []
    for x in telemetry.intruders(snapshot, reservations, booking=booking, now=now):
        who = ", ".join(x.users)
        mem = f", {x.mem_mib} MiB" if x.mem_mib else ""
        reasons.append(f"GPU {x.gpu} is used by {who} without a booking there "
                       f"({counted(x.count, 'process', 'processes')}{mem})")
    if booking.mode != "exclusive" and booking.mem_mib:
        for g in snapshot.gpus:
            if g.index not in booking.gpus or g.mem_total_mib is None or g.mem_used_mib is None:
                continue
            free = g.mem_total_mib - g.mem_used_mib
            if free < booking.mem_mib:
                reasons.append(f"GPU {g.index} has {free} MiB free; the booking needs {booking.mem_mib} MiB")
    return "; ".join(reasons) or None


def exit_state(returncode: int, *, stopped_for: str | None) -> str:
    """The end state of a job that exited with ``returncode`` (negative: a
    signal, as ``subprocess`` reports it).  ``stopped_for``: ``end`` or
    ``cancel`` when the worker stopped it."""
    if stopped_for == "end":
        return TIMED_OUT
    if stopped_for == "cancel":
        return CANCELLED
    return SUCCEEDED if returncode == 0 else FAILED


def ends_booking(*, stopped_for: str | None, keep: bool, cancelled: bool, now: int, end: int) -> bool:
    """Whether a job that just exited ends its booking now: it exited on
    its own (bk did not stop it for the end, a cancel or its worker's stop),
    the booking was made for it without ``--keep``, and the booking still
    has time left to give back."""
    return stopped_for is None and not keep and not cancelled and now < end


def shell_status(returncode: int) -> int:
    """A ``subprocess`` return code as a shell reports it: 128+N for signal N."""
    return 128 - returncode if returncode < 0 else returncode
