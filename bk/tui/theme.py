"""Themes and character sets: what a cell looks like, decided once.

A theme maps each kind of text the screen draws (``mine``, ``full``,
``cursor``) to a ``Style``: a foreground and background colour name (the
eight of curses, or None for the terminal's own) and flags.  Every kind
that matters also differs by *glyph* or flag (own bookings are letters and
bold, the cursor is reversed), so the screen reads the same without
colour: ``NO_COLOR`` gives the ``plain`` theme, flags only.

Which theme: ``COLORFGBG`` (set by rxvt, Konsole, iTerm2 and others as
``fg;bg``, background 7 or 15 meaning a light one) when present, else dark;
``T`` switches.  Which characters: Unicode box drawing and blocks only
when the locale's encoding is UTF-8 (inside tmux and screen too, which
pass them through), plain ASCII otherwise.  curses' alternate character
set (``ACS_HLINE``) is not used: where a terminal's ``acsc`` capability is
wrong (a TERM copied to a machine with another terminfo, screen inside a
UTF-8 xterm) it shows as the raw letters ``lqqk``.
"""

from __future__ import annotations

from bk.core.record import dataclass


@dataclass(frozen=True)
class Style:
    fg: str | None = None
    bg: str | None = None
    bold: bool = False
    reverse: bool = False
    underline: bool = False
    dim: bool = False


@dataclass(frozen=True)
class Theme:
    name: str
    styles: dict
    color: bool = True

    def style(self, kind: str) -> Style:
        return self.styles.get(kind) or self.styles["normal"]


# What carries meaning without colour: the flags (and the glyphs in render).
_FLAGS = {
    "normal": Style(), "header": Style(bold=True, reverse=True), "banner": Style(bold=True),
    "banner_warn": Style(bold=True, reverse=True), "label": Style(bold=True),
    "label_sel": Style(bold=True, reverse=True), "now": Style(bold=True), "free": Style(dim=True),
    "mine": Style(bold=True), "other": Style(), "full": Style(), "blackout": Style(dim=True),
    "disabled": Style(dim=True), "draft": Style(bold=True, underline=True),
    "conflict": Style(bold=True, reverse=True), "cursor": Style(reverse=True), "rule": Style(dim=True),
    "th": Style(bold=True, underline=True), "row": Style(), "row_mine": Style(bold=True),
    "row_sel": Style(reverse=True), "row_mine_sel": Style(bold=True, reverse=True),
    "status": Style(), "error": Style(bold=True), "keys": Style(dim=True), "field": Style(),
    "field_on": Style(reverse=True), "box": Style(), "title": Style(bold=True),
}

_DARK = {
    "header": ("white", "blue"), "banner": ("yellow", None), "banner_warn": ("white", "red"),
    "now": ("yellow", None), "free": (None, None), "mine": ("green", None), "other": ("cyan", None),
    "full": ("red", None), "blackout": ("yellow", None), "disabled": ("magenta", None),
    "draft": ("yellow", None), "conflict": ("white", "red"), "row_mine": ("green", None),
    "row_mine_sel": ("green", None), "error": ("red", None), "title": ("cyan", None),
    "label_sel": (None, None), "cursor": (None, None),
}

_LIGHT = {
    "header": ("white", "blue"), "banner": ("red", None), "banner_warn": ("white", "red"),
    "now": ("red", None), "mine": ("blue", None), "other": ("magenta", None), "full": ("red", None),
    "blackout": ("black", None), "disabled": ("black", None), "draft": ("blue", None),
    "conflict": ("white", "red"), "row_mine": ("blue", None), "row_mine_sel": ("blue", None),
    "error": ("red", None), "title": ("blue", None),
}


def _theme(name: str, colours: dict | None) -> Theme:
    styles = {}
    for kind, flags in _FLAGS.items():
        fg, bg = (colours or {}).get(kind, (None, None))
        styles[kind] = Style(fg, bg, flags.bold, flags.reverse, flags.underline, flags.dim)
    return Theme(name, styles, colours is not None)


THEMES = {"dark": _theme("dark", _DARK), "light": _theme("light", _LIGHT)}
PLAIN = _theme("plain", None)


def theme_for(name: str, env: dict) -> Theme:
    """The theme named, or the flags-only one under ``NO_COLOR`` (any
    non-empty value, as no-color.org says)."""
    if env.get("NO_COLOR"):
        return PLAIN
    return THEMES.get(name, THEMES["dark"])


def detect_theme(env: dict) -> str:
    """``light`` when ``COLORFGBG`` names a light background, else ``dark``."""
    bg = env.get("COLORFGBG", "").split(";")[-1].strip()
    return "light" if bg in ("7", "15") else "dark"


@dataclass(frozen=True)
class Charset:
    name: str
    hline: str
    vline: str
    corners: str                       # top-left, top-right, bottom-left, bottom-right
    full: str
    free: str
    now: str
    before: str                        # now lies left of the window
    after: str                         # now lies right of it
    dash: str                          # between two times
    sep: str                           # between header parts


UNICODE = Charset("unicode", "─", "│", "┌┐└┘", "█", "·", "▼", "◀", "▶", "–", " · ")
ASCII = Charset("ascii", "-", "|", "++++", "@", ".", "v", "<", ">", "-", " | ")


def charset_for(encoding: str | None) -> Charset:
    enc = (encoding or "").lower().replace("-", "").replace("_", "")
    return UNICODE if enc in ("utf8", "utf8mb4") else ASCII
