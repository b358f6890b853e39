"""The escape matrix of hard enforcement on a real GPU server, with CUDA (issue 31).

    sudo python3 benchmarks/enforce_gpu.py [--gpu 0] [--other 1] [--turn-on] [--image IMAGE] [--json]

What ``tests/test_enforce_matrix.py`` plays with ``mknod`` nodes and a
hand-built cgroup tree, this plays on an installed shared server (``sudo
bk admin install``) with systemd, the NVIDIA driver and ``libcuda.so.1``:
the real sessions systemd makes, the real ``/dev/nvidiaN`` and CUDA itself.
It needs root, ``useradd``, ``runuser`` and two GPUs (``--gpu`` and
``--other``); with ``--turn-on`` it runs ``bk admin enforce on --yes``
first and ``bk admin enforce off --yes`` at the end, otherwise enforcement
must already be on.  It creates two throwaway users (removed at the end)
and books through ``bk`` as them.

Each row is a probe started the way its real counterpart starts, by the
first user unless it says otherwise; the probe opens ``/dev/nvidiaN`` of
both GPUs and asks CUDA (``cuInit``, ``cuDeviceGetCount``, and a context on
every device it lists):

* shell: ``runuser -l USER`` (PAM: a session scope in ``user-UID.slice``);
* tmux: a tmux server started from such a session;
* systemd --user: ``systemd-run --user -M USER@ --wait --pipe`` (lingering
  is enabled for the run);
* cron (at): ``at now`` when atd runs (PAM, like cron);
* double fork and setsid daemon, from a session;
* root in a container: ``docker run --gpus all IMAGE`` when ``--image``
  names one with python3 (credited once the monitor sees it on the GPU
  the user alone holds);
* second user: the other user's shell, on the GPU the first has booked.

Phases: no booking; the first user books ``--gpu`` (shared); the second
user shares it too; the first user cancels.  Expected: a probe may open
``--gpu`` exactly while its user holds a booking on it, and never
``--other``; CUDA lists (and creates contexts on) only the GPUs the probe
may open.  The table says what was seen; the exit status is 1 when a raw
open contradicts the rule.  A report, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import time

PROBE = r"""
import ctypes, errno, json, os, sys
gpus = [int(x) for x in sys.argv[1].split(",")]
out = {"open": {}, "cuda": None}
for n in gpus:
    try:
        os.close(os.open(f"/dev/nvidia{n}", os.O_RDWR))
        out["open"][str(n)] = "ok"
    except OSError as e:
        out["open"][str(n)] = errno.errorcode.get(e.errno, str(e.errno))
try:
    cu = ctypes.CDLL("libcuda.so.1")
    rc = cu.cuInit(0)
    count = ctypes.c_int(0)
    if rc == 0:
        cu.cuDeviceGetCount(ctypes.byref(count))
    devs = []
    for i in range(count.value):
        dev = ctypes.c_int()
        cu.cuDeviceGet(ctypes.byref(dev), i)
        bus = ctypes.create_string_buffer(32)
        cu.cuDeviceGetPCIBusId(bus, 32, dev)
        ctx = ctypes.c_void_p()
        r = cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
        if r == 0:
            cu.cuCtxDestroy_v2(ctx)
        devs.append({"bus": bus.value.decode().lower(), "context": r})
    out["cuda"] = {"init": rc, "count": count.value, "devices": devs}
except OSError as e:
    out["cuda"] = {"error": str(e)}
print(json.dumps(out), flush=True)
"""

DAEMON = r"""
import os, sys, subprocess
mode, out = sys.argv[1], sys.argv[2]
if mode == "double":
    if os.fork(): os._exit(0)
    if os.fork(): os._exit(0)
else:
    if os.fork(): os._exit(0)
    os.setsid()
    if os.fork(): os._exit(0)
with open(out + ".tmp", "w") as f:
    f.write(subprocess.run([sys.executable, *sys.argv[3:]], capture_output=True, text=True).stdout)
os.replace(out + ".tmp", out)
"""


def sh(*argv, check=True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=kw.pop("timeout", 120),
                          **kw)


def bus_to_index() -> dict[str, int]:
    out = sh("nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader").stdout
    m = {}
    for line in out.splitlines():
        i, bus = (x.strip() for x in line.split(","))
        m[bus.lower()[-12:]] = int(i)          # nvidia-smi pads the domain to 8 digits, CUDA to 4
    return m


class Run:
    def __init__(self, args):
        self.args = args
        self.dir = f"/var/tmp/bk-enforce-gpu-{secrets.token_hex(3)}"
        os.makedirs(self.dir, mode=0o755)
        self.probe = os.path.join(self.dir, "probe.py")
        self.daemon = os.path.join(self.dir, "daemon.py")
        for path, text in ((self.probe, PROBE), (self.daemon, DAEMON)):
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, 0o644)
        self.users = []
        self.gpus = f"{args.gpu},{args.other}"
        self.buses = bus_to_index()

    def user(self) -> str:
        name = "bke" + secrets.token_hex(3)
        sh("useradd", "-m", "-s", "/bin/bash", name)
        self.users.append(name)
        sh("loginctl", "enable-linger", name, check=False)
        return name

    def bk(self, user: str, *args) -> dict:
        p = sh("runuser", "-u", user, "--", "bk", "--json", *args, check=False)
        return json.loads(p.stdout)

    def parse(self, text: str) -> dict:
        try:
            got = json.loads(text.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"error": text[-200:]}
        cuda = got.get("cuda") or {}
        got["cuda_gpus"] = sorted(self.buses.get(d["bus"][-12:], d["bus"]) for d in cuda.get("devices", [])
                                  if d.get("context") == 0)
        return got

    def wait_file(self, path: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                return '{"error": "no answer"}'
            time.sleep(0.1)
        with open(path) as f:
            return f.read()

    # The rows ---------------------------------------------------------------

    def shell(self, user):
        return self.parse(sh("runuser", "-l", user, "-c", f"python3 {self.probe} {self.gpus}", check=False).stdout)

    def tmux(self, user):
        out = os.path.join(self.dir, f"tmux-{secrets.token_hex(2)}")
        sock = os.path.join(self.dir, f"tmux-{user}.sock")
        sh("runuser", "-l", user, "-c", f"tmux -S {sock} new-session -d 'python3 {self.probe} {self.gpus} > {out}.tmp "
           f"&& mv {out}.tmp {out}'", check=False)
        got = self.parse(self.wait_file(out))
        sh("runuser", "-l", user, "-c", f"tmux -S {sock} kill-server", check=False)
        return got

    def user_manager(self, user):
        p = sh("systemd-run", "--user", "-M", f"{user}@", "--wait", "--pipe", "--quiet", "python3", self.probe,
               self.gpus, check=False)
        return self.parse(p.stdout) if p.returncode == 0 else {"error": p.stderr.strip()[-200:]}

    def at_job(self, user):
        if not shutil.which("at") or sh("systemctl", "is-active", "atd", check=False).stdout.strip() != "active":
            return {"skipped": "atd is not running"}
        out = os.path.join(self.dir, f"at-{secrets.token_hex(2)}")
        sh("runuser", "-u", user, "--", "sh", "-c", f"echo 'python3 {self.probe} {self.gpus} > {out}.tmp && "
           f"mv {out}.tmp {out}' | at now", check=False)
        return self.parse(self.wait_file(out, 120))

    def forked(self, user, mode):
        out = os.path.join(self.dir, f"{mode}-{secrets.token_hex(2)}")
        sh("runuser", "-l", user, "-c", f"python3 {self.daemon} {mode} {out} {self.probe} {self.gpus}", check=False)
        return self.parse(self.wait_file(out))

    def container(self, user):
        if not self.args.image or not shutil.which("docker"):
            return {"skipped": "no --image, or no docker"}
        p = sh("docker", "run", "--rm", "--gpus", "all", "-v", f"{self.dir}:{self.dir}:ro", self.args.image,
               "python3", self.probe, self.gpus, check=False, timeout=300)
        return self.parse(p.stdout) if p.returncode == 0 else {"error": p.stderr.strip()[-200:]}

    def rows(self, a, b) -> dict:
        return {"shell": self.shell(a), "tmux": self.tmux(a), "systemd --user": self.user_manager(a),
                "cron (at)": self.at_job(a), "double fork": self.forked(a, "double"),
                "setsid daemon": self.forked(a, "setsid"), "root in a container": self.container(a),
                "second user": self.shell(b)}

    def cleanup(self):
        for u in self.users:
            sh("loginctl", "disable-linger", u, check=False)
            sh("loginctl", "terminate-user", u, check=False)
            sh("userdel", "-r", u, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


def settle(user: str, gpus: list[int], timeout: float = 30.0) -> None:
    """Until the enforcer says ``user``'s slice may open exactly ``gpus``."""
    import pwd

    uid = pwd.getpwnam(user).pw_uid
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = json.loads(sh("bk", "--json", "admin", "enforce", "status", check=False).stdout)["data"]
        for t in (st.get("status") or {}).get("targets") or []:
            if t["uid"] == uid and t["kind"] == "slice" and t["gpus"] == gpus:
                return
        time.sleep(0.2)
    print(f"warning: the enforcer did not show {user} with {gpus} within {timeout} s", file=sys.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", type=int, default=0, help="the GPU the users book (default 0)")
    ap.add_argument("--other", type=int, default=1, help="a GPU nobody books (default 1)")
    ap.add_argument("--turn-on", action="store_true", help="bk admin enforce on first, off at the end")
    ap.add_argument("--image", help="a container image with python3, for the container row")
    ap.add_argument("--json", action="store_true", help="print the whole report as JSON too")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root", file=sys.stderr)
        return 2
    for tool in ("bk", "runuser", "useradd", "nvidia-smi", "systemd-run"):
        if not shutil.which(tool):
            print(f"needs {tool}", file=sys.stderr)
            return 2
    if args.turn_on:
        p = sh("bk", "admin", "enforce", "on", "--yes", check=False)
        print(p.stdout + p.stderr)
    st = json.loads(sh("bk", "--json", "admin", "enforce", "status", check=False).stdout)["data"]
    if not st["enforce"] or st["enforcer"] != "enforcing":
        print(f"enforcement is not working here: {st['verdict']['detail']}", file=sys.stderr)
        return 2
    run = Run(args)
    report, bad = {}, []
    try:
        a, b = run.user(), run.user()
        report["no booking"] = run.rows(a, b)
        settle(a, [])
        rid_a = run.bk(a, "1", "30m", "-g", str(args.gpu))["data"]["reservation"]["id"]
        settle(a, [args.gpu])
        report["first user books"] = run.rows(a, b)
        rid_b = run.bk(b, "1", "30m", "-g", str(args.gpu))["data"]["reservation"]["id"]
        settle(b, [args.gpu])
        report["second user shares"] = run.rows(a, b)
        run.bk(a, "d", rid_a, "-y")
        settle(a, [])
        report["first user cancels"] = run.rows(a, b)
        run.bk(b, "d", rid_b, "-y")
    finally:
        run.cleanup()
        if args.turn_on:
            p = sh("bk", "admin", "enforce", "off", "--yes", check=False)
            print(p.stdout + p.stderr)
    booked = {"no booking": (False, False), "first user books": (True, False),
              "second user shares": (True, True), "first user cancels": (False, True)}
    g, o = str(args.gpu), str(args.other)
    print(f"| phase | row | /dev/nvidia{g} | /dev/nvidia{o} | CUDA contexts on |\n|---|---|---|---|---|")
    for phase, rows in report.items():
        for row, got in rows.items():
            if "skipped" in got or "error" in got:
                print(f"| {phase} | {row} | {got.get('skipped') or got.get('error')} | | |")
                continue
            mine = booked[phase][1 if row == "second user" else 0]
            want_g = "ok" if mine else "EPERM"
            seen_g, seen_o = got["open"].get(g), got["open"].get(o)
            # A short-lived container is governed only once credited (the monitor saw
            # it on a GPU its user alone holds): its row is shown, not judged.
            if row != "root in a container" and (seen_g != want_g or seen_o != "EPERM"):
                bad.append((phase, row, seen_g, seen_o))
            print(f"| {phase} | {row} | {seen_g} | {seen_o} | {got['cuda_gpus']} |")
    if args.json:
        print(json.dumps(report, indent=1))
    print("\nall rows as the rule says" if not bad else f"\nCONTRADICTIONS: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
