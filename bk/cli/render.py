"""One renderer for everything a command prints.

A command returns an ``Output`` (data for JSON, text for humans).  This module
decides how it reaches the terminal: exactly one JSON envelope with
``--json``; otherwise human text, coloured only on a TTY, never with
``NO_COLOR`` or ``TERM=dumb``.  Diagnostics go to stderr as ``error:``,
``warning:`` and ``hint:`` lines.

Two promises hold whatever the terminal and whatever the ledger holds:

* Stored text cannot drive the terminal.  Notes, notice texts, user names,
  process labels, reasons and preset names are written by other people;
  an ESC byte in one could move the cursor, clear the screen or retitle the
  window of everyone who lists the bookings, and a bidi override can make
  text read backwards.  Every view passes such strings through ``safe``
  (``safe_lines`` for text that spans lines), the one policy of
  ``bk.core.safetext``, which shows those characters as visible escapes
  (``\\x1b``, ``\\u202e``, ``\\u200b``).  JSON keeps the stored strings:
  its encoder escapes them itself.
* Printing cannot undo or hide a write.  A terminal that cannot encode
  ``–`` (``LC_ALL=C``, ``PYTHONIOENCODING=ascii``) gets ASCII stand-ins
  (``_FALLBACK``), not a UnicodeEncodeError after the booking was made; and
  when stdout cannot be written at all (a full disk, a closed descriptor)
  the command says on stderr what it did (``booked a1b2c3d4, but the output
  could not be written``) and exits 74, never 70 with a traceback.  A reader
  that goes away (EPIPE, ``bk l | head``) stays quiet, as before.
"""

from __future__ import annotations

import codecs
import errno
import os
import sys

from bk.core import jsonfast
from bk.core import safetext as _safetext
from bk.core.envelope import failure, success
from bk.core.errors import EXIT_IO, BkError
from bk.core.lazyre import Pattern
from bk.core.record import dataclass, field

TYPE_CHECKING = False
if TYPE_CHECKING:   # annotations only: collections.abc would import collections
    from collections.abc import Callable, Sequence

_CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "blue": "34",
          "magenta": "35", "cyan": "36"}


@dataclass
class Term:
    """What the output device can do."""

    width: int = 80
    color: bool = False
    # Can the output device show the drawing characters (– ▼ █ · …)?
    # Views that draw (the timeline) pick ASCII glyphs when it cannot.
    unicode: bool = True
    tty: bool = False        # a person reads it now (not a file, a pipe, a log)

    @classmethod
    def detect(cls, stream=None, env=None) -> Term:
        stream = stream or sys.stdout
        env = os.environ if env is None else env
        try:
            tty = hasattr(stream, "isatty") and stream.isatty()
        except (OSError, ValueError):       # a closed stream
            tty = False
        # no-color.org: only a non-empty NO_COLOR turns colour off; NO_COLOR= keeps it.
        color = tty and not env.get("NO_COLOR") and env.get("TERM", "") != "dumb"
        return cls(width=max(40, _width(stream, env, tty)), color=color, tty=tty,
                   unicode=_encodes(stream, "–▼█·…"))

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
    # What a write changed, in its own short words ("booked a1b2c3d4"), for
    # when its output cannot be shown; None for reads and dry runs.
    done: str | None = None


_ANSI = Pattern(r"\033\[[0-9;]*m")

# ------------------------------------------------------------ safe display

# The one text policy (bk.core.safetext): every view passes text other
# people or machines wrote through these two.
safe = _safetext.safe
safe_lines = _safetext.safe_lines


# ------------------------------------------------------ encodings, failures

# Stand-ins for the characters bk itself prints, where the output encoding
# has no room for them; anything else becomes a backslash escape.
_FALLBACK = {"–": "-", "—": "-", "▼": "v", "█": "#", "·": ".", "…": "...", "→": "->",
             "≥": ">=", "≤": "<=", "×": "x", "‘": "'", "’": "'", "“": '"', "”": '"'}
FALLBACK_ERRORS = "bk-fallback"


def _fallback(err: UnicodeError):
    if not isinstance(err, UnicodeEncodeError):
        raise err
    chunk = err.object[err.start:err.end]
    return "".join(_FALLBACK.get(c) or c.encode("ascii", "backslashreplace").decode("ascii")
                   for c in chunk), err.end


codecs.register_error(FALLBACK_ERRORS, _fallback)


def _encodes(stream, sample: str) -> bool:
    encoding = getattr(stream, "encoding", None)
    if not encoding:
        return True
    try:
        sample.encode(encoding)
    except (UnicodeError, LookupError):
        return False
    return True


def setup_streams() -> None:
    """Let stdout and stderr write any text: what their encoding cannot
    hold becomes an ASCII stand-in or an escape instead of an exception
    (help, dialogs and the prompt write to them directly)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and stream.errors != FALLBACK_ERRORS:
                stream.reconfigure(errors=FALLBACK_ERRORS)
        except (AttributeError, ValueError, OSError):
            pass                    # not a TextIOWrapper: _write still copes


def _write(stream, text: str) -> None:
    if stream is None:              # the process started with the descriptor closed
        raise OSError(errno.EBADF, "standard output is closed")
    try:
        stream.write(text)
    except UnicodeEncodeError:      # a stream setup_streams could not adjust
        enc = stream.encoding or "ascii"
        stream.write(text.encode(enc, FALLBACK_ERRORS).decode(enc))


def _say(text: str, priority: int | None = None) -> None:
    """A line on stderr that may fail silently: it is the last channel left.
    ``priority`` (3 error, 4 warning): when stderr is the journal (a command
    run by systemd, ``bk broker`` failing to start), each line carries it,
    so ``journalctl -p err`` shows why (``bk.core.journal``)."""
    try:
        if priority is not None and os.environ.get("JOURNAL_STREAM"):
            from bk.core import journal

            if journal.on_journal(os.environ, sys.stderr, os.fstat):
                text = "".join(journal.lines("", journal.mark(priority, line), True)
                               for line in text.rstrip("\n").split("\n"))
        _write(sys.stderr, text)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def park_stdout() -> None:
    """Point stdout's descriptor at /dev/null, so that the interpreter's
    final flush of what is still buffered cannot fail again (it would print
    "Exception ignored" and exit 120).  Not when Python started without a
    stdout: its descriptor number may now belong to a file bk opened."""
    stream = sys.stdout
    if stream is None:
        return
    try:
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError, AttributeError):
        return
    try:
        os.dup2(null, fd)
    except OSError:
        pass
    finally:
        os.close(null)


def output_failed(exc: BaseException, done: str | None = None) -> int:
    """stdout could not take the output: say so on stderr in one line (with
    what the command did, when it changed something) and exit 74."""
    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    if sys.stdout is None:
        reason = "standard output is closed"
    what = f"{safe(done)}, but the output could not be written" if done else "the output could not be written"
    _say(f"error: {what} ({safe(reason)})\n", 3)
    park_stdout()
    return EXIT_IO


def visible_len(text: str) -> int:
    """Length on screen: colour escapes take no columns."""
    return len(_ANSI.sub("", text)) if "\033" in text else len(text)


def table(rows: Sequence[Sequence[str]], headers: Sequence[str], term: Term,
          shrink: int | Sequence[int] | None = None, *, fold: bool = False) -> str:
    """Aligned columns.  When wider than the terminal, the ``shrink`` columns
    (one index, or several in order) are cut with an ellipsis, each down to
    its header's width at most.  Cells may carry colour (``term.style``).

    ``fold``: off a terminal (a file, a pipe, a mail: read later, where the
    words matter more than one line per row), the last column, free text
    such as a reason, is never cut but folded onto continuation lines
    indented to its column, as ``bk doctor`` folds its details; the other
    ``shrink`` columns are cut only as far as it needs 20 characters."""
    cells = [list(map(str, headers))] + [list(map(str, r)) for r in rows]
    widths = [max(visible_len(r[i]) for r in cells) for i in range(len(headers))]
    order = [shrink] if isinstance(shrink, int) else list(shrink or ())
    last = len(headers) - 1
    folding = fold and not term.tty and last >= 0
    if folding:
        order = [i for i in order if i != last]
    ell = "…" if term.unicode else "..."
    for i in order:
        if folding:
            excess = sum(widths[:last]) + 2 * last + FOLD_MIN - term.width
        else:
            excess = sum(widths) + 2 * (len(widths) - 1) - term.width
        if excess <= 0:
            break
        widths[i] = max(len(headers[i]), 2, widths[i] - excess)
    start = sum(widths[:last]) + 2 * last
    lines = []
    for n, row in enumerate(cells):
        parts = []
        for i, c in enumerate(row):
            if folding and i == last:
                break
            if visible_len(c) > widths[i]:
                c = _ANSI.sub("", c)[: max(1, widths[i] - len(ell))] + ell
            pad = widths[i] - visible_len(c)
            parts.append(c + " " * pad if i < len(row) - 1 else c)
        more: list[str] = []
        indent = start
        if folding:
            from bk.core import textfold

            if term.width - start >= FOLD_MIN or n == 0:
                first, *more = textfold.wrap(row[last], width=max(FOLD_MIN, term.width - start),
                                             break_long_words=True, break_on_hyphens=False) or [""]
                parts.append(first)
            else:
                # Too little room beside the other columns: the text goes
                # on the lines below the row, indented a little.
                indent = FOLD_INDENT
                more = textfold.wrap(row[last], width=term.width - indent, break_long_words=True,
                                     break_on_hyphens=False)
        line = "  ".join(parts).rstrip()
        lines.append(term.style(line, "bold") if n == 0 else line)
        lines.extend(" " * indent + m for m in more)
    return "\n".join(lines)


FOLD_MIN = 20            # the narrowest a folded last column gets beside the others
FOLD_INDENT = 4          # below them otherwise


def wrap(text: str, width: int, indent: str = "", hanging: str | None = None) -> str:
    """Free text (notices, notes, reasons) folded to the terminal width;
    continuation lines take ``hanging`` (default: ``indent``), as
    ``textwrap.wrap`` folds them (``bk.core.textfold``: without ``re``)."""
    from bk.core import textfold

    return "\n".join(textfold.wrap(
        text, width=max(20, width), initial_indent=indent,
        subsequent_indent=indent if hanging is None else hanging,
        break_long_words=True)) or indent.rstrip()


def fit(line: str, width: int) -> str:
    """One line cut to ``width`` characters (with an ellipsis)."""
    return line if len(line) <= width else line[: max(1, width - 1)] + "…"


def emit(out: Output, as_json: bool, term: Term | None = None) -> int:
    """Print ``out`` once.  A closed pipe (EPIPE) propagates, for the
    caller's quiet exit; any other failure to write is ``output_failed``."""
    if as_json:
        text = jsonfast.dumps(success(out.command, out.data, out.warnings)) + "\n"
    else:
        for w in out.warnings:
            _say(f"warning: {safe_lines(w)}\n", 4)
        term = term or Term.detect()
        text = _human_text(out, term)
    try:
        if text:
            _write(sys.stdout, text)
        if sys.stdout is not None:
            sys.stdout.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as exc:    # ValueError: a closed file object
        return output_failed(exc, out.done)
    return out.exit_code


def _human_text(out: Output, term: Term) -> str:
    try:
        text = out.human(term) if callable(out.human) else out.human
    except Exception as exc:
        # A view's bug must not make a committed write look failed: show the
        # write's own words, and the bug on stderr.
        if out.done is None or os.environ.get("BK_DEBUG") == "1":
            raise
        _say(f"warning: the full output could not be shown ({type(exc).__name__}: {safe(exc)})\n")
        text = out.done
    return text.rstrip("\n") + "\n" if text else ""


def emit_error(command: str, err: BkError, as_json: bool, warnings: list[str] | None = None) -> int:
    if as_json:
        try:
            _write(sys.stdout, jsonfast.dumps(failure(command, err, warnings)) + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            park_stdout()
        except (OSError, ValueError) as exc:
            # The envelope is lost: the error itself must still be said.
            _say(f"error: {safe_lines(err.message)}\n", 3)
            output_failed(exc)
    else:
        for w in warnings or []:
            _say(f"warning: {safe_lines(w)}\n", 4)
        _say(f"error: {safe_lines(err.message)}\n", 3)
        if err.hint:
            _say(f"hint: {safe_lines(err.hint)}\n", 3)     # the error's fix: found with it
    return err.exit_code
