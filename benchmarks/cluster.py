"""Cluster benchmark: the fan-out at 1, 10, 50 and 100 nodes (issues 16 and 29).

    sudo python3 benchmarks/cluster.py [--sizes 1,10,50,100] [--runs 3] [--before TREE|PYZ]
                                       [--delay 0.25] [--sshd 3] [--hang-timeout 3] [--parallel N]
                                       [--json PATH]

Needs root (the catalog must be root's, and the sshd part makes a throwaway
user).  It times, as whole client processes, ``bk c rec 2 1h``, ``bk c
check`` and a booking (``bk c 1 30m``, cancelled again untimed), and for each
prints the median wall time, the client's own CPU (its process, every
thread; read with getrusage at its exit) in total and per node, and the CPU
of everything the client started (ssh or its stand-in, and the nodes' bk
where they run here).  With ``--before`` it builds that tree (or takes that
archive) as a second client and alternates the two run by run; the nodes
always run this tree's archive, so only the client differs.

Four parts:

* ``real``: every node a real ``bk c node`` process with its own private
  data directory and simulated GPUs, reached through a stand-in for ssh (a
  ``/bin/sh`` script first on the client's PATH that takes ssh's options,
  then runs the remote command line with the node's environment, as sshd
  would).  The catalog's targets are host names, so the client runs its
  ssh code path unchanged.  Every node runs on this machine's cores, so the
  wall time at 100 nodes is mostly the nodes' own CPU (printed): on a real
  cluster that work is spread over 100 machines.
* ``remote``: the same stand-in, but each node answers with the reply its
  real bk printed at set-up to the same row (``recommend``, with the
  fields the client sent a real node once; ``worker_status``, ``list``,
  ``op_lookup``, ``book``; the clock fields made current), after
  ``--delay`` seconds of "network and remote work" that cost no CPU here.
  This is what the client's fan-out itself costs, as on a cluster whose
  nodes are other machines.  The 2x target (100 nodes within twice the
  time of 10) is read from this part.
* ``hang``: the remote part with 10 nodes plus one that never answers
  (``timeout_s`` = ``--hang-timeout``): the command takes that node's
  deadline, and the others' answers are all there.
* ``sshd``: ``--sshd`` real sshd on 127.0.0.2... (tests/helpers_sshd.py:
  each its own config, host key and node), 1 and all of them; skipped
  when sshd is missing.

Prints the numbers; asserts nothing.  Stops every sshd, removes the user
and the directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bk.cluster.client import booking_request  # noqa: E402

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

# The client under a probe that writes its own CPU and its children's at exit.
PROBE = """import atexit, os, resource, runpy, sys
out = os.environ.pop("BK_BENCH_RUSAGE")
def report():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(out, "w") as f:
        f.write(f"{s.ru_utime + s.ru_stime} {c.ru_utime + c.ru_stime}")
atexit.register(report)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

# ssh's options (ssh_argv's), "--", TARGET, the remote command line.  A
# target without a hosts/TARGET file is a name that does not resolve.  A
# replaying node costs this machine this one bash process and nothing more
# (its wait is a read with a timeout, its clock bash's own), so that the
# remote part measures the client; what a real ssh costs is the sshd part's.
STAND_IN = """#!/bin/bash
while (($#)); do
  case "$1" in
    --) shift; break;;
    -o|-p|-i|-l) shift 2;;
    *) shift;;
  esac
done
h='{hosts}'/"$1"
[[ -f $h/env ]] || {{ echo "ssh: Could not resolve hostname $1: Name or service not known" >&2; exit 255; }}
. "$h/env"
[[ -n $BK_BENCH_LOG ]] && printf '%s\n' "$2" >> "$BK_BENCH_LOG"
if [[ -n $REPLAY ]]; then
  read -r -t "$DELAY" <> "$REPLAY/wait"
  case " $2 " in
    *" --row recommend "*'"count":2'*) f=rec2;; *" --row recommend "*) f=rec1;;
    *" --row worker_status "*) f=worker_status;; *" --row list "*) f=list;; *" --row op_lookup "*) f=op;;
    *" --row "*|*" -- "*) f=write;; *) f=who;;
  esac
  IFS= read -r -d '' body < "$REPLAY/$f.json"
  printf '%s' "${{body//@NOW@/$EPOCHREALTIME}}"
  exit 0
fi
exec /bin/sh -c "$2"
"""
HANG = "#!/bin/sh\necho $$ > '{pids}'/hang.$$\nexec sleep 600\n"

COMMANDS = (("rec", ("c", "rec", "2", "1h")), ("check", ("c", "check")), ("book", ("c", "1", "30m")))


def now_field(reply: str) -> str:
    """The node's clock in a recorded reply, for the stand-in to make current."""
    import re

    return re.sub(r'"now_epoch": [0-9.]+', '"now_epoch": @NOW@', reply, count=1)


def build(tree: Path, out: Path) -> Path:
    subprocess.run([sys.executable, str(tree / "build.py"), "--output", str(out)], check=True,
                   capture_output=True, cwd=tree)
    return out


def script(path: Path, text: str) -> Path:
    path.write_text(text)
    os.chmod(path, 0o755)
    return path


def catalog(path: Path, nodes: dict) -> Path:
    path.write_text(json.dumps({"version": 1, "nodes": nodes}))
    os.chmod(path, 0o644)
    return path


class Bench:
    def __init__(self, base: Path, node_pyz: Path, clients: dict[str, Path], args):
        self.base, self.node_pyz, self.clients, self.args = base, node_pyz, clients, args
        self.bin = base / "bin"
        self.bin.mkdir(mode=0o755)
        script(self.bin / "bk", f'#!/bin/sh\nexec {PYTHON} {node_pyz} "$@"\n')
        self.pids = base / "pids"
        self.pids.mkdir()
        script(self.bin / "bk-hang", HANG.format(pids=self.pids))
        self.home = base / "home"
        self.home.mkdir(mode=0o755)
        self.results: list[dict] = []
        self._asked: dict | None = None
        # Each "after" client with --parallel K reads a configuration of its own.
        self.cfgs: dict[str, Path] = {}
        for label in clients:
            k = label.partition("/")[2]
            if k:
                self.cfgs[label] = base / f"config-{k}.json"
                self.cfgs[label].write_text(json.dumps({"cluster_parallel": int(k)}))
                os.chmod(self.cfgs[label], 0o644)

    # -- nodes ---------------------------------------------------------

    def stand_in(self, kind: str) -> Path:
        """The directory to put first on the client's PATH for ``kind``."""
        d = self.base / f"ssh-{kind}"
        if not d.exists():
            d.mkdir()
            (d / "hosts").mkdir()
            script(d / "ssh", STAND_IN.format(hosts=d / "hosts"))
        return d

    def real_nodes(self, count: int) -> dict:
        """``count`` real nodes (made once, reused by every size): their
        catalog entries, in order."""
        d = self.stand_in("real")
        todo = [f"n{i:03d}" for i in range(1, count + 1) if not (d / "hosts" / f"n{i:03d}").exists()]

        def make(name: str) -> None:
            data = self.base / "data" / name
            data.mkdir(parents=True)
            h = d / "hosts" / name
            h.mkdir()
            gpus = 2 + int(name[1:]) % 4 * 2
            env = {"BK_DATA_DIR": str(data), "BK_GPU_COUNT": str(gpus), "PATH": f"{self.bin}:/usr/bin:/bin",
                   "HOME": str(self.home)}
            (h / "env").write_text("".join(f"export {k}='{v}'\n" for k, v in env.items()))
            p = subprocess.run([PYTHON, str(self.node_pyz), "c", "id", "--json"], capture_output=True, text=True,
                               env={**env, "LANG": "C.UTF-8"}, timeout=120)
            (h / "id").write_text(json.loads(p.stdout)["data"]["id"])

        with ThreadPoolExecutor(2) as ex:
            list(ex.map(make, todo))
        return {f"n{i:03d}": {"id": (d / "hosts" / f"n{i:03d}" / "id").read_text(), "target": f"n{i:03d}",
                              "timeout_s": 120} for i in range(1, count + 1)}

    def remote_nodes(self, count: int, delay: float) -> dict:
        """Replaying nodes: each answers as its real node answered at set-up."""
        real = self.real_nodes(count)
        asked = self.asked(real)
        d = self.stand_in("remote")
        for name, entry in real.items():
            h = d / "hosts" / name
            if h.exists():
                continue
            h.mkdir()
            src = self.stand_in("real") / "hosts" / name
            env = (src / "env").read_text()
            (h / "env").write_text(env + f"export REPLAY='{h}' DELAY='{delay}'\n")
            os.mkfifo(h / "wait")
            for f, flags in (("who", []), ("rec2", ["--row", "recommend", "--fields", asked["rec2"]]),
                             ("rec1", ["--row", "recommend", "--fields", asked["rec1"]]),
                             ("worker_status", ["--row", "worker_status", "--fields", "{}"]),
                             ("list", ["--row", "list", "--fields", '{"scope":"all"}']),
                             ("op", ["--row", "op_lookup", "--fields", json.dumps({"op_id": "c-" + "0" * 24})])):
                (h / f"{f}.json").write_text(now_field(self.node_call(src, entry["id"], [], flags)))
            # The book row the client sends this node: its own best option (bk.cluster.client).
            option = json.loads((h / "rec1.json").read_text().replace("@NOW@", "0"))["data"]["reply"]["data"]
            fields = booking_request(json.loads(asked["rec1"]), option["options"][0], exact=False)
            booked = self.node_call(src, entry["id"], [], ["--row", "book", "--fields", json.dumps(
                {**fields, "op_id": "c-" + os.urandom(12).hex()}, separators=(",", ":"))])
            (h / "write.json").write_text(now_field(booked))
            rid = json.loads(booked)["data"]["reply"]["data"]["reservation"]["id"]
            self.node_call(src, entry["id"], ["d", rid])
        return {n: {**e, "timeout_s": 60} for n, e in real.items()}

    def asked(self, real: dict) -> dict:
        """The ``recommend`` rows' fields the client sends for ``c rec 2 1h``
        (``rec2``) and ``c 1 30m`` (``rec1``), as the stand-in saw them
        (once, from one real node)."""
        if self._asked is None:
            first = dict(list(real.items())[:1])
            cat = catalog(self.base / "asked.json", first)
            log = self.base / "asked.log"
            env = {**self.client_env(cat, self.stand_in("real")), "BK_BENCH_LOG": str(log)}
            got = {}
            for key, argv in (("rec2", ("c", "rec", "2", "1h")), ("rec1", ("c", "1", "30m", "--dry-run"))):
                log.write_text("")
                self.timed(next(iter(self.clients)), argv, env)
                for line in log.read_text().splitlines():
                    words = shlex.split(line)
                    if "--row" in words and words[words.index("--row") + 1] == "recommend":
                        got[key] = words[words.index("--fields") + 1]
            self._asked = got
        return self._asked

    def node_call(self, host: Path, nid: str, words: list[str], flags: list[str] = ()) -> str:
        env = dict(line[len("export "):].split("=", 1) for line in (host / "env").read_text().splitlines())
        env = {k: v.strip("'") for k, v in env.items()}
        p = subprocess.run([PYTHON, str(self.node_pyz), "c", "node", "--expect", nid, "--json", *flags,
                            *(["--", *words] if words else [])],
                           capture_output=True, text=True, env={**env, "LANG": "C.UTF-8"}, timeout=120)
        json.loads(p.stdout)
        return p.stdout

    # -- the client ----------------------------------------------------

    def client_env(self, cat: Path, path_first: Path | None) -> dict:
        return {"HOME": str(self.home), "PATH": (f"{path_first}:" if path_first else "") + "/usr/bin:/bin",
                "BK_CLUSTER_FILE": str(cat), "LANG": "C.UTF-8", "COLUMNS": "120"}

    def timed(self, variant: str, argv, env: dict, user=None) -> dict:
        pyz = self.clients[variant]
        if variant in self.cfgs:
            env = {**env, "BK_CONFIG_FILE": str(self.cfgs[variant])}
        out = self.base / "rusage"
        kw = {}
        if user is not None:
            kw = {"user": user.uid, "group": user.gid, "extra_groups": [], "cwd": user.home}
            out = Path(user.home) / "rusage"
        t = time.perf_counter()
        p = subprocess.run([PYTHON, "-c", PROBE, str(pyz), *argv, "--json"], capture_output=True, text=True,
                           env={**env, "BK_BENCH_RUSAGE": str(out)}, timeout=900, **kw)
        wall = time.perf_counter() - t
        own, children = (float(x) for x in out.read_text().split())
        out.unlink()
        try:
            doc = json.loads(p.stdout)
        except ValueError:
            doc = {"ok": False, "error": {"message": (p.stdout + p.stderr)[-300:]}}
        return {"wall": wall, "cpu": own, "children": children, "exit": p.returncode, "doc": doc}

    def series(self, part: str, size: int, cat: Path, env: dict, *, user=None, commands=COMMANDS) -> None:
        for what, argv in commands:
            samples: dict[str, list[dict]] = {v: [] for v in self.clients}
            order = list(self.clients)
            for r in range(self.args.runs):
                for variant in (order if r % 2 == 0 else order[::-1]):
                    s = self.timed(variant, argv, env, user)
                    samples[variant].append(s)
                    if what == "book" and s["doc"].get("ok"):
                        res = s["doc"]["data"]["reservation"]
                        if res and part != "remote":
                            self.timed(variant, ("c", "d", f"{s['doc']['data']['node']}/{res['id']}"),
                                       env, user)
            for variant, xs in samples.items():
                self.report(part, size, what, variant, xs)

    def report(self, part: str, size: int, what: str, variant: str, xs: list[dict]) -> None:
        wall = statistics.median(x["wall"] for x in xs)
        cpu = statistics.median(x["cpu"] for x in xs)
        kids = statistics.median(x["children"] for x in xs)
        codes = sorted({x["exit"] for x in xs})
        doc = xs[-1]["doc"]
        note = ""
        if not doc.get("ok"):
            note = "  " + str((doc.get("error") or {}).get("message", ""))[:60]
        elif what in ("rec", "check"):
            nodes = doc["data"].get("nodes") or []
            good = sum(1 for n in nodes if n.get("state") == "ok")
            note = f"  {good}/{len(nodes)} answered"
        print(f"{part:<7}{size:>5}  {what:<6}{variant:<10}{wall * 1000:9.0f} ms {cpu * 1000:8.0f} ms "
              f"{cpu * 1000 / max(size, 1):8.1f} ms {kids * 1000:9.0f} ms  exit {','.join(map(str, codes))}{note}",
              flush=True)
        self.results.append({"part": part, "nodes": size, "command": what, "client": variant, "wall_s": wall,
                             "client_cpu_s": cpu, "children_cpu_s": kids, "exit": codes,
                             "samples": [{k: v for k, v in x.items() if k != "doc"} for x in xs]})

    def stop(self) -> None:
        for f in self.pids.glob("*"):
            try:
                os.kill(int(f.read_text().strip()), 9)
            except (ValueError, ProcessLookupError):
                pass


HEADER = (f"{'part':<7}{'nodes':>5}  {'cmd':<6}{'client':<10}{'wall':>12} {'client CPU':>11} "
          f"{'per node':>11} {'children CPU':>12}")


def sshd_part(bench: Bench, args) -> None:
    from tests.helpers_broker import Accounts
    from tests.helpers_sshd import Lab, have_sshd

    if not have_sshd():
        print("sshd: skipped (openssh-server is not installed)")
        return
    accounts = Accounts(bench.base)
    lab = None
    try:
        (bench.base / "sshd").mkdir(mode=0o755)
        lab = Lab(bench.base / "sshd", bench.node_pyz, accounts.user())
        for v, pyz in bench.clients.items():
            shutil.copy(pyz, lab.base / f"client-{v.replace('/', '-')}.pyz")
            os.chmod(lab.base / f"client-{v.replace('/', '-')}.pyz", 0o644)
        bench.clients = {v: lab.base / f"client-{v.replace('/', '-')}.pyz" for v in bench.clients}
        entries = {}
        for i in range(args.sshd):
            name = f"s{i + 1}"
            entries[name] = lab.sshd(name, f"127.0.0.{i + 2}", gpus=2 + 2 * i).entry()
        for size in sorted({1, args.sshd}):
            cat = catalog(lab.base / f"sshd-{size}.json", dict(list(entries.items())[:size]))
            env = lab.env(cat)
            bench.timed(next(iter(bench.clients)), ("c", "check"), env, lab.user)     # warm
            bench.series("sshd", size, cat, env, user=lab.user)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        print(f"sshd: skipped ({e})")
    finally:
        if lab is not None:
            lab.stop()
        accounts.cleanup()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,10,50,100")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--before", type=Path, help="a tree (built here) or an archive: the client to compare with")
    ap.add_argument("--delay", type=float, default=0.25, help="seconds a remote node takes (the remote part)")
    ap.add_argument("--sshd", type=int, default=3, help="real sshd nodes (0: none)")
    ap.add_argument("--hang-timeout", type=float, default=3.0)
    ap.add_argument("--parallel", default="", help="cluster_parallel values to try, e.g. 16,64: one 'after' "
                    "client each (default: the after client with its default)")
    ap.add_argument("--parts", default="real,remote,hang,sshd")
    ap.add_argument("--json", type=Path, help="write every figure, with its samples, to this file")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root: the catalog must be root's (and the sshd part makes a user)", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.sizes.split(",")]
    parts = args.parts.split(",")
    base = Path(tempfile.mkdtemp(prefix="bk-bench-cluster-", dir="/tmp"))
    os.chmod(base, 0o755)
    bench = None
    try:
        after = build(ROOT, base / "after.pyz")
        clients = {"before": args.before if args.before.is_file() else build(args.before.resolve(),
                                                                                base / "before.pyz")} \
            if args.before is not None else {}
        clients.update({f"after/{k}": after for k in args.parallel.split(",") if k} or {"after": after})
        for p in clients.values():
            os.chmod(p, 0o644)
        bench = Bench(base, after, clients, args)
        print(f"{os.cpu_count()} CPU cores, shared by the client and every node here; {args.runs} runs each, "
              f"medians; client CPU = the bk client process alone; children = what it started "
              f"(ssh or the stand-in, and in 'real' the nodes' bk)")
        print(HEADER)
        for size in sizes if "real" in parts else ():
            cat = catalog(base / f"real-{size}.json", bench.real_nodes(size))
            bench.timed(next(iter(clients)), ("c", "check"), bench.client_env(cat, bench.stand_in("real")))  # warm
            bench.series("real", size, cat, bench.client_env(cat, bench.stand_in("real")))
        for size in sizes if "remote" in parts else ():
            cat = catalog(base / f"remote-{size}.json", bench.remote_nodes(size, args.delay))
            bench.series("remote", size, cat, bench.client_env(cat, bench.stand_in("remote")))
        if "hang" in parts:
            nodes = bench.remote_nodes(10, args.delay)
            hang = bench.stand_in("remote") / "hosts" / "hang"
            hang.mkdir(exist_ok=True)
            (hang / "env").write_text(f"export PATH='{bench.bin}:/usr/bin:/bin'\n")
            nodes = dict(list(nodes.items())[:5]) | {"hang": {
                "id": "d-" + "9" * 24, "target": "hang", "remote_command": [f"{bench.bin}/bk-hang"],
                "timeout_s": args.hang_timeout}} | dict(list(nodes.items())[5:])
            cat = catalog(base / "hang.json", nodes)
            bench.series("hang", 11, cat, bench.client_env(cat, bench.stand_in("remote")),
                         commands=COMMANDS[:1])
        if "sshd" in parts and args.sshd:
            sshd_part(bench, args)
        if args.json:
            args.json.write_text(json.dumps({"cores": os.cpu_count(), "delay_s": args.delay,
                                             "results": bench.results}, indent=1))
    finally:
        if bench is not None:
            bench.stop()
        subprocess.run(["rm", "-rf", str(base)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
