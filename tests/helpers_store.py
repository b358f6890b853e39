"""Store test helpers: a workload whose every write can be checked, a
verifier, and writer processes.

Each operation ("op") creates ``k`` bookings tagged with the op's name and
bumps a counter in the ledger's unknown top-level fields, so after any crash
the verifier can tell a whole op from a partial one and a lost update from a
duplicate.  Half of the bookings lie a month in the past and move to the
archive at the next commit, so the archive path is crashed into as well.

Run as a script (``python tests/helpers_store.py MODE ...``) it is a writer:

``writer DATA ACKS NAME COUNT``  COUNT ops in a row, then exit.
``zygote DATA ACKS``  reads commands on stdin and forks a writer per
    command, so that hundreds of crash points cost a fork each, not a Python
    start-up each:
    ``step STEP TAG K`` one op with ``BK_TEST_CRASH_AT=STEP``; replies
    ``exit STATUS`` (negative: killed by that signal);
    ``loop NAME SEED`` a writer that runs ops until killed; replies ``pid PID``;
    ``kill PID`` SIGKILL it and reap it; replies ``killed STATUS``.

An op is acknowledged by appending ``TAG`` to ACKS after ``transact``
returned: a single ``O_APPEND`` write, so concurrent writers never mix lines.
"""

from __future__ import annotations

import fcntl
import os
import random
import signal
import sys
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bk.core import ledgercheck  # noqa: E402
from bk.core.models import Mutation, Policy, Reservation  # noqa: E402
from bk.store.ledger import Store  # noqa: E402

NOW = 1_780_000_000
POLICY = Policy(gpu_count=2).bound()
SCRIPT = str(Path(__file__).resolve())


def make_store(data_dir, **kw) -> Store:
    kw.setdefault("lock_timeout", 60.0)
    kw.setdefault("min_free_bytes", 0)
    return Store(str(data_dir), clock=lambda: NOW, **kw)


def tag_for(name: str, k: int) -> str:
    return f"{name}-k{k}"


def k_of(tag: str) -> int:
    return int(tag.rsplit("-k", 1)[1])


def op(tag: str):
    """apply(): create k_of(tag) bookings noted ``tag``; count the op."""
    k = k_of(tag)

    def apply(state):
        n = state.extra.get("test_slots", 0)
        ids, records = [], []
        for slot in range(n, n + k):
            start = NOW + 3600 + slot * 600 if slot % 2 else NOW - 30 * 86400 + slot * 600
            rid = str(uuid.uuid4())
            state.reservations.append(Reservation(rid, 1000, "tester", "shared", (slot % 2,), 1,
                                                  start, start + 300, NOW, note=tag))
            records.append({"action": "create", "reservation": rid, "op_id": tag,
                            "after": {"slot": slot}, "result": "created"})
            ids.append(rid)
        state.extra["test_slots"] = n + k
        state.extra["test_ops"] = state.extra.get("test_ops", 0) + 1
        return Mutation(True, records, ids)
    return apply


def run_op(store: Store, tag: str, acks: str) -> None:
    store.transact(op(tag), policy=POLICY, actor_uid=1000, actor="tester")
    fd = os.open(acks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{tag}\n".encode())
    finally:
        os.close(fd)


def read_acks(path) -> list[str]:
    try:
        return Path(path).read_text().split()
    except FileNotFoundError:
        return []


def noop(state):
    return Mutation(False)


def verify(data_dir, acked, *, repair: bool = True) -> dict:
    """Assert the crash-safety contract on ``data_dir``; return a summary.

    Holds the writers' lock while it looks (running writers wait), so that
    the ledger, the archive and the audit log are read as one snapshot."""
    lock = os.open(os.path.join(data_dir, "ledger.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        summary = _verify(data_dir, acked)
    finally:
        os.close(lock)
    if repair:
        store = make_store(data_dir)
        store.transact(noop, policy=POLICY, actor_uid=0, actor="verify")
        _verify(data_dir, acked, pending=False)
        leftovers = [n for n in os.listdir(data_dir) if n.startswith(".ledger.json.tmp")]
        assert not leftovers, leftovers
    return summary


def _verify(data_dir, acked, *, pending: bool = True) -> dict:
    store = make_store(data_dir)
    got = store.read()
    assert got.source in ("ledger", "empty") and not got.warnings, (got.source, got.warnings)
    state = got.state
    assert ledgercheck.check_state(state) == []
    hot = {r.id: r for r in state.reservations}
    everything = {r.id: r for r in store.archived()}
    everything.update(hot)
    per_op = Counter(r.note for r in everything.values())
    partial = {t: n for t, n in per_op.items() if n != k_of(t)}
    assert not partial, f"partial writes visible: {partial}"
    lost = sorted(set(acked) - set(per_op))
    assert not lost, f"acknowledged writes lost: {lost[:10]}"
    assert state.extra.get("test_ops", 0) == len(per_op), "lost or doubled update"
    _check_audit(store, state.seq, everything, per_op, pending=pending)
    return {"seq": state.seq, "ops": len(per_op), "hot": len(hot), "all": len(everything)}


def _check_audit(store, seq, everything, per_op, *, pending):
    tail = store.audit_tail(limit=1 << 30, max_bytes=1 << 30, include_pending=pending)
    bad = [p for p in tail.problems if "incomplete" not in p or not pending]
    assert not bad, bad
    commits = Counter(e["seq"] for e in tail.entries)
    assert set(commits) == set(range(1, seq + 1)), "audit commits differ from ledger commits"
    created = [e["reservation"] for e in tail.entries if e["action"] == "create"]
    assert len(created) == len(set(created)), "duplicate audit records"
    assert set(created) == set(everything), "audit log and ledger disagree"
    assert Counter(e["op_id"] for e in tail.entries if e["action"] == "create") == per_op


# --- writer processes -------------------------------------------------------------

def _writer(data, acks, name, count):
    rng = random.Random(name)
    store = make_store(data)
    for i in range(int(count)):
        run_op(store, tag_for(f"{name}.{i}", rng.randint(1, 3)), acks)


def _one(data, tag, acks):
    run_op(make_store(data), tag, acks)


def _loop(data, acks, name, seed):
    rng = random.Random(int(seed))
    store = make_store(data)
    i = 0
    while True:
        run_op(store, tag_for(f"{name}.{i}", rng.randint(1, 3)), acks)
        i += 1


def _status(st: int) -> int:
    return -os.WTERMSIG(st) if os.WIFSIGNALED(st) else os.WEXITSTATUS(st)


def _fork(fn, *args, env=None) -> int:
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            if env:
                os.environ.update(env)
            fn(*args)
        except BaseException:  # the child must never return into the zygote loop
            import traceback
            traceback.print_exc()
            code = 1
        os._exit(code)
    return pid


def _zygote(data, acks):
    def reply(text):
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "step":
            step, tag = cmd[1], cmd[2]
            env = {"BK_TEST_CRASH_AT": step} if step != "none" else {}
            pid = _fork(_one, data, tag, acks, env=env)
            reply(f"exit {_status(os.waitpid(pid, 0)[1])}")
        elif cmd[0] == "loop":
            reply(f"pid {_fork(_loop, data, acks, cmd[1], cmd[2])}")
        elif cmd[0] == "kill":
            pid = int(cmd[1])
            os.kill(pid, signal.SIGKILL)
            reply(f"killed {_status(os.waitpid(pid, 0)[1])}")


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    {"writer": _writer, "zygote": _zygote}[mode](*rest)
