"""Helpers for the broker tests that use real accounts (no tests here).

A ``Site`` is one throwaway shared server inside a temporary directory:
the built ``bk.pyz``, a trusted config written by ``bk admin init``, a data
directory and a socket directory owned by a throwaway service account, and
the broker running as that account exactly as a systemd unit would run it
(``/usr/bin/python3 bk.pyz broker`` with ``BK_CONFIG_FILE``).  Clients run
as other throwaway accounts through ``subprocess.Popen(user=...)``.

Everything created is removed by the fixtures that use this module: the
processes they started (by pid), the accounts (``userdel -r``), the groups
and the directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = "/usr/bin/python3"

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("useradd") or not os.path.exists(SYSTEM_PYTHON),
    reason="needs root, useradd and /usr/bin/python3 (real accounts)")


def poll(predicate, timeout: float = 10.0, what: str = "it", interval: float = 0.02):
    """Wait for ``predicate()`` to be truthy, checking often, failing after ``timeout``;
    its value.  The one wait of the tests that watch real processes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


# ------------------------------------------------------------- accounts

@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    home: str


class Accounts:
    """Throwaway users and groups, removed by ``cleanup()``."""

    def __init__(self, base: Path):
        self.base = base
        self.users: list[Account] = []
        self.groups: list[str] = []

    def group(self) -> tuple[str, int]:
        import grp

        name = "bkg" + secrets.token_hex(3)
        subprocess.run(["groupadd", name], check=True, capture_output=True)
        self.groups.append(name)
        return name, grp.getgrnam(name).gr_gid

    def user(self, groups: tuple[str, ...] = ()) -> Account:
        import pwd

        name = "bkt" + secrets.token_hex(3)
        home = self.base / "home" / name
        home.parent.mkdir(exist_ok=True, mode=0o755)
        cmd = ["useradd", "-m", "-d", str(home), "-s", "/usr/sbin/nologin", "-K", "MAIL_DIR=/nonexistent"]
        if groups:
            cmd += ["-G", ",".join(groups)]
        subprocess.run([*cmd, name], check=True, capture_output=True)
        pw = pwd.getpwnam(name)
        acct = Account(name, pw.pw_uid, pw.pw_gid, str(home))
        self.users.append(acct)
        return acct

    def cleanup(self) -> None:
        for a in self.users:
            # userdel refuses an account a process still runs as (a client or
            # a daemon of the test not yet reaped): those are the test's own,
            # so they are stopped and the account removed again, never left.
            for _ in range(50):
                if subprocess.run(["userdel", "-r", a.name], capture_output=True).returncode in (0, 6):
                    break                                  # 6: no such user
                subprocess.run(["pkill", "-KILL", "-u", str(a.uid)], capture_output=True)
                time.sleep(0.1)
        for g in self.groups:
            subprocess.run(["groupdel", g], capture_output=True)


def supplementary(account: Account) -> list[int]:
    return sorted(set(os.getgrouplist(account.name, account.gid)) - {account.gid})


def build_pyz(dest: Path) -> Path:
    """``dest/bk.pyz``: a copy of the session's build (helpers_build)."""
    from helpers_build import copy_to

    return copy_to(dest / "bk.pyz", 0o755)


def make_base() -> Path:
    """A root-owned 0755 directory under /tmp (sticky): trusted for configs."""
    base = Path(tempfile.mkdtemp(prefix="bkt_", dir="/tmp"))
    os.chmod(base, 0o755)
    return base


# ------------------------------------------------------------- one server

class Site:
    def __init__(self, base: Path, pyz: Path, service: Account, *, access: str = "all",
                 group: str | None = None, gpu_count: int = 4, simulated: bool = True):
        self.base, self.pyz, self.service = base, pyz, service
        self.access, self.group, self.gpu_count = access, group, gpu_count
        # A trial server (these machines have no GPUs), unless a test plays
        # a server that expects real ones.
        self.simulated = simulated
        self.config = base / "etc" / "config.json"
        self.data = base / "data"
        self.socket = base / "run" / "broker.sock"
        self.broker: subprocess.Popen | None = None
        self._logs = 0
        self.log_path: Path | None = None

    # -- running bk -----------------------------------------------------------

    def env(self, account: Account | None) -> dict:
        home = account.home if account else str(self.base)
        return {"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "TZ": "UTC",
                "BK_CONFIG_FILE": str(self.config)}

    def popen_args(self, account: Account | None) -> dict:
        if account is None:
            return {}
        return {"user": account.uid, "group": account.gid, "extra_groups": supplementary(account)}

    def run(self, account: Account | None, *args: str, timeout: float = 60, env: dict | None = None,
            input: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([SYSTEM_PYTHON, str(self.pyz), *args], capture_output=True, text=True,
                              timeout=timeout, env=env or self.env(account), cwd=self.base,
                              input=input, **self.popen_args(account))

    def run_json(self, account: Account | None, *args: str, **kw) -> tuple[int, dict]:
        p = self.run(account, "--json", *args, **kw)
        try:
            return p.returncode, json.loads(p.stdout)
        except ValueError:
            raise AssertionError(f"bk {' '.join(args)}: not JSON (rc {p.returncode}): "
                                 f"{p.stdout!r} {p.stderr!r}") from None

    def init(self, *extra: str) -> subprocess.CompletedProcess:
        args = ["admin", "init", "--service-user", self.service.name, "--config-file", str(self.config),
                "--data-dir", str(self.data), "--socket", str(self.socket),
                "--simulated-gpus" if self.simulated else "--gpu-count", str(self.gpu_count),
                "--access", self.access, "--yes", *extra]
        if self.group:
            args += ["--group", self.group]
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.base), "LANG": "C.UTF-8", "TZ": "UTC"}
        return subprocess.run([SYSTEM_PYTHON, str(self.pyz), *args], capture_output=True, text=True,
                              timeout=60, env=env, cwd=self.base)

    # -- the broker -----------------------------------------------------------

    def start_broker(self, *flags: str, wait: bool = True, env=None) -> subprocess.Popen:
        """``env``: more variables for the broker (a test seam), or a function
        of the log file's descriptor that returns them (JOURNAL_STREAM)."""
        assert self.broker is None or self.broker.poll() is not None, "a broker is already running"
        self._logs += 1
        self.log_path = self.base / f"broker-{self._logs}.log"
        with open(self.log_path, "wb") as log:
            extra = env(log.fileno()) if callable(env) else (env or {})
            self.broker = subprocess.Popen([SYSTEM_PYTHON, str(self.pyz), "broker", *flags],
                                           stdout=log, stderr=subprocess.STDOUT,
                                           env={**self.env(self.service), **extra},
                                           cwd=self.base, **self.popen_args(self.service))
        if wait:
            self.wait_ready()
        return self.broker

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def wait_ready(self, timeout: float = 30) -> None:
        def ready():
            if self.broker.poll() is not None:
                raise AssertionError(f"the broker exited with {self.broker.returncode}:\n{self.log()}")
            return self.socket.exists() and ping(self.socket) is not None
        poll(ready, timeout, "the broker to answer")

    def stop_broker(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
        if self.broker is None or self.broker.poll() is not None:
            return None if self.broker is None else self.broker.returncode
        self.broker.send_signal(sig)
        return self.broker.wait(timeout)

    # -- state ----------------------------------------------------------------

    def ledger(self):
        from bk.store.ledger import Store

        return Store(str(self.data), private=False, owner_uid=self.service.uid).read()

    def ledger_digest(self) -> str:
        return hashlib.sha256((self.data / "ledger.json").read_bytes()).hexdigest()


@contextlib.contextmanager
def site(**kw):
    """A built, initialised site whose broker runs; everything removed after."""
    base = make_base()
    accounts = Accounts(base)
    s = None
    try:
        pyz = build_pyz(base)
        service = accounts.user()
        s = Site(base, pyz, service, **kw)
        s.accounts = accounts
        yield s
    finally:
        if s is not None:
            s.stop_broker()
            if s.broker is not None and s.broker.poll() is None:
                s.broker.kill()
                s.broker.wait()
        accounts.cleanup()
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------- raw sockets

def frame(obj) -> bytes:
    body = json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body


def raw_frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def connect(path: Path, timeout: float = 10) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(str(path))
    return s


def read_reply(s: socket.socket) -> dict | None:
    """One reply envelope, or None if the broker closed the connection."""
    header = b""
    while len(header) < 4:
        chunk = s.recv(4 - len(header))
        if not chunk:
            return None
        header += chunk
    (n,) = struct.unpack(">I", header)
    body = b""
    while len(body) < n:
        chunk = s.recv(n - len(body))
        if not chunk:
            return None
        body += chunk
    return json.loads(body)


def ping(path: Path) -> dict | None:
    try:
        with connect(path, timeout=5) as s:
            s.sendall(frame({"v": 1, "op": "ping"}))
            return read_reply(s)
    except OSError:
        return None


def is_envelope(obj) -> bool:
    from bk.core.envelope import is_envelope as check

    return check(obj)


# ------------------------------------------------------------- invariants

def capacity_problems(reservations, capacity: int) -> list[str]:
    """Brute force: at every start of a booking on a GPU, the shares of the
    bookings covering that instant fit, and an exclusive booking is alone."""
    problems = []
    live = [r for r in reservations if r.cancelled_at is None]
    gpus = {g for r in live for g in r.gpus}
    for g in gpus:
        on = [r for r in live if g in r.gpus]
        for probe in {r.start for r in on}:
            cover = [r for r in on if r.start <= probe < r.end]
            exclusive = [r for r in cover if r.mode == "exclusive"]
            if exclusive and len(cover) > 1:
                problems.append(f"GPU {g} at {probe}: exclusive {exclusive[0].id[:8]} overlaps "
                                f"{len(cover) - 1} other booking(s)")
            used = sum(r.share for r in cover if r.mode != "exclusive")
            if used > capacity:
                problems.append(f"GPU {g} at {probe}: {used} slots used of {capacity}")
    return problems


# ------------------------------------------------------------- fuzzing

WRITE_OPS = ("book", "edit", "cancel", "notice_publish")


def corpus(rng: random.Random) -> list[dict]:
    rid = f"{rng.getrandbits(32):08x}-0000-4000-8000-{rng.getrandbits(48):012x}"
    return [
        {"v": 1, "op": "ping"},
        {"v": 1, "op": "ping", "fields": {}},
        {"v": 1, "op": "book", "fields": {"count": 1, "duration": 1800, "dry_run": True}},
        {"v": 1, "op": "book", "fields": {"count": 2, "duration": 3600, "mode": "exclusive",
                                          "pinned": [0, 1], "mem_mib": 1024, "dry_run": True}},
        {"v": 1, "op": "book", "fields": {"count": 1, "duration": 600, "queue": True, "note": "x",
                                          "op_id": "k1", "excluded": [2], "share": 2, "dry_run": True}},
        {"v": 1, "op": "edit", "fields": {"ref": rid, "end": 1900000000, "dry_run": True}},
        {"v": 1, "op": "cancel", "fields": {"ref": rid, "reason": "r", "dry_run": True}},
    ]


_JUNK_VALUES = (None, True, False, 0, -1, 1, 2**31, 2**63, -2**63, 10**40, 1.5, -0.0, 1e308, "", "x",
                "\u0000", "\u2028",
                "é" * 1200, [], [1, 2], [True], [-1], [10**9], ["0"], {}, {"a": 1}, [[[]]])


def _mutate_obj(obj: dict, rng: random.Random) -> object:
    obj = json.loads(json.dumps(obj))
    fields = obj.get("fields") if isinstance(obj.get("fields"), dict) else None
    choice = rng.randrange(11)
    if choice == 0 and fields:
        fields[rng.choice(sorted(fields))] = rng.choice(_JUNK_VALUES)
    elif choice == 1 and fields is not None:
        fields[rng.choice(["uid", "user", "actor", "gid", "pid", "admin", "zz", "ref", "count",
                           "reason", "text", "level", "until"])] = rng.choice(_JUNK_VALUES)
    elif choice == 2 and fields:
        del fields[rng.choice(sorted(fields))]
    elif choice == 3:
        obj["op"] = rng.choice(_JUNK_VALUES + ("BOOK", "book ", "ping\u0000", "__init__", "x" * 100,
                                               "notice_publish", "dispatch", "admin_cancel"))
    elif choice == 4:
        obj[rng.choice(["uid", "user", "id", "V", "fields2", "actor"])] = rng.choice(_JUNK_VALUES)
    elif choice == 5:
        obj["v"] = rng.choice(_JUNK_VALUES)
    elif choice == 6:
        obj["fields"] = rng.choice(_JUNK_VALUES)
    elif choice == 7:
        return rng.choice(_JUNK_VALUES)
    elif choice == 8:
        return [obj]
    elif choice == 9 and fields is not None:
        for _ in range(rng.randrange(1, 4)):
            fields[rng.choice(["count", "duration", "start", "end", "share", "mem_mib", "pinned",
                               "excluded", "mode", "queue", "ref"])] = rng.choice(_JUNK_VALUES)
    else:
        obj.pop("op", None)
    return obj


def _mutate_bytes(body: bytes, rng: random.Random) -> bytes:
    b = bytearray(body)
    for _ in range(rng.randrange(1, 6)):
        kind = rng.randrange(5)
        pos = rng.randrange(len(b) + 1)
        if kind == 0 and b:
            b[min(pos, len(b) - 1)] = rng.randrange(256)
        elif kind == 1:
            b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
        elif kind == 2 and b:
            del b[pos:pos + rng.randrange(1, 8)]
        elif kind == 3:
            b = b[:pos]
        else:
            b[pos:pos] = rng.choice([b"{", b"}", b"[", b"]", b'"', b"\\", b",", b":", b"NaN",
                                     b"Infinity", b"\xff", b"\xc0\x80", b"\x00", b"1e999", b"-"])
    return bytes(b)


def would_write(body: bytes) -> bool:
    """True for a frame the broker would accept as a real change (those are
    not fuzz: the fuzz run must leave the ledger unchanged)."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    if not isinstance(obj, dict) or obj.get("op") not in WRITE_OPS:
        return False
    fields = obj.get("fields")
    return obj.get("op") == "notice_publish" or not (isinstance(fields, dict)
                                                     and fields.get("dry_run") is True)


def fuzz_bodies(seed: int, n: int):
    """``n`` frame bodies (bytes): random bytes, mutated JSON text and
    structurally mutated requests, in a seeded order."""
    rng = random.Random(seed)
    base = corpus(rng)
    made = 0
    while made < n:
        kind = rng.randrange(10)
        if kind == 0:
            body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
        elif kind == 1:
            body = b"[" * rng.randrange(1, 200000) if rng.random() < 0.05 else \
                json.dumps(rng.choice(_JUNK_VALUES)).encode()
        elif kind < 5:
            body = _mutate_bytes(json.dumps(rng.choice(base)).encode(), rng)
        else:
            obj = _mutate_obj(rng.choice(base), rng)
            try:
                body = json.dumps(obj).encode()
            except ValueError:
                continue
        if would_write(body):
            continue
        made += 1
        yield body
