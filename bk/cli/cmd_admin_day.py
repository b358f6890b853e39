"""The administrator's day-to-day commands: ``bk admin maintain``,
``notice`` (guided, list, edit), ``gpu-policy`` and ``data
backup|verify|clear|restore``.

Registered into the ``bk admin`` group by ``bk.cli.cmd_admin``.  Every one
refuses a caller who is not root (exit 5) before it reads anything; the
writes are rows of the operation table, so on a shared server they travel
through the broker, which grants them because the kernel says the caller is
UID 0.  The data commands work on the files themselves and run here.
"""

from __future__ import annotations

import argparse

from bk.cli.render import Output, safe, wrap
from bk.core.errors import EXIT_PARTIAL, BkError, PermissionDenied, UsageError
from bk.core.timegrid import counted

RAW = argparse.RawDescriptionHelpFormatter


def need_root(what: str) -> None:
    import os

    if os.geteuid() != 0:
        raise PermissionDenied(f"bk admin {what} is for the administrator (root)",
                               hint=f"sudo bk admin {what} ...")


def _when(t: int, call) -> str:
    from bk.core import timegrid

    return timegrid.format_local(t, call.tz, now=call.now, compact=True)


def _window(args, call) -> tuple[int, int]:
    from bk.core import timegrid

    slot = call.policy.slot_minutes
    start = timegrid.parse_start(args.start or "now", call.now, call.tz, slot).t
    return start, start + timegrid.parse_duration(args.duration or "2h", slot)


# ------------------------------------------------------------- registration

def register_maintain(actions, parser_class) -> None:
    m = actions.add_parser(
        "maintain", help="a maintenance window: announce it and block new bookings in it",
        description="Open a maintenance window: an announcement every user sees (bk n, at login) and, "
        "unless --no-block, a blackout that refuses new bookings in the window. Running processes are "
        "never stopped. Bookings already in the window are listed with their owners; keep them "
        "(--keep) or cancel them (--cancel-overlapping: the owners are told the reason). Without "
        "flags at a terminal it asks, one question at a time. Defaults: now, 2 h, level warning.",
        epilog="Examples:\n  sudo bk admin maintain                                   guided\n"
               "  sudo bk admin maintain --reason 'driver update' -d 3h -t 18:00 --keep --yes\n"
               "  sudo bk admin maintain --reason reboot --cancel-overlapping --yes --json\n"
               "  sudo bk admin maintain list\n  sudo bk admin maintain end 3f2a9c1b",
        formatter_class=RAW)
    m.add_argument("words", nargs="*", metavar="list|end ID", help="list the windows, or end one now")
    m.add_argument("-t", "--at", dest="start", metavar="TIME",
                   help="when it begins: now, 18:00, +1h, tomorrow 09:00 (default now)")
    m.add_argument("--start", dest="start", metavar="TIME", help="the same as -t")
    m.add_argument("-d", "--duration", metavar="DUR", help="how long: 2h, 90m, 1d (default 2h)")
    m.add_argument("--reason", metavar="TEXT", help="why; every user reads it")
    m.add_argument("--level", choices=("info", "warning", "critical"), default=None,
                   help="how loud the announcement is (default warning)")
    m.add_argument("--no-block", action="store_true", help="announce only; new bookings are not refused")
    g = m.add_mutually_exclusive_group()
    g.add_argument("--keep", action="store_true", help="bookings already in the window run on")
    g.add_argument("--cancel-overlapping", action="store_true",
                   help="cancel the bookings already in the window (their owners are told the reason)")
    m.add_argument("--all", action="store_true", help="list: past windows too")
    m.add_argument("-y", "--yes", action="store_true", help="do not ask")
    m.add_argument("--dry-run", action="store_true", help="show the window and what it overlaps; change nothing")
    m.set_defaults(handler=run_maintain, command="admin maintain")


def register_notice(notice, nacts) -> None:
    notice.set_defaults(handler=run_notice_guided, command="admin notice")
    lst = nacts.add_parser("list", help="every announcement, archived ones too",
                           description="Announcements and notices with their level, start, expiry and "
                                       "state; archived ones say who archived them and when.",
                           epilog="Examples:\n  sudo bk admin notice list\n  sudo bk admin notice list --json",
                           formatter_class=RAW)
    lst.set_defaults(handler=run_notice_list, command="admin notice list")
    ed = nacts.add_parser("edit", help="change an announcement's text, level or expiry",
                          description="Change an announcement. The audit log keeps what it said before "
                                      "(bk lg --all).",
                          epilog="Examples:\n  sudo bk admin notice edit 3f2a9c1b --text 'Reboot moved to 19:00'\n"
                                 "  sudo bk admin notice edit 3f2a --level critical --until 20:00",
                          formatter_class=RAW)
    ed.add_argument("ref", metavar="ID", help="the notice's ID or a prefix of 4+ characters")
    ed.add_argument("--text", metavar="TEXT", help="the new text")
    ed.add_argument("--level", choices=("info", "warning", "critical"), help="the new level")
    u = ed.add_mutually_exclusive_group()
    u.add_argument("--until", metavar="TIME", help="the new expiry: +2h, 18:30, tomorrow 09:00")
    u.add_argument("--no-until", action="store_true", help="shown until archived")
    ed.add_argument("--dry-run", action="store_true", help="show the change; change nothing")
    ed.set_defaults(handler=run_notice_edit, command="admin notice edit")


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


def register_data(dacts) -> None:
    b = dacts.add_parser("backup", help="copy the data directory, with a checksummed manifest",
                         description="Copy the ledger, its backups, the archive, the audit log and the "
                         "usage history (bk's files only; others are named and left out) into DIR, which it "
                         "creates 0700 (an existing DIR must be root's, 0700 and empty; every directory above "
                         "it only root's to change), with manifest.json: the bk version and a SHA-256 per "
                         "file. The services may run: it holds the writers' lock meanwhile. A backup that "
                         "fails (a full disk) is removed.",
                         epilog="Examples:\n  sudo bk admin data backup\n"
                                "  sudo bk admin data backup /srv/backup/gpubk-2026-07-13",
                         formatter_class=RAW)
    b.add_argument("dir", nargs="?", metavar="DIR",
                   help="where (default: DATA_DIR-backups/STAMP next to the data directory)")
    b.add_argument("--dry-run", action="store_true", help="say where; copy nothing")
    b.set_defaults(handler=run_data_backup, command="admin data backup")
    v = dacts.add_parser("verify", help="check every file of a backup against its manifest",
                         description="Check every checksum of a backup; exit 1 naming each file that is "
                                     "missing, changed, not in the manifest, or not a file bk keeps. A backup "
                                     "anyone but root could have changed (a directory or file not root's, or "
                                     "writable by group or others, or below such a directory) is refused "
                                     "(exit 78).",
                         epilog="Examples:\n  sudo bk admin data verify /var/lib/gpubk-backups/20260713T180000Z",
                         formatter_class=RAW)
    v.add_argument("dir", metavar="DIR")
    v.set_defaults(handler=run_data_verify, command="admin data verify")
    c = dacts.add_parser("clear", help="back up, then empty the data directory (services stopped)",
                         description="Back up the data directory (and verify the copy), then remove "
                         "everything in it. The services must be stopped: the broker must not answer on "
                         "its socket and no process may hold a writer's lock (else exit 75).",
                         epilog="Examples:\n  sudo systemctl stop gpubk-broker gpubk-monitor\n"
                                "  sudo bk admin data clear --yes",
                         formatter_class=RAW)
    c.add_argument("--backup-dir", metavar="DIR", help="where the backup goes (default as for backup)")
    c.add_argument("-y", "--yes", action="store_true", help="do not ask")
    c.add_argument("--dry-run", action="store_true", help="say what would go; change nothing")
    c.set_defaults(handler=run_data_clear, command="admin data clear")
    r = dacts.add_parser("restore", help="restore a backup into an empty data directory",
                         description="Verify the backup, then copy it into the data directory, which must "
                         "be empty (bk admin data clear empties it): bk's files only, owned by the service "
                         "account (monitor/ and usage/ by the monitor account) with the modes bk gives them, "
                         "whatever the manifest says. The services must be stopped (else exit 75).",
                         epilog="Examples:\n  sudo bk admin data restore /var/lib/gpubk-backups/20260713T180000Z --yes",
                         formatter_class=RAW)
    r.add_argument("dir", metavar="DIR")
    r.add_argument("-y", "--yes", action="store_true", help="do not ask")
    r.add_argument("--dry-run", action="store_true", help="verify and say what would be restored")
    r.set_defaults(handler=run_data_restore, command="admin data restore")


# ------------------------------------------------------------- maintain

def _res_line(r, call) -> str:
    return f"{r.short_id} {safe(r.user)} GPU {','.join(map(str, r.gpus))} {_when(r.start, call)}-{_when(r.end, call)}"


def run_maintain(args, ctx) -> Output:
    need_root("maintain")
    words = list(args.words)
    if words and words[0] in ("list", "ls"):
        return _maintain_list(args, ctx)
    if words and words[0] == "end":
        if len(words) != 2:
            raise UsageError("which window?", hint="bk admin maintain end ID (IDs: bk admin maintain list)")
        return _maintain_end(words[1], args, ctx)
    if words:
        raise UsageError(f"unknown action {words[0]!r}", hint="bk admin maintain [list | end ID]")
    from bk.service import MaintainRequest

    app, call = ctx.app(), ctx.call()
    guided = ctx.interactive and not args.yes and args.reason is None
    if guided:
        args = _maintain_dialog(args, ctx, call)
    if not args.reason or not args.reason.strip():
        raise UsageError("say why with --reason; every user reads it", hint="--reason 'driver update'")
    start, end = _window(args, call)
    level = args.level or "warning"
    base = MaintainRequest(start, end, args.reason.strip(), level=level, block=not args.no_block,
                           overlapping="keep", dry_run=True)
    preview = app.run("blackout_add", base, call=call)
    over = preview.overlapping
    choice = "keep" if args.keep else "cancel" if args.cancel_overlapping else None
    if over and choice is None:
        listing = "\n".join("  " + _res_line(r, call) for r in over)
        if not ctx.interactive:
            raise UsageError(f"{counted(len(over), 'booking')} already in the window:\n{listing}",
                             hint="choose --keep (they run on) or --cancel-overlapping (their owners are told)")
        print(f"Bookings already in the window:\n{listing}")
        choice = "cancel" if ctx.confirm("Cancel them (their owners are told the reason)? "
                                         "No keeps them running") else "keep"
    choice = choice or "keep"
    req = MaintainRequest(start, end, args.reason.strip(), level=level, block=not args.no_block,
                          overlapping=choice, seen=",".join(r.id for r in over) or None, dry_run=args.dry_run)
    what = (f"{'block new bookings and announce' if not args.no_block else 'announce'} maintenance "
            f"{_when(start, call)} to {_when(end, call)} ({level}): {safe(args.reason.strip())}")
    if over:
        what += f"; {'cancel' if choice == 'cancel' else 'keep'} {counted(len(over), 'booking')}"
    if not args.yes and not args.dry_run:
        if not ctx.interactive:
            raise UsageError(f"confirm with --yes: {what}", hint="or look first with --dry-run")
        if not ctx.confirm(f"{what}?"):
            return Output("admin maintain", {**preview.to_json(), "status": "declined"}, "nothing changed",
                          exit_code=EXIT_PARTIAL)
    result = app.run("blackout_add", req, call=ctx.fresh_call() if guided else call)

    def human(term) -> str:
        verb = "would" if result.dry_run else "did"
        lines = [wrap(f"{verb}: {what}", term.width, "", "  ")]
        if result.blackout is not None:
            lines.append(f"  window {result.blackout.id[:8]} (end it early: sudo bk admin maintain end "
                         f"{result.blackout.id[:8]})")
        for r in over:
            lines.append(f"  {'cancelled' if r.id in result.cancelled else 'kept'}: {_res_line(r, call)}")
        return "\n".join(lines)

    done = None
    if not result.dry_run:
        # The window's ID is the one `maintain end` takes; the notice is
        # how users hear of it.
        done = (f"added maintenance window {result.blackout.id[:8]} (notice {result.notice.id[:8]})"
                if result.blackout is not None else f"published maintenance notice {result.notice.id[:8]}")
        if result.cancelled:
            done += f", {counted(len(result.cancelled), 'booking')} cancelled"
    return Output("admin maintain", result.to_json(), human, done=done)


def _maintain_dialog(args, ctx, call):
    from bk.cli.guided import Cancelled, Dialog, Question
    from bk.core import timegrid
    from bk.core.errors import InvalidInput

    slot = call.policy.slot_minutes

    def text(v: str) -> str:
        if not v.strip():
            raise InvalidInput("say why; every user reads it")
        return v.strip()

    def start(v: str) -> str:
        timegrid.parse_start(v, call.now, call.tz, slot)
        return v

    def dur(v: str) -> str:
        timegrid.parse_duration(v, slot)
        return v

    def level(v: str) -> str:
        if v not in ("info", "warning", "critical"):
            raise InvalidInput("info, warning or critical")
        return v

    def yes(v: str) -> bool:
        return v.lower() in ("y", "yes")

    qs = [Question("reason", "Why (every user reads it)?", text),
          Question("start", "Starts", start, "now"),
          Question("duration", "Lasts", dur, args.duration or "2h"),
          Question("level", "Level (info, warning, critical)", level, args.level or "warning"),
          Question("block", "Refuse new bookings in the window?", yes, "y", shown="Y/n")]
    try:
        got = Dialog.terminal().run(qs)
    except Cancelled:
        raise UsageError("cancelled, nothing changed") from None
    return argparse.Namespace(**{**vars(args), "reason": got["reason"], "start": got["start"],
                                 "duration": got["duration"], "level": got["level"],
                                 "no_block": not got["block"]})


def _maintain_list(args, ctx) -> Output:
    from bk.service import BlackoutsRequest

    call = ctx.call()
    got = ctx.app().run("blackouts", BlackoutsRequest(args.all), call=call)
    rows = got.windows

    def human(term) -> str:
        if not rows:
            return "no maintenance windows" + ("" if args.all else " now or ahead (--all: past ones too)")
        return "\n".join(f"{b.id[:8]}  {_when(b.start, call)} to {_when(b.end, call)}  {safe(b.reason)}"
                         for b in rows)

    return Output("admin maintain list", got.to_json(), human)


def _maintain_end(ref: str, args, ctx) -> Output:
    from bk.service import BlackoutEndRequest

    app, call = ctx.app(), ctx.call()
    result = app.run("blackout_end", BlackoutEndRequest(ref, dry_run=args.dry_run), call=call)
    b = result.blackout
    verb = {"ended": "ended", "dry_run": "would end", "unchanged": "already over:"}[result.status]

    def human(term) -> str:
        return wrap(f"{verb} maintenance window {b.id[:8]} ({_when(b.start, call)} to {_when(b.end, call)}): "
                    f"{safe(b.reason)}", term.width, "", "  ")

    done = f"ended window {b.id[:8]}" if result.status == "ended" else None
    return Output("admin maintain end", result.to_json(), human, done=done)


# ------------------------------------------------------------- notice

def run_notice_guided(args, ctx) -> Output:
    need_root("notice")
    if not ctx.interactive:
        raise UsageError("which action?", hint="bk admin notice publish|list|edit|archive (see bk help admin notice)")
    from bk.cli.guided import Cancelled, Dialog, Question
    from bk.core import timegrid
    from bk.core.errors import InvalidInput
    from bk.service import NoticeRequest

    app, call = ctx.app(), ctx.call()

    def text(v: str) -> str:
        if not v.strip():
            raise InvalidInput("the announcement is empty")
        return v.strip()

    def level(v: str) -> str:
        if v not in ("info", "warning", "critical"):
            raise InvalidInput("info, warning or critical")
        return v

    def until(v: str):
        if v.lower() in ("", "never", "none"):
            return None
        t = timegrid.parse_start(v, call.now, call.tz, 1).t
        if t <= call.now:
            raise InvalidInput(f"{v} is not in the future")
        return t

    try:
        got = Dialog.terminal().run([Question("text", "Announcement", text),
                                     Question("level", "Level (info, warning, critical)", level, "info"),
                                     Question("until", "Shown until (a time, or never)", until, "never")])
    except Cancelled:
        raise UsageError("cancelled, nothing published") from None
    if not ctx.confirm(f"Publish this {got['level']} announcement?"):
        return Output("admin notice", {"status": "declined"}, "nothing published", exit_code=EXIT_PARTIAL)
    result = app.run("notice_publish", NoticeRequest(got["text"], level=got["level"], until=got["until"]),
                     call=ctx.fresh_call())
    return Output("admin notice", result.to_json(), f"published {result.notice.level} announcement "
                  f"{result.notice.id[:8]}", done=f"published notice {result.notice.id[:8]}")


def run_notice_list(args, ctx) -> Output:
    need_root("notice list")
    from bk.service import Empty

    call = ctx.call()
    got = ctx.app().run("notice_list", Empty(), call=call)
    rows, state_word, data = got.notices, got.state, got.to_json()

    def human(term) -> str:
        if not rows:
            return "no notices"
        out = []
        for n in rows:
            until = f" until {_when(n.until, call)}" if n.until else ""
            who = "everyone" if n.uid is None else f"uid {n.uid}"
            extra = ""
            if n.archived and n.extra.get("archived_at"):
                extra = f" (archived {n.extra['archived_at']} by uid {n.extra.get('archived_by')})"
            out.append(wrap(f"{n.id[:8]} {n.level:<8} {state_word(n):<9} from {_when(n.at, call)}{until} "
                            f"[{who}]{extra}: {safe(n.text)}", term.width, "", "  "))
        return "\n".join(out)

    return Output("admin notice list", data, human)


def run_notice_edit(args, ctx) -> Output:
    need_root("notice edit")
    from bk.service import NoticeEditRequest

    app, call = ctx.app(), ctx.call()
    until = None
    if args.until is not None:
        from bk.cli.common import time_ahead

        until = time_ahead(args.until, "--until", call.now, call.tz)
    result = app.run("notice_edit", NoticeEditRequest(args.ref, text=args.text, level=args.level, until=until,
                                                      clear_until=args.no_until, dry_run=args.dry_run), call=call)
    n = result.notice
    verb = {"edited": "edited", "dry_run": "would change", "unchanged": "unchanged:"}[result.status]

    def human(term) -> str:
        return wrap(f"{verb} {n.level} notice {n.id[:8]}: {safe(n.text)}", term.width, "", "  ")

    done = f"edited notice {n.id[:8]}" if result.status == "edited" else None
    return Output("admin notice edit", result.to_json(), human, done=done)


# ------------------------------------------------------------- gpu-policy

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


# ------------------------------------------------------------- data

def _data_dir(app, call) -> str:
    from bk.service import Empty

    return app.run("info", Empty(), call=call)["data_dir"]


def _files_text(result) -> str:
    total = sum(e.size for e in result.files)
    return f"{counted(len(result.files), 'file')}, {counted(total, 'byte')}"


def run_data_backup(args, ctx) -> Output:
    need_root("data backup")
    from bk.service import DataRequest

    result = ctx.app().run("data_backup", DataRequest(args.dir, args.dry_run), call=ctx.call())
    if result.status == "dry_run":
        return Output("admin data backup", result.to_json(), f"would back up {result.data_dir} to {result.backup_dir}")
    left = (f"\nleft out, not bk's: {', '.join(safe(p) for p in result.skipped)}" if result.skipped else "")
    return Output("admin data backup", result.to_json(),
                  f"backed up {result.data_dir} to {result.backup_dir} ({_files_text(result)}){left}\n"
                  f"check it with: sudo bk admin data verify {result.backup_dir}", done=f"backup {result.backup_dir}")


def _problems_text(result) -> str:
    return "\n".join(f"  {p.why}: {safe(p.path)}" for p in result.problems)


def run_data_verify(args, ctx) -> Output:
    need_root("data verify")
    from bk.service import DataRequest

    result = ctx.app().run("data_verify", DataRequest(args.dir), call=ctx.call())
    if result.problems:
        return Output("admin data verify", result.to_json(),
                      f"{result.backup_dir} does NOT verify:\n{_problems_text(result)}", exit_code=EXIT_PARTIAL)
    return Output("admin data verify", result.to_json(),
                  f"{result.backup_dir}: every checksum matches ({_files_text(result)}, bk {result.bk_version})")


def run_data_clear(args, ctx) -> Output:
    need_root("data clear")
    from bk.service import DataRequest

    app, call = ctx.app(), ctx.call()
    if not args.yes and not args.dry_run:
        data_dir = _data_dir(app, call)
        if not ctx.interactive:
            raise UsageError(f"bk admin data clear empties {data_dir}; confirm with --yes",
                             hint="it backs up first; look with --dry-run")
        if not ctx.confirm(f"Back up, then empty {data_dir}?"):
            return Output("admin data clear", {"status": "declined"}, "nothing changed", exit_code=EXIT_PARTIAL)
    result = app.run("data_clear", DataRequest(args.backup_dir, args.dry_run), call=call)
    if result.status == "dry_run":
        return Output("admin data clear", result.to_json(),
                      f"would back up to {result.backup_dir}, then remove from {result.data_dir}: "
                      + ", ".join(result.removed))
    if not result.removed:
        return Output("admin data clear", result.to_json(), f"{result.data_dir} is already empty")
    return Output("admin data clear", result.to_json(),
                  f"backed up to {result.backup_dir} ({_files_text(result)}), then emptied {result.data_dir}",
                  done=f"cleared {result.data_dir}")


def run_data_restore(args, ctx) -> Output:
    need_root("data restore")
    from bk.service import DataRequest

    app, call = ctx.app(), ctx.call()
    if not args.yes and not args.dry_run:
        data_dir = _data_dir(app, call)
        if not ctx.interactive:
            raise UsageError(f"confirm restoring {args.dir} into {data_dir} with --yes",
                             hint="look first with --dry-run")
        if not ctx.confirm(f"Restore {args.dir} into {data_dir}?"):
            return Output("admin data restore", {"status": "declined"}, "nothing changed", exit_code=EXIT_PARTIAL)
    result = app.run("data_restore", DataRequest(args.dir, args.dry_run), call=call)
    if result.status == "tampered":
        return Output("admin data restore", result.to_json(),
                      f"{result.backup_dir} does NOT verify; nothing restored:\n{_problems_text(result)}",
                      exit_code=EXIT_PARTIAL)
    verb = "would restore" if result.status == "dry_run" else "restored"
    return Output("admin data restore", result.to_json(),
                  f"{verb} {result.backup_dir} ({_files_text(result)}) into {result.data_dir}",
                  done=None if result.status == "dry_run" else f"restored {result.data_dir}")
