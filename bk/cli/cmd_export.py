"""``bk export prom|ics|html``: the bookings for Prometheus, a calendar, a web page.

Each runs the service's ``export`` row and renders the typed record with
one of the pure renderers of ``bk.export``; nothing here reads a file.
``prom --listen`` serves the same text over HTTP (``http.server``) until
SIGTERM or Ctrl-C, running the row again for every scrape.  It binds only
to a loopback address unless ``--allow-remote`` says otherwise: the
metrics say who books what, and a scrape from elsewhere should go through
a proxy or node_exporter that the administrator chose to expose.
"""

from __future__ import annotations

import argparse
import sys

from bk.cli.render import Output
from bk.core.errors import InvalidInput, IOFailure, UsageError

EPILOG = """Examples:
  bk export prom                      the metrics once, in the Prometheus text format
  bk export prom --listen 127.0.0.1:9187
  bk export ics --mine > ~/bk.ics     your bookings as a calendar feed
  bk export ics --gpu 0               every booking on GPU 0
  bk export html ~/public_html/gpus   the page of the week, as index.html there
"""
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def register(sub) -> None:
    p = sub.add_parser(
        "export", help="bookings for Prometheus, calendars and a web page",
        description="Export the bookings: prom prints Prometheus metrics (the bookings and their use, "
        "per GPU with dcgm-exporter's gpu and UUID labels); ics prints an RFC 5545 calendar feed; html "
        "writes a static page of the week. The monitor keeps all three current when the configuration "
        "names their directories (prometheus_textfile_dir, calendar_dir, html_dir; see gpubk-config(5)).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_subparsers(dest="export_kind", metavar="FORMAT", required=True)
    prom = what.add_parser("prom", help="Prometheus metrics on stdout, or served over HTTP",
                           description="Print the metrics in the Prometheus text format: the same as the "
                           "monitor's textfile (prometheus_textfile_dir).",
                           epilog="Examples:\n  bk export prom\n  bk export prom --listen 127.0.0.1:9187",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    prom.add_argument("--listen", metavar="HOST:PORT",
                      help="serve the metrics at http://HOST:PORT/metrics until stopped (a loopback address "
                           "unless --allow-remote; port 0 picks a free one)")
    prom.add_argument("--allow-remote", action="store_true",
                      help="let --listen bind to an address other machines can reach")
    prom.set_defaults(handler=run, command="export prom")
    ics = what.add_parser("ics", help="an iCalendar feed on stdout",
                          description="Print an RFC 5545 calendar feed: the bookings of the last 14 days and "
                          "ahead, each with a stable UID and a SEQUENCE that grows with every change; "
                          "cancelled ones as STATUS:CANCELLED; times in UTC.",
                          epilog="Examples:\n  bk export ics --mine > ~/bk.ics\n  bk export ics --gpu 0",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    scope = ics.add_mutually_exclusive_group()
    scope.add_argument("--mine", action="store_true", help="your bookings only")
    scope.add_argument("--gpu", type=_gpu, metavar="N", help="the bookings on GPU N")
    scope.add_argument("--all", action="store_true", help="everyone's bookings (the default)")
    ics.set_defaults(handler=run, command="export ics")
    html = what.add_parser("html", help="the page of the week into a directory",
                           description="Write DIR/index.html: a static, self-contained page of this week "
                           "(local time), every GPU by hour, the bookings with owner and mode, now marked, "
                           "maintenance windows, announcements and each GPU's live state.",
                           epilog="Examples:\n  bk export html ~/public_html/gpus",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    html.add_argument("directory", metavar="DIR", help="where index.html goes (made if missing; yours)")
    html.set_defaults(handler=run, command="export html")


def _gpu(text: str) -> int:
    if not text.isdigit() or int(text) > 63:
        raise InvalidInput(f"--gpu takes a GPU index (0-63), not {text!r}")
    return int(text)


def _request(args):
    from bk.service import ExportRequest

    kind = args.export_kind
    if kind == "ics":
        return ExportRequest("ics", "mine" if args.mine else "all", args.gpu)
    return ExportRequest(kind)


def _raw(data: bytes) -> None:
    """Octets to stdout as they are (a feed is UTF-8 whatever the locale)."""
    out = sys.stdout
    if out is None:
        raise OSError(9, "standard output is closed")
    out.flush()
    out.buffer.write(data)
    out.buffer.flush()


def run(args, ctx) -> Output:
    kind = args.export_kind
    if kind == "prom" and args.listen:
        return _listen(args, ctx)
    app, call = ctx.app(), ctx.call()
    got = app.run("export", _request(args), call=call)
    data = dict(got.to_json())
    if kind == "prom":
        from bk.export import prom

        body = prom.render(got.data, user_names=bool(app.settings["prometheus_user_label"])).encode()
    elif kind == "ics":
        from bk.export import ics

        body = ics.render(got.data, name=_feed_name(got, call), busy=got.request.scope == "mine")
    else:
        from bk.clock import describe_zone
        from bk.export import html
        from bk.service import PageRequest

        # The week's page shows the period the row read: it starts at ``since``.
        page = html.render(got.data, tz=call.tz, zone_name=describe_zone(call.tz)["name"],
                           week_start=got.since, generator=_generator())
        data.update(app.run("export_page", PageRequest(args.directory, page), call=call).to_json())
        return Output(args.command, data, f"wrote {data['path']} ({data['bytes']} bytes)")
    if ctx.json:
        data["text"] = body.decode()
        return Output(args.command, data)
    _raw(body)
    return Output(args.command, data, None)


def _feed_name(got, call) -> str:
    req, host = got.request, got.data.host
    if req.scope == "mine":
        return f"{call.actor.user}'s GPU bookings on {host}"
    if req.gpu is not None:
        return f"GPU {req.gpu} bookings on {host}"
    return f"GPU bookings on {host}"


def _generator() -> str:
    from bk import __version__

    return f"bk {__version__}"


def parse_listen(text: str, allow_remote: bool) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (address, port), refusing
    an address that is not loopback unless ``allow_remote``."""
    import ipaddress

    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--listen takes HOST:PORT, not {text!r}", hint="e.g. --listen 127.0.0.1:9187")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host in ("", "localhost"):
        host = "127.0.0.1" if host == "localhost" or not allow_remote else ""
    try:
        ip = ipaddress.ip_address(host) if host else None
    except ValueError:
        raise UsageError(f"--listen: {host!r} is not an IP address", hint="use 127.0.0.1 or ::1") from None
    if (ip is None or not ip.is_loopback) and not allow_remote:
        raise UsageError(f"--listen {text}: {host or 'every address'} is reachable from other machines; the "
                         "metrics name who books what",
                         hint="listen on 127.0.0.1 (or ::1), or add --allow-remote if you mean it")
    return host, int(port)


def _listen(args, ctx) -> Output:
    import http.server
    import signal
    import socket
    import threading

    host, port = parse_listen(args.listen, args.allow_remote)
    opener = ctx.opener
    if opener is None:
        from bk.service import open_app as opener
    user_names = [None]

    def metrics() -> bytes:
        # A fresh service per scrape: its telemetry caches one look per
        # process, and a scrape must see the GPUs now.
        from bk.export import prom

        app = opener(ctx.env)
        got = app.run("export", _request(args), call=app.call())
        user_names[0] = bool(app.settings["prometheus_user_label"])
        return prom.render(got.data, user_names=user_names[0]).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = 10                      # a client that sends nothing does not hold the server

        def do_GET(self):
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                self.send_error(404, "only /metrics is here")
                return
            try:
                body = metrics()
            except Exception as e:        # one failed scrape must not end the server
                msg = f"# bk export prom failed: {type(e).__name__}: {getattr(e, 'message', e)}\n".encode()
                self.send_response(500)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(msg)))
                self.end_headers()
                self.wfile.write(msg)
                return
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *a):   # no access log on stderr
            pass

    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class Server(http.server.HTTPServer):
        address_family = family

    try:
        server = Server((host, port), Handler)
    except OSError as e:
        raise IOFailure(f"cannot listen on {args.listen}: {e.strerror or e}") from None
    bound = server.server_address[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host or "0.0.0.0"
    sys.stderr.write(f"bk export prom: serving http://{shown}:{bound}/metrics (Ctrl-C to stop)\n")
    sys.stderr.flush()

    def stop(signum, frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    old = signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old)
        server.server_close()
    return Output(args.command, {"listen": f"{shown}:{bound}", "stopped": True}, "stopped")
