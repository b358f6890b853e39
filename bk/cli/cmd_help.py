"""``bk help [COMMAND [SUB-COMMAND ...]]``: the help of the whole tool, of one
command, or of a sub-command (``bk help preset save``, ``bk help admin notice
publish``): the words walk down the argparse tree as they would on a command
line, aliases included."""

from __future__ import annotations

import argparse

from bk.cli.render import Output
from bk.core.errors import UsageError


def register(sub) -> None:
    p = sub.add_parser("help", help="show help for bk, one command or a sub-command",
                       description="Show help for bk, for one command, or for a sub-command "
                                   "(the words as you would type them).",
                       epilog="Examples:\n  bk help\n  bk help book\n  bk help preset save\n"
                              "  bk help admin notice publish",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("topic", nargs="*", metavar="COMMAND", help="the command (and sub-command) to explain")
    p.set_defaults(handler=run, command="help")


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def run(args, ctx) -> Output:
    from bk.cli.app import build_parser

    topic = list(args.topic or [])
    node = build_parser()
    commands = sorted(_subcommands(node).choices)
    path: list[str] = []
    for word in topic:
        sub = _subcommands(node)
        if sub is None or word not in sub.choices:
            where = f"bk {' '.join(path)}" if path else "bk"
            names = sorted(sub.choices) if sub is not None else []
            if not names:
                raise UsageError(f"{where} has no sub-command {word!r}", hint=f"see: bk help {' '.join(path)}")
            what = "command" if not path else f"sub-command of {where}"
            raise UsageError(f"no {what} named {word!r}",
                             hint=("commands: " if not path else "sub-commands: ") + ", ".join(names))
        node = sub.choices[word]
        path.append(word)
    text = node.format_help()
    return Output("help", {"topic": " ".join(path) or None, "path": path, "text": text,
                           "commands": commands}, text)
