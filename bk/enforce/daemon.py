"""The enforcer: keep one device program on every governed cgroup, each
saying what its user's bookings allow, until SIGTERM.

The facts that shape the loop:

* The programs switch by themselves.  Each carries its user's booking
  windows on the boot clock (``bk.core.enforce.grants_for``), so an open
  one nanosecond after a booking ends is refused whether or not this
  process is awake.  The enforcer only has to change a program when what
  it says changes: the ledger (a booking made, edited, cancelled), the
  cgroups (a login makes ``user-UID.slice``, a container starts, a credit
  appears), the wall clock (stepped against the boot clock), and the lease.
* The lease.  Every program expires on a 20-second grid, 40 to 60 s ahead
  (``bk.core.enforce.expiry_for``), and the enforcer renews them all on
  the grid.  One that is not renewed (the enforcer died, hangs, or cannot
  read the ledger) turns, at its expiry, into the administrator's choice:
  everything allowed (``enforce_failure: open``) or no managed GPU
  (``closed``).
* Failing open also detaches.  In open mode the programs hang on BPF
  links held by this process: when it exits, however it exits, the kernel
  detaches them.  In closed mode they are plain attachments, which outlive
  it; a restarted enforcer finds them by name (``gpubk<UID>``) and replaces
  them in place.
* Replacement is atomic (``BPF_LINK_UPDATE``, or ``BPF_PROG_ATTACH`` with
  ``BPF_F_REPLACE``): an open sees the old program or the new one.
* Wake-ups.  The loop sleeps in ``select`` on the stop pipe (``bk.daemon``) and an
  inotify descriptor (a new slice under ``user.slice``, a cgroup at the
  root, the ledger renamed into place), until the next booking boundary,
  renewal or periodic scan (``SCAN_S``, which also bounds a signal's
  grace), whichever comes first.  Without inotify the periodic scan alone
  still bounds the delay.  A pass with nothing to change costs a few stats
  and directory listings; the kernel is asked whether the programs are
  still attached every ``VERIFY_S``, and the status is rewritten when it
  changes and every ``PUBLISH_S`` (it is the enforcer's heartbeat).
* Nothing a single cgroup does ends the loop: an attachment the kernel
  refuses is an event and a problem in the status, and the next pass tries
  again.  A ledger that cannot be read keeps the programs of the last good
  read until their lease runs out, then fails as configured.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from bk import daemon
from bk.core import devprog
from bk.core import enforce as rule
from bk.core.errors import BkError, ConfigError
from bk.core.models import iso
from bk.core.record import dataclass, field
from bk.core.timegrid import counted
from bk.enforce import cgroups, state

SCAN_S = 2.0                      # rescan cgroups, re-read the snapshot
VERIFY_S = 10.0                   # ask the kernel whether each program is still attached
PUBLISH_S = 5.0                   # rewrite an unchanged status at least this often (it is a heartbeat)
DRIFT_NS = 250_000_000            # a wall-clock step larger than this regenerates every program


log_stderr = daemon.stderr_log("bk enforcer")


def clocks() -> tuple[int, int]:
    """(realtime ns, realtime minus boottime ns), read back to back."""
    a = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    t = time.time_ns()
    b = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    return t, t - (a + b) // 2


@dataclass(frozen=True)
class Options:
    root: str                      # the cgroup v2 mount
    state_dir: str
    fail_open: bool
    links: bool                    # BPF links (fail open) or plain attachments
    bypass: frozenset = frozenset()
    signal: bool = False
    grace_s: float = 30.0
    proc_root: str = "/proc"
    lease_s: int = rule.LEASE_S        # tests shorten both
    renew_s: int = rule.RENEW_S


@dataclass
class Slot:
    """One governed cgroup and what the kernel holds for it."""

    target: rule.Target
    cg_fd: int
    link_fd: int | None = None
    prog_fd: int | None = None
    prog_id: int | None = None
    grants: devprog.Grants | None = None
    adopted: bool = False          # prog_fd is an earlier enforcer's plain attachment


@dataclass
class Pass:
    """What one pass found, for the status file."""

    problems: list = field(default_factory=list)
    uncredited: list = field(default_factory=list)


class Enforcer:
    def __init__(self, opts: Options, *, devices: rule.DeviceMap, read_ledger: Callable[[], object],
                 read_snapshot: Callable[[int], object] | None = None, kernel=None,
                 clock: Callable[[], tuple[int, int]] = clocks, log: Callable[[str], None] = log_stderr):
        if kernel is None:
            from bk.enforce import kernel
        self.o, self.devices, self.k = opts, devices, kernel
        self.read_ledger, self.read_snapshot = read_ledger, read_snapshot
        self.clock, self.log = clock, log
        self.slots: dict[tuple[str, int], Slot] = {}
        self.credits: dict[int, rule.Credit] = {}       # container cgroup id -> credit (for its life)
        self.reservations: list | None = None
        self.judged: list = []            # the reservations plus shared bookings' sharers (_with_sharers)
        self.by_uid: dict[int, list] = {}
        self.edges: list[int] = []                       # every booking start and end, sorted
        self.ledger_error: str | None = None
        self.offset_ns: int | None = None
        self.expiry_s: int | None = None                # the expiry of the programs attached now
        self.pending_signals: dict = {}
        self.last = Pass()
        self.pid = os.getpid()
        self.started_at = int(self.clock()[0] // rule.SECOND)
        self.failing = False
        self._found: cgroups.Found | None = None
        self._snap: tuple | None = None
        self._published: dict | None = None
        self._published_at = 0.0
        self._verified_at = 0.0
        self._names: dict[int, str | None] = {}

    # -------------------------------------------------------------- inputs

    def _ledger(self) -> bool:
        """Re-read the ledger; True when its bookings changed."""
        try:
            got = self.read_ledger()
        except BkError as e:
            if self.ledger_error is None:
                self.log(f"cannot read the ledger: {e.message}; the programs of the last good read stay "
                         "until their lease ends")
                self._event("ledger-unreadable", detail=e.message)
            self.ledger_error = e.message
            return False
        if self.ledger_error is not None:
            self.log("the ledger reads again")
            self._event("ledger-readable")
        self.ledger_error = None
        if got is None or got is self.reservations:
            return False
        self.reservations = got
        self.by_uid = {}
        edges = set()
        # A booking shared with others opens its GPUs to them too (issue 27).
        self.judged = _with_sharers(got)
        for r in self.judged:
            self.by_uid.setdefault(r.uid, []).append(r)
            if r.cancelled_at is None:
                edges.update((r.start, r.end))
        self.edges = sorted(edges)
        return True

    def enforced(self, uid: int) -> bool:
        return uid != 0 and uid not in self.o.bypass

    def _targets(self, found: cgroups.Found, now: int, pass_: Pass) -> list[rule.Target]:
        out = [rule.Target(path, uid, rule.SLICE, "slice", ident)
               for path, uid, ident in found.slices if self.enforced(uid)]
        live = {ident for _, ident in found.containers}
        for gone in [i for i in self.credits if i not in live]:
            del self.credits[gone]
        inferred = self._inferred(found) if found.containers else {}
        for path, ident in found.containers:
            pids = cgroups.procs(self.o.root, path)
            uids = {u for u in (cgroups.real_uid(p, self.o.proc_root) for p in pids) if u is not None}
            prior = self.credits.get(ident)
            c = rule.credit(uids, inferred.get(path, set()), prior.uid if prior else None)
            if c.uid is None:
                if pids:
                    pass_.uncredited.append({"cgroup": path, "why": c.how or "no user seen"})
                continue
            if prior is None or prior.uid != c.uid:
                self.log(f"container {path} credited to uid {c.uid} ({c.how})")
                self._event("credit", uid=c.uid, cgroup=path, how=c.how)
            self.credits[ident] = rule.Credit(c.uid, prior.how if c.how == "kept" and prior else c.how)
            if self.enforced(c.uid):
                out.append(rule.Target(path, c.uid, rule.CONTAINER, self.credits[ident].how, ident))
        return out

    def _snapshot(self, now: int):
        """The monitor's snapshot, read at most once a pass."""
        if self.read_snapshot is None:
            return None
        if self._snap is None:
            try:
                self._snap = (self.read_snapshot(now),)
            except (BkError, OSError):
                self._snap = (None,)
        return self._snap[0]

    def _inferred(self, found: cgroups.Found) -> dict[str, set[int]]:
        snap = self._snapshot(int(self.clock()[0] // rule.SECOND))
        if snap is None or self.reservations is None:
            return {}
        paths = {p for p, _ in found.containers}
        where = {}
        for g in snap.gpus:
            for p in g.processes or ():
                cg = cgroups.container_path(cgroups.cgroup_of(p.pid, self.o.proc_root) or "")
                if cg in paths and self._same_process(p.pid, p.since):
                    where[p.pid] = cg
        return rule.inferred_users(snap, self.judged, where)

    def _same_process(self, pid: int, since: int | None) -> bool:
        """``pid`` still is the process the snapshot saw (started at
        ``since``), and is not a zombie."""
        return since is not None and cgroups.started_at(pid, self.o.proc_root, live=True) == since

    # -------------------------------------------------------------- the kernel

    def _open(self, t: rule.Target) -> int | None:
        try:
            fd = os.open(os.path.join(self.o.root, t.path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        if t.ident and os.fstat(fd).st_ino != t.ident:
            os.close(fd)
            return None
        return fd

    def _adopt(self, slot: Slot) -> None:
        """An earlier enforcer's plain attachment on this cgroup (closed
        mode, or a switch of mode) becomes the one this slot replaces."""
        try:
            q = self.k.query(slot.cg_fd)
        except OSError:
            return
        for pid_ in q.ids:
            try:
                fd = self.k.prog_fd_by_id(pid_)
            except OSError:
                continue
            try:
                info = self.k.prog_info(fd)
            except OSError:
                os.close(fd)
                continue
            if rule.is_program(info.name) and slot.prog_fd is None:
                slot.prog_fd, slot.prog_id, slot.adopted = fd, info.id, True
            elif rule.is_program(info.name):
                # A second one of ours (should not happen): detach it.
                try:
                    self.k.detach(slot.cg_fd, fd)
                except OSError:
                    pass
                os.close(fd)
            else:
                os.close(fd)

    def _load(self, g: devprog.Grants, uids: set[int], cache: dict) -> tuple[int, int]:
        """One loaded program per distinct meaning in a pass: cgroups whose
        grants are equal (most often: users with no booking now) share it."""
        hit = cache.get(g)
        if hit is None:
            name = rule.program_name(next(iter(uids)) if len(uids) == 1 else None)
            fd = self.k.load(devprog.encode(devprog.generate(g)), name)
            hit = cache[g] = (fd, self.k.prog_info(fd).id)
        return hit

    def _install(self, slot: Slot, fd: int, prog_id: int) -> None:
        """Put ``fd``'s program on the slot's cgroup in place of the one
        there, in one step."""
        old = slot.prog_fd
        if self.o.links:
            if slot.link_fd is None:
                slot.link_fd = self.k.link_create(slot.cg_fd, fd)
                if old is not None and slot.adopted:       # an earlier plain attachment: ours replaces it
                    try:
                        self.k.detach(slot.cg_fd, old)
                    except OSError:
                        pass
            else:
                self.k.link_update(slot.link_fd, fd, old)
        else:
            try:
                self.k.attach(slot.cg_fd, fd, replace_fd=old)
            except FileNotFoundError:
                if old is None:
                    raise
                self.k.attach(slot.cg_fd, fd)               # someone detached the old one meanwhile
        if old is not None:
            os.close(old)
        slot.prog_fd, slot.prog_id, slot.adopted = os.dup(fd), prog_id, False

    def _remove(self, slot: Slot) -> None:
        try:
            if slot.link_fd is not None:
                try:
                    self.k.link_detach(slot.link_fd)
                except OSError:
                    pass
                os.close(slot.link_fd)
            elif slot.prog_fd is not None:
                try:
                    self.k.detach(slot.cg_fd, slot.prog_fd)
                except OSError:
                    pass
        finally:
            for fd in (slot.prog_fd, slot.cg_fd):
                if fd is not None:
                    os.close(fd)
            slot.link_fd = slot.prog_fd = None

    def _verify(self, slot: Slot) -> bool:
        """Our program is still attached to the slot's cgroup (runc, for
        one, detaches every device program of a container it updates)."""
        if slot.prog_id is None:
            return True
        try:
            return slot.prog_id in self.k.query(slot.cg_fd).ids
        except OSError:
            return False

    # -------------------------------------------------------------- one pass

    def step(self, *, scan: bool = True) -> Pass:
        """One pass: read what changed, put the right program on every
        governed cgroup, release the others, signal if asked to."""
        t_ns, offset = self.clock()
        now = t_ns // rule.SECOND
        changed = self._ledger()
        self._snap = None
        p = Pass()
        if scan or self._found is None:
            self._found = cgroups.scan(self.o.root)
        p.problems += list(self._found.problems)
        targets = self._targets(self._found, now, p)
        good = self.ledger_error is None and self.reservations is not None
        expiry = rule.expiry_for(t_ns / rule.SECOND, self.o.lease_s, self.o.renew_s)
        drift = self.offset_ns is None or abs(offset - self.offset_ns) > DRIFT_NS
        # With a good read, renew when anything changed or the grid moved on.
        # Without one, keep the programs of the last good read: a program made
        # now for a new cgroup gets their expiry, never a later one.
        renew = good and (drift or changed or expiry != self.expiry_s)
        cap = None if good else self.expiry_s
        failing = self.reservations is None or (not good and (self.expiry_s is None or now >= self.expiry_s))
        wanted = {(t.path, t.ident): t for t in targets}
        for key in [k for k in self.slots if k not in wanted]:
            slot = self.slots.pop(key)
            self._remove(slot)
            self._event("released", uid=slot.target.uid, cgroup=slot.target.path)
        if failing and self.o.fail_open:
            self._fail_open(p)
        else:
            mono = time.monotonic()
            verify = scan and mono - self._verified_at >= VERIFY_S
            if verify:
                self._verified_at = mono
            self._enforce(wanted, t_ns, offset, renew=renew, expiry=expiry if good else cap, failing=failing,
                          verify=verify, p=p)
        if renew:
            self.offset_ns, self.expiry_s = offset, expiry
        if failing != self.failing:
            self.failing = failing
            what = "open" if self.o.fail_open else "closed"
            if failing:
                self.log(f"FAILING {what.upper()}: {self.ledger_error or 'the ledger was never read'}")
            else:
                self.log("enforcing again")
            self._event(f"fail-{what}" if failing else "enforcing", detail=self.ledger_error)
        if self.o.signal and not failing:
            self._signals(now, p)
        self.last = p
        return p

    def _fail_open(self, p: Pass) -> None:
        for key in list(self.slots):
            self._remove(self.slots.pop(key))
        p.problems.append("failing open: no program is attached")

    def _enforce(self, wanted: dict, t_ns: int, offset: int, *, renew: bool, expiry: int | None, failing: bool,
                 verify: bool, p: Pass) -> None:
        cache: dict = {}
        todo: list[tuple[Slot, rule.Target, devprog.Grants]] = []
        try:
            for key, t in wanted.items():
                slot = self.slots.get(key)
                fresh = slot is None
                if fresh:
                    fd = self._open(t)
                    if fd is None:
                        continue                            # gone since the scan
                    slot = self.slots[key] = Slot(t, fd)
                    self._adopt(slot)
                if failing:                                 # closed, and no good ledger: nothing managed
                    g = devprog.Grants(self.devices.managed(), (), 0, False)
                elif renew or fresh or slot.grants is None or slot.target.uid != t.uid:
                    g = rule.grants_for(self.by_uid.get(t.uid, ()), t.uid, self.devices, now_ns=t_ns,
                                        offset_ns=offset, fail_open=self.o.fail_open, expiry_s=expiry)
                else:
                    g = slot.grants
                lost = verify and not fresh and not self._verify(slot)
                if lost:
                    self.log(f"our program on {t.path} was detached by someone else; attaching it again")
                    self._event("reattached", uid=t.uid, cgroup=t.path)
                    if slot.link_fd is not None:
                        os.close(slot.link_fd)
                        slot.link_fd = None
                    if slot.prog_fd is not None:
                        os.close(slot.prog_fd)
                    slot.prog_fd = slot.prog_id = None
                if g == slot.grants and not lost and slot.prog_fd is not None:
                    continue
                todo.append((slot, t, g))
            users: dict[devprog.Grants, set[int]] = {}
            for _slot, t, g in todo:
                users.setdefault(g, set()).add(t.uid)
            for slot, t, g in todo:
                try:
                    fd, prog_id = self._load(g, users[g], cache)
                    self._install(slot, fd, prog_id)
                    slot.grants, slot.target = g, t
                except OSError as e:
                    p.problems.append(f"{t.path}: {e.strerror or e}")
                    self._event("attach-failed", uid=t.uid, cgroup=t.path, detail=str(e))
                    self.log(f"cannot attach the program of uid {t.uid} to {t.path}: {e}")
        finally:
            for fd, _ in cache.values():
                os.close(fd)

    # -------------------------------------------------------------- signals

    def _signals(self, now: int, p: Pass) -> None:
        snap = self._snapshot(now)
        if snap is None or self.reservations is None:
            return
        container_uid = {}
        for slot in self.slots.values():
            if slot.target.kind == rule.CONTAINER:
                for pid in cgroups.procs(self.o.root, slot.target.path):
                    container_uid[pid] = slot.target.uid
        found = rule.holders(snap, self.judged, now, enforced=self.enforced, container_uid=container_uid)
        mono = time.monotonic()
        step = rule.signal_step(self.pending_signals, found, mono, self.o.grace_s)
        self.pending_signals = step.pending
        for h, sig in [(h, signal.SIGTERM) for h in step.term] + [(h, signal.SIGKILL) for h in step.kill]:
            if self._send(h, sig):
                name = "term" if sig == signal.SIGTERM else "kill"
                self.log(f"sent SIG{name.upper()} to pid {h.pid} (uid {h.uid}, {h.label or '?'}) on GPU {h.gpu}: "
                         "no booking of its owner holds that GPU")
                self._event(name, uid=h.uid, pid=h.pid, gpu=h.gpu, label=h.label)

    def _send(self, h: rule.Holder, sig: int) -> bool:
        """Signal ``h`` only if its PID still names the process the
        snapshot saw: a pidfd pins the process, its start time proves it."""
        try:
            pidfd = os.pidfd_open(h.pid)
        except OSError:
            return False
        try:
            if not self._same_process(h.pid, h.since):
                return False
            signal.pidfd_send_signal(pidfd, sig)
            return True
        except OSError:
            return False
        finally:
            os.close(pidfd)

    # -------------------------------------------------------------- status

    def _name(self, uid: int) -> str | None:
        if uid not in self._names:
            from bk.users import user_name

            self._names[uid] = user_name(uid)
        return self._names[uid]

    def _event(self, kind: str, **fields) -> None:
        t = self.clock()[0] / rule.SECOND
        if "uid" in fields:
            fields["user"] = self._name(fields["uid"])
        state.append_event(self.o.state_dir, state.event(kind, t, **fields))

    def status(self, *, stopped: str | None = None) -> dict:
        t = self.clock()[0] // rule.SECOND
        if stopped is not None:
            st = state.STOPPED
        elif self.failing:
            st = state.FAILING_OPEN if self.o.fail_open else state.FAILING_CLOSED
        else:
            st = state.ENFORCING
        targets = []
        for slot in sorted(self.slots.values(), key=lambda s: s.target.path):
            tg = slot.target
            allowed = sorted(rule.allowed_now(self.by_uid.get(tg.uid, ()), tg.uid, t)) if not self.failing else []
            targets.append({**tg.to_json(), "user": self._name(tg.uid), "gpus": allowed, "program": slot.prog_id,
                            "attached": slot.prog_fd is not None})
        nb = self._next_edge(t)
        return {"pid": self.pid, "started_at": self.started_at, "updated_at": t, "updated_at_iso": iso(t),
                "state": st, "detail": stopped or self.ledger_error, "failure": "open" if self.o.fail_open else "closed",
                "attach": "link" if self.o.links else "attach", "cgroup_root": self.o.root,
                "devices": self.devices.to_json(), "expiry": iso(self.expiry_s) if self.expiry_s else None,
                "next_boundary": iso(nb) if nb else None, "targets": targets,
                "uncredited": self.last.uncredited, "problems": self.last.problems,
                "bypass": sorted(self.o.bypass),
                "signal": {"enabled": self.o.signal, "grace_s": self.o.grace_s,
                           "pending": len(self.pending_signals)}}

    def publish(self, *, stopped: str | None = None) -> None:
        """Write the status when it says something new, and at least every
        ``PUBLISH_S`` (readers take an old one for a dead enforcer)."""
        doc = self.status(stopped=stopped)
        same = {k: v for k, v in doc.items() if k not in ("updated_at", "updated_at_iso")}
        mono = time.monotonic()
        if stopped is None and same == self._published and mono - self._published_at < PUBLISH_S:
            return
        try:
            state.write_status(self.o.state_dir, doc)
            self._published, self._published_at = same, mono
        except BkError as e:
            self.log(f"cannot write the status: {e.message}")

    def next_wake(self) -> float:
        """Seconds until the next thing that needs a pass by the clock: a
        booking boundary (for the status and the signals), the renewal
        grid, the periodic scan."""
        t = self.clock()[0] / rule.SECOND
        due = [t + SCAN_S, float((int(t) // self.o.renew_s + 1) * self.o.renew_s)]
        nb = self._next_edge(int(t))
        if nb is not None:
            due.append(float(nb))
        return max(0.0, min(due) - t)

    def _next_edge(self, t: int) -> int | None:
        """The first booking boundary after ``t`` (``rule.next_boundary``,
        from the sorted edges of the ledger read, not a walk of it)."""
        import bisect

        i = bisect.bisect_right(self.edges, t)
        return self.edges[i] if i < len(self.edges) else None

    def shutdown(self, *, detach: bool) -> int:
        """Stop: detach every program (open mode, or enforcement turned
        off), or leave them to their lease (closed mode).  Returns how many
        were detached."""
        n = 0
        for key in list(self.slots):
            slot = self.slots.pop(key)
            if detach:
                self._remove(slot)
                n += 1
            else:
                for fd in (slot.link_fd, slot.prog_fd, slot.cg_fd):
                    if fd is not None:
                        os.close(fd)
        return n


# ------------------------------------------------------------------ inotify

class Watch:
    """inotify on a few directories: a descriptor ``select`` can wait on.
    None of it is essential (the periodic scan bounds every delay), so any
    failure leaves ``fd`` None."""

    IN_MODIFY, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x2, 0x80, 0x100, 0x200

    def __init__(self, paths: list[str]):
        self.fd, self.paths, self._libc, self._watched = None, list(paths), None, set()
        try:
            import ctypes

            self._libc = ctypes.CDLL(None, use_errno=True)
            fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd >= 0:
                self.fd = fd
        except (OSError, AttributeError):
            self.fd = None
        self.ensure()

    def ensure(self) -> None:
        """Watch the paths not watched yet (``user.slice`` appears with the
        first login): one call each, none once all are watched."""
        if self.fd is None:
            return
        for p in self.paths:
            if p not in self._watched and os.path.isdir(p):
                if self._libc.inotify_add_watch(self.fd, os.fsencode(p),
                                                self.IN_MOVED_TO | self.IN_CREATE | self.IN_DELETE) >= 0:
                    self._watched.add(p)

    def drain(self) -> None:
        if self.fd is None:
            return
        try:
            while os.read(self.fd, 65536):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# ------------------------------------------------------------------ assembly

def settings_for(env: dict):
    from bk.store.config import load
    from bk.store.paths import locate

    s = load(locate(env))
    if s.mode != "shared":
        raise ConfigError("enforcement needs a shared server's trusted configuration",
                          hint="set up the server first: sudo bk admin install (or bk admin init)")
    return s


def ledger_reader(settings) -> Callable[[], list | None]:
    """The committed ledger's bookings, re-read only when the file changed
    (inode, size, mtime, and ctime: a new owner or mode may make it one no
    reader believes): a stat per pass, a parse per commit.  Returns the
    same list object while nothing changed."""
    from bk.store.ledger import Store

    store = Store(settings.data_dir, private=False, lock_timeout=settings["lock_timeout_seconds"],
                  owner_uid=settings["service_uid"], capacity=settings["max_shared_users"])
    memo: dict = {}

    def read():
        try:
            st = os.stat(store.paths.ledger)
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            stamp = None
        if stamp is not None and memo.get("stamp") == stamp:
            return memo["value"]
        got = store.read()
        memo["stamp"], memo["value"] = stamp, got.state.reservations
        memo["policy"] = got.state.policy
        return memo["value"]

    read.memo = memo
    return read


def snapshot_reader(settings) -> Callable[[int], object]:
    from bk.store import snapshot as files

    directory, owner = files.monitor_dir(settings), files.monitor_owner(settings)

    def read(now: int):
        got = files.read_snapshot_file(directory, now, owner=owner)
        return None if got is None else got.snapshot

    return read


def gpu_count(settings, read_ledger, proc_root: str = "/proc") -> int:
    """The GPUs enforced: the count the ledger is bound to, else the
    configuration's, else what the driver lists."""
    try:
        read_ledger()
        bound = (read_ledger.memo.get("policy") or {}).get("gpu_count")
    except BkError:
        bound = None
    if isinstance(bound, int) and bound > 0:
        return bound
    if settings["gpu_count"]:
        return settings["gpu_count"]
    return len(cgroups.driver_facts(proc_root).minors_by_bus)


def options_for(settings, support_links: bool, *, lease_s: int | None = None) -> Options:
    from bk.core.errors import Unavailable

    root = settings["enforce_cgroup_root"] or cgroups.find_root()
    if root is None:
        raise Unavailable("no cgroup v2 hierarchy is mounted here", hint="device programs attach to cgroup v2: "
                          "boot with systemd's unified or hybrid cgroup layout")
    fail_open = settings["enforce_failure"] == "open"
    bypass = set(settings["enforce_bypass"])
    for key in ("service_uid", "monitor_uid"):
        if settings[key] is not None:
            bypass.add(settings[key])
    return Options(root=root, state_dir=settings["enforce_state_dir"], fail_open=fail_open,
                   links=fail_open and support_links, bypass=frozenset(bypass),
                   signal=settings["enforce_signal"], grace_s=float(settings["enforce_signal_grace_seconds"]),
                   lease_s=lease_s or rule.LEASE_S, renew_s=max(1, (lease_s or rule.LEASE_S) // 3))


def serve(e: Enforcer, watch: Watch, stop: daemon.Stop, *, max_passes: int | None = None) -> int:
    """The loop: a pass, then sleep until something changes or is due.
    Returns the number of passes once ``stop`` is set."""
    passes = 0
    while not stop.is_set():
        watch.ensure()
        e.step()
        e.publish()
        passes += 1
        if max_passes is not None and passes >= max_passes:
            break
        if stop.wait(e.next_wake(), [watch.fd] if watch.fd is not None else []):
            watch.drain()
    return passes


@dataclass
class RunStats:
    passes: int
    detached: int
    pid: int


def run(env: dict, *, log: Callable[[str], None] = log_stderr, max_passes: int | None = None,
        lease_s: int | None = None) -> RunStats:
    """``bk admin enforce run``: check, lock, enforce until SIGTERM."""
    from bk.core.errors import Unavailable
    from bk.enforce import kernel

    os.umask(0o022)
    settings = settings_for(env)
    daemon.check_root("the enforcer must run as root (it loads and attaches BPF programs)",
                      hint="systemd runs it: sudo systemctl start gpubk-enforcer")
    if not settings["enforce"]:
        raise ConfigError(f"enforcement is off in {settings.source}",
                          hint="turn it on with: sudo bk admin enforce on")
    support = kernel.probe()
    if not support.ok:
        raise Unavailable(f"this kernel cannot enforce: {support.detail}",
                          hint="bk admin enforce status shows what is missing")
    opts = options_for(settings, support.links, lease_s=lease_s)
    lock_fd = daemon.instance_lock(opts.state_dir, state.LOCK_FILE, uid=0, what="the enforcer's lock", log=log,
                                   create_mode=state.DIR_MODE, busy=daemon.refusal(
        "another enforcer is running here", "see: systemctl status gpubk-enforcer, or bk admin enforce status",
        os.path.join(opts.state_dir, state.LOCK_FILE)))
    read_ledger = ledger_reader(settings)
    devices = cgroups.device_map(gpu_count(settings, read_ledger))
    watch = Watch([opts.root, os.path.join(opts.root, cgroups.USER_SLICE), settings.data_dir])
    e = Enforcer(opts, devices=devices, read_ledger=read_ledger, read_snapshot=snapshot_reader(settings), log=log)
    try:
        with daemon.Stop() as stop, stop.signals():
            mode = "fail open, BPF links" if opts.links else \
                f"fail {'open' if opts.fail_open else 'closed'}, plain attachments"
            daemon.ready(log, f"pid {os.getpid()}: enforcing on {opts.root} ({mode}); "
                         f"{counted(len(devices.gpus), 'GPU')}, minors from {devices.source}")
            e._event("started", detail=mode)
            passes = serve(e, watch, stop, max_passes=max_passes)
            daemon.stopping()
            # Turned off meanwhile (bk admin enforce off) or open mode: nothing stays attached.
            try:
                still_on = settings_for(env)["enforce"]
            except BkError:
                still_on = True
            detach = opts.fail_open or not still_on
            detached = e.shutdown(detach=detach)
            why = f"stopped by signal; {detached} programs detached" if detach else \
                "stopped by signal; the programs stay attached and close every managed GPU at their expiry " \
                "(fail closed)"
            log(why)
            e._event("stopped", detail=why)
            e.publish(stopped=why)
            return RunStats(passes, detached, os.getpid())
    finally:
        if e.slots:
            e.shutdown(detach=opts.fail_open)
        watch.close()
        os.close(lock_fd)


def _with_sharers(reservations) -> list:
    """The bookings plus, for each shared one, its sharers' shadows
    (``bk.core.sharing.expand``): whose cgroups may open which GPU."""
    if not any(r.shared_with for r in reservations):
        return list(reservations)
    from bk.core.sharing import Sharing, expand, sharers_map
    from bk.store.accounts import accounts

    return expand(reservations, sharers_map(reservations, Sharing(accounts())))
