"""One node, over SSH: run a ``bk`` command there and read its reply.

Every command goes through the node's ``bk c node --expect ID --json --
WORDS``: the node checks that it is the node the catalog means before it
runs anything (a write can never reach the wrong ledger), runs WORDS as its
own ``bk`` would, and wraps the reply with its identity (id, host name,
version, clock, capabilities).  The client checks that identity again, so
a node that ignores ``--expect`` (another program answering on that host,
an old bk) is caught too.

What can go wrong, and what the caller hears (``NodeFailure.state``):
``unreachable`` (ssh could not connect or authenticate: its own message is
kept), ``timeout`` (no full reply within the node's ``timeout_s``: killed),
``too_large`` (a reply past the bound: killed), ``bad_reply`` (not one JSON
envelope), ``wrong_identity`` (another node answered), ``unsupported`` (the
node's bk has no cluster commands), ``cancelled``.  None of them is fatal
for the other nodes: the fan-out reports it in that node's row.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from bk.cluster import replies
from bk.cluster.catalog import NodeEntry
from bk.core.envelope import is_envelope
from bk.core.errors import BkError, ConfigError, Unavailable, error_from
from bk.core.record import dataclass

# What a node must understand for the client to use it.
NODE_PROTOCOL = "node.v1"


class NodeFailure(Exception):
    """A node gave no usable reply; ``state`` says how (module docstring)."""

    def __init__(self, node: str, state: str, message: str, hint: str | None = None,
                 seconds: float | None = None):
        super().__init__(message)
        self.node, self.state, self.message, self.hint, self.seconds = node, state, message, hint, seconds

    def to_json(self) -> dict:
        return {"state": self.state, "message": self.message, "hint": self.hint}

    def as_error(self) -> BkError:
        cls = ConfigError if self.state == "wrong_identity" else Unavailable
        return cls(f"{self.node}: {self.message}", self.hint,
                   details={"node": self.node, "state": self.state})


def timed_out(entry: NodeEntry, timeout: float, seconds: float | None) -> NodeFailure:
    """The row of a node that gave no full reply by its deadline (killed)."""
    return NodeFailure(entry.name, "timeout", f"no reply within {timeout:g} s (killed)",
                       f"raise its timeout: sudo bk admin cluster set {entry.name} --timeout 30", seconds)


@dataclass(frozen=True)
class Reply:
    """A node's answer: who answered (``node``: its identity block), the
    command's own envelope (``envelope``, with ``--json``) or its text, and
    the clock skew (the node's clock minus ours at the middle of the call)."""

    name: str
    node: dict
    envelope: dict | None
    text: str | None
    stderr: str
    exit: int
    seconds: float
    skew_s: float | None

    @property
    def ok(self) -> bool:
        return self.envelope is not None and self.envelope.get("ok") is True

    @property
    def data(self) -> dict:
        return (self.envelope or {}).get("data") or {}

    @property
    def warnings(self) -> list:
        return list((self.envelope or {}).get("warnings") or [])

    def error(self) -> BkError | None:
        """The command's own error (a conflict, not found), as its class."""
        if self.envelope is None or self.envelope.get("ok") is not False:
            return None
        e = self.envelope.get("error") or {}
        return error_from(e.get("code"), e.get("message"), e.get("hint"), e.get("details"))


def _iso_seconds(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    from bk.core.utctime import parse_utc

    try:
        return float(parse_utc(text))
    except (ValueError, BkError):
        return None


class NodeClient:
    """Runs commands on one catalog node.  ``runner`` is the SSH seam
    (``bk.remote.ssh.run``'s signature); ``wall`` the clock for skew."""

    def __init__(self, entry: NodeEntry, *, runner: Callable | None = None,
                 wall: Callable[[], float] = time.time, env: dict | None = None,
                 cancelled: Callable[[], bool] | None = None):
        from bk.remote import ssh

        self.entry = entry
        self._runner = runner or ssh.run
        self._wall = wall
        self._env = env
        self._cancelled = cancelled
        # Node name -> the bk version it last said it runs (a Cluster shares
        # one dict among its clients, so a node's first reply tells the rest).
        self.versions: dict[str, str] = {}

    def argv(self, words: list[str], *, as_json: bool = True, columns: int | None = None,
             row: tuple[str, str] | None = None) -> list[str]:
        from bk.remote import ssh

        e = self.entry
        # The wrapper always answers JSON; --text asks for the command's text inside it.
        remote = [*e.remote_command, "c", "node", *(["--expect", e.id] if e.id else []), "--json"]
        if not as_json:
            remote.append("--text")
        if columns:
            remote += ["--columns", str(columns)]
        if row is not None:
            remote += ["--row", row[0], "--fields", row[1]]
        elif words:
            remote += ["--", *words]
        if e.local:
            return [*local_command(e), *remote[len(e.remote_command):]]
        return ssh.ssh_argv(e.target, remote, port=e.port, connect_timeout=max(1, min(10, int(e.timeout_s))),
                            known_hosts=e.known_hosts, identity_file=e.identity_file)

    def row(self, name: str, fields: dict, *, shape=None, timeout: float | None = None) -> Reply:
        """Row ``name`` of the operation table on the node, with the request
        ``fields`` (its spec's wire form); the reply's ``data`` is the row's
        wire JSON.  A row newer than the node's bk is refused here, before
        anything is sent (``NodeFailure`` ``unsupported``, naming the row);
        for a write whose node's version is not known yet, the node is asked
        who it is first (no row sent), so a write is never sent blind."""
        import json

        from bk import service

        op = service.get(name)
        if self.versions.get(self.entry.name) is None and op.access == service.WRITE:
            self.call([])
        self.refuse_unserved(op)
        return self.call([], shape=shape, timeout=timeout,
                         row=(name, json.dumps(fields, separators=(",", ":"), sort_keys=True)))

    def refuse_unserved(self, op) -> None:
        from bk.service import version_tuple

        known = self.versions.get(self.entry.name)
        if known is not None and version_tuple(known) < version_tuple(op.since):
            raise NodeFailure(self.entry.name, "unsupported",
                              f"its bk {known} cannot serve the {op.name} row (bk {op.since} or later); "
                              "nothing was sent", f"update bk on {self.entry.name}")

    def call(self, words: list[str], *, as_json: bool = True, columns: int | None = None,
             timeout: float | None = None, shape=None, row: tuple[str, str] | None = None) -> Reply:
        """Run ``words`` (or ``row``: its name and fields as JSON) on the node;
        no words and no row: only who answers.  The wrapper, the identity and the
        command's envelope are always checked (``bk.cluster.replies``);
        ``shape`` is what the command's ``data`` must look like (None: any
        object, for ``bk @NODE ... --json``, which passes it on as JSON)."""
        e = self.entry
        before = self._wall()
        out = self._runner(self.argv(words, as_json=as_json, columns=columns, row=row),
                           timeout=timeout or e.timeout_s, cancelled=self._cancelled, env=self._env)
        after = self._wall()
        if out.ended == "timeout":
            raise timed_out(e, timeout or e.timeout_s, out.seconds)
        if out.ended == "too_large":
            raise NodeFailure(e.name, "too_large", "the reply was larger than the limit (killed)",
                              "the node's bk may be broken: try ssh HOST bk c id --json", out.seconds)
        if out.ended == "cancelled":
            raise NodeFailure(e.name, "cancelled", "cancelled", None, out.seconds)
        if out.ended == "not_started":
            hint = (f"set the node's remote_command: sudo bk admin cluster set {e.name} --remote-command CMD"
                    if e.local else "is ssh installed?")
            raise NodeFailure(e.name, "unreachable", out.stderr_text, hint, out.seconds)
        doc = _decode(out.stdout)
        if doc is None:
            if out.rc == 255 and not e.local:
                msg = out.stderr_text.splitlines()[-1] if out.stderr_text else "failed"
                # ssh's own lines start "ssh: connect to host ..." already.
                msg = msg[5:] if msg.startswith("ssh: ") else msg
                raise NodeFailure(e.name, "unreachable", f"ssh: {msg}", _ssh_hint(msg, e), out.seconds)
            shown = (out.stdout[:80].decode("utf-8", "replace") or out.stderr_text[:160] or "nothing")
            if out.rc == 127:
                raise NodeFailure(e.name, "unsupported", f"no bk on the node ({out.stderr_text[:160]})",
                                  "install bk there, or set remote_command in the catalog", out.seconds)
            raise NodeFailure(e.name, "bad_reply", f"not a bk reply (exit {out.rc}): {shown!r}",
                              "check the node by hand: ssh HOST bk c id --json", out.seconds)
        if doc.get("ok") is False:
            err = _checked(e, replies.ERROR, doc.get("error"), "error", out)
            details = err.get("details") or {}
            if details.get("reason") == "wrong_identity":
                raise NodeFailure(e.name, "wrong_identity", err["message"], err.get("hint"), out.seconds)
            if doc.get("command") != "cluster node":
                raise NodeFailure(e.name, "unsupported", f"its bk has no cluster commands: {err['message']}",
                                  "update bk on the node", out.seconds)
            if (row is not None or not words) and err["code"] == "invalid_input":
                # A bk older than the rows (ROWS_SINCE) knows only words.
                what = f"the {row[0]} row" if row is not None else "rows"
                raise NodeFailure(e.name, "unsupported", f"its bk is too old to serve {what}: {err['message']}",
                                  f"update bk on {e.name}", out.seconds)
            raise NodeFailure(e.name, "bad_reply", f"{err['code']}: {err['message']}", err.get("hint"),
                              out.seconds)
        wrapper = _checked(e, replies.WRAPPER, doc["data"], "data", out)
        node = wrapper.get("node") or {}
        if e.id and node.get("id") != e.id:
            raise NodeFailure(e.name, "wrong_identity",
                              f"the node answered as {node.get('id')!r} ({node.get('hostname')}), "
                              f"but the catalog says {e.name} is {e.id}",
                              f"if the node was really reinstalled, check it (bk c probe {e.name} {e.target}) "
                              f"and update the catalog; otherwise something else answers at {e.target}",
                              out.seconds)
        if isinstance(node.get("version"), str):
            self.versions[e.name] = node["version"]
        node_now = node.get("now_epoch")
        if node_now is None:
            node_now = _iso_seconds(node.get("now"))
        skew = None if node_now is None else round(node_now - (before + after) / 2, 3)
        inner = None
        if as_json and (words or row):
            inner = doc["data"].get("reply")
            if not is_envelope(inner):
                raise NodeFailure(e.name, "bad_reply", "the node's reply carries no command envelope",
                                  None, out.seconds)
            inner = _envelope(e, inner, shape, out)
        return Reply(e.name, node, inner, None if as_json else wrapper.get("text") or "",
                     wrapper.get("stderr") or "", wrapper.get("exit") or 0, out.seconds, skew)


def _checked(e: NodeEntry, shape, value: object, path: str, out) -> dict:
    """``value`` as ``shape`` allows it, or the node's ``bad_reply``."""
    try:
        return replies.check(shape, value, path)
    except replies.BadField as bad:
        raise NodeFailure(e.name, "bad_reply", f"not a valid reply: {bad}",
                          "the node's bk may be broken or not bk: check it by hand (ssh HOST bk c id --json)",
                          out.seconds) from None


def _envelope(e: NodeEntry, inner: dict, shape, out) -> dict:
    """The command's envelope with its warnings, error and (when ``shape``
    names what the command answers) data checked."""
    checked = {"schema": inner["schema"], "command": _checked(e, replies.text(64), inner["command"],
                                                              "reply.command", out),
               "ok": inner["ok"], "warnings": _checked(e, replies.WARNINGS, inner["warnings"], "reply.warnings", out)}
    if inner["ok"]:
        data = inner["data"]
        checked["data"] = data if shape is None else _checked(e, shape, data, "", out)
    else:
        checked["error"] = _checked(e, replies.ERROR, inner["error"], "reply.error", out)
    return checked


def terminal_argv(entry: NodeEntry, words: list[str]) -> list[str]:
    """The command line that runs ``words`` on the node with a terminal
    (``ssh -t``): for ``bk c tui``, which hands the terminal to the node's
    full-screen view."""
    from bk.remote import ssh

    remote = [*entry.remote_command, *words]
    if entry.local:
        return [*local_command(entry), *words]
    return ssh.ssh_argv(entry.target, remote, port=entry.port, known_hosts=entry.known_hosts,
                        identity_file=entry.identity_file, tty=True)


def local_command(entry: NodeEntry) -> list[str]:
    """The program of a ``local`` node.  With the default ``remote_command``
    (``bk``) that is this very bk, run by this interpreter, not whatever
    ``bk`` the caller's PATH finds first (there may be none: bk run as
    ``python3 bk.pyz``, or another version): the archive this process runs
    from, or the package directory it was imported from.  Neither puts the
    working directory on the child's ``sys.path`` (a zipapp's ``sys.path[0]``
    is the archive; ``-c`` code drops its ``''`` before importing
    anything), so a ``bk/`` in the directory where the user typed ``bk c``
    cannot stand in for it.  A ``remote_command`` in the catalog is used as
    it is."""
    import sys

    if entry.remote_command != ("bk",) or not sys.executable:
        return list(entry.remote_command)
    return this_bk()


def this_bk() -> list[str]:
    """The command line of this very bk (``local_command``): the node runs a
    person's words (``bk @NODE l``) with it, in a child process."""
    import sys

    # This module's own origin says where bk is: bk/cluster/node.py.
    archive = getattr(getattr(__spec__, "loader", None), "archive", None)     # zipimport
    if isinstance(archive, str):
        return [sys.executable, archive]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return [sys.executable, "-c", f"import sys; sys.path[:] = [{root!r}, *filter(None, sys.path)]; "
                                  "from bk.cli.main import main; sys.exit(main())"]


def _decode(raw: bytes) -> dict | None:
    """The one envelope the node printed, or None."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return doc if is_envelope(doc) else None


def _ssh_hint(msg: str, e: NodeEntry) -> str:
    low = msg.lower()
    if "host key verification failed" in low or "no matching host key" in low:
        return (f"the host key of {e.target} is unknown or changed: verify it and add it to "
                f"{e.known_hosts or '~/.ssh/known_hosts'} (ssh-keyscan, then compare fingerprints)")
    if "permission denied" in low:
        return f"set up key login for your account: ssh-copy-id {e.target}"
    return f"is {e.target} up?  try: ssh {e.target} true"
