"""Cluster nodes without sshd: a catalog of ``local`` nodes, each of which
runs its ``remote_command`` as a real child process, as ssh would run it
on a host.

* ``FakeNode``: a ``/bin/sh`` program that prints a canned reply per
  command (``bk c node``'s wrapper around the command's envelope), written
  by the test: a node that lies exactly as the test says (wrong field
  types, hostile text).  Cheap (sh and cat), so a fuzz test can run
  hundreds of cluster commands.
* ``real_node``: the built bk.pyz with its own data directory.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

NOW = int(time.time()) // 60 * 60


def iso(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def reservation(rid: str = "1f2e3d4c-0000-4000-8000-000000000001", uid: int = 1001, **over) -> dict:
    """A booking as a node's JSON has it (bk.service.views.reservation_json)."""
    return {"id": rid, "short_id": rid[:8], "number": 1, "uid": uid, "user": f"u{uid}", "mine": False,
            "mode": "shared", "gpus": [0, 1], "share": 1, "capacity": 2, "mem_mib": None,
            "mem_mib_effective": 40000, "start": iso(NOW + 3600), "end": iso(NOW + 5400), "status": "upcoming",
            "created": iso(NOW - 60), "op_id": "c-0123", "note": "train",
            "job": {"id": "ab" * 16, "digest": "cd" * 32, "reason": None, "exit_code": None,
                    "updated": iso(NOW - 60), "status": "pending", "summary": "train.sh +1 arg"},
            "cancelled_at": None, "cancel_reason": None, "edits": 0, **over}


def option(start: int = NOW + 600, **over) -> dict:
    return {"gpus": [0], "start": iso(start), "end": iso(start + 1800), "command": "bk 1 30m -g 0",
            "queued": True, "mem_mib_effective": None, "reasons": {"0": "chosen", "1": "free, not needed"}, **over}


def good_data() -> dict:
    """The data of every command a client sends, as a good node answers."""
    return {
        "list": {"scope": "all", "reservations": [reservation()], "total": 1},
        "slots": {"request": {"count": 1, "duration": 1800}, "options": [option()]},
        "write": {"status": "created", "reservation": reservation(), "dry_run": False,
                  "placement": {"gpus": {"0": "chosen"}, "queued": False, "mem_mib_effective": None}},
        "op": {"op_id": "c-x", "found": False, "action": None, "reservation": None},
        "worker": {"worker": {"state": "running", "pid": 4242, "since": iso(NOW - 600), "data_dir": "/x"},
                   "jobs": {"pending": 0, "running": 0}, "jobs_dir": "/x/jobs"},
        "jobs": {"jobs": [], "total": 0, "worker": {"state": "absent", "pid": None, "since": None, "data_dir": None}},
    }


COMMANDS = {"list": "list", "slots": "slots", "write": "book", "op": "cluster op", "worker": "worker",
            "jobs": "jobs"}

# Which canned reply a command line gets: the first pattern found in " ARGV ".
_SCRIPT = """#!/bin/sh
d='{dir}'
case " $* " in
  *" --text "*) exec cat "$d/text.json";;
  *" --row list "*|*" -- l "*) exec cat "$d/list.json";;
  *" --row recommend "*) exec cat "$d/slots.json";;
  *" --row op_lookup "*) exec cat "$d/op.json";;
  *" --row worker_status "*) exec cat "$d/worker.json";;
  *" --row jobs "*) exec cat "$d/jobs.json";;
  *" -- slots "*) exec cat "$d/slots.json";;
  *" -- c op "*) exec cat "$d/op.json";;
  *" -- c id "*) exec cat "$d/id.json";;
  *" -- w "*) exec cat "$d/worker.json";;
  *" -- j "*) exec cat "$d/jobs.json";;
  *) exec cat "$d/write.json";;
esac
"""


class FakeNode:
    def __init__(self, base: Path, name: str, nid: str):
        self.name, self.id = name, nid
        self.dir = base / f"node-{name}"
        self.dir.mkdir(mode=0o755)
        self.script = self.dir / "bk"
        self.script.write_text(_SCRIPT.format(dir=self.dir))
        os.chmod(self.script, 0o755)
        self.identity = {"id": nid, "id_source": "derived", "hostname": f"host-{name}", "version": "9.9.9",
                         "mode": "private", "now": iso(int(time.time())), "now_epoch": time.time(),
                         "capabilities": ["node.v1", "op-lookup", "book", "edit", "cancel", "slots", "jobs"]}
        self.answer_all(good_data())
        self.text("", "", 0)

    def wrapper(self, data: dict) -> dict:
        return {"schema": "gpubk.v1", "command": "cluster node", "ok": True, "warnings": [], "data": data}

    def envelope(self, command: str, data: dict | None = None, error: dict | None = None,
                 warnings: list | None = None) -> dict:
        env = {"schema": "gpubk.v1", "command": command, "ok": error is None, "warnings": warnings or []}
        env.update({"data": data} if error is None else {"error": error})
        return env

    def raw(self, kind: str, doc: object) -> None:
        """Answer ``kind`` with ``doc`` printed as it is."""
        (self.dir / f"{kind}.json").write_text(json.dumps(doc))

    def answer(self, kind: str, data: dict | None = None, *, error: dict | None = None,
               warnings: list | None = None, identity: dict | None = None) -> None:
        inner = self.envelope(COMMANDS.get(kind, kind), data, error, warnings)
        self.raw(kind, self.wrapper({"node": identity or self.identity, "reply": inner, "exit": 0}))

    def answer_all(self, datas: dict) -> None:
        for kind, data in datas.items():
            self.answer(kind, data)
        self.raw("id", self.wrapper({"node": self.identity,
                                     "reply": self.envelope("cluster id", self.identity), "exit": 0}))

    def text(self, text: str, stderr: str = "", exit: int = 0) -> None:
        """What ``bk @NODE CMD`` (a command for people) gets."""
        self.raw("text", self.wrapper({"node": self.identity, "text": text, "stderr": stderr, "exit": exit}))

    def entry(self, **over) -> dict:
        return {"id": self.id, "target": "local", "remote_command": ["/bin/sh", str(self.script)],
                "timeout_s": 20, **over}


def real_node(base: Path, name: str, pyz: Path, gpus: int = 2) -> tuple[dict, Path]:
    """The built bk as a local node with its own data directory: its
    catalog entry (with the id it reports) and the data directory."""
    import subprocess

    data = base / f"data-{name}"
    data.mkdir(mode=0o700)
    cmd = ["/usr/bin/env", f"BK_DATA_DIR={data}", f"BK_GPU_COUNT={gpus}", sys.executable, str(pyz)]
    p = subprocess.run([*cmd, "c", "id", "--json"], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(base)})
    nid = json.loads(p.stdout)["data"]["id"]
    return {"id": nid, "target": "local", "remote_command": cmd, "timeout_s": 30}, data


def write_catalog(path: Path, nodes: dict) -> Path:
    """A root-owned 0644 catalog (the trust check wants root's file)."""
    path.write_text(json.dumps({"version": 1, "nodes": nodes}))
    os.chmod(path, 0o644)
    return path
