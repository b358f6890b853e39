"""Text that came from someone else, made safe to show a person.

The facts:

* A terminal obeys what it is sent.  C0 controls (ESC, CR, BS, BEL...), DEL
  and the C1 controls (0x9b is a one-byte CSI to many terminals) start
  sequences that move the cursor, clear the screen, retitle the window,
  hide text, make hyperlinks, or write the clipboard (OSC 52).  A CR alone
  lets a later part of a line overwrite an earlier one.
* Unicode's format characters (category Cf) draw nothing and change how
  the rest reads: the bidi embeddings, overrides, isolates and marks
  (U+202A-E, U+2066-9, U+200E/F, U+061C) make text read in another order
  than it is stored (the "Trojan Source" trick); zero-width spaces and
  joiners (U+200B-D, U+2060, U+FEFF) hide a difference between two names
  that look the same.  U+2028/9 are line breaks to some programs and not to
  others.  A lone surrogate is no character at all: no encoder writes it.
  The Hangul fillers are letters that draw nothing either.
* The people who write such text are other users (notes, notices, user
  names, process command lines), other machines (a cluster node's replies,
  its errors, its ssh diagnostics) and hardware (a GPU's name).

The decision: one function, ``safe``, through which every front end passes
such text before a terminal sees it (the CLI's renderer, the TUI's cells,
the cluster client, the monitor's process labels at their source).  Every
character above is shown as a visible escape (``\\x1b``, ``\\x9b``,
``\\u202e``, ``\\u200b``, ``\\ud800``, ``\\U000e0041``), or, where a fixed
cell has no room for one (the TUI), as ``mark`` (``?``).  Everything else
is unchanged: any script, emoji, the no-break and ideographic spaces,
private-use characters (icon fonts) and code points this Python's Unicode
tables do not know yet (newer emoji).  ``multiline=True`` keeps the line
breaks and tabs of text that is meant to span lines (a node's output, an
error message); a CR-LF pair is one line break.

Consequences, accepted: an emoji sequence held together by a zero-width
joiner (a family, a profession) shows its joiners as ``\\u200d``, and a
flag made of tag characters shows its tags.  A backslash is not escaped,
so text that already spells ``\\u202e`` looks like an escaped override; the
JSON output (``--json``) holds the exact stored text for anyone who needs
to tell them apart.

``steers`` is the stricter rule for what may enter the shared ledger at
all (``bk.service.fields.check_text``): the controls, the line separators,
the bidi controls and surrogates are refused there; the other invisible
characters are accepted and escaped when shown.
"""

from __future__ import annotations

# Shown escaped wherever they appear (by category; Cc is C0, DEL and C1).
_ESCAPED_CATEGORIES = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))
# Letters (Lo) that draw nothing: the Hangul choseong/jungseong fillers,
# the Hangul filler and its halfwidth form.
INVISIBLE_LETTERS = frozenset("\u115f\u1160\u3164\uffa0")
# Unicode's Bidi_Control property: what reorders text.
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def escaped(c: str) -> bool:
    """Is the one character ``c`` shown escaped by ``safe``?"""
    if c.isprintable():
        return c in INVISIBLE_LETTERS
    if c < "\xa0":                  # C0, DEL, C1
        return True
    import unicodedata

    return unicodedata.category(c) in _ESCAPED_CATEGORIES


def escape(c: str) -> str:
    """The visible escape of one character: ``\\x1b``, ``\\u202e``, ``\\U000e0041``."""
    n = ord(c)
    return _NAMED.get(c) or (f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")


def safe(text, *, multiline: bool = False, mark: str | None = None) -> str:
    """``text`` (anything: ``str()`` is taken) with every character that
    could steer a terminal or hide itself shown as its escape, or as
    ``mark`` when one is given.  ``multiline`` keeps ``\\n`` and ``\\t``
    (and turns ``\\r\\n`` into ``\\n``).  Printable text, any script, comes
    back unchanged (and fast: one C-level test)."""
    text = text if isinstance(text, str) else str(text)
    if text.isprintable() and (text.isascii() or not _has_invisible_letter(text)):
        return text
    if multiline and "\r\n" in text:
        text = text.replace("\r\n", "\n")
    out = []
    for c in text:
        if (multiline and c in "\n\t") or not escaped(c):
            out.append(c)
        else:
            out.append(escape(c) if mark is None else mark)
    return "".join(out)


def _has_invisible_letter(text: str) -> bool:
    # Four substring searches in C beat a Python loop over the text.
    return "\u3164" in text or "\u115f" in text or "\u1160" in text or "\uffa0" in text


def safe_lines(text) -> str:
    """``safe`` for text meant to span lines: a warning, an error, a node's output."""
    return safe(text, multiline=True)


def steers(text: str) -> bool:
    """Does ``text`` hold a character the shared ledger refuses: a control
    (tab and newline included), a line or paragraph separator, a bidi
    control, or a lone surrogate?"""
    if text.isprintable():
        return False
    for c in text:
        if c.isprintable():
            continue
        if c < "\xa0" or c in BIDI_CONTROLS or c in "\u2028\u2029" or "\ud800" <= c <= "\udfff":
            return True
    return False
