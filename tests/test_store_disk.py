"""A full disk: writes fail with exit 74 and leave the previous state intact.

Uses a size-limited tmpfs made by the test, so it needs root (skipped
cleanly otherwise)."""

from __future__ import annotations

import os
import random
import subprocess
import uuid

import pytest

import bk.store.ledger as ledger_mod
from bk.core.errors import EXIT_IO, IOFailure
from bk.core.models import Mutation, Policy, Reservation
from bk.store.ledger import Store

T = 1_780_000_000
POLICY = Policy(gpu_count=2).bound()


@pytest.fixture
def tiny_fs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tiny file system needs root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160k,mode=0700", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


RNG = random.Random(int(os.environ.get("BK_TEST_SEED", "5")))


def big_booking(state):
    # Sizes vary and half the bookings are old (archived at the next commit),
    # so the disk fills at different steps: temp file, archive, audit, backup.
    n = len(state.reservations) + 7 * state.seq
    start = T + n * 600 if n % 2 else T - 10 * 86400 + n * 600
    r = Reservation(str(uuid.uuid4()), 1, "u", "shared", (n % 2,), 1, start, start + 300,
                    T, note="x" * RNG.choice((10, 300, 3000, 9000)))
    state.reservations.append(r)
    return Mutation(True, [{"action": "create", "reservation": r.id}], r.id)


def content(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def commit(store, warnings=None):
    return store.transact(big_booking, policy=POLICY, actor_uid=1, actor="u", warnings=warnings)


def test_disk_full_during_writes(tiny_fs, monkeypatch):
    # Skip the free-space pre-check so that the real ENOSPC paths are taken.
    monkeypatch.setattr(ledger_mod, "ensure_free", lambda *a, **k: None)
    store = Store(str(tiny_fs / "data"), clock=lambda: T, min_free_bytes=0)
    committed, failures, warned = [], 0, 0
    for _ in range(80):
        before = content(store.paths.ledger)
        warnings = []
        try:
            committed.append(commit(store, warnings))
            warned += bool(warnings)
        except IOFailure as e:
            failures += 1
            assert e.exit_code == EXIT_IO and "no space" in e.message, e.message
            assert content(store.paths.ledger) == before, "a failed write changed the ledger"
            assert not [n for n in os.listdir(store.paths.data_dir) if n.startswith(".ledger")]
    print(f"{len(committed)} commits ({warned} with warnings), {failures} refused")
    assert committed and failures >= 10
    got = store.read()
    assert got.source == "ledger"
    hot = [r.id for r in got.state.reservations]
    assert hot == [rid for rid in committed if rid in hot]
    assert {r.id for r in store.archived()} | set(hot) == set(committed)
    # With room again, the next write succeeds and the log catches up.
    for name in os.listdir(store.paths.backups_dir):
        os.unlink(os.path.join(store.paths.backups_dir, name))
    store.backup_keep = 1
    committed.append(commit(store))
    created = [e["reservation"] for e in store.audit_tail(limit=1000, include_pending=False).entries]
    assert created == committed


def test_free_space_is_checked_before_writing(tiny_fs):
    store = Store(str(tiny_fs / "data"), clock=lambda: T)       # default reserve: 1 MiB
    with pytest.raises(IOFailure, match="not enough free space") as e:
        commit(store)
    assert e.value.exit_code == EXIT_IO and "df -h" in e.value.hint
    assert store.read().source == "empty"
    assert not os.path.exists(store.paths.ledger)
