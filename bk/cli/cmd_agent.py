"""``bk agent``: the agent surface (``bk.agent``) as one command, for
programs that would rather run a process than speak MCP.

Each sub-command takes the same JSON object the MCP tool of that name
takes, and prints the same ``gpubk.v1`` envelope, compact, on one line on
stdout, failures included, usage errors too (with --json too; the exit
status is the error's).
"""

from __future__ import annotations

import argparse
import json
import sys

from bk.cli.render import Output
from bk.core.errors import InvalidInput

MAX_ARGUMENTS = 1 << 20

EPILOG = """Each sub-command takes its arguments as one JSON object (a word, or - to
read it from stdin), exactly as the MCP tool of that name takes them, and
prints one gpubk.v1 envelope on one line: {"schema": "gpubk.v1", "command":
TOOL, "ok": true, "data": {...}, "warnings": [...]}, or "ok": false with
"error": {code, message, hint}; the exit status is the error's (bk help).
Times in arguments are epoch seconds (UTC) or as you would type them to bk
(now, +2h, 20:00, tomorrow 09:00, 2026-07-13T18:00Z), durations seconds or
30m, 1h30m, memory MiB or 12g.

Examples:
  bk agent context
  bk agent recommend '{"count": 2, "duration": 7200}'
  bk agent recommend '{"count": 1, "duration": "30m", "start": "tomorrow 09:00"}'
  bk agent operation create '{"count": 1, "duration": 3600, "operation_id": "run-7"}'
  bk agent edit '{"ref": "1", "duration": 10800, "operation_id": "run-7-extend"}'
  bk agent cancel '{"ref": "1", "operation_id": "run-7-cancel"}'
  bk agent operation          every operation, its hints and its input schema
  echo '{"scope": "all"}' | bk agent operation list -
"""


def register(sub) -> None:
    p = sub.add_parser("agent", help="compact JSON for programs: context, recommend, edit, cancel, operation",
                       description="The agent operations (the tools of bk mcp) for programs: JSON "
                       "arguments in, one JSON envelope out.", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="agent_action", metavar="ACTION", required=True)
    for name, text in (("context", "who you are, the rules, the GPUs, your bookings, the time"),
                       ("recommend", "when and where GPUs are free (books nothing)"),
                       ("edit", "change one of your bookings"), ("cancel", "cancel one of your bookings")):
        a = actions.add_parser(name, help=text, description=f"The {name} operation: {text}.",
                               epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
        a.add_argument("arguments", nargs="?", metavar="JSON", help="the arguments object, or - for stdin")
        a.set_defaults(handler=run, command=name, tool=name)
    o = actions.add_parser("operation", help="list the operations, or run one by name",
                           description="Without NAME: every operation with its hints and input schema. "
                           "With NAME: run it with the JSON arguments.", epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    o.add_argument("tool", nargs="?", metavar="NAME", help="the operation (bk agent operation lists them)")
    o.add_argument("arguments", nargs="?", metavar="JSON", help="the arguments object, or - for stdin")
    o.set_defaults(handler=run, command="operation")


def _arguments(text: str | None) -> dict:
    if text is None:
        return {}
    if text == "-":
        text = sys.stdin.read(MAX_ARGUMENTS + 1)
    if len(text) > MAX_ARGUMENTS:
        raise InvalidInput(f"the arguments are too long (at most {MAX_ARGUMENTS} characters)")
    try:
        value = json.loads(text)
    except ValueError as e:
        raise InvalidInput(f"the arguments are not JSON: {e}", hint='e.g. \'{"count": 1, "duration": 3600}\'') \
            from None
    if not isinstance(value, dict):
        raise InvalidInput("the arguments must be a JSON object", hint='e.g. \'{"ref": "1"}\'')
    return value


def _line(envelope: dict) -> str:
    return json.dumps(envelope, separators=(",", ":"), ensure_ascii=False)


def run(args, ctx) -> Output:
    from bk import agent
    from bk.core.envelope import success

    app = ctx.app()
    name = args.tool
    if name is None:                       # bk agent operation: the table
        listed = [agent.describe(t) for t in agent.tools(app)]
        data = {"agent_schema": agent.SCHEMA, "operations": listed}
        return Output("operation", data, lambda term: _line(success("operation", data)))
    call = ctx.call()
    tool = agent.find(app, name)
    if tool is None:
        raise InvalidInput(f"unknown operation {name[:40]!r}",
                           hint="operations: " + ", ".join(t.name for t in agent.tools(app)))
    args.command = tool.name          # a failure's envelope names the tool, --json or not (bk.cli.app)
    data = agent.invoke(app, tool, _arguments(args.arguments), call).to_json()
    return Output(name, data, lambda term: _line(success(name, data, list(call.warnings))),
                  done=_done(tool, data))


def failure_output(command: str, err, warnings: list[str]) -> Output:
    """A failure of ``bk agent`` without --json, usage errors included: the
    same one-line envelope on stdout as a success (``bk.cli.app.run``)."""
    from bk.core.envelope import failure

    return Output(command, {}, _line(failure(command, err, warnings)), exit_code=err.exit_code)


def _done(tool, data: dict) -> str | None:
    """A write's own words for when its envelope cannot be written (stdout
    full or closed): the booking it made, changed or cancelled, so that the
    caller can find it without the envelope."""
    if tool.read_only or data.get("dry_run") or data.get("status") == "dry_run":
        return None
    status = str(data.get("status") or "done")
    where = f" on {data['node']}" if isinstance(data.get("node"), str) else ""
    res = data.get("reservation")
    if isinstance(res, dict) and res.get("short_id"):
        return f"{tool.name}: {status} booking {res['short_id']}{where}"
    rows = data.get("reservations")
    ids = [r.get("short_id") for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
    if ids:
        noun = "booking" if len(ids) == 1 else "bookings"
        return f"{tool.name}: {status} {noun} {', '.join(map(str, ids))}{where}"
    return f"{tool.name}: {status}"
