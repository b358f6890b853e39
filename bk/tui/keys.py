"""The screen's state and what each key does to it: pure.

``handle(state, key, world) -> (state, action)``.  ``key`` is a name
(``"LEFT"``, ``"ENTER"``, ``"ESC"``, ``"RESIZE"``) or the character typed;
``world`` is the latest ``World`` (the keys that depend on the bookings
read it, none of them change it).  ``action`` is None, or what the driver
must do outside: ``quit``, ``refresh``, or a write or look-up that goes
through the service layer (``book``, ``edit``, ``cancel``, ``find``).
Nothing here reads a clock: "now" is the world's.

A booking being drawn is a ``Draft``: start, duration, GPUs, mode, share
slots, memory.  Its values are typed numbers; what a person types into a
field (``20:00``, ``1h30m``, ``12g``) is read with the same grammar as the
command line (``bk.core.timegrid`` through ``bk.service.builders``), so a
word means one thing everywhere.
"""

from __future__ import annotations

from bk.core import timegrid
from bk.core.errors import BkError
from bk.core.models import EXCLUSIVE, SHARED
from bk.core.record import dataclass, replace
from bk.tui import layout

FIELDS = ("start", "duration", "gpus", "mode", "share", "memory")
TEXT_FIELDS = ("start", "duration", "memory")
# What may change once a booking runs (SPEC 4: only its end).
RUNNING_FIELDS = ("duration",)
DEFAULT_DURATION = 3600
GIB = 1024


@dataclass(frozen=True)
class Draft:
    start: int
    duration: int
    gpus: tuple = ()
    mode: str = SHARED
    share: int = 1
    mem_mib: int | None = None
    edit_of: str | None = None         # the reservation ID an edit changes
    running: bool = False              # an edit of a running booking: only the end moves
    field: int = 0                     # index into FIELDS
    typing: str | None = None          # what is being typed into the focused field
    gpu_cursor: int = 0

    @property
    def end(self) -> int:
        return self.start + self.duration


@dataclass(frozen=True)
class Action:
    kind: str                          # quit | refresh | book | edit | cancel | find | keep
    draft: Draft | None = None
    ref: str | None = None


@dataclass(frozen=True)
class ViewState:
    width: int = 80
    height: int = 24
    step: int = layout.DEFAULT_STEP
    frm: int | None = None             # window start; None: follows now
    col: int = 1                       # the cursor's column in the window
    gpu: int = 0                       # the cursor's GPU row
    sel: str | None = None             # the selected booking (table)
    focus: str = "timeline"            # timeline | table
    mode: str = "browse"               # browse | form | confirm | help | tour
    draft: Draft | None = None
    confirm: str | None = None         # the booking a cancel asks about
    theme: str = "dark"
    message: str | None = None
    error: bool = False
    tour_page: int = 0                 # the page of the tour, or of the help


def say(state: ViewState, text: str | None, error: bool = False) -> ViewState:
    return replace(state, message=text, error=error)


# ------------------------------------------------------------ geometry

def window(state: ViewState, world) -> tuple[int, int, int]:
    """(from, number of columns, step) of the timeline at this size."""
    n = layout.columns(state.width, world.gpu_indices)
    return layout.window_start(state.frm, world.now, state.step), n, state.step


def cursor_time(state: ViewState, world) -> int:
    frm, n, step = window(state, world)
    return frm + min(max(state.col, 0), n - 1) * step


def rows(state: ViewState, world) -> list:
    frm, n, step = window(state, world)
    return layout.table_rows(world.reservations, frm=frm, to=frm + n * step, now=world.now)


def show_time(state: ViewState, world, t: int) -> ViewState:
    """Pan so that instant ``t`` is in the window, with the cursor on it."""
    frm, n, step = window(state, world)
    if frm <= t < frm + n * step:
        return replace(state, col=(t - frm) // step)
    start = layout.window_start(t - step, world.now, step)
    return replace(state, frm=start, col=(t - start) // step)


def _pan(state: ViewState, world, cols: int) -> ViewState:
    frm, n, step = window(state, world)
    return replace(state, frm=frm + cols * step)


def _move(state: ViewState, world, d: int) -> ViewState:
    frm, n, step = window(state, world)
    col = state.col + d
    if col < 0:
        return replace(state, frm=frm + col * step, col=0)
    if col >= n:
        return replace(state, frm=frm + (col - n + 1) * step, col=n - 1)
    return replace(state, col=col)


def _zoom(state: ViewState, world, d: int) -> ViewState:
    levels = layout.zooms(world.policy.slot_minutes)
    i = min(range(len(levels)), key=lambda k: abs(levels[k] - state.step))
    j = min(max(i + d, 0), len(levels) - 1)
    if j == i:
        return say(state, f"zoom: {timegrid.format_duration(levels[i])} per column is the "
                          f"{'finest' if d < 0 else 'widest'}")
    t = cursor_time(state, world)
    step = levels[j]
    new = replace(state, step=step)
    if state.frm is None:        # following now: keep following, cursor at the same instant
        frm, n, _ = window(new, world)
        if frm <= t < frm + n * step:
            return replace(new, col=(t - frm) // step)
        return replace(new, col=(world.now - frm) // step)
    _, n, _ = window(new, world)
    col = min(state.col, n - 1)
    start = layout.window_start(t - col * step, world.now, step)
    return say(replace(new, frm=start, col=(t - start) // step),
               f"zoom: {timegrid.format_duration(step)} per column")


def _select(state: ViewState, world, d: int) -> ViewState:
    lst = rows(state, world)
    if not lst:
        return say(replace(state, sel=None), "no bookings in view")
    ids = [r.id for r in lst]
    i = ids.index(state.sel) if state.sel in ids else (-1 if d > 0 else len(ids))
    i = min(max(i + d, 0), len(ids) - 1)
    return replace(state, sel=ids[i], message=None)


def selected(state: ViewState, world):
    lst = rows(state, world)
    for r in lst:
        if r.id == state.sel:
            return r
    return lst[0] if lst and state.sel is None and state.focus == "table" else None


# ------------------------------------------------------------ drafts

def new_draft(state: ViewState, world) -> Draft:
    slot = world.policy.slot_minutes * 60
    t = cursor_time(state, world)
    start = max(t - t % slot, world.now - world.now % slot)
    gpus = world.gpu_indices
    g = gpus[min(state.gpu, len(gpus) - 1)] if gpus else 0
    dur = min(DEFAULT_DURATION, world.policy.max_booking_hours * 3600)
    return Draft(start, max(slot, dur - dur % slot), (g,), gpu_cursor=min(state.gpu, len(gpus) - 1))


def edit_draft(r, world) -> Draft:
    running = r.start <= world.now
    share = r.share if r.mode != EXCLUSIVE else 1
    return Draft(r.start, r.end - r.start, tuple(r.gpus), r.mode, share, r.mem_mib, edit_of=r.id,
                 running=running, field=1 if running else 0,
                 gpu_cursor=r.gpus[0] if r.gpus else 0)


def _adjust(d: Draft, world, step: int, sign: int) -> tuple[Draft, str | None]:
    name = FIELDS[d.field]
    slot = world.policy.slot_minutes * 60
    delta = max(slot, step - step % slot)
    if d.running and name not in RUNNING_FIELDS:
        return d, "this booking is running: only its end may move (duration)"
    if name == "start":
        floor = world.now - world.now % slot
        start = max(floor, d.start + sign * delta)
        return replace(d, start=start), None
    if name == "duration":
        dur = d.duration + sign * delta
        if d.running:      # the end moves; it cannot go before now's slice end
            least = (world.now - world.now % slot + slot) - d.start
            dur = max(dur, least)
        return replace(d, duration=max(slot, dur)), None
    n = len(world.gpu_indices)
    if name == "gpus":
        return replace(d, gpu_cursor=min(max(d.gpu_cursor + sign, 0), n - 1)), None
    if name == "mode":
        return _toggle_mode(d), None
    if name == "share":
        if d.mode == EXCLUSIVE:
            return d, "an exclusive booking takes the whole GPU: switch to shared (x) for share slots"
        cap = world.policy.max_shared_users
        return replace(d, share=min(max(d.share + sign, 1), cap)), None
    # memory, in whole GiB; below 1 GiB: none given (the share of the GPU counts)
    mem = (d.mem_mib or 0) + sign * GIB
    mem = mem - mem % GIB if mem >= GIB else None
    return replace(d, mem_mib=mem), None


def _toggle_mode(d: Draft) -> Draft:
    return replace(d, mode=SHARED if d.mode == EXCLUSIVE else EXCLUSIVE, share=1)


def _toggle_gpu(d: Draft, g: int) -> Draft:
    gpus = set(d.gpus)
    gpus.symmetric_difference_update({g})
    return replace(d, gpus=tuple(sorted(gpus)))


def read_typed(d: Draft, text: str, world) -> Draft:
    """The typed value of the focused field; raises BkError (InvalidInput)."""
    from bk.service import builders

    name = FIELDS[d.field]
    slot_m = world.policy.slot_minutes
    if name == "duration":
        word = text.strip()
        if word.startswith(("+", "-")):
            sign = 1 if word[0] == "+" else -1
            return replace(d, duration=max(slot_m * 60, d.duration + sign * builders.duration(word[1:], slot_m)))
        return replace(d, duration=builders.duration(word, slot_m))
    if name == "memory":
        if text.strip().lower() in builders.CLEAR_MEM_WORDS or not text.strip():
            return replace(d, mem_mib=None)
        return replace(d, mem_mib=builders.memory(text))
    # start: the command line's -t forms (now, +30m, 20:00, tomorrow 09:00)
    when, _spec = builders.start(text, None, now=world.now, tz=world.tz, slot_minutes=slot_m)
    return replace(d, start=when)


def _form_key(state: ViewState, key: str, world) -> tuple[ViewState, Action | None]:
    d = state.draft
    if d.typing is not None:
        if key == "ESC":
            return replace(state, draft=replace(d, typing=None), message=None), None
        if key == "ENTER":
            try:
                nd = read_typed(d, d.typing, world)
            except BkError as e:
                return say(state, e.message + (f" ({e.hint})" if e.hint else ""), True), None
            st = replace(state, draft=replace(nd, typing=None), message=None)
            return (show_time(st, world, nd.start) if FIELDS[d.field] == "start" else st), None
        if key == "BACKSPACE":
            return replace(state, draft=replace(d, typing=d.typing[:-1])), None
        if len(key) == 1 and key.isprintable() and len(d.typing) < 40:
            return replace(state, draft=replace(d, typing=d.typing + key)), None
        return state, None
    name = FIELDS[d.field]
    if key in ("ESC", "q"):
        return replace(state, mode="browse", draft=None, message="nothing booked" if d.edit_of is None
                       else "nothing changed", error=False), None
    if key == "ENTER":
        return state, Action("edit" if d.edit_of else "book", d)
    if key in ("DOWN", "TAB", "j"):
        return replace(state, draft=replace(d, field=(d.field + 1) % len(FIELDS))), None
    if key in ("UP", "BTAB", "k"):
        return replace(state, draft=replace(d, field=(d.field - 1) % len(FIELDS))), None
    if key in ("LEFT", "RIGHT", "h", "l", "-", "+"):
        nd, why = _adjust(d, world, state.step, 1 if key in ("RIGHT", "l", "+") else -1)
        st = replace(state, draft=nd)
        if why:
            return say(st, why, True), None
        return show_time(say(st, None), world, nd.start if name == "start" else nd.end - 1), None
    if key == "f":
        if d.running:
            return say(state, "this booking is running: it cannot move", True), None
        return state, Action("find", d)
    if key in ("x", "m"):
        if d.running:
            return say(state, "this booking is running: only its end may move (duration)", True), None
        return replace(state, draft=_toggle_mode(d), message=None), None
    if name == "gpus" and (key == " " or key.isdigit()):
        if d.running:
            return say(state, "this booking is running: only its end may move (duration)", True), None
        gpus = world.gpu_indices
        g = int(key) if key.isdigit() else gpus[d.gpu_cursor] if gpus else 0
        if g not in gpus:
            return say(state, f"no GPU {g} here", True), None
        return replace(state, draft=_toggle_gpu(d, g), message=None), None
    if key == " " and name in ("mode", "share"):
        nd, why = _adjust(d, world, state.step, 1)
        if name == "share" and nd.share == d.share and d.mode != EXCLUSIVE:
            nd = replace(d, share=1)
        return (say(state, why, True) if why else replace(state, draft=nd, message=None)), None
    if name in TEXT_FIELDS and (key in ("=", "i", "ENTER_FIELD") or (len(key) == 1 and key.isalnum())):
        if d.running and name not in RUNNING_FIELDS:
            return say(state, "this booking is running: only its end may move (duration)", True), None
        first = "" if key in ("=", "i", "ENTER_FIELD") else key
        return replace(state, draft=replace(d, typing=first),
                       message=f"type the {name} (e.g. {EXAMPLES[name]}), Enter to take it, Esc to leave it",
                       error=False), None
    return state, None


EXAMPLES = {"start": "20:00, +30m, tomorrow 09:00, now", "duration": "1h30m, +30m",
            "memory": "12g, 512m, auto"}


# ------------------------------------------------------------ the dispatcher

def handle(state: ViewState, key: str, world) -> tuple[ViewState, Action | None]:
    if key == "RESIZE":
        return state, None
    if state.mode == "help":
        from bk.tui.text import help_pages

        if key not in ("q", "ESC") and state.tour_page + 1 < help_pages(state.width, state.height):
            return replace(state, tour_page=state.tour_page + 1), None
        return replace(state, mode="browse", tour_page=0), None
    if state.mode == "tour":
        return _tour_key(state, key)
    if state.mode == "confirm":
        if key in ("y", "Y"):
            return replace(state, mode="browse", confirm=None), Action("cancel", ref=state.confirm)
        return replace(state, mode="browse", confirm=None, message="kept it", error=False), None
    if state.mode == "form":
        return _form_key(state, key, world)
    return _browse_key(state, key, world)


def _browse_key(state: ViewState, key: str, world) -> tuple[ViewState, Action | None]:
    gpus = world.gpu_indices
    if key in ("q", "Q"):
        return state, Action("quit")
    if key == "ESC":
        return say(state, None), None
    if key in ("LEFT", "h"):
        return _move(state, world, -1), None
    if key in ("RIGHT", "l"):
        return _move(state, world, 1), None
    if key in ("PGUP", "H", "<"):
        return _pan(state, world, -max(1, window(state, world)[1] // 2)), None
    if key in ("PGDN", "L", ">"):
        return _pan(state, world, max(1, window(state, world)[1] // 2)), None
    if key in ("HOME", "n", "."):
        new = replace(state, frm=None)
        frm, n, step = window(new, world)
        return say(replace(new, col=(world.now - frm) // step), None), None
    if key in ("+", "z"):
        return _zoom(state, world, -1), None
    if key in ("-", "Z"):
        return _zoom(state, world, 1), None
    if key == "TAB":
        focus = "table" if state.focus == "timeline" else "timeline"
        st = replace(state, focus=focus)
        if focus == "table" and state.sel is None:
            st = _select(st, world, 1)
        return st, None
    if key in ("UP", "DOWN", "k", "j"):
        d = -1 if key in ("UP", "k") else 1
        if state.focus == "table" or key in ("j", "k"):
            return _select(state, world, d), None
        return replace(state, gpu=min(max(state.gpu + d, 0), max(len(gpus) - 1, 0))), None
    if key == "T":
        theme = "light" if state.theme == "dark" else "dark"
        return say(replace(state, theme=theme), f"theme: {theme}"), None
    if key == "?":
        return replace(state, mode="help", tour_page=0), None
    if key == "t":
        return replace(state, mode="tour", tour_page=0), None
    if key == "r":
        return say(state, "refreshing"), Action("refresh")
    if key == "a":
        if not gpus:
            return say(state, "this server has no GPUs to book", True), None
        d = new_draft(state, world)
        st = replace(state, mode="form", draft=d,
                     message="new booking: arrows change the field, Enter books, Esc leaves", error=False)
        return show_time(st, world, d.start), None
    if key == "K":
        # Keep: no idle nudge and no idle release for KEEP_S (issue 25).
        r = selected(state, world)
        if r is None:
            return say(state, "select a booking first (Tab, then up and down)", True), None
        if r.uid != world.actor_uid:
            return say(state, f"{r.id[:8]} is {r.user}'s booking: you can keep only your own", True), None
        if not r.start <= world.now < r.end:
            return say(state, f"{r.id[:8]} is not running: only a running booking is kept", True), None
        return state, Action("keep", ref=r.id)
    if key in ("e", "d", "DEL", "ENTER"):
        r = selected(state, world)
        if r is None:
            return say(state, "select a booking first (Tab, then up and down)", True), None
        if key == "ENTER":
            return show_time(replace(state, focus="table"), world, max(r.start, world.now)), None
        if r.uid != world.actor_uid:
            return say(state, f"{r.id[:8]} is {r.user}'s booking: you can change only your own", True), None
        if r.end <= world.now:
            return say(state, f"{r.id[:8]} has ended: the past is read-only", True), None
        if key == "e":
            d = edit_draft(r, world)
            hint = ("running: Left and Right move its end" if d.running
                    else "arrows change the field, Enter saves, Esc leaves")
            return replace(state, mode="form", draft=d, message=f"edit {r.id[:8]}: {hint}",
                           error=False), None
        return replace(state, mode="confirm", confirm=r.id, message=None), None
    return state, None


def _tour_key(state: ViewState, key: str) -> tuple[ViewState, Action | None]:
    from bk.tui.text import TOUR

    if key in ("q", "ESC"):
        return replace(state, mode="browse", tour_page=0), None
    if key in ("p", "LEFT", "BACKSPACE", "k", "UP"):
        return replace(state, tour_page=max(0, state.tour_page - 1)), None
    if state.tour_page + 1 >= len(TOUR):
        return replace(state, mode="browse", tour_page=0, message="tour done: press t to see it again",
                       error=False), None
    return replace(state, tour_page=state.tour_page + 1), None
