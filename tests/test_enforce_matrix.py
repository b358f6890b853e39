"""The escape matrix of hard enforcement (issue 31), played for real.

One throwaway shared server (``helpers_broker.site``: the built ``bk.pyz``,
a broker and a monitor running as a throwaway service account, real users
booking through the broker) and one private cgroup subtree laid out as
systemd would (``user.slice/user-UID.slice/session-N.scope``, a delegated
``user@UID.service``, ``system.slice/cron.service``, a Docker scope).  The
enforcer runs as root exactly as its unit runs it (``bk.pyz admin enforce
run``), in its own mount and cgroup namespaces, where cgroup v2 is mounted
at ``/sys/fs/cgroup`` with the test subtree as its root: what it sees is a
systemd host.  GPUs are device nodes made with ``mknod`` (char 195:N) in a
temporary directory: an open the programs allow fails with ENXIO (no
driver), one they refuse with EPERM.

Every row of the matrix is a long-lived process, started the way its real
counterpart is and left running across the phases, that opens the nodes
whenever the test asks (a request file in its directory):

* a shell in the user's session scope;
* a tmux server (it forks, calls setsid and stays in the session's cgroup);
* a ``systemd --user`` style child: the user's own manager, in the
  delegated ``user@UID.service``, makes a cgroup of its own and moves its
  child there;
* a cron style child: a root daemon in ``system.slice/cron.service`` forks
  a job that moves into a new session scope (as pam_systemd does), then
  becomes the user;
* a double-forked and a setsid daemon;
* a root process in a Docker scope, credited to the user by the monitor's
  judgement (its process seen on the GPU she alone holds);
* a second user's shell, on the GPU the first has booked.

Phases: no booking (all refused, the uncredited container aside: not
governed); alice books GPU 0 shared (all of hers allowed on 0, refused on
1; bob refused on 0); bob shares GPU 0 (bob allowed); alice cancels (all of
hers refused again, the container included: its credit lasts; bob still
allowed).  ``nvidiactl`` is open throughout.  Then ``bk admin enforce off``
stops the enforcer and leaves no program attached.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers_broker import SYSTEM_PYTHON, needs_root, site
from tests.helpers_enforce import TestCgroup, mknod, needs_kernel, wait

pytestmark = [needs_root, needs_kernel(), pytest.mark.root,
              pytest.mark.skipif(not shutil.which("unshare") or not shutil.which("setpriv"),
                                 reason="needs unshare(1) and setpriv(1) (util-linux)")]

AGENT = r"""
import errno, os, signal, sys, time
mode, d = sys.argv[1], sys.argv[2]
devs = sys.argv[3:]
if mode == "double":
    if os.fork(): os._exit(0)
    if os.fork(): os._exit(0)
elif mode == "setsid":
    if os.fork(): os._exit(0)
    os.setsid()
    if os.fork(): os._exit(0)
elif mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode in ("double", "setsid"):
    for fd in (0, 1, 2):
        os.dup2(os.open(os.devnull, os.O_RDWR), fd)
with open(os.path.join(d, "pid.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(d, "pid.tmp"), os.path.join(d, "pid"))
held = []
while True:
    for name in sorted(os.listdir(d)):
        if name.startswith("req-") and not os.path.exists(os.path.join(d, "res-" + name[4:])):
            out = []
            for p in devs:
                try:
                    fd = os.open(p, os.O_RDWR)
                    out.append("opened")
                    if mode == "stubborn":
                        held.append(fd)
                    else:
                        os.close(fd)
                except OSError as e:
                    out.append(errno.errorcode.get(e.errno, str(e.errno)))
            with open(os.path.join(d, "res.tmp"), "w") as f:
                f.write(" ".join(out))
            os.replace(os.path.join(d, "res.tmp"), os.path.join(d, "res-" + name[4:]))
    time.sleep(0.02)
"""

MANAGER = r"""
# A user's service manager, as systemd --user behaves: it owns its
# delegated cgroup, makes one per unit and moves each unit's process there.
import os, sys
svc, agent = sys.argv[1], sys.argv[2:]
unit = os.path.join(svc, "app.slice", "probe.service")
os.makedirs(unit, exist_ok=True)
pid = os.fork()
if pid == 0:
    with open(os.path.join(unit, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    os.execv(agent[0], agent)
os.waitpid(pid, 0)
"""


class Agent:
    def __init__(self, world, name: str, owner):
        self.world, self.name, self.owner = world, name, owner
        self.dir = world.base / "agents" / name
        self.dir.mkdir(parents=True)
        if owner is not None:
            os.chown(self.dir, owner.uid, owner.gid)
        os.chmod(self.dir, 0o700)
        self.n = 0

    def argv(self, mode: str = "plain") -> list[str]:
        return [SYSTEM_PYTHON, str(self.world.agent_py), mode, str(self.dir), *map(str, self.world.devs)]

    def pid(self) -> int:
        return int(wait(lambda: (self.dir / "pid").exists() and (self.dir / "pid").read_text(), 30,
                        f"agent {self.name} to start"))

    def ask(self) -> list[str]:
        """Open GPU 0, GPU 1 and nvidiactl now; what each open said."""
        self.n += 1
        (self.dir / f"req-{self.n}").write_text("")
        res = self.dir / f"res-{self.n}"
        return wait(lambda: res.exists() and res.read_text().split(), 30, f"agent {self.name} to answer")


class World:
    """Accounts, the site, the cgroup tree, the nodes, the agents."""

    def __init__(self, s):
        self.s, self.base = s, s.base
        self.alice, self.bob = s.accounts.user(), s.accounts.user()
        self.cg = TestCgroup()
        dev = self.base / "dev"
        dev.mkdir()
        self.devs = [mknod(dev, 0), mknod(dev, 1), mknod(dev, 255)]
        self.agent_py = self.base / "agent.py"
        self.agent_py.write_text(AGENT)
        self.manager_py = self.base / "manager.py"
        self.manager_py.write_text(MANAGER)
        for p in (self.agent_py, self.manager_py):
            os.chmod(p, 0o644)
        self.docker = f"system.slice/docker-{secrets.token_hex(32)}.scope"
        self.procs: list[subprocess.Popen] = []
        self.enforcer: subprocess.Popen | None = None
        self.monitor: subprocess.Popen | None = None
        self.state_dir = self.base / "enforcer"
        self.sim = self.base / "sim.json"

    def slice_of(self, who) -> str:
        return f"user.slice/user-{who.uid}.slice"

    def env(self, who) -> dict:
        # SHELL: the throwaway accounts' login shell is nologin, and tmux runs its commands with SHELL.
        return {"PATH": "/usr/bin:/bin", "HOME": who.home if who else "/root", "LANG": "C.UTF-8", "TERM": "xterm",
                "SHELL": "/bin/sh"}

    def spawn(self, cgroup_rel: str, argv: list[str], who=None) -> subprocess.Popen:
        """Start ``argv`` in ``cgroup_rel`` (moved there by root, as sshd,
        logind or a runtime would), then as ``who`` (None: root)."""
        cg = self.cg.make(cgroup_rel)
        drop = ["setpriv", f"--reuid={who.uid}", f"--regid={who.gid}", "--clear-groups", "--"] if who else []
        p = subprocess.Popen(["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cg / "cgroup.procs"),
                              *drop, *argv], env=self.env(who), cwd="/", stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)
        return p

    # -- bk -----------------------------------------------------------------

    def book(self, who, *args) -> str:
        rc, env = self.s.run_json(who, "1", "30m", "-g", "0", *args)
        assert rc == 0, env
        return env["data"]["reservation"]["id"]

    def cancel(self, who, rid: str) -> None:
        rc, env = self.s.run_json(who, "d", rid, "-y")
        assert rc == 0, env

    def status(self) -> dict:
        p = self.state_dir / "status.json"
        return json.loads(p.read_text()) if p.exists() else {}

    def wait_gpus(self, cgroup: str, gpus: list[int], timeout: float = 30) -> dict:
        """Until the enforcer says ``cgroup`` may open exactly ``gpus``."""
        def ok():
            for t in self.status().get("targets", []):
                if t["cgroup"] == cgroup and t["gpus"] == gpus and t["attached"]:
                    return t
            return None
        return wait(ok, timeout, f"the enforcer to let {cgroup} open {gpus}: {self.status()}")

    def set_sim(self, pids_on_gpu0: list[int]) -> None:
        """The GPUs the monitor sees: four, with these real processes on GPU 0."""
        doc = {"proc": True, "gpus": [
            {"name": "sim", "mem_total_mib": 40960, "processes": [{"pid": p, "mem_mib": 10} for p in pids_on_gpu0]},
            *({"name": "sim", "mem_total_mib": 40960, "processes": []} for _ in range(3))]}
        tmp = self.sim.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.sim)

    def start_monitor(self) -> None:
        env = self.s.env(self.s.service) | {"BK_GPU_SIM_FILE": str(self.sim)}
        log = open(self.base / "monitor.log", "wb")
        self.monitor = subprocess.Popen([SYSTEM_PYTHON, str(self.s.pyz), "m", "--interval", "0.5"], env=env,
                                        cwd=self.base, stdout=log, stderr=subprocess.STDOUT,
                                        **self.s.popen_args(self.s.service))

    def ns_argv(self, unit: str, argv: list[str]) -> list[str]:
        """``argv`` as root, as on a systemd host: in its own mount and cgroup
        namespaces, where cgroup v2 is mounted on /sys/fs/cgroup with the test
        subtree as its root, in ``system.slice/UNIT``."""
        self.cg.make(f"system.slice/{unit}")
        inner = (f'mount -t cgroup2 cgroup2 /sys/fs/cgroup && '
                 f'echo $$ > /sys/fs/cgroup/system.slice/{unit}/cgroup.procs && exec "$@"')
        outer = ('procs="$0"; inner="$1"; shift; echo $$ > "$procs" && '
                 'exec unshare --mount --cgroup --propagation private /bin/sh -c "$inner" sh "$@"')
        return ["/bin/sh", "-c", outer, str(self.cg.path / "cgroup.procs"), inner, *argv]

    def root_env(self) -> dict:
        return {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": "/root", "LANG": "C.UTF-8", "TZ": "UTC",
                "BK_CONFIG_FILE": str(self.s.config)}

    def admin(self, *args: str) -> subprocess.CompletedProcess:
        """``bk ARGS`` as root, seeing the cgroup tree the enforcer sees."""
        return subprocess.run(self.ns_argv(f"bk-admin-{secrets.token_hex(2)}.scope",
                                           [SYSTEM_PYTHON, str(self.s.pyz), *args]),
                              capture_output=True, text=True, timeout=120, env=self.root_env(), cwd="/")

    def admin_json(self, *args: str) -> tuple[int, dict]:
        p = self.admin("--json", *args)
        try:
            return p.returncode, json.loads(p.stdout)
        except ValueError:
            raise AssertionError(f"bk {' '.join(args)}: not JSON (rc {p.returncode}): {p.stdout!r} {p.stderr!r}") \
                from None

    def start_enforcer(self, *flags: str) -> None:
        """As the unit runs it, in namespaces of its own (``ns_argv``)."""
        log = open(self.base / "enforcer.log", "ab")
        self.enforcer = subprocess.Popen(
            self.ns_argv("gpubk-enforcer.service", [SYSTEM_PYTHON, str(self.s.pyz), "admin", "enforce", "run", *flags]),
            env=self.root_env(), cwd="/", stdout=log, stderr=subprocess.STDOUT)
        wait(lambda: self.status().get("state") == "enforcing" and self.status().get("pid") == self.enforcer.pid
             or self._died(), 60, "the enforcer to enforce")
        assert self.enforcer.poll() is None, self.log()

    def _died(self):
        if self.enforcer.poll() is not None:
            raise AssertionError(f"the enforcer exited {self.enforcer.returncode}:\n{self.log()}")
        return False

    def log(self) -> str:
        p = self.base / "enforcer.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def configure(self, **keys) -> None:
        doc = json.loads(self.s.config.read_text())
        doc.update(keys)
        tmp = self.s.config.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.s.config)

    def close(self) -> None:
        for p in [self.enforcer, self.monitor, *self.procs]:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        self.cg.cleanup()


@pytest.fixture(scope="module")
def world():
    with site(gpu_count=4) as s:
        w = World(s)
        try:
            p = s.init("--slot-minutes", "1")
            assert p.returncode == 0, p.stderr
            s.start_broker()
            os.makedirs(w.state_dir, mode=0o755)
            w.configure(enforce_state_dir=str(w.state_dir))
            w.set_sim([])
            w.start_monitor()
            yield w
        finally:
            w.close()


def _rows(w: World) -> dict[str, Agent]:
    """Start every row of the matrix; each agent opens [GPU 0, GPU 1, nvidiactl]."""
    a, b = w.alice, w.bob
    rows = {}
    session = w.slice_of(a) + "/session-1.scope"

    rows["shell"] = ag = Agent(w, "shell", a)
    w.spawn(session, ["/bin/bash", "-c", " ".join(ag.argv()) + "; true"], a)

    rows["tmux"] = ag = Agent(w, "tmux", a)
    w.spawn(session, ["tmux", "-S", str(ag.dir / "sock"), "-f", "/dev/null", "new-session", "-d",
                      " ".join(ag.argv())], a)

    rows["systemd --user child"] = ag = Agent(w, "user-manager", a)
    svc = w.cg.make(w.slice_of(a) + f"/user@{a.uid}.service")
    w.cg.make(w.slice_of(a) + f"/user@{a.uid}.service/init.scope")
    for d, _subdirs, files in os.walk(svc):                 # Delegate=yes: the subtree is the user's
        os.chown(d, a.uid, a.gid)
        for f in ("cgroup.procs", "cgroup.subtree_control", "cgroup.threads"):
            if f in files:
                os.chown(os.path.join(d, f), a.uid, a.gid)
    # systemd starts the manager in init.scope and drops to the user; the manager
    # (the user) makes its own cgroups below and moves its children there.
    w.spawn(w.slice_of(a) + f"/user@{a.uid}.service/init.scope",
            [SYSTEM_PYTHON, str(w.manager_py), str(svc), *ag.argv()], a)

    rows["cron child"] = ag = Agent(w, "cron", a)
    job = w.cg.make(w.slice_of(a) + "/session-c1.scope")
    w.spawn("system.slice/cron.service",
            ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(job / "cgroup.procs"),
             "setpriv", f"--reuid={a.uid}", f"--regid={a.gid}", "--clear-groups", "--", *ag.argv()])

    rows["double fork"] = ag = Agent(w, "double", a)
    w.spawn(session, ag.argv("double"), a)

    rows["setsid daemon"] = ag = Agent(w, "setsid", a)
    w.spawn(session, ag.argv("setsid"), a)

    rows["root in a container"] = ag = Agent(w, "docker", None)
    w.spawn(w.docker, ag.argv())

    rows["second user"] = ag = Agent(w, "bob", b)
    w.spawn(w.slice_of(b) + "/session-2.scope", ag.argv(), b)
    for ag in rows.values():
        ag.pid()
    return rows


def _matrix(rows: dict[str, Agent]) -> dict[str, list[str]]:
    return {name: ag.ask() for name, ag in rows.items()}


def test_the_escape_matrix(world):
    w = world
    a, b = w.alice, w.bob
    rows = _rows(w)
    docker_agent = rows["root in a container"]
    w.set_sim([docker_agent.pid()])           # the container's process runs on GPU 0, as the monitor sees

    before = _matrix(rows)
    assert all(r == ["ENXIO", "ENXIO", "ENXIO"] for r in before.values()), before   # nothing enforced yet

    rc, plan = w.admin_json("admin", "enforce", "on", "--dry-run")
    assert rc == 0 and plan["data"]["dry_run"] is True, plan
    assert {(u["uid"], tuple(u["loses"])) for u in plan["data"]["plan"]} == {(a.uid, (0, 1, 2, 3)), (b.uid, (0, 1, 2, 3))}
    assert json.loads(w.s.config.read_text()).get("enforce") is not True        # a dry run changes nothing
    p = w.admin("--json", "admin", "enforce", "on", "--yes")
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(w.s.config.read_text())["enforce"] is True
    w.start_enforcer()
    w.wait_gpus(w.slice_of(a), [])
    w.wait_gpus(w.slice_of(b), [])
    assert w.docker in [u["cgroup"] for u in w.status()["uncredited"]]      # no user seen in it yet
    report = {"no booking": _matrix(rows)}

    alice_booking = w.book(a)                                    # shared GPU 0, starting now
    w.wait_gpus(w.slice_of(a), [0])
    w.wait_gpus(w.docker, [0], timeout=60)                       # credited through the monitor's judgement
    report["alice books GPU 0"] = _matrix(rows)

    bob_booking = w.book(b)                                      # the second share of GPU 0
    w.wait_gpus(w.slice_of(b), [0])
    report["bob shares GPU 0"] = _matrix(rows)

    w.cancel(a, alice_booking)
    w.wait_gpus(w.slice_of(a), [])
    w.wait_gpus(w.docker, [])
    report["alice cancels"] = _matrix(rows)
    for phase, got in report.items():
        print(f"{phase}:")
        for name, res in got.items():
            print(f"  {name:22s} GPU0 {res[0]:6s} GPU1 {res[1]:6s} nvidiactl {res[2]}")

    alices = [n for n in rows if n not in ("second user", "root in a container")]
    for name in alices:
        assert report["no booking"][name] == ["EPERM", "EPERM", "ENXIO"], (name, report)
        assert report["alice books GPU 0"][name] == ["ENXIO", "EPERM", "ENXIO"], (name, report)
        assert report["alice cancels"][name] == ["EPERM", "EPERM", "ENXIO"], (name, report)
    # The container is governed once credited, and its credit outlives the booking that gave it.
    assert report["no booking"]["root in a container"] == ["ENXIO", "ENXIO", "ENXIO"]
    assert report["alice books GPU 0"]["root in a container"] == ["ENXIO", "EPERM", "ENXIO"]
    assert report["alice cancels"]["root in a container"] == ["EPERM", "EPERM", "ENXIO"]
    # The second user: refused on alice's GPU until she books a share of it herself.
    assert report["no booking"]["second user"] == ["EPERM", "EPERM", "ENXIO"]
    assert report["alice books GPU 0"]["second user"] == ["EPERM", "EPERM", "ENXIO"]
    assert report["bob shares GPU 0"]["second user"] == ["ENXIO", "EPERM", "ENXIO"]
    assert report["alice cancels"]["second user"] == ["ENXIO", "EPERM", "ENXIO"]

    # What the administrator sees: status as an ordinary user and as root, doctor as root.
    p = w.admin("admin", "enforce", "status")
    print(p.stdout)
    assert p.returncode == 0 and p.stdout.startswith("ok: enforcing on 3 cgroups of 2 users"), p.stdout
    assert f"user.slice/user-{b.uid}.slice: {b.name} (uid {b.uid}) may open GPU 0" in p.stdout, p.stdout
    p = w.admin("admin", "enforce", "on", "--dry-run")
    print(p.stdout)
    assert f"{b.name} (uid {b.uid}): keeps GPU 0, loses GPUs 1, 2, 3" in p.stdout, p.stdout
    rc, st = w.s.run_json(a, "admin", "enforce", "status")
    assert rc == 0 and st["data"]["enforcer"] == "enforcing" and st["data"]["verdict"]["ok"], st
    rc, st = w.admin_json("admin", "enforce", "status")
    slices = {os.stat(w.cg.path / w.slice_of(u)).st_ino for u in (a, b)}
    assert rc == 0 and {x["id"] for x in st["data"]["attached"]} >= slices, st
    assert {x["cgroup"] for x in st["data"]["attached"]} >= {w.slice_of(a), w.slice_of(b), w.docker}
    rc, doc = w.admin_json("doctor")
    checks = {c["name"]: c for c in doc["data"]["checks"]}
    assert checks["enforcer"]["ok"] and checks["enforce_kernel"]["ok"] and checks["enforce_cgroup"]["ok"], checks

    # Off: the enforcer stops, and nothing is left attached anywhere.
    rc, off = w.admin_json("admin", "enforce", "off", "--dry-run")
    assert rc == 0 and len(off["data"]["attached"]) >= 3 and w.enforcer.poll() is None, off
    rc, off = w.admin_json("admin", "enforce", "off", "--yes")
    assert rc == 0, off
    assert off["data"]["left"] == [] and not off["data"]["problems"], off
    w.enforcer.wait(timeout=30)
    assert json.loads(w.s.config.read_text())["enforce"] is False
    assert all(r == ["ENXIO", "ENXIO", "ENXIO"] for r in _matrix(rows).values())
    from bk.enforce import kernel

    for d, _subdirs, _files in os.walk(w.cg.path):
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert kernel.query(fd).ids == (), d
        finally:
            os.close(fd)
    events = [json.loads(x)["event"] for x in (w.state_dir / "events.jsonl").read_text().splitlines()]
    assert "credit" in events and events[-1] == "stopped"
    w.cancel(b, bob_booking)


# ------------------------------------------------------------------ failing

def _shell(w: World, who, tag: str, mode: str = "plain") -> Agent:
    ag = Agent(w, f"{tag}-{secrets.token_hex(2)}", who)
    w.spawn(w.slice_of(who) + f"/session-{tag}.scope", ag.argv(mode), who)
    ag.pid()
    return ag


def _kill_enforcer(w: World) -> None:
    w.enforcer.kill()                              # SIGKILL: no chance to clean up
    w.enforcer.wait(timeout=30)


def _slice_programs(w: World, who) -> tuple:
    from bk.enforce import kernel

    fd = os.open(w.cg.path / w.slice_of(who), os.O_RDONLY | os.O_DIRECTORY)
    try:
        return kernel.query(fd).ids
    finally:
        os.close(fd)


def test_a_killed_enforcer_fails_open_by_default_and_closed_on_request(world):
    w = world
    a = w.alice
    rid = w.book(a)
    try:
        ag = _shell(w, a, "fail")
        # Open (the default): the programs hang on the enforcer's links.
        w.configure(enforce=True, enforce_failure="open")
        w.start_enforcer("--lease", "6")
        w.wait_gpus(w.slice_of(a), [0])
        assert ag.ask() == ["ENXIO", "EPERM", "ENXIO"]
        _kill_enforcer(w)
        assert wait(lambda: ag.ask() == ["ENXIO", "ENXIO", "ENXIO"], 30, "every GPU to open")
        assert _slice_programs(w, a) == ()
        rc, doc = w.admin_json("doctor")
        checks = {c["name"]: c for c in doc["data"]["checks"]}
        assert not checks["enforcer"]["ok"] and "stale" in checks["enforcer"]["detail"], checks["enforcer"]

        # Closed: plain attachments outlive the enforcer, and close at their lease's end.
        w.configure(enforce_failure="closed")
        w.start_enforcer("--lease", "6")
        w.wait_gpus(w.slice_of(a), [0])
        assert ag.ask() == ["ENXIO", "EPERM", "ENXIO"]
        _kill_enforcer(w)
        assert ag.ask() == ["ENXIO", "EPERM", "ENXIO"]         # the bookings still rule, for the lease
        assert wait(lambda: ag.ask() == ["EPERM", "EPERM", "ENXIO"], 30, "every managed GPU to close")
        # A new enforcer replaces the programs it finds instead of adding to them.
        before = _slice_programs(w, a)
        assert len(before) == 1
        w.start_enforcer("--lease", "6")
        assert wait(lambda: ag.ask() == ["ENXIO", "EPERM", "ENXIO"], 30, "the booking to rule again")
        after = _slice_programs(w, a)
        assert len(after) == 1 and after != before
        rc, off = w.admin_json("admin", "enforce", "off", "--yes")
        assert rc == 0 and off["data"]["left"] == [], off
        w.enforcer.wait(timeout=30)
        # Closed mode's attachments outlive a stop too, so off swept them itself.
        assert _slice_programs(w, a) == () and ag.ask() == ["ENXIO", "ENXIO", "ENXIO"]
    finally:
        w.configure(enforce=False, enforce_failure="open")
        w.cancel(a, rid)


def test_an_unreadable_ledger_fails_open_after_the_lease(world):
    w = world
    a = w.alice
    rid = w.book(a)
    ledger = w.s.data / "ledger.json"
    try:
        ag = _shell(w, a, "ledger")
        w.configure(enforce=True, enforce_failure="open")
        w.start_enforcer("--lease", "6")
        w.wait_gpus(w.slice_of(a), [0])
        assert ag.ask() == ["ENXIO", "EPERM", "ENXIO"]
        os.chown(ledger, 0, 0)                     # not the service account's: no reader believes it
        wait(lambda: w.status().get("state") == "failing-open", 30, "the enforcer to fail open")
        assert ag.ask() == ["ENXIO", "ENXIO", "ENXIO"] and _slice_programs(w, a) == ()
        rc, st = w.admin_json("admin", "enforce", "status")
        assert rc == 1 and not st["data"]["verdict"]["ok"] and "failing-open" in st["data"]["verdict"]["detail"]
        os.chown(ledger, w.s.service.uid, w.s.service.gid)
        w.wait_gpus(w.slice_of(a), [0])
        assert ag.ask() == ["ENXIO", "EPERM", "ENXIO"]
        events = [json.loads(x)["event"] for x in (w.state_dir / "events.jsonl").read_text().splitlines()]
        assert events.index("ledger-unreadable") < events.index("fail-open") < len(events) - 1
        assert "enforcing" in events[events.index("fail-open"):]
        rc, off = w.admin_json("admin", "enforce", "off", "--yes")
        assert rc == 0, off
        w.enforcer.wait(timeout=30)
    finally:
        os.chown(ledger, w.s.service.uid, w.s.service.gid)
        w.configure(enforce=False)
        w.cancel(a, rid)


def test_processes_that_keep_a_gpu_after_the_booking_are_signalled_when_asked(world):
    """The kernel checks at open: what was opened stays open.  With
    enforce_signal the enforcer sends SIGTERM, then SIGKILL after the grace,
    to processes the monitor sees on a GPU their owner no longer holds."""
    w = world
    a = w.alice
    rid = w.book(a)
    ag_polite = _shell(w, a, "polite")
    ag_stubborn = _shell(w, a, "stubborn", mode="stubborn")
    w.set_sim([ag_polite.pid(), ag_stubborn.pid()])
    try:
        w.configure(enforce=True, enforce_failure="open", enforce_signal=True, enforce_signal_grace_seconds=2)
        w.start_enforcer()
        w.wait_gpus(w.slice_of(a), [0])
        # Allowed while booked; with no driver nothing stays open, so the monitor's
        # view (the simulation lists both on GPU 0) stands for the descriptor they hold.
        assert ag_stubborn.ask() == ["ENXIO", "EPERM", "ENXIO"]
        w.cancel(a, rid)
        polite, stubborn = ag_polite.pid(), ag_stubborn.pid()

        def gone(pid):
            try:
                os.kill(pid, 0)
                return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
            except (ProcessLookupError, FileNotFoundError):
                return True

        def sent():
            events = [json.loads(x) for x in (w.state_dir / "events.jsonl").read_text().splitlines()]
            return events, [(e["event"], e["pid"]) for e in events if e["event"] in ("term", "kill")]

        # The event is written just after the signal is sent: wait for both.
        wait(lambda: gone(polite) and gone(stubborn) and ("kill", stubborn) in sent()[1], 60,
             "both holders to be stopped")
        events, sent = sent()
        assert ("term", polite) in sent and ("term", stubborn) in sent and ("kill", stubborn) in sent, sent
        assert ("kill", polite) not in sent                            # SIGTERM was enough
        assert all(e["uid"] == a.uid and e["gpu"] == 0 for e in events if e["event"] in ("term", "kill"))
        rc, st = w.s.run_json(a, "admin", "enforce", "status")       # the owner reads what was done
        assert {e["event"] for e in st["data"]["events"]} >= {"term", "kill"}
        rc, off = w.admin_json("admin", "enforce", "off", "--yes")
        assert rc == 0, off
        w.enforcer.wait(timeout=30)
    finally:
        w.configure(enforce=False, enforce_signal=False)
