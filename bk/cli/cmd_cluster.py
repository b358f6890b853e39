"""``bk c`` (``cluster``) and ``bk @NODE ...``: book on several servers over SSH.

The client half (``bk c``, ``check``, ``rec``, ``bk c N DUR``, ``e``/``d``
``NODE/ID``, ``probe``, ``tui``, ``@NODE``) calls ``bk.cluster.client``; the
node half (``bk c id``, ``bk c node``, ``bk c op``) is what the client runs
on each node through ssh.  ``bk c node`` runs one row of the operation table
here (``--row``: the row's wire JSON), or a person's words in a child bk
(``bk @NODE l``), and wraps the reply with this node's identity, so every
reply says which ledger answered and which release (docs/CLUSTER.md, The wire).
"""

from __future__ import annotations

import argparse

from bk.cli.render import Output, safe, safe_lines, table
from bk.core.errors import EXIT_CAPACITY, EXIT_PARTIAL, ConfigError, InvalidInput, UsageError

EPILOG = """Examples:
  bk c                       every node: state and bookings
  bk c check                 reachability, identity, clock, version, worker of each node
  bk c rec 2 1h              the earliest start for 2 GPUs for an hour, per node
  bk c 2 1h                  book 2 GPUs for an hour on the best node
  bk c x 1 4h                an exclusive GPU for 4 hours on the best node
  bk c 2 8h -- ./train.sh    book and run ./train.sh there (its worker starts it)
  bk @gpu-a l                any bk command on one node
  bk c e gpu-a/3f2a -d +30m  extend a booking on gpu-a
  bk c d gpu-a/3f2a          cancel it
  bk c probe gpu-b gpu-b.lab print the sudo command that adds gpu-b

The nodes are in the root-owned catalog /etc/gpubk/cluster.json (BK_CLUSTER_FILE
names another), written by sudo bk admin cluster.  Each node is reached over
ssh as you, with verified host keys; a node that does not answer is reported
and the others go on.  See docs/CLUSTER.md."""

# The first words bk c node runs for a person (bk @NODE WORDS): the everyday reads and writes.
# Not the long-running or interactive ones (the worker, the monitor, the
# broker, the TUI, prompts), nor administration.
NODE_WORDS = frozenset((
    "book", "s", "x", "exclusive", "l", "ls", "list", "e", "edit", "d", "del", "rm", "cancel",
    "st", "status", "tl", "timeline", "slots", "g", "gpu", "n", "notices", "history", "lg", "log",
    "info", "doctor", "j", "jobs", "w", "worker", "u", "usage", "p", "preset", "help", "c", "cluster",
))
BOOK_WORDS = ("book", "s", "x", "exclusive")
EDIT_WORDS = ("e", "edit")
CANCEL_WORDS = ("d", "del", "rm", "cancel")

# (flags, dest, takes a value): the options of bk's own commands that bk c
# takes, as the person wrote them; each node reads their words in its row's fields.
_DUR = (("-d", "--duration"), "duration", True)
_MEM = (("-m", "--mem"), "mem", True)
_SHARE = (("-s", "--share"), "share", True)
_AT = (("-t", "--at"), "at", True)
_START = (("--start",), "start", True)
_NOTE = (("--note",), "note", True)
_QUEUE = (("--queue",), "queue", False)
BOOK_PASS = (_DUR, _MEM, _SHARE, _AT, _START, _NOTE)
REC_PASS = (_DUR, _MEM, _SHARE, _AT, _START)
EDIT_PASS = (_DUR, _AT, _START, _MEM, _SHARE, (("--mode",), "mode", True), _QUEUE, _NOTE)


def register(sub) -> None:
    p = sub.add_parser("cluster", aliases=["c"], help="several servers: list, check, recommend, book over SSH",
                       description="Book GPUs on the best of several bk servers, over SSH. Without an "
                       "action: every node's state and bookings.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(handler=run_overview, command="cluster")
    acts = p.add_subparsers(dest="cluster_action", metavar="ACTION", parser_class=type(p))

    probe = acts.add_parser("probe", help="read a host's node identity; print the command that adds it",
                            description="Connect to TARGET over ssh (read-only), read its node identity "
                            "and print the exact sudo bk admin cluster add command to run. The host key "
                            "must already be known (ssh verifies it; bk never accepts a new one).",
                            epilog="Examples:\n  bk c probe gpu-b gpu-b.lab\n"
                                   "  bk c probe gpu-c 10.0.0.7 --port 2222 --known-hosts /etc/gpubk/known_hosts",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    probe.add_argument("name", metavar="NAME", help="the node's name in the catalog, e.g. gpu-b")
    probe.add_argument("target", metavar="TARGET", help="host name or address (no user@: you connect as you)")
    _add_ssh_flags(probe)
    probe.set_defaults(handler=run_probe, command="cluster probe")

    check = acts.add_parser("check", help="each node: reachable, identity, clock, version, capabilities, worker",
                            description="Ask every enabled node, in parallel, and check it: reachable over "
                            "ssh, the identity the catalog names, the clock skew (30 s at most), the bk "
                            "version, its capabilities and your worker there. Exit 1 if a check fails.",
                            epilog="Examples:\n  bk c check\n  bk c check --jobs --json",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    check.add_argument("--jobs", action="store_true", help="list your scheduled jobs on each node too")
    check.set_defaults(handler=run_check, command="cluster check")

    rec = acts.add_parser("rec", aliases=["recommend"], help="the earliest fitting start on every node",
                          description="Recommend without booking: the earliest options per node, and the "
                          "best node (earliest start, then the catalog's priority, lower first).",
                          epilog="Examples:\n  bk c rec 2 1h\n  bk c rec 4 2h 20g -t 'tomorrow 09:00'",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_request(rec, REC_PASS)
    rec.add_argument("-x", "--exclusive", action="store_true", help="exclusive GPUs (default shared)")
    rec.add_argument("-n", "--limit", metavar="N", type=int, default=1, help="options per node (default 1)")
    rec.set_defaults(handler=run_rec, command="cluster rec")

    for word, mode in (("book", "shared"), ("x", "exclusive")):
        b = acts.add_parser(word, help=f"book on the best node ({mode}); bk c N DUR is bk c book N DUR",
                            description=f"Book {mode} GPUs on the single best node: the earliest start, "
                            "then the catalog's priority. A booking never spans nodes. Words after -- are "
                            "a command that node's worker runs in the booking.",
                            epilog="Examples:\n  bk c 2 1h\n  bk c x 1 4h\n  bk c 2 8h -t 20:00 -- ./train.sh\n"
                                   "  bk c 1 30m --dry-run",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        _add_request(b, BOOK_PASS)
        b.add_argument("--queue", action="store_true",
                       help="with -t/--start: take the earliest start at or after it")
        b.add_argument("--op-id", metavar="KEY",
                       help="idempotency key (default: a new one); repeating the command with it books once")
        b.add_argument("--dry-run", action="store_true", help="choose the node; book nothing")
        b.set_defaults(handler=run_book, command="cluster book", mode=mode, takes_command=True)

    ed = acts.add_parser("e", aliases=["edit"], help="change a booking on a node: NODE/ID",
                         description="Edit one booking on one node, with the options of bk e.",
                         epilog="Examples:\n  bk c e gpu-a/3f2a -d +30m\n  bk c e gpu-b/1 -t 21:00",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    ed.add_argument("ref", metavar="NODE/ID", help="the node and the booking's ID prefix or list number there")
    _add_pass(ed, EDIT_PASS, "e")
    ed.add_argument("--op-id", metavar="KEY", help="idempotency key (default: a new one)")
    ed.set_defaults(handler=run_edit, command="cluster edit")

    dl = acts.add_parser("d", aliases=["cancel"], help="cancel a booking on a node: NODE/ID",
                         description="Cancel one booking on one node.",
                         epilog="Examples:\n  bk c d gpu-a/3f2a\n  bk c d gpu-b/1 -y --json",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    dl.add_argument("ref", metavar="NODE/ID", help="the node and the booking's ID prefix or list number there")
    dl.add_argument("--op-id", metavar="KEY", help="idempotency key (default: a new one)")
    dl.add_argument("-y", "--yes", action="store_true",
                    help="accepted as bk d takes it; bk c d never asks (the node cancels at once)")
    dl.set_defaults(handler=run_cancel, command="cluster cancel")

    tui = acts.add_parser("tui", help="the full-screen view of one node (over ssh -t)",
                          description="Open a node's full-screen view (bk t) over ssh -t. Without a node, "
                          "or where the node has no TUI, print the node table instead.",
                          epilog="Examples:\n  bk c tui gpu-a", formatter_class=argparse.RawDescriptionHelpFormatter)
    tui.add_argument("node", metavar="NODE", nargs="?", help="the node (default: the only enabled one)")
    tui.set_defaults(handler=run_tui, command="cluster tui")

    at = acts.add_parser("at", help="run one bk command on one node (bk @NODE ... is the same)",
                         description="Run a bk command on one node: bk @gpu-a l is bk c at gpu-a -- l.",
                         epilog="Examples:\n  bk @gpu-a l\n  bk @gpu-b st --json\n  bk c at gpu-a -- 1 30m",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    at.add_argument("node", metavar="NODE")
    at.set_defaults(handler=run_at, command="cluster at", takes_command=True)

    hist = acts.add_parser("history", help="usage history of every node, from the shared export",
                           description="Booked, active and unreserved GPU time per node and UID over a "
                           "period, read from the directory the nodes export to (bk c export), with the "
                           "catalog's people table applied. Default directory: the catalog's history_dir.",
                           epilog="Examples:\n  bk c history --since 30d\n"
                                  "  bk c history /shared/gpubk-history --since 2026-11-01 --until 2026-12-01",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    hist.add_argument("dir", metavar="DIR", nargs="?", help="the shared export directory")
    hist.add_argument("--since", metavar="WHEN", default="30d", help="start of the period (default 30d ago)")
    hist.add_argument("--until", metavar="WHEN", help="end of the period (default now)")
    hist.set_defaults(handler=run_history, command="cluster history")
    exp = acts.add_parser("export", help="(on a node) copy this node's sealed usage days to shared storage",
                          description="Copy this node's sealed, verified usage days into DIR/<node id>/, "
                          "incrementally (unchanged days are skipped). Run it on each node, e.g. daily "
                          "as the monitor's account, to a directory every client can read.",
                          epilog="Examples:\n  bk c export /shared/gpubk-history\n"
                                 "  sudo -u gpubk bk c export /shared/gpubk-history --json",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    exp.add_argument("dir", metavar="DIR", help="the shared export directory")
    exp.set_defaults(handler=run_export, command="cluster export")

    # The node's half: what the client runs through ssh.
    ident = acts.add_parser("id", help="this node's identity (what the catalog records)",
                            description="This node's identity: id (from its data directory), host name, "
                            "bk version, clock and capabilities.",
                            epilog="Examples:\n  bk c id --json", formatter_class=argparse.RawDescriptionHelpFormatter)
    ident.set_defaults(handler=run_id, command="cluster id")
    node = acts.add_parser("node", help="(run by the client) one bk command here, with this node's identity",
                           description="Run one row of the operation table here (--row NAME --fields JSON: "
                           "the reply is the row's wire JSON), or one bk command (-- WORDS, in a child bk), and "
                           "wrap the reply with this node's identity; with neither, only the identity. With "
                           "--expect, refuse unless this node has that id. Clients run this over ssh.",
                           epilog="Examples:\n  bk c node --expect d-0123456789abcdef01234567 --json --row list "
                                  "--fields '{\"scope\": \"all\"}'\n"
                                  "  bk c node --expect d-0123456789abcdef01234567 --json -- l",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    node.add_argument("--expect", metavar="ID", help="refuse unless this node's id is ID")
    node.add_argument("--text", action="store_true", help="run the command for people (its text, not JSON)")
    node.add_argument("--columns", metavar="N", type=int, help="terminal width for --text")
    node.add_argument("--row", metavar="NAME",
                      help="run this row of the operation table (list, recommend, book, ...) instead of words")
    node.add_argument("--fields", metavar="JSON", default="{}",
                      help="with --row: the row's request fields, a JSON object (default {})")
    node.set_defaults(handler=run_node, command="cluster node", takes_command=True)
    op = acts.add_parser("op", help="what an op-id produced here (the lost-reply lookup)",
                         description="The booking an op-id created, edited or cancelled for you here, if any.",
                         epilog="Examples:\n  bk c op c-3f2a9c1b12ab34cd56ef7890 --json",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    op.add_argument("op_id", metavar="OPID")
    op.set_defaults(handler=run_op, command="cluster op")


def _add_ssh_flags(p) -> None:
    p.add_argument("--port", type=int, metavar="N", help="ssh port (default: ssh's, normally 22)")
    p.add_argument("--known-hosts", metavar="FILE", help="a known_hosts file for this node (default: ssh's)")
    p.add_argument("--identity-file", metavar="FILE", help="an ssh key for this node (default: ssh's)")
    p.add_argument("--timeout", type=float, metavar="S", default=15.0, help="seconds to wait (default 15)")
    p.add_argument("--priority", type=int, metavar="N", default=0,
                   help="for the add command: preference among equal starts, lower first (default 0)")
    p.add_argument("--remote-command", metavar="CMD", default="bk",
                   help="the node's bk (default: bk, found on its PATH; for TARGET local, this bk)")


def _add_request(p, specs) -> None:
    p.add_argument("words", nargs="*", metavar="N DUR [MEM]", help="GPUs, duration, optional VRAM per GPU")
    _add_pass(p, specs, "book")


def _add_pass(p, specs, like: str) -> None:
    for flags, dest, value in specs:
        if value:
            p.add_argument(*flags, dest=dest, metavar=dest.upper(), help=f"as in bk {like} {flags[-1]}")
        else:
            p.add_argument(*flags, dest=dest, action="store_true", help=f"as in bk {like} {flags[-1]}")


def _passed(args, specs) -> list[str]:
    out: list[str] = []
    for flags, dest, value in specs:
        v = getattr(args, dest, None)
        if value and v is not None:
            out += [flags[-1], str(v)]
        elif not value and v:
            out.append(flags[-1])
    return out


# ------------------------------------------------------------ the client


def _cluster(ctx):
    from bk.cluster import catalog
    from bk.cluster.client import Cluster

    return Cluster(catalog.load(ctx.env), env=ctx.env)


def _when(start: str | None, end: str | None = None) -> str:
    """An ISO-8601 UTC time (or span) from a node's JSON, local for people."""
    from bk import clock
    from bk.core.timegrid import format_local_short, format_span
    from bk.core.utctime import parse_utc

    if not start:
        return "-"
    tz, now = clock.local_tz(), clock.now()
    if end:
        return format_span(parse_utc(start), parse_utc(end), tz, now)
    return format_local_short(parse_utc(start), tz, now)


def _term_line(node: dict) -> str:
    state = node["state"]
    if state == "ok":
        return "ok"
    err = node.get("error") or {}
    return f"{state}: {safe(err.get('message') or '')}".rstrip(": ")


def run_overview(args, ctx) -> Output:
    ov = _cluster(ctx).overview()
    data = ov.to_json()

    def human(term) -> str:
        # The state, with a node's failure in its words, goes last: off a
        # terminal it is folded, never cut.
        rows = [(n["name"], n["target"], sum(1 for x in data["reservations"] if x["node"] == n["name"]), _term_line(n))
                for n in data["nodes"]]
        text = table(rows, ("NODE", "TARGET", "BOOKINGS", "STATE"), term, shrink=3, fold=True)
        res = [(x["node"] + "/" + safe(x["short_id"]), safe(x.get("person") or x["user"]),
                ",".join(map(str, x["gpus"])), _when(x["start"], x["end"]), safe(x["status"]))
               for x in data["reservations"]]
        if res:
            text += "\n\n" + table(res, ("NODE/ID", "USER", "GPUS", "WHEN", "STATUS"), term)
        return text
    return Output("cluster", data, human, exit_code=0 if ov.complete else EXIT_PARTIAL)


def run_check(args, ctx) -> Output:
    chk = _cluster(ctx).check(jobs=args.jobs)
    data = chk.to_json()

    def human(term) -> str:
        lines = []
        for n in data["nodes"]:
            head = f"{n['name']} ({n['target']})"
            if n["state"] == "disabled":
                lines.append(f"{head}: disabled")
                continue
            lines.append(f"{head}: {'ok' if n['ok'] else 'PROBLEM'}")
            for c in n["checks"]:
                lines.append(f"  {'ok ' if c['ok'] else 'BAD'} {c['name']:<13} {safe(c['detail'])}")
        return "\n".join(lines)
    return Output("cluster check", data, human, exit_code=0 if chk.ok else EXIT_PARTIAL)


def _request_words(args, specs) -> list[str]:
    if not args.words:
        raise UsageError("say how many GPUs and for how long, e.g. 2 1h", hint="see: bk help c")
    return [*args.words, *_passed(args, specs)]


def cluster_request(args, *, mode: str, limit: int) -> dict:
    """The ``recommend`` row's fields every node is asked for ``bk c rec``
    and ``bk c N DUR``: the count read here, the duration, memory and start
    as the person wrote them, for each node to read on its own clock, zone
    and grid (as its own ``bk slots`` would).  The words wrong on any node
    (no duration, ``-s`` with ``-x``, ``-t`` with ``--start``) are refused
    here, once, before a node is asked."""
    from bk.cli import common
    from bk.service import builders

    if not args.words:
        raise UsageError("say how many GPUs and for how long, e.g. 2 1h", hint="see: bk help c")
    dur, mem = common.split_words(args.words[1:], args.duration, args.mem)
    if args.at is not None and args.start is not None:
        builders.start(args.at, args.start, now=0, tz=None, slot_minutes=1)     # refuses both
    fields = {"count": builders.count(args.words[0]), "duration": dur, "mode": mode, "limit": limit}
    if mem is not None:
        fields["mem_mib"] = mem
    if args.share is not None:
        try:
            fields["share"] = int(args.share)
        except ValueError:
            raise UsageError(f"--share takes a whole number, got {args.share!r}", hint="e.g. -s 2") from None
        builders.check_share(mode, fields["share"])
    if (args.at or args.start) is not None:
        fields["start"] = args.at if args.at is not None else args.start
    return fields


def run_rec(args, ctx) -> Output:
    fields = cluster_request(args, mode="exclusive" if args.exclusive else "shared", limit=max(1, args.limit))
    rec = _cluster(ctx).recommend(fields)
    data = rec.to_json()

    def human(term) -> str:
        rows = []
        for r in rec.rows:
            if r.options:
                o = r.options[0]
                rows.append((r.node, _when(o["start"], o["end"]), ",".join(map(str, o["gpus"])), r.priority, ""))
            else:
                rows.append((r.node, "-", "-", r.priority, safe(r.problem or "")))
        text = table(rows, ("NODE", "WHEN", "GPUS", "PRIORITY", "PROBLEM"), term, shrink=4, fold=True)
        if rec.best:
            text += f"\n\nbest: {rec.best.node} at {_when(rec.best.option['start'])}; book it with: bk c " \
                    + " ".join(_request_words(args, REC_PASS))
        else:
            text += "\n\nno node can take it"
        return text
    answered = all(r.problem is None or r.problem == "no option fits" for r in rec.rows)
    code = EXIT_PARTIAL if not answered else 0 if rec.best else EXIT_CAPACITY
    return Output("cluster rec", data, human, exit_code=code)


def run_book(args, ctx) -> Output:
    from bk.cluster.client import booking_request

    mode = args.mode
    fields = cluster_request(args, mode=mode, limit=1)
    exact = bool((args.at or args.start) and not args.queue)
    attached = getattr(args, "attached", None)

    def booking(option: dict) -> dict:
        return booking_request(fields, option, exact=exact, note=args.note)

    # A command after -- goes with it (the book_job row): that node keeps it
    # private to you, and your worker there starts it.
    done = _cluster(ctx).book(fields, booking, command=attached or None, op_id=args.op_id, dry_run=args.dry_run)
    data = done.to_json()
    res = data.get("reservation") or {}

    def human(term) -> str:
        if done.dry_run:
            o = done.rec.best.option
            return (f"would book on {done.node}: GPUs {','.join(map(str, o['gpus']))} "
                    f"{_when(o['start'], o.get('end'))} (dry run)")
        how = " (the reply was lost; the node confirms it)" if done.recovered else ""
        short = safe(res.get("short_id"))
        return (f"{safe(data['status'])} on {done.node}: {short} GPUs "
                f"{','.join(map(str, res.get('gpus') or []))} {_when(res.get('start'), res.get('end'))}{how}\n"
                f"edit: bk c e {done.node}/{short} -d +30m · cancel: bk c d {done.node}/{short}")
    return Output("cluster book", data, human,
                  done=None if done.dry_run else f"booked {safe(res.get('short_id'))} on {done.node}")


def _split_ref(ref: str) -> tuple[str, str]:
    node, sep, rid = ref.partition("/")
    if not sep or not node or not rid:
        raise InvalidInput(f"{ref!r} is not NODE/ID", hint="e.g. gpu-a/3f2a (see the IDs with: bk c)")
    return node, rid


def _write_on(ctx, args, row: str, fields: dict, command: str) -> Output:
    from bk.cluster.client import new_op_id

    node, _ = _split_ref(args.ref)
    op_id = args.op_id or new_op_id()
    out = _cluster(ctx).write(node, row, fields, op_id)
    data = {"node": node, "op_id": op_id, "recovered": out.recovered, "retried": out.retried, **out.reply_data}
    res = data.get("reservation") or {}

    status, short = safe(data.get("status")), safe(res.get("short_id"))

    def human(term) -> str:
        return (f"{status} on {node}: {short} {_when(res.get('start'), res.get('end'))}"
                + (" (the reply was lost; the node confirms it)" if out.recovered else ""))
    return Output(command, data, human, warnings=list(out.warnings or []), done=f"{status} {short} on {node}")


def edit_fields(args) -> dict:
    """The ``edit`` row's fields for ``bk c e NODE/ID ...``: the ID as typed
    (a list number or a prefix: the node resolves it) and the options of
    ``bk e`` as the person wrote them, for the node to read against its
    booking on its own clock, zone and grid (``-d +30m`` moves that
    booking's end).  What no node could read is refused here."""
    from bk.service import builders

    _, rid = _split_ref(args.ref)
    fields: dict = {"ref": rid}
    if args.duration is not None:
        fields["duration"] = args.duration
    if args.at is not None and args.start is not None:
        builders.start(args.at, args.start, now=0, tz=None, slot_minutes=1)     # refuses both
    if (args.at or args.start) is not None:
        fields["start"] = args.at if args.at is not None else args.start
    if args.mem is not None:
        if args.mem.strip().lower() in builders.CLEAR_MEM_WORDS:
            fields["clear_mem"] = True
        else:
            fields["mem_mib"] = args.mem
    if args.share is not None:
        try:
            fields["share"] = int(args.share)
        except ValueError:
            raise UsageError(f"--share takes a whole number, got {args.share!r}", hint="e.g. -s 2") from None
    if args.mode is not None:
        fields["mode"] = args.mode
    if args.queue:
        fields["queue"] = True
    if args.note is not None:
        fields["note"] = args.note
    if len(fields) == 1:
        raise UsageError("say what to change, e.g. -d +30m", hint="see: bk help c e")
    return fields


def run_edit(args, ctx) -> Output:
    return _write_on(ctx, args, "edit", edit_fields(args), "cluster edit")


def run_cancel(args, ctx) -> Output:
    _, rid = _split_ref(args.ref)
    return _write_on(ctx, args, "cancel", {"ref": rid}, "cluster cancel")


def run_at(args, ctx) -> Output:
    """``bk @NODE WORDS``: the node's own reply, as if bk ran there."""
    from bk.cli.render import Term
    from bk.cluster.client import new_op_id

    words = list(getattr(args, "attached", None) or [])
    if not words:
        raise UsageError(f"say what to run on {args.node}, e.g. bk @{args.node} l", hint="see: bk help c at")
    cluster = _cluster(ctx)
    first = next((w for w in words if not w.startswith("-")), "")
    cut = words.index("--") if "--" in words else len(words)
    write = (first in BOOK_WORDS + EDIT_WORDS + CANCEL_WORDS or first.isdigit()) and "--op-id" not in words[:cut] \
        and "--dry-run" not in words[:cut]
    if write:
        # A write gets an op-id and the lost-reply protocol, as bk c does;
        # the node answers in JSON and the line for people is made here.
        action = "edit" if first in EDIT_WORDS else "cancel" if first in CANCEL_WORDS else "book"
        op_id = new_op_id()
        out = cluster.write_words(args.node, words, op_id, action)
        data = {"node": args.node, "op_id": op_id, "recovered": out.recovered, **out.reply_data}
        res = data.get("reservation") or {}
        status, short = safe(data.get("status")), safe(res.get("short_id"))
        if "-q" in words[:cut] or "--quiet" in words[:cut]:
            human = short
        else:
            human = (f"{status} on {args.node}: {short} GPUs {','.join(map(str, res.get('gpus') or []))} "
                     f"{_when(res.get('start'), res.get('end'))}"
                     + (" (the reply was lost; the node confirms it)" if out.recovered else ""))
        return Output(action, data, human, warnings=list(out.warnings or []),
                      done=f"{status} {short} on {args.node}")
    reply = cluster.at(args.node, words, as_json=ctx.json, columns=Term.detect(env=ctx.env).width)
    if ctx.json:
        env = reply.envelope
        err = reply.error()
        if err is not None:
            raise err
        return Output(env.get("command") or f"@{args.node}", {**env.get("data", {}), "node": args.node},
                      None, warnings=reply.warnings)
    import sys

    # The node's own text and diagnostics, as it printed them, but through
    # the one text policy: another machine must not drive this terminal.
    if reply.stderr:
        sys.stderr.write(safe_lines(reply.stderr).rstrip("\n") + "\n")
    return Output(f"@{args.node}", {}, safe_lines(reply.text or ""), exit_code=reply.exit)


def run_tui(args, ctx) -> Output:
    import importlib.util

    cluster = _cluster(ctx)
    enabled = cluster.catalog.enabled()
    name = args.node or (enabled[0].name if len(enabled) == 1 else None)
    if ctx.json or name is None:
        out = run_overview(args, ctx)
        why = "--json has no full-screen view" if ctx.json else "name a node: bk c tui NODE"
        out.warnings = [*out.warnings, why]
        return out
    entry = cluster.catalog.get(name)
    reply = cluster.at(name, ["c", "id"], as_json=True)
    if "tui" not in (reply.node.get("capabilities") or ()) or importlib.util.find_spec("bk.cli.cmd_tui") is None:
        out = run_overview(args, ctx)
        out.warnings = [*out.warnings, f"{name} has no full-screen view (bk t) in its bk; here is the node table"]
        return out
    import subprocess

    from bk.cluster.node import terminal_argv

    rc = subprocess.call(terminal_argv(entry, ["t"]))
    return Output("cluster tui", {"node": name, "exit": rc}, "", exit_code=0 if rc == 0 else EXIT_PARTIAL)


def run_probe(args, ctx) -> Output:
    import shlex

    from bk.cluster import catalog, replies
    from bk.cluster.node import NodeClient, NodeFailure

    catalog.check_name(args.name)
    catalog.check_target(args.target)
    entry = catalog.NodeEntry(args.name, "", args.target, args.priority, args.timeout, True, args.port,
                              args.known_hosts, args.identity_file, tuple(shlex.split(args.remote_command)))
    try:
        reply = NodeClient(entry, env=ctx.env).call(["c", "id"], shape=replies.IDENTITY)
    except NodeFailure as f:
        raise f.as_error() from None
    ident = reply.data if reply.ok else reply.node
    cmd = ["sudo", "bk", "admin", "cluster", "add", args.name, args.target, "--id", str(ident.get("id"))]
    for flag, v in (("--port", args.port), ("--known-hosts", args.known_hosts),
                    ("--identity-file", args.identity_file)):
        if v is not None:
            cmd += [flag, str(v)]
    if args.timeout != 15.0:
        cmd += ["--timeout", f"{args.timeout:g}"]
    if args.priority:
        cmd += ["--priority", str(args.priority)]
    if args.remote_command != "bk":
        cmd += ["--remote-command", args.remote_command]
    command = " ".join(shlex.quote(w) for w in cmd)
    data = {"name": args.name, "target": args.target, "node": ident, "skew_s": reply.skew_s,
            "command": command}
    human = (f"{args.name} at {args.target}: node {safe(ident.get('id'))} ({safe(ident.get('hostname'))}, "
             f"bk {safe(ident.get('version'))}, id {safe(ident.get('id_source'))})\n"
             f"add it with:\n  {safe(command)}")
    return Output("cluster probe", data, human)


# ------------------------------------------------------------- the node


def identity(ctx) -> dict:
    import importlib.util
    import socket
    import time

    from bk import __version__
    from bk.cluster.identity import node_id
    from bk.core.models import iso

    settings = ctx.app().settings
    nid, source = node_id(settings)
    caps = ["node.v1", "rows.v1", "op-lookup", "book", "edit", "cancel", "slots", "jobs", "usage"]
    if importlib.util.find_spec("bk.cli.cmd_tui") is not None:
        caps.append("tui")
    t = time.time()
    return {"id": nid, "id_source": source, "hostname": socket.gethostname(), "version": __version__,
            "mode": settings.mode, "now": iso(int(t)), "now_epoch": round(t, 3), "capabilities": caps}


def run_id(args, ctx) -> Output:
    data = identity(ctx)
    return Output("cluster id", data, "\n".join(f"{k}: {safe(str(v))}" for k, v in data.items()))


def run_node(args, ctx) -> Output:
    ident = identity(ctx)
    if args.expect and args.expect != ident["id"]:
        raise ConfigError(f"this is node {ident['id']} ({ident['hostname']}), not {args.expect}",
                          hint="the client's catalog names another node here; compare with: bk c id",
                          details={"reason": "wrong_identity", "node": ident})
    words = list(getattr(args, "attached", None) or [])
    if args.row is not None:
        if words:
            raise UsageError("bk c node runs a row or words, not both")
        from bk.cluster.serve import row_reply

        reply = row_reply(ctx.app(), ctx.call, args.row, args.fields, cwd=_here, env=ctx.env)
        return Output("cluster node", {"node": ident, "reply": reply, "exit": 0}, "")
    if not words:          # nothing to run: who answers (the client's version check)
        return Output("cluster node", {"node": ident, "reply": None, "exit": 0}, "")
    _check_node_words(words)
    env = dict(ctx.env)
    if args.columns:
        env["COLUMNS"] = str(args.columns)
    cut = words.index("--") if "--" in words else len(words)     # -- CMD is the command's, keep it last
    rc, out, err = _child(words[:cut] + ([] if args.text else ["--json"]) + words[cut:], env)
    if args.text:
        return Output("cluster node", {"node": ident, "text": out, "stderr": err, "exit": rc}, "")
    import json

    try:
        reply = json.loads(out)
    except ValueError:
        reply = None
    return Output("cluster node", {"node": ident, "reply": reply, "exit": rc}, "")


def _here() -> str:
    """This process's working directory: where a ``book_job``'s command runs
    (the directory ssh starts the caller's session in), as ``bk N DUR -- CMD``
    typed there would run it."""
    import os

    try:
        return os.getcwd()
    except OSError:
        raise UsageError("the current directory no longer exists",
                         hint="cd to an existing directory and run the command again") from None


def _check_node_words(words: list[str]) -> None:
    first = next((w for w in words if not w.startswith("-")), None)
    if first is None:
        raise UsageError("bk c node runs one bk command: bk c node -- l")
    ok = first in NODE_WORDS or first.isdigit()
    if first in ("c", "cluster"):
        rest = words[words.index(first) + 1:]
        ok = bool(rest) and rest[0] in ("id", "op")
    if first in ("w", "worker") and "start" in words:
        ok = False
    if not ok:
        raise UsageError(f"bk c node does not run bk {first} for a client",
                         hint="it runs the everyday commands (book, list, edit, cancel, status, slots, ...)")


def _child(argv: list[str], env: dict) -> tuple[int, str, str]:
    """Run one bk command for a person (``bk @NODE l``) as this node's own bk
    in a child process, its stdout and stderr captured: the command's prints
    and exits stay its own, nothing of this process is swapped or shared."""
    import subprocess

    from bk.cluster.node import this_bk

    done = subprocess.run([*this_bk(), *argv], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          check=False)
    return done.returncode, done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace")


def run_op(args, ctx) -> Output:
    from bk.service import OpLookupRequest

    got = ctx.app().run("op_lookup", OpLookupRequest(args.op_id), call=ctx.call())
    human = (f"op {args.op_id}: {got.action} of {got.reservation_id[:8]}"
             if got.found else f"op {args.op_id}: not used here")
    return Output("cluster op", got.to_json(), human)


def run_export(args, ctx) -> Output:
    from bk.cluster.history import export_node

    ident = identity(ctx)
    done = export_node(ctx.app().settings, args.dir, node=ident, now_iso=ident["now"])
    data = done.to_json()
    lines = [f"exported {len(done.copied)} day(s) to {done.dest}, {done.unchanged} unchanged"]
    lines += [f"warning: not exported: {d} ({w})" for d, w in done.refused]
    return Output("cluster export", data, "\n".join(lines), exit_code=EXIT_PARTIAL if done.refused else 0,
                  done=lines[0])


def run_history(args, ctx) -> Output:
    from bk import clock
    from bk.cluster import catalog as cat
    from bk.cluster.history import read
    from bk.core.usage import parse_since

    c = cat.load(ctx.env, missing_ok=True)
    where = args.dir or c.history_dir
    if not where:
        raise UsageError("name the export directory, or set history_dir in the catalog",
                         hint="bk c history /shared/gpubk-history (the nodes write it: bk c export DIR)")
    now, tz = clock.now(), clock.local_tz()
    since = parse_since(args.since, now, tz)
    until = now if args.until is None else parse_since(args.until, now, tz)
    if until <= since:
        raise InvalidInput(f"--until ({args.until}) must be after --since ({args.since})")
    h = read(where, c, since, until)
    data = h.to_json()

    def hours(s: int) -> str:
        return f"{s / 3600:.1f}"

    def human(term) -> str:
        rows = [(u["node"], u["uid"], safe(u["person"] or "-"), hours(u["booked_s"]), hours(u["active_s"]),
                 hours(u["unreserved_s"])) for u in data["users"]]
        text = table(rows, ("NODE", "UID", "PERSON", "BOOKED H", "ACTIVE H", "UNRESERVED H"), term) if rows \
            else "no usage in that period"
        if data["people"]:
            text += "\n\n" + table([(safe(p["person"]), hours(p["booked_s"]), hours(p["active_s"]),
                                      ",".join(p["nodes"])) for p in data["people"]],
                                    ("PERSON", "BOOKED H", "ACTIVE H", "NODES"), term)
        for n in data["nodes"]:
            if n["problems"]:
                text += f"\nwarning: {n['name'] or n['id']}: {len(n['problems'])} problem(s) in its export"
        return text
    bad = any(n["problems"] for n in data["nodes"])
    return Output("cluster history", data, human, exit_code=EXIT_PARTIAL if bad else 0)
