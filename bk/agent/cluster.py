"""The cluster tools of ``bk mcp`` and ``bk agent``: context, recommend and
create on the best node, over ``bk.cluster``'s client.  ``bk.agent.surface``
composes them with the built-in tools by a plain import; ``tools`` returns
none when there is no catalog, so they appear only where cluster mode is
set up.

Arguments follow the agent surface: durations in seconds or as a person
writes them (``30m``), memory in MiB per GPU or ``12g``, times in epoch
seconds (UTC) or ``tomorrow 09:00`` (this machine's zone), read with the
CLI's grammar on one-minute slices (each node checks its own); ``cluster_create`` takes an
``operation_id`` and repeats as the CLI's ``bk c N DUR --op-id`` does (the
op-id goes to the chosen node; a lost reply is looked up there first).
"""

from __future__ import annotations

import os

from bk.core.errors import InvalidInput


def _or_words(schema: dict, words: str) -> dict:
    return {"anyOf": [schema, {"type": "string", "minLength": 1, "maxLength": 200}],
            "description": f"{schema.pop('description')}, or as a person writes it: {words}"}


_REQUEST = {
    "count": {"type": "integer", "minimum": 1, "description": "number of GPUs"},
    "duration": _or_words({"type": "integer", "minimum": 60, "description": "length in seconds"},
                          "30m, 2h, 1h30m"),
    "mem_mib": _or_words({"type": "integer", "minimum": 1, "description": "expected VRAM per GPU, MiB"},
                         "12g, 512m"),
    "start": _or_words({"type": "integer", "description": "earliest start, epoch seconds (default now)"},
                       "now, +2h, 20:00, tomorrow 09:00, 2026-07-13T18:00Z"),
    "exclusive": {"type": "boolean", "description": "whole GPUs (default shared)"},
}


def _request(args: dict, call) -> dict:
    """The ``recommend`` row's fields every node is asked, from the
    arguments: numbers, or words read with the CLI's grammar (one-minute
    slices; the duration and start go as words, which each node reads on
    its own grid)."""
    from bk.core import timegrid

    count, duration = args.get("count"), args.get("duration")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise InvalidInput("count must be a whole number of GPUs, at least 1")
    if isinstance(duration, str):
        duration = timegrid.parse_duration(duration, 1)
    if not isinstance(duration, int) or isinstance(duration, bool) or duration < 60:
        raise InvalidInput("duration must be whole seconds, at least 60", hint="or as words: 30m, 1h30m")
    mem = args.get("mem_mib")
    if isinstance(mem, str):
        mem = timegrid.parse_memory(mem)
    if mem is not None and (not isinstance(mem, int) or isinstance(mem, bool) or mem < 1):
        raise InvalidInput("mem_mib must be a whole number of MiB", hint="or as words: 12g")
    start = args.get("start")
    if isinstance(start, str):
        start = timegrid.parse_start(start, call.now, call.tz, 1).t
    if start is not None and (not isinstance(start, int) or isinstance(start, bool)):
        raise InvalidInput("start must be epoch seconds", hint="or as words: tomorrow 09:00")
    fields = {"count": count, "duration": f"{-(-duration // 60)}m",
              "mode": "exclusive" if args.get("exclusive") else "shared", "limit": 1}
    if mem is not None:
        fields["mem_mib"] = mem
    if start is not None:
        from bk.core.utctime import format_utc

        fields["start"] = format_utc(start)
    return fields


def _cluster():
    from bk.cluster import catalog
    from bk.cluster.client import Cluster

    env = dict(os.environ)
    return Cluster(catalog.load(env), env=env)


def _context(tool, app, args, call):
    return _cluster().overview()


def _recommend(tool, app, args, call):
    return _cluster().recommend(_request(args, call))


def _create(tool, app, args, call):
    from bk.cluster.client import booking_request

    op_id = args.get("operation_id")
    if not isinstance(op_id, str) or not op_id:
        raise InvalidInput("operation_id is required: retry with the same one after an error or a timeout")
    req = _request(args, call)
    note = args.get("note")
    return _cluster().book(req, lambda option: booking_request(req, option, exact=False, note=note), op_id=op_id)


def _schema(props: dict, required: tuple) -> dict:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}


def _out(props: dict, required: tuple) -> dict:
    return {"type": "object", "properties": props, "required": list(required)}


_NODES = {"type": "array", "items": {"type": "object"}, "description": "one entry per node of the catalog"}
_OVERVIEW = _out({"nodes": _NODES, "reservations": {"type": "array", "items": {"type": "object"}},
                  "complete": {"type": "boolean", "description": "every node answered"}},
                 ("nodes", "reservations", "complete"))
_RECOMMENDED = _out({"best": {"type": ["object", "null"], "description": "the node and option to book"},
                     "nodes": _NODES}, ("best", "nodes"))
_BOOKED = _out({"node": {"type": ["string", "null"]}, "op_id": {"type": ["string", "null"]},
                "dry_run": {"type": "boolean"}, "recovered": {"type": "boolean"}, "retried": {"type": "boolean"},
                "status": {"type": ["string", "null"]}, "reservation": {"type": ["object", "null"]},
                "recommendation": _RECOMMENDED}, ("node", "status", "reservation", "recommendation"))


def tools(app) -> list:
    """The cluster tools, or none without a catalog."""
    from bk.agent.surface import AgentTool
    from bk.cluster import catalog

    if not catalog.exists(dict(os.environ)):
        return []
    return [
        AgentTool("cluster_context", "every cluster node's state and bookings (several servers over SSH)",
                  _schema({}, ()), True, False, True, _context, output=_OVERVIEW),
        AgentTool("cluster_recommend", "the earliest fitting start on every cluster node, and the best node "
                  "(earliest start, then the catalog's priority)", _schema(_REQUEST, ("count", "duration")),
                  True, False, True, _recommend, output=_RECOMMENDED),
        AgentTool("cluster_create", "book on the single best cluster node; give an operation_id and retry "
                  "with the same one after an error or a timeout (it books once)",
                  _schema({**_REQUEST, "note": {"type": "string", "description": "a note others see"},
                           "operation_id": {"type": "string", "description": "idempotency key"}},
                          ("count", "duration", "operation_id")),
                  False, False, True, _create, output=_BOOKED),
    ]
