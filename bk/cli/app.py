"""Parse the command line, run one command, render its result once.

The argparse tree is assembled from one module per command group (listed in
``COMMAND_MODULES``); each module's ``register(sub)`` adds its sub-commands
and sets ``handler`` (a function ``(args, ctx) -> Output``) and ``command``
(the name used in the JSON envelope).

Everything that can fail is turned into exactly one rendering here: an
``Output``, a ``BkError`` (exit status from its class), a closed pipe
(silent), Ctrl-C (130) or an unexpected exception (one line, exit 70).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field

from bk.cli.render import Output, Term, emit, emit_error
from bk.core.errors import EXIT_INTERNAL, BkError, Internal, UsageError

PROG = "bk"

# One module per command group; each defines register(subparsers).
COMMAND_MODULES: tuple[str, ...] = (
    "bk.cli.cmd_help",
)

# Words that are not commands but may stand first: `bk 1 30m` is `bk book 1 30m`.
BOOK_SHORTHAND = "book"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises UsageError instead of exiting, so that a
    usage error becomes the same JSON envelope as any other failure."""

    def error(self, message: str):  # noqa: D401 - argparse API
        cmd = self.prog.split(" ", 1)[1] if " " in self.prog else None
        hint = f"see: bk help {cmd}" if cmd else "see: bk help"
        raise UsageError(message, hint=hint)


@dataclass
class Context:
    """What a command handler may use: the environment and terminal facts.
    Handlers reach the service layer through ``bk.service``, never files."""

    env: dict
    json: bool
    argv: list[str]
    term: Term = field(default_factory=Term)
    _app: object = None

    def app(self):
        """The service-layer application for this process (opened lazily)."""
        if self._app is None:
            from bk.service import open_app

            self._app = open_app(self.env)
        return self._app


def build_parser() -> Parser:
    import importlib

    from bk import __version__

    parser = Parser(prog=PROG, description="Book GPUs on a shared Linux server.",
                    epilog="Run 'bk help COMMAND' for one command, 'bk tutorial' for a walkthrough.",
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", "-V", action="version", version=f"bk {__version__}")
    parser.add_argument("--json", action="store_true", help="print one JSON envelope on stdout")
    sub = parser.add_subparsers(dest="command_word", metavar="COMMAND", parser_class=Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _strip_json(argv: list[str]) -> tuple[list[str], bool]:
    """``--json`` may stand anywhere before ``--`` (``bk --json l`` or ``bk l --json``)."""
    cut = argv.index("--") if "--" in argv else len(argv)
    found = "--json" in argv[:cut]
    head = [a for a in argv[:cut] if a != "--json"]
    return head + argv[cut:], found


def _rewrite_shorthand(argv: list[str]) -> list[str]:
    if argv and argv[0].isdigit() and "bk.cli.cmd_book" in COMMAND_MODULES:
        return [BOOK_SHORTHAND, *argv]
    return argv


def guess_command(argv: list[str]) -> str:
    for a in argv:
        if not a.startswith("-"):
            return a
    return "bk"


def run(argv: list[str], env: dict | None = None) -> int:
    env = dict(os.environ) if env is None else env
    argv, as_json = _strip_json(argv)
    argv = _rewrite_shorthand(argv)
    command = guess_command(argv)
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:        # -h/--help and --version print and "exit"
            return int(e.code or 0)
        handler = getattr(args, "handler", None)
        if handler is None:
            raise UsageError("no command given", hint="try: bk help, or bk 1 30m to book one GPU")
        command = args.command
        ctx = Context(env=env, json=as_json, argv=argv, term=Term.detect(env=env))
        out: Output = handler(args, ctx)
        return emit(out, as_json, ctx.term)
    except BkError as err:
        return emit_error(command, err, as_json)
    except BrokenPipeError:
        return _closed_pipe()
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return 130
    except Exception as exc:  # the one broad catch of this front end
        if env.get("BK_DEBUG") == "1":
            raise
        err = Internal(f"unexpected error: {type(exc).__name__}: {exc}",
                       hint="run with BK_DEBUG=1 for details")
        emit_error(command, err, as_json)
        return EXIT_INTERNAL


def _closed_pipe() -> int:
    # The reader went away (`bk l | head`).  Point stdout at /dev/null so the
    # interpreter's final flush does not raise again, and exit quietly.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
    return 0
