"""Safe opening, checking and atomic writing of state files.

Facts this module is built on (Linux):

* ``open(O_NOFOLLOW)`` fails with ELOOP when the last path component is a
  symbolic link; it does not look at the components before it.  So every
  managed file is opened relative to a descriptor of its directory
  (``dir_fd``), and that directory itself was opened with ``O_NOFOLLOW``:
  nothing in the path bk manages can be a link, and a directory renamed
  away after the check cannot redirect later opens.
* Opening a FIFO for reading blocks until a writer appears, and opening a
  device node can have side effects (a tape rewinds).  So the name is first
  ``lstat``-ed and refused unless it is a regular file, then opened with
  ``O_NONBLOCK`` and ``fstat``-ed again: the checks apply to what was really
  opened, not to what was at the name a moment earlier.
* A hard link makes one inode reachable from two names; a link to someone
  else's file would have bk read (or append to) that file.  ``st_nlink``
  must not exceed 1 (it is 0 for a file renamed over after it was opened).
* ``os.replace`` (rename(2)) within one directory is atomic: an opener sees
  the old inode or the new one, never a mix or nothing.  It is durable only
  after the directory itself is fsync-ed, and the new file's data only after
  the file is fsync-ed before the rename.  A reader that opened the old file
  keeps reading the old inode until it closes it.
* The kernel applies the umask to the mode given to ``open``/``mkdir``; bk
  sets the mode of files and directories it has just created with
  ``fchmod``/``chmod`` so that shared mode gets 0644 ledgers under any umask.
  It never changes the mode or owner of a file that already existed: a
  wrong one is refused with the command that fixes it.

Every refusal is a ``ConfigError`` (exit 78) that names the path, what is
wrong and the fix; failed I/O is an ``IOFailure`` (exit 74).
"""

from __future__ import annotations

import errno
import os
import stat

from bk.core.errors import ConfigError, IOFailure
from bk.core.record import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:   # annotations only: collections.abc would import collections
    from collections.abc import Callable

O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)

_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"))


def kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "an unknown kind of file"


@dataclass(frozen=True)
class Safety:
    """Who must own the managed paths.  Group- or other-writable paths are
    always refused: anyone who can write them can forge bookings."""

    uid: int

    def refuse(self, path: str, problem: str, hint: str) -> ConfigError:
        return ConfigError(f"refusing to use {path}: {problem}", hint,
                           details={"path": path, "problem": problem})

    def check(self, st: os.stat_result, path: str, want_dir: bool) -> None:
        found = unsafe_stat(st, self.uid, want_dir=want_dir)
        if found is None:
            return
        why, problem = found
        raise self.refuse(path, problem, {
            "kind": "something other than bk put it there; inspect and remove it, then retry",
            "links": f"bk only uses files with a single name; inspect it "
                     f"(find / -samefile {path}) and replace it with a copy",
            "owner": f"if the file is genuine: chown {self.uid} {path}",
            "writable": f"chmod go-w {path}",
        }[why])


def unsafe_stat(st: os.stat_result, owner: int, *, want_dir: bool,
                single_link: bool = True) -> tuple[str, str] | None:
    """The first rule that ``st`` breaks for a path bk trusts, as ``(why,
    problem)``: ``why`` is ``kind`` (a link, FIFO, device, socket or the
    wrong one of file and directory), ``links`` (a file with more than one
    hard link, unless ``single_link`` is False), ``owner`` (not ``owner``'s)
    or ``writable`` (by group or others); ``problem`` says it in words.
    None when it is safe.  The one owner/mode rule: the store, the trusted
    configuration and the broker's directories all ask it, and word the
    refusal for their readers."""
    want = stat.S_ISDIR if want_dir else stat.S_ISREG
    if not want(st.st_mode):
        expected = "a directory" if want_dir else "a regular file"
        return "kind", f"it is {kind(st.st_mode)}, not {expected}"
    # 0 is fine: a reader that opened the ledger just before a writer
    # renamed over it holds the old, now nameless inode (a whole version).
    if single_link and not want_dir and st.st_nlink > 1:
        return "links", f"it has {st.st_nlink} hard links"
    if st.st_uid != owner:
        return "owner", f"it is owned by uid {st.st_uid}, expected uid {owner}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "writable", (f"it is writable by group or others "
                            f"(mode {stat.S_IMODE(st.st_mode):04o})")
    return None


def io_error(e: OSError, doing: str, path: str) -> IOFailure:
    """An OSError as the error users see, with a hint for the usual causes."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return IOFailure(f"no space left while {doing} {path}",
                         f"free space on the file system that holds {os.path.dirname(path)} "
                         f"(df -h {os.path.dirname(path)}); nothing was changed",
                         details={"path": path, "errno": e.errno})
    if e.errno == errno.EROFS:
        # Not a permission problem: no owner or mode change helps.
        mount = mount_point(os.path.dirname(path) or path)
        return IOFailure(f"read-only file system while {doing} {path}",
                         f"{mount} is mounted read-only: remount it read-write "
                         f"(mount -o remount,rw {mount}) or point BK_DATA_DIR at a writable "
                         "directory; nothing was changed",
                         details={"path": path, "errno": e.errno, "mount": mount})
    if e.errno in (errno.EACCES, errno.EPERM):
        return IOFailure(f"permission denied while {doing} {path}: {e.strerror}", permission_hint(path),
                         details={"path": path, "errno": e.errno})
    return IOFailure(f"I/O error while {doing} {path}: {e.strerror or e}",
                     details={"path": path, "errno": e.errno})


def permission_hint(path: str) -> str:
    """What to fix after EACCES on ``path``: the path itself when it exists,
    else the nearest directory above it (where the file was to be made),
    with its owner and mode as they are and who this process is.  The data
    directory is only one of the places bk writes (the state directory's
    presets and job specs are others), so the hint names the real one."""
    where = path
    while not os.path.lexists(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    me = os.geteuid()
    try:
        st = os.lstat(where)
    except OSError:
        return f"check the owner and mode of {where} (ls -ld {where})"
    mode = stat.S_IMODE(st.st_mode)
    what = "directory" if stat.S_ISDIR(st.st_mode) else "file"
    if st.st_uid != me:
        return (f"the {what} {where} belongs to uid {st.st_uid} (mode {mode:04o}), and this process runs "
                f"as uid {me}: run as its owner, or give it to uid {me} (ls -ld {where}; bk doctor checks "
                "the data and state directories)")
    need = "u+rwx" if what == "directory" else "u+rw"
    return (f"the {what} {where} is yours but its mode is {mode:04o}: chmod {need} {where} "
            "(bk doctor checks the data and state directories)")


def mount_point(path: str) -> str:
    """The mount point of the file system holding ``path`` (or its nearest
    existing ancestor): the last directory up the tree on the same device."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and path != "/":
        path = os.path.dirname(path)
    try:
        dev = os.stat(path).st_dev
        while path != "/":
            up = os.path.dirname(path)
            if os.stat(up).st_dev != dev:
                break
            path = up
    except OSError:
        pass
    return path


def _not_a_dir_hint(path: str, st: os.stat_result | None) -> str:
    if st is not None and stat.S_ISLNK(st.st_mode):
        return "bk does not follow links for its data directory; point BK_DATA_DIR at the real directory"
    if st is not None:
        return (f"move it away (mv {path} {path}.old) and retry, or point BK_DATA_DIR "
                "at a directory")
    return (f"a component of {path} is not a directory; point BK_DATA_DIR at a directory "
            "whose parents are directories")


def open_dir(path: str, safety: Safety, *, create_mode: int | None = None) -> int | None:
    """Open and check a directory; ``None`` if it does not exist and
    ``create_mode`` is None.  The caller closes the descriptor."""
    try:
        fd = os.open(path, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
    except FileNotFoundError:
        if create_mode is None:
            return None
        parent = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(parent, exist_ok=True)
            os.mkdir(path, create_mode)
            os.chmod(path, create_mode, follow_symlinks=False)
            # The new directory's name lives in its parent: without this a
            # power loss could take a first, acknowledged commit with it.
            fsync_dir_at(parent)
        except FileExistsError:
            pass
        except OSError as e:
            raise io_error(e, "creating", path) from None
        return open_dir(path, safety)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            st = _lstat(path)
            problem = (f"it is {kind(st.st_mode)}, not a directory" if st
                       else "a component of the path is not a directory")
            raise safety.refuse(path, problem, _not_a_dir_hint(path, st)) from None
        raise io_error(e, "opening", path) from None
    return _checked_dir(fd, path, safety)


def open_subdir(dirfd: int, name: str, path: str, safety: Safety, *,
                create_mode: int | None = None) -> int | None:
    """``open_dir`` for a directory inside an open directory."""
    try:
        fd = os.open(name, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, dir_fd=dirfd)
    except FileNotFoundError:
        if create_mode is None:
            return None
        try:
            os.mkdir(name, create_mode, dir_fd=dirfd)
            os.chmod(name, create_mode, dir_fd=dirfd, follow_symlinks=False)
        except FileExistsError:
            pass
        except OSError as e:
            raise io_error(e, "creating", path) from None
        fsync_dir(dirfd, path)
        return open_subdir(dirfd, name, path, safety)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            st = _lstat(name, dirfd)
            raise safety.refuse(path, f"it is {kind(st.st_mode) if st else 'not a directory'}, "
                                "not a directory", "inspect it and remove it") from None
        raise io_error(e, "opening", path) from None
    return _checked_dir(fd, path, safety)


def unsafe_ancestor(directory: str, owners: tuple[int, ...], *,
                    sticky_ok: bool = True) -> tuple[str, os.stat_result | None, str] | None:
    """The first directory from ``directory`` up to ``/`` that someone
    outside ``owners`` could change, as ``(path, stat, why)`` with ``why`` one
    of ``unreadable``, ``not a directory``, ``owner``, ``writable``; None when
    every one is safe.

    Whoever can change a directory can rename what is in it and put a
    subtree of their own in its place, so everything above a trusted path
    matters, not only its parent.  One exception: a sticky world-writable
    directory (``/tmp``) is safe directly above a directory nobody else can
    write, because the sticky bit stops others from renaming entries they do
    not own.  ``sticky_ok`` says whether ``directory`` itself may be such a
    sticky one (it may not when it holds the trusted file directly)."""
    child_safe = sticky_ok
    while True:
        try:
            st = os.lstat(directory)
        except OSError:
            return directory, None, "unreadable"
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            return directory, st, "not a directory"
        if st.st_uid not in owners:
            return directory, st, "owner"
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable and not (st.st_mode & stat.S_ISVTX and child_safe):
            return directory, st, "writable"
        child_safe = not writable
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def _checked_dir(fd: int, path: str, safety: Safety) -> int:
    """``fd`` if what it opened is a directory bk may use; closed otherwise."""
    try:
        safety.check(os.fstat(fd), path, want_dir=True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lstat(name: str, dirfd: int | None = None) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except OSError:
        return None


def open_file(dirfd: int, name: str, path: str, safety: Safety, flags: int = os.O_RDONLY,
              *, create_mode: int | None = None) -> int | None:
    """Open a managed regular file inside ``dirfd``.

    Returns None when it does not exist and ``create_mode`` is None.  With
    ``create_mode`` a missing file is created (``O_EXCL``, so a name that
    appears meanwhile is opened and checked like any existing file) and
    given exactly that mode.
    """
    st = _lstat(name, dirfd)
    if st is None and create_mode is not None:
        try:
            fd = os.open(name, flags | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                         create_mode, dir_fd=dirfd)
        except FileExistsError:
            return open_file(dirfd, name, path, safety, flags)
        except OSError as e:
            raise io_error(e, "creating", path) from None
        try:
            os.fchmod(fd, create_mode)
        except OSError as e:
            os.close(fd)
            raise io_error(e, "setting the mode of", path) from None
        return fd
    if st is None:
        return None
    if not stat.S_ISREG(st.st_mode):
        safety.check(st, path, want_dir=False)
    try:
        fd = os.open(name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, dir_fd=dirfd)
    except FileNotFoundError:
        return open_file(dirfd, name, path, safety, flags, create_mode=create_mode)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):
            st = _lstat(name, dirfd) or st
            safety.check(st, path, want_dir=False)
        raise io_error(e, "opening", path) from None
    try:
        safety.check(os.fstat(fd), path, want_dir=False)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_all(fd: int) -> bytes:
    """The whole file from offset 0 (``pread``: the offset is not shared)."""
    size = os.fstat(fd).st_size
    parts = []
    off = 0
    while True:
        chunk = os.pread(fd, max(size - off, 0) + 65536, off)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        off += len(chunk)


def read_file(dirfd: int, name: str, path: str, safety: Safety, flags: int = os.O_RDONLY) -> bytes | None:
    """The whole of ``name`` in ``dirfd``, opened with the safety checks of
    ``open_file``; None when it does not exist.  ``path`` names it in errors."""
    fd = open_file(dirfd, name, path, safety, flags)
    if fd is None:
        return None
    try:
        return read_all(fd)
    except OSError as e:
        raise io_error(e, "reading", path) from None
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` may write less than asked (a signal, a full disk that
    fills midway): loop until everything is written or it raises."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def fsync_dir(dirfd: int, path: str) -> None:
    """Make renames, creations and unlinks in a directory durable."""
    try:
        os.fsync(dirfd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EROFS):
            raise io_error(e, "syncing the directory", path) from None


def fsync_dir_at(path: str) -> None:
    """``fsync_dir`` for a directory known by its path."""
    try:
        fd = os.open(path, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    except OSError as e:
        raise io_error(e, "syncing the directory", path) from None
    try:
        fsync_dir(fd, path)
    finally:
        os.close(fd)


def ensure_free(dirfd: int, path: str, need: int, min_free: int) -> None:
    """Refuse before writing rather than fail halfway: ``f_bavail`` is what an
    unprivileged writer may still use (root's reserve excluded)."""
    try:
        vfs = os.fstatvfs(dirfd)
    except OSError:
        return
    free = vfs.f_bavail * vfs.f_frsize
    if free < need + min_free:
        raise IOFailure(
            f"not enough free space in {path}: {free} bytes free, a commit needs "
            f"{need} plus a reserve of {min_free}",
            f"free space on that file system (df -h {path}); nothing was changed",
            details={"path": path, "free": free, "need": need, "reserve": min_free})


def make_dirs(path: str, mode: int) -> str | None:
    """Create ``path`` and every missing directory above it, each ``mode``
    (``os.makedirs(mode=)`` gives the mode only to the last one, and the umask
    would weaken it); the topmost directory made (for a cleanup), or None.
    Something already in the way (a file, a link) is left for the caller's
    own check of the path to name."""
    missing = []
    d = path
    while d and not os.path.lexists(d):
        missing.append(d)
        up = os.path.dirname(d)
        if up == d:
            break
        d = up
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
            os.chmod(d, mode, follow_symlinks=False)
        except FileExistsError:
            pass
        except OSError as e:
            raise io_error(e, "creating", d) from None
    return missing[-1] if missing else None


def unlink_quietly(dirfd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dirfd)
    except OSError:
        pass


def write_new(dirfd: int, name: str, path: str, data: bytes, mode: int) -> None:
    """Write a file that must not exist yet (a temp name).  On failure it is
    removed again, so no partial file is left behind by a clean error."""
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                     mode, dir_fd=dirfd)
    except OSError as e:
        raise io_error(e, "creating", path) from None
    try:
        os.fchmod(fd, mode)
        write_all(fd, data)
    except OSError as e:
        os.close(fd)
        unlink_quietly(dirfd, name)
        raise io_error(e, "writing", path) from None
    os.close(fd)


def _no_step(step: str) -> None:
    pass


def replace_file(dirfd: int, name: str, dirpath: str, data: bytes, mode: int, *,
                 sync: bool = True, overwrite: bool = True, tmp: str | None = None,
                 owner: tuple[int, int] | None = None,
                 check: Callable[[str], None] | None = None,
                 write: Callable[[int, bytes], None] = write_all,
                 step: Callable[[str], None] = _no_step) -> None:
    """Give ``name`` in ``dirfd`` the content ``data`` and exactly ``mode``,
    atomically: every state files writer in bk goes through here.

    The steps: create a temp file next to it (``O_EXCL | O_NOFOLLOW``,
    relative to ``dirfd``: ``rename(2)`` is atomic only within one file
    system, and nothing in the path may be a link), ``fchmod`` it (the
    umask does not decide), write it, ``fsync`` it, rename it over ``name``,
    ``fsync`` the directory.  An opener sees the old file or the new one;
    after a crash the old one survives unless the rename reached the disk.
    On any failure before the rename the temp file is removed; an
    ``OSError`` (``ENOSPC`` included) becomes ``IOFailure`` (exit 74) and
    leaves ``name`` as it was.

    ``sync=False`` skips both fsyncs, for copies validated when read
    (backups): a copy torn by a power loss only costs falling back one
    further.  ``overwrite=False`` publishes with ``link(2)`` instead, which
    fails (``FileExistsError``, raised as is) rather than replace a file
    that appeared meanwhile.  ``owner`` is given with ``fchown``; ``check``
    is called with the temp file's path once it is complete, before it
    takes the name (raising abandons the write).  ``tmp`` names the temp
    file (default ``.NAME.tmp-PID-RANDOM``, which ``keep_newest`` and the
    ledger recognise as a dead writer's leftover).  ``write`` and ``step``
    are the ledger's crash-test seams: ``step`` is called after each of
    ``tmp_written``, ``tmp_synced``, ``replaced`` and ``dir_synced``."""
    path = os.path.join(dirpath, name)
    tmp = tmp or f".{name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                     mode, dir_fd=dirfd)
    except OSError as e:
        raise io_error(e, "creating a temporary file in", dirpath) from None
    published = False
    try:
        try:
            if owner is not None:
                os.fchown(fd, *owner)
            os.fchmod(fd, mode)          # after fchown, which may clear set-id bits
            write(fd, data)
            step("tmp_written")
            if sync:
                os.fsync(fd)
                step("tmp_synced")
        finally:
            os.close(fd)
        if check is not None:
            check(os.path.join(dirpath, tmp))
        if overwrite:
            os.replace(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
        else:
            os.link(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd, follow_symlinks=False)
        published = True
    except OSError as e:
        if isinstance(e, FileExistsError) and not overwrite:
            raise
        raise io_error(e, "writing", path) from None
    finally:
        if not published or not overwrite:
            unlink_quietly(dirfd, tmp)
    step("replaced")
    if sync:
        # Until the directory is synced the rename itself may not survive a
        # power loss: the caller hears of a failure (IOFailure) and may retry.
        fsync_dir(dirfd, dirpath)
        step("dir_synced")


def keep_newest(dirfd: int, pattern, keep: int) -> list[str]:
    """Delete all but the ``keep`` greatest names matching ``pattern``
    (names that sort by age), and the temp files of ``replace_file`` (the
    caller holds the lock that every writer of this directory takes, so a
    temp file here belongs to a writer that died); returns what it deleted."""
    listed = os.listdir(dirfd)
    names = sorted((n for n in listed if pattern.match(n)), reverse=True)
    gone = names[keep:] + [n for n in listed if n.startswith(".") and ".tmp-" in n]
    for name in gone:
        unlink_quietly(dirfd, name)
    return gone


class NamePattern:
    """The names of numbered files (``ledger-0000000042.json``,
    ``audit-FIRST-LAST.jsonl``, ``2026-07.jsonl``): literal parts and runs of
    exactly so many decimal digits, ``NamePattern("ledger-", 10, ".json")``.
    ``match(name)`` takes what ``re.match(r"^ledger-(\\d{10})\\.json$", name)``
    takes (``\\d`` any Unicode decimal digit, ``$`` also before a final
    newline) and returns the digit runs (``.group(1)`` is the first), or
    None.  A directory listing is matched on every commit: ``re`` and its
    compiler would cost a command more than the commit's own work."""

    __slots__ = ("parts",)

    def __init__(self, *parts: str | int):
        self.parts = parts

    def match(self, name: str):
        if name[-1:] == "\n":
            name = name[:-1]
        i, groups = 0, []
        for part in self.parts:
            if isinstance(part, str):
                if not name.startswith(part, i):
                    return None
                i += len(part)
            else:
                digits = name[i:i + part]
                if len(digits) != part or not digits.isdecimal():
                    return None
                groups.append(digits)
                i += part
        return Named(groups) if i == len(name) else None


class Named(tuple):
    """The digit runs of a matched name, read as a match's groups."""

    __slots__ = ()

    def group(self, n: int) -> str:
        return self[n - 1]
