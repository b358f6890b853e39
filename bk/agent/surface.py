"""The agent surface's tools: the operations a program (a coding agent,
``bk mcp``, ``bk agent``) may ask for, derived from the operation table.

Facts that shape it:

* An agent speaks JSON objects, never command words.  The one place that
  turns an untrusted JSON object into a typed request is a row's field spec
  (``bk.service.fields``), so every tool's input schema is the row's
  ``schema()`` and every tool call is the row's ``decode``: the broker, MCP
  and ``bk agent`` refuse the same arguments with the same messages.
* Some of what an agent needs is a read anyone may make from the committed
  ledger or their own files (the list, advice, usage, a job's log).  Those
  are rows too (``served=False``), so their schemas and annotations come from
  the same table; they run in the caller's own process, never on the
  broker (the broker's allowlist is the ``served`` rows only).
* The caller is the process: ``open_app`` opens the Service exactly as the
  CLI does (private mode here, a shared server through the broker, which
  names the caller by SO_PEERCRED).  No argument can name a user.
* An agent is asked by a person: "book two GPUs for 30m, tomorrow 09:00".
  A field the spec marks as one a person writes in words (``Field.human``:
  a duration, a start, an edit's new end or length, a usage period, a
  memory figure) takes those words as well as the number, read with the
  CLI's own grammar (``bk.core.timegrid`` through ``bk.service.builders``,
  with this call's clock, zone and slices), so "30m" and 1800 book the same
  and a start off the grid is refused with the CLI's message and hint.  The
  words become the number here, before the row's decode: a broker frame
  still carries only the number.
* Each tool's output schema is the envelope with its own ``data``: the
  row's result type's ``json_schema()``, plus what the tool adds.

Decisions: a tool's result is the ``gpubk.v1`` envelope (``bk --json``'s,
the broker's), with the tool's name as ``command``; ``create`` is the
``book`` row with ``op_id`` spelled ``operation_id`` (a retry with the same
id answers ``exists`` with the first booking and changes nothing);
``edit``/``cancel`` take a list number, an ID prefix or a full ID, resolved
as every front end resolves it (an op-id retry names the booking the first
call changed).  ``cleanup`` cancels the caller's current and upcoming
bookings made with an op-id prefix (an agent's session tag), in one commit.

Extending: the cluster's tools (``bk.agent.cluster``, when a catalog
exists) are composed in ``tools`` by a plain import; ``register_provider``
adds a function ``(app) -> [AgentTool]`` in-process.
"""

from __future__ import annotations

from collections.abc import Callable

from bk.core.errors import InvalidInput
from bk.core.record import dataclass
from bk.service.builders import MAX_ARG, MAX_ARGV

SCHEMA = "gpubk.agent.v1"        # the version of this surface (tool names, arguments), in context


# ------------------------------------------------------------ results

@dataclass(frozen=True)
class Data:
    """A tool's result made here from a row's (the row's JSON and what an
    agent needs besides: the tool names, whether an option starts now)."""

    json: dict

    def to_json(self) -> dict:
        return self.json


UNITS = ("times: ISO-8601 UTC in results; in arguments epoch seconds (UTC) or as a person writes them (now, "
         "+2h, 20:00, tomorrow 09:00, 2026-07-13T18:00Z; the server's zone unless an offset is given); "
         "durations: seconds, or 30m, 1h30m; memory: MiB per GPU, or 12g")


def _recommend(tool, app, arguments, call) -> Data:
    """The ``recommend`` row, and whether one of its options starts now."""
    rec = _run_row(tool, app, arguments, call)
    return Data({**rec.to_json(), "free_now": any(not p.queued and p.start <= call.now for p in rec.options)})


def _context(tool, app, arguments, call) -> Data:
    """The ``context`` row, with what an agent may call and in which units."""
    data = _run_row(tool, app, arguments, call).to_json()
    return Data({"agent_schema": SCHEMA, **data, "tools": [t.name for t in tools(app)], "units": UNITS})


# ------------------------------------------------------------ the tool table

@dataclass(frozen=True)
class AgentTool:
    """One tool: its name, what it does, its JSON input schema, its hints,
    and ``run(tool, app, arguments, call) -> result`` (a rendered result
    with ``to_json``, or a ``BkError``).  ``from_row`` derives all of it
    from an operation row."""

    name: str
    summary: str
    schema: dict
    read_only: bool
    destructive: bool
    idempotent: bool
    run: Callable
    row: str | None = None
    renames: tuple = ()                # (argument name, request field name)
    output: dict | None = None         # the JSON Schema of its result's data (None: any object)

    @classmethod
    def from_row(cls, name: str, row: str, *, summary: str | None = None, hide: tuple = (),
                 renames: tuple = (), run: Callable | None = None, notes: tuple = (),
                 extra: tuple = (), adds: tuple = ()) -> AgentTool:
        """The tool for ``row``: its schema (words a person writes included)
        less ``hide``, with ``renames`` ((argument, field)) and ``notes``
        ((field, description)) applied, plus ``extra`` ((argument, schema))
        that its ``run`` takes itself; its output the row's result type's
        schema, plus ``adds`` ((key, schema)) that its ``run`` adds."""
        from bk import service

        op = service.get(row)
        schema = op.schema(human=True)
        props = dict(schema["properties"])
        for f in hide:
            props.pop(f)
        for f, text in notes:
            props[f] = {**props[f], "description": text}
        for arg, field_name in renames:
            props[arg] = props.pop(field_name)
        props.update(dict(extra))
        required = [next((a for a, f in renames if f == r), r) for r in schema.get("required", ())]
        out = {"type": "object", "properties": props, "additionalProperties": False}
        if required:
            out["required"] = required
        output = op.result.json_schema() if hasattr(op.result, "json_schema") else None
        if adds and output is not None:
            output = {**output, "properties": {**output["properties"], **dict(adds)},
                      "required": [*output.get("required", ()), *(k for k, _ in adds)]}
        return cls(name, summary or op.summary, out, op.access == service.READ, op.destructive, op.idempotent,
                   run or _run_row, row, tuple(renames), output)

    def request_fields(self, arguments: object) -> dict:
        """The row's fields from the tool's arguments (renames undone); an
        argument the tool does not take is refused here, by its own name."""
        if arguments is None:
            return {}
        if not isinstance(arguments, dict):
            raise InvalidInput("the arguments must be a JSON object")
        back = {arg: f for arg, f in self.renames}
        known = set(self.schema["properties"])
        out = {}
        for k, v in arguments.items():
            if k not in known:
                raise InvalidInput(f"unknown argument {str(k)[:40]!r}; {self.name} takes "
                                   + (", ".join(sorted(known)) or "no arguments"))
            out[back.get(k, k)] = v
        return out


def _decode(tool: AgentTool, op, wire: dict):
    """The row's decode, its messages naming the tool's arguments
    (``operation_id``, not the row's ``op_id``)."""
    try:
        return op.decode(wire)
    except InvalidInput as e:
        message = e.message
        for arg, name in tool.renames:
            message = message.replace(f"field {name!r}", f"argument {arg!r}").replace(
                f", {name}", f", {arg}").replace(f" {name},", f" {arg},")
        if message == e.message:
            raise
        raise InvalidInput(message, e.hint, details=e.details) from None


def _worded(tool: AgentTool, op, wire: dict, call, old=None) -> dict:
    """``wire`` with a person's words turned into the row's numbers
    (``bk.service.builders.worded``: a cluster node reads its client's the same way)."""
    from bk.service import builders

    return builders.worded(op, wire, call, old)


def _run_row(tool: AgentTool, app, arguments, call):
    from bk import service

    op = service.get(tool.row)
    return perform(app, op, _decode(tool, op, _worded(tool, op, tool.request_fields(arguments), call)), call)


def perform(app, op, req, call):
    """Run a row for this process's caller: a local read here (what the
    caller may read anyway), anything else through the service's gateway
    (this host's store, or the broker)."""
    return app.run(op.name, req, call=call)


def _resolved(tool: AgentTool, app, arguments, call, action: str):
    """``edit``/``cancel``: ``ref`` may be a list number or an ID prefix; an
    op-id that already did this names the booking it did it to
    (``builders.resolved``, which a cluster node runs for its clients too)."""
    from bk import service
    from bk.service import builders

    op = service.get(tool.row)
    req = builders.resolved(app, op, tool.request_fields(arguments), call,
                            decode=lambda o, w: _decode(tool, o, w))
    return perform(app, op, req, call)


_COMMAND = (("command", {"type": "array", "minItems": 1, "maxItems": MAX_ARGV,
                         "items": {"type": "string", "maxLength": MAX_ARG},
                         "description": "a command to run on the booked GPUs when the booking starts (no "
                         "shell: the program and its arguments); your bk worker starts it"}),
            ("cwd", {"type": "string", "maxLength": MAX_ARG,
                     "description": "the command's working directory, absolute (default: where the "
                     "server was started)"}))


def _create(tool, app, arguments, call):
    """``create``: the book row, with a command attached when asked
    (``bk run N DUR -- CMD``: a private spec, the booking with its digest)."""
    import os

    from bk import service
    from bk.service import builders

    op = service.get(tool.row)
    wire = tool.request_fields(arguments)
    argv, cwd = wire.pop("command", None), wire.pop("cwd", None)
    req = _decode(tool, op, _worded(tool, op, wire, call))
    if argv is None:
        if cwd is not None:
            raise InvalidInput("argument 'cwd' goes with 'command'")
        return perform(app, op, req, call)
    argv = builders.command(argv, "argument 'command'")
    if cwd is None:
        cwd = os.getcwd()
    elif not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd or not _encodable(cwd):
        raise InvalidInput("argument 'cwd' must be an absolute path", hint='e.g. "/home/you/project"')
    from bk.service import BookJobRequest

    return app.run("book_job", BookJobRequest(req, tuple(argv), cwd, dict(os.environ)), call=call)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:       # a lone surrogate
        return False
    return True


def _edit(tool, app, arguments, call):
    return _resolved(tool, app, arguments, call, "edit")


def _cancel(tool, app, arguments, call):
    return _resolved(tool, app, arguments, call, "cancel")


_JOB_FIELDS = ("job_id", "job_digest", "job_summary")
_REF = (("ref", "the booking: its list number (1, 2, ...), an ID prefix of 4+ characters, or its full ID"),)


def builtin_tools() -> list[AgentTool]:
    row = AgentTool.from_row
    return [
        row("context", "context", run=_context, summary="who you are, the rules, every GPU and its live "
            "state, your bookings and the time: call this first",
            adds=(("agent_schema", {"const": SCHEMA}), ("tools", {"type": "array", "items": {"type": "string"}}),
                  ("units", {"type": "string"}))),
        row("recommend", "recommend", run=_recommend,
            adds=(("free_now", {"type": "boolean", "description": "an option starts now"}),)),
        row("create", "book", hide=_JOB_FIELDS, renames=(("operation_id", "op_id"),), extra=_COMMAND,
            run=_create, summary="book GPUs, shared or exclusive, now or later, optionally with a command "
            "to run on them; give operation_id so that a retry returns the first result and books "
            "nothing more"),
        row("list", "list"),
        row("edit", "edit", renames=(("operation_id", "op_id"),), run=_edit, notes=_REF,
            summary="change one of your bookings (ref: list number, ID prefix or full ID); duration as bk e "
            "-d takes it (2h, +30m, 20:00) or seconds, times as a person writes them or epoch seconds"),
        row("cancel", "cancel", renames=(("operation_id", "op_id"),), run=_cancel, notes=_REF,
            summary="cancel one of your bookings (ref: list number, ID prefix or full ID); an active one "
            "ends now"),
        row("usage", "usage"),
        row("job_log", "job_log", hide=("all",)),
        row("cleanup", "cleanup"),
    ]


# Functions ``(app) -> list[AgentTool]`` whose tools join the table
# (``register_provider``); the cluster's are composed in ``tools`` itself.
_PROVIDERS: list[Callable] = []


def register_provider(fn: Callable) -> None:
    """Add a function ``(app) -> [AgentTool]`` whose tools join the table."""
    if fn not in _PROVIDERS:
        _PROVIDERS.append(fn)


def tools(app) -> list[AgentTool]:
    """The built-in tools, the cluster's (when a catalog exists), then each
    provider's (a provider that fails with a ``BkError`` adds none; its own
    tools report such errors when called)."""
    from bk.agent import cluster
    from bk.core.errors import BkError

    out = builtin_tools()
    names = {t.name for t in out}
    for provider in (cluster.tools, *_PROVIDERS):
        try:
            added = provider(app)
        except BkError:      # a broken catalog must not take the built-in tools down with it
            continue
        for t in added:
            if t.name not in names:
                out.append(t)
                names.add(t.name)
    return out


def find(app, name: object) -> AgentTool | None:
    return next((t for t in tools(app) if t.name == name), None) if isinstance(name, str) else None


def call_tool(app, tool: AgentTool, arguments, call) -> dict:
    """The tool's envelope: success with the result's JSON, or the error
    (a ``BkError``) as the failure envelope.  Anything else propagates."""
    from bk.core.envelope import failure, success
    from bk.core.errors import BkError

    try:
        result = invoke(app, tool, arguments, call)
        return success(tool.name, result.to_json(), list(call.warnings))
    except BkError as e:
        return failure(tool.name, e, list(call.warnings))


def invoke(app, tool: AgentTool, arguments, call):
    """Run ``tool``: its result (``to_json``), or a ``BkError``."""
    return tool.run(tool, app, arguments, call)


def describe(tool: AgentTool) -> dict:
    """A tool as ``bk agent operation`` lists it."""
    return {"name": tool.name, "summary": tool.summary, "read_only": tool.read_only,
            "destructive": tool.destructive, "idempotent": tool.idempotent, "input_schema": tool.schema,
            "output_schema": tool.output or {"type": "object"}}


def server_version() -> str:
    from bk import __version__

    return __version__
