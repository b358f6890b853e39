"""Who runs a GPU process: owner, start time, a safe label, its container.

The driver gives a PID and its memory; everything else comes from /proc,
read here and nowhere else (the root is injectable, so tests build fake
trees).  The facts that shape this module:

* ``/proc/PID/status`` has ``Uid: real effective saved fs``.  The real UID
  is the user who started the process (a setuid helper keeps it), so that is
  the owner.  Reading it needs no privilege unless /proc is mounted with
  ``hidepid``; then, or when the process has gone, the owner is unknown
  (None), never guessed.
* ``/proc/PID/stat`` field 22 is the start time in clock ticks since boot;
  ``btime`` in /proc/stat is the boot in epoch seconds.  The command name
  (field 2) is in parentheses and may itself contain spaces and ``)``, so
  the fields are counted from the last ``)``.  (PID, start ticks) names a
  process for life: a reused PID has another start, so it keys the cache.
* ``/proc/PID/cmdline`` holds the arguments, which may hold secrets (tokens,
  paths, data set names).  Only a label leaves this module: the basename of
  the executable, or for an interpreter (python, bash, java, node...) the
  basename of its script; never an argument after that, never the
  environment.  The label is capped at 32 characters and its controls and
  format characters (bidi, zero-width) are shown as escapes (``\\u202e``,
  ``bk.core.safetext``): it ends up in a shared snapshot file, its JSON and
  on others' terminals.  A process may rewrite its own argv[0] (setproctitle), so only
  the first word of it is used.
* ``/proc/PID/cgroup`` places the process: one line ``0::/path`` on cgroup
  v2, one line per hierarchy ``N:controllers:path`` on v1.  Container
  runtimes name their cgroups after the container ID (Docker
  ``/docker/<id>`` or ``docker-<id>.scope``, containerd
  ``cri-containerd-<id>.scope``, Podman ``libpod-<id>.scope``, CRI-O
  ``crio-<id>.scope``, Kubernetes ``kubepods/.../pod<uid>/<id>``).  The
  container is reported as ``runtime:<first 12 hex digits>``.
* CPU time, for the activity state (``CpuTrees``): fields 14-17 of
  ``/proc/PID/stat`` are the ticks the process (all its threads) spent in
  user and kernel mode, and those of its children that it has waited for.
  The file is world-readable (unlike ``/proc/PID/io``), so the monitor
  account can read it for every user's process.  A process's children are
  not listed anywhere cheap (``task/TID/children`` is per thread and not
  always built), so the tree is found from every process's parent (field
  4) in a scan of /proc, repeated only every ``rescan_s`` or when a new
  root appears; a child started between two scans counts from the next.
  A child that exits and is reaped moves its time into its parent's
  waited-for fields, so the sum over a tree does not drop when a data
  loader worker ends; a daemon that leaves the tree takes its time with
  it, which only makes the tree look less busy for one interval.
"""

from __future__ import annotations

import os
import re

from bk.core.models import GpuProcess

LABEL_MAX = 32

# Interpreters whose script names the program better than they do, with the
# options that take a value (skipped with it) and those after which the
# program text follows inline (never shown: the label stays the interpreter).
_INTERPRETERS = {
    "python": ({"-W", "-X", "-Q"}, {"-c"}, "-m"),
    "bash": ({"-o", "-O", "--rcfile", "--init-file"}, {"-c"}, None),
    "sh": ({"-o"}, {"-c"}, None),
    "dash": ({"-o"}, {"-c"}, None),
    "zsh": ({"-o"}, {"-c"}, None),
    "perl": ({"-I", "-M", "-m"}, {"-e", "-E"}, None),
    "ruby": ({"-I", "-r"}, {"-e"}, None),
    "node": ({"-r", "--require", "--loader", "--import"}, {"-e", "--eval", "-p", "--print"}, None),
    "java": ({"-cp", "-classpath", "--class-path", "-p", "--module-path"}, set(), "-jar"),
    "julia": ({"-p", "-t", "--project"}, {"-e", "-E"}, None),
    "Rscript": (set(), {"-e"}, None),
}
_INTERP_RE = re.compile(r"^(python|pypy|perl|ruby|node|julia)[0-9.]*$")

_HEX = r"([0-9a-f]{12,64})"
# Most specific first: Kubernetes wraps a runtime's scope in its pod slice.
_CONTAINER_PATTERNS = (
    ("kubernetes", re.compile(r"kubepods.*?(?:cri-containerd-|crio-|docker-|containerd-)" + _HEX + r"\.scope")),
    ("kubernetes", re.compile(r"kubepods.*/pod[0-9a-f_-]+/" + _HEX + r"(?:/|$)")),
    ("docker", re.compile(r"/docker-" + _HEX + r"\.scope")),
    ("docker", re.compile(r"/docker/" + _HEX + r"(?:/|$)")),
    ("containerd", re.compile(r"cri-containerd-" + _HEX + r"\.scope")),
    ("containerd", re.compile(r"/containerd/(?:[^/]+/)*?" + _HEX + r"(?:/|$)")),
    ("podman", re.compile(r"libpod-(?:conmon-)?" + _HEX + r"\.scope")),
    ("podman", re.compile(r"/libpod_parent/libpod-" + _HEX)),
    ("cri-o", re.compile(r"crio-(?:conmon-)?" + _HEX + r"\.scope")),
)


def container_of(cgroup_text: str) -> str | None:
    """``runtime:shortid`` from the text of /proc/PID/cgroup (v1 or v2),
    None for a process in no container bk recognises."""
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        for runtime, rx in _CONTAINER_PATTERNS:
            m = rx.search(path)
            if m:
                return f"{runtime}:{m.group(1)[:12]}"
    return None


def safe_label(argv: list[str], comm: str | None = None) -> str | None:
    """A short label for a command line that shows none of its arguments
    (see the module essay); ``comm`` (the kernel's 15-character name) when
    there is no command line (a kernel thread, an unreadable one)."""
    if not argv or not argv[0]:
        return _clean(comm) if comm else None
    words = argv[0].split()
    exe = os.path.basename(words[0]) if words else ""
    if not exe:
        return _clean(comm) if comm else None
    if len(words) > 1 or len(argv) == 1:
        return _clean(exe)      # argv[0] rewritten with arguments in it, or no arguments
    family = "python" if exe.startswith("python") else _INTERP_RE.sub(r"\1", exe)
    spec = _INTERPRETERS.get(family)
    if spec is None:
        return _clean(exe)
    with_value, inline, named = spec
    # Short options may be bundled (bash -xc CODE, python -Bc CODE): any
    # letter of an inline-program option in a bundle means the program
    # text follows, and it is never shown.
    letters = {o[1] for o in inline if len(o) == 2}
    args = iter(argv[1:])
    for a in args:
        if a in inline or (a.startswith("-") and not a.startswith("--") and letters & set(a[1:])):
            return _clean(exe)
        if named is not None and a == named:
            target = next(args, "")
            return _clean(f"{exe} {os.path.basename(target)}" if target else exe)
        if a in with_value:
            next(args, None)
            continue
        if a == "--":
            a = next(args, "")
            return _clean(f"{exe} {os.path.basename(a)}" if a else exe)
        if a.startswith("-"):
            continue
        return _clean(f"{exe} {os.path.basename(a)}")
    return _clean(exe)


def _clean(text: str) -> str | None:
    """The label as it may leave this module: every character the one text
    policy neutralises (controls, bidi and other format characters) shown
    as its escape, so the snapshot, its JSON and every view carry the same
    harmless text; then cut to ``LABEL_MAX`` characters, never inside an
    escape."""
    from bk.core.safetext import safe

    shown = safe(text.strip())
    if len(shown) <= LABEL_MAX:
        return shown or None
    out, used = [], 0
    for c in text.strip():
        piece = safe(c)
        if used + len(piece) > LABEL_MAX:
            break
        out.append(piece)
        used += len(piece)
    return "".join(out).strip() or None


class ProcInfo:
    """Reads /proc under ``proc_root``, remembering what cannot change for a
    process (owner, label, container) by (PID, start ticks) and user names
    by UID, so that a monitor sampling every 2 s reads one file per known
    process (its stat) and the rest only for new ones."""

    def __init__(self, proc_root: str = "/proc"):
        self.root = proc_root
        self._btime: int | None = None
        self._hz: int | None = None
        self._known: dict[tuple[int, int], tuple] = {}
        self._names: dict[int, str | None] = {}

    def _read(self, pid: int, name: str) -> bytes | None:
        try:
            with open(os.path.join(self.root, str(pid), name), "rb") as f:
                return f.read(65536)
        except OSError:
            return None

    def _boot(self) -> int | None:
        if self._btime is None:
            try:
                with open(os.path.join(self.root, "stat"), "rb") as f:
                    for line in f:
                        if line.startswith(b"btime "):
                            self._btime = int(line.split()[1])
                            break
            except (OSError, ValueError, IndexError):
                return None
        return self._btime

    def _ticks_per_s(self) -> int:
        if self._hz is None:
            try:
                self._hz = os.sysconf("SC_CLK_TCK")
            except (ValueError, OSError):
                self._hz = 100
        return self._hz

    def start_ticks(self, pid: int) -> int | None:
        raw = self._read(pid, "stat")
        if raw is None:
            return None
        try:
            return int(raw[raw.rindex(b")") + 1:].split()[19])
        except (ValueError, IndexError):
            return None

    def user_name(self, uid: int) -> str | None:
        if uid not in self._names:
            from bk.users import user_name

            self._names[uid] = user_name(uid)
        return self._names[uid]

    def describe(self, pid: int) -> tuple[int | None, str | None, str | None, int | None, str | None]:
        """(uid, user, label, since, container) of ``pid``; all None when
        the process cannot be read (gone, or hidden from us)."""
        ticks = self.start_ticks(pid)
        if ticks is None:
            return (None, None, None, None, None)
        hit = self._known.get((pid, ticks))
        if hit is None:
            uid = _real_uid(self._read(pid, "status"))
            if uid is None:
                return (None, None, None, None, None)
            raw = self._read(pid, "cmdline") or b""
            argv = [a.decode("utf-8", "replace") for a in raw.split(b"\0")]
            while argv and not argv[-1]:
                argv.pop()
            comm = (self._read(pid, "comm") or b"").decode("utf-8", "replace").strip() if not argv else None
            cg = self._read(pid, "cgroup")
            container = container_of(cg.decode("utf-8", "replace")) if cg else None
            boot = self._boot()
            since = boot + ticks // self._ticks_per_s() if boot is not None else None
            hit = (uid, safe_label(argv, comm), since, container)
            if len(self._known) > 4096:     # a long-running monitor: forget the dead
                self._known.clear()
            self._known[(pid, ticks)] = hit
        uid, label, since, container = hit
        return (uid, self.user_name(uid), label, since, container)

    def fill(self, p: GpuProcess) -> GpuProcess:
        """``p`` with what /proc says in the fields it does not have yet."""
        uid, user, label, since, container = self.describe(p.pid)
        return GpuProcess(pid=p.pid, mem_mib=p.mem_mib, sm=p.sm,
                          uid=p.uid if p.uid is not None else uid,
                          user=p.user if p.user is not None else (user if p.uid in (None, uid) else None),
                          label=p.label if p.label is not None else label,
                          since=p.since if p.since is not None else since,
                          container=p.container if p.container is not None else container,
                          identity=p.identity)


# ------------------------------------------------------------ one process, exactly

def identity(pid: int, proc_root: str = "/proc") -> tuple[int, int] | None:
    """(pid, start ticks) of the process that runs as ``pid`` now; None
    when none does (gone, a zombie, or hidden from us).  ``bk adopt`` keeps
    this pair: a PID the kernel hands to a later process has a later start,
    so the pair never names that one (``alive``)."""
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), "rb") as f:
            raw = f.read(4096)
    except OSError:
        return None
    fields = _stat_fields(raw)
    if not fields or len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    try:
        return (pid, int(fields[19]))
    except ValueError:
        return None


def alive(pid: int, start_ticks: int, proc_root: str = "/proc") -> bool:
    """Whether the very process (``pid``, ``start_ticks``) still runs: not
    exited, not a zombie, and not another process that got its PID."""
    return identity(pid, proc_root) == (pid, start_ticks)


def real_uid(pid: int, proc_root: str = "/proc") -> int | None:
    """The real UID of ``pid`` (``/proc/PID/status``), None when unreadable."""
    try:
        with open(os.path.join(proc_root, str(pid), "status"), "rb") as f:
            return _real_uid(f.read(65536))
    except OSError:
        return None


def descendants(pid: int, proc_root: str = "/proc") -> set[int]:
    """``pid`` and every process below it now (one scan of /proc)."""
    kids: dict[int, list[int]] = {}
    try:
        names = os.listdir(proc_root)
    except OSError:
        return {pid}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc_root, name, "stat"), "rb") as f:
                fields = _stat_fields(f.read(4096))
        except OSError:
            continue
        if fields and len(fields) > 1:
            try:
                kids.setdefault(int(fields[1]), []).append(int(name))
            except ValueError:
                continue
    out, todo = {pid}, [pid]
    while todo:
        for c in kids.get(todo.pop(), ()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _real_uid(raw: bytes | None) -> int | None:
    if raw is None:
        return None
    for line in raw.splitlines():
        if line.startswith(b"Uid:"):
            try:
                return int(line.split()[1])
            except (ValueError, IndexError):
                return None
    return None


def _stat_fields(raw: bytes | None) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (field 3 first)."""
    if raw is None:
        return None
    try:
        return raw[raw.rindex(b")") + 1:].split()
    except ValueError:
        return None


class CpuTrees:
    """CPU seconds used by the process trees of given roots (see the module
    essay).  ``advance(roots)`` returns, for each root, the CPU seconds its
    tree used since the previous call, counting only processes seen in
    both calls (a process is known by (PID, start): a reused PID is a new
    process, never a jump)."""

    def __init__(self, proc_root: str = "/proc", *, rescan_s: float = 30.0, clock=None):
        import time

        self.root = proc_root
        self.rescan_s = rescan_s
        self._clock = clock or time.monotonic
        self._children: dict[int, list[int]] = {}
        self._scanned_at: float | None = None
        self._scanned_roots: set[int] = set()
        self._last: dict[int, tuple[int, int]] = {}    # pid -> (start ticks, total ticks)
        self._hz: int | None = None

    def _ticks_per_s(self) -> int:
        if self._hz is None:
            try:
                self._hz = os.sysconf("SC_CLK_TCK")
            except (ValueError, OSError):
                self._hz = 100
        return self._hz

    def _read_stat(self, pid: int) -> list[bytes] | None:
        # os.open/os.read rather than open(): a monitor reads a few hundred
        # of these a minute, and the io stack costs several times the syscalls.
        try:
            fd = os.open(f"{self.root}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            return _stat_fields(os.read(fd, 4096))
        except OSError:
            return None
        finally:
            os.close(fd)

    def _scan(self) -> None:
        children: dict[int, list[int]] = {}
        try:
            names = os.listdir(self.root)
        except OSError:
            names = []
        for name in names:
            if not name.isdigit():
                continue
            f = self._read_stat(int(name))
            if f is None or len(f) < 2:
                continue
            try:
                children.setdefault(int(f[1]), []).append(int(name))
            except ValueError:
                continue
        self._children = children
        self._scanned_at = self._clock()

    def members(self, root: int) -> list[int]:
        """``root`` and its descendants as of the last scan."""
        out, todo, seen = [], [root], {root}
        while todo:
            pid = todo.pop()
            out.append(pid)
            for c in self._children.get(pid, ()):
                if c not in seen:
                    seen.add(c)
                    todo.append(c)
        return out

    def advance(self, groups: dict) -> dict:
        """``groups``: key (a booking) -> its root PIDs.  Returns key -> the
        CPU seconds the union of those roots' trees used since the previous
        call (a process in two trees of one group counts once)."""
        roots = {pid for pids in groups.values() for pid in pids}
        if not roots:
            self._last = {}
            return {k: 0.0 for k in groups}
        now = self._clock()
        if (self._scanned_at is None or now - self._scanned_at >= self.rescan_s
                or not roots <= self._scanned_roots):
            self._scan()
            self._scanned_roots = set(roots)
        hz = self._ticks_per_s()
        last, seen = self._last, {}
        out = {}
        for key, pids in groups.items():
            tree: set[int] = set()
            for r in pids:
                tree.update(self.members(r))
            used = 0
            for pid in tree:
                if pid in seen:
                    got = seen[pid]
                else:
                    got = seen[pid] = self._ticks(pid)
                before = last.get(pid)
                if got is not None and before is not None and before[0] == got[0] and got[1] > before[1]:
                    used += got[1] - before[1]
            out[key] = used / hz
        self._last = {pid: v for pid, v in seen.items() if v is not None}
        return out

    def _ticks(self, pid: int) -> tuple[int, int] | None:
        """(start ticks, CPU ticks of it and its waited-for children)."""
        f = self._read_stat(pid)
        if f is None or len(f) <= 19:
            return None
        try:
            return (int(f[19]), int(f[11]) + int(f[12]) + int(f[13]) + int(f[14]))
        except ValueError:
            return None
