"""Bookings as an RFC 5545 calendar feed (``.ics``).

The facts that shape it:

* Calendar clients that subscribe to a feed (Google Calendar, Outlook,
  Thunderbird, Apple Calendar) refetch it now and then and match events by
  ``UID``; Google drops a feed it cannot parse without saying so.  So each
  booking has one UID for life (its reservation id, ``ID@gpubk``), every
  line ends in CRLF, no content line is longer than 75 octets (RFC 5545
  3.1: longer ones are folded, CRLF and one space, and a fold never splits
  a UTF-8 sequence), and TEXT values escape ``\\``, ``;``, ``,`` and line
  breaks (3.3.11).  The tests parse every feed with a real RFC 5545 library.
* A client takes a changed event only when its ``SEQUENCE`` grew: it is the
  number of recorded edits of the booking plus one for its cancellation
  (``bk.service.exports.sequence``), so it grows with every change, from
  the ledger itself, the same on every run.
* Without ``METHOD``, ``DTSTAMP`` is when the event's information was last
  revised (3.8.7.2): the booking's last change, like ``LAST-MODIFIED``.
  So a feed of unchanged bookings is the same bytes every minute, and a
  client or web server can tell nothing changed.
* Times are UTC (``...Z``): an instant, whichever zone the server, the
  feed and each subscriber are in; every client shows them in its own
  zone, daylight saving time included, so no VTIMEZONE is needed.
* A booking cancelled before it began is ``STATUS:CANCELLED`` (clients
  strike it out or remove it).  One cancelled while it ran did run: its
  event ends at the cancellation, and says it was released early.
* Text others wrote (notes, user names, reasons) first passes the
  project's one text policy (``bk.core.safetext.safe``): control and
  format characters become visible escapes, which TEXT then escapes again.
"""

from __future__ import annotations

from bk.core.safetext import safe
from bk.export.model import Export

PRODID = "-//gpubk//bk//EN"
MAX_OCTETS = 75
REFRESH = "PT5M"


def escape_text(text: str) -> str:
    """A TEXT value (RFC 5545 3.3.11), after the text policy."""
    # Printable ASCII is what the text policy leaves as it is: skip its walk.
    s = text if text.isascii() and text.isprintable() else safe(text, multiline=True).replace("\t", " ")
    return s.replace("\\", "\\\\").replace(";", "\\;").replace(",", "\\,").replace("\n", "\\n")


def fold(line: str) -> bytes:
    """One content line as octets: CRLF-terminated, folded so that no
    physical line is longer than 75 octets (the CRLF not counted), each fold
    a CRLF and one space, never inside a UTF-8 sequence."""
    whole = line.encode("utf-8")
    if len(whole) <= MAX_OCTETS:           # most lines: nothing to fold
        return whole + b"\r\n"
    if len(whole) == len(line):            # ASCII: every octet is a character
        rest = MAX_OCTETS - 1
        parts = [whole[:MAX_OCTETS]] + [whole[i:i + rest] for i in range(MAX_OCTETS, len(whole), rest)]
        return b"\r\n ".join(parts) + b"\r\n"
    out = bytearray()
    width = 0
    limit = MAX_OCTETS
    for ch in line:
        b = ch.encode("utf-8")
        if width + len(b) > limit:
            out += b"\r\n "
            width = 1
            limit = MAX_OCTETS
        out += b
        width += len(b)
    out += b"\r\n"
    return bytes(out)


def stamp(t: int) -> str:
    """A UTC DATE-TIME: ``20261025T003000Z``."""
    from bk.core.utctime import format_utc

    iso = format_utc(t)                      # 2026-10-25T00:30:00Z
    return iso[0:4] + iso[5:7] + iso[8:10] + "T" + iso[11:13] + iso[14:16] + iso[17:19] + "Z"


def _gpus(gpus) -> str:
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ",".join(str(g) for g in gpus)


def render(data: Export, *, name: str, busy: bool = True, cache: dict | None = None) -> bytes:
    """The feed of every booking and maintenance window in ``data``.
    ``name`` is the calendar's name (``X-WR-CALNAME``, RFC 7986 ``NAME``);
    ``busy``: the events block the subscriber's free/busy time (a feed of
    one's own bookings) or not (everyone's).  ``cache``: a dict the caller
    keeps between renders (the monitor, every minute): a booking's event is
    a function of the booking record alone, so an unchanged one is not
    made again."""
    head = ["BEGIN:VCALENDAR", "VERSION:2.0", f"PRODID:{PRODID}", "CALSCALE:GREGORIAN",
            f"NAME:{escape_text(name)}", f"X-WR-CALNAME:{escape_text(name)}",
            f"REFRESH-INTERVAL;VALUE=DURATION:{REFRESH}", f"X-PUBLISHED-TTL:{REFRESH}"]
    out = [fold(line) for line in head]
    for b in data.bookings:
        # What the event says, and nothing else (a running booking's activity
        # and energy change every minute; its event does not).
        key = (b.id, b.user, b.mode, b.gpus, b.slots, b.start, b.end, b.created, b.updated, b.sequence,
               b.cancelled_at, b.note, data.host, data.capacity, busy)
        got = cache.get(key) if cache is not None else None
        if got is None:
            got = b"".join(fold(line) for line in _event(b, data, busy))
            if cache is not None:
                cache[key] = got
        out.append(got)
    for w in data.windows:
        out.append(b"".join(fold(line) for line in _window(w, data)))
    out.append(fold("END:VCALENDAR"))
    return b"".join(out)


def _event(b, data: Export, busy: bool) -> list[str]:
    end = b.end
    cancelled = b.cancelled_at is not None and b.cancelled_at <= b.start
    early = b.cancelled_at is not None and not cancelled
    if early:
        end = max(b.cancelled_at, b.start + 60)
    mode = "exclusive" if b.mode == "exclusive" else f"shared {b.slots}/{data.capacity}"
    user = _shown(b.user)
    desc = [f"Booking {b.short_id} of {user} on {_shown(data.host)}: {_gpus(b.gpus)}, {mode}."]
    if early:
        desc.append(f"Released early at {stamp(b.cancelled_at)}; it was booked until {stamp(b.end)}.")
    if cancelled:
        desc.append("Cancelled.")
    if b.note:
        desc.append(f"Note: {b.note}")
    desc.append(f"Change it: bk e {b.short_id}; cancel it: bk d {b.short_id}")
    return ["BEGIN:VEVENT", f"UID:{b.id}@gpubk", f"DTSTAMP:{stamp(b.updated)}",
            f"CREATED:{stamp(b.created)}", f"LAST-MODIFIED:{stamp(b.updated)}",
            f"SEQUENCE:{b.sequence}", f"DTSTART:{stamp(b.start)}", f"DTEND:{stamp(end)}",
            f"SUMMARY:{escape_text(f'{user}: {_gpus(b.gpus)} ({mode})')}",
            f"DESCRIPTION:{escape_text(chr(10).join(desc))}",
            f"LOCATION:{escape_text(data.host)}", "CATEGORIES:GPU booking",
            f"STATUS:{'CANCELLED' if cancelled else 'CONFIRMED'}",
            f"TRANSP:{'OPAQUE' if busy else 'TRANSPARENT'}", "END:VEVENT"]


def _window(w, data: Export) -> list[str]:
    return ["BEGIN:VEVENT", f"UID:{w.id}@gpubk-maintenance",
            f"DTSTAMP:{stamp(w.updated if w.updated is not None else w.start)}",
            f"SEQUENCE:{w.sequence}", f"DTSTART:{stamp(w.start)}", f"DTEND:{stamp(w.end)}",
            f"SUMMARY:{escape_text('Maintenance on ' + data.host)}",
            f"DESCRIPTION:{escape_text('No GPU can be booked: ' + w.reason)}",
            f"LOCATION:{escape_text(data.host)}", "CATEGORIES:GPU maintenance", "STATUS:CONFIRMED",
            "TRANSP:TRANSPARENT", "END:VEVENT"]


def _shown(text: str) -> str:
    return text if text.isascii() and text.isprintable() else safe(text)
