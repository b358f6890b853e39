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
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bk.core.envelope import failure, success
from bk.core.errors import BkError

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
        width = shutil.get_terminal_size((80, 24)).columns if tty else int(env.get("COLUMNS") or 80)
        return cls(width=max(40, width), color=color)

    def style(self, text: str, *names: str) -> str:
        if not self.color or not names:
            return text
        codes = ";".join(_CODES[n] for n in names)
        return f"\033[{codes}m{text}\033[0m"


@dataclass
class Output:
    """What a command hands to the renderer."""

    command: str
    data: dict
    human: str | Callable[[Term], str] | None = None
    warnings: list[str] = field(default_factory=list)
    exit_code: int = 0


def table(rows: Sequence[Sequence[str]], headers: Sequence[str], term: Term,
          shrink: int | None = None) -> str:
    """Aligned columns; when too wide, column ``shrink`` is cut with an ellipsis."""
    cells = [list(map(str, headers))] + [list(map(str, r)) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    total = sum(widths) + 2 * (len(widths) - 1)
    if shrink is not None and total > term.width:
        widths[shrink] = max(len(headers[shrink]), widths[shrink] - (total - term.width))
    lines = []
    for n, row in enumerate(cells):
        parts = []
        for i, c in enumerate(row):
            if len(c) > widths[i]:
                c = c[: max(1, widths[i] - 1)] + "…"
            parts.append(c.ljust(widths[i]) if i < len(row) - 1 else c)
        line = "  ".join(parts).rstrip()
        lines.append(term.style(line, "bold") if n == 0 else line)
    return "\n".join(lines)


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
