"""The user's own terminals, as ``write(1)`` reaches them, and pop-ups through them.

How the OS behaves, which decides the design:

* A terminal is a character device (``/dev/pts/N`` for every ssh session,
  terminal window, tmux or screen pane; ``/dev/ttyN`` for a console).  The
  login machinery (sshd, login, a terminal emulator's pty setup) makes it
  the user's (``chown``) with mode 0620: the group (``tty``) may write,
  which is how ``write(1)`` and ``wall(1)`` reach it.  ``mesg n`` clears that
  group write bit; ``write(1)`` then refuses, and so does bk.
* Where a user is: ``utmp`` lists login sessions, but many terminal
  emulators and every tmux pane never write to it, containers rarely have
  one, and its records can be stale.  The kernel knows exactly: every
  terminal one of the user's processes holds open appears under
  ``/proc/PID/fd`` as a link to its device.  So bk looks there, only at the
  processes of its own UID (``/proc/PID`` is owned by the process's UID,
  and a process may read only its own UID's ``fd`` directories anyway).
* A descriptor to someone else's terminal can be held by the user's
  process (passed to it, or a terminal whose owner changed): the device's
  owner decides, not the holder.  bk opens the device with
  ``O_NOFOLLOW | O_NOCTTY | O_NONBLOCK``, then checks the open descriptor
  (``fstat``): a terminal, owned by this UID, group-writable.  Anything
  else is skipped, so another user's terminal never receives a byte.
* A terminal whose output is stopped (Ctrl-S) or whose reader is gone
  fills its buffer; a blocking write would hang the deliverer.  The write
  is non-blocking and bounded: ``EAGAIN`` skips that terminal this time.
* Pop-ups: some terminal emulators show a desktop notification for an OSC
  escape (OSC 9: iTerm2; OSC 777 ``notify``: rxvt-unicode, foot, Ghostty,
  WezTerm); others print it as garbage or ignore it, and a multiplexer
  (tmux, screen) swallows it.  Which emulator draws a terminal is only in
  the environment of the programs running in it (``TERM``,
  ``TERM_PROGRAM``, ``TMUX``), read from ``/proc/PID/environ`` of the
  user's own processes.  bk sends a pop-up only where that names an
  emulator known to show one, or where the user said which to use
  (``bk notify set --desktop osc9``).
"""

from __future__ import annotations

import errno
import os
import stat

from bk.core.record import dataclass, field

MAX_MESSAGE = 2000
OSC9, OSC777 = "osc9", "osc777"
# TERM_PROGRAM values and TERM prefixes of emulators that show a pop-up for one of the escapes.
KNOWN_PROGRAMS = {"iTerm.app": OSC9, "WezTerm": OSC777, "ghostty": OSC777}
KNOWN_TERMS = (("xterm-ghostty", OSC777), ("foot", OSC777), ("rxvt-unicode", OSC777))
MULTIPLEXED = ("screen", "tmux")
ENV_KEYS = ("TERM", "TERM_PROGRAM", "TMUX", "STY")


@dataclass
class Terminal:
    path: str                                  # /dev/pts/3
    pids: list = field(default_factory=list)   # the user's processes holding it
    env: dict = field(default_factory=dict)    # TERM and friends, from the first that had them


def _is_terminal_path(target: str) -> bool:
    if target.startswith("/dev/pts/"):
        return target[9:].isdigit()
    return target.startswith("/dev/tty") and target[8:].isdigit()


def _environ(proc_root: str, pid: str) -> dict:
    try:
        with open(f"{proc_root}/{pid}/environ", "rb") as f:
            raw = f.read(1 << 20)
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep and k.decode("ascii", "replace") in ENV_KEYS:
            out[k.decode()] = v.decode("utf-8", "replace")
    return out


def find(uid: int, proc_root: str = "/proc") -> list[Terminal]:
    """The terminals that processes of ``uid`` hold open, by device path.
    Only candidates: ``write`` checks each device itself."""
    found: dict[str, Terminal] = {}
    try:
        pids = [p for p in os.listdir(proc_root) if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        base = f"{proc_root}/{pid}"
        try:
            if os.stat(base).st_uid != uid:
                continue
            fds = os.listdir(f"{base}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{base}/fd/{fd}")
            except OSError:
                continue
            if not _is_terminal_path(target):
                continue
            t = found.setdefault(target, Terminal(target))
            if int(pid) not in t.pids:
                t.pids.append(int(pid))
                if not t.env:
                    t.env = _environ(proc_root, pid)
    return sorted(found.values(), key=lambda t: t.path)


def desktop_kind(env: dict, mode: str) -> str | None:
    """Which pop-up escape this terminal shows: ``mode`` is the user's
    choice (auto, osc9, osc777, off)."""
    if mode == "off":
        return None
    term = env.get("TERM", "")
    if env.get("TMUX") or env.get("STY") or term.startswith(MULTIPLEXED):
        return None
    if mode in (OSC9, OSC777):
        return mode
    kind = KNOWN_PROGRAMS.get(env.get("TERM_PROGRAM", ""))
    if kind:
        return kind
    for prefix, k in KNOWN_TERMS:
        if term.startswith(prefix):
            return k
    return None


def _printable(text: str) -> str:
    """No control character may reach a terminal inside our own message:
    an ESC in a process label would end the OSC early and start anything."""
    from bk.core.safetext import safe

    return safe(" ".join(text.split()))[:MAX_MESSAGE]


def line_bytes(text: str, *, host: str, when: str) -> bytes:
    """The message as ``write(1)`` frames one: on a line of its own."""
    return f"\r\n\x07[bk {when}] {_printable(text)}\r\n".encode("utf-8", "replace")


def osc_bytes(kind: str, title: str, text: str) -> bytes:
    body = _printable(text).replace(";", ",") if kind == OSC9 else _printable(text)
    if kind == OSC9:
        return f"\x1b]9;bk: {body}\x07".encode("utf-8", "replace")
    return f"\x1b]777;notify;bk: {_printable(title).replace(';', ',')};{body}\x07".encode("utf-8", "replace")


@dataclass
class Outcome:
    path: str
    status: str            # sent | mesg-n | not-yours | not-a-terminal | busy | gone | error
    detail: str | None = None
    desktop: str | None = None   # the escape sent with it, if any


def write(term: Terminal, uid: int, data: bytes, desktop: bytes | None = None) -> Outcome:
    """Write ``data`` (and ``desktop``, the pop-up escape) to one terminal,
    only if it is a terminal ``uid`` owns with the group write bit set."""
    try:
        fd = os.open(term.path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return Outcome(term.path, "gone")
    except OSError as e:
        return Outcome(term.path, "not-yours" if e.errno in (errno.EACCES, errno.EPERM) else "error",
                       e.strerror)
    try:
        st = os.fstat(fd)
        if not stat.S_ISCHR(st.st_mode) or not os.isatty(fd):
            return Outcome(term.path, "not-a-terminal")
        if st.st_uid != uid:
            return Outcome(term.path, "not-yours", f"owned by uid {st.st_uid}")
        if not st.st_mode & stat.S_IWGRP:
            return Outcome(term.path, "mesg-n", "messages are off there (mesg n)")
        whole = data + (desktop or b"")
        try:
            n = os.write(fd, whole)
        except BlockingIOError:
            return Outcome(term.path, "busy", "its output is stopped or full")
        except OSError as e:
            return Outcome(term.path, "error", e.strerror)
        if n < len(whole):
            return Outcome(term.path, "busy", f"only {n} of {len(whole)} bytes fitted")
        return Outcome(term.path, "sent")
    finally:
        os.close(fd)


def deliver(uid: int, text: str, title: str, *, host: str, when: str, desktop_mode: str,
            want_line: bool = True, want_desktop: bool = True, proc_root: str = "/proc") -> list[Outcome]:
    """Every terminal of ``uid`` gets the line (``want_line``) and, where it
    is known to show one, the pop-up (``want_desktop``)."""
    out = []
    for t in find(uid, proc_root):
        kind = desktop_kind(t.env, desktop_mode) if want_desktop else None
        data = line_bytes(text, host=host, when=when) if want_line else b""
        pop = osc_bytes(kind, title, text) if kind else None
        if not data and pop is None:
            out.append(Outcome(t.path, "no-desktop", "not a terminal known to show pop-ups"))
            continue
        o = write(t, uid, data, pop)
        if kind and o.status == "sent":
            o.desktop = kind
        out.append(o)
    return out
