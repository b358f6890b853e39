"""``bk notify``: what you are told about your bookings, where, and proof
that it arrives.

``bk notify`` shows the settings in force (yours, else the administrator's),
the terminals a message would reach now and each channel's health; ``set``
changes them (every choice is checked first and refused with the reason);
``test`` sends one test notification on each channel; ``log`` lists what was
delivered.  Everything runs in this process, as you, on your own files
(``bk.service.notify``): the broker never sees an address or a URL.
"""

from __future__ import annotations

import argparse

from bk.cli.render import Output, safe, table

EPILOG = """Examples:
  bk notify                                  what you are told, where, and whether it works
  bk notify set --end-minutes 15,5           warn 15 and 5 minutes before a booking ends
  bk notify set --channels terminal,webhook --webhook https://ntfy.sh/my-lab-gpus --preset ntfy
  bk notify set --email ada@example.org --channels terminal,email
  bk notify set --quiet 22:00-07:00          no pop-ups, mail or webhooks at night
  bk notify set --events default             back to the administrator's events
  bk notify test                             one test message on each channel
  bk notify log                              what was delivered, and how

Events: starts_soon, started, ends_soon, ended, changed (cancelled or changed by
the administrator or maintenance), moved_earlier, can_start_earlier (a GPU freed),
gpu_used_by_other (someone else's process on your GPU), idle_nudge.
Channels: terminal (your terminals, like write(1); mesg n keeps one quiet),
desktop (a pop-up through terminals known to show one), email (through the
administrator's relay), webhook (JSON POST; presets slack, matrix, ntfy).

Your worker delivers them (bk w start, or systemctl --user enable --now
bk-worker): without one running, nothing is sent. Settings are private:
$XDG_CONFIG_HOME/bk/notify.json (default ~/.config/bk/notify.json)."""


def register(sub) -> None:
    p = sub.add_parser("notify", help="notifications: before a booking starts and ends, and more",
                       description="Show your notification settings (the default), change them (set), "
                       "prove each channel works (test) or list what was delivered (log).",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(handler=run_show, command="notify")
    actions = p.add_subparsers(dest="notify_action", metavar="ACTION", parser_class=type(p))
    show = actions.add_parser("show", help="your settings, terminals and channel health (the default)",
                              description="Your notification settings, the terminals a message would "
                              "reach now, the deliverer and each channel's health.")
    show.set_defaults(handler=run_show)

    s = actions.add_parser("set", help="change what you are told and where",
                           description="Change your notification settings. Each is checked before "
                           "anything is kept: an unknown event or channel, a malformed address or URL, "
                           "a webhook host that resolves to a loopback or private address, a mail relay "
                           "that refuses the address: each is refused with the reason.",
                           epilog="Examples:\n  bk notify set --end-minutes 30,15,5\n"
                           "  bk notify set --webhook https://hooks.slack.com/services/T0/B0/XX --preset slack "
                           "--channels terminal,webhook\n  bk notify set --reset",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--events", metavar="LIST", help="the events you are told of, comma-separated; "
                   "all, none, or default (the administrator's)")
    s.add_argument("--channels", metavar="LIST", help="terminal, desktop, email, webhook, comma-separated; "
                   "none, or default")
    s.add_argument("--quiet", metavar="HH:MM-HH:MM", help="local hours without pop-ups, mail and webhooks "
                   "(terminal lines still come); off, or default")
    s.add_argument("--email", metavar="ADDR", help="your address (checked with the relay, nothing sent); off")
    s.add_argument("--webhook", metavar="URL", help="your webhook (https://...); off")
    s.add_argument("--preset", choices=("json", "slack", "matrix", "ntfy"),
                   help="the webhook's body: json (the event, default), slack, matrix (a hook's text "
                   "message), ntfy (the URL names the topic)")
    s.add_argument("--start-minutes", metavar="LIST", help="minutes before a start to tell you (default 10)")
    s.add_argument("--end-minutes", metavar="LIST", help="minutes before an end to tell you (default 30,15,5)")
    s.add_argument("--desktop", choices=("auto", "osc9", "osc777", "off"),
                   help="pop-ups: auto (only terminals known to show them, default), or the escape your "
                   "terminal takes")
    s.add_argument("--reset", action="store_true", help="forget all your settings first")
    s.add_argument("--dry-run", action="store_true", help="check and show; keep nothing")
    s.set_defaults(handler=run_set)

    t = actions.add_parser("test", help="send one test notification on each channel",
                           description="Send a test notification now on each of your channels (or only "
                           "those named) and say what became of each. Exits 1 when one failed.")
    t.add_argument("--channel", action="append", metavar="NAME",
                   choices=("terminal", "desktop", "email", "webhook"), help="only this channel (repeatable)")
    t.set_defaults(handler=run_test)

    lg = actions.add_parser("log", help="what was delivered to you, newest first",
                            description="The notifications your deliverer sent, each channel's outcome, "
                            "and the channels' health.")
    lg.add_argument("--limit", type=int, default=20, metavar="N", help="at most N (default 20)")
    lg.set_defaults(handler=run_log)


def _perform(ctx, name: str, req):
    app, call = ctx.app(), ctx.call()
    return app.run(name, req, call=call), call


def _settings_lines(s: dict) -> list[str]:
    src = s["source"]

    def who(k):
        return {"you": "", "administrator": " (the administrator's)", "bk": " (default)"}.get(src.get(k) or "", "")
    lines = [f"events:    {', '.join(s['events']) or 'none'}{who('events')}",
             f"channels:  {', '.join(s['channels']) or 'none'}{who('channels')}",
             f"warnings:  {', '.join(map(str, s['start_minutes']))} min before a start{who('start_minutes')}; "
             f"{', '.join(map(str, s['end_minutes']))} min before an end{who('end_minutes')}",
             f"quiet:     {s['quiet'] or 'none'}{who('quiet')}",
             f"email:     {safe(s['email']) if s['email'] else 'none'}{who('email')}",
             f"webhook:   {safe(s['webhook']) + ' (' + s['preset'] + ')' if s['webhook'] else 'none'}",
             f"desktop:   {s['desktop']}"]
    return lines


def run_show(args, ctx) -> Output:
    from bk.service import Empty

    result, _call = _perform(ctx, "notify_show", Empty())
    data = result.to_json()

    def human(term) -> str:
        lines = _settings_lines(data["settings"])
        d = data["deliverer"]
        lines.append(f"deliverer: running in your worker (pid {d['pid']})" if d["state"] == "running" else
                     "deliverer: none runs for you, so nothing is sent: start your worker "
                     "(bk w start, or systemctl --user enable --now bk-worker)")
        if data["terminals"]:
            rows = [[t["path"], {"ok": "messages on", "mesg-n": "mesg n: skipped",
                                 "not-yours": "not yours: skipped"}[t["state"]], t["desktop"] or "-"]
                    for t in data["terminals"]]
            lines.append(table(rows, ["TERMINAL", "STATE", "POP-UP"], term))
        else:
            lines.append("terminals: none open now")
        for ch, h in sorted(data["health"].items()):
            if h["failing"]:
                lines.append(f"{ch}: failing ({h['failures']} in a row): {safe(h['error'] or '')}")
        lines.append(f"settings file: {data['file']}")
        return "\n".join(lines)
    return Output("notify", data, human)


def run_set(args, ctx) -> Output:
    from bk.service import NotifySetRequest

    req = NotifySetRequest(events=args.events, channels=args.channels, quiet=args.quiet, email=args.email,
                           webhook=args.webhook, preset=args.preset, start_minutes=args.start_minutes,
                           end_minutes=args.end_minutes, desktop=args.desktop, reset=args.reset,
                           dry_run=args.dry_run)
    result, _call = _perform(ctx, "notify_set", req)
    data = result.to_json()

    def human(term) -> str:
        head = "would keep (dry run):" if data["status"] == "dry_run" else "saved:"
        lines = [head, *("  " + x for x in _settings_lines(data["settings"]))]
        lines += [f"  checked {c['channel']}: {c['detail']}" for c in data["checks"]]
        return "\n".join(lines)
    return Output("notify", data, human, done=None if args.dry_run else "notification settings saved")


def run_test(args, ctx) -> Output:
    from bk.service import NotifyTestRequest

    req = NotifyTestRequest(channels=",".join(args.channel) if args.channel else None)
    result, _call = _perform(ctx, "notify_test", req)
    data = result.to_json()

    def human(term) -> str:
        if not data["channels"]:
            return "no channels chosen: bk notify set --channels terminal"
        return "\n".join(f"{c['channel']}: {'ok' if c['ok'] else 'FAILED'}: {safe(c['detail'])}"
                         for c in data["channels"])
    return Output("notify", data, human, exit_code=0 if data["ok"] else 1)


def run_log(args, ctx) -> Output:
    from bk.core.errors import UsageError
    from bk.service import NotifyLogRequest

    if not 1 <= args.limit <= 1000:
        raise UsageError("--limit must be between 1 and 1000")
    result, call = _perform(ctx, "notify_log", NotifyLogRequest(args.limit))
    data = result.to_json()

    def human(term) -> str:
        if not data["deliveries"]:
            return "nothing delivered yet"
        from bk.core import timegrid
        from bk.core.models import parse_iso

        rows = []
        for d in data["deliveries"]:
            when = timegrid.format_local_short(parse_iso(d["created"]), call.tz, call.now) if d["created"] else ""
            chans = ", ".join(f"{ch} {st['state']}" for ch, st in sorted(d["channels"].items()))
            rows.append([when, d["event"], chans, safe(d["text"] or "")])
        return table(rows, ["WHEN", "EVENT", "CHANNELS", "TEXT"], term, shrink=[3], fold=True)
    return Output("notify", data, human)
