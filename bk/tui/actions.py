"""What the screen's actions do, through the service layer.

Each function takes the service, the action's draft or reference and the
GPU snapshot the screen drew from, and returns an ``Outcome``: the line for
the status bar, whether it failed, and (for "find the earliest") the draft
moved to what was found.  The request is built from the draft's typed
values with ``bk.service.builders`` and a fresh ``Call`` (the clock read
at submit, not at preview), and the service validates it again inside its
transaction: whatever changed since the preview, a refusal comes back as a
``BkError`` with its reason, and nothing was written.
"""

from __future__ import annotations

from bk.core import timegrid
from bk.core.errors import BkError
from bk.core.models import EXCLUSIVE
from bk.core.record import dataclass, replace


@dataclass(frozen=True)
class Outcome:
    message: str
    error: bool = False
    draft: object = None               # keys.Draft: the form stays open with it
    done: bool = False                 # a write happened: close the form
    reservation: str | None = None     # the booking it made or changed


def _call(app, snapshot, inventory=None):
    """A fresh call whose placement sees the snapshot the screen showed, so
    a write never waits for the GPUs (the broker uses its own anyway)."""
    call = app.call()
    if snapshot is None:
        return call
    from bk.service import Fixed

    try:
        inv = inventory if inventory is not None else call.telemetry.inventory()
    except BkError:
        return call
    return app.call(telemetry=Fixed(snapshot, inv))


def failed(e: BkError) -> Outcome:
    # The verdict first: a long reason is cut at the screen's edge, the verdict never.
    return Outcome("nothing changed: " + e.message + (f" (hint: {e.hint})" if e.hint else ""), error=True)


def _book_request(d, call, *, queue: bool = False):
    from bk.service import builders

    exact = d.start > call.now - call.now % (call.policy.slot_minutes * 60)
    req, _ = builders.book_request(
        count_=max(1, len(d.gpus)), duration_=d.duration, policy=call.policy, now=call.now, tz=call.tz,
        mem=d.mem_mib if d.mode != EXCLUSIVE else None, mode=d.mode,
        share=d.share if d.mode != EXCLUSIVE else None,
        at=None if exact else "now", start_at=d.start if exact else None,
        queue=queue, gpus=None if queue else (d.gpus or None))
    return req


def book(app, d, snapshot=None) -> Outcome:
    if not d.gpus:
        return Outcome("choose at least one GPU (Space or a digit on the GPUs field)", error=True)
    call = _call(app, snapshot)
    try:
        res = app.run("book", _book_request(d, call), call=call)
    except BkError as e:
        return failed(e)
    r = res.reservation
    span = timegrid.format_span(r.start, r.end, call.tz, call.now)
    return Outcome(f"booked {r.id[:8]}: GPU {','.join(map(str, r.gpus))} {r.mode} {span}", done=True,
                   reservation=r.id)


def edit(app, d, snapshot=None) -> Outcome:
    from bk.service import builders

    call = _call(app, snapshot)
    try:
        from bk.service import ResolveRequest

        old = app.run("resolve", ResolveRequest(d.edit_of), call=call).reservation
        kw: dict = {}
        if d.running:
            if d.end != old.end:
                kw["end"] = d.end
        else:
            if d.start != old.start:
                kw["start_at"] = d.start
            if d.duration != old.end - old.start or d.start != old.start:
                kw["length"] = d.duration
        if not d.running:
            if tuple(d.gpus) != tuple(old.gpus):
                kw["gpus"] = d.gpus
            if d.mode != old.mode:
                kw["mode"] = d.mode
            if d.mode != EXCLUSIVE and (d.share != old.share or d.mode != old.mode):
                kw["share"] = d.share
            if d.mem_mib != old.mem_mib and d.mode != EXCLUSIVE:
                if d.mem_mib is None:
                    kw["clear_mem"] = True
                else:
                    kw["mem"] = d.mem_mib
        if not kw:
            return Outcome("nothing to change", done=True, reservation=old.id)
        req = builders.edit_request(old, policy=call.policy, now=call.now, tz=call.tz, **kw)
        res = app.run("edit", req, call=call)
    except BkError as e:
        return failed(e)
    r = res.reservation
    span = timegrid.format_span(r.start, r.end, call.tz, call.now)
    return Outcome(f"changed {r.id[:8]}: GPU {','.join(map(str, r.gpus))} {span}", done=True, reservation=r.id)


def cancel(app, ref: str, snapshot=None) -> Outcome:
    from bk.service import CancelRequest

    call = _call(app, snapshot)
    try:
        res = app.run("cancel", CancelRequest(ref=ref), call=call)
    except BkError as e:
        return failed(e)
    return Outcome(f"cancelled {res.reservation.id[:8]}", done=True, reservation=res.reservation.id)


KEEP_FOR = "4h"


def keep(app, ref: str, snapshot=None) -> Outcome:
    """``K``: keep the booking ``KEEP_FOR`` (``bk e ID --keep-for 4h``)."""
    from bk.service import ResolveRequest, builders

    call = _call(app, snapshot)
    try:
        old = app.run("resolve", ResolveRequest(ref), call=call).reservation
        req = builders.edit_request(old, policy=call.policy, now=call.now, tz=call.tz, keep_for_=KEEP_FOR)
        res = app.run("edit", req, call=call)
    except BkError as e:
        return failed(e)
    r = res.reservation
    until = timegrid.format_local_short(min(r.end, call.now + 4 * 3600), call.tz, call.now)
    return Outcome(f"kept {r.id[:8]} until {until}: no idle nudge or release before then", done=True,
                   reservation=r.id)


def find(app, d, snapshot=None) -> Outcome:
    """The earliest start at or after the draft's for as many GPUs (any of
    them), with the draft moved there; books nothing."""
    call = _call(app, snapshot)
    try:
        from bk.service import builders

        req = _book_request(replace(d, gpus=d.gpus or (0,)), call, queue=True)
        found = app.run("recommend", builders.recommend_request(req, 1), call=call)
    except BkError as e:
        return Outcome(e.message + (f" (hint: {e.hint})" if e.hint else ""), error=True)
    if not found.options:
        return Outcome(f"no start for {len(d.gpus) or 1} GPU(s) for {timegrid.format_duration(d.duration)} "
                       "within the search horizon", error=True)
    p = found.options[0]
    nd = replace(d, start=p.start, duration=p.end - p.start, gpus=tuple(p.gpus))
    when = "now" if p.start <= call.now else timegrid.format_local_short(p.start, call.tz, call.now)
    return Outcome(f"earliest: {when} on GPU {','.join(map(str, p.gpus))}; Enter books it", draft=nd)


def perform(app, action, snapshot=None) -> Outcome | None:
    if action.kind == "book":
        return book(app, action.draft, snapshot)
    if action.kind == "edit":
        return edit(app, action.draft, snapshot)
    if action.kind == "cancel":
        return cancel(app, action.ref, snapshot)
    if action.kind == "find":
        return find(app, action.draft, snapshot)
    if action.kind == "keep":
        return keep(app, action.ref, snapshot)
    return None
