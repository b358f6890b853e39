"""One frame of the screen, as data: ``render(state, world, size, theme, charset) -> Frame``.

A ``Frame`` is ``height`` lines, each a tuple of ``(text, Style)`` runs
exactly ``width`` cells wide.  The driver writes them with curses and
nothing else; tests compare ``Frame.text()`` with golden text.

From top to bottom: the header (time, window, step, monitor and worker),
an announcement banner when there is one, the time labels and the now
marker, one row per GPU, the cursor line, the table of bookings in view,
the chosen GPU's live state (or the booking form), the status line and
the keys.  Below 60x16 the frame only says so.

Text other people wrote (user names, notes, notices, process labels) goes
through ``clean``: a control character in a note must not move the
terminal's cursor, and a wide character must not push the line past its
width.
"""

from __future__ import annotations

import unicodedata
from datetime import datetime

from bk.core import timegrid
from bk.core.models import EXCLUSIVE
from bk.core.record import dataclass
from bk.core.safetext import safe
from bk.tui import keys, layout, text
from bk.tui.theme import Charset, Style, Theme


@dataclass(frozen=True)
class Frame:
    width: int
    height: int
    lines: tuple          # tuple of tuples of (text, Style)

    def text(self) -> str:
        return "\n".join("".join(t for t, _ in line).rstrip() for line in self.lines)

    def styles_at(self, row: int) -> list[tuple[str, Style]]:
        return list(self.lines[row])


# ------------------------------------------------------------ text cells

def _w(ch: str) -> int:
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def clean(s) -> str:
    """Stored text made safe to draw: what the one text policy
    (``bk.core.safetext``) neutralises becomes ``?`` (an escape would not fit
    a cell); so do private-use and unassigned characters, whose width the
    terminal may not agree on; combining marks are dropped (they would not
    take a cell)."""
    s = safe(s, mark="?")
    if s.isascii():
        return s
    out = []
    for ch in s:
        cat = unicodedata.category(ch)
        if cat in ("Co", "Cn"):
            out.append("?")
        elif cat in ("Mn", "Me"):
            continue
        else:
            out.append(ch)
    return "".join(out)


def width_of(s: str) -> int:
    return sum(_w(c) for c in s) if not s.isascii() else len(s)


def clip(s: str, w: int) -> str:
    """``s`` cut to ``w`` cells (an ellipsis-free cut: every cell counts)."""
    if w <= 0:
        return ""
    if s.isascii():
        return s[:w]
    out, used = [], 0
    for c in s:
        cw = _w(c)
        if used + cw > w:
            break
        out.append(c)
        used += cw
    return "".join(out)


class Line:
    """Runs being laid out left to right, clipped at the width."""

    def __init__(self, width: int, theme: Theme):
        self.width, self.theme, self.runs, self.used = width, theme, [], 0

    def add(self, s: str, kind: str = "normal") -> Line:
        room = self.width - self.used
        if room <= 0 or not s:
            return self
        if len(s) > room or not s.isascii():
            s = clip(s, room)
        st = self.theme.style(kind)
        if self.runs and self.runs[-1][1] is st:
            self.runs[-1] = (self.runs[-1][0] + s, st)
        else:
            self.runs.append((s, st))
        self.used += width_of(s)
        return self

    def fill(self, kind: str = "normal", ch: str = " ") -> tuple:
        if self.used < self.width:
            self.add(ch * (self.width - self.used), kind)
        return tuple(self.runs)


# ------------------------------------------------------------ pieces

def _hm(t: int, tz) -> str:
    dt = datetime.fromtimestamp(t, tz)
    return f"{dt.hour:02d}:{dt.minute:02d}"


def _local(t: int, world) -> str:
    return timegrid.format_local(t, world.tz, now=world.now, compact=True)


def _span(a: int, b: int, world, cs: Charset) -> str:
    return timegrid.format_span(a, b, world.tz, world.now).replace("–", cs.dash)


def _labels(frm: int, n: int, step: int, tz) -> str:
    return timegrid.time_labels(frm, n, step, tz)


def _state_word(d: dict) -> str:
    return str(d.get("state") or "absent")


def _activity(r, now: int, activity: dict | None) -> str:
    """`` · idle 35m``: the monitor's state of a running booking (issue 25),
    as ``bk l`` adds it to the status."""
    row = (activity or {}).get(r.id) if r.cancelled_at is None and r.start <= now < r.end else None
    if not row:
        return ""
    from bk.core.activity import short_text

    words = short_text(row.get("state"), row.get("idle_s"))
    return f" · {words}" if words else ""


def _gpus(gs) -> str:
    return ",".join(map(str, gs)) if gs else "-"


def _mem(mib) -> str:
    return timegrid.format_memory(mib) if mib else "auto"


def _gib(mib: int) -> str:
    return f"{mib / 1024:.1f}"


def _when(a: int, b: int, world, cs: Charset) -> str:
    """``10:00–11:30`` today, ``07-14 09:00–11:00`` another day, the end's
    day too when it is not the start's."""
    da, db, dn = (datetime.fromtimestamp(t, world.tz) for t in (a, b, world.now))
    head = _hm(a, world.tz) if da.date() == dn.date() else f"{da.month:02d}-{da.day:02d} {_hm(a, world.tz)}"
    tail = _hm(b, world.tz) if db.date() == da.date() else f"{db.month:02d}-{db.day:02d} {_hm(b, world.tz)}"
    return f"{head}{cs.dash}{tail}"


def _rule(width: int, title: str, theme: Theme, cs: Charset) -> tuple:
    line = Line(width, theme)
    line.add(cs.hline * 2 + " ", "rule").add(clean(title), "title").add(" ", "rule")
    return line.fill("rule", cs.hline)


def _box(lines_in: list[tuple[str, str]], title: str, width: int, height: int, theme: Theme,
         cs: Charset) -> list[tuple]:
    """A framed page filling the screen: ``lines_in`` are (text, kind)."""
    tl, tr, bl, br = cs.corners
    inner = width - 4
    out = []
    top = Line(width, theme).add(tl + cs.hline + " ", "box").add(title, "title").add(" ", "box")
    out.append(top.add(cs.hline * (width - top.used - 1), "box").add(tr, "box").fill())
    body = lines_in[:height - 2]
    for s, kind in body:
        line = Line(width, theme).add(cs.vline + " ", "box")
        line.add(clip(s, inner), kind)
        line.add(" " * (width - 2 - line.used), "normal")
        out.append(line.add(" " + cs.vline, "box").fill())
    for _ in range(height - 2 - len(body)):
        out.append(Line(width, theme).add(cs.vline, "box").add(" " * (width - 2)).add(cs.vline, "box").fill())
    out.append(Line(width, theme).add(bl + cs.hline * (width - 2) + br, "box").fill())
    return out


def wrap(s: str, w: int) -> list[str]:
    out, cur = [], ""
    for word in s.split():
        if cur and width_of(cur) + 1 + width_of(word) > w:
            out.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    if cur:
        out.append(cur)
    return out or [""]


# ------------------------------------------------------------ the frame

def render(state: keys.ViewState, world, size: tuple[int, int], theme: Theme, charset: Charset) -> Frame:
    width, height = size
    if width < layout.MIN_W or height < layout.MIN_H:
        return _too_small(width, height, theme)
    if world is None:
        lines = [Line(width, theme).add(" bk t: reading the bookings...", "header").fill("header")]
        lines += [Line(width, theme).fill() for _ in range(height - 1)]
        return Frame(width, height, tuple(lines))
    if state.mode == "help":
        return _help(state.tour_page, width, height, theme, charset)
    if state.mode == "tour":
        return _tour(state.tour_page, width, height, theme, charset)
    return _main(state, world, width, height, theme, charset)


def _too_small(width: int, height: int, theme: Theme) -> Frame:
    msg = [f"terminal too small (need {layout.MIN_W}x{layout.MIN_H})", f"this one is {width}x{height}",
           "enlarge it, or press q to quit"]
    lines = []
    top = max(0, (height - len(msg)) // 2)
    for i in range(height):
        k = i - top
        s = msg[k] if 0 <= k < len(msg) else ""
        pad = max(0, (width - len(s)) // 2)
        lines.append(Line(width, theme).add(" " * pad).add(s, "error" if k == 0 else "normal").fill())
    return Frame(width, height, tuple(lines))


def _help(page: int, width: int, height: int, theme: Theme, cs: Charset) -> Frame:
    body = text.help_lines(width, cs.name == "unicode")
    per = max(1, height - 3)
    pages = text.help_pages(width, height)
    page = min(max(page, 0), pages - 1)
    shown = body[page * per:(page + 1) * per]
    foot = (f"page {page + 1}/{pages}: any key for more, q closes" if page + 1 < pages
            else "any key closes this help")
    shown += [("", "normal")] * (per - len(shown)) + [(foot, "keys")]
    return Frame(width, height, tuple(_box(shown, "bk t: keys", width, height, theme, cs)))


def _tour(page: int, width: int, height: int, theme: Theme, cs: Charset) -> Frame:
    page = min(max(page, 0), len(text.TOUR) - 1)
    title, words = text.TOUR[page]
    body = [(f"{page + 1}/{len(text.TOUR)}  {title}", "title"), ("", "normal")]
    body += [(s, "normal") for s in wrap(words, width - 6)]
    body += [("", "normal"), ("Space or n: next   p: back   q: close the tour", "keys")]
    return Frame(width, height, tuple(_box(body, "bk t: the tour", width, height, theme, cs)))


def _main(state, world, width: int, height: int, theme: Theme, cs: Charset) -> Frame:
    now, pol = world.now, world.policy
    cap = pol.max_shared_users
    gpus = world.gpu_indices
    frm, n, step = keys.window(state, world)
    to = frm + n * step
    lw = layout.label_width(gpus)
    pad = " " * (lw + 1)
    draft = state.draft if state.mode == "form" else None
    skip = draft.edit_of if draft is not None else None

    rows = layout.table_rows(world.reservations, frm=frm, to=to, now=now)
    # Letters go to the caller's bookings the window shows, in table order:
    # one out of view needs none, so 26 letters last for 26 bookings in
    # view, not for the first 26 of the caller's whole future.
    own_rows: dict[str, int] = {}
    for r in rows:
        if r.uid == world.actor_uid and r.start < to and r.end > frm:
            own_rows[r.id] = len(own_rows)

    out: list[tuple] = []
    # header
    head = Line(width, theme)
    parts = [f" bk t {cs.dash} {_local(now, world)}" if width >= 100 else f" {_local(now, world)}",
             f"{_when(frm, to, world, cs)} {timegrid.format_duration(step)}/col",
             f"monitor {_state_word(world.monitor)}", f"worker {_state_word(world.worker)}",
             f"{clean(world.actor_user)}{' (shared)' if world.shared else ''}"]
    shown_parts: list[str] = []
    for p in parts:       # in order of importance, while they fit
        if width_of(cs.sep.join([*shown_parts, p])) > width:
            break
        shown_parts.append(p)
    head.add(cs.sep.join(shown_parts), "header")
    out.append(head.fill("header"))
    # announcements
    if world.notices:
        nt = world.notices[0]
        more = f"  (+{len(world.notices) - 1} more: bk n)" if len(world.notices) > 1 else ""
        kind = "banner_warn" if nt.level in ("warning", "critical") else "banner"
        out.append(Line(width, theme).add(f" {nt.level}: {clean(nt.text)}{more}", kind).fill(kind))

    # height budget
    fixed = len(out) + 2 + 1 + 1 + 1 + 2          # labels+now, cursor line, rule, th, status+keys
    pane = 3
    avail = height - fixed - pane
    if avail < min(len(gpus), 4) + 1 and draft is None:
        pane, avail = 0, avail + 3
    gpu_rows_n = max(1, min(len(gpus), avail - 1))
    table_n = max(0, avail - gpu_rows_n)
    cur_gpu = min(max(state.gpu, 0), max(len(gpus) - 1, 0))
    first_gpu = min(max(0, cur_gpu - gpu_rows_n + 1), max(0, len(gpus) - gpu_rows_n))

    # time labels and now
    out.append(Line(width, theme).add(pad).add(_labels(frm, n, step, world.tz), "label").fill())
    mark = Line(width, theme).add(pad)
    if frm <= now < to:
        col = (now - frm) // step
        mark.add(" " * col).add(f"{cs.now} now {_hm(now, world.tz)}", "now")
    elif now < frm:
        mark.add(f"{cs.before} now {_hm(now, world.tz)} (n: back to now)", "now")
    else:
        label = f"(n: back to now) now {_hm(now, world.tz)} {cs.after}"
        mark.add(" " * max(0, n - len(label))).add(label, "now")
    out.append(mark.fill())

    # lanes
    dark = layout.dark_columns(world.blackouts, frm=frm, step=step, n=n)
    per = layout.by_gpu(world.reservations, gpus[first_gpu:first_gpu + gpu_rows_n], skip)
    cursor_col = min(max(state.col, 0), n - 1)
    d_lo = d_hi = -1
    if draft is not None:
        d_lo = max(0, (draft.start - frm) // step) if draft.end > frm else n
        d_hi = min(n - 1, (draft.end - 1 - frm) // step) if draft.start < to else -1
    d_slots = (cap if draft is not None and draft.mode == EXCLUSIVE else draft.share if draft else 0)
    cursor_desc = ""
    for gi in range(first_gpu, first_gpu + gpu_rows_n):
        g = gpus[gi]
        disabled = g in pol.disabled_gpus or g >= pol.gpu_count
        cells = layout.lane_cells(per[g], own_rows, frm=frm, step=step, n=n, capacity=cap,
                                  actor_uid=world.actor_uid, dark=dark)
        line = Line(width, theme).add(f"GPU {g}".ljust(lw), "label_sel" if gi == cur_gpu else "label").add(" ")
        in_draft = draft is not None and g in draft.gpus
        buf, buf_kind = [], None        # runs of one kind, added at once
        for c, cell in enumerate(cells):
            ch, kind = _glyph(cell, disabled, cap, cs)
            if in_draft and d_lo <= c <= d_hi:
                bad = disabled or cell.blackout or cell.used + d_slots > cap
                ch, kind = ("!", "conflict") if bad else ("+", "draft")
            if gi == cur_gpu and c == cursor_col and state.mode == "browse":
                kind = "cursor"
                cursor_desc = _describe(cell, disabled, cap)
            if kind != buf_kind and buf:
                line.add("".join(buf), buf_kind)
                buf = []
            buf.append(ch)
            buf_kind = kind
        if buf:
            line.add("".join(buf), buf_kind)
        out.append(line.fill())

    # cursor line
    ct = frm + cursor_col * step
    cl = Line(width, theme)
    if draft is not None:
        cl.add(f" {_draft_fit(draft, world, cs)}", "status")
    elif gpus:
        cl.add(f" cursor {_local(ct, world)} on GPU {gpus[cur_gpu]}: {cursor_desc}", "status")
        legend = text.LEGEND_UNICODE if cs.name == "unicode" else text.LEGEND_ASCII
        if cl.used + 3 + len(legend) <= width:
            cl.add(" " * (width - cl.used - len(legend))).add(legend, "keys")
    out.append(cl.fill())

    # table
    live = [r for r in rows if r.end > now]
    out.append(_rule(width, f"Bookings: {len(live)} now or later" + (f", {len(rows) - len(live)} past in view"
                                                                    if len(rows) > len(live) else ""),
                     theme, cs))
    sel_i = next((i for i, r in enumerate(rows) if r.id == state.sel), None)
    if sel_i is None and state.focus == "table" and rows and state.sel is None:
        sel_i = 0
    first = 0
    if sel_i is not None and table_n:
        first = min(max(0, sel_i - table_n + 1), max(0, len(rows) - table_n))
    shown = rows[first:first + table_n]
    # The shortest unique prefix of each ID shown, among every ID of the ledger.
    ids = layout.short_ids([r.id for r in world.reservations], [r.id for r in shown])
    idw = min(12, max([len(s) for s in ids.values()] + [4]))
    wide = width >= 120
    th = Line(width, theme).add(f"   {'ID'.ljust(idw)} {'USER':<8}{'GPUS':<6}{'MODE':<11}{'MEM':<6}"
                                f"{'WHEN':<18}{'STATUS':<13}" + ("NOTE" if wide else ""), "th")
    out.append(th.fill("th"))
    for i, r in enumerate(shown, first):
        mine = r.uid == world.actor_uid or r.id in world.usable      # shared with you: yours to use
        letter = layout.own_letter(own_rows[r.id]) if r.id in own_rows else ("+" if r.id in world.usable else " ")
        kind = ("row_mine" if mine else "row") + ("_sel" if i == sel_i else "")
        if r.id == skip:
            letter = "~"
        note = r.note or (r.job.summary if r.job is not None and r.job.summary else "")
        job = f"job {r.job.status}" if r.job is not None else ""
        tail = " ".join(x for x in (job, clean(note)) if x) if wide else ""
        # A booking reads as on the command line (bk.core.timegrid's words).
        s = (f" {letter} {ids[r.id][:idw].ljust(idw)} {clean(r.user)[:7]:<8}"
             f"{timegrid.gpus_text(r.gpus)[:5]:<6}{timegrid.mode_text(r, cap):<11}"
             f"{timegrid.mem_text(r.mem_mib):<6}"
             f"{timegrid.when_text(r.start, r.end, world.tz, now, dash=cs.dash):<18}"
             f"{timegrid.status_text(r, now) + _activity(r, now, world.activity):<13}{tail}")
        out.append(Line(width, theme).add(s, kind).fill(kind))
    for _ in range(table_n - len(shown)):
        out.append(Line(width, theme).add("   (no bookings in view: press a to add one)" if not rows and _ == 0
                                          else "", "keys").fill())

    # pane: the form, or the chosen GPU's live state
    if pane:
        if draft is not None:
            out.extend(_form(draft, world, width, theme, cs))
        else:
            out.extend(_detail(world, gpus[cur_gpu] if gpus else None, width, theme, cs))

    # status and keys
    out.append(_status_line(state, world, width, theme, cs))
    out.append(Line(width, theme).add(_keys_line(state, world), "keys").fill())
    out = out[:height]
    while len(out) < height:
        out.insert(len(out) - 2, Line(width, theme).fill())
    return Frame(width, height, tuple(out))


def _glyph(cell, disabled: bool, cap: int, cs: Charset) -> tuple[str, str]:
    if disabled:
        return "x", "disabled"
    if cell.blackout:
        return "#", "blackout"
    if cell.mine > 1:
        return "&", "mine"
    if cell.mine:
        ch = layout.own_letter(cell.first_mine)
        return (ch.upper() if cell.full_mine else ch), "mine"
    if cell.used <= 0:
        return cs.free, "free"
    if cell.used >= cap:
        return cs.full, "full"
    return (str(cell.used) if cell.used < 10 else "+"), "other"


def _describe(cell, disabled: bool, cap: int) -> str:
    if disabled:
        return "disabled"
    if cell.blackout:
        return "blackout"
    if cell.used <= 0:
        return "free"
    who = []
    if cell.mine:
        who.append("yours")
    if cell.others:
        who.append(timegrid.counted(cell.others, "other"))
    return f"{min(cell.used, cap)}/{cap} slots held ({', '.join(who)})" if cell.used < cap else \
        f"full ({', '.join(who)})"


def _draft_fit(d, world, cs: Charset) -> str:
    what = "edit" if d.edit_of else "new"
    return (f"{what}: {_span(d.start, d.end, world, cs)} ({timegrid.format_duration(d.duration)}) on GPU "
            f"{_gpus(d.gpus)}: + fits, ! conflicts")


def _form(d, world, width: int, theme: Theme, cs: Charset) -> list[tuple]:
    title = f"Edit {d.edit_of[:8]}" if d.edit_of else "New booking"
    if d.running:
        title += " (running: only its end may move)"
    out = [_rule(width, title, theme, cs)]
    cap = world.policy.max_shared_users
    values = {
        "start": "now" if d.start <= world.now else _local(d.start, world),
        "duration": f"{timegrid.format_duration(d.duration)} (ends {_local(d.end, world)})",
        "gpus": " ".join((f"[{g}]" if g in d.gpus else f" {g} ") for g in world.gpu_indices[:16]),
        "mode": d.mode,
        "share": "whole GPU" if d.mode == EXCLUSIVE else f"{d.share}/{cap}",
        "memory": "-" if d.mode == EXCLUSIVE else _mem(d.mem_mib),
    }
    half = 3 if width < 120 else len(keys.FIELDS)
    for names in (keys.FIELDS[:half], keys.FIELDS[half:]):
        if not names:
            continue
        line = Line(width, theme).add(" ")
        for name in names:
            i = keys.FIELDS.index(name)
            on = i == d.field
            v = values[name]
            if on and d.typing is not None:
                v = d.typing + "_"
            line.add(f"{name} ", "field").add(v, "field_on" if on else "field").add("   ")
        out.append(line.fill())
    if len(out) < 3:
        out.append(Line(width, theme).fill())
    return out


def _detail(world, g, width: int, theme: Theme, cs: Charset) -> list[tuple]:
    row = next((r for r in world.gpus if r.index == g), None)
    title = f"GPU {g}" + (f": {clean(row.name)}" if row is not None and row.name else "")
    out = [_rule(width, title, theme, cs)]
    if row is None:
        out.append(Line(width, theme).add(" " + clean(world.live or "live: unknown"), "keys").fill())
        out.append(Line(width, theme).fill())
        return out
    parts = [f"state {row.state}", f"share {timegrid.share_text(row.share_used, row.capacity)}"]
    parts.append(f"util {row.util}%" if row.util is not None else "util ?")
    if row.mem_total_mib:
        used = _gib(row.mem_used_mib) if row.mem_used_mib is not None else "?"
        parts.append(f"mem {used}/{_gib(row.mem_total_mib)} GiB")
    if row.temperature is not None:
        parts.append(f"{row.temperature}°C" if cs.name == "unicode" else f"{row.temperature}C")
    if row.next_free is not None:
        parts.append("free now" if row.next_free <= world.now else f"next free {_local(row.next_free, world)}")
    out.append(Line(width, theme).add(" " + cs.sep.join(parts)).fill())
    if row.processes is None:
        second = clean(world.live or "processes: this source cannot list them")
    elif not row.processes:
        second = "no processes"
    else:
        second = cs.sep.join(
            f"{p.pid} {clean(p.user or '?')} {clean(p.label or '')} "
            f"{_gib(p.mem_mib) + ' GiB' if p.mem_mib else ''} {p.state}".replace("  ", " ")
            for p in row.processes)
    out.append(Line(width, theme).add(" " + second, "keys" if row.processes is None else "normal").fill())
    return out


def _status_line(state, world, width: int, theme: Theme, cs: Charset) -> tuple:
    line = Line(width, theme)
    if state.mode == "confirm":
        r = next((r for r in world.reservations if r.id == state.confirm), None)
        running = r is not None and r.start <= world.now < r.end
        what = (f"{r.id[:8]} (GPU {_gpus(r.gpus)}, {_span(r.start, r.end, world, cs)}"
                f"{', running' if running else ''})" if r else str(state.confirm)[:8])
        return line.add(f" cancel {what}? y: yes, other key: no", "error").fill()
    if state.message:
        return line.add(" " + clean(state.message), "error" if state.error else "status").fill()
    if world.error:
        return line.add(" " + clean(world.error), "error").fill()
    if world.warnings:
        return line.add(" warning: " + clean(world.warnings[0]), "error").fill()
    return line.fill()


def _keys_line(state, world) -> str:
    d = state.draft
    if state.mode == "form" and d is not None:
        if d.typing is not None:
            return " type, Enter takes it, Esc leaves it, Backspace deletes"
        field = keys.FIELDS[d.field]
        gpus = world.gpu_indices
        change = (f"Space toggles GPU {gpus[d.gpu_cursor]}, 0-9 any" if field == "gpus" and gpus
                  else "= types it" if field in keys.TEXT_FIELDS else "Space switches")
        return (f" Up/Dn field  </> change  {change}  x mode  f earliest  Enter "
                + ("save" if d.edit_of else "book") + "  Esc leave")
    return " a add  e edit  d cancel  </> time  +/- zoom  n now  Tab table  ? help  q quit"
