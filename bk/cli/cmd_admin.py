"""``bk admin ...``: what the administrator runs with sudo.

``admin init`` sets up a shared server (``bk.admin.init`` plans and applies;
this module shows the plan and asks).  ``admin cancel`` and ``admin notice
publish`` are ordinary service calls: on a shared server they travel
through the broker, which grants them because the kernel says the caller is
UID 0, not because of anything this command sends.
"""

from __future__ import annotations

import argparse

from bk.cli import common
from bk.cli.common import need_root
from bk.cli.render import Output, safe, wrap
from bk.core.errors import EXIT_PARTIAL, UsageError
from bk.core.timegrid import counted
from bk.service import CancelRequest, ResolveRequest

INIT_EPILOG = """Examples:
  sudo bk admin init --service-user gpubk --gpu-count 8 --dry-run
  sudo bk admin init --service-user gpubk --gpu-count 8 --yes
  sudo bk admin init --service-user gpubk --gpu-count 8 --access group --group gpu-users --yes

It creates no accounts or groups: create them first
(useradd --system --no-create-home --shell /usr/sbin/nologin gpubk).
It writes the config last, and never over one that says something else.
Then start the broker as the service account: sudo -u gpubk bk broker. For
units that start it at boot, use sudo bk admin install instead (init plus
the archive, units, man pages and completion)."""


def register(sub) -> None:
    p = sub.add_parser("admin", help="administration (run with sudo): init, maintain, notice, gpu-policy, data",
                       description="Administration of a shared server. Run with sudo.",
                       epilog="Examples:\n  sudo bk admin init --service-user gpubk --gpu-count 8\n"
                              "  sudo bk admin cancel a1b2c3d4 --reason 'node maintenance'\n"
                              "  sudo bk admin notice publish 'Reboot at 18:00' --level warning --until 18:30\n"
                              "  sudo bk admin maintain --reason 'driver update' -d 2h --keep --yes\n"
                              "  sudo bk admin gpu-policy --disable 3\n"
                              "  sudo bk admin data backup",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(handler=_missing_action, command="admin")
    actions = p.add_subparsers(dest="admin_action", metavar="ACTION", parser_class=type(p))

    init = actions.add_parser("init", help="set up this server for shared mode",
                              description="Write the trusted configuration and create the data and "
                              "socket directories owned by the service account.",
                              epilog=INIT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    init.add_argument("--service-user", metavar="USER",
                      help="account that runs the broker and owns the data (default: the sudo invoker, "
                           "$SUDO_USER)")
    init.add_argument("--data-dir", metavar="DIR", default="/var/lib/gpubk",
                      help="data directory (default /var/lib/gpubk)")
    init.add_argument("--socket", metavar="PATH", default="/run/gpubk/broker.sock",
                      help="broker socket (default /run/gpubk/broker.sock)")
    init.add_argument("--access", choices=("all", "group"), default="all",
                      help="who may use the broker: all users (socket 0666) or one group (0660); default all")
    init.add_argument("--group", metavar="G", help="the group allowed with --access group")
    init.add_argument("--gpu-count", metavar="N", type=common.positive_int,
                      help="GPUs to schedule (default: detected)")
    init.add_argument("--simulated-gpus", metavar="N", type=common.positive_int,
                      help="a trial or CI server without GPUs: schedule N simulated GPUs on purpose "
                           "(gpu_count N, simulated_gpus true)")
    init.add_argument("--slot-minutes", metavar="M", type=common.positive_int,
                      help="slice length, a divisor of 60 (default 5)")
    init.add_argument("--max-shared-users", metavar="N", type=common.positive_int,
                      help="share slots per GPU (default 2)")
    init.add_argument("--config-file", metavar="PATH", default="/etc/gpubk/config.json",
                      help="where to write the trusted config (default /etc/gpubk/config.json; "
                           "clients find another one through BK_CONFIG_FILE)")
    init.add_argument("--dry-run", action="store_true", help="show the plan; change nothing")
    init.add_argument("-y", "--yes", action="store_true", help="apply without asking")
    init.set_defaults(handler=run_init, command="admin init")

    from bk.cli import cmd_install

    cmd_install.register_admin(actions, type(p))    # install, uninstall, services, login-hook
    from bk.cli import cmd_admin_cluster

    cmd_admin_cluster.register_admin(actions, type(p))  # cluster init|add|set|remove|...|status
    from bk.cli import cmd_enforce

    cmd_enforce.register_admin(actions, type(p))        # enforce on|off|status|run

    cancel = actions.add_parser("cancel", help="cancel anyone's booking, with a reason the owner sees",
                                description="Cancel a booking of any user. The reason is shown to the "
                                "owner in bk n and at login.",
                                epilog="Examples:\n  sudo bk admin cancel a1b2c3d4 --reason 'GPU 3 is failing'\n"
                                       "  sudo bk admin cancel a1b2 --reason maintenance --yes --json",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    cancel.add_argument("ref", metavar="ID", help="reservation ID or unique prefix (4+ characters)")
    cancel.add_argument("--reason", metavar="TEXT", required=True, help="why; the owner is told")
    cancel.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    common.add_write_flags(cancel)
    cancel.set_defaults(handler=run_cancel, command="admin cancel")

    notice = actions.add_parser("notice", help="announcements for every user",
                                description="Announcements every user sees in bk n and at login.")
    notice.set_defaults(handler=_missing_action, command="admin notice")
    nacts = notice.add_subparsers(dest="notice_action", metavar="ACTION", parser_class=type(p))
    from bk.cli import cmd_admin_data, cmd_admin_maintain, cmd_admin_notice, cmd_admin_policy

    cmd_admin_notice.register_notice(notice, nacts)
    pub = nacts.add_parser("publish", help="publish an announcement",
                           description="Publish an announcement for every user.",
                           epilog="Examples:\n  sudo bk admin notice publish 'Driver update tonight'\n"
                                  "  sudo bk admin notice publish 'Reboot at 18:00' --level warning --until 18:30\n"
                                  "  sudo bk admin notice publish 'Reboot at 18:00' --start 17:00 --until 18:30",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    pub.add_argument("text", metavar="TEXT", help="the announcement")
    pub.add_argument("--level", choices=("info", "warning", "critical"), default="info",
                     help="how loud it is (default info)")
    pub.add_argument("--until", metavar="TIME",
                     help="stop showing it then: +2h, 18:30, tomorrow 09:00, 2026-07-13T18:00Z "
                          "(default: until archived with bk admin notice archive)")
    pub.add_argument("--start", metavar="TIME", help="show it from then: 18:00, +1h, tomorrow 09:00 (default now)")
    pub.add_argument("--dry-run", action="store_true", help="show the announcement; publish nothing")
    pub.set_defaults(handler=run_notice_publish, command="admin notice publish")
    arc = nacts.add_parser("archive", help="withdraw an announcement or a notice",
                           description="Withdraw an announcement (or a notice to one user): users "
                                       "no longer see it; it stays in the ledger, archived, until "
                                       "retention drops it.",
                           epilog="Examples:\n  bk n --all                          find its ID\n"
                                  "  sudo bk admin notice archive 3f2a9c1b",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    arc.add_argument("ref", metavar="ID", help="the notice's ID or a prefix of 4+ characters")
    arc.add_argument("--dry-run", action="store_true", help="show the notice; change nothing")
    arc.set_defaults(handler=run_notice_archive, command="admin notice archive")

    data = actions.add_parser("data", help="the ledger's data: backup, verify, clear, restore, recover",
                              description="Look after the ledger's data.")
    data.set_defaults(handler=_missing_action, command="admin data")
    dacts = data.add_subparsers(dest="data_action", metavar="ACTION", parser_class=type(p))
    rec = dacts.add_parser(
        "recover", help="accept (or replay) commits the audit log has but the ledger lost",
        description="When the ledger was restored from an older backup, or lost with every backup, "
        "the audit log still records the newer commits and bk refuses to write over them. This "
        "shows what is missing (commit numbers, bookings, owners) and, confirmed, accepts that "
        "loss; with --replay it first rebuilds the lost bookings from the audit records (their "
        "GPUs, mode, share, memory and times; notes are not in the audit log). Put a newer copy "
        "of the ledger back instead if you have one. In private mode it is yours to run; on a "
        "shared server, the administrator's.",
        epilog="Examples:\n  bk admin data recover --dry-run       what is missing\n"
               "  bk admin data recover --replay -y     rebuild the lost bookings and go on\n"
               "  sudo bk admin data recover            on a shared server",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    rec.add_argument("--replay", action="store_true", help="rebuild the lost bookings from the audit log")
    rec.add_argument("-y", "--yes", action="store_true", help="do not ask")
    rec.add_argument("--dry-run", action="store_true", help="show what is missing; change nothing")
    rec.set_defaults(handler=run_data_recover, command="admin data recover")
    cmd_admin_data.register_data(dacts)
    cmd_admin_maintain.register_maintain(actions, type(p))
    cmd_admin_policy.register_policy(actions)


def _missing_action(args, ctx) -> Output:
    raise UsageError("which action?", hint="see: bk help admin")


# ------------------------------------------------------------- init

def _plan_text(result, applied: bool) -> str:
    p = result.plan
    verbs = {"mkdir": "create", "adopt": "take over", "chmod": "set owner/mode", "write": "write",
             "keep": "keep"}
    import grp

    from bk.users import user_name

    lines = []
    for s in p.steps:
        owner = user_name(s.uid) or str(s.uid)
        try:
            group = grp.getgrgid(s.gid).gr_name
        except KeyError:
            group = str(s.gid)
        lines.append(f"  {verbs[s.action]:<14} {s.path}  ({owner}:{group} {s.mode:04o}; {s.why})")
    head = {"dry_run": "bk admin init would:", "created": "bk admin init did:",
            "unchanged": "bk admin init: everything is already in place:"}.get(result.status,
                                                                               "bk admin init plan:")
    if not applied and result.status != "dry_run":
        head = "bk admin init will:"
    tail = [f"service account: {p.service_user} (uid {p.service_uid}); access: {p.options.access}"
            + (f" (group {p.options.group})" if p.options.group else "")]
    if result.status in ("created", "unchanged"):
        tail.append(f"next: start the broker as {p.service_user}: sudo -u {p.service_user} "
                    f"BK_CONFIG_FILE={p.options.config_file} bk broker (or let sudo bk admin install set up units that start it at boot)")
        if p.options.socket.startswith("/run/"):
            tail.append("note: /run is emptied at boot; the units bk admin install writes "
                        "recreate the socket directory (RuntimeDirectory=)")
    return "\n".join([head, *lines, *tail])


def run_init(args, ctx) -> Output:
    from bk.admin import init

    gpu_count, simulated = common.simulated_gpu_count(args.gpu_count, args.simulated_gpus)
    options = init.Options(service_user=args.service_user, data_dir=args.data_dir, socket=args.socket,
                           access=args.access, group=args.group, gpu_count=gpu_count,
                           slot_minutes=args.slot_minutes, max_shared_users=args.max_shared_users,
                           config_file=args.config_file, simulated_gpus=simulated)
    plan = init.plan(options, ctx.env)
    if args.dry_run:
        result = init.dry_run(plan)
        return Output("admin init", result.to_json(), lambda term: _plan_text(result, False))
    need_root("init")
    if plan.changes and not args.yes:
        if not ctx.interactive:
            raise UsageError("bk admin init changes the system; confirm with --yes",
                             hint="review first with: sudo bk admin init --dry-run ...")
        print(_plan_text(init.dry_run(plan), False).replace("would:", "will:"))
        if not ctx.confirm("Apply this plan?"):
            data = init.dry_run(plan).to_json() | {"status": "declined"}
            return Output("admin init", data, "nothing changed", exit_code=EXIT_PARTIAL)
    result = init.apply(plan)
    done = "bk admin init applied its plan" if result.status == "created" else None
    return Output("admin init", result.to_json(), lambda term: _plan_text(result, True), done=done)


# ------------------------------------------------------------- cancel

def run_cancel(args, ctx) -> Output:
    need_root("cancel")
    if not args.reason.strip():
        raise UsageError("--reason must say something; the owner reads it", hint="--reason 'maintenance'")
    app, call = ctx.app(), ctx.call()
    found = app.run("resolve", ResolveRequest(args.ref, any_owner=True), call=call)
    res = found.reservation
    now, tz = call.now, call.tz
    who = safe(res.user)
    line = f"{who}'s " + common.summary_line(res, capacity=call.policy.max_shared_users, tz=tz, now=now)
    if not args.yes and not args.dry_run:
        if not ctx.interactive:
            raise UsageError(f"confirm cancelling {line} with --yes", hint="add --yes (or -y)")
        if not ctx.confirm(f"Cancel {line}? {who} will be told: {safe(args.reason.strip())}"):
            data = {"status": "kept", "reservation": found.to_json()["reservation"], "dry_run": False}
            return Output("admin cancel", data, f"kept {line}", exit_code=EXIT_PARTIAL)
    result = app.run("cancel", CancelRequest(ref=res.id, reason=args.reason.strip(), op_id=args.op_id,
                                             dry_run=args.dry_run), call=call)
    got = result.to_json()
    data = {"status": got["status"], "reservation": got["reservation"], "reason": args.reason.strip(),
            "dry_run": got["dry_run"]}

    def human(term) -> str:
        verb = "would cancel" if result.dry_run else \
            "already cancelled (same --op-id)" if result.status == "exists" else "cancelled"
        told = "" if result.dry_run or res.uid == 0 else f"; {who} will see the reason in bk n"
        return wrap(f"{verb} {line}{told}", term.width, "", "  ")

    return Output("admin cancel", data, human, done=None if result.dry_run else f"cancelled {res.short_id}")


# ------------------------------------------------------------- notice

def run_notice_publish(args, ctx) -> Output:
    from bk.core import timegrid
    from bk.service import NoticeRequest

    need_root("notice publish")
    app, call = ctx.app(), ctx.call()
    now, tz = call.now, call.tz
    until = start = None
    if args.until is not None:
        from bk.cli.common import time_ahead

        until = time_ahead(args.until, "--until", now, tz)
    if args.start is not None:
        start = timegrid.parse_start(args.start, now, tz, 1).t
    result = app.run("notice_publish", NoticeRequest(args.text, level=args.level, until=until,
                                                     dry_run=args.dry_run, start=start), call=call)
    notice = result.notice
    shown_until = f", until {timegrid.format_local(until, tz, now=now, compact=True)}" if until else ""
    if notice.at > now:
        shown_until = f", from {timegrid.format_local(notice.at, tz, now=now, compact=True)}" + shown_until

    def human(term) -> str:
        verb = "would publish" if args.dry_run else "published"
        return wrap(f"{verb} {notice.level} announcement {notice.id[:8]}{shown_until}: {safe(notice.text)}",
                    term.width, "", "  ")

    done = None if args.dry_run else f"published notice {notice.id[:8]}"
    return Output("admin notice publish", result.to_json(), human, done=done)


def run_notice_archive(args, ctx) -> Output:
    from bk.service import NoticeArchiveRequest

    need_root("notice archive")
    app, call = ctx.app(), ctx.call()
    result = app.run("notice_archive", NoticeArchiveRequest(args.ref, dry_run=args.dry_run), call=call)
    notice = result.notice
    verb = "would archive" if args.dry_run else "archived"

    def human(term) -> str:
        return wrap(f"{verb} {notice.level} notice {notice.id[:8]}: {safe(notice.text)}", term.width, "", "  ")

    done = None if args.dry_run or result.status == "unchanged" else f"archived notice {notice.id[:8]}"
    return Output("admin notice archive", result.to_json(), human, done=done)


# ------------------------------------------------------------- data

def run_data_recover(args, ctx) -> Output:
    from bk.service import Empty, RecoverRequest

    app, call = ctx.app(), ctx.call()
    lost = app.run("data_lost", Empty(), call=call)
    what = _lost_text(lost)
    if lost.status == "nothing_lost" or args.dry_run:
        return Output("admin data recover", lost.to_json(), what)
    if not args.yes:
        if not ctx.interactive:
            raise UsageError("confirm accepting the loss with --yes", hint="add -y, or --dry-run to look first")
        verb = "replay what the audit log holds and accept the rest" if args.replay else "accept this loss"
        if not ctx.confirm(f"{what}\n{verb}?"):
            return Output("admin data recover", lost.to_json(), "nothing changed", exit_code=EXIT_PARTIAL)
    done = app.run("data_recover", RecoverRequest(lost.ledger_seq, lost.audit_seq, replay=args.replay), call=call)

    def human(term) -> str:
        head = f"recovered: writes go on from commit {done.audit_seq + 1}"
        if done.replayed:
            head += f"; replayed {counted(len(done.replayed), 'booking')}"
        left = [b for b in done.bookings if b.reservation not in done.replayed]
        if left:
            head += f"; lost for good: {', '.join(b.reservation[:8] for b in left)}"
        return wrap(head, term.width, "", "  ")

    return Output("admin data recover", done.to_json(), human)


def _lost_text(lost) -> str:
    if lost.status == "nothing_lost":
        return f"nothing is lost: the ledger has every commit the audit log records ({lost.audit_seq})"
    books = ", ".join(f"{b.reservation[:8]} ({b.user or b.owner}, last {b.action})"
                      for b in lost.bookings) or "no bookings"
    return (f"the ledger reads at commit {lost.ledger_seq}; the audit log records commits "
            f"{lost.ledger_seq + 1}-{lost.audit_seq}: {books}")
