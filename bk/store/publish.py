"""Files bk publishes for other programs: the Prometheus textfile, calendar
feeds, the page of the week.

The facts:

* Their readers take no lock and must never see half a file: node_exporter
  skips a textfile it cannot parse (the whole file, for that scrape), a
  calendar client drops a broken feed, a web server serves what is there.
  So each is written with the store's one atomic replace
  (``fsutil.replace_file``: a temp file in the same directory, written and
  fsync-ed, renamed over the name): a reader, or a writer killed at any
  moment, leaves the old file or the new one, never a mix.  A killed
  writer's temp file (``.NAME.tmp-PID-RANDOM``) is not a ``*.prom`` file,
  so node_exporter ignores it; the next write clears such leftovers.
* The directory is the administrator's choice, so it gets the store's
  owner and mode rule (``Safety``): a real directory, owned by the account
  that writes (the monitor's, or yours for ``bk export html DIR``), not
  writable by group or others; one that is missing is made (0755).
* A per-user calendar feed is readable by its user only (unless the
  administrator publishes them).  The monitor is not root and cannot give a
  file to a user, but the owner of a file may set its POSIX ACL (as it may
  chmod it), so the feed is 0600 plus one ACL entry ``user:UID:r--`` (the
  ``system.posix_acl_access`` extended attribute, set on the temp file
  before it takes the name).  Where the file system has no ACLs the feed is
  not written (``IOFailure``), rather than written readable by nobody or by
  everyone.
"""

from __future__ import annotations

import errno
import os
import struct

from bk.core.errors import IOFailure
from bk.store.fsutil import Safety, open_dir, replace_file, unlink_quietly

DIR_MODE = 0o755

# linux/posix_acl_xattr.h: a little-endian version word, then (tag, perm,
# id) entries sorted by tag and id.
_ACL_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_UNDEFINED = 0xFFFFFFFF
_R, _W = 4, 2


def acl_reader(uid: int) -> bytes:
    """The access ACL of a file its owner may read and write, ``uid`` read,
    and nobody else anything."""
    entries = [(_USER_OBJ, _R | _W, _UNDEFINED), (_USER, _R, uid), (_GROUP_OBJ, 0, _UNDEFINED),
               (_MASK, _R, _UNDEFINED), (_OTHER, 0, _UNDEFINED)]
    return struct.pack("<I", _ACL_VERSION) + b"".join(struct.pack("<HHI", *e) for e in entries)


def readers_of(path: str) -> list[int]:
    """The named users of ``path``'s access ACL ([] without one): for tests
    and ``bk doctor``."""
    try:
        blob = os.getxattr(path, "system.posix_acl_access", follow_symlinks=False)
    except OSError:
        return []
    out = []
    for off in range(4, len(blob) - 7, 8):
        tag, _perm, ident = struct.unpack_from("<HHI", blob, off)
        if tag == _USER:
            out.append(ident)
    return out


def publish(directory: str, name: str, data: bytes, *, owner: int | None = None, mode: int = 0o644,
            reader: int | None = None, sync: bool = True) -> None:
    """Replace ``directory/name`` with ``data``, atomically, with ``mode``;
    ``reader``: mode 0600 plus read for that uid alone (module docstring).
    ``owner``: who must own the directory (default: this process).
    Raises ``ConfigError`` (the directory breaks the owner and mode rule)
    or ``IOFailure``."""
    safety = Safety(os.geteuid() if owner is None else owner)
    dirfd = open_dir(directory, safety, create_mode=DIR_MODE)
    try:
        check = None
        if reader is not None:
            mode = 0o600
            blob = acl_reader(reader)

            def check(tmp_path: str) -> None:
                try:
                    os.setxattr(tmp_path, "system.posix_acl_access", blob, follow_symlinks=False)
                except OSError as e:
                    why = ("the file system has no POSIX ACLs" if e.errno in (errno.EOPNOTSUPP, errno.ENOTSUP)
                           else e.strerror)
                    raise IOFailure(f"cannot make {os.path.join(directory, name)} readable by uid {reader} "
                                    f"alone: {why}",
                                    hint="keep the calendar directory on a file system with ACLs (ext4, XFS, "
                                         "btrfs), or publish the per-user feeds (calendar_publish_users)",
                                    details={"path": os.path.join(directory, name), "errno": e.errno}) from None
        replace_file(dirfd, name, directory, data, mode, sync=sync, check=check)
    finally:
        os.close(dirfd)


def remove(directory: str, name: str, *, owner: int | None = None) -> bool:
    """Delete ``directory/name`` (a file bk published); False when it was
    not there."""
    safety = Safety(os.geteuid() if owner is None else owner)
    dirfd = open_dir(directory, safety)
    if dirfd is None:
        return False
    try:
        os.unlink(name, dir_fd=dirfd)
        return True
    except FileNotFoundError:
        return False
    except OSError as e:
        raise IOFailure(f"cannot remove {os.path.join(directory, name)}: {e.strerror}") from None
    finally:
        os.close(dirfd)


def listing(directory: str, *, owner: int | None = None) -> list[str]:
    """The names in a publishing directory ([] when it is missing)."""
    safety = Safety(os.geteuid() if owner is None else owner)
    dirfd = open_dir(directory, safety)
    if dirfd is None:
        return []
    try:
        return sorted(os.listdir(dirfd))
    finally:
        os.close(dirfd)


def clear_leftovers(directory: str, names, *, owner: int | None = None) -> list[str]:
    """Remove the temp files a writer of ``names`` left when it died (the
    caller is the one writer of those names; other programs' files in a
    shared directory, such as node_exporter's, are left alone)."""
    safety = Safety(os.geteuid() if owner is None else owner)
    dirfd = open_dir(directory, safety)
    if dirfd is None:
        return []
    prefixes = tuple(f".{n}.tmp-" for n in names)
    gone = []
    try:
        for n in os.listdir(dirfd):
            if n.startswith(prefixes):
                unlink_quietly(dirfd, n)
                gone.append(n)
        return gone
    finally:
        os.close(dirfd)
