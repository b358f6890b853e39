"""What ``bk l`` (and the agent's ``list``: one row, ``views._serve_list``)
and the agent's ``context`` show of issue 27: the bookings others shared
with you.  A booking shared with you is listed after your
own, without a number (numbers name your own bookings in every command:
``bk d 1`` never means someone else's); ``bk run -r ID`` runs on it.
"""

from __future__ import annotations

from bk.core import sharing


def shared_with_me(state, call) -> list:
    """Others' current and upcoming bookings that the caller may use."""
    cands = [r for r in state.reservations
             if r.shared_with and r.uid != call.actor.uid and r.is_live(call.now)]
    if not cands:
        return []
    groups: frozenset = frozenset()
    if any(e.startswith("@") for r in cands for e in r.shared_with):
        from bk.store.accounts import accounts

        groups = accounts().groups_of(call.actor.user)
    mine = [r for r in cands if sharing.may_use(r, call.actor.uid, call.actor.user, groups)]
    return sorted(mine, key=lambda r: (r.start, r.created))


def may_use(r, call) -> bool:
    """Whether the caller may use (run on) ``r``: theirs, or shared with them."""
    if r.uid == call.actor.uid:
        return True
    if not r.shared_with:
        return False
    groups: frozenset = frozenset()
    if any(e.startswith("@") for e in r.shared_with):
        from bk.store.accounts import accounts

        groups = accounts().groups_of(call.actor.user)
    return sharing.may_use(r, call.actor.uid, call.actor.user, groups)


def expanded(reservations) -> list:
    """The bookings as process attribution judges them: a shared booking
    also as its sharers' (``bk.core.sharing.expand``); the account lookups
    only when some booking is shared."""
    if not any(r.shared_with for r in reservations):
        return reservations
    from bk.core.sharing import Sharing, expand, sharers_map
    from bk.store.accounts import accounts

    return expand(reservations, sharers_map(reservations, Sharing(accounts())))
