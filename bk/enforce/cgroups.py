"""What the enforcer looks at: the cgroup v2 tree, the processes in it and
the NVIDIA device numbers.  Reads only; the roots are arguments, so tests
point them at a private cgroup mount and a fake ``/proc``.

The facts:

* There is one cgroup v2 hierarchy.  It is mounted at ``/sys/fs/cgroup``
  (systemd's unified layout) or ``/sys/fs/cgroup/unified`` (the hybrid
  layout, v1 controllers beside it); device programs attach to v2
  directories in either.  ``/proc/self/mountinfo`` says where; a later
  mount on the same point hides an earlier one, so the last one wins.
* Inside a cgroup namespace, paths in ``/proc/PID/cgroup`` and the mount's
  root are relative to the namespace's root, so everything here works with
  paths relative to the mount, the same on a host and in a namespace.
* systemd names a user's slice ``user.slice/user-UID.slice``.  Container
  runtimes name a container's cgroup after its ID (``bk.gpu.procinfo``
  knows the patterns); the container's cgroup is the shortest prefix of a
  process's path that is one, since a container may nest its own cgroups.
* A cgroup's id, which BPF links report, is its directory's inode number.
* ``/proc/devices`` lists character majors by driver name (``nvidia-caps``
  is dynamic); ``/proc/driver/nvidia/gpus/BUS/information`` gives each
  GPU's ``Device Minor``; each MIG instance's
  ``/proc/driver/nvidia/capabilities/gpuMINOR/mig/gi*/[ci*/]access`` gives
  ``DeviceFileMinor`` of its capability node.
"""

from __future__ import annotations

import os
import re

from bk.core import enforce as rule
from bk.core.record import dataclass, field
from bk.gpu.procinfo import container_of

USER_SLICE = "user.slice"
SCAN_DEPTH = 8                     # deep enough for kubepods.slice/.../cri-containerd-ID.scope
# Containers sit right below a top-level cgroup (system.slice/docker-ID.scope,
# machine.slice/libpod-ID.scope, docker/ID), except in these trees, which
# nest them deeper; the scan descends nowhere else, so the hundreds of
# service cgroups of a busy host cost one directory listing.
_NESTING = ("kubepods", "containerd", "libpod_parent")


def _unescape(path: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def cgroup2_mounts(mountinfo: str) -> list[str]:
    """The cgroup v2 mount points in ``/proc/self/mountinfo`` text, in order."""
    out = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        parts = left.split()
        if len(parts) >= 5 and right.split(" ", 1)[0] == "cgroup2":
            out.append(_unescape(parts[4]))
    return out


def find_root(proc_root: str = "/proc") -> str | None:
    """Where the cgroup v2 hierarchy is mounted here, or None."""
    try:
        with open(os.path.join(proc_root, "self", "mountinfo"), encoding="utf-8", errors="replace") as f:
            mounts = cgroup2_mounts(f.read())
    except OSError:
        return None
    for want in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if want in mounts:
            return want
    return mounts[-1] if mounts else None


def container_path(path: str) -> str | None:
    """The container's cgroup (relative, no leading slash) for a cgroup
    path, or None when it is no container's or it lies in a user slice."""
    parts = [p for p in path.strip("/").split("/") if p]
    if not parts or parts[0] == USER_SLICE:
        return None
    for n in range(1, len(parts) + 1):
        prefix = "/".join(parts[:n])
        if container_of("0::/" + prefix):
            return prefix
    return None


@dataclass(frozen=True)
class Found:
    """One scan of the tree: user slices (path, uid, id) and container
    cgroups (path, id)."""

    slices: tuple[tuple[str, int, int], ...]
    containers: tuple[tuple[str, int], ...]
    problems: tuple[str, ...] = ()


def scan(root: str) -> Found:
    slices, containers, problems = [], [], []
    base = os.path.join(root, USER_SLICE)
    try:
        with os.scandir(base) as it:
            for e in it:
                uid = rule.slice_uid(e.name)
                if uid is not None and e.is_dir(follow_symlinks=False):
                    slices.append((f"{USER_SLICE}/{e.name}", uid, e.inode()))
    except FileNotFoundError:
        pass
    except OSError as e:
        problems.append(f"{base}: {e.strerror}")

    def walk(rel: str, depth: int) -> None:
        try:
            with os.scandir(os.path.join(root, rel) if rel else root) as it:
                entries = [e for e in it if e.is_dir(follow_symlinks=False)]
        except OSError:
            return
        for e in entries:
            sub = f"{rel}/{e.name}" if rel else e.name
            if sub == USER_SLICE:
                continue
            if container_of("0::/" + sub):
                containers.append((sub, e.inode()))
            elif depth == 1 or (depth < SCAN_DEPTH and sub.startswith(_NESTING)):
                walk(sub, depth + 1)

    walk("", 1)
    return Found(tuple(sorted(slices)), tuple(sorted(containers)), tuple(problems))


def procs(root: str, path: str) -> list[int]:
    """The processes of a cgroup and of the cgroups below it."""
    out = []
    top = os.path.join(root, path)
    for d, _subdirs, files in os.walk(top):
        if "cgroup.procs" in files:
            try:
                with open(os.path.join(d, "cgroup.procs"), encoding="ascii") as f:
                    out += [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                pass
    return out


def real_uid(pid: int, proc_root: str = "/proc") -> int | None:
    try:
        with open(os.path.join(proc_root, str(pid), "status"), "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def cgroup_of(pid: int, proc_root: str = "/proc") -> str | None:
    """A process's cgroup v2 path (``0::/...``), relative, or None."""
    try:
        with open(os.path.join(proc_root, str(pid), "cgroup"), encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip().lstrip("/")
    except OSError:
        return None
    return None


def start_ticks(pid: int, proc_root: str = "/proc", *, live: bool = False) -> int | None:
    """The process's start (clock ticks since boot), None when it is gone;
    with ``live``, also None for a zombie (it holds no descriptor any more)."""
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), "rb") as f:
            raw = f.read(4096)
        rest = raw[raw.rindex(b")") + 1:].split()
        if live and rest[0] in (b"Z", b"X"):
            return None
        return int(rest[19])
    except (OSError, ValueError, IndexError):
        return None


_BTIME: dict[str, int] = {}


def _btime(proc_root: str) -> int | None:
    if proc_root not in _BTIME:
        try:
            with open(os.path.join(proc_root, "stat"), "rb") as f:
                for line in f:
                    if line.startswith(b"btime "):
                        _BTIME[proc_root] = int(line.split()[1])
        except (OSError, ValueError):
            return None
    return _BTIME.get(proc_root)


def started_at(pid: int, proc_root: str = "/proc", *, live: bool = False) -> int | None:
    """When the process started (epoch seconds, as the monitor's snapshot
    says ``since``): the boot time plus its start ticks; None when it is
    gone (with ``live``, a zombie too) or ``/proc`` cannot say."""
    ticks = start_ticks(pid, proc_root, live=live)
    boot = _btime(proc_root)
    if ticks is None or boot is None:
        return None
    return boot + ticks // os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ devices

@dataclass(frozen=True)
class DriverFacts:
    minors_by_bus: dict = field(default_factory=dict)
    caps_major: int | None = None
    caps_by_minor: dict = field(default_factory=dict)


def char_major(devices_text: str, name: str) -> int | None:
    """The character major of driver ``name`` in ``/proc/devices`` text."""
    block = devices_text.split("Block devices:", 1)[0]
    for line in block.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == name and parts[0].isdigit():
            return int(parts[0])
    return None


def _field(text: str, key: str) -> str | None:
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if sep and k.strip() == key:
            return v.strip()
    return None


def driver_facts(proc_root: str = "/proc") -> DriverFacts:
    facts = DriverFacts()
    try:
        with open(os.path.join(proc_root, "devices"), encoding="ascii", errors="replace") as f:
            facts = DriverFacts(caps_major=char_major(f.read(), "nvidia-caps"))
    except OSError:
        pass
    gpus = os.path.join(proc_root, "driver", "nvidia", "gpus")
    minors = {}
    try:
        buses = sorted(os.listdir(gpus))
    except OSError:
        buses = []
    for bus in buses:
        try:
            with open(os.path.join(gpus, bus, "information"), encoding="utf-8", errors="replace") as f:
                minor = _field(f.read(), "Device Minor")
        except OSError:
            continue
        if minor is not None and minor.isdigit():
            minors[bus] = int(minor)
    caps: dict[int, list[int]] = {}
    capdir = os.path.join(proc_root, "driver", "nvidia", "capabilities")
    for minor in minors.values():
        mig = os.path.join(capdir, f"gpu{minor}", "mig")
        for d, _subdirs, files in os.walk(mig):
            if "access" in files:
                try:
                    with open(os.path.join(d, "access"), encoding="utf-8", errors="replace") as f:
                        got = _field(f.read(), "DeviceFileMinor")
                except OSError:
                    continue
                if got is not None and got.isdigit():
                    caps.setdefault(minor, []).append(int(got))
    return DriverFacts(minors, facts.caps_major, {k: tuple(sorted(v)) for k, v in caps.items()})


def device_map(gpu_count: int, proc_root: str = "/proc") -> rule.DeviceMap:
    facts = driver_facts(proc_root)
    if not facts.minors_by_bus:
        return rule.index_map(gpu_count)
    return rule.driver_map(gpu_count, facts.minors_by_bus, facts.caps_major, facts.caps_by_minor)
