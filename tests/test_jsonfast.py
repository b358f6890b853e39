"""``bk.core.jsonfast`` is ``json`` for the options bk uses: the same text
out of ``dumps``, the same values out of ``loads``, and the same errors
(class, message, position) for what either refuses, on ordinary
documents, hostile strings and the edge cases of the format; and the same
again when ``_json`` is missing, where it hands everything to ``json``."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import pytest

from bk.core import jsonfast

STRINGS = ["", "a", "é", "日本", "\x00", "\x1b[2J", "\u202e", "\u2028\u2029", "\ud800", "\udfff\ud800",
           "\U0001f600", '"', "\\", "/", "\x7f", "\b\f\n\r\t", "a\u0000b", "\ufeff", "</script>"]
NUMBERS = [0, -0, 1, -1, 2 ** 63, -(2 ** 64) - 1, 10 ** 40, 0.0, -0.0, 1.5, 1e-320, 1e308, 0.1 + 0.2,
           True, False, None]


def documents(seed: int, n: int = 300):
    rnd = random.Random(seed)

    def value(depth: int):
        kind = rnd.randrange(7 if depth < 4 else 3)
        if kind == 0:
            return rnd.choice(STRINGS) + rnd.choice(STRINGS)
        if kind == 1:
            return rnd.choice(NUMBERS)
        if kind == 2:
            return rnd.random() * 10 ** rnd.randrange(-5, 20)
        if kind in (3, 4):
            return {rnd.choice(STRINGS) + str(i): value(depth + 1) for i in range(rnd.randrange(4))}
        if kind == 5:
            return [value(depth + 1) for _ in range(rnd.randrange(4))]
        return (value(depth + 1), value(depth + 1))
    yield from (value(0) for _ in range(n))
    yield from STRINGS
    yield from NUMBERS
    yield from ({}, [], {"b": 1, "a": [1, {"d": None, "c": 2}]}, {3: "int key", 2.5: "float key",
                True: "bool key", None: "none key"})


OPTIONS = [{}, {"separators": (",", ":")}, {"separators": (",", ":"), "allow_nan": False, "check_circular": False},
           {"sort_keys": True, "separators": (",", ":")}, {"ensure_ascii": False, "separators": (",", ":")},
           {"sort_keys": True}, {"default": list}, {"separators": [",", ":"]}]


def outcome(fn, *args, **kwargs):
    try:
        return "ok", fn(*args, **kwargs)
    except Exception as e:                       # noqa: BLE001 - the error is what is compared
        return type(e), str(e), getattr(e, "pos", None)


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_dumps_is_json_dumps(options):
    for doc in documents(OPTIONS.index(options)):
        ours, theirs = outcome(jsonfast.dumps, doc, **options), outcome(json.dumps, doc, **options)
        assert ours == theirs, doc
        if ours[0] == "ok":
            assert outcome(jsonfast.loads, ours[1]) == outcome(json.loads, ours[1])


def test_dumps_refuses_what_json_refuses():
    loop: list = []
    loop.append(loop)
    cases = [(float("nan"), {"allow_nan": False}), ([float("inf")], {"allow_nan": False}),
             ({"x": -math.inf}, {"allow_nan": False, "check_circular": False}), (loop, {}),
             ({"s": {1, 2}}, {}), (object(), {"separators": (",", ":")}), ({(1, 2): 3}, {}),
             (b"bytes", {}), ({"a": 1, 2: "b"}, {"sort_keys": True})]
    for doc, options in cases:
        ours = outcome(jsonfast.dumps, doc, **options)
        assert ours[0] != "ok" and ours == outcome(json.dumps, doc, **options), doc
    for doc in (float("nan"), [math.inf, -math.inf]):
        assert jsonfast.dumps(doc) == json.dumps(doc)


def test_a_reused_encoder_after_a_failure_is_still_right():
    for check in (True, False):
        encode = jsonfast.encoder(separators=(",", ":"), allow_nan=False, check_circular=check)
        shared = [1, 2]
        with pytest.raises(ValueError):
            encode([shared, {"x": [float("nan")]}])
        assert encode([shared, shared]) == "[[1,2],[1,2]]"


BAD = ["", " ", "{", "}", "[1,]", '{"a" 1}', '{"a":1,}', "[1 2]", "01", "1.", ".5", "-", "+1", "nul", "tru",
       '"\\x"', '"\\u12"', '"\\ud800"', '"a\nb"', '"\x00"', "'a'", "[1] x", "{} {}", "1 2", "\ufeff{}",
       "NaN", "Infinity", "-Infinity", "[NaN]", " \t\n\r[1] \t\n\r", "\x0c1", "1\x0c", "[1e400]", "1e5",
       "-0", "-0.0", "[" * 100 + "]" * 100, '{"a":1,"a":2}', "\u3000 1", "1 \u3000", "\ufeff",
       '"\\ud83d\\ude00"', "[-1e-400]", "  ", "\t{}\t"]


def test_loads_is_json_loads_value_and_error():
    for text in BAD + [json.dumps(d) for d in documents(7, 100)]:
        for data in (text, text.encode("utf-8", "surrogatepass"), bytearray(text.encode("utf-8", "surrogatepass"))):
            ours, theirs = outcome(jsonfast.loads, data), outcome(json.loads, data)
            if ours[0] == "ok" and theirs[0] == "ok":
                assert json.dumps(ours[1]) == json.dumps(theirs[1]), data
            else:
                assert ours == theirs, data


def test_loads_of_other_encodings_and_types_is_json_loads():
    for data in ('{"a": "é"}'.encode(enc) for enc in ("utf-8-sig", "utf-16", "utf-16-le", "utf-16-be",
                                                      "utf-32", "utf-32-le", "utf-32-be")):
        assert outcome(jsonfast.loads, data) == outcome(json.loads, data)
    for data in (b"\xff", b"\xc3", b"[\xed\xa0\x80]", b'"\xed\xa0\x80"', b"1", b"12", b"\x001", b"1\x00",
                 b"{}\x00", memoryview(b"{}"), None, 1, ["{}"]):
        assert outcome(jsonfast.loads, data) == outcome(json.loads, data), data


def test_loads_hooks_are_json_loads_hooks():
    def constant(name):
        raise ValueError(f"{name} is not valid JSON")

    seen_ours, seen_theirs = [], []
    text = '{"a": [{"b": 1}, {"c": [2, {"d": 3}]}], "e": {"f": NaN}}'
    for hooks in ({"parse_constant": constant},
                  {"object_hook": lambda d: seen_ours.append(sorted(d)) or d},
                  {"object_pairs_hook": lambda pairs: pairs}):
        ours = outcome(jsonfast.loads, text, **hooks)
        theirs = outcome(json.loads, text, **{k: (lambda d: seen_theirs.append(sorted(d)) or d)
                                              if k == "object_hook" else v for k, v in hooks.items()})
        assert repr(ours) == repr(theirs)
    assert seen_ours == seen_theirs != []


def test_the_error_is_json_s_class():
    with pytest.raises(json.JSONDecodeError) as info:
        jsonfast.loads("[1] 2")
    assert (info.value.msg, info.value.pos, info.value.lineno, info.value.colno) == ("Extra data", 4, 1, 5)
    assert jsonfast.JSONDecodeError is json.JSONDecodeError
    with pytest.raises(AttributeError):
        jsonfast.no_such_name  # noqa: B018


def test_without_the_accelerator_everything_goes_to_json():
    # Another Python (or a build without _json): the module still imports and
    # answers as json does, which then does the work itself.
    script = """
import sys
sys.modules["_json"] = None
from bk.core import jsonfast
import json
assert jsonfast._json is None
doc = {"b": [1, 2.5, None, "\\u00e9"], "a": {"x": True}}
for options in ({}, {"separators": (",", ":"), "sort_keys": True}, {"ensure_ascii": False}):
    assert jsonfast.dumps(doc, **options) == json.dumps(doc, **options)
assert jsonfast.encoder(separators=(",", ":"))(doc) == json.dumps(doc, separators=(",", ":"))
assert jsonfast.loads(json.dumps(doc)) == doc == jsonfast.loads(json.dumps(doc).encode())
for bad in ("[1,]", "[1] 2", ""):
    try:
        jsonfast.loads(bad)
    except json.JSONDecodeError as e:
        ours = (e.msg, e.pos)
    try:
        json.loads(bad)
    except json.JSONDecodeError as e:
        assert ours == (e.msg, e.pos)
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ok"]


def test_jsonfast_imports_no_re():
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", (
        "import sys; sys.path.insert(0, sys.argv[1]); from bk.core import jsonfast; "
        "jsonfast.loads(jsonfast.dumps({'a': [1, 'b']})); jsonfast.loads(b' [1] '); "
        "print('re' in sys.modules, 'json' in sys.modules)"), str(__import__("pathlib").Path(__file__).parent.parent)],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]


BAD_IN_C = ("{garbage", '{"a" 1}', '{"a":1,', '["a\\x"]', '"\\ud800', '{"a":1 "b":2}', "[1 2]", '"abc')


def test_a_bad_document_raises_jsons_error_when_json_was_never_imported():
    # Up to 3.11 the C scanner looks JSONDecodeError up in sys.modules only
    # and, with json.decoder absent, fails with a bare SystemError: a fresh
    # process that never imported json must still get json's own error.
    script = """
import sys
sys.path.insert(0, sys.argv[1])
from bk.core import jsonfast
out = []
for bad in sys.argv[2:]:
    assert "json.decoder" not in sys.modules or out
    try:
        jsonfast.loads(bad)
    except ValueError as e:
        out.append([type(e).__name__, e.msg, e.pos])
    for name in ("scan", "string"):
        sys.modules.pop("json.decoder", None), sys.modules.pop("json", None)
        scan, string = jsonfast.scanners()
        try:
            (scan(bad, 0) if name == "scan" else string(bad, 1))
        except ValueError as e:
            out.append([name, e.msg, e.pos])
        except StopIteration:
            out.append([name, "stop"])
        else:
            out.append([name, "ok"])
    sys.modules.pop("json.decoder", None), sys.modules.pop("json", None)
print(__import__("json").dumps(out))
"""
    root = str(__import__("pathlib").Path(__file__).parent.parent)
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", script, root, *BAD_IN_C],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    want = []
    decoder = json.JSONDecoder()
    for bad in BAD_IN_C:
        try:
            json.loads(bad)
        except json.JSONDecodeError as e:
            want.append(["JSONDecodeError", e.msg, e.pos])
        for name in ("scan", "string"):
            try:
                (decoder.scan_once(bad, 0) if name == "scan" else json.decoder.scanstring(bad, 1))
            except json.JSONDecodeError as e:
                want.append([name, e.msg, e.pos])
            except StopIteration:
                want.append([name, "stop"])
            else:
                want.append([name, "ok"])
    assert json.loads(proc.stdout) == want
