"""Who runs a GPU process, and is it entitled to the GPU (SPEC 8).

Three layers, each against real inputs where they are cheap:
* ``bk.gpu.procinfo`` against fake /proc trees (status, stat, cmdline, comm,
  cgroup files in a tmp dir) for every cgroup format bk recognises, v1 and
  v2, and against the real /proc with real processes started as real
  throwaway users (root-marked), one of them moved into a real cgroup named
  like Docker's;
* the pure judgement ``bk.core.telemetry.attribute_all`` for every state and
  identity, and the booking warning built on it;
* placement: a GPU used without a booking comes after every other busy one.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bk.core import telemetry
from bk.core.models import GpuInfo, GpuProcess, Reservation, parse_iso
from bk.core.telemetry import Attribution, Snapshot, attribute_all
from bk.gpu.procinfo import LABEL_MAX, ProcInfo, container_of, safe_label

BTIME = 1_780_000_000
HZ = os.sysconf("SC_CLK_TCK")
HEX = "3f2a9c1b12ab" + "0123456789abcdef" * 3 + "cdef"      # 64 hex digits
POD = "8d1c2c53_7f6e_4b8e_9d2a_0c1f5e4a3b21"


# ---------------------------------------------------------------- fake /proc

def fake_proc(root: Path, pid: int, *, uid: int = 1000, euid: int | None = None, argv=("python3", "train.py"),
              comm: str = "python3", cgroup: str = "0::/user.slice\n", start_ticks: int = 500 * HZ) -> None:
    """One process in a fake /proc tree, as the kernel lays it out."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text(f"cpu  1 2 3 4\nbtime {BTIME}\nprocesses 1234\n")
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    e = uid if euid is None else euid
    (d / "status").write_text(f"Name:\t{comm}\nUmask:\t0022\nState:\tS (sleeping)\nPid:\t{pid}\n"
                              f"Uid:\t{uid}\t{e}\t{e}\t{e}\nGid:\t100\t100\t100\t100\n")
    # comm in parentheses may hold spaces and ')' itself: fields count from the last ')'
    rest = ["S"] + ["0"] * 18 + [str(start_ticks)] + ["0"] * 30
    (d / "stat").write_text(f"{pid} ({comm}) x) {' '.join(rest)}\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + (b"\0" if argv else b""))
    (d / "comm").write_text(comm + "\n")
    (d / "cgroup").write_text(cgroup)


CGROUPS = [
    ("docker, cgroup v1 (one line per hierarchy)",
     f"12:pids:/docker/{HEX}\n11:memory:/docker/{HEX}\n1:name=systemd:/docker/{HEX}\n0::/\n", "docker:3f2a9c1b12ab"),
    ("docker, cgroup v2 with the systemd driver", f"0::/system.slice/docker-{HEX}.scope\n", "docker:3f2a9c1b12ab"),
    ("containerd (CRI), v2", f"0::/system.slice/cri-containerd-{HEX}.scope\n", "containerd:3f2a9c1b12ab"),
    ("containerd, v1 path", f"3:cpuset:/containerd/default/{HEX}\n", "containerd:3f2a9c1b12ab"),
    ("podman, v2", f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{HEX}.scope/container\n",
     "podman:3f2a9c1b12ab"),
    ("podman's conmon", f"0::/machine.slice/libpod-conmon-{HEX}.scope\n", "podman:3f2a9c1b12ab"),
    ("kubernetes, cgroupfs driver, v1", f"4:memory:/kubepods/burstable/pod{POD.replace('_', '-')}/{HEX}\n"
     "1:name=systemd:/\n", "kubernetes:3f2a9c1b12ab"),
    ("kubernetes guaranteed QoS, v1", f"4:memory:/kubepods/pod{POD.replace('_', '-')}/{HEX}\n",
     "kubernetes:3f2a9c1b12ab"),
    ("kubernetes, systemd driver, cri-o, v2",
     f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD}.slice/crio-{HEX}.scope\n",
     "kubernetes:3f2a9c1b12ab"),
    ("kubernetes, systemd driver, containerd, v2",
     f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD}.slice/cri-containerd-{HEX}.scope\n",
     "kubernetes:3f2a9c1b12ab"),
    ("cri-o without kubernetes", f"0::/machine.slice/crio-{HEX}.scope\n", "cri-o:3f2a9c1b12ab"),
    ("a login session, v2", "0::/user.slice/user-1000.slice/session-3.scope\n", None),
    ("a service, v1", "5:devices:/system.slice/ssh.service\n1:name=systemd:/system.slice/ssh.service\n", None),
    ("the root cgroup", "0::/\n", None),
    ("a short hex name is not a container ID", "0::/docker/abc123\n", None),
]


@pytest.mark.parametrize("text,expected", [c[1:] for c in CGROUPS], ids=[c[0] for c in CGROUPS])
def test_container_of_every_cgroup_format(tmp_path, text, expected):
    assert container_of(text) == expected
    fake_proc(tmp_path, 77, uid=0, cgroup=text)
    assert ProcInfo(str(tmp_path)).describe(77)[4] == expected


LABELS = [
    (["python3", "train.py", "--token", "s3cret"], "python3 train.py"),
    (["/usr/bin/python3.11", "-u", "-W", "ignore", "/home/a/exp/run.py", "--lr=3e-4"], "python3.11 run.py"),
    (["python", "-m", "torch.distributed.run", "--nproc", "8", "x.py"], "python torch.distributed.run"),
    (["python3", "-c", "import os; os.system('curl secret')"], "python3"),
    (["python3", "-Bc", "print(1)"], "python3"),
    (["bash", "-c", "export TOKEN=abc; ./go"], "bash"),
    (["/bin/bash", "-xc", "rm -rf /data/secret"], "bash"),
    (["bash", "/opt/jobs/nightly.sh", "arg"], "bash nightly.sh"),
    (["java", "-Xmx8g", "-cp", "/a:/b", "-jar", "/srv/app-1.2.jar", "--password", "x"], "java app-1.2.jar"),
    (["node", "--require", "ts-node/register", "server.js", "--key", "k"], "node server.js"),
    (["node", "-e", "require('x')"], "node"),
    (["/opt/cuda/bin/nbody", "-benchmark", "-numbodies=1000000"], "nbody"),
    (["ray::Trainer.train() token=abc"], "ray::Trainer.train()"),
    (["postgres: writer process   "], "postgres:"),
    (["./evil\x1b[31mred\x07", "x"], "evil\\x1b[31mred\\x07"),     # escaped, never raw
    (["./a\u202eb\u200fc\u200b\u061c", "x"], "a\\u202eb\\u200fc\\u200b\\u061c"),
    (["./" + "a" * 28 + "\u202e"], "a" * 28),                   # never cut inside an escape
    (["/x/" + "a" * 80], "a" * LABEL_MAX),
    (["python3", "--", "-weird.py"], "python3 -weird.py"),
    (["python3"], "python3"),
]


@pytest.mark.parametrize("argv,label", LABELS, ids=[str(i) for i in range(len(LABELS))])
def test_safe_label_never_shows_arguments(argv, label):
    got = safe_label(argv)
    assert got == label
    assert len(got) <= LABEL_MAX and not any(ord(c) < 32 for c in got)
    for secret in ("s3cret", "secret", "TOKEN", "lr=", "password", "benchmark", "token=abc"):
        assert secret not in got


def test_label_falls_back_to_comm_without_a_command_line(tmp_path):
    fake_proc(tmp_path, 5, argv=(), comm="kworker/0:1")
    assert ProcInfo(str(tmp_path)).describe(5)[2] == "kworker/0:1"


def test_describe_reads_real_uid_start_and_caches_by_start_time(tmp_path):
    fake_proc(tmp_path, 4242, uid=1000, euid=0, start_ticks=1234 * HZ)    # a setuid helper: real uid counts
    info = ProcInfo(str(tmp_path))
    uid, _user, label, since, container = info.describe(4242)
    assert (uid, label, since, container) == (1000, "python3 train.py", BTIME + 1234, None)
    # The same PID and start: remembered, the files are not read again.
    (tmp_path / "4242" / "cmdline").write_bytes(b"changed\0")
    assert info.describe(4242)[2] == "python3 train.py"
    # The PID reused by a new process (another start): read afresh.
    fake_proc(tmp_path, 4242, uid=2000, argv=("other",), start_ticks=9999 * HZ)
    assert info.describe(4242)[0:3:2] == (2000, "other")


def test_an_unreadable_or_gone_process_has_no_owner(tmp_path):
    fake_proc(tmp_path, 9, uid=1000)
    (tmp_path / "9" / "status").unlink()      # hidepid, or gone between two reads
    info = ProcInfo(str(tmp_path))
    assert info.describe(9) == (None,) * 5
    assert info.describe(31337) == (None,) * 5
    p = info.fill(GpuProcess(pid=31337, mem_mib=100))
    assert p.uid is None and p.mem_mib == 100
    snap = Snapshot(0, "t", (GpuInfo(0, "u", "g", processes=[p]),))
    assert attribute_all(snap, [], 0)[(0, 31337)] == Attribution("unknown", None, None)


def test_fill_keeps_what_the_backend_or_file_said(tmp_path):
    fake_proc(tmp_path, 12, uid=1000, cgroup=f"0::/system.slice/docker-{HEX}.scope\n")
    p = ProcInfo(str(tmp_path)).fill(GpuProcess(pid=12, mem_mib=5, sm=7, label="given"))
    assert (p.uid, p.label, p.mem_mib, p.sm, p.container, p.since) == (1000, "given", 5, 7,
                                                                          "docker:3f2a9c1b12ab", BTIME + 500)


# ----------------------------------------------------------------- judgement

NOW = 1_800_000_000


def booking(uid: int, gpus, *, user=None, start=NOW - 600, end=NOW + 3600, rid=None, mode="shared"):
    return Reservation(id=rid or secrets.token_hex(8), uid=uid, user=user or f"u{uid}", mode=mode,
                       gpus=tuple(gpus), share=1, start=start, end=end, created=start)


def snap_of(*gpus_procs) -> Snapshot:
    return Snapshot(NOW, "test", tuple(GpuInfo(i, f"GPU-{i}", "G", util=50, processes=list(ps))
                                       for i, ps in enumerate(gpus_procs)), (), True)


DOCKER = "docker:3f2a9c1b12ab"
JUDGEMENTS = [
    # (process on GPU 0, bookings, expected)
    ("owner booked this GPU", GpuProcess(1, uid=1000), [booking(1000, [0])], ("ok", "verified", 1000)),
    ("owner booked another GPU", GpuProcess(1, uid=1000), [booking(1000, [1])], ("wrong-gpu", "verified", 1000)),
    ("owner has no booking now", GpuProcess(1, uid=1000), [booking(1000, [0], start=NOW + 60)],
     ("unreserved", "verified", 1000)),
    ("a cancelled booking does not count", GpuProcess(1, uid=1000),
     [booking(1000, [0]).replace(cancelled_at=NOW - 1)], ("unreserved", "verified", 1000)),
    ("owner unreadable", GpuProcess(1), [booking(1000, [0])], ("unknown", None, None)),
    ("display server", GpuProcess(1, uid=0, label="Xorg"), [], ("system", "verified", 0)),
    ("root outside a container is root", GpuProcess(1, uid=0, label="python3 x.py"), [booking(1000, [0])],
     ("unreserved", "verified", 0)),
    ("root container, one booker of the GPU", GpuProcess(1, uid=0, container=DOCKER),
     [booking(1000, [0]), booking(2000, [1])], ("ok", "inferred", 1000)),
    ("root container, two bookers of the GPU", GpuProcess(1, uid=0, container=DOCKER),
     [booking(1000, [0]), booking(2000, [0])], ("unknown", "ambiguous", None)),
    ("root container, nobody holds the GPU", GpuProcess(1, uid=0, container=DOCKER),
     [booking(1000, [1])], ("unreserved", "verified", 0)),
    ("root container, root itself booked it", GpuProcess(1, uid=0, container=DOCKER),
     [booking(0, [0]), booking(1000, [0])], ("ok", "verified", 0)),
    ("rootless container runs as its user", GpuProcess(1, uid=1000, container="podman:0123456789ab"),
     [booking(2000, [0])], ("unreserved", "verified", 1000)),
]


@pytest.mark.parametrize("proc,bookings,expected", [j[1:] for j in JUDGEMENTS], ids=[j[0] for j in JUDGEMENTS])
def test_attribute_all_states_and_identities(proc, bookings, expected):
    got = attribute_all(snap_of([proc], []), bookings, NOW)
    assert got == {(0, 1): Attribution(*expected)}
    # The older single-state function agrees.
    assert telemetry.attribute(proc, 0, telemetry.active_gpus_by_uid(bookings, NOW)) == expected[0]


def test_gpu_state_unreserved_use():
    s = Snapshot(NOW, "t", (GpuInfo(0, "a", "G", util=50, processes=[GpuProcess(1, uid=1000), GpuProcess(2, uid=2000)]),
                            GpuInfo(1, "b", "G", util=0, processes=[]),
                            GpuInfo(2, "c", "G", util=0, processes=[GpuProcess(3, uid=1000)]),
                            GpuInfo(3, "d", "G")), (), True)
    atts = attribute_all(s, [booking(1000, [0, 2])], NOW)
    states = [telemetry.gpu_state(g, atts) for g in s.gpus]
    assert states == ["unreserved-use", "idle", "busy", "unknown"]


def test_a_running_container_is_not_credited_to_a_booking_that_starts_now():
    """A root container already running when bob books GPU 0 was not started
    under bob's booking: bob is warned of it rather than credited with it."""
    s = snap_of([GpuProcess(7, uid=0, user="root", container=DOCKER, mem_mib=900)])
    new = booking(2000, [0], start=NOW)
    got = telemetry.intruders(s, [new], booking=new, now=NOW)
    assert [(x.gpu, x.users, x.pids) for x in got] == [(0, ("root",), (7,))]
    # Alice holds GPU 0 already: the container is hers (inferred), not an intruder for bob's shared booking...
    alice = booking(1000, [0])
    assert telemetry.intruders(s, [alice, new], booking=new, now=NOW) == []
    # ...but it is for an exclusive one.
    excl = booking(2000, [0], start=NOW, mode="exclusive")
    assert len(telemetry.intruders(s, [alice, excl], booking=excl, now=NOW)) == 1
    # Owners bk could not read, or knows only by number, are named as such.
    s = snap_of([GpuProcess(8), GpuProcess(9, uid=4321)])
    (x,) = telemetry.intruders(s, [new], booking=new, now=NOW)
    assert x.users == ("an unknown user", "uid 4321") and x.count == 2


# ----------------------------------------------------------------- placement

def test_placement_puts_an_unreserved_gpu_after_every_other_busy_one():
    from bk.core import scheduler
    from bk.core.models import Policy

    # GPU 0: someone without a booking; GPU 1: a booked user's process at higher utilisation.
    s = Snapshot(NOW, "t", (GpuInfo(0, "a", "G", util=10, processes=[GpuProcess(1, uid=3000)]),
                            GpuInfo(1, "b", "G", util=90, processes=[GpuProcess(2, uid=1000)])), (), True)
    holds = [booking(1000, [1])]
    req = scheduler.Request(count=1, duration=3600, mode="shared", share=1)
    policy = Policy(gpu_count=2, max_shared_users=2)

    def place(uid):
        load = telemetry.placement_load(s, holds, NOW, uid=uid)
        return scheduler.place(req, reservations=holds, blackouts=[], policy=policy, gpus=list(s.gpus),
                               now=NOW, load=load).gpus
    assert place(2000) == (1,)
    assert place(3000) == (0,)        # the user's own unbooked process is why they book: not avoided
    assert telemetry.placement_load(s, holds, NOW) == {0: pytest.approx(1.1), 1: pytest.approx(0.9)}


# ------------------------------------------------- real processes, real users

SCRIPT = "import sys, time\nsys.stdout.write('up\\n'); sys.stdout.flush()\ntime.sleep(120)\n"


def _start_as(account, script: Path, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen(["/usr/bin/python3", str(script), *args], user=account.uid, group=account.gid,
                            extra_groups=[], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd="/")
    assert proc.stdout.readline() == b"up\n"       # running its script, not still exec-ing
    return proc


@pytest.mark.root
def test_real_processes_of_real_users(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to create users")
    sys.path.insert(0, str(Path(__file__).parent))
    from helpers_broker import Accounts, make_base

    base = make_base()
    accounts = Accounts(base)
    procs = []
    try:
        alice, bob = accounts.user(), accounts.user()
        script = base / "train.py"
        script.write_text(SCRIPT)
        os.chmod(script, 0o644)
        before = int(time.time())
        pa = _start_as(alice, script, "--api-key", "hunter2")
        pb = _start_as(bob, script)
        procs += [pa, pb]
        info = ProcInfo("/proc")
        ua, na, la, sa, ca = info.describe(pa.pid)
        assert (ua, na, la) == (alice.uid, alice.name, "python3 train.py")
        assert before - 2 <= sa <= int(time.time()) + 1
        assert "hunter2" not in la and ca is None
        # Judged against the ledger: alice booked GPU 0, bob booked nothing.
        s = Snapshot(NOW, "t", (GpuInfo(0, "a", "G", processes=[info.fill(GpuProcess(pa.pid, mem_mib=10)),
                                                              info.fill(GpuProcess(pb.pid, mem_mib=20))]),))
        got = attribute_all(s, [booking(alice.uid, [0], user=alice.name)], NOW)
        assert got[(0, pa.pid)] == Attribution("ok", "verified", alice.uid)
        assert got[(0, pb.pid)] == Attribution("unreserved", "verified", bob.uid)
        # After it ends, its PID reads as unknown, never as the previous owner.
        pb.kill()
        pb.wait()
        assert info.describe(pb.pid)[0] is None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        accounts.cleanup()
        import shutil

        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.root
def test_a_real_process_in_a_real_docker_named_cgroup():
    """The kernel's own /proc/PID/cgroup for a process moved into a cgroup
    named as Docker names them (v1 ``/docker/<id>``, the pids controller),
    read back by ProcInfo: a root process there is a container process."""
    hier = Path("/sys/fs/cgroup/pids")
    if os.geteuid() != 0 or not (hier / "cgroup.procs").exists():
        pytest.skip("needs root and a cgroup v1 pids hierarchy")
    cid = secrets.token_hex(32)
    group = hier / "docker" / cid
    made_parent = not group.parent.exists()
    try:
        group.mkdir(parents=True)
    except OSError as e:
        pytest.skip(f"cannot create a cgroup here: {e}")
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout.readline() == b"up\n"
        (group / "cgroup.procs").write_text(str(proc.pid))
        uid, _, label, _, container = ProcInfo().describe(proc.pid)
        assert container == f"docker:{cid[:12]}" and uid == os.getuid() and label == Path(sys.executable).name
    finally:
        try:
            (hier / "cgroup.procs").write_text(str(proc.pid))    # back to the root group before removal
        except OSError:
            pass
        proc.kill()
        proc.wait()
        for d in (group, group.parent) if made_parent else (group,):
            try:
                d.rmdir()
            except OSError:
                pass


# ------------------------------------------------------- the simulation file

def test_sim_file_real_pids_are_filled_from_proc_and_fields_checked(tmp_path):
    import json

    from bk.core.errors import ConfigError
    from bk.gpu.sim import FileBackend

    proc = tmp_path / "proc"
    fake_proc(proc, 300, uid=1234, argv=("bash", "-c", "secret"), cgroup=f"0::/machine.slice/libpod-{HEX}.scope\n")
    fake_proc(proc, 301, uid=1234)
    doc = {"gpus": [{"processes": [
        {"pid": 300, "proc": True},                                  # real: from /proc
        {"pid": 301, "uid": 7, "user": "given", "since": 5},         # fictional: as written
        {"pid": 302, "since": "2026-07-13T09:00:00Z", "container": "docker:0123456789ab"}]}]}
    path = tmp_path / "sim.json"
    path.write_text(json.dumps(doc))
    b = FileBackend(str(path), proc_root=str(proc))
    a, f, s = b.snapshot(0).gpus[0].processes
    assert (a.uid, a.label, a.since, a.container) == (1234, "bash", BTIME + 500, "podman:3f2a9c1b12ab")
    assert (f.uid, f.user, f.label, f.since, f.container) == (7, "given", None, 5, None)
    assert (s.uid, s.since, s.container) == (None, parse_iso("2026-07-13T09:00:00Z"), "docker:0123456789ab")
    assert b.inventory().gpus[0].processes is None          # the inventory never reads /proc
    for bad in ({"pid": 1, "since": "yesterday"}, {"pid": 1, "container": 5}, {"pid": 1, "proc": "yes"},
                {"pid": 1, "label": ["x"]}):
        path.write_text(json.dumps({"gpus": [{"processes": [bad]}]}))
        with pytest.raises(ConfigError):
            FileBackend(str(path), proc_root=str(proc)).snapshot(0)


def test_placement_reasons_say_used_without_a_booking():
    from bk.core import scheduler
    from bk.core.models import Policy

    s = Snapshot(NOW, "t", (GpuInfo(0, "a", "G", util=10, processes=[GpuProcess(1, uid=3000)]),
                            GpuInfo(1, "b", "G", util=0, processes=[])), (), True)
    p = scheduler.place(scheduler.Request(count=1, duration=3600), reservations=[], blackouts=[],
                        policy=Policy(gpu_count=2), gpus=list(s.gpus), now=NOW,
                        load=telemetry.placement_load(s, [], NOW))
    assert p.gpus == (1,)
    assert p.reasons[0].startswith("free, not needed: priority 0, busy, used without a booking, load 0.10")
