"""What makes a node this node: its id, from its data directory.

A node is a ``bk`` host: one trusted configuration and one data directory
(one ledger).  The host name alone does not identify it (two sshd on one
machine, a container, a renamed host), nor does ``/etc/machine-id`` (cloned
images share it).  So the id is:

* the one stored in ``<data_dir>/cluster-node-id`` (``n-`` and 24 random hex
  digits), written once by ``sudo bk admin cluster init``: it survives a
  rename of the host and a move of the configuration; or, when there is none,
* one derived from the host name, the real path of the data directory and
  the configuration file (``d-`` and 24 hex digits of their SHA-256): stable
  for as long as those are, and different for two data directories on one
  machine, which is what makes two loopback sshd with their own
  ``BK_DATA_DIR`` two nodes.

The client checks the id of every reply against the catalog's, and the node
refuses a command addressed to another id before it runs it
(``bk c node --expect ID``), so a write can never land on the wrong ledger
because DNS, a port or a data directory moved.
"""

from __future__ import annotations

import os
import socket

NODE_ID_FILE = "cluster-node-id"


def derived_id(hostname: str, data_dir: str, config_file: str | None) -> str:
    import hashlib

    text = "\0".join((hostname, os.path.realpath(data_dir), config_file or ""))
    return "d-" + hashlib.sha256(text.encode()).hexdigest()[:24]


def read_stored(data_dir: str) -> str | None:
    """The stored id, or None when there is none (or it is not one)."""
    from bk.cluster.catalog import NODE_ID_RE

    try:
        fd = os.open(os.path.join(data_dir, NODE_ID_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        text = f.read(200).decode("ascii", "replace").strip()
    return text if NODE_ID_RE.match(text) and text.startswith("n-") else None


def node_id(settings) -> tuple[str, str]:
    """``(id, source)``: source ``stored`` or ``derived``."""
    stored = read_stored(settings.data_dir)
    if stored:
        return stored, "stored"
    return derived_id(socket.gethostname(), settings.data_dir, settings.locations.config_file
                      if settings.locations.config_is_system else None), "derived"


def store_new(data_dir: str, owner: tuple[int, int] | None) -> str:
    """Write a fresh random id into ``data_dir`` unless one is there; return the id."""
    from bk.store.fsutil import Safety, open_dir, replace_file

    existing = read_stored(data_dir)
    if existing:
        return existing
    new = "n-" + os.urandom(12).hex()
    uid = os.stat(data_dir).st_uid
    dirfd = open_dir(data_dir, Safety(uid))
    try:
        try:
            replace_file(dirfd, NODE_ID_FILE, data_dir, (new + "\n").encode(), 0o644, owner=owner,
                         overwrite=False)
        except FileExistsError:
            pass
    finally:
        os.close(dirfd)
    return read_stored(data_dir) or new
