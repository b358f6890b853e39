"""A fixed world for the TUI tests: a clock, a ledger and live GPUs that
never change, so a frame of ``bk t`` can be compared as text."""

from __future__ import annotations

from datetime import timezone

from bk.core.models import Blackout, GpuInfo, GpuProcess, Notice, Policy, Reservation, parse_iso
from bk.core.telemetry import Snapshot
from bk.service.status import gpu_rows
from bk.tui.world import World

NOW = parse_iso("2026-07-13T10:41:30Z")
ME, BOB, CAROL = 1000, 2000, 3000


def res(n: int, uid: int, user: str, gpus, a_min: int, b_min: int, mode: str = "shared", share: int = 1,
        mem: int | None = None, note: str | None = None, prefix: str = "") -> Reservation:
    """A booking from ``a_min`` to ``b_min`` minutes after 10:40 (the slice of NOW)."""
    base = NOW - NOW % 300
    rid = prefix + f"{n:08x}"[len(prefix):] + f"-1111-4222-8333-{n:012x}"
    return Reservation(id=rid, uid=uid, user=user, mode=mode, gpus=tuple(gpus), share=share,
                       start=base + a_min * 60, end=base + b_min * 60, created=NOW - 5000 + n, mem_mib=mem,
                       note=note)


RESERVATIONS = (
    res(1, ME, "ada", [0], -40, 50, note="warm-up run"),
    res(2, BOB, "bob", [1], 0, 120, mode="exclusive"),
    res(3, BOB, "bob", [0], 20, 80, share=1, mem=12288),
    res(4, ME, "ada", [2, 3], 200, 260, mem=20480, prefix="4a"),
    res(5, CAROL, "carol", [2], -300, -200, prefix="4a"),          # past: read-only
    res(6, CAROL, "carol\x1b[2J", [3], 30, 90, share=2, note="evil\u202enote"),
)
BLACKOUTS = (Blackout("b1", NOW - NOW % 3600 + 11 * 3600, NOW - NOW % 3600 + 12 * 3600, "maintenance"),)
NOTICES = (Notice("n1", NOW - 60, "GPU 3 is retired on Friday", "warning"),
           Notice("n2", NOW - 600, "welcome", "info"))
POLICY = Policy(gpu_count=4, disabled_gpus=frozenset({3}))


def snapshot() -> Snapshot:
    gpus = (
        GpuInfo(0, "GPU-0", "NVIDIA H100 80GB HBM3", 81559, 4096, 37, 51,
                [GpuProcess(4242, 4000, 30, ME, "ada", "python")]),
        GpuInfo(1, "GPU-1", "NVIDIA H100 80GB HBM3", 81559, 60000, 98, 70,
                [GpuProcess(5151, 59000, 95, BOB, "bob", "train.py")]),
        GpuInfo(2, "GPU-2", "NVIDIA H100 80GB HBM3", 81559, 0, 0, 30, []),
        GpuInfo(3, "GPU-3", "NVIDIA H100 80GB HBM3", 81559, None, None, None, None),
    )
    return Snapshot(NOW, "sim-file", gpus, (), True)


def world(*, live: bool = True, notices=NOTICES, reservations=RESERVATIONS, policy=POLICY, **kw) -> World:
    from bk.core.models import LedgerState

    rows = ()
    line = "live: unknown (no monitor)"
    if live:
        snap = snapshot()
        rows = tuple(gpu_rows(LedgerState(reservations=list(reservations), blackouts=list(BLACKOUTS)), snap,
                              policy, NOW))
        line = snap.describe()
    args = dict(now=NOW, tz=timezone.utc, policy=policy, actor_uid=ME, actor_user="ada",
                reservations=tuple(reservations), blackouts=BLACKOUTS, notices=tuple(notices), gpus=rows,
                live=line, monitor={"state": "running"}, worker={"state": "absent"}, seq=1)
    args.update(kw)
    return World(**args)
