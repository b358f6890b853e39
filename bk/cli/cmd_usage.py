"""``bk u`` (``usage``): what the GPU time you booked was used for.

``bk u`` is your own dashboard (totals, a chart of the last 7 days and 4
weeks, recent bookings); ``users``, ``samples``, ``events`` and ``verify``
look at everyone's history.  The numbers come from the monitor (``bk m``)
through the ``usage`` rows; this module only draws them.
"""

from __future__ import annotations

import argparse

from bk.cli import common
from bk.cli.render import Output, safe, table
from bk.core import timegrid
from bk.core import usage as core
from bk.core.errors import EXIT_PARTIAL

EPILOG = """Examples:
  bk u                          your dashboard: today, 7 days, 4 weeks, recent bookings
  bk u --since 10d              the same, with your totals since then
  bk u users --since 30d        everyone's booked, active and idle GPU time
  bk u samples -g 0 -n 20       the last 20 minute records of GPU 0
  bk u events --since 7d        unreserved use and idle bookings
  bk u verify                   check every sealed day against its checksum

Usage is recorded by the monitor: bk m, or its system service on a shared server.
Times: --since/--until take 30d, 2w, 12h, today, 2026-11-01 (local midnight) or an
ISO-8601 time.  Fields and files: docs/TELEMETRY.md."""


def register(sub) -> None:
    p = sub.add_parser("usage", aliases=["u"], help="your GPU usage: booked vs used, with a chart",
                       description="Show how much of the GPU time you booked was used: totals for "
                       "today, 7 days and 4 weeks, a chart of the last 7 days and 4 weeks, and "
                       "your recent bookings. Sub-commands show everyone's history.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Their own dests: a sub-command's --since (with its own default) must
    # not overwrite, or be overwritten by, the dashboard's.
    p.add_argument("--since", dest="dash_since", metavar="WHEN",
                   help="also show your totals since then (30d, 2w, 12h, today, 2026-11-01)")
    p.add_argument("--until", dest="dash_until", metavar="WHEN",
                   help="with --since: the end of that period (default now)")
    p.set_defaults(handler=run_dashboard, command="usage")
    actions = p.add_subparsers(dest="usage_action", metavar="ACTION", parser_class=type(p))

    users = actions.add_parser("users", help="per-user table: booked, active, idle, unreserved",
                               description="One line per user over [--since, --until): booked GPU "
                               "time, active time, idle share of the booked time, unreserved use, "
                               "average SM and peak memory; then one line per GPU.",
                               epilog="Examples:\n  bk u users\n  bk u users --since 30d\n"
                               "  bk u users --since 2026-11-01 --until 2026-12-01",
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    _span_flags(users, "30d")
    users.set_defaults(handler=run_users, command="usage users")

    samples = actions.add_parser("samples", help="the stored minute records",
                                 description="The stored records, one per GPU and minute (hourly for "
                                 "days older than usage_raw_days), newest last.",
                                 epilog="Examples:\n  bk u samples\n  bk u samples -g 0,1 -n 50\n"
                                 "  bk u samples -r 2          booking 2's records: why it is idle\n"
                                 "  bk u samples --since 2h --json",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    _span_flags(samples, "1h")
    samples.add_argument("-g", "--gpu", metavar="LIST", help="only these GPUs, e.g. 0,2 or 0-3")
    samples.add_argument("-r", "--reservation", metavar="ID|N",
                         help="only the records that credit this booking (its evidence: active or idle "
                         "seconds, SM, memory, energy), over its span unless --since/--until say otherwise")
    samples.add_argument("-n", "--limit", type=common.positive_int, default=60, metavar="N",
                         help="at most the last N records (default 60)")
    samples.set_defaults(handler=run_samples, command="usage samples")

    ev = actions.add_parser("events", help="unreserved use and idle bookings",
                            description="Episodes derived from the records: a user's processes on a "
                            "GPU without a booking there (unreserved), and booked time with none of "
                            "the booker's processes running for --idle or longer (idle-booking).",
                            epilog="Examples:\n  bk u events\n  bk u events --since 30d --idle 1h",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    _span_flags(ev, "7d")
    ev.add_argument("--idle", metavar="DUR", default="30m",
                    help="shortest idle stretch of a booking that counts (default 30m)")
    ev.set_defaults(handler=run_events, command="usage events")

    ver = actions.add_parser("verify", help="check the sealed days against their checksums",
                             description="Recompute the SHA-256, record count and totals of every "
                             "sealed day of the history and compare them with its seal, and check "
                             "every line of every day. Exits 1 when a day does not match its seal "
                             "(tampered) or holds lines that are not records (damaged).",
                             epilog="Examples:\n  bk u verify\n  bk u verify --json",
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    ver.set_defaults(handler=run_verify, command="usage verify")


def _span_flags(p, default: str) -> None:
    p.add_argument("--since", metavar="WHEN", help=f"start of the period (default {default} ago)")
    p.add_argument("--until", metavar="WHEN", help="end of the period (default now)")
    p.set_defaults(since_default=default)


def _span(args, call) -> tuple[int, int]:
    return _period(args.since if args.since is not None else args.since_default, args.until, call)


def _sum_known(values) -> int | None:
    got = [v for v in values if v is not None]
    return sum(got) if got else None


def _period(since_word: str, until_word: str | None, call) -> tuple[int, int]:
    since = core.parse_since(since_word, call.now, call.tz)
    until = call.now if until_word is None else core.parse_since(until_word, call.now, call.tz)
    if until <= since:
        from bk.core.errors import InvalidInput

        raise InvalidInput(f"--until ({until_word}) must be after --since ({since_word})",
                           "e.g. bk u users --since 2026-11-01 --until 2026-12-01")
    return since, until


# ------------------------------------------------------------ words

def hours(seconds: int) -> str:
    """GPU time for tables: ``12.5h``, ``40m``, ``0``."""
    if not seconds:
        return "0"
    if seconds < 3600:
        return f"{max(seconds // 60, 1)}m"
    return f"{seconds / 3600:.1f}h"


def share(x: float | None) -> str:
    return "-" if x is None else f"{round(x * 100)}%"


def mem(mib: int | None) -> str:
    if mib is None:
        return "-"
    return timegrid.format_memory(mib) if mib > 0 else "0"


def sm(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}%"


def totals_line(t: core.Totals, prices=None) -> str:
    if not t.booked_s and not t.unreserved_s:
        return "nothing booked or used"
    text = f"booked {hours(t.booked_s)}, active {hours(t.active_s)}"
    if t.booked_s:
        text += f", idle {share(t.idle_share)} of it"
    if t.unreserved_s:
        text += f", unreserved {hours(t.unreserved_s)}"
    return text + ", " + energy_text(t.energy_mj, prices)


def kwh(energy_mj: int | None) -> str:
    """``1.23 kWh`` for tables; ``?`` when the energy is unknown (no counter,
    a reset): never a figure that was not measured."""
    if energy_mj is None:
        return "?"
    k = energy_mj / 3.6e9
    return f"{k:.2f}" if k >= 0.01 else f"{k:.4f}"


def energy_text(energy_mj: int | None, prices=None) -> str:
    """``energy 1.23 kWh (0.41 cost, 0.5 kg CO2e)``, or ``energy unknown``."""
    if energy_mj is None:
        return "energy unknown"
    text = f"energy {kwh(energy_mj)} kWh"
    extra = []
    got = prices.of(energy_mj) if prices is not None else {}
    if got.get("cost") is not None:
        extra.append(f"cost {got['cost']:.2f}")
    if got.get("co2e_kg") is not None:
        extra.append(f"{got['co2e_kg']:.2f} kg CO2e")
    return text + (f" ({', '.join(extra)})" if extra else "")


# ------------------------------------------------------------ the chart

BLOCKS = " ▏▎▍▌▋▊▉█"


def bar(value: float, scale: float, width: int, term, *, solid: bool = True) -> str:
    """A horizontal bar ``value/scale`` of ``width`` cells: solid bars in
    eighth blocks and light ones in shade under UTF-8, ``#`` and ``=``
    otherwise (``Term.unicode``: can the output encode them?)."""
    if scale <= 0 or value <= 0:
        return ""
    cells = value / scale * width
    if not term.unicode:
        return ("#" if solid else "=") * max(1, round(cells))
    if not solid:
        return "░" * max(1, round(cells))
    whole, part = int(cells), int((cells - int(cells)) * 8)
    return ("█" * whole + (BLOCKS[part] if part else "")) or "▏"


def chart(bins, labels, term) -> list[str]:
    """Two bars per bin: booked (light) and active (solid), on one scale."""
    if not any(b.totals.booked_s or b.totals.active_s for b in bins):
        return ["  nothing booked"]
    width = max(10, min(40, term.width - 34))
    scale = max([b.totals.booked_s for b in bins] + [b.totals.active_s for b in bins] + [1])
    lines = []
    for b, label in zip(bins, labels, strict=True):
        t = b.totals
        booked = bar(t.booked_s, scale, width, term, solid=False)
        active = bar(t.active_s, scale, width, term)
        lines.append(f"  {label:<10} {booked:<{width}} booked {hours(t.booked_s)}")
        lines.append(f"  {'':<10} {active:<{width}} active {hours(t.active_s)}")
    return lines


def _day_label(start: int, tz) -> str:
    from datetime import datetime

    d = datetime.fromtimestamp(start, tz)
    return d.strftime("%a %m-%d")


# ------------------------------------------------------------ commands

def run_dashboard(args, ctx) -> Output:
    from bk.service import UsageRequest

    call = ctx.call()
    if args.dash_until is not None and args.dash_since is None:
        from bk.core.errors import UsageError

        raise UsageError("--until goes with --since", hint="e.g. bk u --since 2026-11-01 --until 2026-12-01")
    since = until = None
    if args.dash_since is not None:
        since, until = _period(args.dash_since, args.dash_until, call)
    got = ctx.app().run("usage", UsageRequest(since=since, until=until), call=call)
    d, period = got.dashboard, got.period
    tz, now = call.tz, call.now

    def human(term) -> str:
        if not d.history:
            return ("no usage recorded yet.\n" + d.hint +
                    "\n(bk u then shows what you booked and what you used)")
        lines = [f"usage of {safe(d.user)} (GPU time; active = a process of yours on the booked GPU)",
                 f"  today     {totals_line(d.today, d.prices)}",
                 f"  7 days    {totals_line(d.week, d.prices)}",
                 f"  4 weeks   {totals_line(d.four_weeks, d.prices)}"]
        if period is not None:
            lines.append(f"  {timegrid.format_span(period[0], period[1], tz, now)}: {totals_line(period[2])}")
        lines += ["", "last 7 days:"]
        lines += chart(d.days, [_day_label(b.start, tz) for b in d.days], term)
        lines += ["", "last 4 weeks:"]
        lines += chart(d.weeks, ["wk " + _day_label(b.start, tz)[4:] for b in d.weeks], term)
        per_week = [f"  wk {_day_label(b.start, tz)[4:]}  {energy_text(b.totals.energy_mj, d.prices)}"
                    for b in d.weeks if b.totals.booked_s or b.totals.energy_mj is not None]
        if per_week:
            lines += ["", "energy per week (the driver's counter; unknown where it was not read):", *per_week]
        if d.bookings:
            lines += ["", "recent bookings:"]
            rows = []
            for b in d.bookings:
                when = (timegrid.format_span(b.start, b.end, tz, now) if b.start is not None
                        else "(no longer in the ledger)")
                rows.append([b.reservation[:8], common.gpus_text(b.gpus), when, hours(b.totals.booked_s),
                             hours(b.totals.active_s), share(b.totals.idle_share), sm(b.totals.sm_avg),
                             mem(b.totals.mem_peak_mib), kwh(b.totals.energy_mj)])
            lines.append(table(rows, ["ID", "GPU", "WHEN", "BOOKED", "ACTIVE", "IDLE", "SM", "PEAK", "KWH"],
                               term, shrink=2))
        return "\n".join(lines)

    return Output("usage", got.to_json(), human)


def run_users(args, ctx) -> Output:
    from bk.service import SpanRequest

    call = ctx.call()
    since, until = _span(args, call)
    rep = ctx.app().run("usage_users", SpanRequest(since, until), call=call)
    tz, now = call.tz, call.now

    def human(term) -> str:
        if not rep.history:
            return "no usage recorded yet.\n" + rep.hint
        head = f"usage {timegrid.format_span(since, until, tz, now)}"
        if not rep.rows:
            return head + "\nnobody booked or used a GPU in this period"
        priced = rep.prices.price_per_kwh is not None
        carbon = rep.prices.gco2_per_kwh is not None
        rows = []
        for r in rep.rows:
            got = rep.prices.of(r.totals.energy_mj)
            rows.append([safe(r.user), hours(r.totals.booked_s), hours(r.totals.active_s),
                         share(r.totals.idle_share), hours(r.totals.unreserved_s), sm(r.totals.sm_avg),
                         mem(r.totals.mem_peak_mib), kwh(r.totals.energy_mj),
                         *([_money(got.get("cost"))] if priced else []),
                         *([_money(got.get("co2e_kg"))] if carbon else []), share(r.share)])
        out = [head, table(rows, ["USER", "BOOKED", "ACTIVE", "IDLE", "UNRESERVED", "AVG SM", "PEAK MEM", "KWH",
                                  *(["COST"] if priced else []), *(["KG CO2E"] if carbon else []), "SHARE"],
                           term, shrink=0),
               "SHARE: each user's part of everyone's decayed usage now (half-life "
               f"{_days(rep.half_life_days)}; fair share orders contested advances "
               + ("and is on)" if call.policy.fair_share_half_life_s else "when on)")]
        if rep.gpus:
            grows = [[str(g), hours(t.covered_s), hours(t.booked_s), hours(t.active_s), hours(t.unreserved_s),
                      sm(t.sm_avg), mem(t.mem_peak_mib)] for g, t in sorted(rep.gpus.items())]
            out += ["", table(grows, ["GPU", "SEEN", "BOOKED", "ACTIVE", "UNRESERVED", "AVG UTIL", "PEAK MEM"],
                              term)]
        return "\n".join(out)

    return Output("usage users", rep.to_json(), human)


def _money(x: float | None) -> str:
    return "?" if x is None else f"{x:.2f}"


def run_samples(args, ctx) -> Output:
    from bk.service import SamplesRequest

    call = ctx.call()
    since, until = _span(args, call)
    gpus = common.parse_gpu_list(args.gpu, "-g") if args.gpu else None
    ref = None
    if args.reservation:
        # A booking's evidence: its own span (unless --since/--until say
        # otherwise), the records that credit it.
        from bk.core.errors import NotFound
        from bk.service import ResolveRequest

        try:
            res = ctx.app().run("resolve", ResolveRequest(args.reservation), call=call).reservation
            ref = res.id
            if args.since is None:
                since = res.start
            if args.until is None:
                until = max(since + 1, min(call.now, res.end))
        except NotFound:
            if not all(c in "0123456789abcdef-" for c in args.reservation.lower()) or len(args.reservation) < 4:
                raise
            ref = args.reservation.lower()      # an ended booking: its ID or a prefix of it
    rep = ctx.app().run("usage_samples", SamplesRequest(since, until, gpus, args.limit, reservation=ref), call=call)
    tz, now = call.tz, call.now

    def human(term) -> str:
        if not rep.history:
            return "no usage recorded yet.\n" + rep.hint
        if not rep.records:
            return "no records in this period"
        rows = []
        for r in rep.records:
            shown = [u for u in r.uses if ref is None or (u.reservation or "").startswith(ref)]
            users = ", ".join(
                f"{u.uid}{'' if u.reservation is None else '@' + u.reservation[:8]}"
                f"{' active' if u.active_s else (' idle' if u.booked_s else ' unreserved')}"
                + (f" {u.active_s}/{u.booked_s}s sm {sm(u.sm_avg)} {mem(u.mem_peak_mib)}" if ref else "")
                for u in shown) or "-"
            wh = (r.energy_mj if ref is None else _sum_known(u.energy_mj for u in shown))
            rows.append([timegrid.format_local(r.t, tz, now=now, compact=True), str(r.gpu),
                         f"{r.period_s // 60}m", str(r.samples), "-" if r.util_avg is None else f"{r.util_avg:.0f}%",
                         mem(r.mem_peak_mib), "?" if wh is None else f"{wh / 3.6e6:.1f}", users])
        more = f"\n({rep.total - len(rep.records)} earlier records not shown; -n N)" \
            if rep.total > len(rep.records) else ""
        return table(rows, ["PERIOD", "GPU", "LEN", "N", "UTIL", "MEM", "WH", "UID@BOOKING"], term, shrink=7) + more

    return Output("usage samples", rep.to_json(), human)


def run_events(args, ctx) -> Output:
    from bk.service import EventsRequest

    call = ctx.call()
    since, until = _span(args, call)
    idle = timegrid.parse_duration(args.idle, 1)
    rep = ctx.app().run("usage_events", EventsRequest(since, until, idle), call=call)
    tz, now = call.tz, call.now

    def human(term) -> str:
        if not rep.history:
            return "no usage recorded yet.\n" + rep.hint
        if not rep.events:
            return "no unreserved use and no idle bookings in this period"
        rows = [[timegrid.format_span(e.start, e.end, tz, now), e.kind, safe(rep.names.get(e.uid, e.uid)),
                 str(e.gpu), hours(e.seconds), "-" if e.reservation is None else e.reservation[:8],
                 mem(e.mem_peak_mib)] for e in rep.events]
        return table(rows, ["WHEN", "KIND", "USER", "GPU", "TIME", "BOOKING", "PEAK MEM"], term, shrink=0)

    return Output("usage events", rep.to_json(), human)


def run_verify(args, ctx) -> Output:
    from bk.service import Empty

    rep = ctx.app().run("usage_verify", Empty(), call=ctx.call())

    def human(term) -> str:
        if not rep.checks:
            return "no usage history to verify"
        rows = [[c.kind, c.day, c.state, "-" if c.records is None else str(c.records), safe(c.detail)]
                for c in rep.checks]
        states = {c.state for c in rep.checks}
        said = []
        if states & {"tampered", "seal-without-data"}:
            said.append("some days do not match their seals: the files were changed after sealing")
        if "damaged" in states:
            said.append("some days hold lines that are not usage records: they are skipped, never counted")
        verdict = "\n".join(said) or "every sealed day matches its seal"
        return table(rows, ["KIND", "DAY", "STATE", "RECORDS", "DETAIL"], term, shrink=4, fold=True) + "\n" + verdict

    return Output("usage verify", rep.to_json(), human, exit_code=0 if rep.ok else EXIT_PARTIAL)


def _days(n: float) -> str:
    """``7 days``, ``1 day``, ``0.5 days``: a half-life may be a fraction."""
    return timegrid.counted(int(n) if float(n).is_integer() else n, "day")
