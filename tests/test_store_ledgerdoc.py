"""The ledger document: time codec, record codec, validation."""

from __future__ import annotations

import json
import os
import random
from datetime import datetime, timezone

import pytest

from bk.core import ledgercheck as C
from bk.core import ledgerdoc as L
from bk.core import utctime as U
from bk.core.models import (
    Advance,
    Blackout,
    Edit,
    Job,
    LedgerState,
    Notice,
    OpRecord,
    Policy,
    Reservation,
)

SEED = int(os.environ.get("BK_TEST_SEED", "7"))
T = 1_780_000_000


def res(rid="r1", gpus=(0,), start=T, end=T + 3600, mode="shared", share=1, **kw):
    return Reservation(rid, 1000, "ada", mode, tuple(gpus), share, start, end, T - 60, **kw)


def state(*rs, policy=None, **kw):
    return LedgerState(seq=3, policy=policy or Policy(gpu_count=4).bound(), reservations=list(rs),
                       **kw)


# --- time -------------------------------------------------------------------

def test_format_and_parse_agree_with_datetime():
    rng = random.Random(SEED)
    for t in [0, -1, 951782400, 4107542399, 253402300799] + [rng.randrange(-2 * 10**9, 10**10)
                                                              for _ in range(3000)]:
        want = datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        assert U.format_utc(t) == want, (SEED, t)
        U._parsed.clear()
        assert U.parse_utc(want) == t, (SEED, want)


@pytest.mark.parametrize("text", [
    "2026-02-29T00:00:00Z", "2026-13-01T00:00:00Z", "2026-04-31T00:00:00Z",
    "2026-01-01T24:00:00Z", "2026-01-01T00:60:00Z", "2026-01-01T00:00:60Z",
    "2026-01-01T0+:00:00Z", "2026-01-01 00:00:00", "2026-01-01T00:00:00",
    "\uff12026-01-01T00:00:00Z", "", "garbage",
])
def test_parse_rejects(text):
    with pytest.raises(ValueError):
        U.parse_utc(text)


def test_parse_accepts_offsets_and_rejects_non_strings():
    assert U.parse_utc("2026-07-13T20:00:00+02:00") == U.parse_utc("2026-07-13T18:00:00Z")
    assert U.parse_utc("2024-02-29T12:00:00Z") == U.days_from_civil(2024, 2, 29) * 86400 + 43200
    for bad in (5, None, ["2026-01-01T00:00:00Z"]):
        with pytest.raises(ValueError):
            U.parse_utc(bad)
    with pytest.raises(ValueError):
        U.format_utc(1.5)


# --- records ------------------------------------------------------------------

def random_reservation(rng: random.Random, i: int) -> Reservation:
    start = T + rng.randrange(0, 10**6) // 300 * 300
    r = res(f"id-{i}", gpus=rng.sample(range(8), rng.randint(1, 3)), start=start,
            end=start + 300 * rng.randint(1, 50), mode=rng.choice(("shared", "exclusive")),
            share=rng.randint(1, 2), mem_mib=rng.choice((None, 4096)),
            op_id=rng.choice((None, f"op{i}")), note=rng.choice((None, "n\u00e9 \"x\"\n")))
    if rng.random() < 0.3:
        r = r.replace(cancelled_at=start - 60, cancelled_by=0, cancel_reason="maintenance")
    if rng.random() < 0.3:
        r = r.replace(edits=[Edit(start - 30, 1000, "ada", {"end": U.format_utc(r.end - 300)},
                                  {"end": U.format_utc(r.end)})])
    if rng.random() < 0.3:
        r = r.replace(job=Job("pending", "train.py"))
    if rng.random() < 0.3:
        r = r.replace(advance=Advance(start - 600, start - 300, rng.random() < 0.5,
                                      tuple(rng.sample(range(8), rng.randint(0, 2)))))
    if rng.random() < 0.3:
        r = r.replace(shared_with=tuple(sorted(rng.sample(["@nlp", "bob", "carol"], rng.randint(1, 3)))))
    if rng.random() < 0.3:
        r = r.replace(extra={"zz_future": [1, {"a": None}], "aa_other": "x"})
    return r


DEFAULTS = {"mem_mib": None, "op_id": None, "note": None, "cancelled_at": None,
            "cancelled_by": None, "cancel_reason": None, "edits": [], "job": None, "advance": None,
            "shared_with": []}


def test_reservation_codec_matches_models():
    rng = random.Random(SEED)
    for i in range(300):
        r = random_reservation(rng, i)
        d = L.reservation_to_dict(r)
        assert dict(DEFAULTS, **d) == r.to_dict(), SEED
        assert list(d) == sorted(d) and not set(DEFAULTS) & {k for k, v in d.items() if v in (None, [])}
        assert L.reservation_from_dict(d) == Reservation.from_dict(d) == r, SEED
        assert L.reservation_from_dict(json.loads(json.dumps(d))) == r


def full_state() -> LedgerState:
    rng = random.Random(SEED)
    st = LedgerState(seq=12, policy=Policy(gpu_count=8).bound(),
                     reservations=[random_reservation(rng, i) for i in range(5)],
                     blackouts=[Blackout("b1", T, T + 600, "maintenance", 0, {"future": 1})],
                     notices=[Notice("n1", T, "hello", extra={"future": True})],
                     ops=[OpRecord("op1", 1000, "create", "abc", "id-1", T)],
                     extra={"future_top": {"x": [1, 2]}})
    # keep the random state valid: no overlaps at all
    st.reservations = [r.replace(gpus=(int(r.id[3:]),), start=T + int(r.id[3:]) * 10**5,
                                 end=T + int(r.id[3:]) * 10**5 + 600) for r in st.reservations]
    return st


def test_document_round_trip_keeps_unknown_fields():
    st = full_state()
    doc = json.loads(L.dumps(L.encode(st, commit="c0ffee", written_at=T, journal=[{"seq": 12}])))
    back, meta, problems = L.decode(doc)
    assert problems == [] and back == st
    assert (meta.seq, meta.commit, meta.written_at, meta.journal_seq) == (12, "c0ffee", T, 12)
    assert meta.journal == [{"seq": 12}]
    assert C.check_state(back) == []


def test_dumps_is_canonical():
    a, b = full_state(), full_state()
    a.extra, b.extra = {"x": 1, "y": {"b": 1, "a": 2}}, {"y": {"a": 2, "b": 1}, "x": 1}
    a.reservations[0] = a.reservations[0].replace(extra={"p": 1, "q": 2})
    b.reservations[0] = b.reservations[0].replace(extra={"q": 2, "p": 1})
    enc = [L.dumps(L.encode(s, commit="c", written_at=T, journal=[])) for s in (a, b)]
    assert enc[0] == enc[1] and enc[0].endswith(b"\n") and enc[0].isascii()


@pytest.mark.parametrize("mutate, expect", [
    (lambda d: d.update(format="other"), "format is 'other'"),
    (lambda d: d.pop("version"), "version is None"),
    (lambda d: d.update(version=2), "newer than this bk"),
    (lambda d: d.update(seq="3"), "seq is '3'"),
    (lambda d: d.update(reservations={}), "reservations: expected a list"),
    (lambda d: d["reservations"][0].pop("start"), "missing field 'start'"),
    (lambda d: d["reservations"][0].update(end="tomorrow"), "reservations[0]"),
    (lambda d: d["reservations"].append(7), "expected an object"),
    (lambda d: d.update(journal={"seq": 1}), "journal"),
    (lambda d: d.update(policy=[1]), "policy: expected an object"),
])
def test_decode_reports_problems(mutate, expect):
    doc = L.encode(state(res()), commit="c", written_at=T, journal=[])
    doc = json.loads(json.dumps(doc))
    mutate(doc)
    problems = C.validate(doc)
    assert problems and any(expect in p for p in problems), problems
    if expect == "newer than this bk":
        assert L.decode(doc)[1].newer


def test_loads_rejects_non_objects_and_constants():
    for data in (b"[]", b'{"a": NaN}', b"\xff\xfe", b'{"a": 1', b""):
        with pytest.raises(ValueError):
            L.loads(data)


# --- validation -----------------------------------------------------------------

@pytest.mark.parametrize("rs, expect", [
    ([res(end=T)], "end is not after start"),
    ([res(), res()], "duplicate id"),
    ([res(mode="both")], "mode 'both'"),
    ([res(gpus=(4,))], "gpu 4 does not exist"),
    ([res(gpus=(1, 1))], "distinct"),
    ([res(gpus=())], "distinct"),
    ([res(share=3)], "exceeds max_shared_users 2"),
    ([res(share=0)], "share 0"),
    ([res(mem_mib=-1)], "mem_mib -1"),
    ([res(note=5)], "must be strings or null"),
    ([res("a"), res("b"), res("c")], "more than 2 share slots"),
    ([res("a", mode="exclusive", share=2), res("b", start=T + 3599, end=T + 7200)],
     "more than 2 share slots"),
    ([res("a", mode="exclusive", share=2), res("b", mode="exclusive", share=2, gpus=(0, 1))],
     "gpu 0"),
])
def test_check_state_finds(rs, expect):
    problems = C.check_state(state(*rs))
    assert any(expect in p for p in problems), problems


def test_check_state_accepts_touching_and_cancelled():
    ok = state(res("a", mode="exclusive", share=2), res("b", mode="exclusive", share=2,
                                                         start=T + 3600, end=T + 7200),
               res("c", start=T + 7200, end=T + 9000, share=2),
               res("d", mode="exclusive", share=2, cancelled_at=T - 10))
    assert C.check_state(ok) == []


def test_check_state_types_of_apply_output():
    bad = res()
    bad = bad.replace(uid=True, start="x")
    problems = C.check_state(state(bad))
    assert any("uid True" in p for p in problems) and any("integer times" in p for p in problems)


def test_check_state_other_records_and_unbound_capacity():
    st = LedgerState(reservations=[res("a"), res("b"), res("c")])
    assert C.check_state(st) == []                       # no policy: no share limit
    assert C.check_state(st, capacity=2)                 # unless the store knows one
    st = LedgerState(blackouts=[Blackout("b", T, T, "x")], notices=[Notice("n", T, "t", level="loud")],
                     ops=[OpRecord("o", 1, "create", "d", "r", T), OpRecord("o", 1, "book", "d", "r", T)])
    text = " | ".join(C.check_state(st))
    for want in ("blackouts[0]", "level 'loud'", "unique per uid", "action 'book'"):
        assert want in text


def brute_force_ok(rs, cap):
    for g in range(4):
        mine = [r for r in rs if g in r.gpus and r.cancelled_at is None]
        for t in {r.start for r in mine}:
            here = [r for r in mine if r.start <= t < r.end]
            if any(r.mode == "exclusive" for r in here) and len(here) > 1:
                return False
            if sum(r.share for r in here if r.mode == "shared") > cap:
                return False
    return True


def test_capacity_sweep_matches_brute_force():
    rng = random.Random(SEED)
    agree = {True: 0, False: 0}
    for trial in range(400):
        rs = []
        for i in range(rng.randint(1, 7)):
            start = T + rng.randrange(0, 20) * 300
            mode = rng.choice(("shared", "shared", "exclusive"))
            rs.append(res(f"{trial}-{i}", gpus=rng.sample(range(4), rng.randint(1, 2)), start=start,
                          end=start + rng.randint(1, 6) * 300, mode=mode,
                          share=2 if mode == "exclusive" else rng.randint(1, 2),
                          cancelled_at=T if rng.random() < 0.15 else None))
        want = brute_force_ok(rs, 2)
        assert (C.check_state(state(*rs)) == []) == want, (SEED, trial)
        agree[want] += 1
    assert min(agree.values()) > 50


def test_problem_list_is_bounded():
    st = state(*[res(f"r{i}", end=T) for i in range(100)])
    problems = C.check_state(st)
    assert len(problems) == L.MAX_PROBLEMS + 1 and "more problems" in problems[-1]
