"""What a node's reply may hold: every field the client reads, with its type.

A node is another machine: its bk may be older, newer, broken or lying, and
its reply is data from outside.  A well-formed envelope whose reservation
has ``short_id: null``, ``start: "garbage"`` or ``gpus: "0,1"`` used to
reach the views and the best-node rule and end every node's ``bk c`` with a
TypeError (exit 70).  So each reply is checked here against the shape of
the command that was asked, before anything reads it, and a reply that
does not fit is that node's ``bad_reply`` (the message names the field:
``reservations[0].start: expected an ISO-8601 UTC time, got "garbage"``)
while the other nodes go on.

The rules, for each shape below:

* every field the client knows has a type (a string of bounded length, a
  whole number in range, true/false, an ISO-8601 UTC time, a list of GPU
  indices, an object of its own shape); ``req`` fields must be there and
  not null, ``opt`` ones may be absent or null;
* a field the client does not know is dropped, so what ``bk c --json`` and
  the MCP tools pass on is only what was checked;
* a span ends at or after it starts.

What passes is returned as a new dict; the reply itself is not changed.
"""

from __future__ import annotations

import math

MAX_TEXT = 10_000           # characters in one field (a note is at most 200)
MAX_OUTPUT = 8 << 20        # a command's text or stderr, inside the 4 MiB reply bound anyway
MAX_INT = 1 << 36           # as bk.service.fields.MAX_WIRE_INT: epoch seconds, MiB, counts
MAX_GPUS = 4096
MAX_ITEMS = 100_000


class BadField(ValueError):
    """``path`` does not have the type ``want``."""

    def __init__(self, path: str, want: str, got: object):
        self.path, self.want = path, want
        super().__init__(f"{path or 'the reply'}: expected {want}, got {_show(got)}")


def _show(v: object) -> str:
    import json

    try:
        text = json.dumps(v)
    except (TypeError, ValueError):
        text = type(v).__name__
    return text if len(text) <= 40 else text[:37] + "..."


class Type:
    """A check: ``check(value, path)`` returns the value as the client may
    use it, or raises ``BadField``."""

    def __init__(self, want: str, test=None, convert=None):
        self.want, self._test, self._convert = want, test, convert

    def check(self, v: object, path: str):
        if self._convert is not None:
            return self._convert(v, path)
        if not self._test(v):
            raise BadField(path, self.want, v)
        return v


def _is_int(v: object, lo: int, hi: int) -> bool:
    return type(v) is int and lo <= v <= hi


def _iso(v: object, path: str) -> str:
    from bk.core.errors import BkError
    from bk.core.utctime import parse_utc

    want = "an ISO-8601 UTC time"
    if not isinstance(v, str) or len(v) > 64:
        raise BadField(path, want, v)
    try:
        t = parse_utc(v)
    except (ValueError, OverflowError, BkError):
        raise BadField(path, want, v) from None
    if not 0 <= t <= MAX_INT:
        raise BadField(path, want + " between 1970 and 4000", v)
    return v


def text(most: int = MAX_TEXT) -> Type:
    return Type(f"a string of at most {most} characters", lambda v: isinstance(v, str) and len(v) <= most)


TEXT = text()
UINT = Type("a whole number >= 0", lambda v: _is_int(v, 0, MAX_INT))
INT = Type("a whole number", lambda v: _is_int(v, -MAX_INT, MAX_INT))
BOOL = Type("true or false", lambda v: isinstance(v, bool))
NUM = Type("a number", lambda v: type(v) in (int, float) and math.isfinite(v) and abs(v) <= MAX_INT)
ISO = Type("an ISO-8601 UTC time", convert=_iso)
GPUS = Type("a list of distinct GPU indices", lambda v: isinstance(v, list) and len(v) <= MAX_GPUS and all(
    _is_int(g, 0, MAX_GPUS - 1) for g in v) and len(set(v)) == len(v))
TEXT_MAP = Type("an object of strings", lambda v: isinstance(v, dict) and len(v) <= MAX_GPUS and all(
    isinstance(k, str) and len(k) <= 64 and isinstance(x, str) and len(x) <= MAX_TEXT for k, x in v.items()))
# Free-form details of a node's error: kept as the node sent them (only the
# CLI's error renderer reads them, through its own escaping), but bounded.
DETAILS = Type("an object", lambda v: isinstance(v, dict) and len(v) <= 100)


def list_of(item, most: int = MAX_ITEMS) -> Type:
    item_type = item if isinstance(item, Type) else obj(item)

    def convert(v, path):
        if not isinstance(v, list) or len(v) > most:
            raise BadField(path, f"a list of at most {most}", v)
        return [item_type.check(x, f"{path}[{i}]") for i, x in enumerate(v)]
    return Type("a list", convert=convert)


def req(t) -> tuple:
    return (t, True)


def opt(t) -> tuple:
    return (t, False)


def obj(fields: dict, *, span: tuple[str, str] | None = None) -> Type:
    """An object with ``fields`` (name -> ``req(type)`` or ``opt(type)``;
    a dict as the type is an object of that shape).  ``span``: two time
    fields, the second not before the first."""
    def convert(v, path):
        if not isinstance(v, dict):
            raise BadField(path, "an object", v)
        out = {}
        for name, (t, required) in fields.items():
            where = f"{path}.{name}" if path else name
            x = v.get(name)
            if x is None:
                if required:
                    raise BadField(where, (t if isinstance(t, Type) else obj(t)).want, x)
                if name in v:
                    out[name] = None
                continue
            out[name] = (t if isinstance(t, Type) else obj(t)).check(x, where)
        if span is not None and out.get(span[0]) is not None and out.get(span[1]) is not None:
            from bk.core.utctime import parse_utc

            if parse_utc(out[span[1]]) < parse_utc(out[span[0]]):
                raise BadField(f"{path}.{span[1]}" if path else span[1], f"a time not before {span[0]}",
                               out[span[1]])
        return out
    return Type("an object", convert=convert)


# -- the shapes ------------------------------------------------------------

# The job attached to a booking, as the ledger knows it (never the command).
JOB = obj({"status": req(TEXT), "summary": opt(TEXT), "id": opt(TEXT), "digest": opt(TEXT),
           "reason": opt(TEXT), "exit_code": opt(INT), "updated": opt(ISO)})

# bk.service.views.reservation_json
RESERVATION = obj({
    "id": req(text(200)), "short_id": req(text(64)), "number": opt(UINT), "uid": req(UINT),
    "user": req(text(256)), "mine": opt(BOOL), "mode": opt(text(32)), "gpus": req(GPUS),
    "share": opt(UINT), "capacity": opt(UINT), "mem_mib": opt(UINT), "mem_mib_effective": opt(UINT),
    "start": req(ISO), "end": req(ISO), "status": req(text(32)), "created": opt(ISO),
    "op_id": opt(text(200)), "job": opt(JOB), "note": opt(TEXT), "cancelled_at": opt(ISO),
    "cancel_reason": opt(TEXT), "edits": opt(UINT),
}, span=("start", "end"))

# bk.service.advice.option_json
OPTION = obj({"gpus": req(GPUS), "start": req(ISO), "end": req(ISO), "command": opt(TEXT),
              "queued": opt(BOOL), "mem_mib_effective": opt(UINT), "reasons": opt(TEXT_MAP)},
             span=("start", "end"))

PLACEMENT = obj({"gpus": opt(TEXT_MAP), "queued": opt(BOOL), "mem_mib_effective": opt(UINT)})

WORKER = obj({"state": opt(text(32)), "pid": opt(UINT), "since": opt(ISO), "data_dir": opt(TEXT)})

JOB_ROW = obj({"id": opt(TEXT), "short_id": opt(text(64)), "status": req(text(32)), "summary": opt(TEXT),
               "reason": opt(TEXT), "exit_code": opt(INT), "updated": opt(ISO), "reservation": opt(text(200)),
               "reservation_short_id": opt(text(64)), "gpus": opt(GPUS), "start": opt(ISO), "end": opt(ISO)})

# What each command the client sends answers (the envelope's ``data``).
LIST = obj({"scope": opt(text(32)), "reservations": req(list_of(RESERVATION)), "total": opt(UINT)})
# What was asked, as the node read it (its grid): a node with no option is
# refused in bk slots' words, which name it.
ASKED = obj({"count": opt(UINT), "duration": opt(UINT), "mode": opt(text(32)), "mem_mib": opt(UINT)})
SLOTS = obj({"options": req(list_of(OPTION)), "request": opt(ASKED)})
WRITE = obj({"status": req(text(32)), "reservation": req(RESERVATION), "before": opt(RESERVATION),
             "placement": opt(PLACEMENT), "dry_run": opt(BOOL)})
OP = obj({"op_id": opt(text(200)), "found": req(BOOL), "action": opt(text(32)), "reservation": opt(RESERVATION)})
WORKER_STATE = obj({"worker": opt(WORKER), "jobs": opt(obj({"pending": opt(UINT), "running": opt(UINT)})),
                    "jobs_dir": opt(TEXT)})
JOBS = obj({"jobs": req(list_of(JOB_ROW)), "total": opt(UINT), "worker": opt(WORKER)})

# The node's identity block (bk.cli.cmd_cluster.identity), in every reply.
IDENTITY = obj({"id": opt(text(80)), "id_source": opt(text(32)), "hostname": opt(text(256)),
                "version": opt(text(64)), "mode": opt(text(32)), "now": opt(ISO), "now_epoch": opt(NUM),
                "capabilities": opt(list_of(text(64), 100))})

# The command's own envelope, inside the node's.
ERROR = obj({"code": req(text(64)), "message": req(TEXT), "hint": opt(TEXT), "details": opt(DETAILS)})
WARNINGS = list_of(TEXT, 1000)

# The wrapper ``bk c node`` prints: identity, and the command's envelope
# (``reply``) or, with ``--text``, its text, stderr and exit status.
WRAPPER = obj({"node": opt(IDENTITY), "text": opt(text(MAX_OUTPUT)), "stderr": opt(text(MAX_OUTPUT)),
               "exit": opt(Type("an exit status 0-255", lambda v: _is_int(v, 0, 255)))})


def check(shape: Type, value: object, path: str = "") -> object:
    """``value`` as ``shape`` allows it (unknown fields dropped); raises
    ``BadField`` naming the first field that does not fit."""
    return shape.check(value, path)
