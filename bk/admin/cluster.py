"""``sudo bk admin cluster ...``: the catalog's changes, planned then applied.

Each action is a pure function from the current catalog to the new one
(``plan``), so ``--dry-run`` shows exactly the document ``apply`` would
write; ``apply`` writes it root-owned 0644 with the store's atomic replace
(``bk.cluster.catalog.save``: a reader sees the old catalog or the new one,
never half of one).  Only root may apply: the catalog decides where every
user's bookings go.

``init NAME`` on a GPU server also gives the server its stored node id (in
its data directory, owned by the service account), and enters it into the
catalog as the ``local`` node NAME, so the server's own users can book on
it and the others with the same ``bk c`` commands.
"""

from __future__ import annotations

import os

from bk.cluster import catalog as cat
from bk.core.errors import ConfigError, InvalidInput, NotFound, PermissionDenied
from bk.core.record import replace


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise PermissionDenied(f"only root may {what}", hint="run it with sudo")


def load(env: dict) -> cat.Catalog:
    return cat.load(env, missing_ok=True)


def add(c: cat.Catalog, entry: cat.NodeEntry) -> cat.Catalog:
    if any(n.name == entry.name for n in c.nodes):
        raise InvalidInput(f"the catalog already has a node {entry.name!r}",
                           hint=f"change it with: sudo bk admin cluster set {entry.name} ...")
    other = next((n for n in c.nodes if n.id == entry.id), None)
    if other is not None:
        raise InvalidInput(f"node id {entry.id} is already in the catalog as {other.name!r}",
                           hint="one node, one name: two names would let one booking be made twice")
    return c.with_node(entry)


def set_fields(c: cat.Catalog, name: str, **changes) -> cat.Catalog:
    entry = c.get(name)
    changes = {k: v for k, v in changes.items() if v is not None}
    if not changes:
        raise InvalidInput("nothing to change", hint="e.g. sudo bk admin cluster set gpu-a --priority 1")
    if "target" in changes:
        cat.check_target(changes["target"])
    new = replace(entry, **changes)
    cat.parse_node(name, new.to_json(), "the new entry")        # the same rules as a loaded catalog
    if "id" in changes and any(n.id == new.id and n.name != name for n in c.nodes):
        raise InvalidInput(f"node id {new.id} is already in the catalog")
    return c.with_node(new)


def remove(c: cat.Catalog, name: str) -> cat.Catalog:
    return c.without(name)


def enable(c: cat.Catalog, name: str, on: bool) -> cat.Catalog:
    return c.with_node(replace(c.get(name), enabled=on))


def map_person(c: cat.Catalog, node: str, uid: int, person: str) -> cat.Catalog:
    c.get(node)
    if not person.strip():
        raise InvalidInput("the person's name is empty")
    people = {k: dict(v) for k, v in c.people.items()}
    people.setdefault(node, {})[str(uid)] = person
    return replace(c, people=people)


def unmap(c: cat.Catalog, node: str, uid: int) -> cat.Catalog:
    c.get(node)
    people = {k: dict(v) for k, v in c.people.items()}
    if str(uid) not in people.get(node, {}):
        raise NotFound(f"UID {uid} on {node} is not mapped")
    del people[node][str(uid)]
    return replace(c, people={k: v for k, v in people.items() if v})


def history_dir(c: cat.Catalog, path: str) -> cat.Catalog:
    if not os.path.isabs(path):
        raise InvalidInput(f"the history directory must be an absolute path, got {path!r}")
    return replace(c, history_dir=os.path.normpath(path))


def history_owners(c: cat.Catalog, owners: list[str]) -> cat.Catalog:
    """The accounts whose exports ``bk c history`` trusts (names or UIDs)."""
    parsed = [int(o) if o.isdigit() else o for o in owners]
    for o in parsed:
        if isinstance(o, str) and not cat.ACCOUNT_RE.match(o):
            raise InvalidInput(f"--history-owner {o!r} is not an account name or UID", hint="e.g. --history-owner gpubk")
    return replace(c, history_owners=cat.parse_owners(parsed, "--history-owner"))


def local_node_id(settings) -> str:
    """This server's stored node id, created in its data directory (owned
    by the service account, readable by all) when it has none."""
    from bk.cluster.identity import store_new

    data_dir = settings.data_dir
    if not os.path.isdir(data_dir):
        raise ConfigError(f"the data directory {data_dir} does not exist",
                          hint="set the server up first: sudo bk admin init")
    st = os.stat(data_dir)
    return store_new(data_dir, owner=(st.st_uid, st.st_gid))


def apply(c: cat.Catalog, path: str) -> None:
    require_root("change the cluster catalog")
    cat.save(c, path)
