"""``sudo bk admin cluster init|add|set|remove|enable|disable|map|unmap|status``:
the root-owned cluster catalog (``bk.admin.cluster`` plans and applies)."""

from __future__ import annotations

import argparse
import json

from bk.cli.render import Output, safe, table

EPILOG = """Examples:
  sudo bk admin cluster init gpu-a --yes          this server is node gpu-a
  bk c probe gpu-b gpu-b.lab                      prints the add command to run:
  sudo bk admin cluster add gpu-b gpu-b.lab --id d-0123456789abcdef01234567
  sudo bk admin cluster set gpu-b --priority 1 --timeout 30
  sudo bk admin cluster disable gpu-b             keep it, stop booking there
  sudo bk admin cluster map gpu-b 1001 alice      UID 1001 on gpu-b is alice
  bk admin cluster status

The catalog is /etc/gpubk/cluster.json (BK_CLUSTER_FILE names another); it
must be root's and writable by nobody else.  See docs/CLUSTER.md."""


def register_admin(actions, parser_class) -> None:
    """``bk admin cluster`` and its actions, on ``bk admin``'s sub-parsers."""
    p = actions.add_parser("cluster", help="the cluster catalog: nodes this client books on",
                           description="Edit the root-owned cluster catalog: the nodes bk c books on.",
                           epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(handler=run_status, command="admin cluster status")
    acts = p.add_subparsers(dest="cluster_admin_action", metavar="ACTION", parser_class=parser_class)

    init = acts.add_parser("init", help="create the catalog; with NAME, enter this server as node NAME",
                           description="Create the catalog if there is none. With NAME (on a GPU server), "
                           "store this server's node id in its data directory and enter it as the local "
                           "node NAME.", epilog="Examples:\n  sudo bk admin cluster init gpu-a --yes\n"
                           "  sudo bk admin cluster init --yes          (a login node: no local node)\n"
                           "  sudo bk admin cluster init --history-dir /shared/gpubk-history --history-owner gpubk",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    init.add_argument("name", metavar="NAME", nargs="?", help="this server's node name")
    init.add_argument("--priority", type=int, default=0, metavar="N", help="its priority (default 0)")
    init.add_argument("--history-dir", metavar="DIR",
                      help="where the nodes export usage history, for bk c history (kept when not given)")
    init.add_argument("--history-owner", metavar="ACCOUNT", action="append", dest="history_owners",
                      help="an account (name or UID) that runs bk c export on the nodes: bk c history "
                      "trusts only namespaces it, root or the reader owns; repeat for several "
                      "(default gpubk; kept when not given)")
    _plan_flags(init)
    init.set_defaults(handler=run_init, command="admin cluster init")

    add = acts.add_parser("add", help="add a node (bk c probe prints this command)",
                          description="Add a node: its name, its ssh target (a host, never user@host) "
                          "and the id bk c probe read from it.",
                          epilog="Examples:\n  sudo bk admin cluster add gpu-b gpu-b.lab --id d-0123456789abcdef01234567\n"
                                 "  sudo bk admin cluster add gpu-c 10.0.0.7 --id n-... --port 2222 --priority 1",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    add.add_argument("name", metavar="NAME")
    add.add_argument("target", metavar="TARGET")
    add.add_argument("--id", required=True, metavar="ID", help="the node id (from bk c probe)")
    _node_flags(add)
    add.add_argument("--disabled", action="store_true", help="add it disabled")
    _plan_flags(add)
    add.set_defaults(handler=run_add, command="admin cluster add")

    st = acts.add_parser("set", help="change a node's target, id, priority, timeout, ssh options",
                         description="Change fields of one node; the others stay.",
                         epilog="Examples:\n  sudo bk admin cluster set gpu-b --priority 1 --timeout 30",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    st.add_argument("name", metavar="NAME")
    st.add_argument("--target", metavar="HOST")
    st.add_argument("--id", metavar="ID")
    _node_flags(st, defaults=False)
    _plan_flags(st)
    st.set_defaults(handler=run_set, command="admin cluster set")

    for word, helptext in (("remove", "remove a node"), ("enable", "book on a node again"),
                           ("disable", "keep a node, stop booking there")):
        a = acts.add_parser(word, help=helptext, description=helptext[0].upper() + helptext[1:] + ".",
                            epilog=f"Examples:\n  sudo bk admin cluster {word} gpu-b",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        a.add_argument("name", metavar="NAME")
        _plan_flags(a)
        a.set_defaults(handler=run_simple, command=f"admin cluster {word}", word=word)

    mp = acts.add_parser("map", help="name the person behind a UID on a node (for reports)",
                         description="Record that UID on NODE is PERSON, for reports across nodes whose "
                         "UIDs differ.", epilog="Examples:\n  sudo bk admin cluster map gpu-b 1001 alice",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    mp.add_argument("node", metavar="NODE")
    mp.add_argument("uid", metavar="UID", type=int)
    mp.add_argument("person", metavar="PERSON")
    _plan_flags(mp)
    mp.set_defaults(handler=run_map, command="admin cluster map")
    um = acts.add_parser("unmap", help="forget a UID's person on a node",
                         description="Remove one UID mapping.", epilog="Examples:\n  sudo bk admin cluster unmap gpu-b 1001",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    um.add_argument("node", metavar="NODE")
    um.add_argument("uid", metavar="UID", type=int)
    _plan_flags(um)
    um.set_defaults(handler=run_unmap, command="admin cluster unmap")

    status = acts.add_parser("status", help="show the catalog (checked as bk c reads it)",
                             description="Show the catalog's nodes and mappings, validated.",
                             epilog="Examples:\n  bk admin cluster status --json",
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    status.set_defaults(handler=run_status, command="admin cluster status")


def _node_flags(p, *, defaults: bool = True) -> None:
    p.add_argument("--priority", type=int, metavar="N", default=0 if defaults else None,
                   help="preference among equal starts, lower first" + (" (default 0)" if defaults else ""))
    p.add_argument("--timeout", type=float, metavar="S", default=None,
                   help="seconds a reply may take (default 15)")
    p.add_argument("--port", type=int, metavar="N", help="ssh port")
    p.add_argument("--known-hosts", metavar="FILE", help="a known_hosts file for this node")
    p.add_argument("--identity-file", metavar="FILE", help="an ssh key every user's ssh uses for this node")
    p.add_argument("--remote-command", metavar="CMD", help="the node's bk (default: bk on its PATH; for target local, this bk)")


def _plan_flags(p) -> None:
    p.add_argument("--dry-run", action="store_true", help="print the new catalog; write nothing")
    p.add_argument("-y", "--yes", action="store_true", help="accepted for scripts (nothing is asked)")


def _path(ctx) -> str:
    from bk.cluster.catalog import catalog_path

    return catalog_path(ctx.env)


def _commit(ctx, args, new, what: str) -> Output:
    from bk.admin import cluster as admin

    doc = new.to_json()
    if not args.dry_run:
        admin.apply(new, _path(ctx))
    done = f"{what} ({_path(ctx)})"
    human = (json.dumps(doc, indent=2, sort_keys=True) + "\n(dry run: nothing written)") if args.dry_run else done
    return Output(args.command, {"path": _path(ctx), "catalog": doc, "dry_run": args.dry_run}, human,
                  done=None if args.dry_run else done)


def _entry_fields(args) -> dict:
    import shlex

    out = {"priority": getattr(args, "priority", None), "timeout_s": args.timeout, "port": args.port,
           "known_hosts": args.known_hosts, "identity_file": args.identity_file,
           "remote_command": tuple(shlex.split(args.remote_command)) if args.remote_command else None}
    return out


def run_init(args, ctx) -> Output:
    from bk.admin import cluster as admin
    from bk.cluster import catalog as cat

    admin.require_root("change the cluster catalog")
    c = admin.load(ctx.env)
    if args.history_dir is not None:
        c = admin.history_dir(c, args.history_dir)
    if args.history_owners:
        c = admin.history_owners(c, args.history_owners)
    if args.name is None:
        return _commit(ctx, args, c, "the catalog is ready")
    cat.check_name(args.name)
    if args.dry_run:
        nid = "(a new id, stored in the data directory)"
        doc = {**c.to_json()}
        doc["nodes"] = {**doc["nodes"], args.name: {"id": nid, "target": "local", "priority": args.priority}}
        return Output(args.command, {"path": _path(ctx), "catalog": doc, "dry_run": True},
                      json.dumps(doc, indent=2, sort_keys=True) + "\n(dry run: nothing written)")
    nid = admin.local_node_id(ctx.app().settings)
    existing = next((n for n in c.nodes if n.id == nid), None)
    if existing is not None and existing.name == args.name:
        return _commit(ctx, args, c, f"this server is already node {args.name}")
    new = admin.add(c, cat.NodeEntry(args.name, nid, cat.LOCAL, args.priority))
    return _commit(ctx, args, new, f"this server is node {args.name} ({nid})")


def run_add(args, ctx) -> Output:
    from bk.admin import cluster as admin
    from bk.cluster import catalog as cat

    f = {k: v for k, v in _entry_fields(args).items() if v is not None}
    doc = {"id": args.id, "target": args.target, "enabled": not args.disabled,
           **{k: (list(v) if k == "remote_command" else v) for k, v in f.items()}}
    entry = cat.parse_node(args.name, doc, "the new node")
    new = admin.add(admin.load(ctx.env), entry)
    return _commit(ctx, args, new, f"added {args.name} ({args.target}, {args.id})")


def run_set(args, ctx) -> Output:
    from bk.admin import cluster as admin

    new = admin.set_fields(admin.load(ctx.env), args.name, target=args.target, id=args.id,
                           **_entry_fields(args))
    return _commit(ctx, args, new, f"changed {args.name}")


def run_simple(args, ctx) -> Output:
    from bk.admin import cluster as admin

    c = admin.load(ctx.env)
    if args.word == "remove":
        new = admin.remove(c, args.name)
    else:
        new = admin.enable(c, args.name, args.word == "enable")
    return _commit(ctx, args, new, f"{args.word.rstrip('e')}ed {args.name}")


def run_map(args, ctx) -> Output:
    from bk.admin import cluster as admin

    new = admin.map_person(admin.load(ctx.env), args.node, args.uid, args.person)
    return _commit(ctx, args, new, f"UID {args.uid} on {args.node} is {args.person}")


def run_unmap(args, ctx) -> Output:
    from bk.admin import cluster as admin

    new = admin.unmap(admin.load(ctx.env), args.node, args.uid)
    return _commit(ctx, args, new, f"forgot UID {args.uid} on {args.node}")


def run_status(args, ctx) -> Output:
    from bk.cluster import catalog as cat

    c = cat.load(ctx.env)
    doc = c.to_json()

    def human(term) -> str:
        rows = [(n.name, n.target + (f":{n.port}" if n.port else ""), n.id, n.priority, f"{n.timeout_s:g}s",
                 "yes" if n.enabled else "no") for n in c.nodes]
        text = f"{c.path}\n" + (table(rows, ("NODE", "TARGET", "ID", "PRIORITY", "TIMEOUT", "ENABLED"), term)
                                if rows else "no nodes yet: bk c probe NAME HOST")
        for node, m in sorted(c.people.items()):
            text += "\n" + f"{node}: " + ", ".join(f"{u}={safe(p)}" for u, p in sorted(m.items()))
        if c.history_dir:
            owners = c.history_owners if c.history_owners is not None else cat.DEFAULT_HISTORY_OWNERS
            text += f"\nhistory: {c.history_dir}, exported by {', '.join(map(str, owners)) or 'root only'}"
        return text
    return Output("admin cluster status", {"path": c.path, "catalog": doc}, human)
