"""Geometry and the grid the screen draws, as pure functions.

The grid is ``bk.service.timeline``'s rule (a cell shows the *most* share
slots held at any instant of its column, so a cell that looks free really
is free for its whole width), computed differently: the text timeline
scans every booking for every cell, which is fine for one print but not
for a frame a second with a thousand bookings.  Here each GPU's holds
become edges swept once across the columns (``O(edges + columns)``), and
who is in a cell is counted with difference arrays; only the caller's own
bookings, which get a letter each, are walked cell by cell.
"""

from __future__ import annotations

from bk.core.models import EXCLUSIVE
from bk.core.record import dataclass

# Zoom levels, seconds per column: 5 minutes to one day (SPEC 10).
ZOOMS = (300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
DEFAULT_STEP = 900
MIN_W, MIN_H = 60, 16
ID_MIN = 4                     # the shortest prefix the service resolves


def zooms(slot_minutes: int) -> tuple[int, ...]:
    """The zoom levels this slice length allows (a column holds whole slices)."""
    slot = slot_minutes * 60
    return tuple(z for z in ZOOMS if z % slot == 0) or (slot,)


def label_width(gpus: list[int]) -> int:
    return len(f"GPU {max(gpus)}") + 1 if gpus else 6


def columns(width: int, gpus: list[int]) -> int:
    """Timeline columns at ``width``: one per step after the GPU labels."""
    return max(10, width - label_width(gpus) - 1)


def home(now: int, step: int) -> int:
    """The window start that follows now: one step of past for context."""
    grid = min(step, 3600)
    return now - now % grid - step


def window_start(frm: int | None, now: int, step: int) -> int:
    if frm is None:
        return home(now, step)
    grid = min(step, 3600)
    return frm - frm % grid


@dataclass(frozen=True)
class Cell:
    used: int            # most share slots held at any instant of the column
    mine: int            # how many of the caller's bookings touch it
    first_mine: int      # index (into the caller's rows) of the first, or -1
    others: int          # how many of other people's
    blackout: bool
    full_mine: bool = False   # full at an instant one of the caller's bookings holds it


def lane_cells(holds, own_rows: dict[str, int], *, frm: int, step: int, n: int, capacity: int,
               actor_uid: int, dark: list[bool]) -> list[Cell]:
    """The cells of one GPU.  ``holds``: its bookings (not cancelled);
    ``own_rows``: the caller's booking IDs -> their letter index."""
    to = frm + n * step
    edges = []
    mine_d = [0] * (n + 1)
    other_d = [0] * (n + 1)
    first = [-1] * n
    own: list[tuple[int, int]] = []          # the caller's spans, for "full while yours"
    for r in holds:
        if r.end <= frm or r.start >= to:
            continue
        slots = capacity if r.mode == EXCLUSIVE else r.share
        edges.append((r.start, slots))
        edges.append((r.end, -slots))
        c0 = max(0, (r.start - frm) // step)
        c1 = min(n - 1, (r.end - 1 - frm) // step)
        if r.uid == actor_uid:
            mine_d[c0] += 1
            mine_d[c1 + 1] -= 1
            own.append((r.start, r.end))
            k = own_rows.get(r.id, -1)
            for c in range(c0, c1 + 1):
                if first[c] < 0 or (0 <= k < first[c]):
                    first[c] = k
        else:
            other_d[c0] += 1
            other_d[c1 + 1] -= 1
    # Ends before starts at one instant: a booking that ends as another
    # begins does not count twice.
    edges.sort()
    cells = []
    cur = i = m = o = 0
    ne = len(edges)
    for c in range(n):
        lo = frm + c * step
        hi = lo + step
        while i < ne and edges[i][0] <= lo:
            cur += edges[i][1]
            i += 1
        m += mine_d[c]
        o += other_d[c]
        # The column as runs of constant load [seg, nxt): its most, and
        # whether a run at capacity overlaps one of the caller's spans (a
        # GPU that fills after the caller's booking left is not "full" for it).
        best, full_mine, seg = cur, False, lo
        while True:
            nxt = edges[i][0] if i < ne and edges[i][0] < hi else hi
            if m and not full_mine and cur >= capacity and seg < nxt:
                full_mine = any(a < nxt and b > seg for a, b in own)
            if nxt >= hi:
                break
            while i < ne and edges[i][0] == nxt:
                cur += edges[i][1]
                i += 1
            best = max(best, cur)
            seg = nxt
        cells.append(Cell(best, m, first[c], o, dark[c], full_mine))
    return cells


def dark_columns(blackouts, *, frm: int, step: int, n: int) -> list[bool]:
    out = [False] * n
    for b in blackouts:
        if b.end <= frm or b.start >= frm + n * step:
            continue
        for c in range(max(0, (b.start - frm) // step), min(n - 1, (b.end - 1 - frm) // step) + 1):
            out[c] = True
    return out


def by_gpu(reservations, gpus: list[int], skip: str | None = None) -> dict[int, list]:
    per: dict[int, list] = {g: [] for g in gpus}
    for r in reservations:
        if r.id == skip:
            continue
        for g in r.gpus:
            lst = per.get(g)
            if lst is not None:
                lst.append(r)
    return per


def table_rows(reservations, *, frm: int, to: int, now: int) -> list:
    """The bookings the table lists: every one that is live (now or later),
    and past ones the window shows; by start."""
    rows = [r for r in reservations if (r.end > now) or (r.start < to and r.end > frm)]
    rows.sort(key=lambda r: (r.start, r.created, r.id))
    return rows


def short_ids(all_ids, wanted) -> dict[str, str]:
    """The shortest prefix (at least ``ID_MIN`` characters) of each of
    ``wanted`` that no other ID of ``all_ids`` shares."""
    import bisect
    import os.path

    ids = sorted(set(all_ids))
    out = {}
    for x in wanted:
        i = bisect.bisect_left(ids, x)
        need = ID_MIN
        # In sorted order the IDs sharing the longest prefix with x are its neighbours.
        for j in (i - 1, i + 1):
            if 0 <= j < len(ids):
                need = max(need, len(os.path.commonprefix([x, ids[j]])) + 1)
        out[x] = x[:min(need, len(x))]
    return out


def own_letter(k: int) -> str:
    return "abcdefghijklmnopqrstuvwxyz"[k] if 0 <= k < 26 else "*"
