"""``bk doctor``: read-only health checks (``--strict``: any failure exits 1)."""

from __future__ import annotations

import argparse

from bk.cli.render import Output, table, wrap
from bk.core.errors import EXIT_PARTIAL
from bk.service.doctor import doctor


def register(sub) -> None:
    p = sub.add_parser(
        "doctor", help="check the installation (read-only)",
        description="Check the configuration's trust, the data directory's owner and modes, "
        "the ledger, the policy bound in the ledger and the GPU backend. Changes nothing, "
        "except with --probe, which also tries for real what a booking needs: on a shared "
        "server the broker's answer and identity, and (through the broker) an atomic "
        "replace and the writers' lock in the data directory.",
        epilog="Examples:\n  bk doctor\n  bk doctor --strict           exit 1 when any check fails\n"
               "  bk doctor --probe --strict   the deployment check\n\n"
               "Exit status: 0, or 1 with --strict when a check failed.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strict", action="store_true", help="exit 1 when any check fails")
    p.add_argument("--probe", action="store_true",
                   help="also try the broker round trip, an atomic replace and the lock")
    p.set_defaults(handler=run, command="doctor")


def run(args, ctx) -> Output:
    report = doctor(ctx.app(), probe=args.probe, call=ctx.call())
    report["strict"] = args.strict
    report["probe"] = args.probe

    def human(term) -> str:
        rows = [[c["name"], "ok" if c["ok"] else term.style("FAIL", "red", "bold"), c["detail"]]
                for c in report["checks"]]
        verdict = "all checks passed" if report["ok"] else \
            f"{sum(not c['ok'] for c in report['checks'])} check(s) failed"
        if not term.tty:
            # A report read later (a ticket, a log, a mail) needs every word
            # of the details: no table cut to a width nobody sees.
            # Wrapped to the width, never cut.
            w = max(len(r[0]) for r in rows) if rows else 5
            pad = " " * (w + 8)
            return "\n".join(wrap(f"{r[0]:<{w}}  {r[1]:<4}  {r[2]}", term.width, "", pad)
                             for r in rows) + "\n" + verdict
        return table(rows, ["CHECK", "RESULT", "DETAIL"], term, shrink=2) + "\n" + verdict

    code = EXIT_PARTIAL if args.strict and not report["ok"] else 0
    return Output("doctor", report, human, exit_code=code)
