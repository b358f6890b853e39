"""The usage history on disk (bk.store.usage): append, torn-line recovery,
seals and their verification, roll-up (with its crash states), retention,
and queries equal to a brute-force sum over the raw records."""

from __future__ import annotations

import json
import os
import random
import stat

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bk.core import usage
from bk.core.usage import DAY, MinuteRecord, Use
from bk.store import usage as su
from bk.store.usage import UsageStore

T0 = 1_800_000_000 - 1_800_000_000 % DAY        # a UTC midnight
UIDS = (1000, 2000, 3000)


def rec(t, gpu, uses=(), util=None, mem=None):
    return MinuteRecord(t, gpu, 60, 30, 60, util, 30 if util is not None else 0, mem, 0, tuple(uses))


def world(seed: int, days: int = 3, gpus: int = 2, step: int = 60 * 7) -> list[MinuteRecord]:
    """Random minute records over ``days`` days (one every ``step`` seconds
    per GPU), with bookings and unreserved use."""
    rng = random.Random(seed)
    out = []
    for t in range(T0, T0 + days * DAY, step):
        for g in range(gpus):
            uses = []
            if rng.random() < 0.7:
                uid = rng.choice(UIDS)
                booked = 60
                active = rng.choice((0, 20, 60))
                sm_n = rng.randrange(0, 30) if active else 0
                uses.append(Use(uid, f"r{uid}-{(t - T0) // 7200}", "shared", booked, active, 0,
                                rng.randrange(0, 100) * 1.0 if sm_n else None, sm_n,
                                rng.randrange(1, 9000) if active else None))
            if rng.random() < 0.2:
                uses.append(Use(rng.choice(UIDS), None, None, 0, 0, rng.randrange(2, 61),
                                rng.randrange(0, 100) * 1.0, 1, rng.randrange(1, 500)))
            out.append(rec(t - t % 60, g, uses, rng.randrange(0, 101) * 1.0, rng.randrange(0, 80000)))
    return out


@pytest.fixture
def store(tmp_path):
    return UsageStore(str(tmp_path / "usage"), raw_days=14, retention_days=400)


def raw_path(store, t, kind="raw", ext="jsonl"):
    return os.path.join(store.dir, kind, f"{su.day_name(t)}.{ext}")


def norm(doc):
    """Seal totals and fresh sums compared exactly, but floats to 6 places
    (a sum of products in another order differs in the last bit)."""
    if isinstance(doc, dict):
        return {k: norm(v) for k, v in doc.items()}
    if isinstance(doc, float):
        return round(doc, 6)
    return doc


# ------------------------------------------------------------ append and read

def test_append_and_read_back_private_modes(store):
    rs = [rec(T0, 0, [Use(1000, "r1", "shared", 60, 30)]), rec(T0 + 60, 1, [Use(2000, None, None, 0, 0, 60)])]
    assert store.append(rs, now=T0 + 120) == 2
    assert store.records() == rs
    assert stat.S_IMODE(os.stat(store.dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(raw_path(store, T0)).st_mode) == 0o600
    assert store.booking_usage("r1") == (60, 30)
    assert store.span() == (T0, T0 + DAY)


def test_shared_mode_files_are_world_readable_and_hold_only_numbers_and_ids(tmp_path):
    s = UsageStore(str(tmp_path / "usage"), private=False)
    s.append([rec(T0, 0, [Use(1000, "r1", "exclusive", 60, 60, 0, 50.0, 30, 4000)], 40.0, 4100)], now=T0 + 60)
    assert stat.S_IMODE(os.stat(s.dir).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(raw_path(s, T0)).st_mode) == 0o644
    line = json.loads(open(raw_path(s, T0)).read())
    strings = {v for v in line.values() if isinstance(v, str)} | \
        {v for u in line["uses"] for v in u.values() if isinstance(v, str)}
    assert strings == {"r1", "exclusive"}       # a booking id and its mode, never a command or a name


def test_a_reader_creates_nothing(tmp_path):
    s = UsageStore(str(tmp_path / "none"))
    assert s.records() == [] and s.summary().records == 0 and s.span() is None and s.verify() == []
    assert not os.path.exists(s.dir)


def test_records_filter_by_gpu_uid_and_period(store):
    rs = world(1, days=1)
    store.append(rs, now=T0 + 3600)
    got = store.records(T0 + 3600, T0 + 7200, gpus=[1], uid=2000)
    want = [r for r in rs if T0 + 3600 <= r.t < T0 + 7200 and r.gpu == 1 and any(u.uid == 2000 for u in r.uses)]
    assert got == want and got


# ------------------------------------------------------------ torn lines

def test_torn_final_line_is_ignored_then_cut_before_the_next_append(store):
    store.append([rec(T0, 0)], now=T0 + 60)
    path = raw_path(store, T0)
    with open(path, "ab") as f:
        f.write(b'{"t":%d,"gpu":0,"v":1,"peri' % (T0 + 60))          # a crash mid-write
    assert store.records() == [rec(T0, 0)]
    assert any("incomplete" in p for p in store.problems)
    store.append([rec(T0 + 120, 0)], now=T0 + 180)
    data = open(path, "rb").read()
    assert data.endswith(b"\n") and data.count(b"\n") == 2
    assert [r.t for r in store.records()] == [T0, T0 + 120]


def test_a_garbage_line_is_skipped_not_fatal(store):
    store.append([rec(T0, 0), rec(T0 + 60, 0)], now=T0 + 120)
    path = raw_path(store, T0)
    lines = open(path, "rb").read().split(b"\n")
    lines.insert(1, b"not json at all")
    open(path, "wb").write(b"\n".join(lines))
    assert [r.t for r in store.records()] == [T0, T0 + 60]
    assert any("not valid JSON" in p for p in store.problems)


# ------------------------------------------------------------ seals

def test_a_day_is_sealed_after_it_ends_and_verifies(store):
    rs = world(2, days=2)
    store.append(rs, now=T0 + DAY + su.SEAL_GRACE - 1)
    assert not os.path.exists(raw_path(store, T0, ext="seal"))
    store.maintain(T0 + DAY + su.SEAL_GRACE)
    seal = json.loads(open(raw_path(store, T0, ext="seal")).read())
    day0 = [r for r in rs if r.t < T0 + DAY]
    assert seal["records"] == len(day0) and seal["bytes"] == os.path.getsize(raw_path(store, T0))
    assert norm(seal["summary"]) == norm(usage.summarise(day0).to_store())
    checks = {(c.kind, c.day): c.state for c in store.verify()}
    assert checks == {("raw", su.day_name(T0)): "ok", ("raw", su.day_name(T0 + DAY)): "unsealed"}


def test_appends_seal_on_schedule_without_being_told(store):
    for r in world(3, days=2, step=3600):
        store.append([r])                              # now = the record's end, as the monitor does
    assert os.path.exists(raw_path(store, T0, ext="seal"))


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend", "drop-line"])
def test_verify_detects_tampering(store, damage):
    rs = world(4, days=1)
    store.append(rs, now=T0 + DAY + su.SEAL_GRACE)
    path = raw_path(store, T0)
    data = bytearray(open(path, "rb").read())
    if damage == "flip":
        i = data.index(b'"booked_s":60') + len('"booked_s":')
        data[i:i + 2] = b"99"
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "extend":
        data += data[: data.index(b"\n") + 1]
    else:
        data = data[data.index(b"\n") + 1:]
    open(path, "wb").write(bytes(data))
    (check,) = store.verify()
    assert check.state == "tampered", check.to_json()


def test_a_late_record_for_a_sealed_day_reseals_it(store):
    store.append([rec(T0, 0)], now=T0 + DAY + su.SEAL_GRACE)
    store.append([rec(T0 + 600, 1, [Use(1000, "late", "shared", 60, 60)])], now=T0 + DAY + 400)
    (check,) = store.verify()
    assert (check.state, check.records) == ("ok", 2)
    assert store.booking_usage("late") == (60, 60)


def test_a_late_record_does_not_hide_tampering(store):
    store.append([rec(T0, 0)], now=T0 + DAY + su.SEAL_GRACE)
    with open(raw_path(store, T0), "ab") as f:
        f.write(json.dumps(rec(T0 + 60, 0).to_dict(), separators=(",", ":")).encode() + b"\n")
    store.append([rec(T0 + 120, 0)], now=T0 + DAY + 400)
    (check,) = store.verify()
    assert check.state == "tampered"
    assert any("no longer matches its seal" in p for p in store.problems)


# ------------------------------------------------------------ roll-up

@pytest.mark.slow
def test_old_days_roll_up_into_sealed_hourly_partitions(store):
    rs = world(5, days=3)
    store.append(rs, now=T0 + 3 * DAY)
    raw_sum = norm(store.summary().to_store())
    store.raw_days = 1
    done = store.maintain(T0 + 3 * DAY + su.SEAL_GRACE)
    assert done["rolled_up"] == [su.day_name(T0), su.day_name(T0 + DAY)]
    assert not os.path.exists(raw_path(store, T0)) and not os.path.exists(raw_path(store, T0, ext="seal"))
    hourly = store.records(T0, T0 + DAY)
    assert {r.period_s for r in hourly} == {3600} and len(hourly) == 24 * 2
    assert hourly == usage.rollup([r for r in rs if r.t < T0 + DAY])
    assert {c.state for c in store.verify()} == {"ok"}
    # Sums and peaks survive the roll-up exactly; first/last coarsen to the
    # hour, and each hour's SM mean is kept to 0.1 %.
    after = norm(store.summary().to_store())
    assert strip(after) == strip(raw_sum)
    for part in ("by_uid", "by_gpu", "by_reservation"):
        for k, t in raw_sum[part].items():
            assert abs(after[part][k]["sm_sum"] - t["sm_sum"]) <= 0.05 * t["sm_n"] + 1e-6


def strip(doc):
    if isinstance(doc, dict):
        return {k: strip(v) for k, v in doc.items() if k not in ("first", "last", "records", "sm_sum")}
    return doc


def test_roll_up_crash_states(store):
    rs = world(6, days=2)
    store.append(rs, now=T0 + 2 * DAY + su.SEAL_GRACE)
    want = store.records(T0, T0 + DAY)
    # (1) written, (2) not: an hourly file without a seal is ignored.
    os.makedirs(os.path.join(store.dir, "hourly"), exist_ok=True)
    open(raw_path(store, T0, "hourly"), "wb").write(b'{"t":1,"gpu":0}\n{"t":')
    assert store.records(T0, T0 + DAY) == want
    store.raw_days = 1
    store.maintain(T0 + 2 * DAY + su.SEAL_GRACE)
    assert store.records(T0, T0 + DAY) == usage.rollup(want)
    assert {c.state for c in store.verify() if c.day == su.day_name(T0)} == {"ok"}


def test_a_crash_before_the_raw_day_is_deleted_reads_the_roll_up_once(store):
    rs = world(7, days=2)
    store.append(rs, now=T0 + 2 * DAY + su.SEAL_GRACE)
    raw = open(raw_path(store, T0), "rb").read()
    seal = open(raw_path(store, T0, ext="seal"), "rb").read()
    store.raw_days = 1
    store.maintain(T0 + 2 * DAY + su.SEAL_GRACE)
    open(raw_path(store, T0), "wb").write(raw)                     # step 3 undone
    open(raw_path(store, T0, ext="seal"), "wb").write(seal)
    day0 = store.summary(T0, T0 + DAY)
    assert day0.records == 2 * 24                                  # the roll-up, not both
    store.maintain(T0 + 2 * DAY + su.SEAL_GRACE)
    assert not os.path.exists(raw_path(store, T0))


def test_a_tampered_raw_day_is_kept_not_rolled_up(store):
    store.append(world(8, days=1), now=T0 + DAY + su.SEAL_GRACE)
    with open(raw_path(store, T0), "r+b") as f:
        f.write(b"[")
    store.raw_days = 1
    done = store.maintain(T0 + 3 * DAY)
    assert done["kept_unverified"] == [su.day_name(T0)] and os.path.exists(raw_path(store, T0))


# ------------------------------------------------------------ retention

def test_retention_drops_whole_old_partitions(store):
    store.append(world(9, days=4, step=3600), now=T0 + 4 * DAY)
    store.raw_days, store.retention_days = 1, 2
    done = store.maintain(T0 + 4 * DAY + su.SEAL_GRACE)
    assert sorted(done["dropped"]) == [f"raw/{su.day_name(T0)}", f"raw/{su.day_name(T0 + DAY)}"]
    assert store.span() == (T0 + 2 * DAY, T0 + 4 * DAY)
    assert not os.path.exists(raw_path(store, T0, ext="seal"))
    store.retention_days = 1
    done = store.maintain(T0 + 5 * DAY)
    assert sorted(done["dropped"]) == [f"hourly/{su.day_name(T0 + 2 * DAY)}",
                                       f"raw/{su.day_name(T0 + 3 * DAY)}"]


# ------------------------------------------------------------ queries = brute force

def brute(records, since, until):
    """The oracle: sum every raw record in [since, until) field by field."""
    by_uid, by_gpu, by_res = {}, {}, {}
    for r in records:
        if not since <= r.t < until:
            continue
        g = by_gpu.setdefault(r.gpu, [0, 0, 0, 0.0, 0, None])
        for u in r.uses:
            for key, table in ((u.uid, by_uid), (u.reservation, by_res)):
                if key is None:
                    continue
                t = table.setdefault(key, [0, 0, 0, 0.0, 0, None])
                t[0] += u.booked_s
                t[1] += u.active_s
                t[2] += u.unreserved_s
                t[3] += (u.sm_avg or 0) * u.sm_n
                t[4] += u.sm_n
                if u.mem_peak_mib is not None:
                    t[5] = u.mem_peak_mib if t[5] is None else max(t[5], u.mem_peak_mib)
            g[0] += u.booked_s
            g[1] += u.active_s
            g[2] += u.unreserved_s
        if r.util_n:
            g[3] += r.util_avg * r.util_n
            g[4] += r.util_n
        if r.mem_peak_mib is not None:
            g[5] = r.mem_peak_mib if g[5] is None else max(g[5], r.mem_peak_mib)
    return by_uid, by_gpu, by_res


def as_lists(summary_part):
    return {k: [t.booked_s, t.active_s, t.unreserved_s, round(t.sm_sum, 6), t.sm_n, t.mem_peak_mib]
            for k, t in summary_part.items()}


def rounded(table):
    return {k: [v[0], v[1], v[2], round(v[3], 6), v[4], v[5]] for k, v in table.items()}


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    rs = world(11, days=4, gpus=3, step=60 * 3)
    s = UsageStore(str(tmp_path_factory.mktemp("hist") / "usage"))
    s.append(rs, now=T0 + 4 * DAY)              # days 0-2 sealed, day 3 raw and open
    return s, rs


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=st.integers(0, 4 * DAY), b=st.integers(0, 4 * DAY))
def test_queries_equal_a_brute_force_sum(history, a, b):
    s, rs = history
    since, until = T0 + min(a, b), T0 + max(a, b) + 1
    got = s.summary(since, until)
    by_uid, by_gpu, by_res = brute(rs, since, until)
    assert as_lists(got.by_uid) == rounded(by_uid), f"since={since} until={until}"
    assert as_lists(got.by_reservation) == rounded(by_res)
    assert as_lists(got.by_gpu) == rounded(by_gpu)


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(k=st.integers(0, 4 * 12 - 1))
def test_booking_usage_equals_brute_force(history, k):
    s, rs = history
    uid = UIDS[k % 3]
    rid = f"r{uid}-{k // 3}"
    booked = sum(u.booked_s for r in rs for u in r.uses if u.reservation == rid)
    active = sum(u.active_s for r in rs for u in r.uses if u.reservation == rid)
    assert s.booking_usage(rid) == (booked, active)
    assert s.booking_usage(rid, start=T0 + (k // 3) * 7200, end=T0 + (k // 3 + 1) * 7200) == (booked, active)


@pytest.mark.slow
def test_seal_totals_are_used_for_whole_days(history, monkeypatch):
    s, rs = history
    read = []
    real = su.parse_dicts

    def spy(data, path, *a, **kw):
        read.append(os.path.basename(path))
        return real(data, path, *a, **kw)

    monkeypatch.setattr(su, "parse_dicts", spy)
    s.summary(T0, T0 + 4 * DAY)
    assert read == [f"{su.day_name(T0 + 3 * DAY)}.jsonl"]       # only the day without a seal
