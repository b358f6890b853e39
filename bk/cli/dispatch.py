"""Run one parsed command and render what came of it, once.

Both readers of the command line end here: ``bk.cli.app`` (argparse, every
command) and ``bk.cli.fast`` (the everyday words, without argparse).  A
handler gets the same namespace and the same ``Context`` from either, and
every way a command can end (an ``Output``, a ``BkError``, a closed pipe,
Ctrl-C, an unexpected exception) is rendered by ``finish`` and ``failure``
here, so the two cannot answer differently.  Nothing here imports argparse.
"""

from __future__ import annotations

import sys

from bk.cli.render import Output, Term, emit, emit_error
from bk.core.errors import EXIT_INTERNAL, BkError, Internal
from bk.core.record import dataclass, field


@dataclass
class Context:
    """What a command handler may use: the environment and terminal facts.
    Handlers reach the service layer through ``bk.service``, never files."""

    env: dict
    json: bool
    argv: list[str]
    term: Term = field(default_factory=Term)
    _app: object = None
    stdin_tty: bool = False
    _call: object = None
    # How the service is opened: ``bk.service.open_app`` unless a caller
    # (a test, an embedding front end) injects its own actor, clock or GPUs.
    opener: object = None

    @property
    def interactive(self) -> bool:
        """May this command ask a question?  Only with a person at a terminal:
        never with --json, and never when stdin is a pipe or a file (a
        script must not hang on a prompt it cannot see)."""
        return self.stdin_tty and not self.json

    def confirm(self, question: str, default: bool = False) -> bool:
        """Ask a yes/no question on the terminal; anything but yes is no,
        except an empty answer, which is ``default`` (shown as ``[Y/n]``)."""
        sys.stderr.write(f"{question} [{'Y/n' if default else 'y/N'}] ")
        sys.stderr.flush()
        try:
            answer = input()
        except EOFError:
            return False
        answer = answer.strip().lower()
        return default if not answer else answer in ("y", "yes")

    def app(self):
        """The service-layer application for this process (opened lazily)."""
        if self._app is None:
            opener = self.opener
            if opener is None:
                from bk.service import open_app as opener
            self._app = opener(self.env)
        return self._app

    def call(self):
        """This command's one call context (who, now, zone, policy, GPUs,
        warnings): every service call and request builder of the command
        gets the same one."""
        if self._call is None:
            self._call = self.app().call()
        return self._call

    def fresh_call(self):
        """A new call context for a write at the end of a dialog (the clock
        read again), keeping the warnings gathered so far."""
        old = self.call()
        self._call = self.app().call()
        self._call.warn(*old.warnings)
        return self._call


def finish(args, ctx: Context) -> int:
    """Run ``args.handler`` and print its ``Output`` (warnings gathered
    on the way included)."""
    out: Output = args.handler(args, ctx)
    out.warnings = merge(warnings_of(ctx), out.warnings)
    return emit(out, ctx.json, ctx.term)


def failure(exc: BaseException, *, command: str, args, ctx, as_json: bool, env: dict,
            agent: bool = False) -> int:
    """The one rendering of a command that raised ``exc`` (``Exception`` or
    ``KeyboardInterrupt``); anything else is raised again."""
    if isinstance(exc, BkError):
        if args is not None:              # a handler may name what failed more exactly
            command = getattr(args, "command", None) or command
        if agent and not as_json:
            # bk agent answers with its one-line envelope, usage errors too.
            from bk.cli.cmd_agent import failure_output

            return emit(failure_output(command, exc, warnings_of(ctx)), False)
        return emit_error(command, exc, as_json, warnings_of(ctx))
    if isinstance(exc, BrokenPipeError):
        from bk.cli.main import closed_pipe

        return closed_pipe()
    if isinstance(exc, KeyboardInterrupt):
        if sys.stderr is not None:
            sys.stderr.write("\n")
        return 130
    if not isinstance(exc, Exception) or env.get("BK_DEBUG") == "1":
        raise exc
    err = Internal(f"unexpected error: {type(exc).__name__}: {exc}",
                   hint="run with BK_DEBUG=1 for details")
    emit_error(command, err, as_json, warnings_of(ctx))
    return EXIT_INTERNAL


def merge(first: list[str], second: list[str]) -> list[str]:
    return list(dict.fromkeys([*first, *second]))


def warnings_of(ctx) -> list[str]:
    """Warnings the service gathered before a failure (a ledger read from a
    backup, say) still reach the user with the error."""
    call = getattr(ctx, "_call", None)
    return list(getattr(call, "warnings", None) or [])


def stdin_is_tty() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (ValueError, OSError):
        return False
