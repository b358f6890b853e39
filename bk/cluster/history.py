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


def _open_dest(dest: str) -> int:
    """A descriptor of the export directory.  Its path is the caller's
    choice (a mount point may be reached through a link root made), but a
    symbolic link on the way that someone else owns is refused: whoever
    owns a link decides where it points, so they could send this account's
    writes into a directory of their choosing (its own data directory)."""
    import stat

    from bk.store.fsutil import O_CLOEXEC, O_DIRECTORY

    path = os.path.abspath(dest)
    me = os.geteuid()
    cur = "/"
    for part in [p for p in path.split("/") if p]:
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            raise InvalidInput(f"the export directory {dest} does not exist",
                               hint="mount the shared storage, or create the directory") from None
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, me):
            raise ConfigError(f"refusing to export through {cur}: it is a symbolic link owned by uid {st.st_uid}",
                              hint="name the real directory, or have root own the link")
    try:
        return os.open(path, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    except NotADirectoryError:
        raise InvalidInput(f"the export directory {dest} is not a directory") from None
    except OSError as e:
        from bk.store.fsutil import io_error

        raise io_error(e, "opening", dest) from None


def export(usage_dir: str, dest: str, *, node: dict, now_iso: str) -> Exported:
    """Copy the sealed, verified days of ``usage_dir`` to ``dest/<id>/usage``.

    Everything below ``dest`` is reached through directory descriptors,
    each component opened with ``O_NOFOLLOW`` and checked (``Safety``: a
    directory of this account, writable by nobody else), so a link or a
    directory someone else planted at ``<id>``, ``usage`` or ``raw`` is
    refused, never followed: the namespace is this account's or nothing
    is written."""
    from bk.cluster.catalog import NODE_ID_RE
    from bk.store.fsutil import Safety, open_subdir, read_file, replace_file

    nid = node["id"]
    if not isinstance(nid, str) or not NODE_ID_RE.match(nid):
        raise InvalidInput(f"{nid!r} is not a node id")
    top = os.path.join(dest, nid)
    safety = Safety(os.geteuid())
    copied, refused, unchanged = [], [], 0
    fds: list[int] = []

    def sub(parent: int, name: str, path: str) -> int:
        fd = open_subdir(parent, name, path, safety, create_mode=0o755)
        fds.append(fd)
        return fd

    try:
        dest_fd = _open_dest(dest)
        fds.append(dest_fd)
        top_fd = sub(dest_fd, nid, top)
        usage_fd = None
        for kind in KINDS:
            src = os.path.join(usage_dir, kind)
            try:
                names = sorted(os.listdir(src))
            except FileNotFoundError:
                continue
            days = [n[:-5] for n in names if n.endswith(".seal") and f"{n[:-5]}.jsonl" in names]
            out_dir = os.path.join(top, "usage", kind)
            kind_fd = None
            for day in days:
                seal = _read(os.path.join(src, f"{day}.seal"))
                data = _read(os.path.join(src, f"{day}.jsonl"))
                if seal is None or data is None:
                    continue                                 # rolled up or pruned meanwhile
                why = _seal_ok(data, seal)
                if why is not None:
                    refused.append((f"{kind}/{day}", why))
                    continue
                if kind_fd is None:
                    usage_fd = usage_fd if usage_fd is not None else sub(top_fd, "usage", os.path.join(top, "usage"))
                    kind_fd = sub(usage_fd, kind, out_dir)
                if read_file(kind_fd, f"{day}.seal", os.path.join(out_dir, f"{day}.seal"), safety) == seal:
                    unchanged += 1
                    continue
                replace_file(kind_fd, f"{day}.jsonl", out_dir, data, 0o644)
                replace_file(kind_fd, f"{day}.seal", out_dir, seal, 0o644)     # last: the day is complete
                copied.append(f"{kind}/{day}")
        doc = {**{k: node.get(k) for k in ("id", "hostname", "version")}, "exported_at": now_iso}
        replace_file(top_fd, "node.json", top, (json.dumps(doc, sort_keys=True) + "\n").encode(), 0o644)
    finally:
        for fd in fds:
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
    """Every exported node's totals over [since, until), per UID.

    A namespace is believed only when it is a real directory (not a link)
    owned by root, by the reader, or by an account the catalog names in
    ``history_owners`` (default ``gpubk``), and writable by nobody else;
    every file and directory below it must have that same owner (the
    store's ``Safety``), and its ``node.json`` must name the id it is filed
    under.  Anything else is reported in that node's ``problems``, never
    counted: anyone who can write the shared directory could otherwise
    file a forged history under any node's id."""
    from bk.cluster.catalog import NODE_ID_RE

    try:
        entries = sorted(os.listdir(dest))
    except FileNotFoundError:
        raise ConfigError(f"the history directory {dest} does not exist",
                          hint="export to it on each node: bk c export DIR") from None
    names = {n.id: n.name for n in catalog.nodes}
    trusted = catalog.history_owner_uids()
    trusted.setdefault(os.geteuid(), "you")
    nodes, users = [], []
    for nid in entries:
        if NODE_ID_RE.match(nid):
            got = _namespace(dest, nid, names.get(nid), trusted, catalog, since, until)
            if got is not None:
                nodes.append(got[0])
                users += got[1]
    return History(dest, since, until, tuple(nodes), tuple(users))


def _namespace(dest: str, nid: str, name: str | None, trusted: dict, catalog, since: int, until: int):
    """``(node row, user rows)`` of one namespace (``read``'s rules), or
    None when ``nid`` is not a directory there."""
    import stat

    from bk.store.fsutil import Safety, open_dir, read_file
    from bk.store.usage import UsageStore

    top = os.path.join(dest, nid)

    def distrust(problem: str, meta: dict | None = None):
        return ({"id": nid, "name": name, "hostname": (meta or {}).get("hostname"),
                 "exported_at": (meta or {}).get("exported_at"), "problems": [problem]}, [])

    try:
        st = os.lstat(top)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return distrust(f"{top} is a symbolic link, not an exported namespace: not counted")
    if not stat.S_ISDIR(st.st_mode):
        return None
    if st.st_uid not in trusted:
        return distrust(f"{top} is owned by uid {st.st_uid}, not by an account that exports history "
                        f"({', '.join(sorted(set(trusted.values())))}): not counted "
                        "(the catalog's history_owners names them)")
    safety = Safety(st.st_uid)
    try:
        fd = open_dir(top, safety)          # O_NOFOLLOW, and fstat checked again: owner and mode
    except ConfigError as e:
        return distrust(e.message)
    via = f"/proc/self/fd/{fd}"
    try:
        try:
            meta = json.loads(read_file(fd, "node.json", os.path.join(top, "node.json"), safety) or b"{}")
        except ValueError:
            meta = {}
        except ConfigError as e:
            return distrust(e.message)
        meta = meta if isinstance(meta, dict) else {}
        if meta.get("id", nid) != nid:
            return distrust(f"{top} holds the export of {meta.get('id')!r}, not of {nid}: not counted", meta)
        # Read below the descriptor (what was checked), not the name, which
        # whoever can write the shared directory could swap meanwhile.
        store = UsageStore(os.path.join(via if os.path.isdir(via) else top, "usage"), private=False,
                           owner_uid=st.st_uid)
        try:
            summary = store.summary(since, until)
            bad = [c.to_json() for c in store.verify() if c.state not in ("ok", "unsealed")]
        except ConfigError as e:            # a file below it someone else could change: not trusted
            return distrust(_renamed(e.message, via, top), meta)
    finally:
        os.close(fd)
    row = {"id": nid, "name": name, "hostname": meta.get("hostname"), "exported_at": meta.get("exported_at"),
           "problems": [_renamed(p, via, top) for p in bad + list(store.problems)]}
    label = name or nid
    users = [{"node": label, "uid": uid, "person": catalog.person(name, uid) if name else None,
              "booked_s": t.booked_s, "active_s": t.active_s, "unreserved_s": t.unreserved_s}
             for uid, t in sorted(summary.by_uid.items())]
    return row, users


def _renamed(problem, via: str, top: str):
    """A problem as the store words it, with the descriptor's path named as the user knows it."""
    if isinstance(problem, str):
        return problem.replace(via, top)
    if isinstance(problem, dict):
        return {k: _renamed(v, via, top) for k, v in problem.items()}
    return problem
