"""Read-only advice as typed results: ``bk slots`` options and ``bk g``.

Each option carries the exact command that books it, so advice turns into
a booking by copy-paste (or, for a program, by running ``command`` from
the JSON).  A start in the current slice is written without ``--start`` (a
bare booking starts now); a later one with ``--start ISO``, which is exact:
if someone takes it first, the booking fails with exit 3 instead of landing
elsewhere.
"""

from __future__ import annotations

from bk.core import timegrid
from bk.core.models import EXCLUSIVE, iso
from bk.core.record import dataclass


def booking_command(req, p, now: int, slot_minutes: int) -> str:
    """The exact ``bk`` command that books option ``p`` of request ``req``."""
    import shlex

    words = ["bk"] + (["x"] if req.mode == EXCLUSIVE else [])
    words += [str(req.count), timegrid.format_duration(req.duration)]
    if req.mem_mib:
        words.append(timegrid.format_memory(req.mem_mib))
    if req.mode != EXCLUSIVE and req.share > 1:
        words += ["-s", str(req.share)]
    words += ["-g", ",".join(map(str, p.gpus))]
    if p.start > timegrid.floor_slice(now, slot_minutes):
        words += ["--start", iso(p.start)]
    return shlex.join(words)


def local_command(req, p, now: int, slot_minutes: int, tz) -> str:
    """``booking_command`` for a person to copy: a later start as local time
    (``-t "2026-07-13 20:00"``, which is exact like ``--start``).  A local
    time that names two instants (a DST fold) stays ISO, which names one."""
    from datetime import datetime

    exact = booking_command(req, p, now, slot_minutes)
    if "--start" not in exact:
        return exact
    local = datetime.fromtimestamp(p.start, tz)
    twin = local.replace(fold=1 - local.fold)
    if twin.utcoffset() != local.utcoffset():
        return exact
    import shlex

    words = shlex.split(exact)
    i = words.index("--start")
    words[i:i + 2] = ["-t", local.strftime("%Y-%m-%d %H:%M")]
    return shlex.join(words)


def option_json(req, p, now: int, slot_minutes: int) -> dict:
    return {"gpus": list(p.gpus), "start": iso(p.start), "end": iso(p.end),
            "command": booking_command(req, p, now, slot_minutes), "queued": p.queued,
            "mem_mib_effective": p.mem_mib_effective,
            "reasons": {str(g): why for g, why in sorted(p.reasons.items())}}


def request_json(req) -> dict:
    return {"count": req.count, "duration": req.duration, "mode": req.mode, "share": req.share,
            "mem_mib": req.mem_mib, "start": iso(req.start) if req.start is not None else None,
            "pinned": list(req.pinned) if req.pinned is not None else None,
            "excluded": list(req.excluded)}


def describe(req) -> str:
    """``2 GPUs, shared, 12 GiB per GPU, 1h``: what was asked for, in words."""
    n = req.count
    mem = f", {timegrid.format_memory(req.mem_mib)} per GPU" if req.mem_mib else ""
    return f"{timegrid.counted(n, 'GPU')}, {req.mode}{mem}, {timegrid.format_duration(req.duration)}"


@dataclass(frozen=True)
class Recommendation:
    """The scheduler's options for ``request`` (placements, earliest first)."""

    request: object
    options: tuple
    now: int
    slot_minutes: int

    def ready(self) -> Recommendation:
        """Only the options that start now (``bk g``)."""
        return Recommendation(self.request, tuple(p for p in self.options if not p.queued), self.now,
                              self.slot_minutes)

    def command(self, p, tz=None) -> str:
        """The command that books option ``p``: exact ISO, or with ``tz`` the
        local ``-t`` form a person copies."""
        if tz is not None:
            return local_command(self.request, p, self.now, self.slot_minutes, tz)
        return booking_command(self.request, p, self.now, self.slot_minutes)

    def options_json(self) -> list[dict]:
        return [option_json(self.request, p, self.now, self.slot_minutes) for p in self.options]

    def to_json(self) -> dict:
        return {"request": request_json(self.request), "options": self.options_json()}


@dataclass(frozen=True)
class GpuAdvice:
    """``bk g``: the caller's GPUs now (with the export line), GPUs free now,
    or, when none are, the earliest options (``free_now`` False)."""

    current: tuple            # the caller's active bookings (Reservation)
    current_json: tuple       # their JSON rows
    export: str | None
    options: Recommendation | None = None
    free_now: bool = True

    def to_json(self) -> dict:
        return {"current": list(self.current_json),
                "options": self.options.options_json() if self.options is not None else [],
                "export": self.export, "free_now": self.free_now}


def present_gpus(gpus, inventory) -> set[int]:
    """The GPUs of ``gpus`` this machine has now (its inventory): a booking
    made for a GPU that has gone (removed, fallen off the bus, a ledger made
    for more) must not hand CUDA an index it does not know, which hides
    every GPU after it in CUDA_VISIBLE_DEVICES."""
    have = {g.index for g in inventory.gpus}
    return {g for g in gpus if g in have}


def export_line(gpus) -> str:
    # nvidia-smi numbers GPUs in PCI bus order, CUDA by default fastest
    # first; PCI_BUS_ID makes CUDA's numbering match the one we book by.
    return f"export CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={','.join(map(str, sorted(gpus)))}"
