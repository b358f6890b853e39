"""The words of the screen: the help page and the guided tour.

Kept apart from the drawing so ``bk tutorial --tui`` can print the same
tour without a terminal."""

from __future__ import annotations

HELP = (
    ("Look", (
        ("Left Right  h l", "move the cursor in time (the window pans at the edges)"),
        ("PgUp PgDn  < >", "pan half a window into the past or the future"),
        ("+ -  z Z", "zoom in and out: 5 minutes to 1 day per column"),
        ("Home  n  .", "back to now"),
        ("Up Down", "choose a GPU (its live state shows below the table)"),
        ("Tab  j k", "choose a booking in the table"),
        ("Enter", "go to the chosen booking on the timeline"),
    )),
    ("Change", (
        ("a", "add a booking at the cursor (on the cursor's GPU)"),
        ("e", "edit the chosen booking (yours)"),
        ("d  Del", "cancel the chosen booking (asks first)"),
        ("K", "keep the chosen running booking 4 hours: no idle nudge, no idle release"),
        ("in a form: Up Down Tab", "choose a field: start, duration, GPUs, mode, share, memory"),
        ("in a form: Left Right", "change it (one column step; GPUs: choose one)"),
        ("in a form: Space 0-9", "toggle a GPU; Space also switches mode and share"),
        ("in a form: = or type", "type a value: 20:00, +30m, 1h30m, 12g, auto"),
        ("in a form: x  f", "shared or exclusive; find the earliest slot for this many GPUs"),
        ("in a form: Enter  Esc", "book or save (checked again); leave without a change"),
    )),
    ("Screen", (
        ("T", "dark or light theme"),
        ("r", "read the bookings again now (they refresh every second anyway)"),
        ("t", "the guided tour"),
        ("?", "this help (any key closes it)"),
        ("q", "quit"),
    )),
)

LEGEND_UNICODE = "a-z yours · 1-9 others' share slots · █ full · # blackout · x disabled · + draft · ! conflict"
LEGEND_ASCII = "a-z yours; 1-9 others' share slots; @ full; # blackout; x disabled; + draft; ! conflict"

TOUR = (
    ("The timeline",
     "Every GPU is a row, time runs left to right, one column is the step shown in the header. "
     "The marker under the time labels is now. Left of it is the past (read-only), right of it "
     "the future. Press + and - to zoom, PgUp and PgDn to pan, n to come back to now."),
    ("Reading a cell",
     "Your bookings are letters (a, b, ... as in the table below; upper case where the GPU is "
     "full). Other people's show how many share slots they hold, or a full block when the GPU "
     "is full or taken exclusively. # is an administrator's blackout, x a disabled GPU, a dot "
     "is free for the whole column."),
    ("The table and the GPU",
     "Below the timeline every booking in view is listed with the shortest ID that names it. "
     "Tab moves into the table, Up and Down choose a booking. Up and Down on the timeline "
     "choose a GPU; its live state (use, memory, processes) shows under the table when a "
     "monitor or the GPUs can tell."),
    ("Booking",
     "Press a to draw a booking at the cursor. Up and Down choose a field, Left and Right "
     "change it, Space or a digit toggles GPUs, x switches shared and exclusive, f finds the "
     "earliest slot for as many GPUs, Enter books. The draft shows as + on the timeline, ! "
     "where it would not fit. The server checks again when you book: if someone took the "
     "slot meanwhile you are told why and nothing is booked."),
    ("Changing and cancelling",
     "Choose one of your bookings and press e to edit it (once it runs, only its end may "
     "move) or d to cancel it (you are asked first). Everything you do here is what bk e "
     "and bk d do, so bk l shows it at once."),
    ("More",
     "T switches between dark and light, ? lists every key, q quits. The header shows the "
     "monitor and your worker, the line under it announcements. Run bk tutorial --tui to see "
     "this tour again, or press t."),
)


def _wrap(s: str, w: int) -> list[str]:
    out, cur = [], ""
    for word in s.split():
        if cur and len(cur) + 1 + len(word) > w:
            out.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    return [*out, cur] if cur else out or [""]


def help_lines(width: int, unicode: bool) -> list[tuple[str, str]]:
    """The help page's lines at ``width`` as (text, kind)."""
    body: list[tuple[str, str]] = []
    keyw = max(len(k) for _, rows in HELP for k, _ in rows) + 2
    for title, rows in HELP:
        body.append((title, "title"))
        for k, what in rows:
            for i, part in enumerate(_wrap(what, max(10, width - 6 - keyw))):
                body.append(((k if i == 0 else "").ljust(keyw) + part, "normal"))
    body.append(("", "normal"))
    body += [(line, "keys") for line in _wrap(LEGEND_UNICODE if unicode else LEGEND_ASCII, width - 6)]
    return body


def help_pages(width: int, height: int) -> int:
    per = max(1, height - 3)
    return -(-len(help_lines(width, True)) // per)
