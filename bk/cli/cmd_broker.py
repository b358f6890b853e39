"""``bk broker [--check]``: run the shared-server daemon (as the service
account, normally from systemd) or check that it could start.

The daemon itself lives in ``bk.broker.server``; this module parses the
flags, and renders ``--check`` and the final statistics like any command.
"""

from __future__ import annotations

import argparse

from bk.cli.render import Output

EPILOG = """Examples:
  sudo -u gpubk bk broker
  sudo -u gpubk bk broker --check        (systemd: ExecStartPre=)
  sudo -u gpubk BK_CONFIG_FILE=/etc/gpubk/test.json bk broker --frame-timeout 2

It refuses to start (and --check fails) with an untrusted config (exit 78),
under another account than service_uid (77), with a data or socket directory
of the wrong owner or mode (78), or when another broker answers (75).
SIGTERM stops it cleanly. Settings come from the trusted config only
(man 5 gpubk-config)."""


def _positive_float(text: str) -> float:
    from bk.core.errors import InvalidInput

    try:
        value = float(text)
    except ValueError:
        raise InvalidInput(f"expected seconds, got {text!r}") from None
    if not 0 < value <= 3600:
        raise InvalidInput(f"expected seconds between 0 and 3600, got {text!r}")
    return value


def register(sub) -> None:
    from bk.cli import common

    p = sub.add_parser("broker", help="run the shared-server broker (service account, systemd)",
                       description="Serve bookings for every user of this server on the Unix socket "
                       "named by the trusted config. Runs until SIGTERM.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true",
                   help="check config trust, account, directories and that no broker answers; then exit")
    p.add_argument("--max-clients", metavar="N", type=common.positive_int, default=64,
                   help="connections served at once; more are told 'busy' (default 64)")
    p.add_argument("--idle-timeout", metavar="S", type=_positive_float, default=30.0,
                   help="close a connection idle this long between requests (default 30)")
    p.add_argument("--frame-timeout", metavar="S", type=_positive_float, default=10.0,
                   help="a request must arrive, and its reply be taken, within this many seconds "
                        "(default 10)")
    p.set_defaults(handler=run, command="broker")


def run(args, ctx) -> Output:
    from bk.broker import server

    if args.check:
        result = server.check(ctx.env)
        plan = result.plan
        data = {"ok": True, "config_file": plan.config_file, "data_dir": plan.data_dir,
                "socket": plan.socket_path, "service_uid": plan.service_uid, "access": plan.access,
                "ledger": result.ledger}
        human = "\n".join(["the broker can start:",
                           f"  config  {plan.config_file} (trusted)",
                           f"  data    {plan.data_dir} (owner uid {plan.service_uid}, safe mode)",
                           f"  socket  {plan.socket_path} (access {plan.access}; no other broker answers)",
                           f"  ledger  {result.ledger}"])
        return Output("broker", data, human)
    stats = server.run(ctx.env, max_clients=args.max_clients, idle_timeout=args.idle_timeout,
                       frame_timeout=args.frame_timeout)
    data = {"stopped": True, "connections": stats.connections, "requests": stats.requests,
            "errors": stats.errors, "refused": stats.refused}
    return Output("broker", data, None)
