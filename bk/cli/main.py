"""``main(argv=None) -> int``: the single entry point of the bk command.

``bk --version`` is answered here without importing argparse or anything
else heavy: start-up time is a feature (benchmarks/cli.py measures it).
Every other command goes to ``bk.cli.app``.
"""

from __future__ import annotations

import sys


def _json_flag(argv: list[str]) -> bool:
    head = argv[: argv.index("--")] if "--" in argv else argv
    return "--json" in head


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("--version", "-V") and all(a == "--json" for a in argv[1:]):
        from bk.cli.version import print_version

        try:
            code = print_version(_json_flag(argv))
            sys.stdout.flush()
            return code
        except BrokenPipeError:
            return closed_pipe()
        except (OSError, ValueError, AttributeError) as exc:   # a full disk; no stdout (None)
            from bk.cli.render import output_failed

            return output_failed(exc)
    from bk.cli.app import run

    return run(argv)


def closed_pipe() -> int:
    """The reader went away (``bk l | head``): point stdout at /dev/null so
    the interpreter's final flush does not raise again, and exit quietly."""
    from bk.cli.render import park_stdout

    park_stdout()
    return 0
