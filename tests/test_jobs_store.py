"""Private job specs and job logs on a real file system (bk.jobs.specs,
bk.jobs.logs): created exclusively and 0600, refused when changed, bounded."""

from __future__ import annotations

import os
import stat

import pytest

from bk.core.errors import ConfigError, IOFailure, NotFound
from bk.jobs import logs, specs

JID = "0123456789abcdef" * 2


@pytest.fixture
def jobs(tmp_path):
    return str(tmp_path / "state" / "jobs")


def test_a_spec_is_private_and_bound_by_its_digest(jobs):
    digest = specs.write_spec(jobs, JID, ["python3", "train.py", "--key", "hunter2"], "/tmp", "/usr/bin", 5)
    path = os.path.join(jobs, "specs", f"{JID}.json")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.join(jobs, "specs")).st_mode) == 0o700
    spec = specs.read_spec(jobs, JID, digest)
    assert spec.argv == ("python3", "train.py", "--key", "hunter2") and spec.cwd == "/tmp"
    assert spec.path == "/usr/bin"


def _unsalted(job_id, argv, cwd, path, created) -> bytes:
    """A spec as bk wrote it before salts (and as a dictionary attack would
    rebuild one from a guess): the same fields, the same canonical JSON."""
    import json

    doc = {"schema": specs.SCHEMA, "id": job_id, "argv": list(argv), "cwd": cwd, "path": path,
           "created": created}
    return (json.dumps(doc, sort_keys=True, ensure_ascii=True, separators=(",", ":")) + "\n").encode()


def test_a_correct_guess_of_every_field_cannot_be_confirmed_by_the_digest(jobs):
    import hashlib

    argv = ["python3", "train.py", "--token", "s3cr3t"]
    digest = specs.write_spec(jobs, JID, argv, "/home/ada", "/usr/local/bin:/usr/bin:/bin", 1_700_000_000)
    guess = _unsalted(JID, argv, "/home/ada", "/usr/local/bin:/usr/bin:/bin", 1_700_000_000)
    assert hashlib.sha256(guess).hexdigest() != digest
    with open(os.path.join(jobs, "specs", f"{JID}.json"), "rb") as f:
        doc = __import__("json").loads(f.read())
    assert len(bytes.fromhex(doc["salt"])) == specs.SALT_BYTES
    assert specs.read_spec(jobs, JID, digest).argv == tuple(argv)       # the owner still verifies it
    other = "f" * 32                                                   # and no two specs share a salt
    specs.write_spec(jobs, other, argv, "/home/ada", None, 1)
    with open(os.path.join(jobs, "specs", f"{other}.json"), "rb") as f:
        assert __import__("json").loads(f.read())["salt"] != doc["salt"]


def test_a_spec_written_before_salts_still_verifies_for_its_owner(jobs):
    import hashlib

    specs.write_spec(jobs, "f" * 32, ["true"], "/", None, 5)          # makes the directories
    data = _unsalted(JID, ["echo", "hi"], "/tmp", "/usr/bin", 5)
    fd = os.open(os.path.join(jobs, "specs", f"{JID}.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, data)
    os.close(fd)
    spec = specs.read_spec(jobs, JID, hashlib.sha256(data).hexdigest())
    assert spec.argv == ("echo", "hi") and spec.cwd == "/tmp" and spec.path == "/usr/bin"


def test_a_spec_is_never_overwritten(jobs):
    specs.write_spec(jobs, JID, ["true"], "/", None, 5)
    with pytest.raises(IOFailure):
        specs.write_spec(jobs, JID, ["evil"], "/", None, 5)


def test_a_planted_link_is_not_followed(jobs, tmp_path):
    specs.write_spec(jobs, "f" * 32, ["true"], "/", None, 5)        # makes the directories
    target = tmp_path / "victim"
    target.write_text("keep")
    os.symlink(target, os.path.join(jobs, "specs", f"{JID}.json"))
    with pytest.raises(IOFailure):
        specs.write_spec(jobs, JID, ["true"], "/", None, 5)
    assert target.read_text() == "keep"


def test_a_changed_spec_is_refused(jobs):
    digest = specs.write_spec(jobs, JID, ["true"], "/", None, 5)
    path = os.path.join(jobs, "specs", f"{JID}.json")
    with open(path, "r+b") as f:
        f.write(f.read().replace(b'"true"', b'"rm -rf"'))
    with pytest.raises(IOFailure, match="changed after the booking"):
        specs.read_spec(jobs, JID, digest)
    os.chmod(path, 0o644)
    with pytest.raises(IOFailure, match="others may read it"):
        specs.read_spec(jobs, JID, digest)
    os.chmod(path, 0o666)
    with pytest.raises(ConfigError):                                  # writable by others
        specs.read_spec(jobs, JID, digest)
    os.unlink(path)
    with pytest.raises(NotFound):
        specs.read_spec(jobs, JID, digest)


def test_clean_keeps_live_and_young_specs(jobs):
    a, b, c = "a" * 32, "b" * 32, "c" * 32
    for j in (a, b, c):
        specs.write_spec(jobs, j, ["true"], "/", None, 5)
    old = os.stat(os.path.join(jobs, "specs", f"{a}.json")).st_mtime
    gone = specs.clean(jobs, keep={b}, now=old + 1000, grace_s=600)
    assert sorted(gone) == [a, c] and set(specs.listed(jobs)) == {b}
    specs.write_spec(jobs, a, ["true"], "/", None, 5)          # young: its booking may be committing
    young = os.stat(os.path.join(jobs, "specs", f"{a}.json")).st_mtime
    os.utime(os.path.join(jobs, "specs", f"{b}.json"), (young - 1000, young - 1000))   # b: no longer live, old
    assert specs.clean(jobs, keep=set(), now=young + 10, grace_s=600) == [b] and set(specs.listed(jobs)) == {a}


def test_logs_rotate_in_two_segments(jobs):
    fd = logs.open_for_job(jobs, JID)
    try:
        os.write(fd, b"a" * 100)
        assert not logs.rotate(jobs, JID, segment=150)
        os.write(fd, b"b" * 100)
        assert logs.rotate(jobs, JID, segment=150)                 # 200 > 150: keep the newest 150
        os.write(fd, b"c" * 10)                                    # O_APPEND: lands at the new start
    finally:
        os.close(fd)
    data, cut = logs.read(jobs, JID, limit=None)
    assert data == b"a" * 50 + b"b" * 100 + b"c" * 10 and not cut
    tail, cut = logs.read(jobs, JID, limit=20)
    assert tail == b"b" * 10 + b"c" * 10 and cut
    for name in os.listdir(os.path.join(jobs, "logs")):
        assert stat.S_IMODE(os.stat(os.path.join(jobs, "logs", name)).st_mode) == 0o600


def _segments(jobs) -> dict:
    d = os.path.join(jobs, "logs")
    return {n: os.path.getsize(os.path.join(d, n)) for n in os.listdir(d)} if os.path.isdir(d) else {}


def test_the_log_pump_keeps_the_cap_at_every_write_while_the_job_runs(jobs, tmp_path):
    """Issue 30: the worker checked a log's size once per tick, so a fast
    writer grew one far past the two promised segments.  With the pump, a
    job that has written 3.5 segments and still runs has exactly its newest
    1.5 segments on disk, and a new segment starts on the very byte."""
    import subprocess
    import sys
    import time

    gate = tmp_path / "gate"
    os.mkfifo(gate)
    writer = ("import sys; out = sys.stdout.buffer\n"
              "for i in range(35): out.write(bytes([65 + i % 26]) * 100); out.flush()\n"
              f"open({str(gate)!r}).read()\n"
              "out.write(b'!end'); out.flush()\n")
    fd, pump = logs.start_pump(jobs, JID, segment=1000)
    try:
        job = subprocess.Popen([sys.executable, "-c", writer], stdout=fd, stderr=fd)
    finally:
        os.close(fd)
    try:
        deadline = time.monotonic() + 20
        while _segments(jobs).get(f"{JID}.log") != 500:        # the pump has copied all 3,500 bytes
            assert time.monotonic() < deadline, _segments(jobs)
            assert job.poll() is None and pump.poll() is None
            time.sleep(0.01)
        assert _segments(jobs) == {f"{JID}.log": 500, f"{JID}.log.1": 1000}
        data, cut = logs.read(jobs, JID, limit=None)
        assert data == b"".join(bytes([65 + i % 26]) * 100 for i in range(20, 35)) and not cut
    finally:
        with open(gate, "w") as g:
            g.write("go")
        job.wait(20)
    assert pump.wait(20) == 0                                    # the job's end closed the pipe
    assert _segments(jobs) == {f"{JID}.log": 504, f"{JID}.log.1": 1000}
    assert logs.read(jobs, JID, limit=4)[0] == b"!end"
    for name in os.listdir(os.path.join(jobs, "logs")):
        assert stat.S_IMODE(os.stat(os.path.join(jobs, "logs", name)).st_mode) == 0o600


def test_a_log_over_the_cap_from_before_the_pump_is_cut_back_before_it_grows(jobs):
    import subprocess

    fd = logs.open_for_job(jobs, JID)
    os.write(fd, b"o" * 5000)                                  # an old worker's 5-segment log
    os.close(fd)
    w, pump = logs.start_pump(jobs, JID, segment=1000)
    subprocess.run(["printf", "new"], stdout=w, check=True)
    os.close(w)
    assert pump.wait(20) == 0
    assert _segments(jobs) == {f"{JID}.log": 3, f"{JID}.log.1": 1000}
    assert logs.read(jobs, JID, limit=None)[0] == b"o" * 1000 + b"new"


def test_logs_are_bounded_by_age_and_total(jobs):
    ids = ["1" * 32, "2" * 32, "3" * 32]
    for i, j in enumerate(ids):
        fd = logs.open_for_job(jobs, j)
        os.write(fd, b"x" * 1000)
        os.close(fd)
        os.utime(os.path.join(jobs, "logs", f"{j}.log"), (1000 + i * 100, 1000 + i * 100))
    # the oldest is past the age limit; the running one is never removed
    assert logs.clean(jobs, running={ids[0]}, now=1000 + 50 + 10_000, max_age_s=10_000) == []
    assert logs.clean(jobs, running=set(), now=1000 + 10_050, max_age_s=10_000) == [ids[0]]
    assert logs.clean(jobs, running=set(), now=1300, total_bytes=1500) == [ids[1]]
    assert set(logs.sizes(jobs)) == {ids[2]}


def test_every_directory_a_spec_creates_is_private(tmp_path):
    """A trial BK_DATA_DIR that the first job spec creates (data/state/jobs)
    must come out 0700 at every level, like the ledger makes it."""
    jobs = str(tmp_path / "data" / "state" / "jobs")
    specs.write_spec(jobs, JID, ["true"], "/tmp", "/usr/bin", 5)
    for d in (tmp_path / "data", tmp_path / "data" / "state", tmp_path / "data" / "state" / "jobs"):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
