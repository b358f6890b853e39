"""Worlds for the export tests: ledger records made by hand and assembled by
the service's own ``assemble`` (the function the ``export`` row and the
monitor both call), so a test renders what bk would render."""

from __future__ import annotations

import uuid

from bk.core.models import Blackout, Edit, GpuInfo, GpuProcess, Notice, Policy, Reservation
from bk.core.usage import Summary, Totals
from bk.service.exports import assemble
from bk.store.snapshot import Heartbeat

H = 3600


def rid(n: int) -> str:
    return str(uuid.UUID(int=0x5EED0000_0000_4000_8000_000000000000 + n))


def booking(n: int, *, uid: int = 1000, user: str = "ada", mode: str = "shared", gpus=(0,), share: int = 1,
            start: int, end: int, created: int | None = None, note: str | None = None, edits: int = 0,
            cancelled_at: int | None = None) -> Reservation:
    created = start - H if created is None else created
    ed = [Edit(created + 60 * (i + 1), uid, user, {"end": "x"}, {"end": "y"}) for i in range(edits)]
    return Reservation(rid(n), uid, user, mode, tuple(gpus), share, start, end, created, note=note, edits=ed,
                       cancelled_at=cancelled_at, cancelled_by=uid if cancelled_at is not None else None)


def gpus(n: int = 2, *, processes=None) -> tuple[GpuInfo, ...]:
    out = []
    for i in range(n):
        procs = (processes or {}).get(i, [])
        out.append(GpuInfo(i, f"GPU-5133d000-0000-4000-8000-00000000000{i}", "NVIDIA H100 80GB HBM3",
                           mem_total_mib=81559, mem_used_mib=sum(p.mem_mib or 0 for p in procs), util=40 if procs else 0,
                           processes=list(procs), power_mw=300000 if procs else 70000))
    return tuple(out)


def world(now: int, *, reservations=(), blackouts=(), notices=(), n_gpus: int = 2, processes=None,
          activity=None, summary=None, since=None, host="gpu-a", heartbeat=None, capacity: int = 2):
    from bk.core.telemetry import Snapshot, attribute_all

    policy = Policy(gpu_count=n_gpus, max_shared_users=capacity)
    g = gpus(n_gpus, processes=processes)
    snap = Snapshot(now, "sim-file", g)
    return assemble(now=now, host=host, policy=policy, reservations=list(reservations), blackouts=list(blackouts),
                    notices=list(notices), gpus=g, live_at=now, live_source="sim-file",
                    attributions=attribute_all(snap, list(reservations), now), activity=activity,
                    heartbeat=heartbeat or Heartbeat("running", 4242, now - 1, now - 3600, 2.0, None, 1, 1800),
                    summary=summary, since=since,
                    user_of={1009: "mallory"}.get)


def rich(now: int, *, hostile: str = 'eve "\\evil"\nnext'):
    """Shared and exclusive bookings, running and ahead, a hostile user
    name, an unreserved process, activity judgements, today's usage,
    a maintenance window ahead and an announcement."""
    rs = [booking(1, start=now - H, end=now + H, note="training; run 3, part \\ 2"),
          booking(2, uid=1001, user="bob", start=now - 2 * H, end=now + 2 * H, gpus=(0,), edits=2),
          booking(3, uid=1002, user=hostile, mode="exclusive", gpus=(1,), share=2, start=now - H, end=now + 3 * H),
          booking(4, uid=1003, user="李雷", start=now + 5 * H, end=now + 6 * H, gpus=(0, 1)),
          booking(5, start=now + 7 * H, end=now + 8 * H, cancelled_at=now - 600)]
    procs = {0: [GpuProcess(4242, mem_mib=8000, sm=60, uid=1000, user="ada"),
                 GpuProcess(4343, mem_mib=4000, sm=10, uid=1009, user="mallory")]}
    activity = {"v": 1, "interval_s": 2.0, "bookings": [
        {"reservation": rid(1), "uid": 1000, "gpus": [0], "state": "active", "idle_s": 0},
        {"reservation": rid(2), "uid": 1001, "gpus": [0], "state": "idle-held", "idle_s": 2110},
        {"reservation": rid(3), "uid": 1002, "gpus": [1], "state": "empty", "idle_s": 600}]}
    s = Summary()
    s.by_gpu = {0: Totals(7200, 3600, 600, energy_mj=3_600_000_500), 1: Totals(3600, 0, 0, energy_mj=900_000)}
    s.by_uid = {1000: Totals(3600, 3600, 0, energy_mj=2_000_000_000), 1009: Totals(0, 0, 600, energy_mj=1500)}
    s.by_reservation = {rid(1): Totals(3600, 3600, 0, energy_mj=2_000_000_000)}
    notices = [Notice("n" * 8 + rid(9)[8:], now - 600, "driver update tonight <b>&</b>", "warning")]
    blackouts = [Blackout("b" * 8 + rid(8)[8:], now + 10 * H, now + 12 * H, "driver update")]
    return world(now, reservations=rs, blackouts=blackouts, notices=notices, processes=procs, activity=activity,
                 summary=s)
