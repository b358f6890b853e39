"""``bk admin gpu-policy``: show the scheduling policy, or change it after
checking the live bookings against the new one.

Root only (exit 5) before anything is read; the write is a row of the
operation table, so on a shared server it travels through the broker.
"""

from __future__ import annotations

import argparse

from bk.cli.common import need_root
from bk.cli.render import Output, safe
from bk.core.errors import BkError
from bk.core.timegrid import counted

RAW = argparse.RawDescriptionHelpFormatter


# ------------------------------------------------------------- registration


def register_policy(actions) -> None:
    p = actions.add_parser(
        "gpu-policy", help="show or change the GPU policy: disabled GPUs, priorities, limits, per-user "
        "limits, advances, fair share, memory rule",
        description="Without options: the policy in force, and whether the ledger's binding agrees. "
        "With options: change the trusted configuration atomically and, when a key the ledger binds "
        "changes (the memory reserve or rule), the binding in the same step. A change that bookings "
        "still to run would break is refused and they are listed, unless --force. If it is "
        "interrupted between the two, running the same command again completes it. With the broker "
        "stopped, root binds the ledger itself, as the service account. Blackouts: "
        "bk admin maintain.",
        epilog="Examples:\n  sudo bk admin gpu-policy\n  sudo bk admin gpu-policy --disable 3 --dry-run\n"
               "  sudo bk admin gpu-policy --enable 3 --priority 3=1,2=5\n"
               "  sudo bk admin gpu-policy --max-hours 48 --horizon-days 14\n"
               "  sudo bk admin gpu-policy --require-memory --reserve-mb 1024 --force\n"
               "  sudo bk admin gpu-policy --limit '*:gpus=2' --dry-run\n"
               "  sudo bk admin gpu-policy --tier students=@students --limit students:booking_hours=4\n"
               "  sudo bk admin gpu-policy --advance-default on --fair-share on",
        formatter_class=RAW)
    p.add_argument("--disable", metavar="LIST", help="GPU indices never placed: 3 or 2,3")
    p.add_argument("--enable", metavar="LIST", help="GPU indices to place again")
    p.add_argument("--priority", metavar="MAP", help="placement preference, lower first: 3=1,2=5")
    p.add_argument("--horizon-days", metavar="N", type=int, help="bookings must end within N days")
    p.add_argument("--max-hours", metavar="N", type=int, help="the longest booking, in hours")
    mem = p.add_mutually_exclusive_group()
    mem.add_argument("--require-memory", dest="require_memory", action="store_const", const=True,
                     help="shared bookings must state their per-GPU memory (-m)")
    mem.add_argument("--no-require-memory", dest="require_memory", action="store_const", const=False,
                     help="shared bookings need not state memory")
    p.add_argument("--reserve-mb", metavar="MIB", type=int, help="VRAM per GPU kept out of the shared budget")
    p.add_argument("--limit", metavar="WHO:LIMIT=VALUE", action="append", default=[],
                   help="a per-user limit (repeatable): WHO is * (everyone), a user, a tier or an @group; "
                        "LIMIT gpus, gpu_hours, booking_hours, ahead_hours or shared_vram_gib; VALUE a "
                        "number, none (no limit) or unset (drop it)")
    p.add_argument("--tier", metavar="NAME=MEMBERS", action="append", default=[],
                   help="a named set of users and @groups for --limit (repeatable); NAME= removes it")
    p.add_argument("--exempt", metavar="LIST", help="users and @groups no limit applies to ('' for nobody)")
    p.add_argument("--advance-default", choices=("on", "off"),
                   help="queued bookings move earlier on their own unless booked with --no-advance")
    p.add_argument("--fair-share", choices=("on", "off"),
                   help="contested advances go in order of decayed past usage, not first come")
    p.add_argument("--half-life-days", metavar="DAYS", type=float, help="fair share's half-life (default 7)")
    p.add_argument("--force", action="store_true", help="change it even though bookings break the new rules")
    p.add_argument("--dry-run", action="store_true", help="show the diff and what it breaks; change nothing")
    p.set_defaults(handler=run_policy, command="admin gpu-policy")


def run_policy(args, ctx) -> Output:
    need_root("gpu-policy")
    from bk.service import builders

    app, call = ctx.app(), ctx.call()
    change = builders.policy_change(
        gpu_count=call.policy.gpu_count, disable=args.disable, enable=args.enable, priority=args.priority,
        horizon_days=args.horizon_days, max_hours=args.max_hours, require_memory=args.require_memory,
        reserve_mb=args.reserve_mb, limits=args.limit, tiers=args.tier, exempt=args.exempt,
        advance_default=args.advance_default, fair_share=args.fair_share, half_life_days=args.half_life_days)
    seen = app.run("policy", change, call=call)
    touched, plan = seen.touched, seen.plan
    data = {**seen.plan_json(), "dry_run": args.dry_run, "status": "shown"}
    if not touched:
        return _policy_show(seen, {**data, **seen.shown_json()})
    diff_text = "\n".join(f"  {k}: {_js(b)} -> {_js(a)}" for k, b, a in plan.diff) \
        or "  (the configuration already says so)"
    if args.dry_run:
        data["status"] = "dry_run"
        tail = "\n  and the ledger's binding with it" if data["rebind"] else ""
        broken = [f"{v.reservation.short_id} ({safe(v.reservation.user)}) {v.why}" for v in plan.violations]
        if broken:
            tail += "\n  bookings that break it (refused without --force):\n    " + "\n    ".join(broken)
        if plan.invalid:
            tail += "\n  refused even with --force: " + "; ".join(plan.invalid[:5])
        return Output("admin gpu-policy", data, f"would change {plan.config_file}:\n{diff_text}{tail}")
    if plan.invalid:
        from bk.core.errors import PolicyRefused

        raise PolicyRefused("the ledger cannot hold its bookings under that policy: " + "; ".join(plan.invalid[:5]),
                            hint="cancel or move those bookings first (--force cannot override this)")
    if plan.violations and not args.force:
        from bk.core.errors import PolicyRefused

        raise PolicyRefused(f"{counted(len(plan.violations), 'booking')} {'breaks' if len(plan.violations) == 1 else 'break'} the "
                            "new policy: " + "; ".join(f"{v.reservation.short_id} ({v.reservation.user}) {v.why}"
                                                       for v in plan.violations[:10]),
                            hint="add --force to keep them as they are, or cancel them first",
                            details={"violations": [v.reservation.id for v in plan.violations]})
    if plan.config_changes:
        from bk.service import PolicyWriteRequest

        app.run("policy_write", PolicyWriteRequest(plan), call=call)
    bound = None
    if data["rebind"]:
        # A fresh service: its call carries the policy the file now says,
        # which is what the bind row checks the request against.
        from bk.service import PolicyBindRequest, open_app

        opener = ctx.opener or open_app
        fresh = opener(ctx.env)
        fcall = fresh.call()
        req = PolicyBindRequest(**fcall.policy.bound(), force=args.force)
        try:
            bound = fresh.run("policy_rebind", req, call=fcall).to_json()
        except BkError as e:
            if not plan.config_changes:
                raise
            # The configuration is already the new one: say so, and how to
            # finish, rather than the row's own "nothing was changed".
            why = e.message.removesuffix("; nothing was changed")
            e.message = f"changed {plan.config_file}, but not the ledger's binding: {why}"
            e.hint = ("run the same command again to complete it (sudo bk admin gpu-policy shows the "
                      "mismatch)" + (f"; {e.hint}" if e.hint else ""))
            e.details = {**e.details, "config_changed": True}
            raise
    changed = plan.config_changes or (bound is not None and bound["status"] == "bound")
    data.update(status="changed" if changed else "unchanged", binding=bound)
    if not changed:
        return Output("admin gpu-policy", data, f"unchanged: {plan.config_file} and the ledger's binding "
                      "already say so")
    text = f"changed {plan.config_file}:\n{diff_text}"
    if bound:
        text += "\n  ledger binding: " + ", ".join(f"{k}={_js(v)}" for k, v in sorted(bound["after"].items()))
    if plan.violations:
        text += f"\n  kept against the new rules (--force): {', '.join(v.reservation.short_id for v in plan.violations)}"
    return Output("admin gpu-policy", data, text, done="changed the GPU policy")


def _js(v) -> str:
    import json

    return json.dumps(v, sort_keys=True)


def _policy_show(seen, data) -> Output:
    shown, mismatch = seen.policy, seen.mismatch

    def human(term) -> str:
        lines = [f"{k}: {_js(v)}" for k, v in shown.items()]
        if mismatch:
            lines.append("MISMATCH: the ledger's binding disagrees with the configuration: " + seen.mismatch_text)
            lines.append("hint: re-run the gpu-policy command that was interrupted, or set the previous values back")
        elif not seen.bound:
            lines.append("ledger binding: none yet (the first write records it)")
        else:
            lines.append("ledger binding: agrees")
        return "\n".join(lines)

    return Output("admin gpu-policy", data, human)
