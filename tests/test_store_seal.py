"""The ledger's seal: reads trust the bytes a writer checked, and only those.

A writer runs the full invariant check and seals what it commits
(``ledgerdoc.seal``); a reader whose bytes still match skips the check.
Anything else (no seal, a stale one, a torn file) takes the full check
and, failing it, the backup fallback.  ``bk doctor`` checks in full
whatever the seal says, and checks backups by their seal."""

from __future__ import annotations

import json
import uuid

import pytest
from test_store_ledger import POLICY, Clock, T, add, booking, commit, ledger_bytes

from bk.core import ledgercheck, ledgerdoc
from bk.core.errors import Internal
from bk.core.models import Reservation
from bk.store import health
from bk.store.ledger import Store


@pytest.fixture
def store(tmp_path):
    return Store(str(tmp_path / "data"), clock=Clock(), min_free_bytes=0, backup_keep=20)


@pytest.fixture
def checks(monkeypatch):
    """How often the full invariant check runs."""
    calls = []
    real = ledgercheck.check_state

    def counting(state, capacity=None):
        calls.append(state.seq)
        return real(state, capacity)
    monkeypatch.setattr(ledgercheck, "check_state", counting)
    return calls


def write(store, data: bytes) -> None:
    with open(store.paths.ledger, "wb") as f:
        f.write(data)


def fresh(store) -> Store:
    """Another process's Store: nothing validated in memory."""
    return Store(store.paths.data_dir, clock=store.clock, min_free_bytes=0, backup_keep=20)


def test_seal_round_trip_and_damage():
    body = ledgerdoc.dumps({"format": "gpubk.ledger", "seq": 3, "version": 1})
    data = ledgerdoc.seal(body)
    assert ledgerdoc.sealed(data) is True
    assert json.loads(data)["digest"].startswith("crc32:")
    assert data.endswith(b'"}\n') and data.startswith(body[:-2])
    assert ledgerdoc.sealed(body) is None                       # an older bk's file
    flipped = data.replace(b'"seq":3', b'"seq":4')
    assert ledgerdoc.sealed(flipped) is False                   # edited in place
    assert ledgerdoc.sealed(data[:-1]) is None                  # torn: the tail is gone
    assert ledgerdoc.sealed(data[:-11] + b'zzzzzzzz"}\n') is False
    assert ledgerdoc.sealed(b"") is None
    with pytest.raises(ValueError):
        ledgerdoc.seal(b"[]")


def test_commits_are_sealed_and_a_fresh_read_trusts_them(store, checks):
    commit(store, add(booking(T, T + 600)))
    commit(store, add(booking(T + 600, T + 1200)))
    assert ledgerdoc.sealed(ledger_bytes(store)) is True
    checks.clear()
    got = fresh(store).read()
    assert (got.source, got.warnings, got.state.seq, len(got.state.reservations)) == ("ledger", [], 2, 2)
    assert checks == []                                         # trusted: no second invariant check
    assert "digest" not in got.state.extra                      # the seal is not ledger data
    fresh(store).read(verify=True)
    assert checks == [2]                                        # doctor's read checks anyway


def test_a_tampered_ledger_with_a_stale_seal_is_checked_and_falls_back(store, checks):
    a = booking(T, T + 600)
    commit(store, add(a))
    commit(store, add(booking(T + 600, T + 1200)))
    data = ledger_bytes(store)
    trailer = data[data.rindex(b',"digest":'):]
    doc = json.loads(data)
    # An exclusive booking over a shared one: structurally fine, invariants broken.
    doc["reservations"].append(dict(doc["reservations"][0], id="other", mode="exclusive"))
    del doc["digest"]
    forged = ledgerdoc.dumps(doc)[:-2] + trailer                # the old seal kept at the end
    write(store, forged)
    assert ledgerdoc.sealed(forged) is False
    checks.clear()
    got = fresh(store).read()
    assert got.source.startswith("backup:ledger-0000000002")
    assert "capacity" in got.warnings[0] and "THE LEDGER" in got.warnings[0]
    assert checks and [r.id for r in got.state.reservations][0] == a.id
    # The next write replaces the damaged file and seals its own.
    commit(store, add(booking(T + 1200, T + 1800)))
    assert ledgerdoc.sealed(ledger_bytes(store)) is True and fresh(store).read().source == "ledger"


def test_an_edit_that_keeps_the_ledger_valid_is_checked_then_used(store, checks):
    commit(store, add(booking(T, T + 600)))
    data = ledger_bytes(store)
    edited = data.replace(b'"user":"u1000"', b'"user":"u1001"')
    assert edited != data and ledgerdoc.sealed(edited) is False
    write(store, edited)
    checks.clear()
    got = fresh(store).read()
    assert (got.source, got.warnings, got.state.reservations[0].user) == ("ledger", [], "u1001")
    assert checks == [1]


def test_an_older_bk_ledger_without_a_seal_is_read_checked_and_sealed_by_the_next_write(store, checks):
    commit(store, add(booking(T, T + 600)))
    doc = json.loads(ledger_bytes(store))
    del doc["digest"]
    write(store, ledgerdoc.dumps(doc))                          # what bk before the seal wrote
    checks.clear()
    got = fresh(store).read()
    assert (got.source, got.warnings, got.state.seq) == ("ledger", [], 1)
    assert checks == [1]
    commit(fresh(store), add(booking(T + 600, T + 1200)))
    data = ledger_bytes(store)
    assert ledgerdoc.sealed(data) is True and data.count(b'"digest"') == 1


def test_a_rewritten_ledger_with_its_digest_moved_is_unsealed_and_the_next_write_keeps_one(store):
    commit(store, add(booking(T, T + 600)))
    doc = json.loads(ledger_bytes(store))
    write(store, json.dumps(doc, sort_keys=True).encode())     # a JSON tool: "digest" mid-document
    assert ledgerdoc.sealed(ledger_bytes(store)) is None
    assert fresh(store).read().source == "ledger"
    commit(fresh(store), add(booking(T + 600, T + 1200)))
    data = ledger_bytes(store)
    assert data.count(b'"digest"') == 1 and ledgerdoc.sealed(data) is True


def test_doctor_checks_what_reads_trust(store):
    """A file sealed over broken invariants (by hand: no bk writes one)
    is trusted by reads, but doctor checks in full and says so."""
    commit(store, add(booking(T, T + 600)))
    commit(store, add(booking(T + 600, T + 1200)))
    doc = json.loads(ledger_bytes(store))
    doc["reservations"].append(dict(doc["reservations"][0], id="other", mode="exclusive"))
    del doc["digest"]
    write(store, ledgerdoc.seal(ledgerdoc.dumps(doc)))
    assert fresh(store).read().source == "ledger"
    found = {name: (ok, detail) for name, ok, detail in health.check(fresh(store))}
    ok, detail = found["ledger"]
    assert not ok and "backup" in detail and "capacity" in detail


def test_doctor_notes_an_unsealed_ledger(store):
    commit(store, add(booking(T, T + 600)))
    found = {name: (ok, detail) for name, ok, detail in health.check(fresh(store))}
    assert found["ledger"][0] and "seal" not in found["ledger"][1]
    doc = json.loads(ledger_bytes(store))
    del doc["digest"]
    write(store, ledgerdoc.dumps(doc))
    found = {name: (ok, detail) for name, ok, detail in health.check(fresh(store))}
    assert found["ledger"][0] and "not sealed" in found["ledger"][1]


def test_doctor_checks_many_backups_by_seal_and_parses_only_the_unsealed(store, monkeypatch):
    for i in range(15):
        commit(store, add(booking(T + i * 600, T + i * 600 + 600)))
    backups = sorted((store.paths.backups_dir + "/" + n) for n in
                     __import__("os").listdir(store.paths.backups_dir))
    assert len(backups) == 15
    # One torn (a crash while it was written), one from an older bk (no seal).
    with open(backups[3], "rb+") as f:
        f.truncate(100)
    with open(backups[5], "rb") as f:
        doc = json.loads(f.read())
    del doc["digest"]
    with open(backups[5], "wb") as f:
        f.write(ledgerdoc.dumps(doc))
    parsed = []
    real = ledgerdoc.loads
    monkeypatch.setattr(ledgerdoc, "loads", lambda data: parsed.append(len(data)) or real(data))
    doctor = fresh(store)
    found = {name: (ok, detail) for name, ok, detail in health.check(doctor)}
    ok, detail = found["backups"]
    assert not ok and "14 of 15 valid" in detail and "ledger-0000000004.json" in detail
    # The ledger once (in full), the torn backup and the unsealed (valid) one: never the 13 sealed.
    assert len(parsed) == 3
    assert found["ledger"][0] and found["audit log"][0]


def test_a_sealed_backup_is_what_the_fallback_uses(store, checks):
    commit(store, add(booking(T, T + 600)))
    commit(store, add(booking(T + 600, T + 1200)))
    write(store, b"{not json")
    checks.clear()
    got = fresh(store).read()
    assert got.source == "backup:ledger-0000000002.json" and checks == []


def test_unsealed_bytes_this_store_checked_are_not_checked_twice(store, checks):
    commit(store, add(booking(T, T + 600)), policy=POLICY)
    doc = json.loads(ledger_bytes(store))
    del doc["digest"]
    write(store, ledgerdoc.dumps(doc))
    s = fresh(store)
    checks.clear()
    s.read()
    s.read()
    assert checks == [1]


def _broken(first, kind: str) -> Reservation:
    """A booking that breaks an invariant of a ledger holding ``first``."""
    if kind == "overlap":       # exclusive over a shared booking of the same GPU and time
        return Reservation(str(uuid.uuid4()), 1001, "u1001", "exclusive", (0,), 2, T + 300, T + 900, T)
    if kind == "duplicate":
        return Reservation(first.id, 1001, "u1001", "shared", (1,), 1, T + 600, T + 1200, T)
    return booking(T + 600, T + 600)                          # ends when it starts


@pytest.mark.parametrize("kind", ["overlap", "duplicate", "backwards"])
@pytest.mark.parametrize("writer", ["fresh", "kept"])
def test_the_writer_still_refuses_an_invalid_state(store, writer, kind):
    """The seal is only ever put on bytes that passed the check: in full
    (a writer that just read the file) and by the changes (a writer that
    keeps the state it committed, ``ledgercheck.Checked``)."""
    first = booking(T, T + 600)
    commit(store, add(first))
    commit(store, add(booking(T + 3600, T + 4200)))
    before = ledger_bytes(store)
    w = store if writer == "kept" else fresh(store)
    with pytest.raises(Internal, match="refusing to write an invalid ledger"):
        commit(w, add(_broken(first, kind)))
    assert ledger_bytes(store) == before
    commit(w, add(booking(T + 600, T + 1200)))                  # the writer goes on
    assert fresh(store).read(verify=True).state.seq == 3
