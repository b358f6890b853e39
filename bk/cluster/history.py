"""Usage history across nodes: each node exports its sealed days to shared
storage, in its own namespace; ``bk c history`` reads them all.

Layout under the shared directory (an NFS mount, say)::

    <dir>/<node id>/node.json                 who exported: id, host name, bk version, when
    <dir>/<node id>/usage/raw/2026-12-01.jsonl
    <dir>/<node id>/usage/raw/2026-12-01.seal
    <dir>/<node id>/usage/hourly/...          the same layout as the node's own history

The facts and the decisions:

* Only sealed days are exported (a day is sealed once it has ended and the
  monitor's grace has passed; ``bk.store.usage``), and only after the copy's
  bytes hash to the seal's SHA-256: a day that does not verify at the source
  is reported and left out, so tampering on a node never spreads.
* Incremental: a day whose exported seal equals the node's is skipped; a
  day whose seal changed (late records rewrote it, or it was rolled up into
  hours) is copied again.  The records are written first and the seal last,
  each with the atomic replace: a reader that sees a seal sees its records
  (the history reader, like ``bk u``, trusts only sealed days).
* One namespace per node id, never per host name: two nodes on one host, or
  a renamed host, stay apart, and the catalog maps ids to names.
* Reading uses the node's own store code on the exported tree
  (``UsageStore``), so totals mean exactly what ``bk u users`` says on the
  node; UIDs become people through the catalog's ``people`` table.
"""

from __future__ import annotations

import hashlib
import json
import os

from bk.core.errors import ConfigError, InvalidInput
from bk.core.record import dataclass

KINDS = ("raw", "hourly")


@dataclass(frozen=True)
class Exported:
    node_id: str
    dest: str
    copied: tuple
    unchanged: int
    refused: tuple          # (kind/day, why): not exported

    def to_json(self) -> dict:
        return {"node_id": self.node_id, "dest": self.dest, "copied": list(self.copied),
                "unchanged": self.unchanged, "refused": [{"day": d, "why": w} for d, w in self.refused]}


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _seal_ok(data: bytes, seal_raw: bytes) -> str | None:
    """None when ``data`` is what the seal says; else why not."""
    try:
        seal = json.loads(seal_raw)
    except ValueError:
        return "its seal is not JSON"
    if not isinstance(seal, dict) or seal.get("bytes") != len(data) or \
            seal.get("sha256") != hashlib.sha256(data).hexdigest():
        return "its records do not match its seal (bk u verify on the node)"
    return None


def export(usage_dir: str, dest: str, *, node: dict, now_iso: str) -> Exported:
    """Copy the sealed, verified days of ``usage_dir`` to ``dest/<id>/usage``."""
    from bk.store.fsutil import Safety, open_dir, replace_file

    if not os.path.isdir(dest):
        raise InvalidInput(f"the export directory {dest} does not exist",
                           hint="mount the shared storage, or create the directory")
    nid = node["id"]
    top = os.path.join(dest, nid)
    safety = Safety(os.geteuid())
    copied, refused, unchanged = [], [], 0
    for kind in KINDS:
        src = os.path.join(usage_dir, kind)
        try:
            names = sorted(os.listdir(src))
        except FileNotFoundError:
            continue
        days = [n[:-5] for n in names if n.endswith(".seal") and f"{n[:-5]}.jsonl" in names]
        out_dir = os.path.join(top, "usage", kind)
        for day in days:
            seal = _read(os.path.join(src, f"{day}.seal"))
            data = _read(os.path.join(src, f"{day}.jsonl"))
            if seal is None or data is None:
                continue                                 # rolled up or pruned meanwhile
            why = _seal_ok(data, seal)
            if why is not None:
                refused.append((f"{kind}/{day}", why))
                continue
            if _read(os.path.join(out_dir, f"{day}.seal")) == seal:
                unchanged += 1
                continue
            os.makedirs(out_dir, mode=0o755, exist_ok=True)
            fd = open_dir(out_dir, safety)
            try:
                replace_file(fd, f"{day}.jsonl", out_dir, data, 0o644)
                replace_file(fd, f"{day}.seal", out_dir, seal, 0o644)     # last: the day is complete
            finally:
                os.close(fd)
            copied.append(f"{kind}/{day}")
    os.makedirs(top, mode=0o755, exist_ok=True)
    fd = open_dir(top, safety)
    try:
        doc = {**{k: node.get(k) for k in ("id", "hostname", "version")}, "exported_at": now_iso}
        replace_file(fd, "node.json", top, (json.dumps(doc, sort_keys=True) + "\n").encode(), 0o644)
    finally:
        os.close(fd)
    return Exported(nid, top, tuple(copied), unchanged, tuple(refused))


def export_node(settings, dest: str, *, node: dict, now_iso: str) -> Exported:
    """``export`` of this node's own history (``<data_dir>/usage``)."""
    from bk.store.usage import usage_dir

    return export(usage_dir(settings), dest, node=node, now_iso=now_iso)


@dataclass(frozen=True)
class History:
    dir: str
    since: int
    until: int
    nodes: tuple        # dicts
    users: tuple        # dicts: node, uid, person, booked_s, active_s, unreserved_s

    def to_json(self) -> dict:
        from bk.core.utctime import format_utc

        people: dict[str, dict] = {}
        for u in self.users:
            if u["person"] is None:
                continue
            p = people.setdefault(u["person"], {"person": u["person"], "booked_s": 0, "active_s": 0,
                                                "unreserved_s": 0, "nodes": []})
            for k in ("booked_s", "active_s", "unreserved_s"):
                p[k] += u[k]
            if u["node"] not in p["nodes"]:
                p["nodes"].append(u["node"])
        return {"dir": self.dir, "since": format_utc(self.since), "until": format_utc(self.until),
                "nodes": list(self.nodes), "users": list(self.users),
                "people": sorted(people.values(), key=lambda p: -p["booked_s"])}


def read(dest: str, catalog, since: int, until: int) -> History:
    """Every exported node's totals over [since, until), per UID."""
    from bk.cluster.catalog import NODE_ID_RE
    from bk.store.usage import UsageStore

    try:
        entries = sorted(os.listdir(dest))
    except FileNotFoundError:
        raise ConfigError(f"the history directory {dest} does not exist",
                          hint="export to it on each node: bk c export DIR") from None
    names = {n.id: n.name for n in catalog.nodes}
    nodes, users = [], []
    for nid in entries:
        top = os.path.join(dest, nid)
        if not NODE_ID_RE.match(nid) or not os.path.isdir(top):
            continue
        try:
            meta = json.loads(_read(os.path.join(top, "node.json")) or b"{}")
        except ValueError:
            meta = {}
        name = names.get(nid)
        store = UsageStore(os.path.join(top, "usage"), private=False, owner_uid=os.stat(top).st_uid)
        try:
            summary = store.summary(since, until)
            bad = [c.to_json() for c in store.verify() if c.state not in ("ok", "unsealed")]
        except ConfigError as e:            # a namespace someone else could change: not trusted
            nodes.append({"id": nid, "name": name, "hostname": meta.get("hostname"),
                          "exported_at": meta.get("exported_at"), "problems": [e.message]})
            continue
        nodes.append({"id": nid, "name": name, "hostname": meta.get("hostname"),
                      "exported_at": meta.get("exported_at"), "problems": bad + list(store.problems)})
        label = name or nid
        for uid, t in sorted(summary.by_uid.items()):
            users.append({"node": label, "uid": uid, "person": catalog.person(name, uid) if name else None,
                          "booked_s": t.booked_s, "active_s": t.active_s, "unreserved_s": t.unreserved_s})
    return History(dest, since, until, tuple(nodes), tuple(users))
