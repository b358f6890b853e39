"""The node's half of the wire: one row of the operation table, run here for
a cluster client (``bk c node --row NAME --fields JSON``, docs/CLUSTER.md).

The fields are the row's request in its wire form, decoded with the row's
own spec; the words a person writes in them (``"30m"``, ``"+2h"``) are read
here, on this node's clock, zone and slot grid, as its own CLI reads them
(``builders.worded``).  Two kinds of row need this node to finish the request
before it runs, as its own ``bk e``/``bk d``/``bk N DUR -- CMD`` would:

* ``edit`` and ``cancel``: the client names the booking as a person does
  (a list number or an ID prefix: ``bk c e gpu-a/3f2a``), and only this node
  knows which booking that is; ``builders.resolved`` names it with the
  ``resolve`` row (a retried op-id names the booking it changed) and reads
  an edit's ``-d +30m`` against it.
* ``book_job``: a booking with a command (``bk c N DUR -- CMD``).  On the
  wire it is the ``book`` row's fields plus ``command`` (the program and its
  arguments); the working directory and ``PATH`` are this node's (the
  process ssh started for the caller), as they were for the command typed
  here.  The command goes into the caller's private job spec on this node
  and the ledger gets only its digest and summary (``book_job``'s own
  handling), so it stays private to its owner here too.

The reply is one envelope: the row's ``to_json()`` and every warning the
call gathered (a worker that does not run for you), or its refusal.
"""

from __future__ import annotations

from collections.abc import Callable

from bk.core.errors import BkError, InvalidInput

# The rows a client may ask a node for: the everyday reads and writes of
# the caller's own bookings.
NODE_ROWS = frozenset(("list", "status", "recommend", "gpu", "worker_status", "jobs", "op_lookup", "resolve",
                       "history", "notices", "usage", "book", "book_job", "edit", "cancel"))

# What the node makes itself for a booking with a command: a client may not name them.
_NODE_JOB_FIELDS = ("job_id", "job_digest", "job_summary")


def row_reply(app, make_call: Callable[[], object], name: str, fields: str, *, cwd: Callable[[], str],
              env: dict) -> dict:
    """Row ``name`` run here with ``fields`` (JSON text): the envelope of its
    wire JSON, or of its refusal (one that comes while the call is made
    too).  ``cwd`` and ``env`` are this process's (a ``book_job``'s command
    is checked and kept with them)."""
    import json

    from bk.core import envelope

    call = None
    try:
        op = _served(name)
        try:
            wire = json.loads(fields)
        except ValueError as e:
            raise InvalidInput(f"the fields of {name} are not JSON: {e}") from None
        if not isinstance(wire, dict):
            raise InvalidInput(f"the fields of {name} must be a JSON object")
        call = make_call()
        result = app.run(name, _request(app, op, wire, call, cwd=cwd, env=env), call=call)
        warnings = [*call.warnings, *(getattr(result, "warnings", None) or ())]
        return envelope.success(name, result.to_json(), list(dict.fromkeys(warnings)))
    except BkError as e:
        return envelope.failure(name, e, list(call.warnings) if call is not None else [])


def _served(name: str):
    from bk import service

    op = service.OPERATIONS.get(name) if name in NODE_ROWS else None
    if op is None:
        raise InvalidInput(f"this node does not serve the row {name[:40]!r} for a client",
                           hint="rows: " + ", ".join(sorted(NODE_ROWS)), details={"row": name[:40]})
    return op


def _request(app, op, wire: dict, call, *, cwd: Callable[[], str], env: dict):
    from bk.service import builders

    if op.name in ("edit", "cancel"):
        return builders.resolved(app, op, wire, call)
    if op.name == "book_job":
        return _job(wire, call, cwd=cwd, env=env)
    return op.decode(builders.worded(op, wire, call))


def _job(wire: dict, call, *, cwd: Callable[[], str], env: dict):
    """The ``book_job`` request: the booking decoded with the ``book`` row's
    spec, the command checked as the agent's is, this node's directory and
    environment."""
    from bk import service
    from bk.service import BookJobRequest, builders

    wire = dict(wire)
    if "command" not in wire:
        raise InvalidInput("book_job takes a command: the field 'command', the program and its arguments",
                           hint='e.g. {"count": 1, "duration": "2h", "command": ["python3", "train.py"]}')
    argv = builders.command(wire.pop("command"), "field 'command'")
    for name in _NODE_JOB_FIELDS:
        if name in wire:
            raise InvalidInput(f"field {name!r} is the node's own: it writes the job spec and names it",
                               hint="send the command only")
    book = service.get("book")
    return BookJobRequest(book.decode(builders.worded(book, wire, call)), argv, cwd(), dict(env))
