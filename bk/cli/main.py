"""``main(argv=None) -> int``: the single entry point of the bk command.

``bk --version`` is answered here without importing argparse or anything
else heavy: start-up time is a feature (benchmarks/cli.py measures it).
The everyday words (``bk l``, ``bk 1 30m``...) are read by ``bk.cli.fast``
when it knows their exact form, also without argparse; every other command
line goes to ``bk.cli.app``.
"""

from __future__ import annotations

import sys


def _version_words(argv: list[str]) -> bool | None:
    """``bk --version`` / ``-V``, with ``--json`` before or after it (and
    nothing else): whether JSON was asked for; None for any other line."""
    rest = [a for a in argv if a != "--json"]
    if rest not in (["--version"], ["-V"]):
        return None
    return len(rest) < len(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    as_json = _version_words(argv)
    if as_json is not None:
        return version(as_json)
    code = _fast(argv)
    if code is not None:
        return code
    from bk.cli.app import run

    return run(argv)


def _fast(argv: list[str]) -> int | None:
    """``bk.cli.fast.run`` with the cyclic garbage collector paused.

    Importing a command's 40-60 modules makes tens of thousands of objects
    (functions, classes, their dicts and tuples), and CPython starts a
    collection every 700 net allocations: about ten of them during ``bk l``,
    each walking every object made so far, 1.5 ms in all.  Nothing an
    everyday command makes needs the collector (its reference cycles live
    as long as the process, a few milliseconds), and the ledger's reader
    pauses it anyway.  The collector's state is restored afterwards, for an
    in-process caller; the other commands (the daemons among them) run
    with it as usual."""
    import gc

    was = gc.isenabled()
    gc.disable()
    try:
        from bk.cli.fast import run as run_fast

        return run_fast(argv)
    finally:
        if was:
            gc.enable()


def version(as_json: bool) -> int:
    """Print the version (or its JSON envelope); a failed write exits 74."""
    from bk.cli.version import print_version

    try:
        code = print_version(as_json)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return closed_pipe()
    except (OSError, ValueError, AttributeError) as exc:   # a full disk; no stdout (None)
        from bk.cli.render import output_failed

        return output_failed(exc)


def closed_pipe() -> int:
    """The reader went away (``bk l | head``): point stdout at /dev/null so
    the interpreter's final flush does not raise again, and exit quietly."""
    from bk.cli.render import park_stdout

    park_stdout()
    return 0
