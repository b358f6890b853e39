"""Reservation IDs: random version-4 UUIDs in the canonical text form."""

from __future__ import annotations

import uuid

from bk.service.context import Actor, Call


def _new_id() -> str:
    return Call(Actor(0, 'root'), 0, None, None, None).new_id()


def test_new_ids_are_canonical_version_4_uuids():
    seen = set()
    for _ in range(2000):
        text = _new_id()
        u = uuid.UUID(text)
        assert u.version == 4 and u.variant == uuid.RFC_4122 and str(u) == text
        seen.add(text)
    assert len(seen) == 2000


def test_one_call_keeps_one_id_per_key():
    """A write applied twice (a retried transaction) makes the same record."""
    call = Call(Actor(0, "root"), 0, None, None, None)
    assert call.new_id("reservation") == call.new_id("reservation") != call.new_id("notice")
