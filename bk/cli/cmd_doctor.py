"""``bk doctor``: health checks, and with ``--probe --require-monitor
--strict`` the deployment check (exit 1 unless the server is ready)."""

from __future__ import annotations

import argparse

from bk.cli.render import Output, table, wrap
from bk.core.errors import EXIT_PARTIAL, ConfigError
from bk.core.timegrid import counted

EPILOG = """Examples:
  bk doctor
  bk doctor --strict                            exit 1 when a check fails or warns
  bk doctor --probe --strict                    try the broker, a replace and the lock
  bk doctor --probe --require-monitor --strict  the deployment check of a shared server
  bk doctor --require-worker --strict           will my scheduled commands start?
  bk doctor --json                              every check with its status and fix

A check is ok, WARN (works, but look at it) or FAIL; each one that is not ok
says how to fix it.  Exit status: 0, or with --strict 1 when a check failed
or warned."""


def register(sub) -> None:
    p = sub.add_parser(
        "doctor", help="check the installation; with --probe --strict, the deployment check",
        description="Check the configuration's trust (its owner and mode and every directory above "
        "it), the data directory's and the broker socket's owners and modes, the ledger, its "
        "backups and audit log, the policy bound in the ledger, the GPU telemetry source and the "
        "monitor's heartbeat. Changes nothing, except with --probe, which also tries for real what "
        "a booking needs: on a shared server that the broker answers and knows you by your own "
        "UID, and (as the service account, through the broker) an atomic replace and the writers' "
        "lock in the data directory.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strict", action="store_true",
                   help="count warnings as failures, and exit 1 when any check is not ok")
    p.add_argument("--probe", action="store_true",
                   help="also try the broker round trip, an atomic replace and the lock")
    p.add_argument("--require-monitor", action="store_true",
                   help="fail unless the GPU monitor (bk m) is running and its heartbeat is fresh "
                        "(without it a stopped monitor is a warning, and none at all is fine)")
    p.add_argument("--require-worker", action="store_true",
                   help="fail unless your scheduled-command worker (bk w) runs; without it, a missing "
                        "worker is a warning only while you have jobs waiting")
    p.set_defaults(handler=run, command="doctor")


def run(args, ctx) -> Output:
    from bk.service import DoctorRequest, DoctorResult

    flags = {"probe": args.probe, "strict": args.strict, "require_monitor": args.require_monitor,
             "require_worker": args.require_worker}
    try:
        app, call = ctx.app(), ctx.call()
    except ConfigError as e:
        # Every other command refuses an unusable configuration (exit 78);
        # the doctor reports it as its failed check, with the fix.
        report = DoctorResult.unusable(e, **flags)
    else:
        report = app.run("doctor", DoctorRequest(**flags), call=call)

    def human(term) -> str:
        def result(c) -> str:
            if c["status"] == "ok":
                return "ok"
            word = "FAIL" if not c["ok"] else "WARN"
            return term.style(word, "red" if word == "FAIL" else "yellow", "bold")

        checks = report["checks"]
        rows = [[c["name"], result(c), c["detail"]] for c in checks]
        if not term.tty:
            # A report read later (a ticket, a log, a mail) needs every word
            # of the details: no table cut to a width nobody sees.
            # Wrapped to the width, never cut.
            w = max(len(r[0]) for r in rows) if rows else 5
            pad = " " * (w + 8)
            body = "\n".join(wrap(f"{r[0]:<{w}}  {r[1]:<4}  {r[2]}", term.width, "", pad) for r in rows)
        else:
            body = table(rows, ["CHECK", "RESULT", "DETAIL"], term, shrink=2)
        fixes = [wrap(f"{c['name']}: {c['fix']}", term.width, "  ", "    ")
                 for c in checks if c["status"] != "ok" and c["fix"]]
        if fixes:
            body += "\nto fix:\n" + "\n".join(fixes)
        return body + "\n" + verdict(report)

    code = EXIT_PARTIAL if args.strict and not report["ok"] else 0
    return Output("doctor", report.to_json(), human, exit_code=code)


def verdict(report: dict) -> str:
    """The last line: ready or not, naming what is not."""
    failed, warned = report["failed"], report["warnings"]
    if failed:
        return f"not ready: {counted(len(failed), 'check')} failed ({', '.join(failed)})"
    if warned:
        names = [c["name"] for c in report["checks"] if c["status"] == "warn"]
        return (f"all checks passed, {counted(warned, 'warning')} ({', '.join(names)}); "
                "--strict counts warnings as failures")
    return "all checks passed"
