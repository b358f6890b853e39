"""The text timeline (``bk tl``) as data: GPUs by time steps.

A column covers ``[t, t + step)``.  Its ``used`` is the *largest* number of
share slots held at any instant inside it, not an average: a column that
shows a GPU as having room must really have room for its whole width, or a
user reading the picture would book into a conflict.  Own bookings are
listed apart from others' so a front end can draw them differently.

``plan`` picks the window and the step for a given number of columns;
``build`` is a pure function of the ledger's reservations and blackouts
returning a typed ``Grid``, so the TUI and tests can call it with any world;
the ``timeline`` row (``TimelineRequest``) reads the committed ledger for
it as a typed ``TimelineView`` whose ``to_json()`` is the contract.
"""

from __future__ import annotations

from bk.core.models import EXCLUSIVE, Reservation, iso
from bk.core.record import dataclass

# Steps a timeline may use, in minutes; each must be a multiple of the slice.
STEP_LADDER_MIN = (5, 10, 15, 20, 30, 60, 120, 180, 360, 720, 1440)
DEFAULT_WINDOW_S = 12 * 3600
MAX_COLUMNS = 2000


def choose_step(columns: int, window: int, slot_minutes: int) -> int:
    """The finest ladder step (seconds) that shows ``window`` in ``columns``."""
    steps = [m * 60 for m in STEP_LADDER_MIN if m % slot_minutes == 0] or [slot_minutes * 60]
    for s in steps:
        if s * columns >= window:
            return s
    return steps[-1]


def plan(columns: int, now: int, slot_minutes: int, *, frm: int | None = None,
         window: int | None = None, step: int | None = None) -> tuple[int, int, int]:
    """-> (from, to, step) in epoch seconds.

    The step, when not given, is the finest that fits ``window`` (default
    12 h) in ``columns``; the window, when not given, fills the columns.  The
    default start is one step before now, on the step's grid, so "now" sits
    near the left edge with a little of the past for context."""
    columns = max(1, columns)
    if step is None:
        step = choose_step(columns, window or DEFAULT_WINDOW_S, slot_minutes)
    grid = min(step, 3600)
    if frm is None:
        frm = now - now % grid - step
    else:
        frm -= frm % grid
    if window is None:
        window = columns * step
    n = max(1, -(-window // step))
    return frm, frm + n * step, step


def _max_used(holds: list[tuple[int, int, int]], lo: int, hi: int) -> int:
    """The most slots held at any instant of ``[lo, hi)``."""
    edges = []
    for a, b, slots in holds:
        a, b = max(a, lo), min(b, hi)
        if a < b:
            edges.append((a, slots))
            edges.append((b, -slots))
    # Ends sort before starts at the same instant (negative first): a booking
    # that ends as another begins does not count twice.
    edges.sort()
    best = cur = 0
    for _, d in edges:
        cur += d
        best = max(best, cur)
    return best


@dataclass(frozen=True)
class Cell:
    """One GPU over one column: the most share slots held at any instant in
    it, whose bookings (short IDs) and whether a blackout touches it."""

    used: int
    mine: tuple[str, ...]
    others: tuple[str, ...]
    blackout: bool
    # Whether the GPU is full while one of the caller's bookings holds it:
    # ``used`` is the column's most, which may come after the booking left.
    full_mine: bool = False

    def to_json(self) -> dict:
        return {"used": self.used, "mine": list(self.mine), "others": list(self.others),
                "blackout": self.blackout}


@dataclass(frozen=True)
class Lane:
    index: int
    disabled: bool
    cells: tuple

    def to_json(self) -> dict:
        return {"index": self.index, "disabled": self.disabled, "cells": [c.to_json() for c in self.cells]}


@dataclass(frozen=True)
class Grid:
    frm: int
    to: int
    step: int
    capacity: int
    lanes: tuple

    def to_json(self) -> dict:
        return {"from": iso(self.frm), "to": iso(self.to), "step": self.step, "capacity": self.capacity,
                "gpus": [lane.to_json() for lane in self.lanes]}


@dataclass(frozen=True)
class TimelineView:
    """The grid of the live ledger with the bookings and blackouts it shows."""

    now: int
    grid: Grid
    blackouts: tuple
    reservations: tuple
    view: object                      # bk.service.results.View
    label_w: int = 5                  # the width of the GPU labels the picture leaves room for

    def to_json(self) -> dict:
        out = self.grid.to_json()
        out["now"] = iso(self.now)
        out["blackouts"] = [{"id": b.id, "start": iso(b.start), "end": iso(b.end), "reason": b.reason}
                            for b in self.blackouts]
        out["reservations"] = [self.view.reservation(r) for r in self.reservations]
        return out


def build(reservations, blackouts, *, capacity: int, gpus: list[int], disabled=frozenset(),
          frm: int, to: int, step: int, actor_uid: int) -> Grid:
    """Cells for each GPU in ``gpus`` over ``[frm, to)``; cell ``i`` starts
    at ``frm + i * step``."""
    wanted = set(gpus)
    per: dict[int, list[Reservation]] = {g: [] for g in gpus}
    for r in reservations:
        if r.cancelled_at is not None or r.end <= frm or r.start >= to:
            continue
        for g in r.gpus:
            if g in wanted:
                per[g].append(r)
    dark = [(b.start, b.end) for b in blackouts if b.end > frm and b.start < to]
    cols = range(frm, to, step)
    lanes = []
    for g in gpus:
        lst = sorted(per[g], key=lambda r: (r.start, r.created))
        cells = []
        for t in cols:
            e = t + step
            here = [r for r in lst if r.start < e and r.end > t]
            holds = [(r.start, r.end, capacity if r.mode == EXCLUSIVE else r.share) for r in here]
            mine = [r for r in here if r.uid == actor_uid]
            cells.append(Cell(_max_used(holds, t, e),
                              tuple(r.short_id for r in mine),
                              tuple(r.short_id for r in here if r.uid != actor_uid),
                              any(a < e and b > t for a, b in dark),
                              any(_max_used(holds, max(t, r.start), min(e, r.end)) >= capacity for r in mine)))
        lanes.append(Lane(g, g in disabled, tuple(cells)))
    return Grid(frm, to, step, capacity, tuple(lanes))


def timeline_view(state, call, *, frm: int, to: int, step: int, gpus: list[int] | None = None) -> TimelineView:
    """The timeline of ``state`` (a read of the committed ledger), with the
    bookings it shows."""
    from bk.service.views import View, numbers_of

    now, policy = call.now, call.policy
    if gpus is None:
        from bk.service.status import shown_gpus

        gpus = shown_gpus(state.reservations, now, policy.gpu_count)
    grid = build(state.reservations, state.blackouts, capacity=policy.max_shared_users, gpus=gpus,
                 disabled=policy.disabled_gpus, frm=frm, to=to, step=step, actor_uid=call.actor.uid)
    wanted = set(gpus)
    shown = sorted((r for r in state.reservations if r.cancelled_at is None and r.start < to
                    and r.end > frm and wanted & set(r.gpus)), key=lambda r: (r.start, r.created))
    view = View(now, call.actor.uid, policy, call.gpu_mem(), numbers_of(state, call))
    return TimelineView(now, grid, tuple(b for b in state.blackouts if b.end > frm and b.start < to),
                        tuple(shown), view)


@dataclass(frozen=True)
class TimelineRequest:
    """``bk tl``: the window (``frm``, ``window``, ``step``: None picks what
    fits) drawn ``width`` characters wide, GPU labels included; ``fit``
    refuses more columns than fit (a person's terminal; JSON need not fit)."""

    width: int = 80
    frm: int | None = None
    window: int | None = None
    step: int | None = None
    gpus: tuple[int, ...] | None = None
    fit: bool = True


def _serve_timeline(service, req: TimelineRequest, call) -> TimelineView:
    from bk.core.errors import InvalidInput
    from bk.core.ledgerdoc import DocKeep
    from bk.core.record import replace

    now, policy = call.now, call.policy
    if req.gpus is not None:
        bad = [g for g in req.gpus if g >= policy.gpu_count]
        if bad:
            raise InvalidInput(f"no GPU {', '.join(map(str, bad))} here (GPUs 0 to {policy.gpu_count - 1})",
                               hint="see the GPUs with: bk st")

    def label_width(shown: list[int]) -> int:
        return len(f"GPU {max(shown)}") if shown else 5

    def window_for(shown: list[int]) -> tuple[int, int, int]:
        return plan(max(10, req.width - label_width(shown) - 1), now, policy.slot_minutes, frm=req.frm,
                    window=req.window, step=req.step)

    # One read serves the GPU rows and the grid, and builds only the bookings
    # the window shows (with yours, for the numbers, and any on a GPU this
    # machine lacks, which adds a row).  Such a row widens the labels; if the
    # window it gives is not the one read, the read is made again, whole.
    guess = list(req.gpus) if req.gpus is not None else list(range(policy.gpu_count))
    lo, hi, _ = window_for(guess)
    state = service.ledger(call=call, keep=DocKeep(uid=call.actor.uid, lo=lo, hi=hi, gpu_count=policy.gpu_count))
    if req.gpus is not None:
        shown = list(req.gpus)
    else:   # this machine's GPUs, and any other a live booking holds
        from bk.service.status import shown_gpus

        shown = shown_gpus(state.reservations, now, policy.gpu_count)
    label_w = label_width(shown)
    columns = max(10, req.width - label_w - 1)
    frm, to, step = window_for(shown)
    if frm < lo or to > hi:
        state = service.ledger(call=call)
    ncols = (to - frm) // step
    if ncols > MAX_COLUMNS or (ncols > columns and req.fit):
        raise InvalidInput(f"{ncols} columns do not fit a {req.width}-column terminal",
                           hint="use a larger --step, a shorter --window, or --step auto")
    return replace(timeline_view(state, call, frm=frm, to=to, step=step, gpus=shown), label_w=label_w)
