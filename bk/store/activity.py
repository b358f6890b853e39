"""The monitor's memory of idle time: ``<data_dir>/monitor/activity.json``.

What it holds: each running booking's idle clock (``bk.core.activity``:
state, idle seconds, the start of the idle streak, the nudges it reached,
the last sample that judged it) and each GPU's learned idle baseline, by
UUID.  Without it a restarted monitor would start every idle clock from 0
and learn the baselines again.

The protocol is the store's: the whole file is replaced with
``fsutil.replace_file`` (temporary file, fsync, rename, fsync of the
directory), so a reader or a restarted monitor sees the previous version or
the new one, never half.  It is written once a minute (when a minute record
closes) and at a clean stop, not every sample: a crash loses at most a
minute of idle time, which errs towards keeping a booking, never towards
releasing one.  It is read only by the monitor, at start, and only when the
monitor account owns it and nobody else can write it (``Safety``): a file
planted by a user to age someone's booking into a release is not believed.
Anything unusable (missing, damaged, another schema) is an empty memory,
never an error.  0644, like the snapshot: it says no more than the snapshot.
"""

from __future__ import annotations

from bk.core.models import iso
from bk.store import snapshot as files

SCHEMA = "gpubk.activity.v1"
FILE = "activity.json"


def write(directory: str, doc: dict, t: int) -> None:
    """Replace the file with ``doc`` (``Tracker.to_store()``) at time ``t``.
    Raises ``IOFailure``/``ConfigError`` like every store write."""
    files._write(directory, FILE, {"schema": SCHEMA, "updated_at": t, "updated_at_iso": iso(t), **doc},
                 sync=True)


def read(directory: str, *, owner: int | None = None) -> dict:
    """What a previous monitor kept: ``{"bookings": ..., "baselines": ...}``
    (empty when there is nothing usable)."""
    doc = files._read_doc(directory, FILE, owner)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return {}
    out = {}
    for key in ("bookings", "baselines"):
        v = doc.get(key)
        if isinstance(v, dict):
            out[key] = v
    return out
