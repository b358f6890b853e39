"""The writer's ledger document, put together from parts (pure).

The facts.  A commit writes the whole ledger, 2 MB at 10,000 bookings, and
a transaction changes a few records of it: a booking appends one, a
cancellation or an edit replaces one where it stood.  JSON's compact form
of a list is its members' forms joined by commas, and every key of the
document is written sorted (``ledgerdoc.encode``), so the document is its
top-level parts laid end to end, and its seal (``ledgerdoc.seal``) is a
CRC-32 of them.  CRC-32 is linear over GF(2): the CRC of ``A + B`` follows
from the CRC of ``A``, the CRC of ``B`` and the length of ``B`` (zlib's
``crc32_combine``, which Python's zlib does not offer: ``_combine`` here,
about 50 us in Python), and ``zlib.crc32(B, crc_of_A)`` carries a CRC
forward over bytes that follow.

The consequences.  Joining 10,000 records' bytes and hashing 2 MB on every
commit costs about 1 ms, most of it spent on bytes the commit before
already joined and hashed.  So the writer keeps, besides each record's own
bytes (``Encoded``), each list as a ``Rope``: a few chunks of joined
records, with the index of the first record in each and the CRC of the
list's text up to the end of each.  A transaction that appends adds one
chunk; one that changes records from position ``i`` on rebuilds from the
chunk that holds ``i`` (a change near the start: the whole list, as
before); past ``MAX_CHUNKS`` the chunks are joined into one.  The document
is then a few dozen parts copied once into its buffer, and its seal the
CRC of the small parts carried forward and of each large list combined.

``document(...)`` is ``seal(dumps(encode(...)))`` byte for byte, whatever
the ropes it was given (tests/test_store_kept.py holds it to that on long
random runs); only the writer imports this module.
"""

from __future__ import annotations

import zlib
from bisect import bisect_right
from itertools import compress, count
from operator import is_not

from bk.core.ledgerdoc import (
    _SEAL,
    _TOP_KEYS,
    FORMAT,
    VERSION,
    Delta,
    _encode_json,
    canonical,
    reservation_to_dict,
)
from bk.core.models import LedgerState, OpRecord, Reservation
from bk.core.utctime import format_utc

MAX_CHUNKS = 32            # chunks of one list before they are joined into one
COMBINE_MIN = 1 << 16      # below this many bytes a list's CRC is carried forward, not combined

# --- CRC-32 arithmetic (zlib's crc32_combine, as zlib 1.2.12 writes it) -------

_POLY = 0xEDB88320         # the CRC-32 polynomial, bit-reflected as zlib uses it


def _multmodp(a: int, b: int) -> int:
    """a times b modulo the polynomial (bit-reflected: x^0 is the top bit)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if not a & (m - 1):
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> tuple[int, ...]:
    table, p = [], 1 << 30          # x^1
    for _ in range(32):
        table.append(p)
        p = _multmodp(p, p)          # x^(2^(k+1))
    return tuple(table)


_X2N = _x2n_table()                 # x^(2^k) modulo the polynomial


def _combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of A + B from crc1 = CRC(A), crc2 = CRC(B), len2 = len(B)."""
    p, k, n = 1 << 31, 3, len2      # x^(8 * len2): a byte is eight shifts
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return _multmodp(p, crc1) ^ crc2


# --- one list as chunks ---------------------------------------------------------

class Rope:
    """The text of one JSON list, ``[`` and its members joined by commas
    (the closing ``]`` is the document's), as chunks: ``starts[k]`` is the
    index of the first record whose bytes chunk ``k`` holds (chunk 0 begins
    with ``[``), ``crcs[k]`` the CRC-32 of the text through chunk ``k``.
    Never changed once made."""

    __slots__ = ("chunks", "starts", "crcs", "size", "count")

    def __init__(self, chunks: tuple, starts: tuple, crcs: tuple, size: int, count: int):
        self.chunks, self.starts, self.crcs, self.size, self.count = chunks, starts, crcs, size, count

    @classmethod
    def of(cls, frags: list[bytes]) -> Rope:
        text = b"[" + b",".join(frags)
        return cls((text,), (0,), (zlib.crc32(text),), len(text), len(frags))

    def next(self, frags: list[bytes], same: int) -> Rope:
        """The rope of ``frags``, whose first ``same`` records have the bytes
        of this rope's first ``same``."""
        n = len(frags)
        if same >= self.count:
            if n == self.count:
                return self
            # Appended: one chunk more, after every chunk there is.
            piece = (b"," if self.count else b"") + b",".join(frags[self.count:])
            chunks, starts, crcs = self.chunks + (piece,), self.starts + (self.count,), \
                self.crcs + (zlib.crc32(piece, self.crcs[-1]),)
            size = self.size + len(piece)
        else:
            k = bisect_right(self.starts, same) - 1        # the chunk that holds record ``same``
            start = self.starts[k]
            chunks, starts, crcs = self.chunks[:k], self.starts[:k], self.crcs[:k]
            size = self.size - sum(map(len, self.chunks[k:]))
            if k == 0:
                piece = b"[" + b",".join(frags)
            elif start < n:
                piece = (b"," if start else b"") + b",".join(frags[start:])
            else:
                piece = None                              # the records of chunk k and after are gone
            if piece is not None:
                chunks, starts = chunks + (piece,), starts + (start,)
                crcs += (zlib.crc32(piece, crcs[-1] if crcs else 0),)
                size += len(piece)
        if len(chunks) > MAX_CHUNKS:
            return Rope((b"".join(chunks),), (0,), (crcs[-1],), size, n)
        return Rope(chunks, starts, crcs, size, n)

    def put(self, parts: list, crc: int) -> int:
        """Append the chunks and ``]`` to ``parts``; the CRC of the document
        so far (``crc``: up to the chunks) carried over them."""
        parts.extend(self.chunks)
        parts.append(b"]")
        if self.size >= COMBINE_MIN:
            crc = _combine(crc, self.crcs[-1], self.size)
        else:
            for chunk in self.chunks:
                crc = zlib.crc32(chunk, crc)
        return zlib.crc32(b"]", crc)


# --- the records' bytes ---------------------------------------------------------

def _reservation_bytes(r: Reservation) -> bytes:
    return _encode_json(reservation_to_dict(r)).encode("ascii")


def _op_bytes(o: OpRecord) -> bytes:
    return _encode_json(canonical(o.to_dict())).encode("ascii")


class Encoded:
    """The bytes of each booking and op record of one committed state, in
    the order of its lists (which this object holds: they must not change),
    and the lists' ropes: records are frozen, so a record's bytes never go
    stale, and the next ``document`` encodes only the records its
    transaction added and joins only the chunks they fall in."""

    __slots__ = ("reservations", "ops", "reservation_bytes", "op_bytes", "reservation_rope", "op_rope")

    def __init__(self, reservations: list, ops: list, reservation_bytes: list[bytes], op_bytes: list[bytes],
                 reservation_rope: Rope | None = None, op_rope: Rope | None = None):
        self.reservations, self.ops = reservations, ops
        self.reservation_bytes, self.op_bytes = reservation_bytes, op_bytes
        self.reservation_rope = reservation_rope or Rope.of(reservation_bytes)
        self.op_rope = op_rope or Rope.of(op_bytes)

    def __len__(self) -> int:
        return len(self.reservation_bytes) + len(self.op_bytes)

    def bound(self, reservations: list, ops: list) -> Encoded:
        """The same bytes for lists holding the same records (a copy's)."""
        return Encoded(reservations, ops, self.reservation_bytes, self.op_bytes, self.reservation_rope,
                       self.op_rope)


def _list_bytes(old: list, old_bytes: list[bytes], rope: Rope, new: list, delta: Delta | None,
                to_bytes) -> tuple[list[bytes], Rope]:
    """The bytes of ``new``'s records and their rope, from ``old``'s."""
    if delta is None or delta.old is not old or delta.new is not new:
        delta = Delta.of(old, new)
    if delta is None:                        # a record twice: encode it twice
        frags = list(map(to_bytes, new))
        return frags, Rope.of(frags)
    n = min(len(old), len(new))
    if delta.at is not None:
        same = delta.at[0] if delta.at else n
    else:                                    # the first position that differs, at C speed
        same = next(compress(count(), map(is_not, old, new)), n)
    frags = delta.encoded(old_bytes, to_bytes)
    return frags, rope.next(frags, same)


def document(state: LedgerState, *, commit: str, written_at: int, journal: list[dict],
             known: Encoded | None = None, delta: Delta | None = None,
             frame=None) -> tuple[bytearray, Encoded | None]:
    """``seal(dumps(encode(...)))``, byte for byte, and its ``Encoded``.
    With ``known`` (the ``Encoded`` of the state this one was made from)
    only the records the transaction added are encoded and only the chunks
    they fall in joined (module docstring); ``delta``: the bookings'
    ``Delta`` from ``known.reservations`` (or ``frame``'s), if the caller
    has it.  With ``frame`` instead (a ``ledgerframe.Framed`` of the sealed
    bytes that state was read from), the bookings the transaction left as
    they were are those bytes (``Framed.splice``), and there is no
    ``Encoded`` (None) when they were used."""
    spliced = None
    if known is None:
        ops_bytes = list(map(_op_bytes, state.ops))
        ops_rope = Rope.of(ops_bytes)
        if frame is not None:
            spliced = frame.splice(state.reservations, delta)
        if spliced is None:
            res_bytes = list(map(_reservation_bytes, state.reservations))
            res_rope = Rope.of(res_bytes)
    else:
        res_bytes, res_rope = _list_bytes(known.reservations, known.reservation_bytes, known.reservation_rope,
                                          state.reservations, delta, _reservation_bytes)
        ops_bytes, ops_rope = _list_bytes(known.ops, known.op_bytes, known.op_rope, state.ops, None, _op_bytes)
    parts: list = []
    crc = 0
    for key, value in _top(state, commit, written_at, journal, ops_rope,
                           res_rope if spliced is None else _SPLICED):
        head = (b"," if parts else b"{") + _encode_json(key).encode("ascii") + b":"
        if type(value) is Rope:
            parts.append(head)
            crc = value.put(parts, zlib.crc32(head, crc))
        elif value is _SPLICED:
            for piece in (head + b"[", *spliced, b"]"):
                parts.append(piece)
                crc = zlib.crc32(piece, crc)
        else:
            piece = head + _encode_json(value).encode("ascii")
            parts.append(piece)
            crc = zlib.crc32(piece, crc)
    parts.append(b'%s%08x"}\n' % (_SEAL, crc))
    data = bytearray().join(parts)
    if spliced is not None:
        return data, None
    return data, Encoded(state.reservations, state.ops, res_bytes, ops_bytes, res_rope, ops_rope)


_SPLICED = object()        # the bookings' place in ``_top`` when they are a frame's bytes


def _top(state: LedgerState, commit: str, written_at: int, journal: list[dict], ops, reservations):
    """The document's top-level (key, value) pairs in the order written,
    with ``ops`` and ``reservations`` as given (ropes, or markers)."""
    doc = {
        "blackouts": [canonical(b.to_dict()) for b in state.blackouts],
        "commit": commit, "format": FORMAT,
        "journal": {"audit": canonical(journal), "seq": state.seq},
        "notices": [canonical(n.to_dict()) for n in state.notices],
        "ops": ops, "policy": canonical(state.policy), "reservations": reservations,
        "seq": state.seq, "version": VERSION, "written_at": format_utc(written_at),
    }
    if state.extra:
        extra = {k: canonical(v) for k, v in state.extra.items() if k not in _TOP_KEYS}
        extra.update(doc)
        doc = extra
    return sorted(doc.items())


def framing(state: LedgerState, *, commit: str, written_at: int, journal: list[dict]) -> tuple[bytes, bytes]:
    """The bytes ``document`` writes before the bookings' records (through
    ``"reservations":[``) and after them (from the list's ``]`` up to the
    seal), for ``ledgerframe``."""
    before: list[bytes] = []
    after: list[bytes] = []
    parts = before
    for key, value in _top(state, commit, written_at, journal, Rope.of(list(map(_op_bytes, state.ops))),
                           _SPLICED):
        parts.append((b"," if before else b"{") + _encode_json(key).encode("ascii") + b":")
        if value is _SPLICED:
            parts.append(b"[")
            parts = after
            parts.append(b"]")
        elif type(value) is Rope:
            value.put(parts, 0)
        else:
            parts.append(_encode_json(value).encode("ascii"))
    return b"".join(before), b"".join(after)
