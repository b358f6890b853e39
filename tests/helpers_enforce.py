"""Helpers for the enforcement tests that use the real kernel (no tests here).

Everything happens in one uniquely named cgroup below the machine's cgroup
v2 root (``bk-enforce-test-<random>``) and in temporary directories: device
nodes made with ``mknod`` for char 195:N (an open the program allows fails
with ``ENXIO``, since no driver answers; one it refuses fails with
``EPERM``: that difference is every assertion).  ``/dev`` and the rest of
the cgroup tree are never touched.  ``TestCgroup.cleanup`` kills the
processes it finds in the subtree (by PID), detaches every program on it
and removes it bottom-up, whatever the test did.
"""

from __future__ import annotations

import errno
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers_broker import poll as wait  # noqa: F401  (the enforcement tests wait with it)

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = "/usr/bin/python3"


def why_not() -> str | None:
    """Why the kernel tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (BPF programs, cgroups, mknod)"
    sys.path.insert(0, str(ROOT))
    from bk.enforce import cgroups, kernel

    got = kernel.probe()
    if not got.ok:
        return f"the kernel refuses cgroup device programs: {got.detail}"
    if cgroups.find_root() is None:
        return "no cgroup v2 hierarchy is mounted"
    return None


def needs_kernel():
    why = why_not()
    return pytest.mark.skipif(why is not None, reason=why or "")


def mknod(directory: Path, minor: int, major: int = 195) -> Path:
    path = directory / f"nvidia{minor}" if major == 195 else directory / f"dev{major}-{minor}"
    os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))
    os.chmod(path, 0o666)
    return path


def open_result(path) -> str:
    """``opened``, or the errno's name of the refusal (ENXIO: allowed,
    there is just no driver; EPERM: a device program refused)."""
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CLOEXEC))
        return "opened"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))


class TestCgroup:
    """A private subtree of the cgroup v2 hierarchy."""

    __test__ = False

    def __init__(self):
        from bk.enforce import cgroups

        self.mount = cgroups.find_root()
        self.name = "bk-enforce-test-" + secrets.token_hex(4)
        self.path = Path(self.mount) / self.name
        self.path.mkdir()

    def make(self, rel: str) -> Path:
        p = self.path / rel
        p.mkdir(parents=True, exist_ok=True)
        return p

    def procs(self) -> list[int]:
        out = []
        for d, _subdirs, files in os.walk(self.path):
            if "cgroup.procs" in files:
                try:
                    out += [int(x) for x in Path(d, "cgroup.procs").read_text().split()]
                except (OSError, ValueError):
                    pass
        return out

    def cleanup(self) -> None:
        from bk.enforce import kernel

        deadline = time.monotonic() + 20
        while True:
            pids = self.procs()
            if not pids or time.monotonic() > deadline:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        for pid in self.procs():                    # unkillable? move it out rather than leak the cgroup
            try:
                Path(self.mount, "cgroup.procs").write_text(str(pid))
            except OSError:
                pass
        for d, _subdirs, _files in sorted(os.walk(self.path), key=lambda x: -x[0].count("/")):
            try:
                fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                continue
            try:
                for pid in kernel.query(fd).ids:
                    try:
                        pfd = kernel.prog_fd_by_id(pid)
                        kernel.detach(fd, pfd)
                        os.close(pfd)
                    except OSError:
                        pass
            except OSError:
                pass
            finally:
                os.close(fd)
            try:
                os.rmdir(d)
            except OSError:
                pass


PROBER = r"""
import errno, os, sys, time
cg, stop = sys.argv[1], sys.argv[2]
paths = sys.argv[3:]
with open(cg, "w") as f:
    f.write(str(os.getpid()))
counts = {}
print("ready", flush=True)
n = 0
while not os.path.exists(stop):
    for p in paths:
        try:
            os.close(os.open(p, os.O_RDWR))
            r = "opened"
        except OSError as e:
            r = errno.errorcode.get(e.errno, str(e.errno))
        counts[(p, r)] = counts.get((p, r), 0) + 1
    n += 1
print(repr(counts), flush=True)
"""


class Prober:
    """A process in ``cgroup_dir`` opening ``paths`` in a tight loop until
    stopped; ``stop()`` returns how often each open ended how."""

    def __init__(self, cgroup_dir: Path, paths, tmp: Path):
        self.stop_file = tmp / f"stop-{secrets.token_hex(3)}"
        self.proc = subprocess.Popen([sys.executable, "-c", PROBER, str(cgroup_dir / "cgroup.procs"),
                                      str(self.stop_file), *map(str, paths)], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def stop(self) -> dict:
        self.stop_file.write_text("")
        out, _ = self.proc.communicate(timeout=60)
        import ast

        return ast.literal_eval(out.strip().splitlines()[-1])
