"""``bk info`` (who runs this server, and its rules), ``bk login`` (the
summary a login hook prints) and ``bk config`` (the effective settings)."""

from __future__ import annotations

import argparse
import json

from bk.cli import common
from bk.cli.cmd_status import notice_lines
from bk.cli.render import Output, safe, table, wrap
from bk.core.timegrid import counted


def register(sub) -> None:
    p = sub.add_parser(
        "info", help="administrator contact and this server's rules",
        description="Show whom to ask about this server, the mode, where the data lives, the "
        "GPUs and the booking rules in force.",
        epilog="Examples:\n  bk info\n  bk info --json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(handler=run_info, command="info")

    lg = sub.add_parser(
        "login", help="login summary (silent when there is nothing to say)",
        description="What a login hook shows: notices, and your bookings running now or "
        "starting within the hour. Prints nothing when there is nothing to say.",
        epilog="Examples:\n  bk login          (from a shell profile or the login hook)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    lg.set_defaults(handler=run_login, command="login")

    c = sub.add_parser(
        "config", help="the effective configuration and where each value comes from",
        description="Show every setting, its effective value and its source: default, file "
        "(the configuration file), environment (BK_GPU_COUNT, BK_GPU_SIM_FILE), detected, or "
        "simulated default (no GPU backend answered and no count was configured).",
        epilog="Examples:\n  bk config\n  bk config --json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    c.set_defaults(handler=run_config, command="config")


def run_info(args, ctx) -> Output:
    from bk.service import Empty

    data = ctx.app().run("info", Empty(), call=ctx.call()).to_json()

    def human(term) -> str:
        a, pol = data["admin"], data["policy"]
        # The contact comes from the configuration or an account's GECOS
        # field, text someone typed: shown escaped like every stored string.
        contact = safe(a["contact"]) if a["contact"] else "unknown (set admin_contact in the configuration)"
        rows = [
            ["administrator", contact],
            ["mode", f"{data['mode']} ({'one ledger for everyone' if data['mode'] == 'shared' else 'your own ledger'})"],
            ["data", safe(data["data_dir"])],
            ["config", safe(data["config_file"]) if data["config_file"] else "defaults (no file)"],
            ["time zone", _zone_text(data["timezone"])],
            ["GPUs", f"{data['gpu_count']} (simulated on purpose: simulated_gpus)"
                     if data["backend"]["name"] == "simulated" else
                     f"{data['gpu_count']} ({data['backend']['name']}"
                     f"{', simulated' if data['backend']['simulated'] else ''})"],
            ["slices", counted(pol["slot_minutes"], "minute")],
            ["sharing", f"{counted(pol['max_shared_users'], 'share slot')} per GPU"
                        f"{', memory required (-m)' if pol['require_shared_memory'] else ''}"],
            ["limits", f"bookings up to {pol['max_booking_hours']} h, ending within "
                       f"{counted(pol['booking_horizon_days'], 'day')}"],
        ]
        if pol["disabled_gpus"]:
            rows.append(["disabled", "GPU " + common.gpus_text(pol["disabled_gpus"])])
        mine = data["your_limits"]
        if mine is not None:
            rows.append(["your limits", _limits_text(mine)])
        if data["advance_default"] or data["fair_share"]:
            rows.append(["queue", ("queued bookings move earlier on their own" if data["advance_default"]
                                   else "queued bookings may move earlier (--advance)")
                         + ("; contested ones by fair share (bk u users)" if data["fair_share"] else "")])
        return table(rows, ["", ""], term, shrink=1).split("\n", 1)[1]

    return Output("info", data, human)


# "1 GPU at once" is the commonest lab rule: the noun follows the number.
_LIMIT_WORDS = {"gpus": lambda v: f"{counted(_whole(v), 'GPU')} at once",
                "gpu_hours": lambda v: f"{counted(_whole(v), 'GPU-hour')} booked ahead",
                "booking_hours": lambda v: f"bookings up to {v:g} h", "ahead_hours": lambda v: f"starting within {v:g} h",
                "shared_vram_gib": lambda v: f"{v:g} GiB per GPU shared"}


def _whole(v: float) -> float | int:
    """24.0 as 24, so that it reads as a config file says it."""
    return int(v) if float(v).is_integer() else v


def _limits_text(mine: dict) -> str:
    """``2 GPUs at once, bookings up to 4 h (the students tier)``; ``none (exempt: ...)``."""
    if mine["exempt"]:
        return f"none ({safe(mine['exempt'])})"
    if not mine["limits"]:
        return "none"
    return ", ".join(_LIMIT_WORDS[k](b["value"]) + ("" if b["level"] == "everyone" else
                     f" ({'you' if b['level'] == 'user' else safe(b['who'])})") for k, b in mine["limits"].items())


def _zone_text(zone: dict) -> str:
    """``Europe/Berlin (from TZ)``, ``Etc/UTC (from /etc/localtime)``, ``UTC (fallback: no zone found)``."""
    name, source = zone["name"], zone["source"]
    if source == "UTC fallback":
        return f"{name} (fallback: no zone found)"
    return name if source == "given" else f"{name} (from {source})"


def run_login(args, ctx) -> Output:
    from bk.service import LoginRequest

    call = ctx.call()
    lv = ctx.app().run("login", LoginRequest(), call=call)
    now, tz = call.now, call.tz

    def human(term) -> str:
        parts = []
        if lv.notices:
            parts.append("bk notices:\n" + notice_lines(lv.notices, term, tz=tz, now=now))
        if lv.reservations:
            parts.append("your GPU bookings now and within the hour:\n"
                         + common.reservations_table(lv.reservations, lv.view, term, tz=tz, show_user=False))
        # Silence is the point: a login hook must not nag when all is quiet.
        return "\n\n".join(parts)

    return Output("login", lv.to_json(), human)


def _value(v) -> str:
    if isinstance(v, (dict, list)) or v is None or isinstance(v, bool):
        return json.dumps(v)
    return str(v)


def run_config(args, ctx) -> Output:
    from bk.service import Empty

    data = ctx.app().run("config", Empty(), call=ctx.call()).to_json()

    def human(term) -> str:
        head = [f"mode: {data['mode']}",
                f"config file: {data['config_read'] or (data['config_file'] or '-') + ' (not present; defaults)'}",
                f"data dir: {data['data_dir']}"]
        rows = [[name, _value(k["value"]), k["source"]] for name, k in data["settings"].items()]
        return "\n".join(wrap(h, term.width, "", "  ") for h in head) + "\n\n" + \
            table(rows, ["KEY", "VALUE", "SOURCE"], term, shrink=1)

    return Output("config", data, human)
