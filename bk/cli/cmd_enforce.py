"""``bk admin enforce on|off|status|run``: opt-in hard enforcement, GPU
device access follows the bookings (issue 31).

The mechanism lives in ``bk.enforce`` (imported only when one of these
commands runs); this module parses the flags and renders the plans.
"""

from __future__ import annotations

import argparse

from bk.cli.render import Output, safe, wrap
from bk.core.errors import EXIT_PARTIAL, UsageError

EPILOG = """Examples:
  sudo bk admin enforce on --dry-run        who would lose which GPUs right now
  sudo bk admin enforce on --yes            turn it on (fail open)
  sudo bk admin enforce on --failure closed --signal --grace 60 --yes
  bk admin enforce status                   is it on, and working?
  sudo bk admin enforce off --yes           detach every program, stop the enforcer

While enforcement is on, a user's processes (everything in user-UID.slice,
and containers credited to the user) may open /dev/nvidiaN and the MIG
capability nodes of GPU N only while the user holds a booking on GPU N;
nvidiactl, nvidia-uvm, nvidia-modeset and every other device stay open.
Root, the service and monitor accounts and enforce_bypass are never
restricted. The kernel checks at open time: a process that opened a GPU
before its booking ended keeps it (bk st shows it as unreserved; --signal
sends it SIGTERM, then SIGKILL after --grace seconds). See gpubk-config(5)
for the enforce_* keys and docs/SECURITY.md for what this cannot stop."""

ON_EPILOG = """Examples:
  sudo bk admin enforce on --dry-run
  sudo bk admin enforce on --yes
  sudo bk admin enforce on --failure closed --yes
  sudo bk admin enforce on --signal --grace 60 --bypass alice,1002 --yes

It writes enforce=true (and the options given) into the trusted
configuration, then enables and restarts gpubk-enforcer.service and waits
until it reports 'enforcing'. Without systemd it says how to start the
enforcer (bk admin enforce run, as root)."""

OFF_EPILOG = """Examples:
  sudo bk admin enforce off --dry-run
  sudo bk admin enforce off --yes

It writes enforce=false, stops and disables gpubk-enforcer.service (or
sends the running enforcer SIGTERM), detaches every gpubk device program
still attached anywhere and counts again: it fails unless none is left."""


def _grace(text: str) -> int:
    from bk.core.errors import InvalidInput

    if not text.isdigit() or not 1 <= int(text) <= 3600:
        raise InvalidInput(f"--grace: expected whole seconds between 1 and 3600, got {text!r}")
    return int(text)


def register_admin(actions, parser_class) -> None:
    p = actions.add_parser("enforce", help="opt-in hard enforcement: GPU device access follows bookings",
                           description="Hard enforcement through cgroup v2 device programs: while it is on, "
                           "a user's processes may open a GPU only while the user holds a booking on it. "
                           "Off by default.",
                           epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(handler=_missing, command="admin enforce")
    acts = p.add_subparsers(dest="enforce_action", metavar="ACTION", parser_class=parser_class)
    on = acts.add_parser("on", help="turn enforcement on (shows who would lose which GPUs first)",
                         description="Turn hard enforcement on: write enforce=true into the trusted "
                         "configuration, then start gpubk-enforcer.service.",
                         epilog=ON_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    on.add_argument("--failure", choices=("open", "closed"),
                    help="when the enforcer dies or cannot read the ledger: every GPU opens (open) or no "
                         "managed GPU does (closed); default: as configured (enforce_failure, open)")
    on.add_argument("--signal", dest="signal", action="store_true", default=None,
                    help="SIGTERM processes that keep a GPU open without a booking, SIGKILL after the grace")
    on.add_argument("--no-signal", dest="signal", action="store_false", help="never signal processes")
    on.add_argument("--grace", metavar="SECONDS", type=_grace,
                    help="seconds between SIGTERM and SIGKILL (enforce_signal_grace_seconds, default 30)")
    on.add_argument("--bypass", metavar="USERS", action="append",
                    help="users (names or UIDs, comma-separated) never restricted; replaces enforce_bypass")
    on.add_argument("--dry-run", action="store_true", help="show the plan; change nothing")
    on.add_argument("-y", "--yes", action="store_true", help="apply without asking")
    on.set_defaults(handler=run_on, command="admin enforce on")
    off = acts.add_parser("off", help="turn enforcement off: no program stays attached",
                          description="Turn hard enforcement off: write enforce=false, stop the enforcer "
                          "and detach every gpubk device program.",
                          epilog=OFF_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    off.add_argument("--dry-run", action="store_true", help="show what would be detached; change nothing")
    off.add_argument("-y", "--yes", action="store_true", help="apply without asking")
    off.set_defaults(handler=run_off, command="admin enforce off")
    st = acts.add_parser("status", help="is enforcement on and working (read-only, anyone)",
                         description="Show the configuration, the kernel's support, the enforcer's state, "
                         "the cgroups it governs with the GPUs each may open now, and recent events "
                         "(yours; everyone's for root). As root, also the programs the kernel holds.",
                         epilog="Examples:\n  bk admin enforce status\n  sudo bk admin enforce status --json",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    st.set_defaults(handler=run_status, command="admin enforce status")
    run = acts.add_parser("run", help="the enforcer itself, in the foreground (systemd runs it)",
                          description="Run the enforcer until SIGTERM: keep one device program on every "
                          "governed cgroup. gpubk-enforcer.service runs it as root; it refuses to run "
                          "while enforce is false (exit 78), as anyone but root (77), or beside another "
                          "enforcer (75).",
                          epilog="Examples:\n  sudo systemctl start gpubk-enforcer\n  sudo bk admin enforce run",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    # Tests shorten the lease (default 60 s) to see it run out.
    run.add_argument("--lease", type=int, default=None, help=argparse.SUPPRESS)
    run.set_defaults(handler=run_daemon, command="admin enforce run")


def _missing(args, ctx) -> Output:
    raise UsageError("bk admin enforce needs an action: on, off, status or run",
                     hint="bk admin enforce status")


def _settings(ctx):
    from bk.enforce import daemon

    return daemon.settings_for(ctx.env)


def _who(uid: int, name: str | None) -> str:
    return f"{safe(name)} (uid {uid})" if name else f"uid {uid}"


def _gpus(gs) -> str:
    if not gs:
        return "none"
    return ("GPU " if len(gs) == 1 else "GPUs ") + ", ".join(str(g) for g in gs)


def plan_lines(plan: list[dict], signal: bool) -> list[str]:
    if not plan:
        return ["  nobody: no user slice or credited container exists now"]
    out = []
    for u in plan:
        where = ", ".join(safe(c) for c in u["cgroups"]) or "no governed cgroup"
        out.append(f"  {_who(u['uid'], u['user'])}: keeps {_gpus(u['keeps'])}, loses {_gpus(u['loses'])}"
                   f"  ({where})")
        for h in u["holding"]:
            what = "would get SIGTERM, then SIGKILL" if signal else "keeps it (no --signal)"
            out.append(f"      pid {h['pid']} {safe(h['label'] or '?')} holds GPU {h['gpu']} with no booking: {what}")
    return out


def run_on(args, ctx) -> Output:
    from bk import clock
    from bk.enforce import admin

    settings = _settings(ctx)
    changes = {}
    if args.failure:
        changes["enforce_failure"] = args.failure
    if args.signal is not None:
        changes["enforce_signal"] = args.signal
    if args.grace is not None:
        changes["enforce_signal_grace_seconds"] = args.grace
    if args.bypass is not None:
        changes["enforce_bypass"] = admin.parse_bypass(args.bypass)
    signal_on = changes.get("enforce_signal", settings["enforce_signal"])
    plan = admin.turn_on(settings, changes, now=clock.now(), dry_run=True)
    text = lambda data: _on_text(data, signal_on)   # noqa: E731
    if args.dry_run:
        return Output("admin enforce on", plan, lambda term: text(plan))
    admin.need_root("on")
    declined = _unconfirmed(args, ctx, "on", "changes who may open which GPU", plan, text(plan))
    if declined:
        return declined
    done = admin.turn_on(settings, changes, now=clock.now(), dry_run=False)
    code = 0 if done["enforcer"] in (None, "enforcing") and not done["problems"] else EXIT_PARTIAL
    return Output("admin enforce on", done, lambda term: text(done), exit_code=code,
                  done="enforcement turned on")


def _unconfirmed(args, ctx, verb: str, effect: str, plan: dict, shown: str) -> Output | None:
    """The answer when ``bk admin enforce VERB`` is not confirmed (None: go
    on): ``--yes`` confirms, a terminal is shown the plan and asked, and no
    terminal is a usage error saying what the command would change."""
    if args.yes:
        return None
    if not ctx.interactive:
        raise UsageError(f"bk admin enforce {verb} {effect}; confirm with --yes",
                         hint=f"review first with: sudo bk admin enforce {verb} --dry-run")
    print(shown)
    if ctx.confirm(f"Turn enforcement {verb}?"):
        return None
    return Output(f"admin enforce {verb}", plan | {"status": "declined"}, "nothing changed", exit_code=EXIT_PARTIAL)


def _on_text(d: dict, signal_on: bool) -> str:
    head = "bk admin enforce on would:" if d["dry_run"] else "bk admin enforce on:"
    lines = [head, *("  " + s for s in d["steps"])]
    k = d["kernel"]
    lines.append("kernel: " + ("ok, " if k.get("ok") else "NOT SUPPORTED, " if k.get("ok") is False else "")
                 + safe(k.get("detail") or ""))
    lines.append(f"cgroup v2: {safe(d['cgroup_root'] or 'not mounted')}")
    lines.append("right now, with enforcement on:" if d["dry_run"] else "now:")
    lines += plan_lines(d["plan"], signal_on)
    for u in d["uncredited"]:
        lines.append(f"  container {safe(u['cgroup'])}: credited to nobody ({safe(u['why'])}), not governed")
    for a in d["actions"]:
        if a["rc"] != 0:
            lines.append(f"warning: {a['command']} failed: {safe(a['stderr'])}")
    if not d["dry_run"]:
        if d["systemd"]:
            lines.append(f"enforcer: {d['enforcer']}")
        else:
            lines.append("systemd is not running here: start the enforcer as root with: bk admin enforce run")
    lines += [f"problem: {safe(p)}" for p in d["problems"]]
    return "\n".join(lines)


def run_off(args, ctx) -> Output:
    from bk.enforce import admin

    settings = _settings(ctx)
    plan = admin.turn_off(settings, dry_run=True)
    if args.dry_run:
        return Output("admin enforce off", plan, lambda term: _off_text(plan))
    admin.need_root("off")
    declined = _unconfirmed(args, ctx, "off", "opens every GPU to everyone", plan, _off_text(plan))
    if declined:
        return declined
    done = admin.turn_off(settings, dry_run=False)
    return Output("admin enforce off", done, lambda term: _off_text(done),
                  exit_code=EXIT_PARTIAL if done["problems"] else 0, done="enforcement turned off")


def _off_text(d: dict) -> str:
    head = "bk admin enforce off would:" if d["dry_run"] else "bk admin enforce off:"
    lines = [head, *("  " + s for s in d["steps"])]
    if d["attached"] is not None:
        lines.append(f"attached now: {len(d['attached'])} gpubk programs")
        for a in d["attached"]:
            lines.append(f"  {safe(a['cgroup'])}: {safe(a['name'])} ({'link' if a['link'] else 'attached'})")
    if not d["dry_run"]:
        lines.append(f"detached {d['detached']}; left attached: {len(d['left'] or [])}")
    lines += [f"problem: {safe(p)}" for p in d["problems"]]
    return "\n".join(lines)


def run_status(args, ctx) -> Output:
    from bk import clock
    from bk.enforce import admin

    settings = _settings(ctx)
    d = admin.status(settings, now=clock.now())
    return Output("admin enforce status", d, lambda term: _status_text(d, term.width),
                  exit_code=0 if d["verdict"]["ok"] else EXIT_PARTIAL)


def _status_text(d: dict, width: int) -> str:
    v = d["verdict"]
    lines = [("ok: " if v["ok"] else "FAIL: ") + safe(v["detail"])]
    if v["fix"]:
        lines.append(f"  fix: {safe(v['fix'])}")
    lines.append(f"enforce: {'on' if d['enforce'] else 'off'}; on failure: {d['failure']}; signal: "
                 + (f"on, {d['grace_s']} s grace" if d["signal"] else "off"))
    k = d["kernel"]
    lines.append("kernel: " + safe(k.get("detail") or "?"))
    lines.append(f"cgroup v2: {safe(d['cgroup_root'] or 'not mounted')}; enforcer: {d['enforcer']}")
    doc = d["status"] or {}
    for t in doc.get("targets") or []:
        lines.append(f"  {safe(t['cgroup'])}: {_who(t['uid'], t.get('user'))} may open {_gpus(t['gpus'])}"
                     + ("" if t.get("attached") else " (NOT ATTACHED)"))
    for u in doc.get("uncredited") or []:
        lines.append(f"  {safe(u['cgroup'])}: a container credited to nobody ({safe(u['why'])}), not governed")
    if d["attached"] is not None:
        lines.append(f"kernel holds {len(d['attached'])} gpubk programs")
    for e in d["events"][-10:]:
        bits = [e.get("time", "?"), e.get("event", "?")]
        if e.get("uid") is not None:
            bits.append(_who(e["uid"], e.get("user")))
        if e.get("pid") is not None:
            bits.append(f"pid {e['pid']} {e.get('label') or ''} GPU {e.get('gpu')}".strip())
        if e.get("cgroup"):
            bits.append(e["cgroup"])
        if e.get("detail"):
            bits.append(e["detail"])
        lines.append(wrap("  " + safe(" ".join(str(b) for b in bits)), width, "", "    "))
    return "\n".join(lines)


def run_daemon(args, ctx) -> Output:
    from bk.enforce import daemon

    if args.lease is not None and not 3 <= args.lease <= 3600:
        raise UsageError("--lease: between 3 and 3600 seconds")
    stats = daemon.run(ctx.env, lease_s=args.lease)
    return Output("admin enforce run", {"stopped": True, "passes": stats.passes, "detached": stats.detached,
                                        "pid": stats.pid}, None)
