"""The ``bpf(2)`` system call through ``ctypes``: load, attach, replace,
query and detach cgroup device programs.  No libbpf, no bcc.

How the kernel behaves, where it decides the design:

* ``bpf(cmd, attr, size)`` takes a ``union bpf_attr``; fields the caller
  does not know must be zero, and a size larger than the kernel's is fine
  when the tail is zero.  So every command here packs its few fields into
  a zeroed 128-byte buffer.  The call number is 321 on x86_64 and 280 on
  arm64; elsewhere enforcement is unsupported.
* ``BPF_PROG_LOAD`` of a ``BPF_PROG_TYPE_CGROUP_DEVICE`` program needs
  ``CAP_BPF`` and ``CAP_NET_ADMIN`` (or ``CAP_SYS_ADMIN``); a refusal by
  the verifier is ``EACCES``/``EINVAL`` with its reasons in the log buffer,
  which the error carries.  Turning an id into a descriptor
  (``BPF_PROG_GET_FD_BY_ID``, needed to name and detach programs this
  process did not load) needs ``CAP_SYS_ADMIN``.
* Two ways to attach, two lifetimes.  ``BPF_PROG_ATTACH`` stays attached
  until someone detaches it or the cgroup goes, whatever happens to the
  process that attached it.  ``BPF_LINK_CREATE`` makes a *link*: when the
  last descriptor of the link closes (the enforcer exits, crashes, is
  killed), the kernel detaches the program.  The enforcer uses links to
  fail open and plain attachments to fail closed.
* Replacement is atomic both ways: ``BPF_LINK_UPDATE`` swaps a link's
  program, ``BPF_PROG_ATTACH`` with ``BPF_F_REPLACE`` swaps one attached
  program for another in the cgroup's array; the array the kernel runs is
  rebuilt and published in one step, so an ``open`` sees the old program
  or the new one, never neither.
* Attachments are made with ``BPF_F_ALLOW_MULTI``: programs of ancestors
  and of the cgroup itself all run and all must allow.  systemd
  (``DeviceAllow=``) and runc attach theirs the same way, so ours add to
  theirs.  A cgroup whose programs were attached without the flag refuses
  ours (``EPERM``), which is reported, not hidden.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

from bk.core.errors import Unavailable
from bk.core.record import dataclass

# Commands (include/uapi/linux/bpf.h).
PROG_LOAD, PROG_ATTACH, PROG_DETACH = 5, 8, 9
PROG_GET_NEXT_ID, PROG_GET_FD_BY_ID, OBJ_GET_INFO_BY_FD = 11, 13, 15
PROG_QUERY = 16
LINK_CREATE, LINK_UPDATE, LINK_GET_FD_BY_ID, LINK_GET_NEXT_ID, LINK_DETACH = 28, 29, 30, 31, 34
PROG_TYPE_CGROUP_DEVICE = 15
ATTACH_CGROUP_DEVICE = 6
LINK_TYPE_CGROUP = 3
F_ALLOW_OVERRIDE, F_ALLOW_MULTI, F_REPLACE = 1, 2, 4
QUERY_EFFECTIVE = 1
ATTR_SIZE = 128
LOG_SIZE = 1 << 16
_SYSCALL = {"x86_64": 321, "amd64": 321, "aarch64": 280, "arm64": 280}

_libc = None


def _nr() -> int:
    nr = _SYSCALL.get(platform.machine().lower())
    if nr is None:
        raise Unavailable(f"enforcement is not supported on {platform.machine()} (no known bpf system call)",
                          hint="x86_64 and arm64 are supported")
    return nr


def _call(cmd: int, attr: bytes) -> tuple[int, bytes]:
    """One ``bpf()`` call: (its result, the attribute buffer after it)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    buf = ctypes.create_string_buffer(attr.ljust(ATTR_SIZE, b"\0"), ATTR_SIZE)
    r = _libc.syscall(ctypes.c_long(_nr()), ctypes.c_long(cmd), buf, ctypes.c_uint(ATTR_SIZE))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return int(r), buf.raw


class Refused(OSError):
    """The verifier refused a program; ``log`` is what it said."""

    def __init__(self, err: int, log: str):
        super().__init__(err, f"{os.strerror(err)}: the verifier refused the program: {log.strip()[-800:]}")
        self.log = log


def load(code: bytes, name: str) -> int:
    """Load a device program; its descriptor (close it when done: the
    attachments keep the program alive)."""
    insns = ctypes.create_string_buffer(code, len(code))
    lic = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(LOG_SIZE)
    attr = struct.pack("<IIQQIIQII16sII", PROG_TYPE_CGROUP_DEVICE, len(code) // 8, ctypes.addressof(insns),
                       ctypes.addressof(lic), 1, LOG_SIZE, ctypes.addressof(log), 0, 0,
                       name.encode()[:15], 0, ATTACH_CGROUP_DEVICE)
    try:
        fd, _ = _call(PROG_LOAD, attr)
    except OSError as e:
        text = log.value.decode(errors="replace")
        if e.errno in (errno.EACCES, errno.EINVAL) and text:
            raise Refused(e.errno, text) from None
        raise
    return fd


def attach(cgroup_fd: int, prog_fd: int, replace_fd: int | None = None) -> None:
    """Attach (``BPF_F_ALLOW_MULTI``), or swap ``replace_fd``'s program for
    ``prog_fd`` in one step."""
    flags = F_ALLOW_MULTI | (F_REPLACE if replace_fd is not None else 0)
    _call(PROG_ATTACH, struct.pack("<IIIII", cgroup_fd, prog_fd, ATTACH_CGROUP_DEVICE, flags,
                                   replace_fd if replace_fd is not None else 0))


def detach(cgroup_fd: int, prog_fd: int) -> None:
    _call(PROG_DETACH, struct.pack("<IIII", cgroup_fd, prog_fd, ATTACH_CGROUP_DEVICE, 0))


def link_create(cgroup_fd: int, prog_fd: int) -> int:
    fd, _ = _call(LINK_CREATE, struct.pack("<IIII", prog_fd, cgroup_fd, ATTACH_CGROUP_DEVICE, 0))
    return fd


def link_update(link_fd: int, new_fd: int, old_fd: int) -> None:
    """Swap the link's program from ``old_fd``'s to ``new_fd``'s, only if
    it still runs ``old_fd``'s (``BPF_F_REPLACE``)."""
    _call(LINK_UPDATE, struct.pack("<IIII", link_fd, new_fd, F_REPLACE, old_fd))


def link_detach(link_fd: int) -> None:
    _call(LINK_DETACH, struct.pack("<I", link_fd))


@dataclass(frozen=True)
class Query:
    flags: int                  # the cgroup's attach flags (F_ALLOW_MULTI, ...)
    ids: tuple[int, ...]        # the programs attached here (links included), by id


def query(cgroup_fd: int, *, effective: bool = False) -> Query:
    """The device programs attached to a cgroup (with ``effective``: every
    program that runs for it, its ancestors' included)."""
    n = 64
    while True:
        ids = (ctypes.c_uint32 * n)()
        _, out = _call(PROG_QUERY, struct.pack("<IIIIQI", cgroup_fd, ATTACH_CGROUP_DEVICE,
                                               QUERY_EFFECTIVE if effective else 0, 0, ctypes.addressof(ids), n))
        flags, count = struct.unpack_from("<I", out, 12)[0], struct.unpack_from("<I", out, 24)[0]
        if count <= n:
            return Query(flags, tuple(ids[:count]))
        n = count


@dataclass(frozen=True)
class ProgInfo:
    id: int
    type: int
    name: str
    tag: str


def prog_info(prog_fd: int) -> ProgInfo:
    info = ctypes.create_string_buffer(256)
    _call(OBJ_GET_INFO_BY_FD, struct.pack("<IIQ", prog_fd, 256, ctypes.addressof(info)))
    raw = info.raw
    return ProgInfo(struct.unpack_from("<I", raw, 4)[0], struct.unpack_from("<I", raw, 0)[0],
                    raw[64:80].split(b"\0", 1)[0].decode(errors="replace"), raw[8:16].hex())


def prog_fd_by_id(prog_id: int) -> int:
    fd, _ = _call(PROG_GET_FD_BY_ID, struct.pack("<I", prog_id))
    return fd


def prog_by_id(prog_id: int) -> ProgInfo | None:
    """The program with this id, None when it is gone."""
    try:
        fd = prog_fd_by_id(prog_id)
    except FileNotFoundError:
        return None
    try:
        return prog_info(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class LinkInfo:
    id: int
    prog_id: int
    cgroup_id: int
    attach_type: int


def cgroup_links() -> list[LinkInfo]:
    """Every cgroup link of the system (``CAP_SYS_ADMIN``)."""
    out, start = [], 0
    while True:
        try:
            _, raw = _call(LINK_GET_NEXT_ID, struct.pack("<I", start))
        except FileNotFoundError:
            return out
        start = struct.unpack_from("<I", raw, 4)[0]
        try:
            fd, _ = _call(LINK_GET_FD_BY_ID, struct.pack("<I", start))
        except FileNotFoundError:
            continue
        try:
            info = ctypes.create_string_buffer(64)
            _call(OBJ_GET_INFO_BY_FD, struct.pack("<IIQ", fd, 64, ctypes.addressof(info)))
            kind, lid, pid = struct.unpack_from("<III", info.raw, 0)
            if kind == LINK_TYPE_CGROUP:
                cg, at = struct.unpack_from("<QI", info.raw, 16)
                out.append(LinkInfo(lid, pid, cg, at))
        finally:
            os.close(fd)


def link_fd_by_id(link_id: int) -> int:
    fd, _ = _call(LINK_GET_FD_BY_ID, struct.pack("<I", link_id))
    return fd


# ------------------------------------------------------------------ support

@dataclass(frozen=True)
class Support:
    """What this kernel allows, as far as this process can tell."""

    ok: bool
    detail: str
    links: bool = False

    def to_json(self) -> dict:
        return {"ok": self.ok, "detail": self.detail, "links": self.links}


def probe() -> Support:
    """Load (and drop) a one-instruction device program: the system call
    exists, device programs are built in and this process may load them.
    Links are tried on no cgroup (``EBADF`` means the command exists)."""
    try:
        _nr()
    except Unavailable as e:
        return Support(False, e.message)
    from bk.core import devprog

    code = devprog.encode([devprog.Insn(devprog.MOV64_IMM, 0, imm=1), devprog.Insn(devprog.EXIT)])
    try:
        fd = load(code, "gpubk_probe")
    except OSError as e:
        if e.errno == errno.ENOSYS:
            return Support(False, "this kernel has no bpf() system call (CONFIG_BPF_SYSCALL)")
        if e.errno == errno.EPERM:
            return Support(False, "loading a device program was refused (needs CAP_BPF and CAP_NET_ADMIN, "
                                  "or root)")
        if e.errno == errno.EINVAL:
            return Support(False, "the kernel does not know cgroup device programs (CONFIG_CGROUP_BPF)")
        return Support(False, f"loading a device program failed: {e.strerror}")
    try:
        try:
            link_create(-1 & 0xFFFFFFFF, fd)
            links = True
        except OSError as e:
            links = e.errno == errno.EBADF
    finally:
        os.close(fd)
    return Support(True, "bpf() loads cgroup device programs" + ("; BPF links available" if links else ""),
                   links)
