"""Reservation IDs: random version-4 UUIDs in the canonical text form."""

from __future__ import annotations

import uuid

from bk.service.app import _new_id


def test_new_ids_are_canonical_version_4_uuids():
    seen = set()
    for _ in range(2000):
        text = _new_id()
        u = uuid.UUID(text)
        assert u.version == 4 and u.variant == uuid.RFC_4122 and str(u) == text
        seen.add(text)
    assert len(seen) == 2000
