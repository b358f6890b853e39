"""``bk help [COMMAND]``: the help of the whole tool or of one command."""

from __future__ import annotations

import argparse

from bk.cli.render import Output
from bk.core.errors import UsageError


def register(sub) -> None:
    p = sub.add_parser("help", help="show help for bk or for one command",
                       description="Show help for bk or for one command.",
                       epilog="Examples:\n  bk help\n  bk help book",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("topic", nargs="?", metavar="COMMAND", help="the command to explain")
    p.set_defaults(handler=run, command="help")


def run(args, ctx) -> Output:
    from bk.cli.app import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands = sorted({name for name in sub.choices})
    if args.topic is None:
        text = parser.format_help()
    elif args.topic in sub.choices:
        text = sub.choices[args.topic].format_help()
    else:
        raise UsageError(f"no command named {args.topic!r}",
                         hint="commands: " + ", ".join(commands))
    return Output("help", {"topic": args.topic, "text": text, "commands": commands}, text)
