"""The kernel side of hard enforcement (issue 31), for real: programs made by
``bk.core.devprog`` loaded and attached with ``bk.enforce.kernel`` to a
private cgroup, judged by opening device nodes made with ``mknod`` (ENXIO:
allowed, no driver; EPERM: refused by the program).  Root only."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.helpers_enforce import Prober, TestCgroup, mknod, needs_kernel, wait

pytestmark = [needs_kernel(), pytest.mark.root]


@pytest.fixture
def cg():
    c = TestCgroup()
    try:
        yield c
    finally:
        c.cleanup()


@pytest.fixture
def nodes(tmp_path):
    return {n: mknod(tmp_path, n) for n in (0, 1, 2, 255)} | {"other": mknod(tmp_path, 3, major=236)}


def program(allowed: set[int], managed=(0, 1, 2), *, windows=None, expiry=2 ** 63, open_=False):
    from bk.core import devprog as d

    wins = windows if windows is not None else [(195, m, 0, 2 ** 63) for m in allowed]
    return d.encode(d.generate(d.Grants(tuple((195, m) for m in managed), tuple(wins), expiry, open_)))


def load(code: bytes, name="gpubk1000") -> int:
    from bk.enforce import kernel

    return kernel.load(code, name)


def dirfd(path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def probe_in(cgroup_dir, paths) -> list[str]:
    """Open each path from a new process placed in ``cgroup_dir``."""
    script = ("import os, sys\nfrom tests.helpers_enforce import open_result\n"
              "open(sys.argv[1], 'w').write(str(os.getpid()))\nprint(' '.join(open_result(p) for p in sys.argv[2:]))")
    out = subprocess.run([sys.executable, "-c", script, str(cgroup_dir / "cgroup.procs"), *map(str, paths)],
                         capture_output=True, text=True, timeout=30, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return out.stdout.split()


def test_a_program_refuses_exactly_the_managed_gpus_it_does_not_grant(cg, nodes):
    from bk.enforce import kernel

    top = cg.make("user.slice/user-1000.slice")
    below = cg.make("user.slice/user-1000.slice/session-1.scope")
    paths = [nodes[0], nodes[1], nodes[2], nodes[255], nodes["other"]]
    assert probe_in(below, paths) == ["ENXIO"] * 5            # no program: the absent driver answers
    fd, cgfd = load(program({0})), dirfd(top)
    try:
        kernel.attach(cgfd, fd)
        # GPU 0 granted; 1 and 2 refused; nvidiactl (255) and other devices open; below the slice too.
        assert probe_in(below, paths) == ["ENXIO", "EPERM", "EPERM", "ENXIO", "ENXIO"]
        assert probe_in(top, paths) == ["ENXIO", "EPERM", "EPERM", "ENXIO", "ENXIO"]
        # A program that allows everything, attached below ours, cannot undo a refusal.
        allow_all = load(program(set(), managed=()))
        sub = dirfd(below)
        try:
            kernel.attach(sub, allow_all)
            assert probe_in(below, paths)[1] == "EPERM"
            kernel.detach(sub, allow_all)
        finally:
            os.close(sub)
            os.close(allow_all)
        q = kernel.query(cgfd)
        assert q.flags == kernel.F_ALLOW_MULTI and len(q.ids) == 1
        assert kernel.prog_by_id(q.ids[0]).name == "gpubk1000"
        kernel.detach(cgfd, fd)
        assert probe_in(below, paths) == ["ENXIO"] * 5
        assert kernel.query(cgfd).ids == ()
    finally:
        os.close(fd)
        os.close(cgfd)


def _swaps(cg, nodes, tmp_path, swap, seconds=1.0) -> dict:
    """A prober opens GPU 0 (granted by both programs) and GPU 1 (refused
    by both) in a loop while ``swap(cgfd, a, b)`` replaces one program by
    the other, back and forth, for ``seconds`` (thousands of swaps)."""
    leaf = cg.make("user.slice/user-1000.slice/session-1.scope")
    top = leaf.parent
    a, b = load(program({0})), load(program({0}, managed=(0, 1, 3)))
    cgfd = dirfd(top)
    state = {"cur": a, "link": None}
    try:
        swap.first(cgfd, a, state)
        prober = Prober(leaf, [nodes[0], nodes[1]], tmp_path)
        try:
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                new = b if state["cur"] == a else a
                swap(cgfd, new, state)
                state["cur"] = new
        finally:
            counts = prober.stop()
        swap.last(cgfd, state)
        return counts
    finally:
        for fd in (a, b, cgfd):
            os.close(fd)


class _Replace:
    """``BPF_PROG_ATTACH`` with ``BPF_F_REPLACE``."""

    def first(self, cgfd, a, state):
        from bk.enforce import kernel

        kernel.attach(cgfd, a)

    def __call__(self, cgfd, new, state):
        from bk.enforce import kernel

        kernel.attach(cgfd, new, replace_fd=state["cur"])

    def last(self, cgfd, state):
        from bk.enforce import kernel

        kernel.detach(cgfd, state["cur"])


class _LinkUpdate(_Replace):
    """``BPF_LINK_UPDATE``."""

    def first(self, cgfd, a, state):
        from bk.enforce import kernel

        state["link"] = kernel.link_create(cgfd, a)

    def __call__(self, cgfd, new, state):
        from bk.enforce import kernel

        kernel.link_update(state["link"], new, state["cur"])

    def last(self, cgfd, state):
        os.close(state["link"])


class _DetachAttach(_Replace):
    """What not to do: take the old one off, then put the new one on."""

    def __call__(self, cgfd, new, state):
        from bk.enforce import kernel

        kernel.detach(cgfd, state["cur"])
        kernel.attach(cgfd, new)


@pytest.mark.parametrize("swap", [_Replace(), _LinkUpdate()], ids=["attach-replace", "link-update"])
def test_replacement_leaves_no_window_open_or_closed(cg, nodes, tmp_path, swap):
    counts = _swaps(cg, nodes, tmp_path, swap)
    n0, n1 = str(nodes[0]), str(nodes[1])
    print(counts)
    assert counts.get((n0, "EPERM"), 0) == 0, "a moment where the granted GPU was refused"
    assert counts.get((n1, "ENXIO"), 0) == 0, "a moment where the refused GPU was open"
    assert counts[(n0, "ENXIO")] > 0 and counts[(n1, "EPERM")] > 0


def test_the_prober_does_see_a_non_atomic_swap(cg, nodes, tmp_path):
    """The control: detach-then-attach leaves moments with no program, and
    the same prober sees them (so its silence above means something).
    Rounds are repeated until it does, within a deadline."""
    n1 = str(nodes[1])
    deadline = time.monotonic() + 60
    seen = 0
    while not seen and time.monotonic() < deadline:
        c2 = TestCgroup()
        try:
            seen = _swaps(c2, nodes, tmp_path, _DetachAttach()).get((n1, "ENXIO"), 0)
        finally:
            c2.cleanup()
    assert seen, "a detach-then-attach swap never showed its open moment"


LINK_HOLDER = r"""
import os, sys
from bk.core import devprog as d
from bk.enforce import kernel
g = d.Grants(((195, 0), (195, 1)), ((195, 0, 0, 2 ** 63),), 2 ** 63, True)
fd = kernel.load(d.encode(d.generate(g)), "gpubk1000")
cg = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
link = kernel.link_create(cg, fd)
print("linked", flush=True)
sys.stdin.read()
"""


def test_a_link_is_detached_when_its_holder_is_killed(cg, nodes):
    """Fail open on a crash: the enforcer's links die with it."""
    from bk.enforce import kernel

    top = cg.make("user.slice/user-1000.slice")
    holder = subprocess.Popen([sys.executable, "-c", LINK_HOLDER, str(top)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        assert holder.stdout.readline().strip() == "linked"
        assert probe_in(top, [nodes[0], nodes[1]]) == ["ENXIO", "EPERM"]
        holder.kill()
        holder.wait(timeout=30)
        cgfd = dirfd(top)
        try:
            # The kernel releases the link when its last descriptor closes (with the process).
            wait(lambda: kernel.query(cgfd).ids == (), 30, "the link to go")
        finally:
            os.close(cgfd)
        assert probe_in(top, [nodes[0], nodes[1]]) == ["ENXIO", "ENXIO"]
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


WINDOW_PROBE = r"""
import errno, os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
end = int(sys.argv[3])
first_refused = None
deadline = time.monotonic() + 20
last = None
while time.monotonic() < deadline:
    t = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    try:
        os.close(os.open(sys.argv[2], os.O_RDWR)); r = "opened"
    except OSError as e:
        r = errno.errorcode[e.errno]
    if r == "EPERM":
        first_refused = time.clock_gettime_ns(time.CLOCK_BOOTTIME)   # the open ended by then
        break
    last = (r, t)
print(last[0] if last else None, last[1] if last else 0, first_refused)
"""


def test_a_window_closes_by_itself_at_its_end(cg, nodes):
    """No process wakes at a booking's end: the program compares the boot
    clock itself.  The probe is allowed until the window's end and never
    refused before it."""
    from bk.enforce import kernel

    top = cg.make("user.slice/user-1000.slice")
    end = time.clock_gettime_ns(time.CLOCK_BOOTTIME) + 700_000_000
    fd, cgfd = load(program(set(), windows=[(195, 0, 0, end)])), dirfd(top)
    try:
        kernel.attach(cgfd, fd)
        out = subprocess.run([sys.executable, "-c", WINDOW_PROBE, str(top / "cgroup.procs"), str(nodes[0]),
                              str(end)], capture_output=True, text=True, timeout=60, check=True)
        last, last_t, refused = out.stdout.split()
        assert last == "ENXIO" and refused != "None"
        # The last allowed open started before the end; the first refused one ended after it.
        assert int(last_t) < end <= int(refused)
        print(f"first refusal {(int(refused) - end) / 1e6:.3f} ms after the window's end")
        kernel.detach(cgfd, fd)
    finally:
        os.close(fd)
        os.close(cgfd)


def test_probe_says_what_this_kernel_allows():
    from bk.enforce import kernel

    got = kernel.probe()
    assert got.ok and "device programs" in got.detail
    print(got.detail)
