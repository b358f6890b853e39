"""Webhooks: one JSON POST per event, to an address that was checked.

The facts:

* A host name means nothing until it is resolved, and it may resolve to
  anything: ``localhost``, a private address of the lab's network, the
  cloud's metadata service at 169.254.169.254, or (DNS rebinding) a public
  address when it is checked and a loopback one a second later when the
  connection is made.  So the check is made on the address bk connects to,
  not on the name: resolve, refuse unless every address is globally
  routable (``bk.core.notify.address_allowed``; the administrator may allow
  private ones with ``notify_webhook_allow_private``), connect the socket
  to exactly that checked address, and check the connected peer once
  more.  The name is used only for the ``Host`` header and TLS (SNI and the
  certificate check).  No proxy from the environment, no redirects.
* The deliverer runs as the user, who could connect to those addresses
  anyway; the check keeps a mistyped or malicious URL in a shared setup
  from probing internal services in bk's name, and is the rule the
  administrator sets, not a boundary between users.
* A server can accept the connection and never answer, or answer a byte
  at a time.  Every socket operation has a timeout and a watchdog shuts
  the socket down when the whole exchange passes its deadline, so one
  delivery costs at most ``notify_timeout_seconds``.  It runs in the
  deliverer's webhook thread, never in a booking's path.
"""

from __future__ import annotations

import json
import socket

from bk.core import notify as N
from bk.core.record import dataclass
from bk.notify.mail import ChannelError

MAX_REPLY = 64 * 1024
# The name resolver every check and post uses: a seam for tests (a name
# that resolves to a public address once and to a loopback one next).
RESOLVER = socket.getaddrinfo


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str


def split_url(text) -> Target:
    """An http(s) URL, checked: no credentials (they would show in logs),
    a host name or address, a port.  Raises ``bk.core.notify.Invalid``."""
    from urllib.parse import urlsplit

    if not isinstance(text, str) or len(text) > 2000 or any(c.isspace() or not c.isprintable() for c in text):
        raise N.Invalid("a webhook URL is one line of printable text without spaces")
    try:
        u = urlsplit(text)
        port = u.port
    except ValueError as e:
        raise N.Invalid(f"the webhook URL is malformed: {e}") from None
    if u.scheme not in ("http", "https"):
        raise N.Invalid(f"a webhook URL starts with https:// (or http://), not {u.scheme or 'nothing'}",
                        hint="e.g. https://hooks.slack.com/services/...")
    if u.username is not None or u.password is not None:
        raise N.Invalid("a webhook URL may not hold a user name or password",
                        hint="use a URL with a token in its path, as Slack's and ntfy's are")
    host = u.hostname or ""
    if not host:
        raise N.Invalid("the webhook URL names no host")
    if not (N.HOST_NAME.fullmatch(host) or N.is_ip(host)):
        raise N.Invalid(f"the webhook URL's host {host[:60]!r} is not a host name or address")
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    return Target(u.scheme, host, port or (443 if u.scheme == "https" else 80), path)


def resolve(target: Target, *, allow_private: bool, resolver=socket.getaddrinfo) -> list[tuple]:
    """The addresses to connect to, each checked; raises ``ChannelError``
    (permanent) when any address of the name is not allowed: a name that
    resolves partly to this machine is not trusted for the rest."""
    try:
        infos = resolver(target.host, target.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise ChannelError(f"cannot resolve {target.host}: {getattr(e, 'strerror', None) or e}") from None
    addrs = []
    for family, _type, _proto, _canon, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        why = N.address_allowed(sockaddr[0], allow_private)
        if why:
            raise ChannelError(f"the webhook host {target.host} resolves to {why}; only public addresses "
                               "are allowed (the administrator may allow private ones: "
                               "notify_webhook_allow_private)", permanent=True)
        if (family, sockaddr) not in addrs:
            addrs.append((family, sockaddr))
    if not addrs:
        raise ChannelError(f"{target.host} has no IPv4 or IPv6 address")
    return addrs


def _connect(family: int, sockaddr: tuple, timeout: float, allow_private: bool) -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        s.connect(sockaddr)
        why = N.address_allowed(s.getpeername()[0], allow_private)
        if why:                      # cannot happen after the check above; said loudly if it does
            raise ChannelError(f"connected to {why}", permanent=True)
        return s
    except BaseException:
        s.close()
        raise


def post(url: str, body: dict, *, allow_private: bool, timeout: float, event_id: str,
         resolver=socket.getaddrinfo) -> str:
    """POST ``body`` as JSON to ``url``.  Returns ``"HTTP 200"``; raises
    ``ChannelError`` (``permanent`` for a refusal retrying cannot change:
    a forbidden address, an HTTP 4xx other than 408 and 429)."""
    import http.client
    import threading

    try:
        target = split_url(url)
    except N.Invalid as e:
        raise ChannelError(str(e), permanent=True) from None
    addrs = resolve(target, allow_private=allow_private, resolver=resolver)
    data = json.dumps(body, sort_keys=True).encode()
    last: Exception | None = None
    for family, sockaddr in addrs[:3]:
        try:
            sock = _connect(family, sockaddr, timeout, allow_private)
        except ChannelError:
            raise
        except OSError as e:
            last = e
            continue
        if target.scheme == "https":
            import ssl

            try:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=target.host)
            except (OSError, ssl.SSLError) as e:
                sock.close()
                raise ChannelError(f"TLS with {target.host} failed: {e}") from None
        conn = http.client.HTTPConnection(target.host, target.port, timeout=timeout)
        conn.sock = sock             # already connected to the checked address: connect() is not called
        watchdog = threading.Timer(timeout, _shut, (sock,))
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.request("POST", target.path, body=data, headers={
                "Content-Type": "application/json", "User-Agent": "bk-notify",
                "X-Bk-Event-Id": event_id, "Idempotency-Key": event_id})
            reply = conn.getresponse()
            reply.read(MAX_REPLY)
            status = reply.status
        except (OSError, http.client.HTTPException) as e:
            raise ChannelError(f"the webhook at {target.host} did not answer within {timeout:g} s"
                               if isinstance(e, TimeoutError) or not watchdog.is_alive()
                               else f"the webhook at {target.host} failed: {getattr(e, 'strerror', None) or e}") from None
        finally:
            watchdog.cancel()
            conn.close()
        if 200 <= status < 300:
            return f"HTTP {status}"
        raise ChannelError(f"the webhook at {target.host} answered HTTP {status}",
                           permanent=400 <= status < 500 and status not in (408, 429))
    raise ChannelError(f"cannot connect to {target.host}:{target.port}: "
                       f"{getattr(last, 'strerror', None) or last}")


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def check(url: str, *, allow_private: bool, resolver=socket.getaddrinfo) -> Target:
    """What ``bk notify set --webhook URL`` checks before it keeps the URL:
    its form, and that its host resolves now to addresses a webhook may
    use.  Sends nothing (``bk notify test`` does)."""
    target = split_url(url)
    resolve(target, allow_private=allow_private, resolver=resolver)
    return target
