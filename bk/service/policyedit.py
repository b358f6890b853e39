"""Changing the GPU policy: the configuration file and the ledger's binding.

The facts.  The policy lives in two places.  The configuration file (on a
shared server the trusted ``/etc/gpubk/config.json``, root's) holds every
key; clients read it on every run and the broker re-reads it when its
stamp changes (``ConfigWatch``).  The ledger records the keys that decide
its validity (``Policy.BOUND_KEYS``: GPU count, slice, share slots, the
memory reserve and the memory rule) at its first write, and every writer
refuses to commit when its configuration disagrees (``Store._bind``).  Two
files cannot be replaced in one atomic step.

The decision: the configuration first, then the binding.

1. ``plan``: read the configuration document and the ledger, compute the
   new document, the diff, and the bookings the new rules would break
   (refused unless ``--force``; rules the ledger cannot hold at all, such
   as more shared bookings on a GPU than the new slot count, are refused
   even then, the ledger would be invalid).
2. ``write_config``: a temp file in the same directory, the trust check on
   the finished temp file (``check_trusted``, the rule every client
   applies), fsync, ``os.replace``, fsync the directory.  A crash leaves
   the old file or the new one.
3. When a bound key changed: the ``policy_bind`` row (ADMIN) commits the
   new binding.  It runs without the store's binding check (that check is
   what it repairs) but only to exactly the values the host's own
   configuration now holds, re-checks the bookings under the lock, and
   records before and after in the audit log.

   On a shared server the row runs in the broker while it answers.  When
   no broker listens (a maintenance stop, the moment administrators pick
   for a policy change) root runs it on the host, as the service account
   and under the store's lock (``bind``, ``HostGateway``): waiting for the
   broker would not do, since a broker started with a configuration its
   ledger disagrees with refuses to start.

A crash between 2 and 3 leaves a configuration the ledger's binding does
not match.  That is detectable: every write and ``bk doctor`` name the keys,
and ``bk admin gpu-policy`` (show) says so.  It is repaired by re-running
the same command, broker running or not: the configuration already holds
the target, so step 2 changes nothing and step 3 binds it.  Keys outside
the binding need only step 2.
"""

from __future__ import annotations

import json
import os

from bk.core.errors import ConfigError, InvalidInput, PolicyRefused
from bk.core.models import CANCELLED, ENDED, SHARED, AuditEntry, LedgerState, Mutation, Policy, iso
from bk.core.policy import same
from bk.core.record import dataclass, replace
from bk.core.timegrid import counted
from bk.service.context import Call
from bk.service.requests import PolicyBindRequest
from bk.service.results import PolicyBindResult
from bk.service.views import View

POLICY_BIND = "policy_bind"
# The flag that sets each key, for a refusal in the words that were typed.
FLAGS = {"disabled_gpus": "--disable/--enable", "gpu_priority": "--priority",
         "booking_horizon_days": "--horizon-days", "max_booking_hours": "--max-hours",
         "require_shared_memory": "--require-memory", "shared_memory_reserve_mb": "--reserve-mb",
         "limits": "--limit", "limit_tiers": "--tier", "limit_exempt": "--exempt",
         "advance_default": "--advance-default", "fair_share": "--fair-share",
         "fair_share_half_life_days": "--half-life-days"}
UNSET = "unset"          # --limit WHO:LIMIT=unset removes the rule's value (none: no limit)


@dataclass(frozen=True)
class PolicyChange:
    disable: tuple[int, ...] = ()
    enable: tuple[int, ...] = ()
    priority: tuple[tuple[int, int], ...] = ()
    horizon_days: int | None = None
    max_hours: int | None = None
    require_memory: bool | None = None
    reserve_mb: int | None = None
    # Issue 27: per-user limits and their tiers and exemptions, advances, fair share.
    limits: tuple = ()                   # ((who, limit, value | None | UNSET), ...)
    tiers: tuple = ()                    # ((tier, (member, ...) or None to remove), ...)
    exempt: tuple | None = None
    advance_default: bool | None = None
    fair_share: bool | None = None
    half_life_days: float | None = None

    def touched(self) -> set[str]:
        out = set()
        if self.disable or self.enable:
            out.add("disabled_gpus")
        if self.priority:
            out.add("gpu_priority")
        for key, v in (("booking_horizon_days", self.horizon_days), ("max_booking_hours", self.max_hours),
                       ("require_shared_memory", self.require_memory),
                       ("shared_memory_reserve_mb", self.reserve_mb), ("limit_exempt", self.exempt),
                       ("advance_default", self.advance_default), ("fair_share", self.fair_share),
                       ("fair_share_half_life_days", self.half_life_days)):
            if v is not None:
                out.add(key)
        if self.limits:
            out.add("limits")
        if self.tiers:
            out.add("limit_tiers")
        return out


def parse_limit(text: str) -> tuple:
    """``WHO:LIMIT=VALUE`` (``*:gpus=2``, ``students:booking_hours=4``,
    ``@nlp:gpu_hours=none``, ``alice:gpus=unset``) -> (who, limit, value)."""
    from bk.core.limits import FIELDS

    who, colon, rest = text.rpartition(":")
    name, eq, value = rest.partition("=")
    if not colon or not eq or not who or name not in FIELDS:
        raise InvalidInput(f"--limit {text!r} is not WHO:LIMIT=VALUE",
                           hint="e.g. --limit '*:gpus=2', --limit students:booking_hours=4; LIMIT one of "
                                + ", ".join(FIELDS) + "; VALUE a number, none (no limit) or unset")
    v = value.strip().lower()
    if v in ("none", "null"):
        return who, name, None
    if v == UNSET:
        return who, name, UNSET
    try:
        num = float(v)
    except ValueError:
        raise InvalidInput(f"--limit {text!r}: {value!r} is not a number, none or unset") from None
    return who, name, int(num) if num.is_integer() else num


def parse_tier(text: str) -> tuple:
    """``NAME=user,@group`` -> (name, members); ``NAME=`` removes the tier."""
    name, eq, members = text.partition("=")
    if not eq or not name:
        raise InvalidInput(f"--tier {text!r} is not NAME=MEMBERS", hint="e.g. --tier students=@students,dave")
    words = tuple(w.strip() for w in members.split(",") if w.strip())
    return name.strip(), (words or None)


def parse_gpus(text: str, count: int) -> tuple[int, ...]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 0 <= int(part) < count:
            raise InvalidInput(f"{part!r} is not a GPU index (0-{count - 1})", hint="e.g. --disable 3 or 2,3")
        out.append(int(part))
    return tuple(sorted(set(out)))


def parse_priority(text: str, count: int) -> tuple[tuple[int, int], ...]:
    out = {}
    for part in text.split(","):
        gpu, eq, prio = part.strip().partition("=")
        try:
            g, p = int(gpu), int(prio)
        except ValueError:
            g = p = None
        if not eq or g is None or not 0 <= g < count or not -100 <= p <= 100:
            raise InvalidInput(f"{part!r} is not GPU=PRIORITY (GPU 0-{count - 1}, priority -100..100)",
                               hint="e.g. --priority 3=1,2=5 (lower is placed first)")
        out[g] = p
    return tuple(sorted(out.items()))


@dataclass(frozen=True)
class Violation:
    reservation: object
    why: str

    def to_json(self, view: View) -> dict:
        return {"reservation": view.reservation(self.reservation), "why": self.why}


@dataclass(frozen=True)
class PolicyPlan:
    config_file: str
    trusted: bool
    before: dict                  # the configuration document as the file has it
    after: dict
    diff: tuple                   # (key, before value, after value)
    bound_before: dict | None     # the ledger's binding
    bound_after: dict             # Policy(after).bound()
    violations: tuple = ()
    invalid: tuple = ()           # problems the ledger could not hold even with --force

    @property
    def config_changes(self) -> bool:
        return bool(self.diff)

    def rebind(self, touched: set[str]) -> bool:
        """The binding must change: it lags a bound key this command sets
        (also when an earlier run wrote the configuration and stopped)."""
        if self.bound_before is None:
            return False          # not bound yet: the first write records it
        return any(k in touched and not same(self.bound_before.get(k), v) for k, v in self.bound_after.items())


def _show(v) -> object:
    return sorted(v) if isinstance(v, (set, frozenset)) else v


def read_document(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 20)
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a JSON object of settings")
    return doc


def violations(state: LedgerState, old: Policy, new: Policy, now: int, gpu_mem: dict) -> tuple[list, list]:
    """Bookings still to run that the new policy refuses, and problems the
    ledger could not hold at all (capacity, alignment, GPU count)."""
    from bk.core.capacity import check_invariants

    live = [r for r in state.reservations if r.status(now) not in (ENDED, CANCELLED)]
    found = []
    newly_off = new.disabled_gpus - old.disabled_gpus
    for r in live:
        off = sorted(set(r.gpus) & newly_off)
        if off:
            found.append(Violation(r, f"uses GPU {', '.join(map(str, off))}, which is being disabled"))
        if r.end - r.start > new.max_booking_hours * 3600 and \
                r.end - r.start <= old.max_booking_hours * 3600:
            found.append(Violation(r, f"is longer than {new.max_booking_hours} h"))
        if r.end > now + new.booking_horizon_days * 86400 >= now and \
                r.end <= now + old.booking_horizon_days * 86400:
            found.append(Violation(r, f"ends beyond {counted(new.booking_horizon_days, 'day')} from now"))
        if new.require_shared_memory and not old.require_shared_memory and r.mode == SHARED \
                and r.mem_mib is None:
            found.append(Violation(r, "is shared without a memory figure (-m), now required"))
    invalid = []
    if new.bound() != old.bound():
        before = set(check_invariants(live, (), old, gpu_mem))
        invalid = [p for p in check_invariants(live, (), new, gpu_mem) if p not in before]
    return found, invalid


def limit_violations(state: LedgerState, old: Policy, new: Policy, call: Call, gpu_mem: dict) -> list:
    """The live bookings the new per-user limits break that the old ones
    did not (``bk.core.limits.violations``), owner by owner."""
    from bk.core import limits as lim
    from bk.core.advance import held
    from bk.store.accounts import accounts

    now = call.now
    live = [r for r in state.reservations if r.status(now) not in (ENDED, CANCELLED)]
    owners = sorted({(r.uid, r.user) for r in live})
    groups = (new.limits and new.limits.uses_groups()) or (old.limits and old.limits.uses_groups())
    found = []
    by_id = {r.id: r for r in live}
    for uid, user in owners:
        g = accounts().groups_of(user) if groups else frozenset()
        mine = sorted((r for r in live if r.uid == uid), key=lambda r: (r.created, r.id))
        hs = [held(r, new, gpu_mem) for r in mine]
        was = {rid for rid, _ in lim.violations(lim.bounds_for(old.limits, user, g, admin=uid == 0), hs, now)}
        for rid, why in lim.violations(lim.bounds_for(new.limits, user, g, admin=uid == 0), hs, now):
            if rid not in was:
                found.append(Violation(by_id[rid], why))
    return found


def _plan(service, change: PolicyChange, *, call: Call) -> PolicyPlan:
    loc = service.settings.locations
    path = loc.config_file
    if not path:
        raise ConfigError("there is no configuration file to change",
                          hint="on a shared server: sudo bk admin init first")
    before = read_document(path)
    after = dict(before)
    count = call.policy.gpu_count
    if change.disable or change.enable:
        cur = set(service.settings["disabled_gpus"])
        both = set(change.disable) & set(change.enable)
        if both:
            raise InvalidInput(f"GPU {', '.join(map(str, sorted(both)))} is both disabled and enabled")
        new = sorted((cur | set(change.disable)) - set(change.enable))
        if len(new) >= count:
            raise InvalidInput("that would disable every GPU", hint="keep at least one enabled")
        after["disabled_gpus"] = new
    if change.priority:
        prio = {str(k): v for k, v in (service.settings["gpu_priority"] or {}).items()}
        prio.update({str(g): p for g, p in change.priority})
        after["gpu_priority"] = dict(sorted(prio.items(), key=lambda kv: int(kv[0])))
    for key, v in (("booking_horizon_days", change.horizon_days), ("max_booking_hours", change.max_hours),
                   ("require_shared_memory", change.require_memory),
                   ("shared_memory_reserve_mb", change.reserve_mb),
                   ("limit_exempt", list(change.exempt) if change.exempt is not None else None),
                   ("advance_default", change.advance_default), ("fair_share", change.fair_share),
                   ("fair_share_half_life_days", change.half_life_days)):
        if v is not None:
            after[key] = v
    if change.limits:
        rules = {w: dict(spec) for w, spec in (service.settings["limits"] or {}).items()}
        for who, name, v in change.limits:
            spec = rules.setdefault(who, {})
            if v == UNSET:
                spec.pop(name, None)
            else:
                spec[name] = v
        after["limits"] = {w: spec for w, spec in rules.items() if spec}
    if change.tiers:
        tiers = {t: list(m) for t, m in (service.settings["limit_tiers"] or {}).items()}
        for name, members in change.tiers:
            if members is None:
                tiers.pop(name, None)
            else:
                tiers[name] = list(members)
        after["limit_tiers"] = tiers
    from bk.store.config import KEYS, check_value, parse_document

    for key in change.touched():
        try:
            after[key] = check_value(KEYS[key], after[key], "the new policy")
        except ConfigError as e:
            # A bad flag value is a usage error (exit 2) about the flag,
            # not a broken configuration (78): nothing was written.
            if key in ("limits", "limit_tiers", "limit_exempt"):
                raise InvalidInput(f"{FLAGS[key]}: {e.message.removeprefix('the new policy: ')}",
                                   hint="see: bk help admin gpu-policy, man 5 gpubk-config") from None
            raise InvalidInput(f"{FLAGS[key]} must be {e.details.get('expected', 'valid')}, got "
                               f"{json.dumps(after[key])}", hint=f"see: bk help admin gpu-policy (it sets "
                               f"{key}, man 5 gpubk-config)") from None
    # Drop values equal to what the file already says, so the diff is real.
    values = {**service.settings.values}
    wanted = {**values, **parse_document(after, path, allow_security=loc.config_is_system)}
    diff = tuple((k, _show(values[k]), _show(wanted[k])) for k in sorted(change.touched())
                 if not same(_show(values[k]), _show(wanted[k])))
    if not diff:
        after = before
    old = call.policy
    from bk.store.config import Settings

    new_rules = Settings(loc, wanted, path).limit_rules()
    new = replace(old, disabled_gpus=frozenset(wanted["disabled_gpus"]),
                  gpu_priority=tuple(sorted((int(g), p) for g, p in wanted["gpu_priority"].items())),
                  booking_horizon_days=wanted["booking_horizon_days"],
                  max_booking_hours=wanted["max_booking_hours"],
                  require_shared_memory=wanted["require_shared_memory"],
                  shared_memory_reserve_mb=wanted["shared_memory_reserve_mb"],
                  limits=new_rules, advance_default=wanted["advance_default"],
                  fair_share_half_life_s=(int(wanted["fair_share_half_life_days"] * 86400)
                                          if wanted["fair_share"] else None))
    state = service.ledger(call=call)
    try:
        mem = call.gpu_mem()
    except Exception:      # noqa: BLE001  (no inventory: memory is not checked)
        mem = {}
    found, invalid = violations(state, old, new, call.now, mem)
    if {"limits", "limit_tiers", "limit_exempt"} & change.touched():
        found += limit_violations(state, old, new, call, mem)
    return PolicyPlan(path, loc.config_is_system, before, after, diff, state.policy, new.bound(),
                      tuple(found), tuple(invalid))


def write_config(p: PolicyPlan) -> None:
    """Step 2 of the module essay: replace the configuration atomically,
    trust-checked before it takes the name."""
    from bk.store.config import check_trusted
    from bk.store.fsutil import Safety, open_dir, replace_file

    directory, name = os.path.split(p.config_file)
    data = (json.dumps(p.after, indent=2, sort_keys=True) + "\n").encode()
    if p.trusted:
        dirfd = open_dir(directory, Safety(0))
        owner, check, mode = (0, 0), check_trusted, 0o644
    else:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        dirfd = open_dir(directory, Safety(os.geteuid()))
        owner, check, mode = None, None, 0o600
    if dirfd is None:
        raise ConfigError(f"{directory} disappeared", hint="inspect it and rerun")
    try:
        replace_file(dirfd, name, directory, data, mode, owner=owner, check=check)
    finally:
        os.close(dirfd)


def _bind(service, req: PolicyBindRequest, call: Call):
    """Step 3: the ``policy_bind`` row, through the broker while one
    answers, else on the host (the module essay).  Only a broker that is
    not there at all (no socket, nobody listening: nothing was sent) sends
    it to the host; any other failure is the caller's to report."""
    from bk.core.errors import Unavailable
    from bk.service.gateway import HostGateway

    try:
        return service.run(POLICY_BIND, req, call=call)
    except Unavailable as e:
        if not service.shared or e.details.get("reason") != "no_broker":
            raise
    service.gateway = HostGateway(service)
    return service.run(POLICY_BIND, req, call=call)


# ------------------------------------------------------------ the bind row

def apply_bind(state: LedgerState, req: PolicyBindRequest, call: Call) -> Mutation:
    """Bind the ledger to the host's configuration (step 3).  Run without
    the store's binding check (``Operation.rebinds``)."""
    from bk.core import ledgercheck

    wanted, host = req.bound(), call.policy.bound()
    if not same(wanted, host):
        diff = ", ".join(f"{k}={host[k]!r}" for k in wanted if not same(wanted[k], host[k]))
        raise ConfigError(f"the host's configuration says {diff}: the binding follows the configuration",
                          hint="change the configuration first: sudo bk admin gpu-policy ...")
    before = state.policy
    if before is not None and same({k: before.get(k) for k in wanted}, wanted):
        return Mutation(False, [], PolicyBindResult("unchanged", before, wanted))
    old = replace(call.policy, **{k: before[k] for k in Policy.BOUND_KEYS if k in (before or {})})
    new = replace(call.policy, **wanted)
    try:
        mem = call.gpu_mem()
    except Exception:      # noqa: BLE001
        mem = {}
    found, invalid = violations(state, old, new, call.now, mem)
    trial = state.copy()
    trial.policy = {**(before or {}), **wanted}
    invalid = invalid + ledgercheck.check_state(trial)
    if invalid:
        raise PolicyRefused("the ledger cannot hold its bookings under the new policy: " + "; ".join(invalid[:5]),
                            hint="cancel or move those bookings first (--force cannot override this)",
                            details={"problems": invalid})
    if found and not req.force:
        raise PolicyRefused(f"{counted(len(found), 'booking')} {'breaks' if len(found) == 1 else 'break'} the new policy: "
                            + "; ".join(f"{v.reservation.short_id} ({v.reservation.user}) {v.why}"
                                        for v in found[:10]),
                            hint="add --force to keep them as they are, or cancel them first",
                            details={"violations": [v.reservation.id for v in found]})
    forced = tuple(sorted({v.reservation.id for v in found}))
    result = PolicyBindResult("dry_run" if req.dry_run else "bound", before, wanted, forced)
    if req.dry_run:
        return Mutation(False, [], result)
    state.policy = trial.policy
    return Mutation(True, [AuditEntry(POLICY_BIND, "bound", before=before, after={
        **trial.policy, "forced": list(forced), "at": iso(call.now)})], result)


# ------------------------------------------------------------ the rows

@dataclass(frozen=True)
class PolicyView:
    """``bk admin gpu-policy``: the policy in force, the ledger's binding,
    and what a change (``change``; nothing touched: none) would do."""

    change: PolicyChange
    plan: PolicyPlan
    policy: dict                      # the policy in force, as a person reads it
    blackouts: int                    # maintenance windows now or ahead
    mismatch: dict                    # the binding's keys the configuration disagrees with
    mismatch_text: str                # the same, in words
    bound: bool                       # the ledger has a binding
    view: View

    @property
    def touched(self) -> set[str]:
        return self.change.touched()

    def plan_json(self) -> dict:
        p = self.plan
        return {"config_file": p.config_file,
                "changes": [{"key": k, "before": b, "after": a} for k, b, a in p.diff],
                "bound": p.bound_before, "binding_after": p.bound_after, "rebind": p.rebind(self.touched),
                "violations": [v.to_json(self.view) for v in p.violations], "invalid": list(p.invalid)}

    def shown_json(self) -> dict:
        return {"policy": self.policy, "blackouts": self.blackouts, "mismatch": self.mismatch}

    def to_json(self) -> dict:
        return {**self.plan_json(), **({} if self.touched else self.shown_json())}


def _serve_policy(service, req: PolicyChange, call: Call) -> PolicyView:
    from bk.core.policy import policy_diff

    plan = _plan(service, req, call=call)
    p = call.policy
    shown = {"gpu_count": p.gpu_count, "disabled_gpus": sorted(p.disabled_gpus),
             "gpu_priority": {str(g): v for g, v in p.gpu_priority}, "booking_horizon_days": p.booking_horizon_days,
             "max_booking_hours": p.max_booking_hours, "require_shared_memory": p.require_shared_memory,
             "shared_memory_reserve_mb": p.shared_memory_reserve_mb, "max_shared_users": p.max_shared_users,
             "slot_minutes": p.slot_minutes,
             **(p.limits.to_json() if p.limits else {"limits": {}, "limit_tiers": {}, "limit_exempt": []}),
             "advance_default": p.advance_default, "fair_share": p.fair_share_half_life_s is not None,
             "fair_share_half_life_days": service.settings["fair_share_half_life_days"]}
    state = service.ledger(call=call)
    diff = policy_diff(state.policy, p.bound()) if state.policy is not None else None
    return PolicyView(req, plan, shown, len([b for b in state.blackouts if b.end > call.now]),
                      diff.conflicts if diff else {}, diff.describe() if diff and diff.conflicts else "",
                      state.policy is not None, View.of(call))


@dataclass(frozen=True)
class PolicyWriteRequest:
    plan: PolicyPlan


@dataclass(frozen=True)
class PolicyWriteResult:
    config_file: str

    def to_json(self) -> dict:
        return {"config_file": self.config_file}


def _serve_policy_write(service, req: PolicyWriteRequest, call: Call) -> PolicyWriteResult:
    write_config(req.plan)
    return PolicyWriteResult(req.plan.config_file)


def _serve_rebind(service, req: PolicyBindRequest, call: Call) -> PolicyBindResult:
    return _bind(service, req, call)
