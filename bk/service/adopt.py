"""``bk adopt PID | --gpu N [--until T]``: put a job that runs without a
booking under one (issue 25).

The facts that shape it:

* A PID names a process only while it runs: once it exits the kernel may
  give the number to any later process.  ``/proc/PID/stat`` field 22 is the
  process's start time in clock ticks since boot, fixed for its life; the
  pair (PID, start ticks) names one process for ever (a PID reused within
  the same tick would need the whole PID space, ``pid_max``, to wrap in
  10 ms).  The booking keeps the pairs (``extra.adopt``) and ends when
  none of them runs any more (the owner's worker checks each second:
  ``bk.service.follow.adopt_reason``), so a reused PID can neither keep a
  booking alive nor be adopted in its place.
* Whose process it is: its real UID (``/proc/PID/status``), the truth the
  attribution uses.  A root process in a container says nothing of who
  started it; attribution credits it to the one user whose booking holds
  its GPU now, and so does adopt; anything else is refused.  The caller
  must be the owner; the administrator may adopt anyone's, and the booking
  is then the owner's (the audit record names both).  The check runs where
  the booking is written (``check_adopt``, called by ``apply_book``: the
  broker on a shared server, which reads /proc itself), so a client cannot
  claim someone else's process.
* Which GPUs and how: exactly those where the driver lists a process of
  the tree (the PID and its descendants; ``--gpu N``: the caller's
  processes on GPU N).  Exclusive when the tree holds more than one share's
  part of a GPU's memory (total / max_shared_users) on any of them, else
  shared with the memory it holds (rounded up to 1 GiB) as its figure: the
  memory is counted once, by the booking, as the scheduler counts every
  booking's figure (it never subtracts live memory as well).
* The window: now until ``--until`` (default: as long as the policy allows,
  at most 24 h: it ends when the process does anyway).  When a later
  booking collides, an explicit ``--until`` is refused with the longest
  window that fits (and the command for it); the default is cut to it.
"""

from __future__ import annotations

import math

from bk.core.errors import Conflict, InvalidInput, NotFound, PermissionDenied
from bk.core.models import EXCLUSIVE, SHARED
from bk.core.record import dataclass, replace
from bk.core.timegrid import counted

DEFAULT_HOURS = 24


def footprint(snapshot, pids: set[int]) -> dict[int, int]:
    """GPU index -> MiB that ``pids`` hold there (only GPUs they are on)."""
    out: dict[int, int] = {}
    for g in snapshot.gpus:
        for p in g.processes or ():
            if p.pid in pids:
                out[g.index] = out.get(g.index, 0) + (p.mem_mib or 0)
    return out


def plan(app, call, *, pid: int | None = None, gpu: int | None = None, until: int | None = None,
         note: str | None = None, idle_release_minutes: int | None = None, op_id: str | None = None,
         dry_run: bool = False, proc_root: str = "/proc"):
    """The ``BookRequest`` that adopts the process (or the caller's
    processes on ``gpu``), and a warning when the default window was cut."""
    from bk.core.timegrid import ceil_slice, floor_slice
    from bk.gpu.procinfo import descendants, identity
    from bk.service.requests import BookRequest

    snap = call.telemetry.snapshot()
    if any(g.processes is None for g in snap.gpus):
        raise InvalidInput("the GPUs' process lists cannot be read here, so bk cannot tell what a process holds",
                           hint="bk st shows what is missing; bk m status whether the monitor runs")
    if pid is not None:
        ident = identity(pid, proc_root)
        if ident is None:
            raise NotFound(f"no process {pid} runs (or it is hidden from you)", hint="ps -o pid,user,cmd -p PID")
        tree = descendants(pid, proc_root)
        held = footprint(snap, tree)
        if not held:
            raise InvalidInput(f"process {pid} and its children hold no GPU",
                               hint="bk st lists every GPU process; adopt one of those, or book: bk N DUR")
        roots = [ident]
    else:
        g = next((x for x in snap.gpus if x.index == gpu), None)
        if g is None:
            raise InvalidInput(f"there is no GPU {gpu}")
        from bk.gpu.procinfo import real_uid

        mine = [p.pid for p in g.processes or () if (p.uid if p.uid is not None else real_uid(p.pid, proc_root))
                == call.actor.uid]
        roots = [i for i in (identity(p, proc_root) for p in mine) if i is not None]
        if not roots:
            raise InvalidInput(f"none of your processes is on GPU {gpu}", hint="bk st lists every GPU process")
        held = footprint(snap, {p for p, _ in roots})
        held = {gpu: held.get(gpu, 0)}
    policy = call.policy
    totals = {x.index: x.mem_total_mib for x in snap.gpus}
    part = {i: (totals.get(i) or 0) / max(1, policy.max_shared_users) for i in held}
    exclusive = any(part[i] and held[i] > part[i] for i in held)
    mem = None if exclusive else max(1024, int(math.ceil(max(held.values()) / 1024)) * 1024)
    slot = policy.slot_minutes
    start = floor_slice(call.now, slot)
    longest = min(policy.max_booking_hours, DEFAULT_HOURS) * 3600
    end = ceil_slice(until, slot) if until is not None else start + longest
    if end <= call.now:
        raise InvalidInput("--until is in the past", hint="e.g. --until 18:00 or --until +4h")
    req = BookRequest(count=len(held), duration=end - start, mode=EXCLUSIVE if exclusive else SHARED,
                      share=1, mem_mib=mem, start=start, pinned=tuple(sorted(held)), note=note, op_id=op_id,
                      dry_run=dry_run, idle_release_minutes=idle_release_minutes,
                      adopt=",".join(f"{p}:{s}" for p, s in sorted(roots)))
    fit = longest_fit(app, call, req)
    if fit is None:
        return req, None
    if until is not None:
        from bk.core.timegrid import format_local_short

        words = format_local_short(start + fit, call.tz, call.now)
        raise Conflict(f"GPU {','.join(map(str, sorted(held)))} is booked before --until; the longest window "
                       f"that fits ends at {words}",
                       hint=f"bk adopt {pid if pid is not None else '--gpu ' + str(gpu)} --until {words}",
                       details={"rule": "capacity", "longest_s": fit})
    return replace(req, duration=fit), f"adopted until a later booking's start ({counted(fit // 60, 'minute')})"


def longest_fit(app, call, req) -> int | None:
    """None when ``req`` fits as asked; else the longest duration (whole
    slices from the current one) that does.  Raises the placement's error
    when not even one slice fits."""
    from bk.core.timegrid import slot_seconds

    def fits(duration: int) -> bool:
        try:
            app.run("book", replace(req, duration=duration, dry_run=True, op_id=None), call=call)
            return True
        except Conflict:
            return False

    if fits(req.duration):
        return None
    step = slot_seconds(call.policy.slot_minutes)
    lo, hi = 0, req.duration // step          # fits(lo * step) (0: vacuous), not fits(hi * step)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid * step):
            lo = mid
        else:
            hi = mid
    if lo == 0:
        app.run("book", replace(req, duration=step, dry_run=True, op_id=None), call=call)   # raises why
    return lo * step


def check_adopt(req, actor, state, now: int, proc_root: str = "/proc"):
    """Where the booking is written: every adopted process still runs as
    the very process named (pid and start), and whose they are.  Returns
    (uid, user) the booking belongs to: the actor's, or the owner's when the
    administrator adopts another user's process."""
    from bk.core.models import GpuProcess
    from bk.core.telemetry import active_gpus_by_uid, judge
    from bk.gpu.procinfo import alive, real_uid
    from bk.service import follow

    owners = set()
    active = active_gpus_by_uid(state.reservations, now)
    for pid, start in follow.adopt_pairs(req.adopt):
        if not alive(pid, start, proc_root):
            raise NotFound(f"process {pid} is no longer running (or its PID now names another process)",
                           hint="nothing to adopt; book with: bk N DUR")
        uid = real_uid(pid, proc_root)
        if uid is None:
            raise PermissionDenied(f"cannot read whose process {pid} is")
        if uid == 0 and actor.uid != 0:
            # A root process in a container: credited as attribution does, to
            # the one user whose booking holds its GPU now, or to nobody.
            from bk.gpu.procinfo import ProcInfo

            info = ProcInfo(proc_root).describe(pid)
            p = GpuProcess(pid=pid, uid=0, container=info[4])
            got = {judge(p, g, active).uid for g in (req.pinned or ())} if info[4] else {0}
            if got == {actor.uid}:
                uid = actor.uid
        owners.add(uid)
    if len(owners) != 1:
        raise InvalidInput("the processes to adopt belong to different users; adopt each user's apart")
    owner = owners.pop()
    if owner != actor.uid and not actor.is_admin:
        raise PermissionDenied(f"the process belongs to {_name(owner)}, not to you; you may adopt only your own",
                               hint="its owner can run bk adopt, or the administrator (sudo bk adopt PID)")
    return owner, (actor.user if owner == actor.uid else _name(owner))


def _name(uid: int) -> str:
    from bk.users import user_name

    return user_name(uid) or str(uid)


# ------------------------------------------------------------- the row

@dataclass(frozen=True)
class AdoptRequest:
    """``bk adopt PID | --gpu N``: which processes, until when, and the
    booking's own words; read from this machine's ``/proc`` and GPUs."""

    pid: int | None = None
    gpu: int | None = None
    until: int | None = None
    note: str | None = None
    idle_release_minutes: int | None = None
    op_id: str | None = None
    dry_run: bool = False


@dataclass(frozen=True)
class AdoptPlan:
    """The booking that adopts them (a ``BookRequest`` for the ``book``
    row), and why its window was cut, if it was."""

    request: object
    cut: str | None

    def to_json(self) -> dict:
        from bk.service.fields import encode

        return {"request": encode(self.request), "cut": self.cut}


def _serve_adopt(app, req: AdoptRequest, call) -> AdoptPlan:
    got, cut = plan(app, call, pid=req.pid, gpu=req.gpu, until=req.until, note=req.note,
                    idle_release_minutes=req.idle_release_minutes, op_id=req.op_id, dry_run=req.dry_run)
    return AdoptPlan(got, cut)
