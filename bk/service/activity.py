"""Each running booking's activity state as the front ends show it (issue 25).

The monitor judges every running booking each sample (``bk.core.activity``)
and publishes the states in its snapshot (``activity``); this module reads
them for ``bk l``, ``bk st``, ``bk t``, MCP and the worker.  A reader
believes only a fresh snapshot written by the monitor account (the store's
rule), and reads it only when a booking it shows is running: a list of
upcoming bookings costs no read at all.  No monitor, or a stale snapshot:
no state, shown as nothing (never as "idle").
"""

from __future__ import annotations


def rows(settings, reservations, now: int) -> dict[str, dict]:
    """Booking id -> the monitor's activity row (docs/TELEMETRY.md), for
    those of ``reservations`` running now; {} when none runs or no fresh
    snapshot says."""
    if not any(r.cancelled_at is None and r.start <= now < r.end for r in reservations):
        return {}
    from bk.store import snapshot as files

    try:
        directory = files.monitor_dir(settings)
        got = files.read_snapshot_file(directory, now, owner=files.monitor_owner(settings))
    except Exception:          # advice only: a damaged or unreadable snapshot shows no state
        return {}
    act = got.activity if got is not None else None
    out = {}
    for row in (act or {}).get("bookings", []) if isinstance(act, dict) else ():
        if isinstance(row, dict) and isinstance(row.get("reservation"), str):
            out[row["reservation"]] = row
    return out


def row_json(row: dict | None) -> dict | None:
    """The ``activity`` object of a reservation's JSON (docs/JSON.md)."""
    if not isinstance(row, dict):
        return None
    from bk.core.activity import short_text

    return {"state": row.get("state"), "reason": row.get("reason"), "idle_s": row.get("idle_s"),
            "idle_since": row.get("idle_since"), "release_after_s": row.get("release_after_s"),
            "release_due": bool(row.get("release_due")), "text": short_text(row.get("state"), row.get("idle_s")),
            "evidence": row.get("evidence")}
