"""Real sshd on loopback for the cluster tests: every "host" is an sshd
process on its own 127.0.0.x address and port, with its own host key, its
own sshd_config and, through sshd's ``SetEnv``, its own ``BK_DATA_DIR`` and
``BK_GPU_COUNT``: two distinct bk nodes on one machine (issue 16, item 8).

The test user logs in with a key in its ``~/.ssh``; host keys are in a test
known_hosts file that the catalog names per node, so ``StrictHostKeyChecking
=yes`` is exercised for real.  ``UsePAM no`` keeps the system's PAM stack out;
with it, sshd refuses a locked account, so the user gets the password ``*``
(no password works, but the account is not locked) and the shell /bin/sh.
Each sshd runs in the foreground (``-D``) as our child and is stopped by its
PID; node scripts that may outlive a killed ssh (a hanging node) record
their PID so that the test can end them by PID too.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def have_sshd() -> bool:
    return os.path.exists(SSHD) and shutil.which("ssh") is not None and shutil.which("ssh-keygen") is not None


def free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def wait_listening(addr: str, port: int, proc: subprocess.Popen, deadline_s: float = 10.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd on {addr}:{port} exited with {proc.returncode}: "
                               f"{proc.stderr.read().decode(errors='replace') if proc.stderr else ''}")
        try:
            # Its banner, not just a connection: another program may hold the port.
            with socket.create_connection((addr, port), timeout=0.5) as s:
                if s.recv(8).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"sshd on {addr}:{port} did not start listening")


class Lab:
    """A base directory (root-owned 0755) with the node programs in ``bin``,
    the user's key, the known_hosts file, and the sshd processes."""

    def __init__(self, base: Path, pyz: Path, user):
        self.base, self.user = base, user
        self.sshds: list[Sshd] = []
        self.bin = base / "bin"
        self.bin.mkdir(mode=0o755)
        self.pyz = base / "bk.pyz"
        shutil.copy(pyz, self.pyz)
        os.chmod(self.pyz, 0o644)
        self.known_hosts = base / "known_hosts"
        self.known_hosts.write_text("")
        os.chmod(self.known_hosts, 0o644)
        self.keys = base / "authorized_keys"
        self.keys.mkdir(mode=0o755)
        self.pids = base / "pids"
        self.pids.mkdir(mode=0o777)
        self.scratch = base / "scratch"           # the user's: the lossy node's marker and reply
        self.scratch.mkdir(mode=0o755)
        os.chown(self.scratch, user.uid, user.gid)
        self._user_key()
        self._programs()
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)     # sshd's privilege-separation directory

    def _user_key(self) -> None:
        u = self.user
        subprocess.run(["usermod", "-s", "/bin/sh", "-p", "*", u.name], check=True, capture_output=True)
        ssh_dir = Path(u.home) / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        key = ssh_dir / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        for p in (ssh_dir, key, key.with_suffix(".pub")):
            os.chown(p, u.uid, u.gid)
        (self.keys / u.name).write_text(key.with_suffix(".pub").read_text())
        os.chmod(self.keys / u.name, 0o644)

    def _programs(self) -> None:
        """``bk`` (the built archive) and the misbehaving nodes' programs."""
        def script(name: str, text: str) -> None:
            p = self.bin / name
            p.write_text(text)
            os.chmod(p, 0o755)

        script("bk", f'#!/bin/sh\nexec /usr/bin/python3 {self.pyz} "$@"\n')
        script("bk-garbage", "#!/bin/sh\necho 'Welcome to gpu-z! Today is a good day.'\n")
        script("bk-huge", "#!/bin/sh\nhead -c 20000000 /dev/zero | tr '\\0' x\n")
        script("bk-hang", f"#!/bin/sh\necho $$ > {self.pids}/hang.$$\nexec sleep 120\n")
        # Answers as whatever node its BK_DATA_DIR is, ignoring --expect: "another node's identity".
        script("bk-liar", "#!/usr/bin/python3\nimport os, sys\na = sys.argv[1:]\n"
                          "if '--expect' in a:\n    i = a.index('--expect'); del a[i:i + 2]\n"
                          f"os.execv('/usr/bin/python3', ['/usr/bin/python3', {str(self.pyz)!r}, *a])\n")
        # Commits the write (words with --op-id, or a row whose fields carry "op_id"),
        # then loses the reply (ssh exits 255 with nothing on stdout), once: while
        # the marker file exists.
        script("bk-lose", "#!/bin/sh\n"
                          f"if [ -e {self.scratch}/lose-marker ] && echo \"$*\" | grep -q -- 'op.id'; then\n"
                          f"  rm -f {self.scratch}/lose-marker\n"
                          f"  /usr/bin/python3 {self.pyz} \"$@\" > {self.scratch}/lost-reply.json\n"
                          "  exit 255\nfi\n"
                          f'exec /usr/bin/python3 {self.pyz} "$@"\n')

    def node_dir(self, name: str) -> Path:
        d = self.base / "nodes" / name
        d.parent.mkdir(mode=0o755, exist_ok=True)
        d.mkdir(mode=0o700)
        os.chown(d, self.user.uid, self.user.gid)
        return d

    def sshd(self, name: str, addr: str, *, gpus: int, data_dir: Path | None = None) -> Sshd:
        s = Sshd(self, name, addr, gpus=gpus, data_dir=data_dir or self.node_dir(name))
        s.start()
        self.sshds.append(s)
        return s

    def env(self, catalog: Path, **extra) -> dict:
        u = self.user
        return {"HOME": u.home, "USER": u.name, "LOGNAME": u.name, "PATH": "/usr/bin:/bin",
                "BK_CLUSTER_FILE": str(catalog), "LANG": "C.UTF-8", "COLUMNS": "120", **extra}

    def bk(self, catalog: Path, *argv: str, timeout: float = 60, **extra) -> subprocess.CompletedProcess:
        """``bk ARGV`` on the client, as the test user."""
        u = self.user
        return subprocess.run(["/usr/bin/python3", str(self.pyz), *argv], capture_output=True, text=True,
                              env=self.env(catalog, **extra), user=u.uid, group=u.gid, extra_groups=[],
                              cwd=u.home, timeout=timeout)

    def bk_json(self, catalog: Path, *argv: str, **kw) -> tuple[int, dict]:
        p = self.bk(catalog, *argv, "--json", **kw) if "--" not in argv else \
            self.bk(catalog, *argv[:argv.index("--")], "--json", *argv[argv.index("--"):], **kw)
        try:
            return p.returncode, json.loads(p.stdout)
        except ValueError:
            raise AssertionError(f"not one envelope (exit {p.returncode}): {p.stdout[:400]!r} {p.stderr[:400]!r}") \
                from None

    def stop(self) -> None:
        for s in self.sshds:
            s.stop()
        for f in self.pids.glob("*"):
            try:
                os.kill(int(f.read_text().strip()), 9)
            except (ValueError, ProcessLookupError):
                pass


class Sshd:
    def __init__(self, lab: Lab, name: str, addr: str, *, gpus: int, data_dir: Path):
        self.lab, self.name, self.addr, self.gpus, self.data_dir = lab, name, addr, gpus, data_dir
        self.port = free_port(addr)
        self.dir = lab.base / f"sshd-{name}"
        self.dir.mkdir(mode=0o700)
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        key = self.dir / "host_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        pub = key.with_suffix(".pub").read_text().split()
        # free_port's port is free when it answers, not when sshd binds it: on
        # a shared machine another process may take it in between, and sshd
        # exits.  Then take another.
        for attempt in range(5):
            try:
                self._launch(key)
                break
            except RuntimeError:
                if attempt == 4 or self.proc is None or self.proc.poll() is None:
                    raise
                self.port = free_port(self.addr)
        with open(self.lab.known_hosts, "a") as f:
            f.write(f"[{self.addr}]:{self.port} {pub[0]} {pub[1]}\n")

    def _launch(self, key: Path) -> None:
        cfg = self.dir / "sshd_config"
        cfg.write_text("\n".join((
            f"ListenAddress {self.addr}:{self.port}",
            f"HostKey {key}",
            f"PidFile {self.dir / 'sshd.pid'}",
            "UsePAM no",
            f"AuthorizedKeysFile {self.lab.keys}/%u",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "PermitRootLogin no",
            f"AllowUsers {self.lab.user.name}",
            "StrictModes no",
            "LogLevel ERROR",
            f"SetEnv BK_DATA_DIR={self.data_dir} BK_GPU_COUNT={self.gpus} PATH={self.lab.bin}:/usr/bin:/bin",
            "",
        )))
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_listening(self.addr, self.port, self.proc)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stderr:
            self.proc.stderr.close()

    def entry(self, **over) -> dict:
        """This node's catalog entry (its id read with ``bk c id`` on the node itself)."""
        doc = {"id": self.node_id(), "target": self.addr, "port": self.port,
               "known_hosts": str(self.lab.known_hosts), "timeout_s": 20}
        doc.update(over)
        return doc

    def node_id(self) -> str:
        u = self.lab.user
        p = subprocess.run(["/usr/bin/python3", str(self.lab.pyz), "c", "id", "--json"], capture_output=True,
                           text=True, user=u.uid, group=u.gid, extra_groups=[], cwd=u.home,
                           env={"HOME": u.home, "PATH": "/usr/bin:/bin", "BK_DATA_DIR": str(self.data_dir),
                                "BK_GPU_COUNT": str(self.gpus)}, timeout=60)
        return json.loads(p.stdout)["data"]["id"]


def write_catalog(path: Path, nodes: dict) -> Path:
    """A root-owned 0644 catalog file (what sudo bk admin cluster writes)."""
    path.write_text(json.dumps({"version": 1, "nodes": nodes}))
    os.chmod(path, 0o644)
    return path
