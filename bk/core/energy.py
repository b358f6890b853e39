"""Energy per GPU and per booking from the driver's energy counter.  Pure.

The facts:

* NVML's ``nvmlDeviceGetTotalEnergyConsumption`` is a 64-bit counter of
  millijoules since the driver loaded.  Its difference between two looks is
  the energy of that interval, whatever the board did in between; sampled
  power is not (on A100/H100 the reading is an average that covers about a
  quarter of the time).  So energy comes from the counter alone.
* The counter starts again from 0 when the driver reloads, and a driver or
  device fault can report nonsense.  A difference that is negative (a
  reset, or a wrap of the 64 bits), larger than the board could draw in the
  time (``MAX_W`` or 1.5 times its power limit), over a gap longer than
  ``GAP_INTERVALS`` sample intervals (the monitor was stopped: the energy is
  real but cannot be placed in its minutes), or missing at either end is
  **unknown**: no figure, never a negative or an invented one.

How an interval's energy ``E`` is shared on one GPU (``split``):

* An exclusive booking gets all of ``E``: the GPU is its own.
* Otherwise the idle baseline's part, ``B = min(E, baseline × dt)``, is
  the cost of the GPU being on at all; each shared booking gets the part of
  ``B`` of the slots it holds (``share / capacity``), and the slots nobody
  holds go to ``other``.  The rest, ``E - B``, is the work: it goes to the
  processes by their SM readings (a booking's, a user's without a booking,
  and those of unknown or system processes to ``other``); with no SM
  reading above 0, to the bookings that have a process there by their
  slots, else to ``other``.  Without a learned baseline all of ``E`` is
  shared as work.
* The parts and ``other`` add up to ``E``.  ``settle`` turns the parts of
  a period into whole millijoules, rounding each down and giving ``other``
  the rest, so the integers add up exactly and none is negative.
"""

from __future__ import annotations

MAX_W = 5000               # no board draws more (a counter jump beyond is a fault)
GAP_INTERVALS = 3
OTHER = ("other",)         # the key of energy nobody is credited with


def counter_delta(prev: tuple[int, int] | None, t: int, counter: int | None, *, interval_s: float,
                  limit_mw: int | None = None) -> int | None:
    """The energy (mJ) between the previous reading ``prev`` = (t, counter)
    and this one, or None when it is unknown (see the module essay)."""
    if prev is None or counter is None:
        return None
    t0, c0 = prev
    dt = t - t0
    if dt <= 0 or dt > GAP_INTERVALS * interval_s:
        return None
    delta = counter - c0
    if delta < 0:
        return None
    cap_w = min(MAX_W, 1.5 * limit_mw / 1000) if limit_mw else MAX_W
    if delta > cap_w * 1000 * (dt + 1):          # +1: the clock is whole seconds
        return None
    return delta


def split(energy: float, dt_s: float, *, baseline_mw: int | None, capacity: int, holders,
          sm: dict, present: set) -> tuple[dict, float]:
    """One interval's energy on one GPU: (key -> part, other).

    ``holders``: (key, mode, share) of the bookings running on the GPU;
    ``sm``: key -> the SM sum of its processes this sample (``OTHER`` for
    unknown and system processes; keys of uses without a booking too);
    ``present``: booking keys with a process on the GPU."""
    parts: dict = {}
    if energy <= 0:
        return parts, 0.0
    exclusive = [k for k, mode, _ in holders if mode == "exclusive"]
    if exclusive:
        each = energy / len(exclusive)
        for k in exclusive:
            parts[k] = parts.get(k, 0.0) + each
        return parts, 0.0
    other = 0.0
    base = min(energy, baseline_mw * dt_s) if baseline_mw else 0.0
    work = energy - base
    if base:
        slots = max(capacity, sum(share for _, _, share in holders), 1)
        given = 0.0
        for k, _, share in holders:
            part = base * share / slots
            parts[k] = parts.get(k, 0.0) + part
            given += part
        other += base - given
    total_sm = sum(v for v in sm.values() if v > 0)
    if total_sm > 0:
        for k, v in sm.items():
            if v <= 0:
                continue
            part = work * v / total_sm
            if k == OTHER:
                other += part
            else:
                parts[k] = parts.get(k, 0.0) + part
    else:
        here = [(k, share) for k, _, share in holders if k in present]
        weight = sum(share for _, share in here)
        if weight:
            for k, share in here:
                parts[k] = parts.get(k, 0.0) + work * share / weight
        else:
            other += work
    return parts, other


def settle(total: int, parts: dict) -> tuple[dict, int]:
    """Whole millijoules for a period's float parts: each rounded down (and
    never below 0), ``other`` the rest, so that everything adds up to
    ``total`` exactly."""
    out = {k: max(0, int(v)) for k, v in parts.items()}
    given = sum(out.values())
    if given > total:                 # only float noise can do this: take it back from the largest
        for k in sorted(out, key=out.get, reverse=True):
            cut = min(out[k], given - total)
            out[k] -= cut
            given -= cut
            if given == total:
                break
    return out, total - given
