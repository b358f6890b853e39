"""A static web page of the week: every GPU by hour, the bookings with their
owner and mode, now marked, maintenance windows, announcements, and each
GPU's live state.

The decisions:

* Self-contained and read-only: one file, its style inline, no script, no
  font, image or link to anything outside it; it reads the same with
  JavaScript off, and a web server can publish it as it is.  It does not
  refresh itself (a timed refresh takes the page from under a screen
  reader or a keyboard user: axe's ``meta-refresh`` rule); the monitor
  rewrites it every minute and it says when it was written.
* Accessible: landmarks (header, nav, main, footer), one ``h1``, a caption
  and ``th`` with ``scope`` on every table, the current hour's column
  header marked ``aria-current="time"``, wide tables in focusable scroll
  regions, mode and maintenance said in words (colour is never the only
  sign), colours of at least 4.5:1 contrast in both themes
  (``prefers-color-scheme``); the tests measure them in a real browser.
* Names are someone else's text: the project's text policy first
  (``bk.core.safetext.safe``: control and format characters as visible
  escapes), then ``html.escape``; the page is ASCII, everything else as
  character references, so no encoding can garble it.
* Hours are local hours of the zone given, as many as the day really has
  (23 or 25 on the days the clocks change; the repeated hour is labelled
  with its zone).
"""

from __future__ import annotations

from html import escape

from bk.core.safetext import safe
from bk.core.timegrid import counted
from bk.core.utctime import format_utc
from bk.export.model import Export

HOUR = 3600
DAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

CSS = """
:root{color-scheme:light dark;--bg:#ffffff;--fg:#1a1a1a;--muted:#4a4a4a;--line:#8a8a8a;--head:#eef1f5;
--sh-bg:#dbe7fb;--sh-fg:#102a5c;--ex-bg:#1e3a8a;--ex-fg:#ffffff;--mt-bg:#fde68a;--mt-fg:#5c2a06;
--now:#b3261e;--link:#1d4ed8;--warn-bg:#fff4d6;--crit-bg:#fde2e1}
@media (prefers-color-scheme:dark){:root{--bg:#121417;--fg:#e8e8e8;--muted:#c2c2c2;--line:#6b6b6b;
--head:#22262c;--sh-bg:#1e3a5f;--sh-fg:#e3eeff;--ex-bg:#a9cbfa;--ex-fg:#0b1a33;--mt-bg:#6b3410;
--mt-fg:#fff1d0;--now:#ff8a80;--link:#9cc1ff;--warn-bg:#3d3212;--crit-bg:#47201e}}
*{box-sizing:border-box}
body{margin:0;padding:0 1rem 2rem;background:var(--bg);color:var(--fg);font:15px/1.45 system-ui,sans-serif}
a{color:var(--link)}
a:focus,[tabindex]:focus{outline:3px solid var(--now);outline-offset:2px}
.skip{position:absolute;left:-999px;top:0;background:var(--bg);color:var(--link);padding:.4rem}
.skip:focus{left:1rem}
.sr{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0);white-space:nowrap}
header p,footer p{color:var(--muted)}
nav ul{list-style:none;padding:0;display:flex;flex-wrap:wrap;gap:.3rem 1rem}
table{border-collapse:collapse;margin:.4rem 0 1.2rem}
caption{text-align:left;font-weight:600;padding:.3rem 0}
th,td{border:1px solid var(--line);padding:.15rem .35rem;vertical-align:top}
thead th{background:var(--head);color:var(--fg)}
th[scope=row]{background:var(--head);color:var(--fg);text-align:left;white-space:nowrap}
.scroll{overflow-x:auto;max-width:100%}
.week td{min-width:3.4rem;font-size:13px}
.b{display:block;padding:0 .2rem;margin:1px 0;border-radius:3px;white-space:nowrap;overflow:hidden;
text-overflow:ellipsis;max-width:9rem}
.shared{background:var(--sh-bg);color:var(--sh-fg)}
.exclusive{background:var(--ex-bg);color:var(--ex-fg);font-weight:700}
.maint{background:var(--mt-bg);color:var(--mt-fg)}
th.now{color:var(--now);border:2px solid var(--now)}
td.now{border-left:2px solid var(--now);border-right:2px solid var(--now)}
.level-warning{background:var(--warn-bg);color:var(--fg)}
.level-critical{background:var(--crit-bg);color:var(--fg)}
ul.notices li{padding:.2rem .4rem;margin:.2rem 0}
"""


def text(s) -> str:
    """Someone else's text, safe for the page."""
    return escape(safe(s), quote=True)


def _local(t: int, tz):
    from datetime import datetime

    return datetime.fromtimestamp(t, tz)


def _when(t: int, tz) -> str:
    d = _local(t, tz)
    return f"{DAY_NAMES[d.weekday()][:3]} {d:%Y-%m-%d %H:%M} {d.tzname() or ''}".rstrip()


def _day_hours(day_start: int, tz) -> list[int]:
    """The UTC instants of the local hours of the day that begins at
    ``day_start``: 23, 24 or 25 of them."""
    from datetime import datetime, timedelta

    d = _local(day_start, tz)
    nxt = d.date() + timedelta(days=1)
    end = int(datetime(nxt.year, nxt.month, nxt.day, tzinfo=tz).timestamp())
    return list(range(day_start, end, HOUR))


def _hour_label(t: int, tz, folded: set[int]) -> str:
    d = _local(t, tz)
    return f"{d:%H}" + (f" {d.tzname()}" if t in folded else "")


def _ends(b) -> int:
    """When a booking really stops holding its GPUs."""
    return b.cancelled_at if b.cancelled_at is not None and b.cancelled_at > b.start else b.end


def _mode(b, capacity: int) -> str:
    return "exclusive" if b.mode == "exclusive" else f"shared {b.slots}/{capacity}"


def render(data: Export, *, tz, zone_name: str, week_start: int, generator: str = "bk") -> bytes:
    """The page (ASCII bytes).  ``week_start``: Monday 00:00 local, as an
    instant; ``zone_name`` names ``tz`` for people."""
    now, cap = data.now, data.capacity
    shown = [b for b in data.bookings if b.status != "cancelled" or (b.cancelled_at or 0) > b.start]
    days, t = [], week_start
    for _ in range(7):
        hours = _day_hours(t, tz)
        days.append(hours)
        t = hours[-1] + HOUR
    week_end = t
    title = f"GPU bookings on {data.host}: week of {_local(week_start, tz):%Y-%m-%d}"
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           '<meta name="color-scheme" content="light dark">',
           f"<title>{text(title)}</title>", f"<style>{CSS}</style>", "</head>", "<body>",
           '<a class="skip" href="#main">Skip to the bookings</a>',
           "<header>", f"<h1>GPU bookings on {text(data.host)}</h1>",
           f"<p>Week of {_local(week_start, tz):%A %Y-%m-%d}; times in {text(zone_name)}. "
           f"Now: <strong>{text(_when(now, tz))}</strong> (the current hour is marked in the week). "
           f"Written at {text(_when(now, tz))}; the monitor writes it again every minute: reload for the "
           "latest.</p>", "</header>",
           '<nav aria-label="Days of the week"><ul>']
    for hours in days:
        d = _local(hours[0], tz)
        out.append(f'<li><a href="#d{d:%Y-%m-%d}">{DAY_NAMES[d.weekday()]} {d:%m-%d}</a></li>')
    out += ['<li><a href="#live">GPUs now</a></li>', '<li><a href="#list">All bookings</a></li>', "</ul></nav>",
            '<main id="main">']
    if data.announcements:
        out += ['<section aria-labelledby="ann-h">', '<h2 id="ann-h">Announcements</h2>', '<ul class="notices">']
        for a in data.announcements:
            until = f" (until {text(_when(a.until, tz))})" if a.until is not None else ""
            out.append(f'<li class="level-{text(a.level)}"><strong>{text(a.level)}:</strong> {text(a.text)}'
                       f"{until}</li>")
        out += ["</ul>", "</section>"]
    out += _live(data, tz, shown)
    out += ['<section aria-labelledby="week-h">', '<h2 id="week-h">The week by hour</h2>',
            "<p>Each cell is one hour on one GPU: who holds it and how (shared: the slots held of "
            f"{cap}; exclusive: the whole GPU); <em>maintenance</em>: no booking runs.</p>"]
    by_gpu = {g.index: sorted((b for b in shown if g.index in b.gpus), key=lambda b: b.start) for g in data.gpus}
    for hours in days:
        out += _day_table(data, hours, tz, by_gpu)
    out.append("</section>")
    out += _list(data, tz, [b for b in data.bookings if b.start < week_end and _ends(b) > week_start])
    if data.windows:
        out += ['<section aria-labelledby="maint-h">', '<h2 id="maint-h">Maintenance windows</h2>', "<ul>"]
        for w in data.windows:
            out.append(f"<li>{text(_when(w.start, tz))} to {text(_when(w.end, tz))}: {text(w.reason)}</li>")
        out += ["</ul>", "</section>"]
    out += ["</main>", f"<footer><p>Made by {text(generator)}; read-only. Book with <code>bk</code> on "
            f"{text(data.host)}.</p></footer>", "</body>", "</html>", ""]
    return "\n".join(out).encode("ascii", "xmlcharrefreplace")


def _live(data: Export, tz, shown) -> list[str]:
    when = (f"as seen at {text(_when(data.live_at, tz))} ({text(data.live_source or '')})"
            if data.live_at is not None else "no live look (no monitor and no GPU answered)")
    out = ['<section id="live" aria-labelledby="live-h">', '<h2 id="live-h">GPUs now</h2>',
           '<div class="scroll" role="region" aria-label="GPUs now" tabindex="0">', "<table>",
           f"<caption>Each GPU {when}; monitor: {text(data.monitor.state)}</caption>",
           "<thead><tr>" + "".join(f'<th scope="col">{h}</th>' for h in (
               "GPU", "Model", "State", "Utilisation", "Memory", "Running bookings", "Use without a booking"))
           + "</tr></thead>", "<tbody>"]
    for g in data.gpus:
        running = [b for b in shown if g.index in b.gpus and b.start <= data.now < _ends(b)]
        runs = "; ".join(f"{text(b.user)} ({_mode(b, data.capacity)}"
                         + (f", {text(b.activity)}" if b.activity else "")
                         + (f", idle {b.idle_s // 60} min" if b.idle_s else "") + ")" for b in running) or "none"
        state = "disabled" if g.disabled else g.live
        mem = (f"{g.mem_used_mib} of {g.mem_total_mib} MiB" if g.mem_used_mib is not None and g.mem_total_mib
               else "unknown")
        util = f"{g.util} %" if g.util is not None else "unknown"
        unres = ", ".join(text(u) for u in g.unreserved) if g.unreserved else (
            "none" if g.processes is not None else "unknown")
        out.append(f'<tr><th scope="row">GPU {g.index}</th><td>{text(g.name)}</td><td>{text(state)}</td>'
                   f"<td>{util}</td><td>{mem}</td><td>{runs}</td><td>{unres}</td></tr>")
    out += ["</tbody>", "</table>", "</div>", "</section>"]
    return out


def _day_table(data: Export, hours: list[int], tz, by_gpu: dict) -> list[str]:
    d = _local(hours[0], tz)
    day_id = f"d{d:%Y-%m-%d}"
    labels = [_local(t, tz).strftime("%H") for t in hours]
    folded = {t for t, lab in zip(hours, labels, strict=True) if labels.count(lab) > 1}
    now_hour = next((t for t in hours if t <= data.now < t + HOUR), None)
    name = f"{DAY_NAMES[d.weekday()]} {d:%Y-%m-%d}"
    out = [f'<div class="scroll" role="region" aria-labelledby="{day_id}-c" tabindex="0">',
           f'<table class="week" id="{day_id}">',
           f'<caption id="{day_id}-c">{name}' + (" (today)" if now_hour is not None else "") + "</caption>",
           '<thead><tr><th scope="col">GPU</th>']
    for t in hours:
        label = _hour_label(t, tz, folded)
        if t == now_hour:
            out.append(f'<th scope="col" class="now" aria-current="time">{label}'
                       '<span class="sr"> (now)</span></th>')
        else:
            out.append(f'<th scope="col">{label}</th>')
    out += ["</tr></thead>", "<tbody>"]
    windows = data.windows
    for g in data.gpus:
        row = [f'<tr><th scope="row">GPU {g.index}</th>']
        mine = by_gpu.get(g.index, ())
        for t in hours:
            e = t + HOUR
            parts = []
            if any(w.start < e and w.end > t for w in windows):
                parts.append('<span class="b maint">maintenance</span>')
            for b in mine:
                if b.start >= e:
                    break
                if _ends(b) > t:
                    parts.append(f'<span class="b {"exclusive" if b.mode == "exclusive" else "shared"}" '
                                 f'data-id="{b.short_id}">{text(b.user)} '
                                 f"{'excl.' if b.mode == 'exclusive' else f'{b.slots}/{data.capacity}'}</span>")
            cls = ' class="now"' if t == now_hour else ""
            row.append(f'<td{cls} data-gpu="{g.index}" data-hour="{format_utc(t)}">{"".join(parts)}</td>')
        row.append("</tr>")
        out.append("".join(row))
    out += ["</tbody>", "</table>", "</div>"]
    return out


def _list(data: Export, tz, bookings) -> list[str]:
    out = ['<section id="list" aria-labelledby="list-h">', '<h2 id="list-h">Bookings this week</h2>']
    if not bookings:
        return out + ["<p>No bookings this week.</p>", "</section>"]
    out += ['<div class="scroll" role="region" aria-label="Bookings this week" tabindex="0">', "<table>",
            f"<caption>{counted(len(bookings), 'booking')}, by start</caption>",
            "<thead><tr>" + "".join(f'<th scope="col">{h}</th>' for h in (
                "ID", "Owner", "Mode", "GPUs", "From", "Until", "Status", "Note")) + "</tr></thead>", "<tbody>"]
    for b in bookings:
        status = b.status if not (b.status == "cancelled" and (b.cancelled_at or 0) > b.start) else "released early"
        out.append(f'<tr><th scope="row">{b.short_id}</th><td>{text(b.user)}</td><td>{_mode(b, data.capacity)}</td>'
                   f"<td>{', '.join(str(i) for i in b.gpus)}</td><td>{text(_when(b.start, tz))}</td>"
                   f"<td>{text(_when(_ends(b), tz))}</td><td>{text(status)}</td>"
                   f"<td>{text(b.note) if b.note else ''}</td></tr>")
    out += ["</tbody>", "</table>", "</div>", "</section>"]
    return out
