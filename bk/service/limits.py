"""The lab's per-user limits in the booking write path (``bk.core.limits``).

Three calls, each inside the book or edit transaction: ``bounds`` (which
limits the caller has: their groups asked of ``bk.store.accounts`` only when
a rule names a group), ``place`` (a new booking: the scheduler with the
limits around it) and ``check_edit``.  A refusal keeps the rule's details
and gets a hint with the commands that pass (``details.commands``), so the
CLI, ``--json``, the broker's clients and MCP agents read the same thing.
"""

from __future__ import annotations

import shlex

from bk.core import limits as lim
from bk.core import timegrid
from bk.core.errors import PolicyRefused
from bk.core.models import EXCLUSIVE, Reservation, iso, parse_iso
from bk.core.record import replace


def bounds(call, *, uid: int | None = None, user: str | None = None) -> lim.Bounds | None:
    """The limits of the caller (or of ``uid``/``user``, a booking's owner);
    None when the configuration has none."""
    rules = call.policy.limits
    if not rules:
        return None
    if uid is None:
        uid, user = call.actor.uid, call.actor.user
    groups: frozenset = frozenset()
    if rules.uses_groups():
        from bk.store.accounts import accounts

        groups = accounts().groups_of(user)
    return lim.bounds_for(rules, user, groups, admin=uid == 0)


def bounds_of_owner(call):
    """``r -> Bounds`` for the advance's limit check, one lookup per owner."""
    seen: dict[int, lim.Bounds | None] = {}

    def of(r: Reservation):
        if r.uid not in seen:
            seen[r.uid] = bounds(call, uid=r.uid, user=r.user)
        return seen[r.uid]
    return of


def place(state, sreq, call, *, gpus, load, req=None):
    """``scheduler.place`` with the caller's limits (``limits.place_booking``)."""
    b = bounds(call)
    try:
        return lim.place_booking(sreq, b, call.actor.uid, reservations=state.reservations,
                                 blackouts=state.blackouts, policy=call.policy, gpus=gpus, now=call.now,
                                 load=load, tz=call.tz)
    except PolicyRefused as e:
        if req is not None and str(e.details.get("rule", "")).startswith("limit_"):
            raise _explained(e, book_commands(req, e.details, call), _later(e.details, req, call)) from None
        raise


def check_edit(state, old: Reservation, new: Reservation, call) -> None:
    """An edit may not make a limit worse than it was and break it."""
    b = bounds(call)
    if not b:
        return
    from bk.core.advance import held

    gpu_mem = call.gpu_mem()
    others = lim.own_held(state.reservations, old.uid, call.now, ignore_id=old.id)
    try:
        lim.check_all(b, held(new, call.policy, gpu_mem), others, now=call.now,
                      slot_seconds=call.policy.slot_seconds, tz=call.tz, before=held(old, call.policy, gpu_mem))
    except PolicyRefused as e:
        raise _explained(e, edit_commands(new, e.details, call), _later(e.details, None, call)) from None


def _later(details: dict, req, call) -> dict | None:
    """``fits.book_from`` as what to do then: the same request (``req``;
    None for an edit), made at that time or later (nothing to run now, so
    not in ``commands``); ``when`` is for the hint only.  A start that
    will have passed by then is left out: the booking starts when made."""
    t = (details.get("fits") or {}).get("book_from")
    if t is None:
        return None
    command = None
    if req is not None:
        command = _words(replace(req, start=None) if req.start is not None and req.start < parse_iso(t) else req)
    return {"from": t, "command": command,
            "when": timegrid.format_local_short(parse_iso(t), call.tz, call.now)}


def _explained(e: PolicyRefused, commands: list[str], later: dict | None = None) -> PolicyRefused:
    """The refusal with the commands that pass now (``details.commands``)
    and, where waiting is enough, when the same request passes (``later``)."""
    parts = ["run: " + " or: ".join(commands)] if commands else []
    if later is not None:
        parts.append(f"at {later['when']} or later: " + (later["command"] or "the same edit"))
    hint = "; ".join(parts) if parts else "your limits: bk info"
    if e.details.get("limit") in ("gpu_hours", "gpus"):
        hint += "; your bookings: bk l"
    details = {**e.details, "commands": commands}
    if later is not None:
        details["later"] = {"from": later["from"], "command": later["command"]}
    return PolicyRefused(e.message, hint, details=details)


def _words(req, *, count=None, duration=None, mem=None, start=None) -> str:
    words = ["bk"] + (["x"] if req.mode == EXCLUSIVE else [])
    words += [str(count or req.count), timegrid.format_duration(duration or req.duration)]
    m = mem if mem is not None else req.mem_mib
    if m and req.mode != EXCLUSIVE:
        words.append(timegrid.format_memory(m))
    if req.mode != EXCLUSIVE and req.share > 1:
        words += ["-s", str(req.share)]
    if req.pinned and count is None:
        words += ["-g", ",".join(map(str, req.pinned))]
    s = start if start is not None else req.start
    if s is not None:
        words += ["--start", iso(s)]
    if req.note:
        words += ["--note", req.note]
    return shlex.join(words)


def book_commands(req, details: dict, call) -> list[str]:
    """The commands that book what ``fits`` says passes."""
    f = details.get("fits") or {}
    out = []
    if "duration" in f:
        out.append(_words(req, duration=f["duration"]))
    if "end" in f and req.start is not None:
        out.append(_words(req, duration=parse_iso(f["end"]) - req.start))
    if "count" in f:
        out.append(_words(req, count=f["count"]))
    if "mem_mib" in f:
        out.append(_words(req, mem=f["mem_mib"]))
    if "start" in f:
        out.append(_words(req, start=parse_iso(f["start"])))
    if "latest_start" in f:
        out.append(_words(req, start=parse_iso(f["latest_start"])))
    return out


def edit_commands(new: Reservation, details: dict, call) -> list[str]:
    f = details.get("fits") or {}
    ref = new.short_id
    out = []
    if "duration" in f:
        out.append(f"bk e {ref} -d {timegrid.format_duration(f['duration'])}")
    if "end" in f:
        out.append(f"bk e {ref} -d {timegrid.format_duration(parse_iso(f['end']) - new.start)}")
    if "mem_mib" in f:
        out.append(f"bk e {ref} -m {timegrid.format_memory(f['mem_mib'])}")
    if "start" in f and new.start > call.now:
        out.append(f"bk e {ref} --start {f['start']}")
    return out
