"""``bk run``, ``bk N DUR -- CMD``, ``bk j`` and ``bk w`` as a user types
them: real processes (the built bk.pyz, or ``python -m bk``), a pseudo-
terminal for ``bk run -- CMD``, and a second real user for privacy."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers_broker import Accounts, needs_root

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def env(tmp_path):
    cfg = tmp_path / "cfg" / "bk"
    cfg.mkdir(parents=True)
    (cfg / "config.json").write_text(json.dumps({"slot_minutes": 1, "worker_termination_grace_seconds": 2}))
    return {"BK_DATA_DIR": str(tmp_path / "data"), "BK_GPU_COUNT": "4", "HOME": str(tmp_path),
            "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TZ": "UTC", "PYTHONPATH": str(ROOT)}


def bk(env, *argv, code=0, cwd=None, **extra):
    p = subprocess.run([sys.executable, "-m", "bk", *argv], env={**env, **extra}, capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, timeout=60, cwd=cwd or env["HOME"])
    assert p.returncode == code, (argv, p.returncode, p.stdout, p.stderr)
    return p


@pytest.mark.slow
def test_the_before_stop_check_through_the_archive(pyz, tmp_path):
    env = {"BK_DATA_DIR": str(tmp_path / "d"), "BK_GPU_COUNT": "4", "HOME": str(tmp_path),
           "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "XDG_CONFIG_HOME": str(tmp_path / "c")}
    for argv in (["1", "30m"], ["2", "1h30m", "12g"], ["x", "1", "2h"], ["run", "--", "true"]):
        p = subprocess.run([sys.executable, str(pyz), *argv], env=env, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=60)
        assert p.returncode == 0, (argv, p.stdout, p.stderr)
    assert "running on booking 1" in p.stderr            # several active: it says which
    p = subprocess.run([sys.executable, str(pyz), "run", "-r", "3", "--json", "--", "sh", "-c",
                        "echo $CUDA_VISIBLE_DEVICES $BK_RESERVED_GPUS >&2; exit 7"], env=env,
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert p.returncode == 7 and p.stderr.strip() == "3 3"
    doc = json.loads(p.stdout)
    assert doc["ok"] and doc["data"]["exit_code"] == 7 and doc["data"]["reservation"]["gpus"] == [3]


def test_run_json_keeps_stdout_for_the_envelope_alone(pyz, env):
    """Issue 30 item 6: `bk run --json -- CMD` printed the command's output
    and then the envelope, both on stdout; a program could parse neither."""
    bk(env, "1", "30m")
    p = subprocess.run([sys.executable, str(pyz), "run", "--json", "--", "sh", "-c",
                        "echo to-stdout; echo to-stderr >&2; exit 3"], env=env, capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, timeout=60, cwd=env["HOME"])
    assert p.returncode == 3, p.stderr
    doc = json.loads(p.stdout)                          # the whole of stdout: one envelope
    assert doc["ok"] and doc["data"]["exit_code"] == 3 and doc["data"]["stopped"] is None
    assert p.stderr.splitlines() == ["to-stdout", "to-stderr"]
    # Without --json the command keeps stdout, and bk adds nothing to it.
    p = subprocess.run([sys.executable, str(pyz), "run", "--", "sh", "-c", "echo to-stdout"], env=env,
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, cwd=env["HOME"])
    assert (p.returncode, p.stdout, p.stderr) == (0, "to-stdout\n", "")


def test_run_with_no_active_booking_says_how_to_book(env):
    p = bk(env, "run", "--", "true", code=4)
    assert "no active booking" in p.stderr and "bk run 1 1h -- CMD" in p.stderr
    doc = json.loads(bk(env, "--json", "run", code=4).stdout)
    assert doc["error"]["code"] == "not_found"


def test_run_alone_shows_the_gpus_and_environment(env):
    bk(env, "1", "30m", "-g", "2")
    doc = json.loads(bk(env, "run", "--json").stdout)["data"]
    assert doc["env"]["CUDA_VISIBLE_DEVICES"] == "2" and doc["env"]["BK_RESERVED_GPUS"] == "2"
    assert doc["env"]["BK_RESERVATION_ID"] == doc["reservation"]["id"]
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in bk(env, "run").stdout


@pytest.mark.slow
def test_run_stops_the_command_when_the_booking_ends(env):
    now = int(time.time())
    fixed = str(now - now % 60 + 57)                    # 3 s before the one-minute booking ends
    bk(env, "1", "1m", BK_NOW=fixed)
    # TERM 1 s in (3 s left, grace 2 s): the command says so and exits 0; bk exits 124 all the same.
    p = bk(env, "run", "--", "sh", "-c", "trap 'echo got TERM >&2; exit 0' TERM; while :; do sleep 0.1; done",
           code=124, BK_NOW=fixed)
    assert "got TERM" in p.stderr
    assert "ended" in p.stderr and "124" in p.stderr
    # One that ignores TERM is killed at the end, its whole process group with it.
    p = bk(env, "run", "--json", "--", "sh", "-c", "trap '' TERM; while :; do sleep 0.1; done",
           code=124, BK_NOW=fixed)
    data = json.loads(p.stdout)["data"]
    assert data["stopped"] == "end" and data["returncode"] == -signal.SIGKILL and data["exit_code"] == 124


def test_run_keeps_the_terminal_and_forwards_ctrl_c(env):
    bk(env, "1", "30m")
    child = ("import os, sys; print('tty', os.isatty(0), os.isatty(1), os.getpgrp() == os.tcgetpgrp(0), "
             "flush=True); input()")
    pid, fd = pty.fork()
    if pid == 0:                                          # the child: bk on the pseudo-terminal
        try:
            os.chdir(env["HOME"])
            os.execve(sys.executable, [sys.executable, "-m", "bk", "run", "--", sys.executable, "-c", child],
                      env)
        finally:
            os._exit(99)
    out = b""
    try:
        deadline = time.monotonic() + 20
        while b"tty" not in out or not out.rstrip().endswith(b"True"):
            assert time.monotonic() < deadline, out
            out += os.read(fd, 1024)
        assert b"tty True True True" in out              # stdin and stdout are the terminal, in the foreground
        os.write(fd, b"\x03")                              # Ctrl-C, as typed
        while True:
            try:
                chunk = os.read(fd, 1024)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 130, out
    assert b"KeyboardInterrupt" in out


@pytest.mark.slow
def test_booking_with_a_command_warns_without_a_worker_and_lists_the_job(env, tmp_path):
    p = bk(env, "1", "30m", "--", "echo", "s3cr3t-token")
    assert "no bk worker is running" in p.stderr and "loginctl enable-linger" in p.stderr
    assert "job echo +1 arg: pending" in p.stdout
    listed = json.loads(bk(env, "l", "--json").stdout)["data"]["reservations"]
    assert listed[0]["job"]["status"] == "pending" and listed[0]["job"]["summary"] == "echo +1 arg"
    assert "job of 1 [" in bk(env, "l").stdout
    assert json.loads(bk(env, "w", "--json").stdout)["data"]["worker"]["state"] == "absent"
    assert bk(env, "w", "once").returncode == 0
    jobs = json.loads(bk(env, "j", "--json").stdout)["data"]["jobs"]
    assert jobs[0]["status"] == "succeeded" and jobs[0]["exit_code"] == 0
    # the booking ended with its command: no longer among yours, so named by its ID
    assert jobs[0]["reason"].startswith("ended early: the command finished at ") and "(exit 0)" in jobs[0]["reason"]
    assert json.loads(bk(env, "l", "--json").stdout)["data"]["reservations"] == []
    ref = jobs[0]["reservation_short_id"]
    log = json.loads(bk(env, "j", "log", ref, "--json").stdout)["data"]
    assert log["log"] == "s3cr3t-token\n"
    assert bk(env, "j", "log", ref).stdout == "s3cr3t-token\n"
    p = bk(env, "j", "retry", ref, code=2)                 # it succeeded: nothing to retry
    assert "succeeded" in p.stderr and "can be retried" in p.stderr
    for name in ("ledger.json", "audit.jsonl"):
        assert "s3cr3t" not in (tmp_path / "data" / name).read_text()


def test_the_ledger_confirms_no_guess_of_a_private_command_and_the_worker_still_runs_it(pyz, env):
    """Issue 22: the world-readable ledger held the sha256 of each job spec,
    whose other fields (id, time, cwd, PATH) are all guessable, so a
    dictionary over command lines confirmed the secret one.  An attacker who
    guesses every field right, here exactly, still cannot match the ledger's
    value; the owner's worker (the built archive) verifies the spec and runs it."""
    import hashlib

    token = "s3cr3t-" + os.urandom(4).hex()
    argv = ["echo", "--token", token]

    def pyz_bk(*words, code=0):
        p = subprocess.run([sys.executable, str(pyz), *words], env=env, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=60, cwd=env["HOME"])
        assert p.returncode == code, (words, p.stdout, p.stderr)
        return p

    pyz_bk("1", "30m", "--", *argv)
    ledger = json.loads((Path(env["BK_DATA_DIR"]) / "ledger.json").read_text())
    (res,) = [r for r in ledger["reservations"] if r.get("job")]
    job = res["job"]
    assert token not in json.dumps(ledger)
    created = res["created"] if isinstance(res["created"], int) else None
    times = range(created - 5, created + 6) if created is not None else range(int(time.time()) - 60,
                                                                            int(time.time()) + 1)
    for guess in ([*argv], ["echo", "--token", "wrong"]):
        for t in times:
            doc = {"schema": "gpubk.jobspec.v1", "id": job["id"], "argv": guess, "cwd": env["HOME"],
                   "path": env["PATH"], "created": t}
            data = (json.dumps(doc, sort_keys=True, ensure_ascii=True, separators=(",", ":")) + "\n").encode()
            assert hashlib.sha256(data).hexdigest() != job["digest"], (guess, t)
    pyz_bk("w", "once")
    done = json.loads(pyz_bk("j", "--json").stdout)["data"]["jobs"][0]
    assert done["status"] == "succeeded", done
    missing = json.loads(pyz_bk("j", "log", "1", "--json", code=4).stdout)["error"]     # it ended with its command
    assert "ends when it exits" in missing["hint"]
    ref = done["short_id"]
    assert json.loads(pyz_bk("j", "log", ref, "--json").stdout)["data"]["log"] == f"--token {token}\n"


def test_a_job_that_writes_25_mib_and_exits_within_a_tick_keeps_at_most_two_8_mib_segments(pyz, env):
    """Issue 30: the cap was checked once per worker tick, so a job that
    wrote fast and ended between two ticks left one 30 MB log.  Through the
    built archive: 25 MiB and an end mark, written at once; at most two
    segments of 8 MiB are left, the newest output in them."""
    # One write(2) of it all, then exit: on a file, done before any tick.
    writer = ("import os\n"
              "view = memoryview(b''.join(bytes([97 + i]) * (1 << 20) for i in range(25)) + b'END')\n"
              "while view: view = view[os.write(1, view):]\n"
              "os._exit(0)\n")

    def pyz_bk(*words):
        p = subprocess.run([sys.executable, str(pyz), *words], env=env, capture_output=True,
                           stdin=subprocess.DEVNULL, timeout=120, cwd=env["HOME"])
        assert p.returncode == 0, (words, p.stdout, p.stderr)
        return p.stdout

    pyz_bk("1", "30m", "--", sys.executable, "-c", writer)
    pyz_bk("w", "once")
    job = json.loads(pyz_bk("j", "--json"))["data"]["jobs"][0]
    assert job["status"] == "succeeded", job
    logs = Path(env["BK_DATA_DIR"]) / "state" / "jobs" / "logs"
    sizes = {p.name.split(".", 1)[1]: p.stat().st_size for p in logs.iterdir()}
    # 25 MiB + 3: three full segments went by; the newest full one and the
    # 1 MiB + 3 after it are left.
    assert sizes == {"log": 2**20 + 3, "log.1": 8 * 2**20}, sizes
    whole = json.loads(pyz_bk("j", "log", job["short_id"], "--all", "--json"))["data"]
    assert whole["log"] == "".join(chr(97 + i) * 2**20 for i in range(16, 25)) + "END"
    assert pyz_bk("j", "log", job["short_id"]).endswith(b"yyyyEND\n")


def test_a_booking_made_for_a_command_ends_with_it_unless_kept(pyz, env):
    """Issue 25 item 3, through the built archive: ``bk run 1 30m -- CMD``
    and the worker (``bk w once``): the booking ends when the command exits
    (its GPU books again at once), and ``--keep`` keeps it."""
    def pyz_bk(*words, code=0):
        p = subprocess.run([sys.executable, str(pyz), *words], env=env, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=60, cwd=env["HOME"])
        assert p.returncode == code, (words, p.stdout, p.stderr)
        return p

    def said(p):
        return " ".join(p.stdout.split())              # as one line, however the terminal wrapped it

    assert "the booking ends when it exits" in said(pyz_bk("run", "1", "30m", "-g", "0", "--", "true"))
    assert "the booking ends when it exits" not in said(pyz_bk("run", "1", "30m", "-g", "1", "--keep", "--", "true"))
    pyz_bk("w", "once")
    by_gpu = {j["gpus"][0]: j for j in json.loads(pyz_bk("j", "--json").stdout)["data"]["jobs"]}
    assert by_gpu[0]["status"] == by_gpu[1]["status"] == "succeeded"
    assert by_gpu[0]["reason"].startswith("ended early: the command finished at ")
    assert by_gpu[1]["reason"] is None
    live = json.loads(pyz_bk("l", "--json").stdout)["data"]["reservations"]
    assert [r["gpus"] for r in live] == [[1]]
    pyz_bk("1", "30m", "-g", "0")                         # the rest of the window is free
    p = pyz_bk("run", "--keep", "--", "true", code=2)
    assert "--keep is for a booking bk run makes" in p.stderr


def test_commands_after_dashes_are_never_bks(env):
    p = bk(env, "1", "30m", "-g", "1", "--", "sh", "-c", "exit 0", "--json", "-g", "3")
    assert "GPU (1)" in p.stdout                          # -g 3 and --json were the command's
    assert "takes no command" in bk(env, "l", "--", "x", code=2).stderr
    assert "needs the command after --" in bk(env, "run", "1", "30m", code=2).stderr


@pytest.mark.slow
def test_a_second_worker_is_turned_away(env):
    proc = subprocess.Popen([sys.executable, "-m", "bk", "w", "start"], env=env, cwd=env["HOME"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while json.loads(bk(env, "w", "--json").stdout)["data"]["worker"]["state"] != "running":
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        st = json.loads(bk(env, "w", "--json").stdout)["data"]["worker"]
        assert st["pid"] == proc.pid and st["since"]
        p = bk(env, "w", "start", code=75)
        assert "already running" in p.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    assert proc.returncode == 0


def test_a_turned_away_worker_never_says_it_started(pyz, env):
    """Issue 30 item 13: the second `bk w start` printed "started" and then
    "already running"."""
    proc = subprocess.Popen([sys.executable, str(pyz), "w", "start"], env=env, cwd=env["HOME"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while json.loads(bk(env, "w", "--json").stdout)["data"]["worker"]["state"] != "running":
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        p = subprocess.run([sys.executable, str(pyz), "w", "start"], env=env, cwd=env["HOME"], capture_output=True,
                           text=True, stdin=subprocess.DEVNULL, timeout=60)
        assert p.returncode == 75, p.stderr
        assert p.stderr.startswith(f"error: a bk worker is already running for you (process {proc.pid})"), p.stderr
        assert "started" not in p.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert err.startswith(f"bk worker: started (pid {proc.pid})"), err     # the one that runs says so


@pytest.mark.slow
@pytest.mark.root
@needs_root
def test_the_command_line_reaches_no_file_another_user_can_read(tmp_path):
    base = tmp_path / "world"
    base.mkdir()
    for p in (tmp_path, base):
        p.chmod(0o755)
    env = {"BK_DATA_DIR": str(base / "data"), "BK_GPU_COUNT": "2", "HOME": str(base),
           "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(base / "cache")}
    token = "tok-" + os.urandom(8).hex()
    bk(env, "1", "30m", "--", "echo", token)
    bk(env, "w", "once")
    found = [p for p in base.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert found, "the spec and the log hold it"
    for p in found:                                       # only the private spec and log, 0600 in 0700
        assert "/state/jobs/" in str(p) and (p.stat().st_mode & 0o077) == 0, p
    for name in ("ledger.json", "audit.jsonl"):
        assert token not in (base / "data" / name).read_text()
    accounts = Accounts(tmp_path)
    try:
        other = accounts.user()
        probe = ("import os, sys\nhits = []\nfor d, _, names in os.walk(sys.argv[1]):\n"
                 "    for n in names:\n        try:\n            data = open(os.path.join(d, n), 'rb').read()\n"
                 "        except OSError:\n            continue\n"
                 "        if sys.argv[2].encode() in data:\n            hits.append(os.path.join(d, n))\n"
                 "print(hits)\n")
        p = subprocess.run(["/usr/bin/python3", "-c", probe, str(base), token], user=other.uid, group=other.gid,
                           extra_groups=[], capture_output=True, text=True, timeout=60, cwd="/")
        assert p.returncode == 0 and p.stdout.strip() == "[]", (p.stdout, p.stderr)
    finally:
        accounts.cleanup()


def test_the_help_examples_are_real_commands():
    import re
    import shlex

    from bk.cli.app import _strip_json, build_parser, parse_argv

    for word in ("run", "jobs", "worker"):
        parser = build_parser(word)
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        examples = sub.choices[word].epilog.split("Examples:", 1)[1].split("\n\n")[0]
        lines = [line for line in examples.strip().splitlines() if line.strip()]
        assert lines, word
        for line in lines:
            words = shlex.split(re.split(r"\s{2,}", line.strip())[0])
            assert words[0] == "bk", line
            parse_argv(_strip_json(words[1:])[0])
