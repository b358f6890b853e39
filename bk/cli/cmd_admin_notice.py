"""``bk admin notice`` (guided), ``notice list`` and ``notice edit``: the
administrator's announcements (``publish`` and ``archive`` are in
``bk.cli.cmd_admin``).

Root only (exit 5) before anything is read; the writes are rows of the
operation table, so on a shared server they travel through the broker.
"""

from __future__ import annotations

import argparse

from bk.cli.common import need_root, when_short
from bk.cli.render import Output, safe, wrap
from bk.core.errors import EXIT_PARTIAL, UsageError

RAW = argparse.RawDescriptionHelpFormatter


# ------------------------------------------------------------- registration


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
            until = f" until {when_short(n.until, call)}" if n.until else ""
            who = "everyone" if n.uid is None else f"uid {n.uid}"
            extra = ""
            if n.archived and n.extra.get("archived_at"):
                extra = f" (archived {n.extra['archived_at']} by uid {n.extra.get('archived_by')})"
            out.append(wrap(f"{n.id[:8]} {n.level:<8} {state_word(n):<9} from {when_short(n.at, call)}{until} "
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
