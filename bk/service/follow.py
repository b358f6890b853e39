"""Bookings that follow real use (issue 25): what a booking keeps in its
extra fields, and the checks that end it when its work has ended.

A booking may carry, in ``Reservation.extra``:

* ``idle_release_minutes`` (int): the owner's opt-in: end it once the
  monitor saw it idle this long (``bk N DUR --idle-release 60m``,
  ``bk e ID --idle-release 60m|off``);
* ``idle_keep_until`` (ISO-8601 UTC): "keep": no idle nudge and no idle
  release before then (``bk e ID --keep-for 4h``, the TUI's ``K``, MCP's
  ``edit`` with ``keep_until``);
* ``adopt`` (a list of ``[pid, start_ticks]``): ``bk adopt``'s processes;
  the booking ends when none of them runs any more.

Who ends a booking, and why there: the owner's worker (``bk w``), as the
owner, through the ``cancel`` row, the same path as a booking that ends
with its command (``bk.service.jobs.Host.end_booking``).  The monitor sees
the whole server but is not the owner (on a shared server it runs as the
monitor account, which may cancel nothing); the worker is the owner, ticks
every second, and is what ``bk run`` already needs.  So the monitor only
*decides* (``release_due`` in its snapshot's ``activity``) and the worker
*executes*, after checking the decision again against the ledger it just
read: a ``keep`` or an ``--idle-release off`` written since the monitor's
last sample wins.  Release ends the booking; it never signals a process
(no configuration key lets it).
"""

from __future__ import annotations

from bk.core.models import Reservation, iso, parse_iso

KEYS = ("idle_release_minutes", "idle_keep_until", "adopt")


# ------------------------------------------------------------ the extra fields

def adopt_pairs(text: str | None) -> list[list[int]]:
    """``"PID:START,..."`` (the request's form) -> ``[[pid, start], ...]``."""
    out = []
    for part in (text or "").split(","):
        if part:
            pid, _, start = part.partition(":")
            out.append([int(pid), int(start)])
    return out


def adopted(r: Reservation) -> list[tuple[int, int]]:
    """The processes ``r`` follows (``bk adopt``), as (pid, start ticks)."""
    got = r.extra.get("adopt") if isinstance(r.extra, dict) else None
    out = []
    for x in got if isinstance(got, list) else ():
        if isinstance(x, list) and len(x) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in x):
            out.append((x[0], x[1]))
    return out


def keep_until(r: Reservation) -> int | None:
    v = r.extra.get("idle_keep_until") if isinstance(r.extra, dict) else None
    try:
        return parse_iso(v) if isinstance(v, str) else None
    except ValueError:
        return None


def release_minutes(r: Reservation) -> int | None:
    v = r.extra.get("idle_release_minutes") if isinstance(r.extra, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def book_extra(req) -> dict:
    """The extra fields a new booking gets from its request."""
    out = {}
    if req.idle_release_minutes is not None:
        out["idle_release_minutes"] = int(req.idle_release_minutes)
    if req.adopt:
        out["adopt"] = adopt_pairs(req.adopt)
    return out


def edited(new: Reservation, req, now: int) -> Reservation:
    """``new`` with the edit's opt-in and keep applied."""
    from bk.core.errors import InvalidInput

    if req.idle_release_minutes is None and req.keep_until is None:
        return new
    extra = dict(new.extra)
    if req.idle_release_minutes is not None:
        if req.idle_release_minutes == 0:
            extra.pop("idle_release_minutes", None)
        elif req.idle_release_minutes < 5:
            raise InvalidInput("--idle-release must be at least 5 minutes (or off)")
        else:
            extra["idle_release_minutes"] = int(req.idle_release_minutes)
    if req.keep_until is not None:
        if req.keep_until == 0:
            extra.pop("idle_keep_until", None)
        elif req.keep_until <= now:
            raise InvalidInput("the keep ends in the past", hint="e.g. bk e ID --keep-for 4h")
        else:
            extra["idle_keep_until"] = iso(min(req.keep_until, new.end))
    return new.replace(extra=extra)


def summary(r: Reservation) -> dict:
    """What the audit record's before/after shows of these fields (only
    those set, so that every older record keeps its shape)."""
    out = {}
    if release_minutes(r) is not None:
        out["idle_release_minutes"] = release_minutes(r)
    if isinstance(r.extra, dict) and isinstance(r.extra.get("idle_keep_until"), str):
        out["idle_keep_until"] = r.extra["idle_keep_until"]
    return out


def json_fields(r: Reservation) -> dict:
    """The reservation JSON's view of them (docs/JSON.md)."""
    return {"idle_release_minutes": release_minutes(r), "keep_until": iso(keep_until(r)),
            "adopted": [{"pid": p, "start_ticks": s} for p, s in adopted(r)] or None}


# ------------------------------------------------------------ ending

def release_reason(row: dict, r: Reservation, now: int, policy_minutes: int | None) -> str | None:
    """Why ``r`` is released now, from the monitor's activity ``row`` for
    it, checked again against the booking as the ledger has it now; None:
    not released."""
    from bk.core import activity as A
    from bk.core.timegrid import format_duration

    if row.get("reservation") != r.id or row.get("uid") != r.uid or not row.get("release_due"):
        return None
    if r.cancelled_at is not None or not r.start <= now < r.end:
        return None
    state, idle_s = row.get("state"), row.get("idle_s")
    if state not in A.IDLE_STATES or not isinstance(idle_s, int):
        return None
    after = A.release_after(release_minutes(r), policy_minutes)
    keep = keep_until(r)
    if after is None or idle_s < after or (keep is not None and now < keep):
        return None
    whose = "its opt-in" if release_minutes(r) is not None else "the administrator's idle_release_minutes"
    return (f"released: idle {format_duration(idle_s)} ({A.state_words(state)}"
            f"{evidence_text(row.get('evidence'))}), after {format_duration(after)} by {whose}; "
            f"evidence: bk u samples -r {r.short_id}")


def evidence_text(ev) -> str:
    """``; 8.0 GiB held, SM 0 %, 61 W (idle 58 W), CPU 0.0 %`` from the evidence object."""
    if not isinstance(ev, dict):
        return ""
    bits = []
    if isinstance(ev.get("mem_mib"), int):
        bits.append(f"{ev['mem_mib'] / 1024:.1f} GiB held")
    if isinstance(ev.get("sm_max"), int):
        bits.append(f"SM {ev['sm_max']} %")
    if isinstance(ev.get("power_mw"), int):
        base = ev.get("baseline_mw")
        bits.append(f"{ev['power_mw'] // 1000} W" + (f" (idle {base // 1000} W)" if isinstance(base, int) else ""))
    if isinstance(ev.get("cpu_pct"), (int, float)):
        bits.append(f"CPU {ev['cpu_pct']:.1f} %")
    return ("; " + ", ".join(bits)) if bits else ""


def adopt_reason(r: Reservation, now: int, alive) -> str | None:
    """Why ``r`` (a ``bk adopt`` booking) ends now: none of its processes
    runs any more; ``alive(pid, start)`` tells whether that exact process
    still runs.  None: it goes on."""
    procs = adopted(r)
    if not procs or r.cancelled_at is not None or not r.start <= now < r.end:
        return None
    if any(alive(pid, start) for pid, start in procs):
        return None
    pids = ", ".join(str(p) for p, _ in procs)
    noun = "process" if len(procs) == 1 else "processes"
    return f"ended early: the adopted {noun} {pids} exited"
