"""``bk m`` (``monitor``): run the GPU monitor daemon, print one sample
(``--once``), or show its heartbeat (``bk m status``).

The daemon lives in ``bk.monitor.daemon``; this module parses the flags and
renders its results like any command.
"""

from __future__ import annotations

import argparse

from bk.cli.render import Output, safe, table
from bk.core.timegrid import counted

EPILOG = """Examples:
  bk m                      run the monitor in the foreground (private mode: as you)
  sudo -u gpubk bk m        on a shared server, as the monitor account (systemd does this)
  bk m --once               one sample of every GPU and its processes, nothing written
  bk m --once --json        the same as one JSON envelope
  bk m status               is a monitor running? (running, degraded, stale, stopped,
                            topology-mismatch, damaged or absent)

The monitor samples the GPUs every 2 seconds, writes the latest sample to
DATA_DIR/monitor/snapshot.json and a heartbeat beside it, and folds the samples
into usage history (DATA_DIR/usage). bk st, bk g and the broker read the
snapshot while it is fresh instead of asking the GPUs themselves.
It refuses to start while another monitor runs here (exit 75), and on a shared
server under another account than monitor_uid (or service_uid) (exit 77).
SIGTERM or Ctrl-C flushes the minute in progress and records 'stopped'."""


def _interval(text: str) -> float:
    from bk.core.errors import InvalidInput

    try:
        value = float(text)
    except ValueError:
        raise InvalidInput(f"expected seconds, got {text!r}") from None
    if not 0.05 <= value <= 3600:
        raise InvalidInput(f"expected seconds between 0.05 and 3600, got {text!r}")
    return value


def register(sub) -> None:
    p = sub.add_parser("monitor", aliases=["m"], help="the GPU monitor daemon (systemd), one sample, its state",
                       description="Run the GPU monitor in the foreground until SIGTERM: sample every GPU, "
                       "judge each process against the bookings, keep usage history, and publish a "
                       "snapshot and a heartbeat that bk st and the broker read.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", nargs="?", choices=["status"],
                   help="status: show the heartbeat of the running monitor (read-only)")
    p.add_argument("--once", action="store_true", help="take one sample, print it and exit; writes nothing")
    p.add_argument("--status", dest="status_flag", action="store_true", help="the same as bk m status")
    # Tests and benchmarks sample faster than the 2 s a server uses.
    p.add_argument("--interval", type=_interval, default=2.0, help=argparse.SUPPRESS)
    p.set_defaults(handler=run, command="monitor")


def run(args, ctx) -> Output:
    from bk.monitor import daemon

    if args.action == "status" or args.status_flag:
        hb = daemon.heartbeat(ctx.env)
        return Output("monitor", hb.to_json(), heartbeat_line(hb))
    if args.once:
        got = daemon.once(ctx.env)
        return Output("monitor", got.to_json(), lambda term: once_text(got, term))
    stats = daemon.run(ctx.env, interval_s=args.interval)
    return Output("monitor", {"stopped": True, "samples": stats.samples, "flushed": stats.flushed,
                              "pid": stats.pid}, None)


def heartbeat_line(hb) -> str:
    if hb.state in ("absent", "damaged"):
        return f"monitor: {hb.state} ({safe(hb.detail)})" if hb.detail else f"monitor: {hb.state}"
    bits = [f"pid {hb.pid}"]
    if hb.age_s is not None:
        bits.append(f"last sample {hb.age_s} s ago")
    if hb.interval_s is not None:
        bits.append(f"every {hb.interval_s:g} s")
    if hb.samples is not None:
        bits.append(counted(hb.samples, "sample"))
    line = f"monitor: {hb.state} ({', '.join(bits)})"
    return line + (f"\n  {safe(hb.detail)}" if hb.detail else "")


def _cell(v) -> str:
    return "?" if v is None else str(v)


def once_text(got, term) -> str:
    s = got.sample
    head = f"monitor sample: {s.status}" + (f" ({safe(s.detail)})" if s.detail else "")
    if s.snapshot is None:
        return head + "\nno GPU readings"
    snap = s.snapshot
    rows, procs = [], []
    for g in snap.gpus:
        mem = "?" if g.mem_used_mib is None else f"{g.mem_used_mib}/{_cell(g.mem_total_mib)}"
        util = "?" if g.util is None else f"{g.util}%"
        rows.append([str(g.index), safe(g.name or "?"), util, mem,
                     "?" if g.processes is None else str(len(g.processes))])
        for p in g.processes or ():
            a = s.attributions.get((g.index, p.pid))
            state = getattr(a, "state", a) if a is not None else "?"
            identity = getattr(a, "identity", None) or ""
            who = safe(p.user) if p.user else (f"uid {p.uid}" if p.uid is not None else "?")
            procs.append([str(g.index), str(p.pid), who, safe(p.label or "?"), _cell(p.mem_mib),
                          _cell(p.sm), f"{state} {identity}".strip()])
    parts = [head + f"\nsource: {safe(snap.source)}" + (" (simulated)" if snap.simulated
                                                          and snap.source != "simulated" else "")
             + (f"; gaps: {', '.join(snap.gaps)}" if snap.gaps else ""),
             table(rows, ["GPU", "MODEL", "UTIL", "MEM MiB", "PROCS"], term, shrink=1)]
    if procs:
        parts.append(table(procs, ["GPU", "PID", "USER", "LABEL", "MiB", "SM%", "STATE"], term, shrink=3))
    return "\n\n".join(parts)
