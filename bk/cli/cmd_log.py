"""``bk history ID`` (one booking's lifecycle) and ``bk lg`` (``log``, your audit trail)."""

from __future__ import annotations

import argparse

from bk.cli import common
from bk.cli.render import Output, safe, wrap
from bk.core import timegrid
from bk.core.errors import PermissionDenied
from bk.core.models import parse_iso

DEFAULT_LOG_LIMIT = 20


def register(sub) -> None:
    p = sub.add_parser(
        "history", help="one booking's lifecycle",
        description="Show how one booking came to be: created, each edit with before and "
        "after, and its cancellation with the reason.",
        epilog="Examples:\n  bk history 1\n  bk history a1b2c3d4",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ref", metavar="ID|N", help="list number or ID prefix (4+ characters)")
    p.set_defaults(handler=run_history, command="history")

    lg = sub.add_parser(
        "log", aliases=["lg"], help="your audit trail",
        description="Show your most recent actions from the audit log, oldest first.",
        epilog=f"Examples:\n  bk lg\n  bk lg -n 100\n\nDefault: the last {DEFAULT_LOG_LIMIT} entries.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    lg.add_argument("-n", "--limit", type=common.positive_int, default=DEFAULT_LOG_LIMIT, metavar="N",
                    help=f"how many entries (default {DEFAULT_LOG_LIMIT})")
    lg.add_argument("--all", action="store_true",
                    help="everyone's actions (the administrator only; others see their own)")
    lg.set_defaults(handler=run_log, command="log")


# ------------------------------------------------------------ the words

def _t(v) -> int | None:
    """Audit summaries carry epoch seconds; records carry ISO text."""
    if v is None:
        return None
    return v if isinstance(v, int) else parse_iso(v)


def _field(k: str, v, tz, now: int) -> str:
    if v is None:
        return "-"
    if k in ("start", "end", "idle_keep_until"):
        return timegrid.format_local(_t(v), tz, now=now, compact=True)
    if k == "idle_release_minutes" and isinstance(v, int):
        return timegrid.format_duration(v * 60)
    if k == "gpus":
        return common.gpus_text(v)
    if k == "mem_mib":
        return timegrid.format_memory(v)
    if k == "shared_with":
        return safe(", ".join(map(str, v))) if isinstance(v, list) and v else "nobody"
    if k == "advance":
        return "on" if v else "off"
    return safe(v)


def change_text(before: dict | None, after: dict | None, tz, now: int) -> str:
    """``end 07-13 21:30 → 22:00, gpus 0 → 0,1``: only what changed."""
    before, after = before or {}, after or {}
    parts = []
    for k in ("start", "end", "gpus", "mode", "share", "mem_mib", "note", "shared_with", "advance",
              "idle_release_minutes", "idle_keep_until"):
        if k in before or k in after:
            b, a = before.get(k), after.get(k)
            if b != a:
                name = {"idle_release_minutes": "idle release", "idle_keep_until": "kept until"}.get(k, k)
                parts.append(f"{name} {_field(k, b, tz, now)} → {_field(k, a, tz, now)}")
    return ", ".join(parts)


def _span_of(summary: dict | None, tz, now: int) -> str:
    if not summary or summary.get("start") is None:
        return ""
    return (f"GPU {common.gpus_text(summary.get('gpus') or [])} {safe(summary.get('mode', ''))} "
            f"{timegrid.format_span(_t(summary['start']), _t(summary['end']), tz, now)}")


def _said(d, key: str) -> str:
    return safe((d or {}).get(key) or "")


# The administrator's and the worker's actions, in words (the action names are
# the audit log's constants; an unknown one is shown as it is).
_WORDS = {
    "blackout_add": lambda e, who: f"maintenance window set by {who}: {_said(e.get('after'), 'reason')}".rstrip(": "),
    "blackout_end": lambda e, who: f"maintenance window {safe(e.get('result') or 'ended')} by {who}",
    "notice_publish": lambda e, who: f"announcement published by {who}: {_said(e.get('after'), 'text')}".rstrip(": "),
    "notice_archive": lambda e, who: f"announcement archived by {who}: {_said(e.get('before'), 'text')}".rstrip(": "),
    "notice_edit": lambda e, who: f"announcement edited by {who}: {_said(e.get('after'), 'text')}".rstrip(": "),
    "policy_bind": lambda e, who: f"GPU policy bound to the ledger by {who}",
    "recover": lambda e, who: f"lost commits accepted by {who}",
    "job": lambda e, who: (f"job {_said(e.get('before'), 'job')} -> {_said(e.get('after'), 'job')} "
                           f"by {who}"),
}


def describe(e: dict, tz, now: int) -> str:
    """One audit entry in words (whatever the log holds is shown escaped:
    ``safe``)."""
    action = safe(e.get("action") or "?")
    who = safe(e.get("user") or e.get("uid"))
    if action == "create":
        text = f"booked by {who}: {_span_of(e.get('after'), tz, now)}"
        if e.get("result") == "queued":
            text += " (queued)"
    elif action == "edit":
        text = f"edited by {who}: {change_text(e.get('before'), e.get('after'), tz, now) or 'no change'}"
    elif action == "booking_advanced":
        # bk.core.advance: it moved earlier on its own, in the commit of the change that made room.
        keys = ("start", "end", "gpus")
        text = (f"moved earlier on its own, after a change by {who}: " + change_text(
            {k: (e.get("before") or {}).get(k) for k in keys}, {k: (e.get("after") or {}).get(k) for k in keys},
            tz, now))
    elif action in ("cancel", "admin_cancel"):
        text = f"cancelled by {who}" + (f": {safe(e['reason'])}" if e.get("reason") else "")
    elif action in _WORDS:
        text = _WORDS[action](e, who)
    else:
        text = f"{action} by {who}" + (f": {safe(e['result'])}" if e.get("result") else "")
    if e.get("op_id"):
        text += f" [op-id {safe(e['op_id'])}]"
    return text


# ------------------------------------------------------------ commands

def run_history(args, ctx) -> Output:
    from bk.service import HistoryRequest

    call = ctx.call()
    got = ctx.app().run("history", HistoryRequest(args.ref), call=call)
    res, events, source = got.reservation, got.events, got.source
    now, tz = call.now, call.tz

    def human(term) -> str:
        head = (f"{common.summary_line(res, capacity=call.policy.max_shared_users, tz=tz, now=now)}, "
                f"{res.status(now)}, booked by {safe(res.user)}")
        lines = [wrap(head, term.width, "", "  ")]
        for e in events:
            when = timegrid.format_local(_t(e["time"]), tz, now=now, compact=True) if e.get("time") else "?"
            lines.append(wrap(f"{when}  {describe(e, tz, now)}", term.width, "", " " * 13))
        if source == "record":
            lines.append("(from the booking's own record; the audit log no longer has it)")
        return "\n".join(lines)

    return Output("history", got.to_json(), human)


def run_log(args, ctx) -> Output:
    from bk.service import AuditRequest

    call = ctx.call()
    if args.all and not call.actor.is_admin:
        raise PermissionDenied("only the administrator (root) may read everyone's audit trail",
                               hint="sudo bk lg --all; your own: bk lg")
    tail = ctx.app().run("audit", AuditRequest(args.limit, args.all), call=call)
    now, tz = call.now, call.tz
    warnings = [f"audit log: {p}" for p in tail.problems]
    data = {"entries": list(tail.entries), "complete": tail.complete}

    def human(term) -> str:
        if not tail.entries:
            return "no actions of yours in the audit log"
        lines = []
        for e in tail.entries:
            when = timegrid.format_local(_t(e["time"]), tz, now=now, compact=True) if e.get("time") else "?"
            rid = safe((e.get("reservation") or "")[:8] or "-")
            lines.append(wrap(f"{when}  {rid:<8}  {describe(e, tz, now)}", term.width, "", " " * 23))
        return "\n".join(lines)

    return Output("log", data, human, warnings=warnings)
