"""Usage history: is a stored record or a day's seal one bk wrote?

Every reader of the history (``bk u``, the monitor's roll-ups, the seal
check of ``bk u verify``) asks this of every line before counting it: a
line whose type or value is out of range (a utilisation of 10^9 %, a booked
time of 10^14 s) is skipped and named, never summed.  The records
themselves and their sums are ``bk.core.usage``.
"""

from __future__ import annotations

from bk.core.models import MODES
from bk.core.telemetry import MAX_GPUS, MAX_MEM_MIB, MAX_UID
from bk.core.usage import DAY, RAW_PERIOD

# The range of a stored record (``record_problem``).  A sample stands for at
# most three intervals and ``bk m --interval`` at most an hour, so a period
# may count up to that much more than its own length (a late sample after a
# pause); at most 20 samples a second (the shortest interval, 0.05 s).
SAMPLE_SLACK_S = 3 * 3600
SAMPLES_PER_S = 20
MAX_ID = 128                                # reservation ids are 36 characters


def _num(v, hi: float) -> bool:
    # Not a bool, and NaN fails both comparisons (json.loads accepts NaN).
    return (type(v) is float or type(v) is int) and 0 <= v <= hi


def _show(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _fine(d: dict) -> bool:
    """``record_problem`` is None, for a record with every key (what bk
    writes): one expression, no calls, since every read of the history
    asks it of every line (benchmarks/usage.py)."""
    p, t, s, c, b = d["period_s"], d["t"], d["samples"], d["covered_s"], d["blind_s"]
    n, a, m = d["util_n"], d["util_avg"], d["mem_peak_mib"]
    if not (type(p) is int and 0 < p <= DAY and not DAY % p and type(t) is int and 0 <= t < 1 << 40
            and not t % p and type(d["gpu"]) is int and 0 <= d["gpu"] < MAX_GPUS):
        return False
    secs = p + SAMPLE_SLACK_S
    if not (type(s) is int and 0 <= s <= SAMPLES_PER_S * secs and type(c) is int and 0 <= c <= secs
            and type(b) is int and 0 <= b <= secs and type(n) is int and 0 <= n <= s
            and (a is None or ((type(a) is float or type(a) is int) and 0 <= a <= 100))
            and (m is None or (type(m) is int and 0 <= m <= MAX_MEM_MIB))
            and type(d["uses"]) is list):
        return False
    for u in d["uses"]:
        uid, r, mo, bs, ac, un = u["uid"], u["reservation"], u["mode"], u["booked_s"], u["active_s"], u["unreserved_s"]
        k, a, m = u["sm_n"], u["sm_avg"], u["mem_peak_mib"]
        if not (type(uid) is int and 0 <= uid <= MAX_UID and (r is None or (type(r) is str and 0 < len(r) <= MAX_ID))
                and (mo is None or mo in MODES) and type(bs) is int and 0 <= bs <= secs
                and type(ac) is int and 0 <= ac <= secs and type(un) is int and 0 <= un <= secs
                and type(k) is int and 0 <= k <= s
                and (a is None or ((type(a) is float or type(a) is int) and 0 <= a <= 100))
                and (m is None or (type(m) is int and 0 <= m <= MAX_MEM_MIB))):
            return False
    return True


def record_problem(d) -> str | None:
    """What makes a stored record (``MinuteRecord.to_dict``) one bk did not
    write: a type or a value out of range (a utilisation of 10^9 %, a
    booked time of 10^14 s).  None when it is a record.  Every reader of the
    history asks this of every line before counting it; a line that fails
    is skipped and named, never summed."""
    try:
        if _fine(d):
            return None
    except (KeyError, TypeError):
        pass                            # a key missing (the defaults apply), or not a dict: say which
    if not isinstance(d, dict):
        return "not an object"
    t, gpu, period = d.get("t"), d.get("gpu"), d.get("period_s", RAW_PERIOD)
    if type(period) is not int or not 0 < period <= DAY or DAY % period:
        return f"period_s {_show(period)} is out of range"
    if type(t) is not int or not 0 <= t < 1 << 40 or t % period:
        return f"t {_show(t)} is not the start of a period"
    if type(gpu) is not int or not 0 <= gpu < MAX_GPUS:
        return f"gpu {_show(gpu)} is out of range"
    secs = period + SAMPLE_SLACK_S
    samples = d.get("samples", 0)
    if type(samples) is not int or not 0 <= samples <= SAMPLES_PER_S * secs:
        return f"samples {_show(samples)} is out of range"
    problem = _readings_problem(d, ("covered_s", "blind_s"), "util", secs, samples)
    if problem:
        return problem
    uses = d.get("uses", [])
    if not isinstance(uses, list):
        return "uses is not a list"
    for u in uses:
        if not isinstance(u, dict):
            return "a use is not an object"
        uid, rid, mode = u.get("uid"), u.get("reservation"), u.get("mode")
        if type(uid) is not int or not 0 <= uid <= MAX_UID:
            return f"uid {_show(uid)} is out of range"
        if rid is not None and (not isinstance(rid, str) or not 0 < len(rid) <= MAX_ID):
            return f"reservation {_show(rid)} is not a booking id"
        if mode is not None and mode not in MODES:
            return f"mode {_show(mode)} is not a mode"
        problem = _readings_problem(u, ("booked_s", "active_s", "unreserved_s"), "sm", secs, samples)
        if problem:
            return problem
    return None


def _readings_problem(d: dict, seconds: tuple[str, ...], avg: str, secs: int, samples: int) -> str | None:
    """What is wrong with the readings a record and each of its uses share:
    the ``seconds`` counters (at most the period and its slack), the
    ``{avg}_n`` count of samples averaged (at most the record's samples),
    the ``{avg}_avg`` percentage and the memory peak."""
    for k in seconds:
        v = d.get(k, 0)
        if type(v) is not int or not 0 <= v <= secs:
            return f"{k} {_show(v)} is out of range"
    n = d.get(f"{avg}_n", 0)
    if type(n) is not int or not 0 <= n <= samples:
        return f"{avg}_n {_show(n)} is out of range"
    v = d.get(f"{avg}_avg")
    if v is not None and not _num(v, 100):
        return f"{avg}_avg {_show(v)} is out of range"
    v = d.get("mem_peak_mib")
    if v is not None and (type(v) is not int or not 0 <= v <= MAX_MEM_MIB):
        return f"mem_peak_mib {_show(v)} is out of range"
    return None


def _totals_problem(t, secs: int) -> str | None:
    if not isinstance(t, dict):
        return "totals are not an object"
    for k in ("booked_s", "active_s", "unreserved_s", "covered_s"):
        v = t.get(k, 0)
        if type(v) is not int or not 0 <= v <= secs:
            return f"{k} {_show(v)} is out of range"
    n = t.get("sm_n", 0)
    if type(n) is not int or not 0 <= n <= SAMPLES_PER_S * secs:
        return f"sm_n {_show(n)} is out of range"
    v = t.get("sm_sum", 0.0)
    if v is not None and not _num(v, 100 * n):
        return f"sm_sum {_show(v)} is out of range"
    v = t.get("mem_peak_mib")
    if v is not None and (type(v) is not int or not 0 <= v <= MAX_MEM_MIB):
        return f"mem_peak_mib {_show(v)} is out of range"
    for k in ("first", "last"):
        v = t.get(k)
        if v is not None and (type(v) is not int or not 0 <= v < 1 << 40):
            return f"{k} {_show(v)} is out of range"
    return None


def summary_problem(d) -> str | None:
    """``record_problem`` for a seal's totals of one day
    (``Summary.to_store``): no user, GPU or booking can count more than
    every GPU for the whole day.  None when they are in range."""
    if not isinstance(d, dict):
        return "not an object"
    secs = (DAY + SAMPLE_SLACK_S) * MAX_GPUS
    if type(d.get("records", 0)) is not int or d.get("records", 0) < 0:
        return "records is out of range"
    for part in ("by_uid", "by_gpu", "by_reservation"):
        got = d.get(part) or {}
        if not isinstance(got, dict):
            return f"{part} is not an object"
        for k, t in got.items():
            top = MAX_UID if part == "by_uid" else MAX_GPUS - 1
            if part != "by_reservation" and not (k.isdigit() and int(k) <= top):
                return f"{part} key {_show(k)} is out of range"
            why = _totals_problem(t, secs)
            if why is None and part == "by_reservation":
                uid, gpus = t.get("uid"), t.get("gpus", [])
                if type(uid) is not int or not 0 <= uid <= MAX_UID or not isinstance(gpus, list) or not all(
                        type(g) is int and 0 <= g < MAX_GPUS for g in gpus):
                    why = "owner or GPUs out of range"
            if why is not None:
                return f"{part}[{_show(k)}]: {why}"
    return None
