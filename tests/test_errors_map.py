"""The error table is complete and one-to-one: every ``BkError`` class has
a code in ``errors.BY_CODE``, each code means one exit status, and an error
sent across a process as ``(code, message, hint)`` comes back as the class
(and so the exit status) that raised it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bk.core import errors

ROOT = Path(__file__).resolve().parents[1]


def all_error_classes() -> list[type[errors.BkError]]:
    out, todo = [], [errors.BkError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            out.append(sub)
            todo.append(sub)
    return sorted(set(out), key=lambda c: c.__name__)


CLASSES = all_error_classes()


def test_the_map_is_keyed_by_each_class_own_code():
    assert all(cls.code == code for code, cls in errors.BY_CODE.items())
    assert errors.ERROR_CODES == tuple(errors.BY_CODE)
    assert len(set(errors.BY_CODE.values())) == len(errors.BY_CODE)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_error_class_is_in_the_map_with_its_exit_status(cls):
    mapped = errors.BY_CODE.get(cls.code)
    assert mapped is not None, f"{cls.__name__}.code {cls.code!r} is not in errors.BY_CODE"
    # A class is its code's class, or refines it without changing what
    # scripts see (UsageError is an InvalidInput).
    assert issubclass(cls, mapped), f"{cls.__name__} shares code {cls.code!r} with {mapped.__name__}"
    assert cls.exit_code == mapped.exit_code
    assert cls.exit_code in {status for status, _ in errors.EXIT_TABLE}


def test_each_code_means_one_exit_status_and_distinct_classes_distinct_codes():
    status_of: dict[str, set[int]] = {}
    for cls in CLASSES:
        status_of.setdefault(cls.code, set()).add(cls.exit_code)
    assert {code: len(s) for code, s in status_of.items()} == {code: 1 for code in status_of}
    assert set(status_of) == set(errors.BY_CODE)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_an_error_rebuilt_from_its_json_keeps_class_and_exit_status(cls):
    sent = cls("it went wrong", "do this", details={"rule": "x"})
    j = sent.to_json()
    back = errors.error_from(j["code"], j["message"], j["hint"], j.get("details"))
    assert type(back) is errors.BY_CODE[cls.code]
    assert isinstance(sent, type(back))
    assert (back.code, back.exit_code) == (sent.code, sent.exit_code)
    assert (back.message, back.hint, back.details) == ("it went wrong", "do this", {"rule": "x"})


def test_unknown_or_malformed_replies_are_internal():
    assert type(errors.error_from("no_such_code", "m")) is errors.Internal
    e = errors.error_from(None, 5, ["h"], "d")
    assert type(e) is errors.Internal and e.hint is None and e.details == {}
    assert isinstance(e.message, str)


@pytest.mark.slow
def test_no_error_class_is_defined_outside_the_table():
    names = {c.__name__ for c in CLASSES} | {"BkError"}
    for path in sorted((ROOT / "bk").rglob("*.py")):
        if path == ROOT / "bk" / "core" / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", None)
                         for b in node.bases}
                assert not bases & names, f"{path}: class {node.name} belongs in bk/core/errors.py"


@pytest.mark.parametrize("doc", ["docs/JSON.md", "man/bk.1"])
def test_the_documented_code_lists_name_every_code(doc):
    text = (ROOT / doc).read_text()
    line = next(ln for ln in text.replace("\n", " ").split("error.code")[1:] if "invalid_input" in ln)
    listed = line.split(";")[0].split(".")[0].replace("`", "").replace("\\fR", "").replace("is one of", "")
    assert {w.strip(" ,") for w in listed.split(",")} == set(errors.BY_CODE), doc
