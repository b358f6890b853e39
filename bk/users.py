"""The account seam: the one place that turns a UID into an account name.

``pwd.getpwuid`` raises ``KeyError`` for a UID the password database does
not know (a user deleted while their bookings or processes live on, a
container's UID); callers differ only in what they show then (``1234``,
``uid 1234``, nothing), so the lookup answers ``None`` and each caller says
its own fallback: ``user_name(uid) or str(uid)``.
"""

from __future__ import annotations


def user_name(uid: int) -> str | None:
    """The account name of ``uid``, or ``None`` when no account has it."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError, OSError):   # no such account; a UID past uid_t; NSS failed
        return None
