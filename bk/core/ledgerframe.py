"""Where a sealed ledger's bookings lie in its bytes, for a writer that did not write them (pure).

A writer that committed a ledger keeps the bytes of its records
(``docparts.Encoded``) and encodes only what its next transaction adds.
A writer that only read the file (every ``bk`` command in private mode, a
broker's first commit) had nothing kept, and encoded every booking again:
at 10,000 bookings that was a third of a booking's time.  The bytes were
there all along: ``Framed`` says where, and ``docparts.document`` puts
the new document together from them and the records the transaction
added or changed.  Only writes load this module.
"""

from __future__ import annotations

from bk.core import docparts, ledgerdoc
from bk.core.models import LedgerState

MAX_SPLICED = 8      # bookings a transaction may have changed in place for Framed.splice


class Framed:
    """Where the bookings' records lie in the sealed bytes of a ledger
    read whole, found by writing the rest of the document again from the
    state read (``framed``): what a writer that did not commit those bytes
    itself needs so as not to encode every booking again.

    Why the bytes between are the bookings.  The parts before and after
    them are exactly what ``docparts.document`` writes for that state, so
    they are the document's own head and tail (the top-level object in its
    sorted order), and what lies between is the one list ``document`` puts
    there; a second top-level "reservations" key inside it (no bk writes
    one) is refused (``framed`` gives None).  A sealed document's bytes
    are what a writer checked and wrote (``ledgerdoc.seal``), and every bk
    writer writes a record as ``ledgerdoc.reservation_to_dict`` does, so
    they are the records' bytes: ``splice`` keeps them, and finds a record
    it takes out by those bytes, written once more, which must stand
    exactly once in the list, between two of its commas (or its ends);
    anything else, and the bookings are encoded in full.  So the document
    is, byte for byte, the one the full encoder writes."""

    __slots__ = ("data", "lo", "hi", "reservations")

    def __init__(self, data: bytes, lo: int, hi: int, reservations: list):
        self.data, self.lo, self.hi = data, lo, hi       # data[lo:hi]: the records, comma-separated
        self.reservations = reservations                 # the list they decoded to (must not change)

    def splice(self, new: list, delta: ledgerdoc.Delta | None = None) -> list | None:
        """The records of ``new`` as parts of the list (without its
        brackets), from those of ``reservations``: the ones a transaction
        added at the end or put in place of others (``Delta.at``) are
        encoded, the rest are these bytes; None when the change is another
        (bookings taken away), too wide, or a record is not found."""
        old = self.reservations
        if delta is None or delta.old is not old or delta.new is not new:
            delta = ledgerdoc.Delta.of(old, new)
        if delta is None or delta.at is None or len(new) < len(old) or len(delta.at) > MAX_SPLICED:
            return None
        data, view = self.data, memoryview(self.data)
        parts, at = [], self.lo
        for i in delta.at:
            b = docparts._reservation_bytes(old[i])
            p = data.find(b, at, self.hi)
            q = p + len(b)
            if (p < 0 or data.count(b, self.lo, self.hi) != 1 or (p != self.lo and data[p - 1] != 44)
                    or (q != self.hi and data[q] != 44)):          # 44: ","
                return None
            parts.append(view[at:p])
            parts.append(docparts._reservation_bytes(new[i]))
            at = q
        parts.append(view[at:self.hi])
        tail = new[len(old):]
        if tail:
            more = b",".join(map(docparts._reservation_bytes, tail))
            parts.append(b"," + more if old else more)
        return parts


def framed(data: bytes, state: LedgerState, meta: ledgerdoc.DocMeta) -> Framed | None:
    """The ``Framed`` of ``data``, the sealed bytes ``state`` and ``meta``
    were decoded from whole; None when they are not what
    ``docparts.document`` writes around the records."""
    if meta.commit is None or meta.written_at is None or meta.journal_seq != state.seq:
        return None
    try:
        head, tail = docparts.framing(state, commit=meta.commit, written_at=meta.written_at, journal=meta.journal)
    except (TypeError, ValueError, RecursionError):
        return None
    lo, hi = len(head), len(data) - ledgerdoc._SEAL_LEN - len(tail)
    if (hi < lo or not data.startswith(head) or data[hi:len(data) - ledgerdoc._SEAL_LEN] != tail
            or data.find(b'"reservations":[', lo, hi) >= 0):
        return None
    return Framed(data, lo, hi, state.reservations)
