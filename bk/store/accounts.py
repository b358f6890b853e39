"""Who is who: login names, uids and Unix groups, asked of the system's
account databases (``pwd``, ``grp``: NSS, so LDAP and SSSD too) and kept a
short while.

Why here.  Limits per group (``bk.core.limits``) and bookings shared with a
group (``bk.core.sharing``) need a user's groups and a group's members; the
rules are pure and take a lookup, and this is the one lookup every process
uses (the CLI, the broker, the monitor, the enforcer).

The facts.  ``getgrnam(g).gr_mem`` lists only the *supplementary* members:
a user whose primary group is ``g`` is not among them, so the members of a
group are ``gr_mem`` plus every account whose ``pw_gid`` is the group's
(``getpwall``, the one scan, done only when a group's members are asked).
A user's groups are ``os.getgrouplist(name, primary gid)``, what ``id``
prints, the same set the kernel gives their login session.  Each lookup
can be slow on a directory service, and the monitor asks every few
seconds, so answers are kept for ``TTL`` seconds (monotonic clock, passed
in): a change of membership is seen within a minute.
"""

from __future__ import annotations

import os

TTL = 60.0


class Accounts:
    """Cached account lookups; ``clock`` is ``time.monotonic`` unless a test
    passes its own."""

    def __init__(self, clock=None):
        if clock is None:
            import time

            clock = time.monotonic
        self._clock = clock
        self._cache: dict[tuple, tuple[float, object]] = {}

    def _get(self, key: tuple, compute):
        now = self._clock()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < TTL:
            return hit[1]
        value = compute()
        self._cache[key] = (now, value)
        return value

    def uid_of(self, name: str) -> int | None:
        def look():
            import pwd

            try:
                return pwd.getpwnam(name).pw_uid
            except (KeyError, OSError):
                return None
        return self._get(("uid", name), look)

    def name_of(self, uid: int) -> str | None:
        from bk.users import user_name

        return self._get(("name", uid), lambda: user_name(uid))

    def groups_of(self, user: str) -> frozenset[str]:
        """The names of ``user``'s groups, the primary one included."""
        def look():
            import grp
            import pwd

            try:
                gid = pwd.getpwnam(user).pw_gid
                gids = os.getgrouplist(user, gid)
            except (KeyError, OSError):
                return frozenset()
            out = set()
            for g in gids:
                try:
                    out.add(grp.getgrgid(g).gr_name)
                except (KeyError, OSError):
                    continue
            return frozenset(out)
        return self._get(("groups", user), look)

    def group_exists(self, group: str) -> bool:
        def look():
            import grp

            try:
                grp.getgrnam(group)
                return True
            except (KeyError, OSError):
                return False
        return self._get(("group", group), look)

    def members_of(self, group: str) -> frozenset[int]:
        """The uids of ``group``'s members: supplementary and primary."""
        def look():
            import grp
            import pwd

            try:
                g = grp.getgrnam(group)
            except (KeyError, OSError):
                return frozenset()
            out = set()
            for name in g.gr_mem:
                uid = self.uid_of(name)
                if uid is not None:
                    out.add(uid)
            try:
                out.update(p.pw_uid for p in pwd.getpwall() if p.pw_gid == g.gr_gid)
            except OSError:
                pass
            return frozenset(out)
        return self._get(("members", group), look)


_shared: Accounts | None = None


def accounts() -> Accounts:
    """The process's one cache (the broker and the monitor live long).
    Tests that play users the system does not have put a fake with the
    same four methods in ``_shared``."""
    global _shared
    if _shared is None:
        _shared = Accounts()
    return _shared
