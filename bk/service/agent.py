"""The agent surface: the operations a program (a coding agent, ``bk mcp``,
``bk agent``) may ask for, derived from the operation table.

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

Decisions: a tool's result is the ``gpubk.v1`` envelope (``bk --json``'s,
the broker's), with the tool's name as ``command``; ``create`` is the
``book`` row with ``op_id`` spelled ``operation_id`` (a retry with the same
id answers ``exists`` with the first booking and changes nothing);
``edit``/``cancel`` take a list number, an ID prefix or a full ID, resolved
as every front end resolves it (an op-id retry names the booking the first
call changed).  ``cleanup`` cancels the caller's current and upcoming
bookings made with an op-id prefix (an agent's session tag), in one commit.

Extending: ``TOOL_PROVIDERS`` names functions ``(app) -> [AgentTool]`` that
add tools when they apply (the cluster tools, when a catalog exists);
``register_provider`` adds one in-process.
"""

from __future__ import annotations

from collections.abc import Callable

from bk.core.errors import InvalidInput
from bk.core.models import Reservation
from bk.core.record import dataclass, field, replace
from bk.service.fields import Field
from bk.service.results import _malformed, _Rendered
from bk.service.specs import OP_ID, OP_ID_HELP

SCHEMA = "gpubk.agent.v1"        # the version of this surface (tool names, arguments), in context


# ------------------------------------------------------------ request types

@dataclass(frozen=True)
class CleanupRequest:
    op_id_prefix: str | None = None
    all: bool = False
    dry_run: bool = False


CLEANUP_FIELDS = (Field("op_id_prefix", "text", min_len=1, max_len=128, pattern=OP_ID,
                        help="cancel your current and upcoming bookings whose op-id starts with this; "
                        + OP_ID_HELP),
                  Field("all", "bool", help="cancel all your current and upcoming bookings"),
                  Field("dry_run", "bool", help="show what would be cancelled; change nothing"))


def check_cleanup(req: CleanupRequest) -> None:
    if (req.op_id_prefix is None) == (not req.all):
        raise InvalidInput("cleanup takes either op_id_prefix or all: true (not both, not neither)",
                           hint='e.g. {"op_id_prefix": "agent-run-7-"}')


# ------------------------------------------------------------ results

@dataclass(frozen=True)
class Data(_Rendered):
    """A local read's result: its JSON, made by the serve function with the
    call's view (nothing to re-render)."""

    json: dict | None = field(default=None, compare=False)

    def rendered(self, view) -> Data:
        return self


@dataclass(frozen=True)
class CleanupResult(_Rendered):
    status: str                          # cancelled | nothing | dry_run
    cancelled: tuple = ()                # Reservations, as cancelled
    dry_run: bool = False
    json: dict | None = field(default=None, compare=False)

    def rendered(self, view) -> CleanupResult:
        return replace(self, json={"status": self.status, "dry_run": self.dry_run,
                                   "reservations": [view.reservation(r) for r in self.cancelled],
                                   "count": len(self.cancelled)})

    def to_wire(self) -> dict:
        return {**self.to_json(), "records": [r.to_dict() for r in self.cancelled]}

    @classmethod
    def from_wire(cls, data: dict) -> CleanupResult:
        try:
            recs = tuple(Reservation.from_dict(r) for r in data["records"])
            return cls(str(data["status"]), recs, bool(data.get("dry_run")),
                       {k: v for k, v in data.items() if k != "records"})
        except (KeyError, TypeError, ValueError) as e:
            raise _malformed("cleanup result", e) from None


# ------------------------------------------------------------ the rows' work

def apply_cleanup(state, req: CleanupRequest, call):
    """Cancel the caller's live bookings that match, in this one transaction;
    a retry finds nothing left to cancel (``nothing``), so it is idempotent."""
    from bk.service import booking
    from bk.service.requests import CancelRequest
    from bk.store.ledger import Mutation

    uid, now = call.actor.uid, call.now
    hits = [r for r in state.reservations if r.uid == uid and r.is_live(now)
            and (req.all or (r.op_id or "").startswith(req.op_id_prefix or "\0"))]
    done, audit, changed = [], [], False
    for r in hits:
        m = booking.apply_cancel(state, CancelRequest(r.id, dry_run=req.dry_run), call)
        done.append(m.result.reservation)
        audit.extend(m.audit)
        changed = changed or m.changed
    status = "nothing" if not hits else "dry_run" if req.dry_run else "cancelled"
    return Mutation(changed, audit, CleanupResult(status, tuple(done), req.dry_run))


def _recommend(tool, app, arguments, call) -> Data:
    """The ``recommend`` row, and whether one of its options starts now."""
    rec = _run_row(tool, app, arguments, call)
    return Data({**rec.to_json(), "free_now": any(not p.queued and p.start <= call.now for p in rec.options)})


def _context(tool, app, arguments, call) -> Data:
    """The ``context`` row, with what an agent may call and in which units."""
    data = _run_row(tool, app, arguments, call).to_json()
    return Data({"agent_schema": SCHEMA, **data, "tools": [t.name for t in tools(app)],
                 "units": "times: ISO-8601 UTC in results, epoch seconds (UTC) in arguments; durations: "
                          "seconds; memory: MiB per GPU"})


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

    @classmethod
    def from_row(cls, name: str, row: str, *, summary: str | None = None, hide: tuple = (),
                 renames: tuple = (), run: Callable | None = None, notes: tuple = (),
                 extra: tuple = ()) -> AgentTool:
        """The tool for ``row``: its schema less ``hide``, with ``renames``
        ((argument, field)) and ``notes`` ((field, description)) applied,
        plus ``extra`` ((argument, schema)) that its ``run`` takes itself."""
        from bk.service import ops

        op = ops.get(row)
        schema = op.schema()
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
        return cls(name, summary or op.summary, out, op.access == ops.READ, op.destructive, op.idempotent,
                   run or _run_row, row, tuple(renames))

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


def _run_row(tool: AgentTool, app, arguments, call):
    from bk.service import ops

    op = ops.get(tool.row)
    return perform(app, op, _decode(tool, op, tool.request_fields(arguments)), call)


def perform(app, op, req, call):
    """Run a row for this process's caller: a local read here (what the
    caller may read anyway), anything else through the service's gateway
    (this host's store, or the broker)."""
    return app.run(op.name, req, call=call)


def _resolved(tool: AgentTool, app, arguments, call, action: str):
    """``edit``/``cancel``: ``ref`` may be a list number or an ID prefix; an
    op-id that already did this names the booking it did it to."""
    from bk.service import ops

    op = ops.get(tool.row)
    wire = tool.request_fields(arguments)
    ref = wire.get("ref")
    if not isinstance(ref, str):
        return perform(app, op, _decode(tool, op, wire), call)      # the decode says what is wrong
    from bk.service import ResolveRequest
    from bk.service.fields import check_text

    op_id = wire.get("op_id")
    check_text(ref, "field 'ref'", max_len=64, min_len=1)
    earlier = app.run("resolve", ResolveRequest(ref, op_id if isinstance(op_id, str) else None, action),
                      call=call).reservation
    return perform(app, op, _decode(tool, op, {**wire, "ref": earlier.id}), call)


MAX_ARGV, MAX_ARG = 256, 4096
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

    from bk.service import ops

    op = ops.get(tool.row)
    wire = tool.request_fields(arguments)
    argv, cwd = wire.pop("command", None), wire.pop("cwd", None)
    req = _decode(tool, op, wire)
    if argv is None:
        if cwd is not None:
            raise InvalidInput("argument 'cwd' goes with 'command'")
        return perform(app, op, req, call)
    if not isinstance(argv, list) or not 1 <= len(argv) <= MAX_ARGV or not all(
            isinstance(a, str) and len(a) <= MAX_ARG and "\0" not in a and _encodable(a) for a in argv):
        raise InvalidInput(f"argument 'command' must be a list of 1-{MAX_ARGV} strings (the program and its "
                           f"arguments, at most {MAX_ARG} characters each, no NUL)",
                           hint='e.g. ["python3", "train.py", "--lr", "3e-4"]')
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
            "state, your bookings and the time: call this first"),
        row("recommend", "recommend", run=_recommend),
        row("create", "book", hide=_JOB_FIELDS, renames=(("operation_id", "op_id"),), extra=_COMMAND,
            run=_create, summary="book GPUs, shared or exclusive, now or later, optionally with a command "
            "to run on them; give operation_id so that a retry returns the first result and books "
            "nothing more"),
        row("list", "list"),
        row("edit", "edit", renames=(("operation_id", "op_id"),), run=_edit, notes=_REF,
            summary="change one of your bookings (ref: list number, ID prefix or full ID); times are "
            "epoch seconds"),
        row("cancel", "cancel", renames=(("operation_id", "op_id"),), run=_cancel, notes=_REF,
            summary="cancel one of your bookings (ref: list number, ID prefix or full ID); an active one "
            "ends now"),
        row("usage", "usage"),
        row("job_log", "job_log", hide=("all",)),
        row("cleanup", "cleanup"),
    ]


# Functions ``(app) -> list[AgentTool]`` named "module:function", imported
# when tools are listed.  CLUSTER: add "bk.cluster.agent:tools" here; return
# [] when no catalog exists, so the cluster tools appear only with one.
TOOL_PROVIDERS: list[str] = ["bk.cluster.agent:tools"]
_PROVIDERS: list[Callable] = []


def register_provider(fn: Callable) -> None:
    """Add a function ``(app) -> [AgentTool]`` whose tools join the table."""
    if fn not in _PROVIDERS:
        _PROVIDERS.append(fn)


def tools(app) -> list[AgentTool]:
    """The built-in tools, then each provider's (a provider that fails with
    a ``BkError`` adds none; its own tools report such errors when called)."""
    import importlib

    from bk.core.errors import BkError

    out = builtin_tools()
    providers = list(_PROVIDERS)
    for name in TOOL_PROVIDERS:
        mod, _, fn = name.partition(":")
        try:
            providers.append(getattr(importlib.import_module(mod), fn))
        except (ImportError, AttributeError):
            continue
    names = {t.name for t in out}
    for provider in providers:
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
            "destructive": tool.destructive, "idempotent": tool.idempotent, "input_schema": tool.schema}


def server_version() -> str:
    from bk import __version__

    return __version__
