"""A hypothesis state machine drives the real service layer (real store,
real transactions, fake clock) through random books, exclusive books, edits,
cancels, clock advances and op-id retries, and checks the scheduling
invariants after every step."""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bk.core import scheduler
from bk.core.errors import BkError
from bk.core.models import EXCLUSIVE, SHARED, Blackout, Mutation
from bk.gpu.sim import FileBackend
from bk.service import open_app
from bk.service.requests import Actor, BookRequest, CancelRequest, EditRequest

SLOT = 300
T0 = 1_784_000_000 - 1_784_000_000 % SLOT      # an aligned instant in 2026
USERS = [Actor(2001, "alice"), Actor(2002, "bob"), Actor(2003, "carol")]
TMP_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None   # cheap fsync
# GPU 0..1 report memory (VRAM budget applies), GPU 2..3 do not.
SIM = {"gpus": [{"mem_total_mib": 16384, "processes": []}, {"mem_total_mib": 16384, "processes": []},
                {}, {}]}
BLACKOUT = Blackout("b1", T0 + 20 * 3600, T0 + 22 * 3600, "maintenance")
POLICY_CFG = {"slot_minutes": 5, "max_shared_users": 2, "booking_horizon_days": 2,
              "max_booking_hours": 12, "queue_search_hours": 48}


class BookingMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="bk-sm-", dir=TMP_ROOT)
        cfg = os.path.join(self.dir, "config.json")
        with open(cfg, "w") as f:
            json.dump(POLICY_CFG, f)
        sim = os.path.join(self.dir, "sim.json")
        with open(sim, "w") as f:
            json.dump(SIM, f)
        env = {"HOME": self.dir, "BK_DATA_DIR": os.path.join(self.dir, "data"),
               "BK_CONFIG_FILE": cfg}
        self.t = T0
        # Deterministic IDs: hypothesis replays a failing run and needs the
        # same choices (which depend on the ledger's order) to come out.
        ids = iter(range(1, 10**9))
        self.svc = open_app(env, backend=FileBackend(sim), clock_fn=lambda: self.t, actor=USERS[0])
        self.svc.id_source = lambda: f"{next(ids):08x}-0000-4000-8000-000000000000"
        self.svc.store.transact(self._add_blackout, policy=self.svc.policy.bound(), actor_uid=0,
                                actor="root")
        self.requests: dict[str, tuple] = {}     # op-id -> (kind, request, actor, result id)
        self.frozen: dict[str, tuple] = {}       # id -> (start, gpus) once active
        self.n = 0

    @staticmethod
    def _add_blackout(state):
        state.blackouts.append(BLACKOUT)
        return Mutation(True, [], None)

    def teardown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def _state(self):
        return self.svc.ledger()

    def _live(self, uid=None):
        return [r for r in self._state().reservations
                if r.is_live(self.t) and (uid is None or r.uid == uid)]

    def _op(self):
        self.n += 1
        return f"op-{self.n}"

    @rule(user=st.sampled_from(USERS), count=st.integers(1, 4), slices=st.integers(1, 36),
          exclusive=st.booleans(), share=st.integers(1, 2),
          mem=st.sampled_from([None, None, 4096, 9000, 20000]),
          offset=st.one_of(st.none(), st.integers(0, 60)), queue=st.booleans())
    def book(self, user, count, slices, exclusive, share, mem, offset, queue):
        start = None if offset is None else self.t - self.t % SLOT + offset * SLOT
        req = BookRequest(count=count, duration=slices * SLOT,
                          mode=EXCLUSIVE if exclusive else SHARED, share=share,
                          mem_mib=None if exclusive else mem, start=start, queue=queue,
                          op_id=self._op())
        try:
            res = self.svc.run("book", req, call=self.svc.call(user))
        except BkError as e:
            assert e.exit_code in (2, 3), e
            return
        r = res.reservation
        assert res.status in ("created", "queued")
        assert r.end - r.start == req.duration and len(r.gpus) == count
        if start is not None and not queue:
            assert r.start == start
        self.requests[req.op_id] = ("book", req, user, r.id)

    @precondition(lambda self: self._live())
    @rule(data=st.data(), slices=st.integers(1, 24), shift=st.integers(-2, 6))
    def edit(self, data, slices, shift):
        r = data.draw(st.sampled_from(sorted(self._live(), key=lambda x: x.id)))
        owner = next(u for u in USERS if u.uid == r.uid)
        if r.status(self.t) == "active":
            req = EditRequest(ref=r.id, end=r.end + shift * SLOT, op_id=self._op())
        else:
            req = EditRequest(ref=r.id, duration=slices * SLOT,
                              start=max(r.start + shift * SLOT, self.t - self.t % SLOT), op_id=self._op())
        try:
            result = self.svc.run("edit", req, call=self.svc.call(owner))
        except BkError as e:
            assert e.exit_code in (2, 3), e
            return
        if result.status == "updated":    # an unchanged edit commits nothing, not even its op-id
            self.requests[req.op_id] = ("edit", req, owner, r.id)

    @precondition(lambda self: self._live())
    @rule(data=st.data(), wrong_user=st.booleans())
    def cancel(self, data, wrong_user):
        r = data.draw(st.sampled_from(sorted(self._live(), key=lambda x: x.id)))
        owner = next(u for u in USERS if u.uid == r.uid)
        other = next(u for u in USERS if u.uid != r.uid)
        req = CancelRequest(ref=r.id, op_id=self._op())
        if wrong_user:
            before = self._state().reservations
            try:
                self.svc.run("cancel", req, call=self.svc.call(other))
            except BkError as e:
                assert e.code == "permission_denied"
            else:
                raise AssertionError("another user cancelled a booking")
            assert self._state().reservations == before
            return
        self.svc.run("cancel", req, call=self.svc.call(owner))
        self.requests[req.op_id] = ("cancel", req, owner, r.id)

    @rule(slices=st.integers(1, 40))
    def advance(self, slices):
        self.t += slices * SLOT + 7     # also land between slice boundaries

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def retry(self, data):
        op = data.draw(st.sampled_from(sorted(self.requests)))
        kind, req, actor, rid = self.requests[op]
        before = self._state()
        result = self.svc.run(kind, req, call=self.svc.call(actor))
        assert result.status == "exists" and result.reservation.id == rid
        after = self._state()
        assert after.reservations == before.reservations and after.seq == before.seq

    @invariant()
    def invariants_hold(self):
        state = self._state()
        gpu_mem = {0: 16384, 1: 16384, 2: None, 3: None}
        problems = scheduler.check_invariants(state.reservations, state.blackouts, self.svc.policy,
                                              gpu_mem)
        assert not problems, problems
        horizon = POLICY_CFG["booking_horizon_days"] * 86400
        for r in state.reservations:
            if r.cancelled_at is None:
                assert not (r.start < BLACKOUT.end and BLACKOUT.start < r.end), r
            assert r.end <= r.created + horizon + SLOT, r
            if r.mode == EXCLUSIVE:
                others = [o for o in state.reservations if o.id != r.id and o.cancelled_at is None
                          and r.cancelled_at is None and set(o.gpus) & set(r.gpus)]
                assert not any(o.start < r.end and r.start < o.end for o in others), r

    @invariant()
    def elapsed_part_never_changes(self):
        for r in self._state().reservations:
            if r.start <= self.t:
                seen = self.frozen.setdefault(r.id, (r.start, r.gpus))
                assert seen == (r.start, r.gpus), r


TestBookingMachine = BookingMachine.TestCase
TestBookingMachine.pytestmark = [pytest.mark.slow]
TestBookingMachine.settings = settings(max_examples=40, stateful_step_count=25, deadline=None,
                                       suppress_health_check=[HealthCheck.too_slow])
