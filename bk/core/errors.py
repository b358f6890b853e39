"""Every error bk reports, with its stable code and exit status.

One table (SPEC section 6.4) decides how a failure looks to a shell script
(the exit status) and to a program (``error.code`` in the JSON envelope).
Each error is a class so that code raises what happened, and the front end
(CLI, broker, MCP) turns it into an exit status or an envelope without
knowing the details.  Only the top of each front end catches broadly.
"""

from __future__ import annotations

# Exit statuses.  The man page's EXIT STATUS section is checked against this.
EXIT_OK = 0
EXIT_PARTIAL = 1
EXIT_USAGE = 2
EXIT_CAPACITY = 3
EXIT_NOT_FOUND = 4
EXIT_PERMISSION = 5
EXIT_UNAVAILABLE = 69
EXIT_INTERNAL = 70
EXIT_IO = 74
EXIT_TEMPFAIL = 75
EXIT_WRONG_ACCOUNT = 77
EXIT_CONFIG = 78

EXIT_TABLE: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "success"),
    (EXIT_PARTIAL, "finished, but a check failed or a result is partial"),
    (EXIT_USAGE, "usage error or invalid input"),
    (EXIT_CAPACITY, "no capacity or refused by policy"),
    (EXIT_NOT_FOUND, "not found (no such reservation, preset, job)"),
    (EXIT_PERMISSION, "permission denied (another user's booking, administrator-only)"),
    (EXIT_UNAVAILABLE, "service unavailable (broker not reachable, NVML required but missing)"),
    (EXIT_INTERNAL, "internal error (a bug)"),
    (EXIT_IO, "I/O error (disk full, unreadable ledger with no valid backup)"),
    (EXIT_TEMPFAIL, "temporary failure (lock busy); retrying can succeed"),
    (EXIT_WRONG_ACCOUNT, "a daemon started under the wrong account"),
    (EXIT_CONFIG, "configuration error (untrusted config, policy mismatch with the ledger)"),
)


class BkError(Exception):
    """Base class: a failure the user can understand and act on."""

    code = "internal"
    exit_code = EXIT_INTERNAL

    def __init__(self, message: str, hint: str | None = None, *, details: dict | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = details or {}

    def to_json(self) -> dict:
        out: dict = {"code": self.code, "message": self.message, "hint": self.hint}
        if self.details:
            out["details"] = self.details
        return out


class InvalidInput(BkError):
    """Bad words from the user: a duration, a time, a flag value."""

    code = "invalid_input"
    exit_code = EXIT_USAGE


class UsageError(InvalidInput):
    """The command line itself is wrong (unknown command, missing argument)."""


class Ambiguous(BkError):
    """An ID prefix matches several reservations."""

    code = "ambiguous"
    exit_code = EXIT_USAGE


class Conflict(BkError):
    """No capacity for the request (at the exact time asked, or at all)."""

    code = "conflict"
    exit_code = EXIT_CAPACITY


class PolicyRefused(BkError):
    """A policy rule refused the request (horizon, blackout, length, disabled GPU)."""

    code = "policy"
    exit_code = EXIT_CAPACITY


class LedgerLimit(BkError):
    """One user's share of the shared ledger is used up (``bk.core.ledgerlimits``):
    the limit's key, the user's count and the maximum are in ``details``."""

    code = "ledger_limit"
    exit_code = EXIT_CAPACITY


class NotFound(BkError):
    code = "not_found"
    exit_code = EXIT_NOT_FOUND


class PermissionDenied(BkError):
    code = "permission_denied"
    exit_code = EXIT_PERMISSION


class Unavailable(BkError):
    code = "unavailable"
    exit_code = EXIT_UNAVAILABLE


class Internal(BkError):
    code = "internal"
    exit_code = EXIT_INTERNAL


class IOFailure(BkError):
    code = "io_error"
    exit_code = EXIT_IO


class LostCommits(BkError):
    """The audit log witnesses commits the ledger no longer has (it was
    restored from an older backup, or lost): writing on top would forget
    acknowledged bookings for good, so writes stop until someone decides."""

    code = "lost_commits"
    exit_code = EXIT_IO


class Busy(BkError):
    code = "busy"
    exit_code = EXIT_TEMPFAIL


class WrongAccount(BkError):
    code = "wrong_account"
    exit_code = EXIT_WRONG_ACCOUNT


class ConfigError(BkError):
    code = "config"
    exit_code = EXIT_CONFIG


# Each code names exactly one class, and so one exit status: an error that
# crossed a process boundary as (code, message, hint) is rebuilt as the class
# that raised it (the broker's replies, ``error_from``).  ``UsageError``
# refines ``InvalidInput`` and keeps its code and status: for scripts both are
# "invalid input" (exit 2); only the CLI's own parser tells them apart.
BY_CODE: dict[str, type[BkError]] = {cls.code: cls for cls in (
    InvalidInput, Conflict, PolicyRefused, NotFound, Ambiguous, PermissionDenied, Unavailable,
    Internal, IOFailure, LostCommits, Busy, WrongAccount, ConfigError, LedgerLimit,
)}

ERROR_CODES = tuple(BY_CODE)


def error_from(code: object, message: object, hint: object = None, details: object = None) -> BkError:
    """The error that ``to_json()`` described, as its own class (``Internal``
    for a code this bk does not know); fields of the wrong type are dropped."""
    cls = BY_CODE.get(code, Internal) if isinstance(code, str) else Internal
    return cls(message if isinstance(message, str) else f"{cls.code} (no message was given)",
               hint if isinstance(hint, str) else None,
               details=details if isinstance(details, dict) else None)
