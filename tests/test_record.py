"""bk.core.record: the dataclasses subset bk uses, checked against dataclasses itself."""

from __future__ import annotations

import dataclasses

import pytest

from bk.core import record
from bk.core.record import FrozenInstanceError, dataclass, field


@dataclass
class Point:
    x: int
    y: int = 0
    tags: list = field(default_factory=list)
    note: str = field(default="", compare=False)
    KIND = "point"                       # not annotated: a class constant, not a field


@dataclass(frozen=True)
class Key:
    name: str
    size: int = 1


@dataclasses.dataclass
class RefPoint:
    x: int
    y: int = 0
    tags: list = dataclasses.field(default_factory=list)
    note: str = dataclasses.field(default="", compare=False)


def test_init_defaults_and_factories_like_dataclasses():
    a, b = Point(1), Point(1)
    assert (a.x, a.y, a.tags, a.note) == (1, 0, [], "")
    a.tags.append(1)
    assert b.tags == []                                   # one list per instance
    assert Point(1, 2, [3], "n").__dict__ == RefPoint(1, 2, [3], "n").__dict__
    assert Point.KIND == "point" and [f.name for f in record.fields(Point)] == ["x", "y", "tags", "note"]
    with pytest.raises(TypeError):
        Point()                                           # x is required
    with pytest.raises(TypeError):
        Point(1, z=2)


def test_repr_eq_and_hash():
    assert repr(Point(1, 2)) == "Point(x=1, y=2, tags=[], note='')"
    assert Point(1, note="a") == Point(1, note="b")       # compare=False
    assert Point(1) != Point(2) and Point(1) != RefPoint(1)
    assert Point.__hash__ is None                         # mutable and compared by value
    assert hash(Key("a")) == hash(Key("a")) and {Key("a"): 1}[Key("a")] == 1


def test_frozen_refuses_assignment():
    k = Key("a")
    with pytest.raises(FrozenInstanceError):
        k.name = "b"
    with pytest.raises(FrozenInstanceError):
        del k.size
    assert isinstance(FrozenInstanceError("x"), AttributeError)


def test_replace_fields_and_asdict():
    p = Point(1, 2, [Key("a")])
    q = record.replace(p, y=5)
    assert (q.x, q.y, q.tags) == (1, 5, p.tags) and p.y == 2
    with pytest.raises(TypeError):
        record.replace(p, z=1)
    assert record.asdict(Point(1, 2, [Key("a", 3)], "n")) == \
        {"x": 1, "y": 2, "tags": [{"name": "a", "size": 3}], "note": "n"}
    assert record.asdict(Key("t")) == dataclasses.asdict(dataclasses.make_dataclass(
        "K", [("name", str), ("size", int)])("t", 1))
    with pytest.raises(TypeError):
        record.fields(object())


def test_a_required_field_after_a_default_is_refused():
    with pytest.raises(TypeError, match="without a default"):
        @dataclass
        class Bad:
            a: int = 1
            b: int


def test_methods_a_class_defines_are_kept():
    @dataclass
    class Custom:
        a: int

        def __repr__(self):
            return "custom"

    assert repr(Custom(1)) == "custom" and Custom(1) == Custom(1)


@dataclass(frozen=True, bulk=True)
class BulkKey:
    name: str
    size: int = 1


@dataclass(frozen=True, bulk=True)
class Sized(BulkKey):
    unit: str = "MiB"


@pytest.mark.parametrize("cls", [Key, BulkKey])
def test_both_kinds_of_frozen_record_behave_alike(cls):
    k = cls("a", 2)
    assert type(k) is cls and record.replace(k, size=3) == cls("a", 3) and type(record.replace(k)) is cls
    assert cls(name="b").size == 1 and cls.__match_args__ == ("name", "size")
    assert hash(k) == hash(cls("a", 2)) and k != (Key if cls is BulkKey else BulkKey)("a", 2)
    with pytest.raises(FrozenInstanceError):
        k.size = 3
    with pytest.raises(FrozenInstanceError):
        del k.name
    with pytest.raises(TypeError):
        cls()                                             # name is required
    with pytest.raises(TypeError):
        cls("a", bogus=1)


def test_bulk_records_have_a_slot_per_field_and_inherit():
    assert not hasattr(BulkKey("a"), "__dict__")
    s = Sized("x", 4)
    assert (s.name, s.size, s.unit) == ("x", 4, "MiB") and type(s) is Sized and isinstance(s, BulkKey)
    assert s != BulkKey("x", 4)                           # another class: never equal
    with pytest.raises(FrozenInstanceError):
        s.unit = "GiB"


def _calls():
    # Every way to call: positional, keyword, mixed, defaults, a factory given
    # and left out, and the mistakes (missing, unexpected, repeated, too many).
    return [((1,), {}), ((1, 2), {}), ((1, 2, [3], "n"), {}), ((), {"x": 1, "note": "n"}),
            ((1,), {"tags": [9]}), ((1,), {"tags": record.MISSING}), ((), {}), ((1,), {"z": 2}),
            ((1,), {"x": 2}), ((1, 2, 3, 4, 5), {}), ((), {"y": 2})]


def _made(make, args, kwargs):
    try:
        o = make(*args, **kwargs)
    except TypeError as e:
        return "TypeError", str(e)
    return type(o).__name__, [getattr(o, f.name) for f in record.fields(o)]


@pytest.mark.parametrize("frozen, bulk", [(False, False), (True, False), (True, True)])
def test_the_generic_first_instances_are_the_compiled_ones(frozen, bulk, monkeypatch):
    # A class makes its first instances with a generic method and compiles its
    # own after record.HOT of them: both give the same instances and raise the
    # same errors (a call the generic one cannot bind goes to the compiled one).
    def make_class():
        @dataclass(frozen=frozen, bulk=bulk)
        class P:
            x: int
            y: int = 0
            tags: list = field(default_factory=list)
            note: str = field(default="", compare=False)
        return P

    generic, compiled = make_class(), make_class()
    monkeypatch.setattr(record, "HOT", 0)
    compiled(1)                                     # compiles at once
    monkeypatch.setattr(record, "HOT", 10 ** 6)
    made_by = compiled.__new__ if bulk else compiled.__init__
    assert made_by.__code__.co_name == ("__new__" if bulk else "__init__")
    for args, kwargs in _calls():
        ours, theirs = _made(generic, args, kwargs), _made(compiled, args, kwargs)
        assert ours == theirs, (args, kwargs)
    a, b = generic(1), generic(1)
    assert a.tags is not b.tags and a == b and repr(a) == repr(compiled(1))
    monkeypatch.setattr(record, "HOT", 3)
    hot = make_class()
    for i in range(5):
        assert _made(hot, (i,), {}) == ("P", [i, 0, [], ""])
    assert (hot.__new__ if bulk else hot.__init__).__code__.co_name == ("__new__" if bulk else "__init__")
