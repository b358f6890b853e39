"""Folding text to a width: what ``textwrap.wrap`` does for bk, without ``re``.

Why not ``textwrap``?  It compiles its word-splitting patterns when it is
imported, so ``import textwrap`` is ``import re`` and the pattern compiler
too: about 3.5 ms, more than a booking's own work, and every command that
prints a sentence wider than the terminal (a booking's line, ``bk st``'s
notes) folds it.

What this module promises.  ``wrap(text, width, ...)`` returns exactly the
lines ``textwrap.wrap`` returns for the same arguments, at its defaults
otherwise (tabs expanded to 8 columns, every ASCII whitespace character
made a space, whitespace dropped at the ends of lines, no sentence-ending
fixes, no line limit).  Like textwrap it first cuts the text into chunks
(runs of spaces, and words), then fills lines with whole chunks, breaking
a chunk only when it is longer than a whole line.  With ``break_on_hyphens``
a word also ends after a hyphen that joins two letters on each side
(``sim-count`` is ``sim-``, ``count``), and a run of two or more hyphens
between words (an em-dash written ``--``) is a chunk of its own; "letter"
and "word character" are what Python's regular expressions call ``[^\\d\\W]``
and ``\\w``.  tests/test_textfold.py holds it to ``textwrap`` on every short
text over the characters that matter and on random long ones.
"""

from __future__ import annotations

_SPACE = "\t\n\x0b\x0c\r "          # what textwrap calls whitespace (ASCII only)
_TO_SPACE = dict.fromkeys(map(ord, _SPACE), " ")
_PUNCT = "!\"'&.,?"                  # with the word characters: what may come before a "--"


def _word(c: str) -> bool:
    return c.isalnum() or c == "_"


def _letter(c: str) -> bool:
    return (c.isalnum() or c == "_") and not c.isdecimal()


def _dashes_then_word(text: str, i: int) -> int:
    """The end of a run of two or more hyphens at ``i`` that a word
    character follows, else -1."""
    j = i
    n = len(text)
    while j < n and text[j] == "-":
        j += 1
    return j if j - i >= 2 and j < n and _word(text[j]) else -1


def _joining_hyphen(text: str, q: int) -> bool:
    """Whether the hyphen at ``q`` ends a word: two letters (or a letter, a
    hyphen and a letter) before it, a letter after it, then a letter or a
    hyphen and a letter."""
    n = len(text)
    before = (q >= 2 and _letter(text[q - 2]) and _letter(text[q - 1])) or \
        (q >= 3 and _letter(text[q - 3]) and text[q - 2] == "-" and _letter(text[q - 1]))
    if not before or q + 2 >= n or not _letter(text[q + 1]):
        return False
    return _letter(text[q + 2]) or (text[q + 2] == "-" and q + 3 < n and _letter(text[q + 3]))


def chunks(text: str, break_on_hyphens: bool = True) -> list[str]:
    """The chunks ``textwrap`` fills lines with, from text already made
    plain (``_plain``)."""
    out = []
    pos, n = 0, len(text)
    while pos < n:
        if text[pos] in _SPACE:
            end = pos + 1
            while end < n and text[end] in _SPACE:
                end += 1
        elif break_on_hyphens and pos and (_word(text[pos - 1]) or text[pos - 1] in _PUNCT) and \
                (dashes := _dashes_then_word(text, pos)) > 0:
            end = dashes                                  # an em-dash between words
        else:
            end = pos + 1                                 # a word: its shortest run that ends here
            while end < n and text[end] not in _SPACE:
                if not break_on_hyphens:
                    end += 1
                    continue
                if text[end] == "-" and _joining_hyphen(text, end):
                    end += 1
                    break
                if (_word(text[end - 1]) or text[end - 1] in _PUNCT) and _dashes_then_word(text, end) > 0:
                    break
                end += 1
        out.append(text[pos:end])
        pos = end
    return out


def _plain(text: str) -> str:
    return text.expandtabs(8).translate(_TO_SPACE)


def wrap(text: str, width: int, *, initial_indent: str = "", subsequent_indent: str = "",
         break_long_words: bool = True, break_on_hyphens: bool = True) -> list[str]:
    """``textwrap.wrap(text, width, initial_indent=..., subsequent_indent=...,
    break_long_words=..., break_on_hyphens=...)``."""
    if width <= 0:
        raise ValueError(f"invalid width {width!r} (must be > 0)")
    todo = chunks(_plain(text), break_on_hyphens)
    todo.reverse()                          # the next chunk is the last
    lines: list[str] = []
    while todo:
        indent = subsequent_indent if lines else initial_indent
        room = width - len(indent)
        if lines and todo[-1].strip() == "":
            todo.pop()                      # a line does not start with the break's spaces
        if room < 1 and todo and not todo[-1]:
            # What is left of a cut chunk, with an indent as wide as the
            # line and no line made yet: textwrap cuts it again forever.
            todo.pop()
            continue
        line: list[str] = []
        used = 0
        while todo and used + len(todo[-1]) <= room:
            used += len(todo[-1])
            line.append(todo.pop())
        if todo and len(todo[-1]) > room:
            # A chunk longer than a line: cut it (after its last hyphen
            # in reach, when one follows something else than hyphens).
            left = 1 if room < 1 else room - used
            if break_long_words:
                chunk = todo[-1]
                end = left
                if break_on_hyphens and len(chunk) > left:
                    hyphen = chunk.rfind("-", 0, left)
                    if hyphen > 0 and chunk[:hyphen].strip("-"):
                        end = hyphen + 1
                line.append(chunk[:end])
                todo[-1] = chunk[end:]
            elif not line:
                line.append(todo.pop())
        if line and line[-1].strip() == "":
            line.pop()                      # nor end with them
        if line:
            lines.append(indent + "".join(line))
    return lines
