"""How much of the shared ledger one user may fill (pure).

The facts.  Every commit re-reads, checks and re-writes the whole hot
ledger, so its size is every user's write latency; and a booking stays in
it while it is live and for ``archive_after_hours`` (24 h) after it stopped,
cancelled or not.  One user booking and cancelling in a loop with long notes
took the hot ledger from 0.3 to 4.2 MB in a few minutes, and everyone else's
writes from 59 to 622 ms, for a day.

The limits.  Three per UID, counted on the hot ledger the transaction holds
(so they are exact, need no other state, and forget at the pace the ledger
does), checked when a booking is made and when a note is set:

* ``bookings``: live bookings plus cancelled ones still in the hot ledger;
* ``per_minute``: bookings made in the last 60 seconds;
* ``note_bytes``: the UTF-8 bytes of the notes on the user's bookings in
  the hot ledger.

A refusal (``LedgerLimit``, exit 3) names the limit's configuration key, the
user's count and the maximum.  Zero turns a limit off.  The administrator is
exempt, and so is private mode (one user, one ledger: ``Call.limits`` is
None there).  The defaults are far above what a person or a careful script
does in a lab, so nobody notices them until something loops.  A booking
cancelled before it started also gives its note up (``bk.service.booking``):
it never ran, and its note would otherwise sit in the ledger for a day.

These limits protect the ledger, not the GPUs: they are not the scheduler's
rules (``bk.core.scheduler``, with the policy) and do not decide who may
hold which GPUs for how long; such fairness rules sit there, beside these.
"""

from __future__ import annotations

from bk.core.errors import LedgerLimit
from bk.core.record import dataclass
from bk.core.timegrid import counted

WINDOW = 60                   # seconds: what "per minute" means
BOOKINGS_KEY = "ledger_bookings_per_user"
PER_MINUTE_KEY = "ledger_bookings_per_minute"
NOTE_BYTES_KEY = "ledger_note_bytes_per_user"


@dataclass(frozen=True)
class LedgerLimits:
    """One user's share of the hot ledger; 0 means no limit."""

    bookings: int = 200
    per_minute: int = 60
    note_bytes: int = 16384
    kept_hours: int = 24      # archive_after_hours: how long a stopped booking stays


@dataclass(frozen=True)
class Usage:
    bookings: int             # live, plus cancelled still in the hot ledger
    last_minute: int          # made in the last WINDOW seconds
    note_bytes: int
    oldest_recent: int | None  # when the oldest of the last minute's was made


def note_size(note: str | None) -> int:
    return len(note.encode("utf-8", "surrogatepass")) if note else 0


def usage(reservations, uid: int, now: int) -> Usage:
    bookings = last = notes = 0
    oldest = None
    for r in reservations:
        if r.uid != uid:
            continue
        if r.cancelled_at is not None or r.end > now:
            bookings += 1
        if 0 <= now - r.created < WINDOW:
            last += 1
            oldest = r.created if oldest is None else min(oldest, r.created)
        notes += note_size(r.note)
    return Usage(bookings, last, notes, oldest)


def check_new(reservations, uid: int, now: int, limits: LedgerLimits, note: str | None) -> None:
    """Raise ``LedgerLimit`` when ``uid`` may not make one more booking (with ``note``)."""
    u = usage(reservations, uid, now)
    if limits.per_minute and u.last_minute >= limits.per_minute:
        wait = max(1, WINDOW - (now - (u.oldest_recent if u.oldest_recent is not None else now)))
        raise LedgerLimit(
            f"you made {counted(u.last_minute, 'booking')} in the last minute, the most one user may make "
            f"({PER_MINUTE_KEY} {limits.per_minute})",
            hint=f"retry in {wait} s; a script that books in a loop should pause between bookings",
            details=_details(PER_MINUTE_KEY, u.last_minute, limits.per_minute, uid, retry_after=wait))
    if limits.bookings and u.bookings >= limits.bookings:
        raise LedgerLimit(
            f"you have {counted(u.bookings, 'booking')} live or cancelled in the last "
            f"{counted(limits.kept_hours, 'hour')}, "
            f"the most one user may keep in the ledger ({BOOKINGS_KEY} {limits.bookings})",
            hint=f"a cancelled booking leaves the ledger {counted(limits.kept_hours, 'hour')} after it stops; "
                 "cancel fewer, or ask the administrator (bk info)",
            details=_details(BOOKINGS_KEY, u.bookings, limits.bookings, uid))
    _check_notes(u.note_bytes, note_size(note), limits, uid)


def check_note(reservations, uid: int, now: int, limits: LedgerLimits, old: str | None,
               new: str | None) -> None:
    """Raise ``LedgerLimit`` when replacing a booking's note ``old`` by ``new``
    would put ``uid``'s notes over their limit (shortening one never does)."""
    grow = note_size(new) - note_size(old)
    if grow > 0:
        _check_notes(usage(reservations, uid, now).note_bytes - note_size(old), note_size(new), limits, uid)


def _check_notes(held: int, adding: int, limits: LedgerLimits, uid: int) -> None:
    if limits.note_bytes and adding and held + adding > limits.note_bytes:
        raise LedgerLimit(
            f"the notes on your bookings already take {held} bytes of the ledger; this one ({adding} bytes) "
            f"would pass the most one user may keep there ({NOTE_BYTES_KEY} {limits.note_bytes})",
            hint="book without --note or with a shorter one; a booking cancelled before it starts gives its "
                 "note up",
            details=_details(NOTE_BYTES_KEY, held + adding, limits.note_bytes, uid))


def _details(key: str, value: int, limit: int, uid: int, **more) -> dict:
    return {"limit": key, "value": value, "max": limit, "uid": uid, **more}
