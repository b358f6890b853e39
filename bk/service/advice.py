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
    return _shell_join(_booking_words(req, p, now, slot_minutes))


def _booking_words(req, p, now: int, slot_minutes: int) -> list[str]:
    words = ["bk"] + (["x"] if req.mode == EXCLUSIVE else [])
    words += [str(req.count), timegrid.format_duration(req.duration)]
    if req.mem_mib:
        words.append(timegrid.format_memory(req.mem_mib))
    if req.mode != EXCLUSIVE and req.share > 1:
        words += ["-s", str(req.share)]
    words += ["-g", ",".join(map(str, p.gpus))]
    if p.start > timegrid.floor_slice(now, slot_minutes):
        words += ["--start", iso(p.start)]
    return words


# What shlex.quote leaves unquoted (``[\w@%+=:,./-]`` in ASCII).
_SHELL_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-")


def _shell_join(words: list[str]) -> str:
    """``shlex.join(words)``; shlex (and the ``re`` it imports) only when a
    word needs quotes: the words of a booking command rarely do."""
    if all(w and _SHELL_SAFE.issuperset(w) for w in words):
        return " ".join(words)
    import shlex

    return shlex.join(words)


def local_command(req, p, now: int, slot_minutes: int, tz) -> str:
    """``booking_command`` for a person to copy: a later start as local time
    (``-t "2026-07-13 20:00"``, which is exact like ``--start``).  A local
    time that names two instants (a DST fold) stays ISO, which names one."""
    from bk.core.utctime import datetime

    words = _booking_words(req, p, now, slot_minutes)
    if "--start" not in words:
        return _shell_join(words)
    local = datetime.fromtimestamp(p.start, tz)
    twin = local.replace(fold=1 - local.fold)
    if twin.utcoffset() != local.utcoffset():
        return _shell_join(words)
    i = words.index("--start")
    words[i:i + 2] = ["-t", local.strftime("%Y-%m-%d %H:%M")]
    return _shell_join(words)


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

    def describe(self) -> str:
        """What was asked for, in words (``describe``)."""
        return describe(self.request)

    def options_json(self) -> list[dict]:
        return [option_json(self.request, p, self.now, self.slot_minutes) for p in self.options]

    def to_json(self) -> dict:
        return {"request": request_json(self.request), "options": self.options_json()}

    @staticmethod
    def json_schema() -> dict:
        from bk.service.views import obj, typed

        s, i = typed("string"), typed("integer")
        gpus = {"type": "array", "items": i}
        request = obj({"count": i, "duration": typed("integer", description="seconds"), "mode": s, "share": i,
                       "mem_mib": typed("integer", null=True), "start": typed("string", null=True),
                       "pinned": {"anyOf": [gpus, {"type": "null"}]}, "excluded": gpus})
        option = obj({"gpus": gpus, "start": s, "end": s,
                      "command": typed("string", description="the bk command that books it"),
                      "queued": typed("boolean"), "mem_mib_effective": typed("integer", null=True),
                      "reasons": typed("object", description="GPU -> why it was or was not chosen")})
        return obj({"request": request, "options": {"type": "array", "items": option}})


@dataclass(frozen=True)
class GpuAdvice:
    """``bk g``: the caller's GPUs now (with the export line), GPUs free now
    (with their live state), or, when none are, the earliest options
    (``free_now`` False)."""

    current: tuple            # the caller's active bookings (Reservation)
    current_json: tuple       # their JSON rows
    export: str | None
    options: Recommendation | None = None
    free_now: bool = True
    request: object = None    # the BookRequest looked for (None: the caller's GPUs were shown)
    live: dict | None = None  # GPU index -> status.GpuLive of the GPUs free now (None: not looked at)
    missing: str | None = None        # what the telemetry misses, in one line

    def to_json(self) -> dict:
        out = {"current": list(self.current_json),
               "options": self.options.options_json() if self.options is not None else [],
               "export": self.export, "free_now": self.free_now}
        if self.live is not None:
            shown = sorted({g for p in self.options.options for g in p.gpus})
            out["live"] = [self.live[g].to_json() for g in shown if g in self.live]
        return out


# ------------------------------------------------------------ the rows

@dataclass(frozen=True)
class RecommendRequest:
    """Where and when a booking would fit (``bk slots``, the agent's
    ``recommend``): the booking's shape and the options wanted."""

    count: int
    duration: int
    mode: str = "shared"
    share: int = 1
    mem_mib: int | None = None
    start: int | None = None          # the earliest start (None: now)
    pinned: tuple[int, ...] | None = None
    excluded: tuple[int, ...] = ()
    limit: int = 3

    def book(self):
        """The booking these options are for (``BookRequest``)."""
        from bk.service.requests import BookRequest

        return BookRequest(self.count, self.duration, mode=self.mode, share=self.share, mem_mib=self.mem_mib,
                           start=self.start, queue=self.start is not None, pinned=self.pinned,
                           excluded=self.excluded)


MAX_RECOMMEND = 20


def check_recommend(req: RecommendRequest) -> None:
    from bk.service.requests import check_request

    check_request(req.book())


def _recommend(service, req, alternatives: int, call, state=None) -> Recommendation:
    """The scheduler's options for the BookRequest ``req`` on the committed
    ledger (or ``state``), ranked with the call's GPU snapshot."""
    from bk.core import scheduler, telemetry
    from bk.service import booking
    from bk.service.requests import check_request

    check_request(req)
    if state is None:
        state = service.ledger(call=call, keep=live_keep(call))
    snap = call.telemetry.snapshot()
    found = scheduler.recommend(booking._sched_request(req), reservations=state.reservations,
                                blackouts=state.blackouts, policy=call.policy, gpus=list(snap.gpus),
                                now=call.now, alternatives=alternatives, tz=call.tz,
                                load=telemetry.placement_load(snap, state.reservations, call.now,
                                                              uid=call.actor.uid))
    return Recommendation(req, tuple(found), call.now, call.policy.slot_minutes)


def live_keep(call):
    """What a placement reads: the caller's bookings (their list numbers,
    their own limits) and every booking that still holds capacity at
    ``call.now``.  The scheduler (``capacity.index_holds``) and attribution
    (``telemetry.active_gpus_by_uid``) skip cancelled and ended ones, so on
    a sealed ledger the rest need not be built (tests/test_reads.py)."""
    from bk.core.ledgerdoc import DocKeep

    return DocKeep(uid=call.actor.uid, lo=call.now)


def window_keep(call, until: int):
    """What ``bk g`` reads first: the caller's bookings and every booking
    that holds capacity from ``call.now`` to ``until`` (``_ready``)."""
    from bk.core.ledgerdoc import DocKeep

    return DocKeep(uid=call.actor.uid, lo=call.now, hi=until)


def _ready(req, call, state, until: int) -> Recommendation | None:
    """``_recommend(...).ready()`` from a state that holds every booking
    before ``until`` (``window_keep``), when that tells it
    (``scheduler.options_now``); None when it has no option now, or might
    not."""
    from bk.core import scheduler, telemetry
    from bk.service import booking
    from bk.service.requests import check_request

    check_request(req)
    snap = call.telemetry.snapshot()
    found = scheduler.options_now(booking._sched_request(req), reservations=state.reservations,
                                  blackouts=state.blackouts, policy=call.policy, gpus=list(snap.gpus),
                                  now=call.now, complete_until=until, alternatives=GPU_OPTIONS, tz=call.tz,
                                  load=telemetry.placement_load(snap, state.reservations, call.now,
                                                                uid=call.actor.uid))
    if not found:
        return None
    return Recommendation(req, tuple(found), call.now, call.policy.slot_minutes)


def _serve_recommend(service, req: RecommendRequest, call) -> Recommendation:
    return _recommend(service, req.book(), req.limit, call)


@dataclass(frozen=True)
class GpuRequest:
    """``bk g``: the caller's GPUs now, or (``count``, or no booking running)
    GPUs free now for a booking of this shape."""

    count: int | None = None          # None: your running bookings' GPUs, else one GPU
    duration: int = 3600
    mode: str = "shared"
    share: int = 1
    mem_mib: int | None = None
    pinned: tuple[int, ...] | None = None
    excluded: tuple[int, ...] = ()


GPU_OPTIONS = 3


def _serve_gpu(service, req: GpuRequest, call) -> GpuAdvice:
    from bk.core.errors import Conflict
    from bk.service.requests import BookRequest
    from bk.service.status import live_gpus
    from bk.service.views import View, own_current

    now = call.now
    # One read serves both the current bookings and the options now: yours,
    # and the live ones of the coming day (``window_keep``); only when the
    # options now cannot be told from those are the live ones all read.
    span = 4 * req.duration if type(req.duration) is int else 0      # (checked with the request)
    until = timegrid.floor_slice(now, call.policy.slot_minutes) + max(span, 86400)
    state = service.ledger(call=call, keep=window_keep(call, until))
    mine = own_current(state, call)
    view = View.of(call, {r.id: i for i, r in enumerate(mine, 1)})
    active = tuple(r for r in mine if r.status(now) == "active")
    current = tuple(view.reservation(r) for r in active)
    if req.count is None and active:
        booked = {g for r in active for g in r.gpus}
        here = present_gpus(booked, call.telemetry.inventory())
        if here != booked:
            gone = sorted(booked - here)
            call.warn(f"{'GPU' if len(gone) == 1 else 'GPUs'} {timegrid.gpus_text(gone)} of your booking "
                      f"{'is' if len(gone) == 1 else 'are'} not on this machine now: "
                      + ("CUDA_VISIBLE_DEVICES names only the GPUs present" if here else
                         "there is no GPU of it to use (bk doctor says more)"))
        return GpuAdvice(active, current, export_line(here) if here else None)
    book = BookRequest(req.count or 1, req.duration, mode=req.mode, share=req.share, mem_mib=req.mem_mib,
                       pinned=req.pinned, excluded=req.excluded)
    ready = _ready(book, call, state, until)
    if ready is not None:
        live, missing = live_gpus(state, call)
        return GpuAdvice(active, current, None, ready, request=book, live=live, missing=missing)
    state = service.ledger(call=call, keep=live_keep(call))
    rec = _recommend(service, book, GPU_OPTIONS, call, state)
    ready = rec.ready()
    if not rec.options:
        raise Conflict(f"nothing fits {describe(book)} within the next "
                       f"{timegrid.counted(call.policy.queue_search_hours, 'hour')} (queue_search_hours)",
                       hint="ask for fewer GPUs, less memory or a shorter time")
    if not ready.options:
        # Not an error: the question was where to run, and the answer is
        # "not now, but here is the earliest", with the command that books it.
        return GpuAdvice(active, current, None, rec, free_now=False, request=book)
    live, missing = live_gpus(state, call)
    return GpuAdvice(active, current, None, ready, request=book, live=live, missing=missing)


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
