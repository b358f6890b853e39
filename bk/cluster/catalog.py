"""The cluster catalog: ``/etc/gpubk/cluster.json``, the nodes a client may book on.

Why it is root-owned and checked like the trusted configuration: the catalog
decides which machines a user's ``bk c 2 1h`` books on and which node
identity each reply must carry.  A catalog anyone could write would let one
user send everybody's bookings (and the commands they attach) to a host of
their choosing.  So the file and every directory above it are root's and
writable by nobody else (``bk.store.config.check_trusted``), it is written
only by ``sudo bk admin cluster ...`` with the store's atomic replace, and
every key is known: a typo is refused with "did you mean", never ignored.

The document::

    {"version": 1,
     "nodes": {"gpu-a": {"id": "n-3f2a...", "target": "gpu-a.lab", "priority": 0,
                         "timeout_s": 15, "enabled": true, "port": 22,
                         "known_hosts": "/etc/gpubk/known_hosts", "remote_command": "bk"}},
     "people": {"gpu-a": {"1001": "alice"}}}

A target names a host (or ``local``: this machine, without ssh), never a
user: each user reaches every node as themselves, so the node's broker sees
their own UID.  ``people`` maps a node's UIDs to persons, for reports over
nodes whose UIDs differ.
"""

from __future__ import annotations

import json
import os
import re

from bk.core.errors import ConfigError, NotFound
from bk.core.record import dataclass, field, replace

SYSTEM_CATALOG = "/etc/gpubk/cluster.json"
VERSION = 1
LOCAL = "local"
DEFAULT_TIMEOUT_S = 15.0
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
# A host name, an IPv4 address or a bracketed IPv6 one: no user ("@"), no
# option ("-" first), no shell or ssh-config syntax.
TARGET_RE = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9_.-]{0,252}|\[[0-9A-Fa-f:.]+\])$")
NODE_ID_RE = re.compile(r"^[a-z]-[0-9a-f]{8,64}$")

NODE_KEYS = ("id", "target", "priority", "timeout_s", "enabled", "port", "known_hosts",
             "identity_file", "remote_command")
TOP_KEYS = ("version", "nodes", "people", "history_dir", "history_owners")
# Who may own a node's namespace under history_dir when the catalog names
# nobody: the service account the guide installs (root and the reader
# are always trusted).
DEFAULT_HISTORY_OWNERS = ("gpubk",)
ACCOUNT_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}\$?$")


@dataclass(frozen=True)
class NodeEntry:
    name: str
    id: str
    target: str
    priority: int = 0
    timeout_s: float = DEFAULT_TIMEOUT_S
    enabled: bool = True
    port: int | None = None
    known_hosts: str | None = None
    identity_file: str | None = None
    remote_command: tuple[str, ...] = ("bk",)

    @property
    def local(self) -> bool:
        return self.target == LOCAL

    def to_json(self) -> dict:
        out = {"id": self.id, "target": self.target, "priority": self.priority,
               "timeout_s": self.timeout_s, "enabled": self.enabled}
        for k in ("port", "known_hosts", "identity_file"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        if self.remote_command != ("bk",):
            out["remote_command"] = list(self.remote_command)
        return out


@dataclass(frozen=True)
class Catalog:
    nodes: tuple[NodeEntry, ...] = ()
    people: dict = field(default_factory=dict)      # node -> {uid str: person}
    path: str | None = None
    history_dir: str | None = None                  # where nodes export usage (bk c history)
    history_owners: tuple | None = None             # accounts (names or UIDs) that may export there

    def get(self, name: str) -> NodeEntry:
        for n in self.nodes:
            if n.name == name:
                return n
        import difflib

        close = difflib.get_close_matches(name, [n.name for n in self.nodes], n=1)
        raise NotFound(f"no node {name!r} in the cluster catalog",
                       hint=(f"did you mean {close[0]!r}? " if close else "") + "list them with: bk c")

    def enabled(self) -> tuple[NodeEntry, ...]:
        return tuple(n for n in self.nodes if n.enabled)

    def person(self, node: str, uid: int) -> str | None:
        return self.people.get(node, {}).get(str(uid))

    def history_owner_uids(self, pwd_lookup=None) -> dict[int, str]:
        """UID -> account of everyone whose namespaces ``bk c history``
        trusts: root, the accounts of ``history_owners`` (default
        ``DEFAULT_HISTORY_OWNERS``) that exist here, and numeric UIDs."""
        if pwd_lookup is None:
            import pwd

            pwd_lookup = pwd.getpwnam
        out = {0: "root"}
        for who in (self.history_owners if self.history_owners is not None else DEFAULT_HISTORY_OWNERS):
            if isinstance(who, int):
                out.setdefault(who, str(who))
                continue
            try:
                out.setdefault(pwd_lookup(who).pw_uid, who)
            except KeyError:
                pass
        return out

    def to_json(self) -> dict:
        out = {"version": VERSION, "nodes": {n.name: n.to_json() for n in self.nodes},
               "people": {k: dict(sorted(v.items())) for k, v in sorted(self.people.items()) if v}}
        if self.history_dir:
            out["history_dir"] = self.history_dir
        if self.history_owners is not None:
            out["history_owners"] = list(self.history_owners)
        return out

    def with_node(self, entry: NodeEntry) -> Catalog:
        rest = tuple(n for n in self.nodes if n.name != entry.name)
        return replace(self, nodes=tuple(sorted((*rest, entry), key=lambda n: n.name)))

    def without(self, name: str) -> Catalog:
        self.get(name)
        people = {k: v for k, v in self.people.items() if k != name}
        return replace(self, nodes=tuple(n for n in self.nodes if n.name != name), people=people)


def _unknown(key: str, known, where: str, source: str) -> ConfigError:
    import difflib

    close = difflib.get_close_matches(key, known, n=1)
    return ConfigError(f"{source}: unknown key {key!r} {where}",
                       hint=(f"did you mean {close[0]!r}?" if close else
                             "known keys: " + ", ".join(known)) + " (docs/CLUSTER.md)")


def check_name(name: object, source: str = "node name") -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(f"{source}: node name {name!r} must be 1-63 characters of a-z, 0-9, '_', '.', '-'",
                          hint="e.g. gpu-a")
    return name


def check_target(target: object, source: str = "target") -> str:
    if isinstance(target, str) and "@" in target:
        raise ConfigError(f"{source}: target {target!r} names a user; a target is a host only",
                          hint=f"use {target.rsplit('@', 1)[1]!r}: every user connects as themselves "
                               "(their own account on the node)")
    if not isinstance(target, str) or not (target == LOCAL or TARGET_RE.match(target)):
        raise ConfigError(f"{source}: target {target!r} is not a host name or address",
                          hint="e.g. gpu-a.lab, 10.0.0.5, or local for this machine")
    return target


def parse_node(name: str, doc: object, source: str) -> NodeEntry:
    where = f"{source}: node {name!r}"
    check_name(name, source)
    if not isinstance(doc, dict):
        raise ConfigError(f"{where} must be an object")
    for k in doc:
        if k not in NODE_KEYS:
            raise _unknown(k, NODE_KEYS, f"in node {name!r}", source)
    for k in ("id", "target"):
        if k not in doc:
            raise ConfigError(f"{where} has no {k!r}",
                              hint="add it with: bk c probe NAME TARGET (it prints the command)")
    nid = doc["id"]
    if not isinstance(nid, str) or not NODE_ID_RE.match(nid):
        raise ConfigError(f"{where}: id {nid!r} is not a node id (what bk c probe prints)")
    target = check_target(doc["target"], where)
    pri = doc.get("priority", 0)
    if not isinstance(pri, int) or isinstance(pri, bool) or not -1000 <= pri <= 1000:
        raise ConfigError(f"{where}: priority must be a whole number from -1000 to 1000, got {pri!r}")
    tmo = doc.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(tmo, bool) or not isinstance(tmo, (int, float)) or not 0.1 <= tmo <= 600:
        raise ConfigError(f"{where}: timeout_s must be between 0.1 and 600 seconds, got {tmo!r}")
    enabled = doc.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{where}: enabled must be true or false")
    port = doc.get("port")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535):
        raise ConfigError(f"{where}: port must be 1-65535, got {port!r}")
    paths = {}
    for k in ("known_hosts", "identity_file"):
        v = doc.get(k)
        if v is not None and (not isinstance(v, str) or not os.path.isabs(v)):
            raise ConfigError(f"{where}: {k} must be an absolute path, got {v!r}")
        paths[k] = v
    rc = doc.get("remote_command", ["bk"])
    if isinstance(rc, str):
        rc = [rc]
    if (not isinstance(rc, list) or not rc or not all(isinstance(w, str) and w and "\0" not in w for w in rc)):
        raise ConfigError(f"{where}: remote_command must be a list of words, e.g. [\"/opt/gpubk/bin/bk\"]")
    return NodeEntry(name, nid, target, pri, float(tmo), enabled, port, paths["known_hosts"],
                     paths["identity_file"], tuple(rc))


def parse(doc: object, source: str) -> Catalog:
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a JSON object", hint='start from {"version": 1, "nodes": {}}')
    for k in doc:
        if k not in TOP_KEYS:
            raise _unknown(k, TOP_KEYS, "at the top level", source)
    if doc.get("version", VERSION) != VERSION:
        raise ConfigError(f"{source}: version {doc.get('version')!r} is not {VERSION}",
                          hint="this bk reads catalog version 1; update bk")
    nodes_doc = doc.get("nodes", {})
    if not isinstance(nodes_doc, dict):
        raise ConfigError(f"{source}: nodes must be an object of name -> node")
    nodes = tuple(parse_node(name, nodes_doc[name], source) for name in sorted(nodes_doc))
    seen: dict[str, str] = {}
    for n in nodes:
        if n.id in seen:
            raise ConfigError(f"{source}: nodes {seen[n.id]!r} and {n.name!r} have the same id {n.id}",
                              hint="two names for one node would book it twice over; remove one")
        seen[n.id] = n.name
    people_doc = doc.get("people", {})
    if not isinstance(people_doc, dict):
        raise ConfigError(f"{source}: people must be an object of node -> {{uid: person}}")
    people = {}
    for node, m in people_doc.items():
        if node not in seen.values():
            raise ConfigError(f"{source}: people names node {node!r}, which is not in nodes")
        if not isinstance(m, dict) or not all(isinstance(u, str) and u.isdigit() and isinstance(p, str) and p
                                              for u, p in m.items()):
            raise ConfigError(f"{source}: people.{node} must map UIDs (as strings) to names")
        people[node] = dict(m)
    hist = doc.get("history_dir")
    if hist is not None and (not isinstance(hist, str) or not os.path.isabs(hist)):
        raise ConfigError(f"{source}: history_dir must be an absolute path, got {hist!r}")
    return Catalog(nodes, people, source, hist, parse_owners(doc.get("history_owners"), source))


def parse_owners(owners: object, source: str) -> tuple | None:
    """``history_owners``: account names or UIDs (None: the default)."""
    if owners is None:
        return None
    if not isinstance(owners, list) or not all(
            (isinstance(o, str) and ACCOUNT_RE.match(o)) or (type(o) is int and 0 <= o < 1 << 32) for o in owners):
        raise ConfigError(f"{source}: history_owners must be a list of account names or UIDs, got {owners!r}",
                          hint='e.g. ["gpubk"]: the accounts that run bk c export on the nodes')
    return tuple(owners)


def catalog_path(env: dict) -> str:
    """``BK_CLUSTER_FILE`` (tests, a second catalog) or the system file.
    Either way the file must pass the trust check: the variable chooses
    which root-owned catalog, not whether one is trusted."""
    return env.get("BK_CLUSTER_FILE") or SYSTEM_CATALOG


def exists(env: dict) -> bool:
    return os.path.lexists(catalog_path(env))


def load(env: dict, *, missing_ok: bool = False) -> Catalog:
    from bk.store.config import check_trusted

    path = catalog_path(env)
    if not os.path.lexists(path):
        if missing_ok:
            return Catalog((), {}, path)
        raise ConfigError(f"there is no cluster catalog ({path})",
                          hint="on a login node: bk c probe NAME HOST, then the sudo command it prints; "
                               "on a GPU server: sudo bk admin cluster init NAME")
    check_trusted(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            raw = f.read(1 << 20)
    except OSError as e:
        raise ConfigError(f"cannot read the cluster catalog {path}: {e.strerror}") from None
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from None
    return parse(doc, path)


def save(catalog: Catalog, path: str) -> None:
    """Write the catalog root-owned 0644 with the store's atomic replace,
    checked (parsed back and trust-checked) before it takes the name."""
    from bk.store.config import check_trusted
    from bk.store.fsutil import Safety, open_dir, replace_file

    directory, name = os.path.split(os.path.abspath(path))
    data = (json.dumps(catalog.to_json(), indent=2, sort_keys=True) + "\n").encode()
    parse(json.loads(data), path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    dirfd = open_dir(directory, Safety(0))
    try:
        replace_file(dirfd, name, directory, data, 0o644, owner=(0, 0))
    finally:
        os.close(dirfd)
    check_trusted(path)
