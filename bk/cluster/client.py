"""The cluster operations a front end calls: overview, check, recommend,
book on the best node, edit and cancel ``NODE/ID``, and one node's command.

Each returns a result with ``to_json()`` (the CLI renders text from it, the
MCP tools send it as is) and never prints.

Writes and lost replies.  A write is a row of the operation table sent to
one node (``book``; ``book_job``, a booking with a command; ``edit`` and
``cancel``, whose ``ref`` the node resolves), and always carries an op-id,
made here when the caller gave none.  The node's ledger records the
op-id with the change in the same commit, and a write repeated with the
same op-id answers ``exists`` instead of doing it twice.  When a write's
reply is lost (ssh died, the node hung past its timeout, the reply was cut)
the client cannot know whether the node committed before it went quiet, so
it asks first: the ``op_lookup`` row on that node says what that op-id
produced (``bk c op OPID`` is the same for a person).
Found: the write happened, and the result says ``recovered``.  Not found:
it did not, and the write is sent once more, with the same op-id (so even
a commit racing the lookup cannot make a second booking).  When the node
cannot be asked at all the result is "outcome unknown" with the op-id, and
the command to repeat safely.  A booking is made on exactly one node: the
best one is chosen first, and only that one is written to.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence

from bk.cluster import replies
from bk.cluster.catalog import Catalog, NodeEntry
from bk.cluster.fanout import fan_out
from bk.cluster.node import NodeClient, NodeFailure, Reply
from bk.core.errors import BkError, Conflict, InvalidInput, Unavailable
from bk.core.record import dataclass, replace

# What each write row records with its op-id (the ``op_lookup`` row's ``action``).
WRITE_ACTIONS = {"book": "create", "book_job": "create", "edit": "edit", "cancel": "cancel"}


def new_op_id() -> str:
    return "c-" + os.urandom(12).hex()


class Cluster:
    """The catalog plus the seams: how a node client is made (tests give
    one with a fake runner) and a cancel event shared by all threads."""

    def __init__(self, catalog: Catalog, *, make_client: Callable[..., NodeClient] | None = None,
                 env: dict | None = None, parallel: int | None = None):
        self.catalog = catalog
        self.env = env
        self.cancel = threading.Event()
        self._parallel = parallel
        made = make_client or (lambda entry, cancelled=None: NodeClient(entry, env=env, cancelled=cancelled))
        # Every client of this cluster shares what the nodes said they run,
        # so a row one node cannot serve is refused before it is sent.
        self.versions: dict[str, str] = {}

        def make(entry, cancelled=None) -> NodeClient:
            client = made(entry, cancelled=cancelled)
            client.versions = self.versions
            return client
        self._make = make

    def client(self, name_or_entry) -> NodeClient:
        entry = name_or_entry if isinstance(name_or_entry, NodeEntry) else self.catalog.get(name_or_entry)
        return self._make(entry, cancelled=self.cancel.is_set)

    def fan_out(self, job, nodes: Sequence[NodeEntry] | None = None):
        nodes = self.catalog.enabled() if nodes is None else nodes
        if not nodes:
            raise InvalidInput("the cluster catalog has no enabled nodes",
                               hint="add one: bk c probe NAME HOST, then the sudo command it prints")
        return fan_out(nodes, job, make_client=self._make, cancel=self.cancel, parallel=self.parallel)

    @property
    def parallel(self) -> int:
        """How many nodes are asked at once: the caller's number, else the
        configuration's ``cluster_parallel`` (read once, when first needed)."""
        if self._parallel is None:
            from bk.store import config, paths

            self._parallel = config.load(paths.locate(self.env))["cluster_parallel"]
        return self._parallel

    # -- reads -------------------------------------------------------------

    def overview(self) -> Overview:
        rows = []
        got = dict((n.name, r) for n, r in self.fan_out(
            lambda c: c.row("list", {"scope": "all"}, shape=replies.LIST)))
        for n in self.catalog.nodes:
            r = got.get(n.name)
            rows.append(NodeRow.of(n, r, self.catalog))
        return Overview(tuple(rows))

    def check(self, *, jobs: bool = False) -> Check:
        name, shape = ("jobs", replies.JOBS) if jobs else ("worker_status", replies.WORKER_STATE)

        def job(c: NodeClient):
            return c.row(name, {}, shape=shape)
        got = dict((n.name, r) for n, r in self.fan_out(job))
        return Check(tuple(CheckRow.of(n, got.get(n.name), jobs=jobs) for n in self.catalog.nodes))

    def recommend(self, fields: dict) -> Recommendation:
        """Each node's options for the ``recommend`` row's ``fields`` (its
        wire form; durations, memory and starts may be a person's words,
        which each node reads on its own clock, zone and grid), and for a
        node with none the refusal ``bk slots`` words, so a node's row reads
        as it always did."""
        got = self.fan_out(lambda c: _no_option(c.row("recommend", fields, shape=replies.SLOTS)))
        rows = [RecRow.of(n, r) for n, r in got]
        return Recommendation(tuple(rows), best_row(rows))

    # -- writes ------------------------------------------------------------

    def book(self, fields: dict, booking: Callable[[dict], dict], *, command: Sequence[str] | None = None,
             op_id: str | None = None, dry_run: bool = False) -> Booked:
        """Book on the best node for the ``recommend`` row's ``fields``;
        ``booking(option)`` is the ``book`` row's fields sent to it
        (``booking_request``).  With a ``command`` (``bk c N DUR -- CMD``)
        the row is ``book_job``: those fields and the command, which that
        node keeps in your private job spec and your worker there starts."""
        if op_id:
            done = self._already(op_id)
            if done is not None:
                return done
        rec = self.recommend(fields)
        if rec.best is None:
            why = "; ".join(f"{r.node}: {r.problem}" for r in rec.rows if r.problem) or "no node has room"
            cls = Conflict if all(r.problem == "no option fits" or r.info.get("state") == "error"
                                  for r in rec.rows) else Unavailable
            raise cls(f"no node can take this booking ({why})",
                           hint="see the options per node: bk c rec ...",
                           details={"nodes": [r.to_json() for r in rec.rows]})
        best = rec.best
        if dry_run:
            return Booked(rec, best.node, None, op_id, recovered=False, retried=False, dry_run=True)
        op_id = op_id or new_op_id()
        sent = booking(best.option)
        row = "book"
        if command:
            row, sent = "book_job", {**sent, "command": list(command)}
        outcome = self.write(best.node, row, sent, op_id)
        return Booked(rec, best.node, outcome.reply_data, op_id, outcome.recovered, outcome.retried)

    def _already(self, op_id: str) -> Booked | None:
        """A caller's op-id may have booked already, on any node (a retry
        after a lost reply, by a program): the best node now may be another
        one, so every node is asked before anything is booked.  A node that
        cannot answer might hold it: then nothing is booked."""
        got = self.fan_out(lambda c: lookup(c, op_id, "book"))
        for n, r in got:
            if isinstance(r, dict):
                return Booked(Recommendation((), None), n.name, {"status": "exists", "reservation": r}, op_id,
                              recovered=False, retried=False)
        failed = [(n.name, r) for n, r in got if isinstance(r, NodeFailure)]
        if failed:
            names = ", ".join(f"{name} ({f.state})" for name, f in failed)
            raise Unavailable(f"cannot tell whether op-id {op_id} already booked on {names}, so nothing was booked",
                              hint="retry when the node answers (bk c check); a new op-id books anew",
                              details={"op_id": op_id, "nodes": [name for name, _ in failed]})
        return None

    def write(self, node: str, row: str, fields: dict, op_id: str) -> WriteOutcome:
        """Write row ``row`` (``book``, ``book_job``, ``edit``, ``cancel``)
        on ``node`` with its wire ``fields`` and ``op_id``, under the
        lost-reply protocol of the module docstring.  A refusal by the node
        (conflict, not found) is raised as its own error."""
        client = self.client(node)
        sent = {**fields, "op_id": op_id}
        return _protected(client, lambda: client.row(row, sent, shape=replies.WRITE), op_id, row)

    def write_words(self, node: str, words: list[str], op_id: str, action: str) -> WriteOutcome:
        """``bk @NODE WORDS`` that write (``bk @gpu-b 1 30m``): a person's
        words, which only the node's own bk reads (its whole grammar, run in
        a child bk there), answered in JSON; with ``op_id`` and the same
        lost-reply protocol as a row.  ``action``: the write row the words
        stand for (``book``, ``edit``, ``cancel``)."""
        client = self.client(node)
        cut = words.index("--") if "--" in words else len(words)      # -- CMD stays last
        sent = [*words[:cut], "--op-id", op_id, *words[cut:]]
        return _protected(client, lambda: client.call(sent, shape=replies.WRITE), op_id, action)

    def at(self, node: str, words: list[str], *, as_json: bool, columns: int | None = None) -> Reply:
        try:
            return self.client(node).call(words, as_json=as_json, columns=columns)
        except NodeFailure as f:
            raise f.as_error() from None


def _protected(client: NodeClient, send: Callable[[], Reply], op_id: str, action: str) -> WriteOutcome:
    """``send()`` once; when its reply is lost, ask the node what ``op_id``
    did before sending it again (the module docstring)."""
    node = client.entry.name
    try:
        return _written(send(), False, False)
    except NodeFailure as first:
        if first.state in ("wrong_identity", "unsupported"):
            raise first.as_error() from None
        lost = first
    # The reply was lost: did the node commit before it went quiet?
    try:
        found = lookup(client, op_id, action)
    except NodeFailure as f:
        raise _unknown(node, op_id, lost, f) from None
    if found is not None:
        return WriteOutcome({"status": "exists", "reservation": found, "recovered": True}, True, False)
    try:
        return _written(send(), False, True)
    except NodeFailure as again:
        raise _unknown(node, op_id, lost, again) from None


def _written(reply: Reply, recovered: bool, retried: bool) -> WriteOutcome:
    err = reply.error()
    if err is not None:
        err.details = {**err.details, "node": reply.name}
        err.message = f"{reply.name}: {err.message}"
        raise err
    return WriteOutcome(dict(reply.data), recovered, retried, reply.warnings)


def _unknown(node: str, op_id: str, lost: NodeFailure, why: NodeFailure) -> BkError:
    return Unavailable(f"{node}: the reply was lost ({lost.message}) and the node cannot say whether "
                       f"the change was made ({why.message})",
                       hint=f"repeat the same command with --op-id {op_id}: it cannot be done twice; "
                            f"or look: bk @{node} c op {op_id}",
                       details={"node": node, "op_id": op_id, "state": "outcome_unknown"})


def lookup(client: NodeClient, op_id: str, action: str) -> dict | None:
    """The reservation ``op_id`` produced on that node (as JSON), or None."""
    reply = client.row("op_lookup", {"op_id": op_id}, shape=replies.OP)
    if not reply.ok:
        err = reply.error()
        raise NodeFailure(client.entry.name, "bad_reply", f"op lookup failed: {err.message if err else '?'}")
    d = reply.data
    if d.get("found") and d.get("action") == WRITE_ACTIONS.get(action, action):
        return d.get("reservation")
    return None


def booking_request(fields: dict, option: dict, *, exact: bool, note: str | None = None) -> dict:
    """What ``bk c N DUR`` and the agent's ``cluster_create`` send to the
    best node: the ``book`` row's fields for the ``recommend`` row's
    ``fields`` every node was asked, at the node's best ``option``.  The
    best option of "now" is the node's current slice; it may have ended
    while the slowest node answered, and a past start is refused.  So
    without an ``exact`` time (a ``-t``/``--start`` without ``--queue``) it
    books "the earliest from the option's start", queued, and one whose
    start has passed "the earliest from now"."""
    from bk import clock
    from bk.core.utctime import parse_utc

    out = {k: v for k, v in fields.items() if k not in ("limit", "start")}
    if exact or parse_utc(option["start"]) > clock.now():
        out["start"] = option["start"]
    if not exact:
        out["queue"] = True
    if note is not None:
        out["note"] = note
    return out


def _no_option(reply: Reply) -> Reply:
    """A node's ``recommend`` reply with no option, as ``bk slots`` refuses it."""
    if not reply.ok or reply.data.get("options"):
        return reply
    from types import SimpleNamespace

    from bk.core.envelope import failure
    from bk.service import describe

    asked = reply.data.get("request") or {}
    what = SimpleNamespace(count=asked.get("count") or 0, duration=asked.get("duration") or 0,
                           mode=asked.get("mode") or "shared", mem_mib=asked.get("mem_mib"))
    err = Conflict(f"no option for {describe(what)}", hint="ask for fewer GPUs or a shorter time")
    return replace(reply, envelope=failure("recommend", err, reply.warnings))


@dataclass
class WriteOutcome:
    reply_data: dict
    recovered: bool
    retried: bool
    warnings: list = None


# -- rows ------------------------------------------------------------------

def _node_json(n: NodeEntry, r) -> dict:
    out = {"name": n.name, "id": n.id, "target": n.target, "priority": n.priority, "enabled": n.enabled}
    if not n.enabled:
        out["state"] = "disabled"
    elif isinstance(r, NodeFailure):
        out["state"] = r.state
        out["error"] = r.to_json()
    elif isinstance(r, Reply):
        out["state"] = "ok" if r.ok else "error"
        out["seconds"] = round(r.seconds, 3)
        out["skew_s"] = r.skew_s
        out["version"] = r.node.get("version")
        if not r.ok:
            err = r.error()
            out["error"] = err.to_json() if err else None
    else:
        out["state"] = "skipped"
    return out


@dataclass(frozen=True)
class NodeRow:
    node: dict
    reservations: tuple

    @classmethod
    def of(cls, n: NodeEntry, r, catalog: Catalog) -> NodeRow:
        res = ()
        if isinstance(r, Reply) and r.ok:
            res = tuple({**x, "node": n.name, "person": catalog.person(n.name, x.get("uid", -1))}
                        for x in r.data.get("reservations") or ())
        return cls(_node_json(n, r), res)


@dataclass(frozen=True)
class Overview:
    rows: tuple

    @property
    def complete(self) -> bool:
        return all(r.node["state"] in ("ok", "disabled") for r in self.rows)

    def to_json(self) -> dict:
        return {"nodes": [r.node for r in self.rows],
                "reservations": [x for r in self.rows for x in r.reservations], "complete": self.complete}


@dataclass(frozen=True)
class CheckRow:
    node: dict
    checks: tuple       # (name, ok, detail)

    @classmethod
    def of(cls, n: NodeEntry, r, *, jobs: bool) -> CheckRow:
        from bk.cluster.node import NODE_PROTOCOL

        base = _node_json(n, r)
        if not n.enabled:
            return cls(base, ())
        if isinstance(r, NodeFailure):
            reach = r.state not in ("unreachable", "timeout", "cancelled")
            checks = [("reachable", reach, r.message if not reach else "yes")]
            if reach:
                checks.append(("identity" if r.state == "wrong_identity" else "reply", False,
                               f"{r.state}: {r.message}"))
            return cls(base, tuple(checks))
        caps = tuple(r.node.get("capabilities") or ())
        skew = r.skew_s
        checks = [("reachable", True, f"{r.seconds * 1000:.0f} ms"),
                  ("identity", True, f"{r.node.get('id')} ({r.node.get('hostname')}, {r.node.get('id_source')})"),
                  ("clock", skew is not None and abs(skew) <= 30,
                   "unknown" if skew is None else f"skew {skew:+.1f} s" + ("" if abs(skew) <= 30 else
                                                                             " (more than 30 s: fix NTP)")),
                  ("version", bool(r.node.get("version")), str(r.node.get("version"))),
                  ("capabilities", NODE_PROTOCOL in caps, ", ".join(caps) or "none")]
        if r.ok and not jobs:
            w = r.data.get("worker") or {}
            state = w.get("state")
            js = r.data.get("jobs") or {}
            checks.append(("worker", state == "running" or not (js.get("pending") or js.get("running")),
                           f"{state}; jobs pending {js.get('pending', 0)}, running {js.get('running', 0)}"))
        elif r.ok:
            listed = r.data.get("jobs") or []
            checks.append(("jobs", True, f"{len(listed)} job(s)"))
        else:
            err = r.error()
            checks.append(("worker", False, err.message if err else "no answer"))
        base = {**base, "capabilities": list(caps), "hostname": r.node.get("hostname"),
                **({"jobs": r.data.get("jobs")} if jobs and r.ok else {})}
        return cls(base, tuple(checks))

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.checks)


@dataclass(frozen=True)
class Check:
    rows: tuple

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def to_json(self) -> dict:
        return {"ok": self.ok, "nodes": [{**r.node, "ok": r.ok, "checks": [
            {"name": c, "ok": ok, "detail": d} for c, ok, d in r.checks]} for r in self.rows]}


@dataclass(frozen=True)
class RecRow:
    node: str
    priority: int
    options: tuple
    problem: str | None
    info: dict

    @classmethod
    def of(cls, n: NodeEntry, r) -> RecRow:
        info = _node_json(n, r)
        if isinstance(r, NodeFailure):
            return cls(n.name, n.priority, (), f"{r.state}: {r.message}", info)
        if not r.ok:
            err = r.error()
            return cls(n.name, n.priority, (), err.message if err else "refused", info)
        opts = tuple(r.data.get("options") or ())
        return cls(n.name, n.priority, opts, None if opts else "no option fits", info)

    def to_json(self) -> dict:
        return {**self.info, "options": list(self.options), "problem": self.problem}


@dataclass(frozen=True)
class Best:
    node: str
    option: dict


def best_row(rows: Sequence[RecRow]) -> Best | None:
    """Earliest start, then the node's priority (lower first), then the name."""
    from bk.core.utctime import parse_utc

    cands = [(parse_utc(r.options[0]["start"]), r.priority, r.node, r) for r in rows if r.options]
    if not cands:
        return None
    _, _, _, r = min(cands, key=lambda c: c[:3])
    return Best(r.node, r.options[0])


@dataclass(frozen=True)
class Recommendation:
    rows: tuple
    best: Best | None

    def to_json(self) -> dict:
        return {"best": None if self.best is None else {"node": self.best.node, "option": self.best.option},
                "nodes": [r.to_json() for r in self.rows]}


@dataclass(frozen=True)
class Booked:
    rec: Recommendation
    node: str
    result: dict | None
    op_id: str | None
    recovered: bool
    retried: bool
    dry_run: bool = False

    def to_json(self) -> dict:
        return {"node": self.node, "op_id": self.op_id, "dry_run": self.dry_run,
                "recovered": self.recovered, "retried": self.retried,
                "status": (self.result or {}).get("status") if not self.dry_run else "dry_run",
                "reservation": (self.result or {}).get("reservation"),
                "recommendation": self.rec.to_json()}
