"""The ledger's test hooks (tests only; a Store loads this module only when
a test sets one of the variables).

``BK_TEST_CRASH_AT=STEP[:N]`` kills the process by SIGKILL at a named step
of a commit, so the crash tests can stop a writer at every step and check
what a reader finds; ``BK_TEST_SCAN_PAUSE=FIFO[:UID]`` holds an audit scan
in progress for as long as a test likes (the broker's fairness tests).
"""

from __future__ import annotations

import _thread
import os

from bk.core.errors import ConfigError
from bk.store.ledger import CRASH_ENV


def crash_point(spec: str | None, steps: tuple[str, ...]) -> tuple[str, int] | None:
    """``BK_TEST_CRASH_AT=STEP[:N]`` (tests only): die by SIGKILL right after
    the N-th time (default 1) this Store passes STEP."""
    if not spec:
        return None
    from bk.store import segments

    step, _, count = spec.partition(":")
    if step not in steps + segments.STEPS:
        raise ConfigError(f"{CRASH_ENV}={spec!r}: unknown step; steps: {', '.join(steps + segments.STEPS)}")
    return step, int(count or 1)


def scan_pause(spec: str | None) -> tuple[str, int | None] | None:
    """``BK_TEST_SCAN_PAUSE=FIFO[:UID]`` (tests only): every audit scan (of
    UID's records only, with UID) parks in ``park`` once its files are
    open, so a test can hold a scan in progress for as long as it likes."""
    if not spec:
        return None
    path, _, uid = spec.rpartition(":")
    return (path, int(uid)) if path and uid.isdigit() else (spec, None)


def park(fifo: str) -> None:
    """Say so (``FIFO.parked-THREAD``, created), then wait for one byte of
    ``fifo``: the test writes one per scan it lets go."""
    marker = f"{fifo}.parked-{_thread.get_ident()}"
    os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    try:
        fd = os.open(fifo, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.read(fd, 1)
        finally:
            os.close(fd)
    finally:
        os.unlink(marker)


def die() -> None:
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
    os._exit(137)
