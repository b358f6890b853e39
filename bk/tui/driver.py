"""The thin curses driver: the only code of ``bk t`` that touches the terminal.

How the terminal behaves, and what follows:

* ``curses.wrapper`` puts the terminal in cbreak mode on the alternate
  screen and runs ``endwin`` in a ``finally``, so a Python exception
  restores it.  Signals are not exceptions: SIGTERM and SIGHUP would kill
  the process without running the ``finally``.  Their handlers here raise
  ``Stopped``, which unwinds through it.  After a SIGHUP (the SSH session
  dropped) writing to the terminal may fail with EIO; that is swallowed,
  there is nobody left to read it.
* Ctrl-Z sends SIGTSTP.  A stopped full-screen program must first give the
  terminal back (``endwin``: the shell's screen, echo, the cursor), then
  really stop (the default action, re-raised at itself), and on ``fg``
  (SIGCONT, when ``os.kill`` returns) take it again and redraw everything,
  since the shell wrote over the screen meanwhile.
* Python runs signal handlers between bytecodes on the main thread; a
  ``get_wch`` waiting with a timeout returns on EINTR, so a handler runs
  within one timeout at worst.  Only this thread touches curses; the
  loader thread only replaces ``Loader.latest``.
* The input wait (``timeout``) is also the idle loop: nothing is drawn
  unless a key came or a new ``World`` arrived (once a second), so an idle
  screen costs a wake-up every ``POLL_MS`` and one frame a second.
* Characters: under a UTF-8 locale (``setlocale(LC_ALL, "")`` first, or
  ncursesw writes bytes, not characters) the Unicode set; otherwise ASCII,
  and any other character is written as ``?`` rather than failing.
"""

from __future__ import annotations

import locale
import os
import signal
import sys

from bk.core.record import replace
from bk.tui import actions, keys, layout, render, theme

POLL_MS = 200
TOUR_MARKER = "tui-tour-seen"


class Stopped(Exception):
    """SIGTERM or SIGHUP: leave the screen, restoring the terminal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def why_not(env: dict, stdin=None, stdout=None) -> str | None:
    """Why curses cannot start here, or None when it can."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    try:
        if stdin is None or stdout is None or not stdin.isatty() or not stdout.isatty():
            return "no terminal (standard input and output must both be a terminal)"
    except (ValueError, OSError):
        return "no terminal"
    term = env.get("TERM", "")
    if not term or term in ("dumb", "unknown"):
        return f"TERM={term or '(unset)'} cannot draw a full screen"
    try:
        import curses

        curses.setupterm(term, stdout.fileno())
    except Exception as exc:  # noqa: BLE001 - curses.error, or no _curses at all
        return f"the terminal {term!r} is not known to curses here ({exc})"
    try:
        size = os.get_terminal_size(stdout.fileno())
    except OSError:
        return "the terminal's size is unknown"
    if size.columns < layout.MIN_W or size.lines < layout.MIN_H:
        return (f"terminal too small (need {layout.MIN_W}x{layout.MIN_H}, this one is "
                f"{size.columns}x{size.lines})")
    return None


_SPECIAL = None


def _special(curses) -> dict:
    global _SPECIAL
    if _SPECIAL is None:
        _SPECIAL = {curses.KEY_LEFT: "LEFT", curses.KEY_RIGHT: "RIGHT", curses.KEY_UP: "UP",
                    curses.KEY_DOWN: "DOWN", curses.KEY_PPAGE: "PGUP", curses.KEY_NPAGE: "PGDN",
                    curses.KEY_HOME: "HOME", curses.KEY_END: "END", curses.KEY_ENTER: "ENTER",
                    curses.KEY_BACKSPACE: "BACKSPACE", curses.KEY_DC: "DEL", curses.KEY_BTAB: "BTAB",
                    curses.KEY_RESIZE: "RESIZE"}
    return _SPECIAL


def key_name(curses, k) -> str | None:
    if isinstance(k, int):
        return _special(curses).get(k)
    return {"\n": "ENTER", "\r": "ENTER", "\x1b": "ESC", "\t": "TAB", "\x7f": "BACKSPACE",
            "\b": "BACKSPACE"}.get(k, k if k.isprintable() else None)


class Screen:
    """Styles to curses attributes, frames to the window."""

    def __init__(self, curses, win, encoding: str):
        self.c, self.win, self.enc = curses, win, encoding
        self.colors = False
        try:
            if curses.has_colors():
                curses.start_color()
                try:
                    curses.use_default_colors()
                    self._default = -1
                except curses.error:
                    self._default = 0
                self.colors = True
        except curses.error:
            self.colors = False
        self._pairs: dict = {}
        self._attrs: dict = {}
        self._names = {"black": curses.COLOR_BLACK, "red": curses.COLOR_RED, "green": curses.COLOR_GREEN,
                       "yellow": curses.COLOR_YELLOW, "blue": curses.COLOR_BLUE,
                       "magenta": curses.COLOR_MAGENTA, "cyan": curses.COLOR_CYAN,
                       "white": curses.COLOR_WHITE}

    def attr(self, st) -> int:
        a = self._attrs.get(st)
        if a is not None:
            return a
        c = self.c
        a = ((c.A_BOLD if st.bold else 0) | (c.A_REVERSE if st.reverse else 0)
             | (c.A_UNDERLINE if st.underline else 0) | (c.A_DIM if st.dim else 0))
        if self.colors and (st.fg or st.bg):
            key = (st.fg, st.bg)
            pair = self._pairs.get(key)
            if pair is None and len(self._pairs) + 1 < getattr(c, "COLOR_PAIRS", 8):
                pair = len(self._pairs) + 1
                try:
                    c.init_pair(pair, self._names.get(st.fg, self._default),
                                self._names.get(st.bg, self._default))
                except c.error:
                    pair = 0
                self._pairs[key] = pair
            if pair:
                a |= c.color_pair(pair)
        self._attrs[st] = a
        return a

    def draw(self, frame) -> None:
        win, c = self.win, self.c
        win.erase()
        ascii_only = self.enc != "utf-8"
        for y, line in enumerate(frame.lines):
            x = 0
            for s, st in line:
                if ascii_only and not s.isascii():
                    s = s.encode("ascii", "replace").decode()
                try:
                    win.addstr(y, x, s, self.attr(st))
                except c.error:
                    pass        # the last cell of the screen: the cursor cannot move past it
                x += render.width_of(s)
        win.noutrefresh()
        c.doupdate()


def _encoding() -> str:
    enc = (locale.getpreferredencoding(False) or "").lower().replace("_", "-")
    return "utf-8" if enc in ("utf-8", "utf8") else enc


def run(app, env: dict, *, theme_name: str = "auto", ascii_only: bool = False, interval: float = 1.0,
        tour: bool | None = None) -> dict:
    """Run the screen until the user quits; -> what was done
    (``{"booked": [...], "changed": [...], "cancelled": [...]}``)."""
    import curses

    from bk.tui.world import Loader

    locale.setlocale(locale.LC_ALL, "")
    enc = _encoding()
    cs = theme.ASCII if ascii_only else theme.charset_for(enc)
    name = theme.detect_theme(env) if theme_name == "auto" else theme_name
    first = tour if tour is not None else not _tour_seen(app)
    done: dict = {"booked": [], "changed": [], "cancelled": []}
    loader = Loader(app, interval=interval)
    os.environ.setdefault("ESCDELAY", "25")

    got: list[int] = []

    def stop(signum, _frame):
        got.append(signum)
        raise Stopped(signum)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        curses.wrapper(_main, app, env, loader, cs, name, first, done)
    except Stopped as e:
        done["signal"] = signal.Signals(e.signum).name
    except curses.error:
        if not got:
            raise
        # endwin after a hang-up: the terminal is gone, nobody to restore it for.
        done["signal"] = signal.Signals(got[0]).name
    finally:
        loader.stop()
        for s, h in old.items():
            signal.signal(s, h)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
    if first:
        _mark_tour_seen(app)
    return done


def _main(win, app, env, loader, cs, theme_name, first_tour, done) -> None:
    import curses

    try:
        curses.curs_set(0)
    except curses.error:
        pass
    win.keypad(True)
    win.timeout(POLL_MS)
    screen = Screen(curses, win, _encoding())
    h, w = win.getmaxyx()
    state = keys.ViewState(width=w, height=h, theme=theme_name, mode="tour" if first_tour else "browse")

    def suspend(_signum, _frame):
        # Give the terminal back, stop for real, and take it again on fg.
        curses.endwin()
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)
        signal.signal(signal.SIGTSTP, suspend)
        win.clearok(True)
        redraw[0] = True

    redraw = [True]
    signal.signal(signal.SIGTSTP, suspend)
    loader.start()
    last_seq, last_look = -1, None
    while True:
        world = loader.latest
        seq = world.seq if world is not None else -1
        look = None
        if seq != last_seq and world is not None:
            # A new world that shows what the last one showed (the same
            # minute, the same bookings and GPUs) needs no frame: an idle
            # screen draws once a minute, not once a second.
            look = looks(world)
            if look == last_look and not redraw[0]:
                last_seq = seq
                look = None
        if redraw[0] or seq != last_seq:
            th = theme.theme_for(state.theme, env)
            frame = render.render(state, world, (state.width, state.height), th, cs)
            screen.draw(frame)
            redraw[0], last_seq = False, seq
            if world is not None:
                last_look = look if look is not None else looks(world)
        try:
            k = win.get_wch()
        except curses.error:
            continue                # the timeout: nothing typed
        name = key_name(curses, k)
        if name is None:
            continue
        if name == "RESIZE":
            h, w = win.getmaxyx()
            state = replace(state, width=w, height=h)
            win.clear()
            redraw[0] = True
            continue
        if world is None:
            if name in ("q", "Q"):
                return
            continue
        too_small = state.width < layout.MIN_W or state.height < layout.MIN_H
        if too_small:
            if name in ("q", "Q"):
                return
            continue
        state, action = keys.handle(state, name, world)
        redraw[0] = True
        if action is None:
            continue
        if action.kind == "quit":
            return
        if action.kind == "refresh":
            loader.wake()
            continue
        busy = {"book": "booking...", "edit": "saving...", "cancel": "cancelling...",
                "find": "looking for the earliest start...", "keep": "keeping..."}[action.kind]
        screen.draw(render.render(keys.say(state, busy), world, (state.width, state.height),
                                  theme.theme_for(state.theme, env), cs))
        state = apply_outcome(state, action, actions.perform(app, action, loader.snapshot), world, done)
        loader.wake()


def looks(world) -> tuple:
    """What a frame of ``world`` depends on besides the screen's state."""
    return (world.now // 60, world.reservations, world.blackouts, world.notices, world.gpus, world.live,
            world.monitor, world.worker, world.error, world.warnings)


def apply_outcome(state, action, out, world, done: dict):
    """The screen after an action's outcome (pure; the driver's last step)."""
    if out is None:
        return state
    if out.done:
        bucket = {"book": "booked", "edit": "changed", "cancel": "cancelled"}.get(action.kind)
        if bucket and out.reservation and not out.message.startswith("nothing"):
            done[bucket].append(out.reservation)
        return replace(state, mode="browse", draft=None, sel=out.reservation or state.sel,
                       message=out.message, error=False)
    if out.draft is not None:
        st = replace(state, draft=out.draft, message=out.message, error=out.error)
        return keys.show_time(st, world, out.draft.start)
    return replace(state, message=out.message, error=out.error)


def _marker(app) -> str | None:
    from bk.core.errors import BkError
    from bk.service import Empty

    try:
        return os.path.join(app.run("config", Empty())["state_dir"], TOUR_MARKER)
    except (BkError, AttributeError, KeyError, TypeError):
        return None


def _tour_seen(app) -> bool:
    path = _marker(app)
    return path is None or os.path.exists(path)


def _mark_tour_seen(app) -> None:
    """A marker in the user's private state directory: the tour shows once."""
    path = _marker(app)
    if path is None:
        return
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        os.close(fd)
    except OSError:
        pass            # the tour shows again next time; nothing else depends on it
