"""One renderer for everything a command prints.

A command returns an ``Output`` (data for JSON, text for humans).  This module
decides how it reaches the terminal: exactly one JSON envelope with
``--json``; otherwise human text, coloured only on a TTY, never with
``NO_COLOR`` or ``TERM=dumb``.  Diagnostics go to stderr as ``error:``,
``warning:`` and ``hint:`` lines.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Sequence

from bk.core.envelope import failure, success
from bk.core.errors import BkError
from bk.core.record import dataclass, field

_CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "blue": "34",
          "magenta": "35", "cyan": "36"}


@dataclass
class Term:
    """What the output device can do."""

    width: int = 80
    color: bool = False

    @classmethod
    def detect(cls, stream=None, env=None) -> Term:
        stream = stream or sys.stdout
        env = os.environ if env is None else env
        tty = hasattr(stream, "isatty") and stream.isatty()
        color = tty and "NO_COLOR" not in env and env.get("TERM", "") != "dumb"
        return cls(width=max(40, _width(stream, env, tty)), color=color)

    def style(self, text: str, *names: str) -> str:
        if not self.color or not names:
            return text
        codes = ";".join(_CODES[n] for n in names)
        return f"\033[{codes}m{text}\033[0m"


def _width(stream, env, tty: bool) -> int:
    # COLUMNS wins, as in shutil.get_terminal_size, but read from the
    # environment we were given (tests and the prompt pass their own).
    cols = env.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return int(cols)
    if tty:
        try:
            return os.get_terminal_size(stream.fileno()).columns or 80
        except (OSError, ValueError, AttributeError):
            pass
    return 80


@dataclass
class Output:
    """What a command hands to the renderer."""

    command: str
    data: dict
    human: str | Callable[[Term], str] | None = None
    warnings: list[str] = field(default_factory=list)
    exit_code: int = 0


_ANSI = re.compile(r"\033\[[0-9;]*m")


def visible_len(text: str) -> int:
    """Length on screen: colour escapes take no columns."""
    return len(_ANSI.sub("", text)) if "\033" in text else len(text)


def table(rows: Sequence[Sequence[str]], headers: Sequence[str], term: Term,
          shrink: int | Sequence[int] | None = None) -> str:
    """Aligned columns.  When wider than the terminal, the ``shrink`` columns
    (one index, or several in order) are cut with an ellipsis, each down to
    its header's width at most.  Cells may carry colour (``term.style``)."""
    cells = [list(map(str, headers))] + [list(map(str, r)) for r in rows]
    widths = [max(visible_len(r[i]) for r in cells) for i in range(len(headers))]
    order = [shrink] if isinstance(shrink, int) else list(shrink or ())
    for i in order:
        excess = sum(widths) + 2 * (len(widths) - 1) - term.width
        if excess <= 0:
            break
        widths[i] = max(len(headers[i]), 2, widths[i] - excess)
    lines = []
    for n, row in enumerate(cells):
        parts = []
        for i, c in enumerate(row):
            if visible_len(c) > widths[i]:
                c = _ANSI.sub("", c)[: max(1, widths[i] - 1)] + "…"
            pad = widths[i] - visible_len(c)
            parts.append(c + " " * pad if i < len(row) - 1 else c)
        line = "  ".join(parts).rstrip()
        lines.append(term.style(line, "bold") if n == 0 else line)
    return "\n".join(lines)


def wrap(text: str, width: int, indent: str = "", hanging: str | None = None) -> str:
    """Free text (notices, notes, reasons) folded to the terminal width;
    continuation lines take ``hanging`` (default: ``indent``)."""
    import textwrap

    return "\n".join(textwrap.wrap(
        text, width=max(20, width), initial_indent=indent,
        subsequent_indent=indent if hanging is None else hanging,
        break_long_words=True)) or indent.rstrip()


def fit(line: str, width: int) -> str:
    """One line cut to ``width`` characters (with an ellipsis)."""
    return line if len(line) <= width else line[: max(1, width - 1)] + "…"


def emit(out: Output, as_json: bool, term: Term | None = None) -> int:
    if as_json:
        sys.stdout.write(json.dumps(success(out.command, out.data, out.warnings)) + "\n")
    else:
        for w in out.warnings:
            sys.stderr.write(f"warning: {w}\n")
        term = term or Term.detect()
        text = out.human(term) if callable(out.human) else out.human
        if text:
            sys.stdout.write(text.rstrip("\n") + "\n")
    sys.stdout.flush()
    return out.exit_code


def emit_error(command: str, err: BkError, as_json: bool, warnings: list[str] | None = None) -> int:
    if as_json:
        sys.stdout.write(json.dumps(failure(command, err, warnings)) + "\n")
        sys.stdout.flush()
    else:
        for w in warnings or []:
            sys.stderr.write(f"warning: {w}\n")
        sys.stderr.write(f"error: {err.message}\n")
        if err.hint:
            sys.stderr.write(f"hint: {err.hint}\n")
    return err.exit_code
