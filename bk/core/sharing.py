"""Bookings shared for a project: who besides its owner may use one.

The facts.  A project's GPUs are often booked by one person for several:
a student and their supervisor, a team running one experiment.  The owner
names them with ``bk e ID --with alice,@nlp`` (users by login name, Unix
groups with ``@``); the ledger keeps the names as typed (``shared_with``),
and who is in a group is asked when it matters, so a student who joins
``nlp`` later may use the booking from then on.

The rules.

* Using a booking means what the owner may do with it besides changing it:
  run on it (``bk run -r``), see it among one's own (``bk l``, ``bk t``, the
  agent's list), and have one's processes on its GPUs judged ``ok``
  (``bk st``, the monitor, the enforcer).
* Only the owner changes it (edit, cancel, ``--with`` itself); the
  administrator cancels it as any other booking.  Sharing gives no right
  over the booking, only over its GPUs while it runs.
* Limits and fair share count it as the owner's: the owner holds it.  Usage
  and energy are credited to whoever ran the process (the monitor's
  records carry that uid under the booking), so a sharer's work is theirs.

Pure: names are resolved to uids by a ``lookup`` the caller passes
(``bk.store.accounts.Accounts``: ``uid_of(name)``, ``members_of(group)``).
"""

from __future__ import annotations

from bk.core.errors import InvalidInput
from bk.core.limits import valid_name

MAX_SHARED = 32          # users and groups one booking may be shared with


def valid_entry(x: object) -> bool:
    """A user name, or ``@`` and a group name."""
    return isinstance(x, str) and valid_name(x[1:] if x.startswith("@") else x)


def parse(text: str, *, owner: str | None = None) -> tuple[str, ...]:
    """``alice,@nlp`` -> ``("@nlp", "alice")``; ``""`` or ``none`` -> ``()``
    (shared with nobody).  The owner's own name is dropped."""
    words = [w.strip() for w in str(text).split(",") if w.strip()]
    if len(words) == 1 and words[0].lower() == "none":
        return ()
    bad = [w for w in words if not valid_entry(w)]
    if bad:
        raise InvalidInput(f"--with takes user names and @groups separated by commas, not {bad[0][:40]!r}",
                           hint="e.g. bk e 1 --with alice,@nlp (--with none: nobody)")
    out = tuple(sorted(set(w for w in words if w != owner)))
    if len(out) > MAX_SHARED:
        raise InvalidInput(f"a booking may be shared with at most {MAX_SHARED} users and groups",
                           hint="share it with a group instead: --with @GROUP")
    return out


def describe(entries) -> str:
    """``alice, group nlp``."""
    return ", ".join(f"group {e[1:]}" if e.startswith("@") else e for e in entries)


def uids_of(r, lookup) -> frozenset[int]:
    """Everyone ``r`` is shared with, as uids (the owner not included)."""
    out: set[int] = set()
    for e in r.shared_with:
        if e.startswith("@"):
            out |= lookup.members_of(e[1:])
        else:
            uid = lookup.uid_of(e)
            if uid is not None:
                out.add(uid)
    out.discard(r.uid)
    return frozenset(out)


def may_use(r, uid: int, user: str, groups) -> bool:
    """Whether ``uid`` (``user``, member of ``groups``) may use ``r``."""
    if r.uid == uid:
        return True
    return any(e == user or (e.startswith("@") and e[1:] in groups) for e in r.shared_with)


class Sharing:
    """Who may use which booking, asked of ``lookup`` once per booking:
    what attribution, usage and enforcement take so that a sharer's process
    on a shared booking's GPU is that booking's."""

    def __init__(self, lookup):
        self.lookup = lookup
        self._cache: dict[str, frozenset[int]] = {}

    def uids(self, r) -> frozenset[int]:
        if not r.shared_with:
            return frozenset()
        got = self._cache.get(r.id)
        if got is None:
            got = self._cache[r.id] = uids_of(r, self.lookup)
        return got

    def users_of(self, r) -> frozenset[int]:
        """The owner and everyone it is shared with."""
        return self.uids(r) | {r.uid}


# ------------------------------------------------------------ for attribution

def sharers_map(reservations, sharing: Sharing) -> dict[str, frozenset[int]]:
    """Booking id -> the uids it is shared with (only bookings that are)."""
    out = {}
    for r in reservations:
        if r.shared_with and r.cancelled_at is None:
            uids = sharing.uids(r)
            if uids:
                out[r.id] = uids
    return out


def expand(reservations, sharers: dict[str, frozenset[int]]) -> list:
    """The bookings as process attribution should judge them: each shared
    booking also as one *shadow* per user it is shared with (that user's,
    the same GPUs and window), so their processes on its GPUs are ``ok``.
    Only for judging processes (``telemetry.attribute_all``, the
    enforcer's grants): a shadow holds no capacity and is never written."""
    if not sharers:
        return list(reservations)
    out = list(reservations)
    for r in reservations:
        for uid in sorted(sharers.get(r.id, ())):
            out.append(r.replace(id=f"{r.id}+{uid}", uid=uid, shared_with=()))
    return out


def as_owner(attributions: dict, snapshot, reservations, sharers: dict[str, frozenset[int]], now: int) -> dict:
    """``attributions`` with each sharer's ``ok`` process on a running shared
    booking's GPU credited to the booking's owner, for the activity judge
    (``bk.core.activity``): the booking is in use when anyone it is shared
    with works on it.  A process of someone who has a booking of their own
    on that GPU stays theirs."""
    if not sharers:
        return attributions
    from bk.core.telemetry import Attribution

    running = [r for r in reservations if r.id in sharers and r.start <= now < r.end]
    if not running:
        return attributions
    own = {(g, r.uid) for r in reservations if r.cancelled_at is None and r.start <= now < r.end
           and r.id not in {x.id for x in running} for g in r.gpus}
    out = dict(attributions)
    for g in snapshot.gpus:
        for p in g.processes or ():
            a = attributions.get((g.index, p.pid))
            uid = getattr(a, "uid", None) if a is not None and not isinstance(a, str) else p.uid
            state = a if isinstance(a, str) else getattr(a, "state", None)
            if state != "ok" or uid is None or (g.index, uid) in own:
                continue
            for r in running:
                if g.index in r.gpus and uid in sharers[r.id]:
                    out[(g.index, p.pid)] = Attribution("ok", getattr(a, "identity", None), r.uid)
                    break
    return out
