"""JSON read and written by the interpreter's C accelerator alone, without ``re``.

The facts.  ``import json`` imports ``json.decoder``, ``json.scanner`` and
``json.encoder``, and each of those imports ``re`` for a pattern or two
(the whitespace between tokens, the characters a string must escape):
with ``re`` come ``enum``, ``functools`` and the regular-expression
compiler, about 4 ms of a command that itself takes a few (benchmarks/cli.py).
Yet CPython does the work in C: ``_json.make_scanner`` parses a document,
``_json.make_encoder`` writes one, and ``json`` only wraps them, using its
patterns on the slow paths (the pure-Python scanner, an indented dump) and to
skip the whitespace around a document.

The decision.  ``loads`` and ``dumps`` here are ``json.loads`` and
``json.dumps`` for the options bk uses, built on ``_json`` directly: the
same C objects, given the same arguments the standard module gives them,
so the same bytes come out and the same errors are raised (the C scanner
raises ``json.JSONDecodeError`` itself; what the wrapper raises, "Expecting
value" and "Extra data", is raised here as that same class, imported when a
document is bad, which is no hurry).  Up to Python 3.11 the C scanner
finds that class only in ``sys.modules`` and, with ``json.decoder`` not
imported, fails with a bare ``SystemError`` ("returned NULL without
setting an exception"); a bad document is then scanned again once
``json.decoder`` is imported (``_again``), and raises what ``json`` raises.  Whatever this module does not do
itself goes to ``json`` unchanged: an ``indent``, bytes in UTF-16 or UTF-32,
and every call where ``_json`` is missing (another Python).
``tests/test_jsonfast.py`` compares both, byte for byte and error for error.
"""

from __future__ import annotations

try:
    import _json
except ImportError:                       # not CPython: the standard module does it all
    _json = None

_WS = " \t\n\r"                           # what JSON calls whitespace, and json skips


def __getattr__(name: str):
    # ``except jsonfast.JSONDecodeError``: the class json raises, looked up
    # only when an exception is being matched.
    if name == "JSONDecodeError":
        import json

        return json.JSONDecodeError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _error(message: str, doc: str, pos: int):
    import json

    return json.JSONDecodeError(message, doc, pos)


class _Context:
    """What ``_json.make_scanner`` reads off a ``json.JSONDecoder``: the
    standard decoder's settings (``strict``, ``int``, ``float``, NaN and
    Infinity allowed unless ``parse_constant`` says otherwise)."""

    __slots__ = ("strict", "object_hook", "object_pairs_hook", "parse_float", "parse_int",
                 "parse_constant")

    def __init__(self, object_hook, object_pairs_hook, parse_constant):
        self.strict = True
        self.object_hook, self.object_pairs_hook = object_hook, object_pairs_hook
        self.parse_float, self.parse_int = float, int
        self.parse_constant = parse_constant or _CONSTANTS.__getitem__


_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}
_scanners: dict = {}


def _again(scan, *args):
    """``scan(*args)`` for a C scanner that failed without its exception
    class (module docstring): the same call, with ``json.decoder`` there."""
    import json.decoder  # noqa: F401  (the C scanner looks it up in sys.modules)

    return scan(*args)


def _scanner(object_hook, object_pairs_hook, parse_constant):
    if object_hook is not None or object_pairs_hook is not None:
        # A hook is often a closure made for one read: not kept.
        return _json.make_scanner(_Context(object_hook, object_pairs_hook, parse_constant))
    scan = _scanners.get(parse_constant)
    if scan is None:
        scan = _json.make_scanner(_Context(None, None, parse_constant))
        if len(_scanners) < 8:
            _scanners[parse_constant] = scan
    return scan


def _utf8(b) -> bool:
    """Whether ``json.loads`` reads these bytes as plain UTF-8: no byte-order
    mark, and no zero byte where it would take one for UTF-16 or UTF-32."""
    if b[:2] in (b"\xfe\xff", b"\xff\xfe") or b[:3] == b"\xef\xbb\xbf" or b[:4] == b"\x00\x00\xfe\xff":
        return False
    if len(b) >= 4 or len(b) == 2:
        return bool(b[0] and b[1])
    return True


def loads(s, *, object_hook=None, object_pairs_hook=None, parse_constant=None):
    """``json.loads(s, ...)`` with these hooks (the others at their defaults)."""
    if _json is None or not isinstance(s, (str, bytes, bytearray)) or \
            (not isinstance(s, str) and not _utf8(s)):
        import json

        return json.loads(s, object_hook=object_hook, object_pairs_hook=object_pairs_hook,
                          parse_constant=parse_constant)
    if isinstance(s, str):
        if s[:1] == "\ufeff":
            raise _error("Unexpected UTF-8 BOM (decode using utf-8-sig)", s, 0)
    else:
        s = s.decode("utf-8", "surrogatepass")
    scan = _scanner(object_hook, object_pairs_hook, parse_constant)
    start = 0
    if s and s[0] in _WS:
        start = len(s) - len(s.lstrip(_WS))
    try:
        try:
            obj, end = scan(s, start)
        except SystemError:
            obj, end = _again(scan, s, start)
    except StopIteration as err:
        raise _error("Expecting value", s, err.value) from None
    if end != len(s):
        tail = s[end:]
        rest = tail.lstrip(_WS)
        if rest:
            raise _error("Extra data", s, end + len(tail) - len(rest))
    return obj


def _not_serializable(o):
    raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")


def encoder(*, ensure_ascii: bool = True, separators: tuple[str, str] | None = None,
            sort_keys: bool = False, allow_nan: bool = True, check_circular: bool = True,
            default=None):
    """A function ``obj -> str`` that is ``json.dumps(obj, **these)``: the
    C encoder made once for a writer that encodes many records."""
    item_sep, key_sep = separators if separators is not None else (", ", ": ")
    if _json is None:
        import json

        options = {"ensure_ascii": ensure_ascii, "separators": (item_sep, key_sep), "sort_keys": sort_keys,
                   "allow_nan": allow_nan, "check_circular": check_circular, "default": default}
        return lambda obj: json.dumps(obj, **options)
    string = _json.encode_basestring_ascii if ensure_ascii else _json.encode_basestring
    default = default or _not_serializable
    make = _json.make_encoder

    def encode(obj) -> str:
        if isinstance(obj, str):
            return string(obj)
        # A new one each time when it tracks containers: after a failed
        # encoding its table of the containers being written is not empty.
        run = made if made is not None else make(
            {}, default, string, None, key_sep, item_sep, sort_keys, False, allow_nan)
        return "".join(run(obj, 0))

    made = None if check_circular else make(None, default, string, None, key_sep, item_sep,
                                            sort_keys, False, allow_nan)
    return encode


_encoders: dict = {}


def dumps(obj, *, ensure_ascii: bool = True, separators: tuple[str, str] | None = None,
          sort_keys: bool = False, allow_nan: bool = True, check_circular: bool = True,
          default=None) -> str:
    """``json.dumps(obj, ...)`` with these options (no ``indent``: use ``json``)."""
    if separators is not None:
        separators = tuple(separators)
    key = (ensure_ascii, separators, sort_keys, allow_nan, check_circular, default)
    encode = _encoders.get(key)
    if encode is None:
        encode = encoder(ensure_ascii=ensure_ascii, separators=separators, sort_keys=sort_keys,
                         allow_nan=allow_nan, check_circular=check_circular, default=default)
        if len(_encoders) < 16:
            _encoders[key] = encode
    return encode(obj)


def scanners(parse_constant=None):
    """A decoder's two scanners, for a reader that walks a document itself:
    ``scan(s, i)`` -> (the value at ``i``, where it ends), raising
    StopIteration where no value starts, and ``scanstring(s, i)`` -> (the
    string whose opening quote is at ``i - 1``, where it ends)."""
    if _json is None:
        from json.decoder import JSONDecoder, scanstring

        return JSONDecoder(parse_constant=parse_constant).scan_once, scanstring
    scan, string = _scanner(None, None, parse_constant), _json.scanstring

    def scan_once(s: str, i: int):
        try:
            return scan(s, i)
        except SystemError:
            return _again(scan, s, i)

    def scanstring(s: str, i: int):
        try:
            return string(s, i)
        except SystemError:
            return _again(string, s, i)

    return scan_once, scanstring


def raw_decode(s: str, idx: int = 0):
    """``json.JSONDecoder().raw_decode(s, idx)``: the value at ``idx`` (no
    whitespace skipped) and where it ends."""
    if _json is None:
        import json

        return json.JSONDecoder().raw_decode(s, idx)
    try:
        scan = _scanner(None, None, None)
        try:
            return scan(s, idx)
        except SystemError:
            return _again(scan, s, idx)
    except StopIteration as err:
        raise _error("Expecting value", s, err.value) from None
