"""Field specs: the shape of each request type, declared once.

A request crosses a trust boundary as a JSON object (a broker frame, an MCP
tool call).  ``decode`` builds the typed request from such an object with
the request type's spec: unknown fields, wrong types (a bool is not an
int), nulls where a value is required, out-of-range numbers, over-long or
control-character text are refused before any rule sees them.  ``encode``
is its inverse for the client side, and ``schema`` the JSON Schema that
tool descriptions are derived from.
"""

from __future__ import annotations

from bk.core import record
from bk.core.errors import InvalidInput
from bk.core.record import dataclass

# Integers on the wire are counts, MiB, GPU indices or epoch seconds.  None
# of them is negative, and 2**36 seconds is past the year 4000: anything
# larger is junk that must not reach date arithmetic.
MAX_WIRE_INT = 1 << 36
MAX_GPUS = 64

# Text a user sends ends up on other users' terminals (``bk l --all``, the
# TUI, notices).  C0/C1 control characters would let it carry terminal
# escape sequences, line separators break a one-line field, and bidi
# controls can make it read differently from what it is, so none may enter
# the shared ledger (``bk.core.safetext.steers``; every view also escapes
# them, and the other invisible characters, with ``safetext.safe``).  A
# lone surrogate is not a character at all: JSON's ``\ud800`` escape and
# Python's ``surrogateescape`` (how argv holds bytes that are not UTF-8)
# both make one, and no UTF-8 encoder will write it, so a reply or a
# terminal line that held one would fail after the commit.
# (UTF-8's strict encoder refuses exactly those code points: ``_valid_unicode``.)


def unprintable(text: str) -> bool:
    from bk.core.safetext import steers

    return steers(text)


def check_text(value: object, label: str, *, max_len: int, min_len: int = 0,
               pattern: str | None = None, help: str = "") -> str:
    """THE rule for user text (notes, reasons, notice text, op-ids, refs),
    for every front end and the broker alike: a string of ``min_len`` to
    ``max_len`` characters, valid Unicode (no lone surrogates), no control
    characters or bidi overrides, matching ``pattern`` if given.  The length
    is checked first, so a megabyte of junk costs nothing more.  ``label``
    names the value in the message (``field 'note'``, ``--note``)."""
    if not isinstance(value, str):
        raise InvalidInput(f"{label} must be a string")
    if len(value) > max_len:
        raise InvalidInput(f"{label} is too long ({len(value)} characters; at most {max_len})")
    if len(value) < min_len:
        raise InvalidInput(f"{label} is empty" if not value else
                           f"{label} is too short (at least {min_len} characters)")
    if not _valid_unicode(value):
        raise InvalidInput(f"{label} is not valid text (bytes that are not UTF-8, or a lone surrogate)",
                           hint="use UTF-8 text")
    if unprintable(value):
        raise InvalidInput(f"{label} contains control characters",
                           hint="plain text only: no escape sequences, tabs or line breaks")
    if pattern is not None:
        import re  # only for the fields that have a pattern and a value

        if not re.fullmatch(pattern, value):
            raise InvalidInput(f"{label} is malformed" + (f": {help}" if help else ""))
    return value


def _valid_unicode(text: str) -> bool:
    """No lone surrogates (U+D800 to U+DFFF), the only code points UTF-8 cannot encode."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class Field:
    """One field of a request type.

    ``kind``: int, bool, text (printable, ``max_len``), gpus (GPU indices),
    or choice (one of ``choices``).  ``lo``/``hi`` bound ints.  A field is
    required when its record field has no default."""

    name: str
    kind: str
    lo: int = 0
    hi: int = MAX_WIRE_INT
    max_len: int = 1000
    min_len: int = 0
    choices: tuple[str, ...] = ()
    pattern: str | None = None          # a regular expression the whole text must match
    help: str = ""
    # An int a person may also write as words (``30m``, ``tomorrow 09:00``):
    # duration, start, end (an edit's new end), length (an edit's -d), since
    # (a usage period's end), memory.  The wire (a broker frame) carries the
    # int; a front end that takes words turns them into it first, with the
    # CLI's grammar (bk.agent does, for the MCP and ``bk agent`` tools), and
    # ``schema(human=True)`` says what it accepts.
    human: str = ""


def decode(cls, spec: tuple[Field, ...], fields: object):
    """The typed request ``cls`` from untrusted ``fields``."""
    if not isinstance(fields, dict):
        raise InvalidInput("request fields must be an object")
    by_name = {f.name: f for f in spec}
    defaults = {f.name: f.default for f in record.fields(cls)}
    kwargs = {}
    for name, value in fields.items():
        f = by_name.get(name)
        if f is None:
            raise InvalidInput(f"unknown field {str(name)[:40]!r}; this request takes "
                               + (", ".join(by_name) or "no fields"))
        if value is None:
            if defaults[name] is not None:
                raise InvalidInput(f"field {name!r} may not be null")
            kwargs[name] = None
            continue
        kwargs[name] = _value(f, value)
    try:
        return cls(**kwargs)
    except TypeError as e:
        missing = [f.name for f in record.fields(cls) if f.default is record.MISSING
                   and f.default_factory is record.MISSING and f.name not in kwargs]
        raise InvalidInput("incomplete request: missing " + (", ".join(missing) or str(e))) from None


def _value(f: Field, v: object):
    name = f.name
    if f.kind == "int":
        if type(v) is not int:
            raise InvalidInput(f"field {name!r} must be an integer")
        if not f.lo <= v <= f.hi:
            raise InvalidInput(f"field {name!r} is out of range ({f.lo}-{f.hi})")
        return v
    if f.kind == "bool":
        if type(v) is not bool:
            raise InvalidInput(f"field {name!r} must be true or false")
        return v
    if f.kind in ("text", "choice"):
        check_text(v, f"field {name!r}", max_len=f.max_len, min_len=f.min_len,
                   pattern=f.pattern if f.kind == "text" else None, help=f.help)
        if f.kind == "choice" and v not in f.choices:
            raise InvalidInput(f"field {name!r} must be one of " + ", ".join(f.choices))
        return v
    if f.kind == "gpus":
        if not isinstance(v, list) or len(v) > MAX_GPUS or \
                not all(type(x) is int and 0 <= x < MAX_GPUS for x in v):
            raise InvalidInput(f"field {name!r} must be a list of GPU indices (0-{MAX_GPUS - 1})")
        return tuple(v)
    raise AssertionError(f"unknown field kind {f.kind}")


def check(req, spec: tuple[Field, ...]) -> None:
    """Check a typed request built in this process (the CLI, a preset, a
    guided flow) against its field spec, exactly as ``decode`` checks one
    from the wire: private mode and the broker refuse the same requests."""
    for f in spec:
        value = getattr(req, f.name)
        if value is None:
            continue
        _value(f, list(value) if f.kind == "gpus" and isinstance(value, tuple) else value)


def encode(req) -> dict:
    """A request's fields for the wire: only those that differ from the
    default (the other side fills in the rest), tuples as lists."""
    out = {}
    for f in record.fields(req):
        value = getattr(req, f.name)
        if value == f.default:
            continue
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


HUMAN_FORMS = {
    "duration": "or as a person writes it: 30m, 2h, 1h30m, 1d12h",
    "length": "or as bk e -d takes it: 2h (the new total), +30m, -15m, 20:00, total 2h (a new end)",
    "start": "or as a person writes it: now, +30m, 20:00, 9pm, tomorrow 09:00, 07-13 20:00, "
             "2026-07-13T18:00Z (exact; the local zone unless an offset is given)",
    "end": "or as a person writes it: +30m, -15m (from the present end), 20:00, total 2h",
    "since": "or as a person writes it: 30d, 2w, 12h, today, 2026-11-01, 2026-11-01T08:00Z",
    "memory": "or as a person writes it: 12g, 512m, 1.5g",
}


def schema(cls, spec: tuple[Field, ...], *, human: bool = False) -> dict:
    """A JSON Schema (draft 2020-12 subset) for the request type; with
    ``human``, the fields a person may write as words take a string too."""
    defaults = {f.name: f for f in record.fields(cls)}
    props, required = {}, []
    for f in spec:
        rf = defaults[f.name]
        if f.kind == "int" and human and f.human:
            p = {"anyOf": [{"type": "integer", "minimum": f.lo, "maximum": f.hi},
                           {"type": "string", "minLength": 1, "maxLength": 200}]}
        elif f.kind == "int":
            p = {"type": "integer", "minimum": f.lo, "maximum": f.hi}
        elif f.kind == "bool":
            p = {"type": "boolean"}
        elif f.kind == "choice":
            p = {"type": "string", "enum": list(f.choices)}
        elif f.kind == "gpus":
            p = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": MAX_GPUS - 1},
                 "maxItems": MAX_GPUS}
        else:
            p = {"type": "string", "maxLength": f.max_len}
            if f.min_len:
                p["minLength"] = f.min_len
            if f.pattern:
                p["pattern"] = f"^(?:{f.pattern})$"
        if rf.default is record.MISSING and rf.default_factory is record.MISSING:
            required.append(f.name)
        elif rf.default is None:
            p = {"anyOf": [*p.get("anyOf", (p,)), {"type": "null"}]}
        help = f.help
        if human and f.human:
            help = f"{help}, {HUMAN_FORMS[f.human]}" if help else HUMAN_FORMS[f.human]
        if help:
            p["description"] = help
        props[f.name] = p
    out = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = required
    return out
