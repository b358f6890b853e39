"""Policy binding as one pure comparison (SPEC 5).

The ledger records ``Policy.bound()`` at its first write; later writers
compare their configuration with it.  Three places ask the question, and
must agree: the store before every commit (``Store._bind``), the broker
before it starts serving (``_check_store``), and ``bk doctor``.  They all
call ``policy_diff``.

The rules.  A key both sides have is a conflict when the values differ *or
their types do*: JSON keeps ``true`` and ``1``, ``5`` and ``5.0`` apart, and
Python's ``True == 1`` and ``5 == 5.0`` must not hide a hand-edited ledger
or configuration.  A key the configuration has and the ledger lacks (a
newer bk added it, or someone deleted it) is an addition: the next write
records it, nothing refuses.  A key only the ledger has is ignored (an
older bk does not know it).  No bound policy at all (``None``) means a
ledger not written yet: everything is an addition.
"""

from __future__ import annotations

from bk.core.record import dataclass


@dataclass(frozen=True)
class PolicyDiff:
    """``conflicts``: key -> ``{"ledger": bound value, "config": wanted
    value}`` (the shape of ``ConfigError.details["differences"]``);
    ``additions``: key -> wanted value, for keys the ledger lacks."""

    conflicts: dict
    additions: dict

    def describe(self) -> str:
        """The conflicts for people: ``key: ledger V, configuration W; ...``."""
        return "; ".join(f"{k}: ledger {d['ledger']!r}, configuration {d['config']!r}"
                         for k, d in sorted(self.conflicts.items()))

    def describe_additions(self) -> str:
        return ", ".join(f"{k}={_show(v)}" for k, v in sorted(self.additions.items()))


def _show(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def same(a: object, b: object) -> bool:
    """Equal and of the same types, all the way down (``True`` is not ``1``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def policy_diff(bound: dict | None, wanted: dict) -> PolicyDiff:
    """Compare the ledger's bound policy with the configuration's."""
    bound = bound or {}
    conflicts = {k: {"ledger": bound[k], "config": v} for k, v in wanted.items()
                 if k in bound and not same(bound[k], v)}
    additions = {k: v for k, v in wanted.items() if k not in bound}
    return PolicyDiff(conflicts, additions)
