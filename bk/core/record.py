"""Records: the part of ``dataclasses`` bk uses, at a fraction of its start-up cost.

Why not ``dataclasses``?  Every bk command is a new process, and start-up is
most of what a user waits for (benchmarks/cli.py).  Importing ``dataclasses``
pulls in ``inspect``, ``ast``, ``dis`` and ``tokenize`` (about 6 ms here), and
it compiles one code object per generated method: about 0.3 ms per class,
10 ms for the ~30 classes a command loads.  This module compiles only each
class's ``__init__`` (the other methods are shared functions that read the
class's field list), about 0.07 ms a class, and imports nothing.  Frozen
records made in bulk (``bulk=True``: the ledger's) have a slot per field
(see ``_frozen``), so they cost what a mutable record costs to make and less
to read.

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


def dataclass(cls=None, /, *, frozen: bool = False, bulk: bool = False):
    """``bulk`` (frozen records made by the thousand, such as the ledger's
    bookings): a slot per field, filled by plain stores (see ``_frozen``);
    costs a second class at import, saves a call per field per instance."""
    def wrap(c):
        return _process(c, frozen, bulk)
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


def _repr(self) -> str:
    shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in self.__record_fields__)
    return f"{type(self).__qualname__}({shown})"


def _key(self) -> tuple:
    return tuple([getattr(self, n) for n in self.__record_compare__])


def _eq(self, other):
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _key(self) == _key(other)


def _hash(self) -> int:
    return hash(_key(self))


def _refuse_set(self, name, value):
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _refuse_del(self, name):
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _process(cls, frozen: bool, bulk: bool = False):
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
            if bulk and frozen:
                pass                 # _frozen builds the class again, without them
            elif f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        else:
            f = Field(name, value)
        found[name] = f
    flist = tuple(found.values())
    defaulted = None
    for f in flist:
        if f.default is not MISSING or f.default_factory is not MISSING:
            defaulted = f
        elif defaulted is not None:
            raise TypeError(f"{cls.__name__}: field {f.name!r} without a default follows one with")
    cls.__record_fields__ = flist
    cls.__record_compare__ = tuple(f.name for f in flist if f.compare)
    cls.__match_args__ = tuple(f.name for f in flist)
    if frozen and bulk:
        return _frozen(cls, flist)
    # Only __init__ is compiled per class, and only when first called (its
    # source is made then too); __repr__, __eq__ and __hash__ are shared
    # functions above.  A frozen record made a few times per command sets
    # its fields past the refusing __setattr__ (a call per field: nothing at
    # that count).
    made: dict = {"__init__": _on_demand(cls, "__init__", lambda: _init_source(flist, frozen), flist,
                                         setter=object.__setattr__ if frozen else setattr)}
    made.update(__repr__=_repr, __eq__=_eq)
    if frozen:
        made.update(__setattr__=_refuse_set, __delattr__=_refuse_del, __hash__=_hash)
    for name, fn in made.items():
        if name not in cls.__dict__:
            setattr(cls, name, fn)
    if not frozen and "__hash__" not in cls.__dict__:
        cls.__hash__ = None          # mutable and compared by value: not hashable
    return cls


def _signature(flist) -> tuple[dict, list[str], list[tuple[str, str]]]:
    """The generated method's globals, parameters and (field, value) stores."""
    env: dict = {"MISSING": MISSING}
    params, values = [], []
    for f in flist:
        if f.default_factory is not MISSING:
            env[f"_f_{f.name}"] = f.default_factory
            params.append(f"{f.name}=MISSING")
            values.append((f.name, f"_f_{f.name}() if {f.name} is MISSING else {f.name}"))
        elif f.default is not MISSING:
            env[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
            values.append((f.name, f.name))
        else:
            params.append(f.name)
            values.append((f.name, f.name))
    return env, params, values


def _init_source(flist, frozen: bool) -> tuple[list[str], dict]:
    env, params, values = _signature(flist)
    if frozen:
        env["_set"] = object.__setattr__
        body = [f"    _set(self, {name!r}, {value})" for name, value in values]
    else:
        body = [f"    self.{name} = {value}" for name, value in values]
    return [f"def __init__(self, {', '.join(params)}):", *(body or ["    pass"])], env


def _frozen(cls, flist):
    """A frozen record is two classes: a hidden one with a slot per field and
    plain attribute stores, in which ``__new__`` fills the instance (the
    interpreter's fast path: one store per field, no call), and the public
    one, which adds nothing to the layout but refuses every assignment; the
    new instance is then moved to the public class.  A refusing
    ``__setattr__`` on the class being filled would cost a call per field,
    about a microsecond per booking read, 10 ms at 10,000 bookings."""
    inherited = {n for k in cls.__mro__[1:] for n in getattr(k, "__slots__", ())}
    hidden_ns = {"__slots__": tuple(f.name for f in flist if f.name not in inherited),
                 "__module__": cls.__module__, "__qualname__": f"{cls.__qualname__}._fields"}
    if any(k.__dict__.get("__setattr__") is _refuse_set for k in cls.__mro__[1:]):
        hidden_ns["__setattr__"] = object.__setattr__      # a frozen record's subclass
    hidden = type(cls)(f"{cls.__name__}_fields", cls.__bases__, hidden_ns)
    ns = {k: v for k, v in cls.__dict__.items() if k not in ("__dict__", "__weakref__")}
    for f in flist:                  # defaults live in __new__: a class attribute would hide the slot
        ns.pop(f.name, None)
    ns.update(__slots__=(), __init__=object.__init__)
    for name, fn in (("__repr__", _repr), ("__eq__", _eq), ("__hash__", _hash),
                     ("__setattr__", _refuse_set), ("__delattr__", _refuse_del)):
        ns.setdefault(name, fn)
    public = type(cls)(cls.__name__, (hidden,), ns)
    public.__new__ = _on_demand(public, "__new__", lambda: _new_source(flist, hidden), flist, hidden=hidden)
    return public


def _new_source(flist, hidden) -> tuple[list[str], dict]:
    env, params, values = _signature(flist)
    env.update(_new=object.__new__, _hidden=hidden)
    body = [f"    o.{name} = {value}" for name, value in values]
    return [f"def __new__(cls, {', '.join(params)}):", "    o = _new(_hidden)", *body,
            "    o.__class__ = cls", "    return o"], env


# Instances a class makes with the generic method before it compiles its own.
HOT = 32
_ABSENT = object()


def _on_demand(cls, name: str, source, flist, *, setter=setattr, hidden=None):
    """``cls.<name>`` (``__init__``, or a bulk record's ``__new__``): a
    generic method that binds the arguments itself, until the class has
    made ``HOT`` instances; then the method written for the class by
    ``source()`` (its lines and globals), compiled, takes its place.

    Writing and compiling a method costs about 0.1 ms (the parser and the
    compiler run), and a command loads some 80 record classes but makes
    instances of a third of them, most of them a few times: compiling
    every one of those was 3 ms of ``bk l`` and 6 ms of a booking.  The
    generic method costs a few microseconds more per instance, so the
    classes made by the thousand (a ledger's bookings) compile theirs
    after the first few.  A call the generic method cannot bind exactly
    (a missing, unexpected or repeated argument) goes to the compiled
    method, which raises what Python raises for it."""
    state: list = [0, None, None]     # instances made, the compiled method, the binder

    def compiled():
        if state[1] is None:
            lines, env = source()
            made: dict = {}
            exec("\n".join(lines), env, made)
            real = state[1] = made[name]
            real.__qualname__ = f"{cls.__qualname__}.{name}"
            if cls.__dict__.get(name) is generic:
                setattr(cls, name, real)
        return state[1]

    def bound(args, kwargs):
        """The field values for these arguments, or None."""
        state[0] += 1
        if state[0] > HOT:
            return None
        if state[2] is None:               # not at import: most classes make no instance
            state[2] = _binder(flist)
        return state[2](args, kwargs)

    if hidden is None:
        def generic(self, *args, **kwargs):
            values = bound(args, kwargs)
            if values is None:
                return compiled()(self, *args, **kwargs)
            for n, v in values:
                setter(self, n, v)
    else:
        def generic(cls_, *args, **kwargs):
            values = bound(args, kwargs)
            if values is None:
                return compiled()(cls_, *args, **kwargs)
            o = object.__new__(hidden)
            for n, v in values:
                setattr(o, n, v)
            o.__class__ = cls_
            return o
    generic.__qualname__ = f"{cls.__qualname__}.{name}"
    return generic


def _binder(flist):
    """``(args, kwargs) -> [(field, value)]`` as a method with the record's
    parameters would bind them, or None for a call it would refuse."""
    names = tuple(f.name for f in flist)
    index = {n: i for i, n in enumerate(names)}
    plan = tuple((f.default, f.default_factory) for f in flist)
    count = len(names)

    def bind(args, kwargs):
        if len(args) > count:
            return None
        values = list(args)
        if len(values) < count:
            values += [_ABSENT] * (count - len(values))
        for k, v in kwargs.items():
            i = index.get(k)
            if i is None or values[i] is not _ABSENT:
                return None
            values[i] = v
        for i, (default, factory) in enumerate(plan):
            v = values[i]
            if factory is not MISSING:
                if v is _ABSENT or v is MISSING:
                    values[i] = factory()
            elif v is _ABSENT:
                if default is MISSING:
                    return None
                values[i] = default
        return zip(names, values, strict=True)
    return bind
