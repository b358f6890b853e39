"""The daemons' log lines and their journal priorities (pure; the stream,
the environment and ``fstat`` are arguments).

How systemd reads them.  A service's stderr is a stream into journald,
which stores each line as one record.  A line that starts with ``<N>``
(sd-daemon(3): 3 error, 4 warning, 5 notice, 6 info, 7 debug) gets that
priority and loses the prefix, so ``journalctl -p err`` finds the errors;
a line without one is stored at the unit's default, info.  Anywhere else (a
terminal, a file, a pipe) the prefix is noise.  systemd says where it is:
for a service whose stderr is the journal stream it sets
``JOURNAL_STREAM=DEV:INODE``, the device and inode of that stream, and a
program that finds its own stderr to be that file knows it is read by the
journal (systemd.exec(5)).  So the prefix is written only then.

The decision.  A daemon's logger stays a ``Callable[[str], None]`` (tests
pass ``list.append``).  A message carries its priority as a leading
marker, made by ``error()``, ``warning()``, ``notice()``, ``info()``; a
message without one is info.  ``write`` turns a message into lines, every
line of it (a traceback too) with the tag and, on the journal, the
priority.  The broker, the monitor and the worker all write through it,
and the command line's ``error:``/``warning:`` lines too (``bk.cli.render``).
"""

from __future__ import annotations

ERR, WARNING, NOTICE, INFO = 3, 4, 5, 6


def mark(priority: int, text: str) -> str:
    """``text`` marked with ``priority`` (3 error ... 6 info)."""
    return f"<{priority}>{text}"


def error(text: str) -> str:
    return mark(ERR, text)


def warning(text: str) -> str:
    return mark(WARNING, text)


def notice(text: str) -> str:
    return mark(NOTICE, text)


def info(text: str) -> str:
    return mark(INFO, text)


def split(message: str) -> tuple[int, str]:
    """(priority, text) of a message; unmarked: info."""
    if len(message) >= 3 and message[0] == "<" and message[2] == ">" and message[1] in "01234567":
        return int(message[1]), message[3:]
    return INFO, message


def on_journal(environ, stream, fstat) -> bool:
    """Whether ``stream`` is the journal stream systemd named in ``JOURNAL_STREAM``."""
    want = environ.get("JOURNAL_STREAM") if environ is not None else None
    if not want:
        return False
    try:
        st = fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return want == f"{st.st_dev}:{st.st_ino}"


def lines(tag: str, message: str, prefixed: bool) -> str:
    """The text to write for ``message``: one line per line of it, each
    ``TAG: line``, with ``<N>`` in front when ``prefixed``."""
    priority, text = split(message)
    head = f"<{priority}>" if prefixed else ""
    return "".join(f"{head}{tag}: {line}\n" if tag else f"{head}{line}\n" for line in text.split("\n"))


def write(stream, tag: str, message: str, environ, fstat) -> None:
    """Write ``message`` to ``stream`` (``lines``), prefixed when ``stream``
    is the journal; a stream that cannot take it is given up silently (it
    is the last channel left)."""
    try:
        stream.write(lines(tag, message, on_journal(environ, stream, fstat)))
        stream.flush()
    except (OSError, ValueError, AttributeError):
        pass
