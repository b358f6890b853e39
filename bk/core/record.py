"""Records: the part of ``dataclasses`` bk uses, at a fraction of its start-up cost.

Why not ``dataclasses``?  Every bk command is a new process, and start-up is
most of what a user waits for (benchmarks/cli.py).  Importing ``dataclasses``
pulls in ``inspect``, ``ast``, ``dis`` and ``tokenize`` (about 6 ms here), and
it compiles one code object per generated method: about 0.3 ms per class,
10 ms for the ~30 classes a command loads.  This module compiles all of a
class's methods from one source string (about 0.07 ms) and imports nothing.

What it supports is exactly what bk uses: ``@dataclass`` and
``@dataclass(frozen=True)``; ``field(default=..., default_factory=...,
compare=...)``; generated ``__init__``, ``__repr__``, ``__eq__`` (and, when
frozen, ``__hash__`` and assignment refusal); and ``fields``, ``replace``
and ``asdict``.  Annotations are read as written (bk modules use
``from __future__ import annotations``, so they are strings); an annotation
starting with ``ClassVar`` is not a field.  Methods a class defines itself are
kept.
"""

from __future__ import annotations

MISSING = object()


class FrozenInstanceError(AttributeError):
    """Assignment to a field of a frozen record."""


class Field:
    __slots__ = ("name", "default", "default_factory", "compare")

    def __init__(self, name, default=MISSING, default_factory=MISSING, compare=True):
        self.name, self.default, self.default_factory, self.compare = name, default, default_factory, compare

    def __repr__(self) -> str:
        return f"Field({self.name!r})"


def field(*, default=MISSING, default_factory=MISSING, compare: bool = True) -> Field:
    if default is not MISSING and default_factory is not MISSING:
        raise ValueError("cannot specify both default and default_factory")
    return Field(None, default, default_factory, compare)


def dataclass(cls=None, /, *, frozen: bool = False):
    def wrap(c):
        return _process(c, frozen)
    return wrap if cls is None else wrap(cls)


def fields(obj) -> tuple[Field, ...]:
    cls = obj if isinstance(obj, type) else type(obj)
    try:
        return cls.__record_fields__
    except AttributeError:
        raise TypeError(f"{cls.__name__} is not a record") from None


def replace(obj, /, **changes):
    values = {f.name: getattr(obj, f.name) for f in fields(obj)}
    unknown = set(changes) - set(values)
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field {sorted(unknown)[0]!r}")
    values.update(changes)
    return type(obj)(**values)


def asdict(obj) -> dict:
    return _plain(obj)


def _plain(v):
    if hasattr(type(v), "__record_fields__"):
        return {f.name: _plain(getattr(v, f.name)) for f in type(v).__record_fields__}
    if isinstance(v, (list, tuple)):
        return type(v)(_plain(x) for x in v)
    if isinstance(v, dict):
        return {_plain(k): _plain(x) for k, x in v.items()}
    return v


def _process(cls, frozen: bool):
    found: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        for f in getattr(base, "__record_fields__", ()):
            found[f.name] = f
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if str(annotation).startswith(("ClassVar", "typing.ClassVar")):
            continue
        value = cls.__dict__.get(name, MISSING)
        if isinstance(value, Field):
            f = Field(name, value.default, value.default_factory, value.compare)
            if f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        else:
            f = Field(name, value)
        found[name] = f
    flist = tuple(found.values())

    env: dict = {"MISSING": MISSING, "FrozenInstanceError": FrozenInstanceError,
                 "_setattr": object.__setattr__}
    params, body = [], []
    for f in flist:
        if f.default_factory is not MISSING:
            env[f"_f_{f.name}"] = f.default_factory
            params.append(f"{f.name}=MISSING")
            value = f"_f_{f.name}() if {f.name} is MISSING else {f.name}"
        elif f.default is not MISSING:
            env[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
            value = f.name
        else:
            if any(p.count("=") for p in params):
                raise TypeError(f"{cls.__name__}: field {f.name!r} without a default follows one with")
            params.append(f.name)
            value = f.name
        body.append(f"    _setattr(self, {f.name!r}, {value})" if frozen
                    else f"    self.{f.name} = {value}")
    lines = [f"def __init__(self, {', '.join(params)}):", *(body or ["    pass"])]
    shown = ", ".join(f"{f.name}={{self.{f.name}!r}}" for f in flist)
    lines += ["def __repr__(self):", f"    return f'{cls.__qualname__}({shown})'"]
    keys = "".join(f"self.{f.name}, " for f in flist if f.compare)
    other = "".join(f"other.{f.name}, " for f in flist if f.compare)
    lines += ["def __eq__(self, other):",
              "    if other.__class__ is not self.__class__:",
              "        return NotImplemented",
              f"    return ({keys}) == ({other})"]
    if frozen:
        lines += ["def __setattr__(self, name, value):",
                  "    raise FrozenInstanceError(f'cannot assign to field {name!r}')",
                  "def __delattr__(self, name):",
                  "    raise FrozenInstanceError(f'cannot delete field {name!r}')",
                  "def __hash__(self):",
                  f"    return hash(({keys}))"]
    made: dict = {}
    exec("\n".join(lines), env, made)   # one compile for the whole class
    for name, fn in made.items():
        fn.__qualname__ = f"{cls.__qualname__}.{name}"
        if name not in cls.__dict__:
            setattr(cls, name, fn)
    if not frozen and "__hash__" not in cls.__dict__:
        cls.__hash__ = None          # mutable and compared by value: not hashable
    cls.__record_fields__ = flist
    cls.__match_args__ = tuple(f.name for f in flist)
    return cls
