"""The Store: transactions, policy binding, lock timeout, backups,
archiving and retention, corruption fallback and refusal."""

from __future__ import annotations

import fcntl
import json
import os
import uuid

import pytest

from bk.core import ledgerdoc, utctime
from bk.core.errors import (
    EXIT_CONFIG,
    EXIT_IO,
    EXIT_TEMPFAIL,
    Busy,
    ConfigError,
    Internal,
    IOFailure,
    LostCommits,
)
from bk.core.models import Mutation, Policy, Reservation
from bk.store import health
from bk.store.ledger import Store

T = 1_780_000_000
POLICY = Policy(gpu_count=4).bound()


class Clock:
    def __init__(self, t=T):
        self.t = t

    def __call__(self):
        return self.t


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(tmp_path, clock):
    return Store(str(tmp_path / "data"), clock=clock, min_free_bytes=0)


def booking(start, end, uid=1000, **kw):
    return Reservation(str(uuid.uuid4()), uid, f"u{uid}", "shared", (0,), 1, start, end, start, **kw)


def add(*rs):
    def apply(state):
        state.reservations.extend(rs)
        return Mutation(True, [{"action": "create", "reservation": r.id, "owner": r.uid}
                               for r in rs], [r.id for r in rs])
    return apply


def commit(store, apply, policy=POLICY, uid=1000):
    return store.transact(apply, policy=policy, actor_uid=uid, actor=f"u{uid}")


def ledger_bytes(store):
    with open(store.paths.ledger, "rb") as f:
        return f.read()


def test_empty_then_commits(store, clock):
    got = store.read()
    assert (got.source, got.warnings, got.state.seq) == ("empty", [], 0)
    ids = commit(store, add(booking(T, T + 600)))
    ids += commit(store, add(booking(T + 600, T + 1200)))
    got = store.read()
    assert got.source == "ledger" and got.state.seq == 2
    assert [r.id for r in got.state.reservations] == ids
    assert got.state.policy == POLICY
    tail = store.audit_tail()
    assert [(e["seq"], e["index"], e["uid"], e["action"]) for e in tail.entries] == [
        (1, 0, 1000, "create"), (2, 0, 1000, "create")]
    assert tail.entries[0]["time"] == utctime.format_utc(T)


def test_unchanged_and_failed_transactions_write_nothing(store):
    commit(store, add(booking(T, T + 600)))
    before = (ledger_bytes(store), os.stat(store.paths.audit).st_size)
    assert commit(store, lambda s: Mutation(False, result="same")) == "same"

    def boom(state):
        state.reservations.clear()
        raise ValueError("apply failed")
    with pytest.raises(ValueError):
        commit(store, boom)

    def invalid(state):
        state.reservations.append(booking(T + 600, T + 300))
        return Mutation(True)
    with pytest.raises(Internal, match="end is not after start"):
        commit(store, invalid)
    with pytest.raises(Internal, match="not a Mutation"):
        commit(store, lambda s: None)
    assert (ledger_bytes(store), os.stat(store.paths.audit).st_size) == before


def test_commit_without_audit_items_still_logs(store):
    def touch(state):
        state.extra["x"] = 1
        return Mutation(True)
    commit(store, touch)
    assert [e["action"] for e in store.audit_tail().entries] == ["commit"]
    assert store.read().state.extra == {"x": 1}


def test_policy_binding(store):
    commit(store, add(booking(T, T + 600)))
    other = dict(POLICY, max_shared_users=3, slot_minutes=10)
    with pytest.raises(ConfigError) as e:
        commit(store, add(booking(T, T + 600)), policy=other)
    err = e.value
    assert err.exit_code == EXIT_CONFIG
    assert "max_shared_users: ledger 2, configuration 3" in err.message
    assert "slot_minutes: ledger 5, configuration 10" in err.message
    assert err.details["differences"]["max_shared_users"] == {"ledger": 2, "config": 3}
    with pytest.raises(ConfigError):
        commit(store, add(), policy=dict(POLICY, require_shared_memory=0))  # 0 is not False
    commit(store, add(), policy=dict(POLICY, new_rule=True))   # a key the ledger lacks is adopted
    assert store.read().state.policy == dict(POLICY, new_rule=True)


def test_lock_timeout_is_busy(store, tmp_path):
    commit(store, add())
    fd = os.open(store.paths.lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, b"4242\n", 0)
    waited = []
    fake = Clock(0)

    def sleep(s):
        waited.append(s)
        fake.t += s
    busy = Store(store.paths.data_dir, lock_timeout=2.0, monotonic=fake, sleep=sleep, min_free_bytes=0)
    try:
        with pytest.raises(Busy) as e:
            commit(busy, add())
    finally:
        os.close(fd)
    assert e.value.exit_code == EXIT_TEMPFAIL and e.value.code == "busy"
    # The holder is this process (another open file description), as the
    # kernel's lock table says; 4242 is only what someone wrote in the file.
    assert f"process {os.getpid()} has held" in e.value.message and "4242" not in e.value.message
    assert f"ps -o pid,etime,args -p {os.getpid()}" in e.value.hint
    assert 1.9 < sum(waited) <= 2.0 and max(waited) <= 0.075
    commit(busy, add())                          # free again


def test_nested_transaction_is_refused(store):
    with pytest.raises(Internal, match="nested"):
        commit(store, lambda s: commit(store, add()))


def test_backups_rotate(tmp_path, clock):
    store = Store(str(tmp_path / "d"), clock=clock, backup_keep=3, min_free_bytes=0)
    for i in range(6):
        commit(store, add(booking(T + i * 600, T + i * 600 + 600)))
        if i == 3:       # what a writer killed while writing a backup leaves
            open(os.path.join(store.paths.backups_dir, ".ledger-0000000005.json.tmp-99"), "w").close()
    names = sorted(os.listdir(store.paths.backups_dir))
    assert names == ["ledger-0000000004.json", "ledger-0000000005.json", "ledger-0000000006.json"]
    with open(os.path.join(store.paths.backups_dir, names[-1]), "rb") as f:
        assert f.read() == ledger_bytes(store)


def test_archive_and_retention(store, clock):
    old = booking(T - 3 * 86400, T - 2 * 86400, uid=7)
    cancelled = booking(T + 86400, T + 90000, cancelled_at=T - 2 * 86400 - 60)
    recent = booking(T - 7200, T - 3600)
    live = booking(T, T + 3600)
    commit(store, add(old, cancelled, recent, live))
    # Created by that very transaction: they stay hot until the next commit.
    assert len(store.read().state.reservations) == 4 and store.archived() == []
    commit(store, add())
    assert {r.id for r in store.read().state.reservations} == {recent.id, live.id}
    assert [r.id for r in store.archived()] == [cancelled.id, old.id]
    assert [r.id for r in store.archived(uid=7)] == [old.id]
    assert store.archived(since=T - 2 * 86400 + 1) == []
    assert store.archived()[1] == old
    assert os.listdir(store.paths.archive_dir) == [utctime.format_utc(T)[:7] + ".jsonl"]
    clock.t = T + 87 * 86400                     # 89 days after they closed
    assert len(store.archived()) == 2
    clock.t = T + 89 * 86400
    assert store.archived() == []                # past retention: not shown ...
    clock.t = T + 200 * 86400
    commit(store, add())
    assert os.listdir(store.paths.archive_dir) == []   # ... and the month file goes
    assert store.read().state.reservations == []       # the hot ones past retention too


def test_archive_cuts_a_torn_tail_and_dedups(store, clock):
    a, b = booking(T - 3 * 86400, T - 2 * 86400), booking(T - 3 * 86400, T - 2 * 86400)
    commit(store, add(a))
    commit(store, add(b))        # archives a
    month = os.path.join(store.paths.archive_dir, utctime.format_utc(T - 2 * 86400)[:7] + ".jsonl")
    with open(month, "ab") as f:
        f.write(b'{"seq": 99, "reserv')          # an interrupted append
    # A crash after the archive append but before the commit duplicates a line:
    with open(month, "rb") as f:
        first = f.readline()
    commit(store, add())         # archives b after cutting the fragment off
    with open(month, "ab") as f:
        f.write(first)
    with open(month, "rb") as f:
        lines = f.read().splitlines()
    assert len(lines) == 3 and all(json.loads(x) for x in lines)
    assert sorted(r.id for r in store.archived()) == sorted([a.id, b.id])


def test_old_op_keys_are_forgotten(store, clock):
    from bk.core.models import OpRecord
    live = booking(T, T + 10 * 86400)

    def with_ops(state):
        state.reservations.append(live)
        state.ops += [OpRecord("keep", 1000, "create", "d", live.id, T),
                      OpRecord("old", 1000, "create", "d", "gone", T)]
        return Mutation(True)
    commit(store, with_ops)
    clock.t = T + 2 * 86400
    commit(store, add())
    assert [o.op_id for o in store.read().state.ops] == ["keep"]


def test_unknown_fields_survive_a_transaction(store):
    r = booking(T, T + 600).replace(extra={"future": {"x": 1}})
    commit(store, add(r))
    doc = json.loads(ledger_bytes(store))
    doc["from_the_future"] = [1, 2]
    doc["reservations"][0]["also_new"] = True
    data = ledgerdoc.dumps(doc)
    with open(store.paths.ledger, "wb") as f:
        f.write(data)
    commit(store, add(booking(T + 600, T + 1200)))
    doc = json.loads(ledger_bytes(store))
    assert doc["from_the_future"] == [1, 2]
    assert doc["reservations"][0]["also_new"] is True and doc["reservations"][0]["future"] == {"x": 1}


def test_audit_tail_filters_by_uid_or_owner(store):
    commit(store, add(booking(T, T + 600, uid=1000)), uid=1000)
    commit(store, add(booking(T, T + 600, uid=1001)), uid=1001)
    commit(store, add(booking(T + 600, T + 1200, uid=1000)), uid=0)      # an admin acting for 1000
    assert [e["seq"] for e in store.audit_tail(uid=1000).entries] == [1, 3]
    assert [e["seq"] for e in store.audit_tail(uid=1001).entries] == [2]
    assert [e["seq"] for e in store.audit_tail(limit=2).entries] == [2, 3]


# --- corruption -------------------------------------------------------------------

def damage(store, how):
    data = ledger_bytes(store)
    doc = json.loads(data)
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "garbage":
        data = os.urandom(len(data))
    elif how == "empty":
        data = b""
    elif how == "wrong schema":
        doc["format"] = "something.else"
        data = json.dumps(doc).encode()
    elif how == "wrong types":
        doc["reservations"][0]["gpus"] = "0"
        data = json.dumps(doc).encode()
    elif how == "capacity":
        r = dict(doc["reservations"][0], id="other", mode="exclusive", share=2)
        doc["reservations"].append(r)
        data = json.dumps(doc).encode()
    with open(store.paths.ledger, "wb") as f:
        f.write(data)
    return data


def two_commits(store):
    a, b = booking(T, T + 600), booking(T + 600, T + 1200)
    commit(store, add(a))
    commit(store, add(b))
    return a, b


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty", "wrong schema", "wrong types",
                                 "capacity"])
def test_invalid_ledger_falls_back_to_newest_backup(store, how):
    a, b = two_commits(store)
    os.unlink(os.path.join(store.paths.backups_dir, "ledger-0000000002.json"))
    bad = damage(store, how)
    got = store.read()
    assert got.source == "backup:ledger-0000000001.json"
    assert [r.id for r in got.state.reservations] == [a.id]
    assert len(got.warnings) == 1 and "THE LEDGER" in got.warnings[0] and "is invalid" in got.warnings[0]
    # The audit log witnesses commit 2 (booking b): a write on top of the
    # backup would forget it for good, so it is refused until the loss is
    # accepted explicitly; nothing is written meanwhile.
    with pytest.raises(LostCommits) as e:
        store.transact(add(), policy=POLICY, actor_uid=0, actor="root")
    assert "commits 2-2" in e.value.message and b.id[:8] in e.value.message and e.value.exit_code == EXIT_IO
    assert e.value.details["reservations"] == [b.id] and ledger_bytes(store) == bad
    assert store.lost_commits()[:2] == (1, 2)
    warnings = []
    with pytest.raises(LostCommits):          # accepting another loss than the one witnessed
        store.transact(add(), policy=POLICY, actor_uid=0, actor="root", accept_loss=(0, 2))
    store.transact(add(), policy=POLICY, actor_uid=0, actor="root", warnings=warnings, accept_loss=(1, 2))
    assert store.lost_commits() is None
    assert any("damaged ledger was kept" in w for w in warnings)
    got = store.read()
    assert got.source == "ledger" and got.state.seq == 3    # past the log's newest commit
    kept = [n for n in os.listdir(store.paths.data_dir) if n.startswith("ledger.json.damaged-")]
    with open(os.path.join(store.paths.data_dir, kept[0]), "rb") as f:
        assert f.read() == bad
    actions = [(e["seq"], e["action"]) for e in store.audit_tail().entries]
    assert actions == [(1, "create"), (2, "create"), (3, "recover"), (3, "commit")]


def test_missing_ledger_uses_backup(store):
    a, b = two_commits(store)
    os.unlink(store.paths.ledger)
    got = store.read()
    assert got.source == "backup:ledger-0000000002.json" and "is missing" in got.warnings[0]
    assert len(got.state.reservations) == 2


def test_no_valid_copy_refuses_with_restore_hint(store):
    two_commits(store)
    for name in os.listdir(store.paths.backups_dir):
        with open(os.path.join(store.paths.backups_dir, name), "wb") as f:
            f.write(b"{}")
    bad = damage(store, "truncated")
    for attempt in (store.read, lambda: commit(store, add())):
        with pytest.raises(IOFailure) as e:
            attempt()
        err = e.value
        assert err.exit_code == EXIT_IO and err.code == "io_error"
        assert "none of the 2 backups" in err.message
        p = store.paths
        assert f"cp COPY {p.ledger}.new && mv {p.ledger}.new {p.ledger}" in err.hint
        assert f"mv {p.ledger} {p.ledger}.damaged; mv {p.backups_dir} {p.backups_dir}.damaged" in err.hint
    assert ledger_bytes(store) == bad
    # Following the "start empty" hint works.
    os.rename(store.paths.ledger, store.paths.ledger + ".damaged")
    os.rename(store.paths.backups_dir, store.paths.backups_dir + ".damaged")
    assert store.read().source == "empty"
    with pytest.raises(LostCommits, match="the ledger is missing, and so is every backup"):
        commit(store, add())                    # the audit log says two commits happened
    store.transact(add(), policy=POLICY, actor_uid=0, actor="root", accept_loss=(0, 2))
    assert store.read().state.seq == 3          # the audit log's numbering continues


def test_newer_format_is_not_treated_as_damage(store):
    two_commits(store)
    doc = json.loads(ledger_bytes(store))
    doc["version"] = ledgerdoc.VERSION + 1
    with open(store.paths.ledger, "w") as f:
        json.dump(doc, f)
    with pytest.raises(ConfigError, match="newer bk"):
        store.read()
    with pytest.raises(ConfigError, match="newer bk"):
        commit(store, add())


def test_check_reports(store):
    names = [c[0] for c in health.check(store)]
    assert names == ["data directory", "ledger", "backups", "audit log", "lock"]
    two_commits(store)
    checks = {name: (ok, detail) for name, ok, detail in health.check(store)}
    assert all(ok for ok, _ in checks.values()), checks
    assert "commit 2" in checks["ledger"][1] and "agrees" in checks["audit log"][1]
    damage(store, "garbage")
    checks = {name: (ok, detail) for name, ok, detail in health.check(store)}
    assert not checks["ledger"][0] and "THE LEDGER" in checks["ledger"][1]


def test_shared_restore_hint_runs_as_the_owner(tmp_path):
    """On a shared server restored files must belong to the service account,
    or the next write refuses them: the hint says to run it as that account."""
    data = tmp_path / "shared"
    data.mkdir(mode=0o755)
    store = Store(str(data), private=False, owner_uid=os.geteuid(), clock=lambda: T)
    commit(store, add())
    for name in os.listdir(store.paths.backups_dir):
        with open(os.path.join(store.paths.backups_dir, name), "wb") as f:
            f.write(b"{}")
    with open(store.paths.ledger, "wb") as f:
        f.write(b"{")
    with pytest.raises(IOFailure) as e:
        store.read()
    owner = f"sudo -u '#{os.geteuid()}' "
    assert f"`{owner}cp COPY {store.paths.ledger}.new && {owner}mv " in e.value.hint


def test_check_reports_lost_commits_invalid_backups_and_a_damaged_audit_head(store):
    a, b = two_commits(store)
    checks = {name: (ok, detail) for name, ok, detail in health.check(store)}
    assert checks["audit log"][0] and checks["backups"][0]
    os.unlink(os.path.join(store.paths.backups_dir, "ledger-0000000002.json"))
    damage(store, "garbage")
    checks = {name: (ok, detail) for name, ok, detail in health.check(store)}
    assert not checks["audit log"][0] and "audit log has commits the ledger lacks (2-2)" in checks["audit log"][1]
    assert b.id[:8] in checks["audit log"][1]
    with open(os.path.join(store.paths.backups_dir, "ledger-0000000001.json"), "wb") as f:
        f.write(b"{}")
    checks = {name: (ok, detail) for name, ok, detail in health.check(store)}
    assert not checks["backups"][0] and "invalid: ledger-0000000001.json" in checks["backups"][1]


def test_check_reports_a_damaged_audit_head(store):
    two_commits(store)
    with open(store.paths.audit, "r+b") as f:
        f.write(b"\x00garbage")
    checks = {name: (ok, detail) for name, ok, detail in health.check(store)}
    assert not checks["audit log"][0] and "does not start with a whole record" in checks["audit log"][1]
