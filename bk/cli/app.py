"""Parse the command line, run one command, render its result once.

The argparse tree is assembled from one module per command group (listed in
``COMMAND_MODULES``); each module's ``register(sub)`` adds its sub-commands
and sets ``handler`` (a function ``(args, ctx) -> Output``) and ``command``
(the name used in the JSON envelope).

Everything that can fail is turned into exactly one rendering here: an
``Output``, a ``BkError`` (exit status from its class), a closed pipe
(silent), Ctrl-C (130) or an unexpected exception (one line, exit 70).

``parse_argv`` is how every front end that takes typed words (the prompt,
the guided flows) reads them, so ``bk 1 30m``, ``-d -15m`` and free words
after flags mean the same everywhere.  ``bk`` alone opens the interactive
prompt at a terminal, and prints the status otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys

from bk.cli.dispatch import Context, failure, finish, merge, stdin_is_tty, warnings_of
from bk.cli.render import Term, emit, setup_streams
from bk.core.errors import UsageError

__all__ = ["COMMAND_WORDS", "Context", "build_parser", "normalise", "parse_argv", "run"]

PROG = "bk"

# argparse looks each of its phrases ("usage:", "options", its error
# templates) up with gettext on every call, and the first lookup imports
# locale; each looks for a "messages" catalogue of every language named in
# the environment on disk: about a millisecond of every command.  bk's help
# and errors are English, and Parser.error reads argparse's English messages,
# so argparse's phrases stay English: no lookup.
argparse._ = str


def _ngettext(singular: str, plural: str, n: int) -> str:
    return singular if n == 1 else plural


argparse.ngettext = _ngettext

# One module per command group; each defines register(subparsers) and adds
# exactly the words listed here.  Knowing the words up front lets a run build
# only the parser of the command it runs: importing all groups and building
# ~35 sub-parsers costs more than most commands' work (benchmarks/cli.py).
# tests/test_cli_registry.py checks this table against what modules register.
COMMAND_WORDS: dict[str, tuple[str, ...]] = {
    "bk.cli.cmd_book": ("book", "s", "x", "exclusive"),
    "bk.cli.cmd_list": ("l", "ls", "list"),
    "bk.cli.cmd_edit": ("e", "edit"),
    "bk.cli.cmd_cancel": ("d", "del", "rm", "cancel"),
    "bk.cli.cmd_status": ("st", "status"),
    "bk.cli.cmd_timeline": ("tl", "timeline"),
    "bk.cli.cmd_tui": ("t", "tui"),
    "bk.cli.cmd_slots": ("slots", "g", "gpu"),
    "bk.cli.cmd_notices": ("n", "notices"),
    "bk.cli.cmd_log": ("history", "lg", "log"),
    "bk.cli.cmd_info": ("info", "login", "config"),
    "bk.cli.cmd_doctor": ("doctor",),
    "bk.cli.cmd_tutorial": ("tutorial",),
    "bk.cli.guided": ("a", "add"),
    "bk.cli.cmd_preset": ("p", "preset"),
    "bk.cli.cmd_admin": ("admin",),
    "bk.cli.cmd_install": ("update",),
    "bk.cli.cmd_broker": ("broker",),
    "bk.cli.cmd_run": ("run",),
    "bk.cli.cmd_adopt": ("adopt",),
    "bk.cli.cmd_jobs": ("j", "jobs", "w", "worker"),
    "bk.cli.cmd_notify": ("notify",),
    "bk.cli.cmd_monitor": ("m", "monitor"),
    "bk.cli.cmd_usage": ("u", "usage"),
    "bk.cli.cmd_export": ("export",),
    "bk.cli.cmd_cluster": ("c", "cluster"),
    "bk.cli.cmd_mcp": ("mcp",),
    "bk.cli.cmd_agent": ("agent",),
    "bk.cli.cmd_help": ("help",),
}
COMMAND_MODULES: tuple[str, ...] = tuple(COMMAND_WORDS)
_MODULE_OF = {w: m for m, words in COMMAND_WORDS.items() for w in words}

# Words that are not commands but may stand first: `bk 1 30m` is `bk book 1 30m`.
BOOK_SHORTHAND = "book"

CHEAT_SHEET = """Book GPUs on a shared Linux server.

Everyday commands:
  bk 1 30m               book one GPU for 30 minutes, starting now
  bk 2 1h30m 12g         two GPUs for 90 minutes, 12 GiB each
  bk l                   list your bookings, numbered 1, 2, ...
  bk d 1                 cancel booking 1
  bk e 1 -d +30m         extend booking 1 by 30 minutes
  bk st                  every GPU, its use and your bookings
  bk tl                  text timeline of every GPU
  bk slots 2 1h          where and when two GPUs are free for an hour
  bk g                   which GPU can I use now?
  bk p save train 2 1h   save a preset; bk p train books it
  bk doctor              check that bk works here

All commands:"""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions are folded to the terminal like any prose; a paragraph
    whose lines are indented (``Examples:`` blocks) keeps its layout, so
    commands line up and stay copyable."""

    def __init__(self, prog, indent_increment=2, max_help_position=24, width=None):
        # argparse builds a formatter for every add_argument() call, and the
        # default width lookup imports shutil (and with it bz2 and lzma): a
        # few milliseconds on every run for help that is rarely printed.
        if width is None:
            cols = os.environ.get("COLUMNS", "")
            if cols.isdigit():
                width = int(cols)
            else:
                try:
                    width = os.get_terminal_size(sys.stdout.fileno()).columns
                except (OSError, ValueError, AttributeError):   # no stdout at all: None
                    width = 80
            width -= 2
        super().__init__(prog, indent_increment, max_help_position, width)

    def _fill_text(self, text, width, indent):
        import textwrap

        out = []
        for para in text.strip("\n").split("\n\n"):
            lines = para.splitlines()
            if any(line[:1].isspace() for line in lines) or para.rstrip().endswith(":"):
                out.append("\n".join(indent + line for line in lines))
            else:
                out.append(textwrap.fill(" ".join(para.split()), width, initial_indent=indent,
                                         subsequent_indent=indent))
        return "\n\n".join(out)


class _HelpLost(Exception):
    """Help or usage text argparse could not write (``exc``: why)."""

    def __init__(self, exc: OSError):
        super().__init__(exc)
        self.exc = exc


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises UsageError instead of exiting, so that a
    usage error becomes the same JSON envelope as any other failure."""

    def __init__(self, *args, **kwargs):
        # Every command's help uses the one formatter (fits the terminal,
        # keeps examples), whichever argparse formatter its module named.
        if kwargs.get("formatter_class") in (None, argparse.HelpFormatter,
                                             argparse.RawDescriptionHelpFormatter):
            kwargs["formatter_class"] = HelpFormatter
        super().__init__(*args, **kwargs)

    def _print_message(self, message, file=None):
        # argparse drops an OSError here, so help written to a full disk
        # would be lost with exit 0; run() turns this into exit 74.
        if message:
            file = file or sys.stderr
            try:
                file.write(message)
            except BrokenPipeError:
                raise
            except OSError as exc:
                raise _HelpLost(exc) from None
            except AttributeError:      # no stream at all (None)
                if file is sys.stdout:
                    raise _HelpLost(OSError("standard output is closed")) from None

    def error(self, message: str):  # noqa: D401 - argparse API
        cmd = self.prog.split(" ", 1)[1] if " " in self.prog else None
        hint = f"see: bk help {cmd}" if cmd else "see: bk help"
        if cmd is None and message.startswith("argument COMMAND: invalid choice"):
            raise self._unknown_command(message)
        raise UsageError(message, hint=hint)

    def _unknown_command(self, message: str) -> UsageError:
        # argparse lists every alias in its message; say what was typed and
        # suggest the nearest command instead.
        import difflib
        import re

        m = re.search(r"invalid choice: '([^']*)'", message)
        word = m.group(1) if m else "?"
        sub = next((a for a in self._actions if isinstance(a, argparse._SubParsersAction)), None)
        names = sorted(sub.choices) if sub else []
        close = difflib.get_close_matches(word, names, n=1)
        hint = (f"did you mean: bk {close[0]}?  " if close else "") + "all commands: bk help"
        return UsageError(f"unknown command {word!r}", hint=hint)


def build_parser(only: str | None = None) -> Parser:
    """The argparse tree: every command, or with ``only`` (a command word)
    just the group that owns it; unknown words get the whole tree so the
    "did you mean" hint can see every name."""
    import importlib

    from bk import __version__

    parser = Parser(prog=PROG, description=CHEAT_SHEET,
                    epilog="Run 'bk help COMMAND' for one command, "
                    "'bk help preset save' for a sub-command, 'bk tutorial' for a walkthrough.",
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", "-V", action="version", version=f"bk {__version__}")
    parser.add_argument("--json", action="store_true", help="print one JSON envelope on stdout")
    sub = parser.add_subparsers(dest="command_word", metavar="COMMAND", parser_class=Parser)
    modules = [_MODULE_OF[only]] if only in _MODULE_OF else COMMAND_MODULES
    for name in modules:
        importlib.import_module(name).register(sub)
    return parser


def _strip_json(argv: list[str]) -> tuple[list[str], bool]:
    """``--json`` may stand anywhere before ``--`` (``bk --json l`` or ``bk l --json``)."""
    cut = argv.index("--") if "--" in argv else len(argv)
    found = "--json" in argv[:cut]
    head = [a for a in argv[:cut] if a != "--json"]
    return head + argv[cut:], found


def _rewrite_shorthand(argv: list[str]) -> list[str]:
    # ``bk @gpu-a l`` is ``bk c at gpu-a -- l``; ``bk c 2 1h`` is ``bk c book 2 1h``.
    if argv and argv[0][:1] == "@" and len(argv[0]) > 1 and "bk.cli.cmd_cluster" in COMMAND_MODULES:
        return ["c", "at", argv[0][1:], "--", *argv[1:]]
    if len(argv) > 1 and argv[0] in ("c", "cluster") and argv[1].isdigit():
        return [argv[0], "book", *argv[1:]]
    if argv and argv[0].isdigit() and "bk.cli.cmd_book" in COMMAND_MODULES:
        return [BOOK_SHORTHAND, *argv]
    return argv


# Options of bk itself: they stay in front of the command word.
_TOP_OPTIONS = ("-h", "--help", "-V", "--version")


def _split_leading(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(options, rest)``: the command options typed before the command
    word (``bk --dry-run 1 30m``, ``bk -t 20:00 1 1h``), each with its value,
    and the words from the command on.  Nothing is split off when bk's own
    options stand there (``bk -h``) or nothing does."""
    if not argv or not argv[0].startswith("-") or argv[0] == "--":
        return [], argv
    takes_value = _value_options()
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        if argv[i].split("=", 1)[0] in _TOP_OPTIONS:
            return [], argv
        i += 2 if argv[i] in takes_value and i + 1 < len(argv) else 1
    return argv[:i], argv[i:]


_VALUE_OPTIONS: frozenset[str] | None = None


def _value_options() -> frozenset[str]:
    """Every option of any command that takes a value (``-t``, ``--op-id``):
    read from the whole tree, so it cannot drift from what commands accept.
    Only a command line that opens with an option pays for building it."""
    global _VALUE_OPTIONS
    if _VALUE_OPTIONS is None:
        _VALUE_OPTIONS = frozenset(o for _path, p in _all_parsers() for a in p._actions
                                   if a.option_strings and a.nargs != 0 for o in a.option_strings)
    return _VALUE_OPTIONS


def _all_parsers(parser: argparse.ArgumentParser | None = None, path: tuple[str, ...] = ()):
    """``(command path, parser)`` for every command and sub-command, each
    once (aliases share their parser)."""
    parser = parser or build_parser()
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if sub is None:
        return
    seen: set[int] = set()
    for word, child in sub.choices.items():
        if id(child) in seen:
            continue
        seen.add(id(child))
        yield (*path, word), child
        yield from _all_parsers(child, (*path, word))


def _hoist_options(argv: list[str]) -> list[str]:
    """``bk --dry-run 1 30m`` -> ``bk book 1 30m --dry-run``: command options
    typed before the command word move after its words (before ``--``), where
    the command, or the sub-command they belong to, reads them."""
    lead, rest = _split_leading(argv)
    if not lead or not rest:
        return argv
    rest = _rewrite_shorthand(rest)
    cut = rest.index("--") if "--" in rest else len(rest)
    return rest[:cut] + lead + rest[cut:]


def _misplaced(option: str, command: str | None) -> UsageError:
    """An option typed before a command that does not take it (or before no
    command at all): say which commands do, and that it goes after them."""
    takers = [" ".join(path) for path, p in _all_parsers() if option in p._option_string_actions]
    where = (f"it goes after the command word of: bk {', bk '.join(takers)} "
             f"(e.g. bk {takers[0]} ... {option})" if takers else "no command takes it")
    if command is None:
        return UsageError(f"{option} needs a command", hint=where)
    return UsageError(f"bk {command} takes no {option}", hint=f"{where}; see: bk help {command}")


# Flags whose value may start with "-" (``bk e 1 -d -15m``, ``bk tl --from -2h``).  argparse would
# take "-15m" for an unknown option, so such a value is glued to its flag.
_SIGNED_VALUE_FLAGS = ("-d", "--duration", "--from", "--until")


def _glue_signed_values(argv: list[str]) -> list[str]:
    cut = argv.index("--") if "--" in argv else len(argv)
    out, i = [], 0
    while i < cut:
        a = argv[i]
        if a in _SIGNED_VALUE_FLAGS and i + 1 < cut and argv[i + 1][:2] in [f"-{d}" for d in "0123456789"]:
            out.append(f"{a}={argv[i + 1]}" if a.startswith("--") else f"{a}{argv[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out + argv[cut:]


def guess_command(argv: list[str], parser: argparse.ArgumentParser | None = None) -> str:
    """The command name for an envelope, even when parsing fails: the
    canonical name of the first word (``d`` -> ``cancel``) when known."""
    word = next((a for a in argv if not a.startswith("-")), None)
    if word is None:
        return "bk"
    if parser is not None:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is not None and word in sub.choices:
            return sub.choices[word].get_default("command") or word
    return word


def run(argv: list[str], env: dict | None = None, *, opener=None) -> int:
    """Run one command; ``opener(env)`` returns the service (default:
    ``bk.service.open_app``)."""
    env = dict(os.environ) if env is None else env
    setup_streams()
    typed, as_json = _strip_json(argv)
    if typed in (["--version"], ["-V"]):            # bk --json --version, in-process too
        from bk.cli.main import version

        return version(as_json)
    argv = normalise(typed)
    if as_json and _asks_help(argv):
        argv = typed = ["help", *_help_path(argv)]     # -h --json: help as an envelope
    command = guess_command(argv)
    ctx = args = None
    try:
        parser = build_parser(_first_word(argv))
        command = guess_command(argv, parser)
        try:
            args = parse_argv(typed, parser)
        except SystemExit as e:        # -h/--help and --version print and "exit"
            return _flushed(int(e.code or 0))
        except _HelpLost as lost:
            from bk.cli.render import output_failed

            return output_failed(lost.exc)
        ctx = Context(env=env, json=as_json, argv=argv, term=Term.detect(env=env),
                      stdin_tty=_stdin_is_tty(), opener=opener)
        if getattr(args, "handler", None) is None:
            if argv:
                raise UsageError("no command given", hint="try: bk help, or bk 1 30m to book one GPU")
            return _bare(ctx)
        command = args.command
        return finish(args, ctx)
    except (Exception, KeyboardInterrupt) as exc:   # the one broad catch of this front end
        return failure(exc, command=command, args=args, ctx=ctx, as_json=as_json, env=env,
                       agent=_first_word(argv) == "agent")


def _asks_help(argv: list[str]) -> bool:
    head = argv[: argv.index("--")] if "--" in argv else argv
    return "-h" in head or "--help" in head


def _help_path(argv: list[str]) -> list[str]:
    """The command words before ``-h`` (``bk p save -h`` -> ``p save``)."""
    path, node = [], build_parser(_first_word(argv))
    for word in argv:
        if word in ("-h", "--help"):
            break
        sub = next((a for a in node._actions if isinstance(a, argparse._SubParsersAction)), None)
        if word.startswith("-") or sub is None or word not in sub.choices:
            if not word.startswith("-"):
                break
            continue
        path.append(word)
        node = sub.choices[word]
    return path


def _flushed(code: int) -> int:
    """``code``, once what argparse printed has reached stdout (or 74)."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except BrokenPipeError:
        from bk.cli.main import closed_pipe

        return closed_pipe()
    except (OSError, ValueError) as exc:
        from bk.cli.render import output_failed

        return output_failed(exc)
    return code


def _first_word(argv: list[str]) -> str | None:
    """The command word, which decides the one group whose parser is built;
    None (every group) when bk's own options come first (``bk -h l`` is the
    help of all of bk, which must list every command)."""
    if argv and argv[0] in _TOP_OPTIONS:
        return None
    return next((a for a in argv if not a.startswith("-")), None)


def normalise(argv: list[str]) -> list[str]:
    """The rewrites every command line gets: ``bk 1 30m`` -> ``bk book 1 30m``,
    ``bk -q 1 30m`` -> ``bk book 1 30m -q`` and ``-d -15m`` -> ``-d-15m``.
    Idempotent."""
    return _glue_signed_values(_rewrite_shorthand(_hoist_options(argv)))


def parse_argv(argv: list[str], parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """One command's words (``--json`` already taken out) -> its namespace,
    exactly as ``bk`` itself reads them.  The prompt and the guided flows
    use this so a command typed there means what it means in a shell.
    Raises UsageError; ``-h`` raises SystemExit after printing help."""
    lead, _rest = _split_leading(argv)
    argv = normalise(argv)
    argv, attached = _split_attached(argv)
    parser = parser or build_parser(_first_word(argv))
    args, extra = parser.parse_known_args(argv)
    hoisted = {a.split("=", 1)[0] for a in lead if a.startswith("-")}
    stray = next((a.split("=", 1)[0] for a in extra if a.split("=", 1)[0] in hoisted), None)
    if stray is not None:
        raise _misplaced(stray, _command_path(args, parser))
    _take_extra_words(args, extra, _command_path(args, parser))
    _attach(args, attached)
    return args


def _split_attached(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``bk 2 1h -g 0 -- python3 train.py --lr 3e-4``: the words after the
    first ``--`` are a command to run, never bk's own (argparse would take
    them for positionals, or its options for bk's)."""
    if "--" not in argv:
        return argv, None
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def _attach(args, attached: list[str] | None) -> None:
    """The command after ``--`` to the commands that run one (``takes_command``)."""
    if attached is None:
        return
    if not getattr(args, "takes_command", False):
        cmd = getattr(args, "command", None)
        raise UsageError(f"bk {cmd or ''} takes no command after --".replace("  ", " "),
                         hint="to run a command on GPUs: bk run N DUR -- CMD, or bk run -- CMD "
                              "on a booking that has started")
    args.attached = attached


def _command_path(args, parser) -> str | None:
    """The command the words named (``preset save``), as typed in help."""
    path, node = [], parser
    while True:
        sub = next((a for a in node._actions if isinstance(a, argparse._SubParsersAction)), None)
        word = getattr(args, sub.dest, None) if sub is not None else None
        if word is None or word not in sub.choices:
            return " ".join(path) or None
        path.append(word)
        node = sub.choices[word]


def _take_extra_words(args, extra: list[str], path: str | None) -> None:
    """argparse gives a positional list only the words before the first
    option, so ``bk 2 -d 1h 12g`` leaves ``12g`` over.  Commands that take
    free words (``words`` in their namespace) get the leftovers in order;
    anything else left over is a usage error, as with parse_args."""
    if not extra:
        return
    if isinstance(getattr(args, "words", None), list) and not any(
            a.startswith("-") and a != "-" for a in extra):
        args.words.extend(extra)
        return
    # The words typed (``agent operation``), not the command's name in the
    # envelope (``operation``), which help may not know.
    raise UsageError(f"unrecognized arguments: {' '.join(extra)}",
                     hint=f"see: bk help {path}" if path else "see: bk help")


def _stdin_is_tty() -> bool:
    return stdin_is_tty()           # a seam: tests put a person at the terminal


def _bare(ctx: Context) -> int:
    """``bk`` alone: the interactive prompt at a terminal; otherwise (a
    pipe, --json, or no prompt module) the status view and a hint."""
    import importlib.util

    if ctx.interactive and importlib.util.find_spec("bk.cli.prompt") is not None:
        from bk.cli.prompt import run_prompt

        return run_prompt(ctx)
    from bk.cli.cmd_status import status_output

    out = status_output(ctx, verbose=False)
    out.warnings = merge(warnings_of(ctx), out.warnings)
    if not ctx.json:
        human = out.human

        def with_hint(term: Term) -> str:
            text = human(term) if callable(human) else (human or "")
            return text.rstrip("\n") + "\n\nbook with: bk N DUR (e.g. bk 1 30m) · help: bk help · bk tutorial"
        out.human = with_hint
    return emit(out, ctx.json, ctx.term)
