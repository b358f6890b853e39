"""Email through the administrator's relay (``smtplib``), and the check made
when a user sets an address.

The relay is the only mail server bk talks to (``notify_smtp_host``,
``notify_smtp_port``, ``notify_smtp_starttls``): no MX lookup, no
credentials in a world-readable config.  Every call has a timeout
(``notify_timeout_seconds``), so a relay that hangs costs one bounded try.

A message carries ``Message-ID: <KEY-DIGEST@bk>``, the same for every try
of one event: after a crash between the relay's "250 OK" and the delivery
log's "sent", the retry is a duplicate that mail systems can recognise.
"""

from __future__ import annotations

import json

from bk.core.record import dataclass


class ChannelError(Exception):
    """A delivery (or a check) that failed; ``str()`` says why in words."""

    def __init__(self, message: str, *, permanent: bool = False):
        super().__init__(message)
        self.permanent = permanent       # retrying cannot help (the relay refused the address)


@dataclass(frozen=True)
class Relay:
    host: str
    port: int
    starttls: bool
    sender: str
    timeout: float


def _connect(relay: Relay):
    import smtplib

    try:
        s = smtplib.SMTP(relay.host, relay.port, timeout=relay.timeout)
    except (OSError, smtplib.SMTPException) as e:
        raise ChannelError(f"cannot reach the mail relay {relay.host}:{relay.port}: {_why(e)}") from None
    try:
        s.ehlo_or_helo_if_needed()
        if relay.starttls:
            import ssl

            s.starttls(context=ssl.create_default_context())
            s.ehlo()
    except (OSError, smtplib.SMTPException) as e:
        _quit(s)
        raise ChannelError(f"the mail relay {relay.host}:{relay.port} failed the greeting: {_why(e)}") from None
    return s


def _why(e: BaseException) -> str:
    import smtplib

    if isinstance(e, smtplib.SMTPResponseException):
        text = e.smtp_error.decode("utf-8", "replace") if isinstance(e.smtp_error, bytes) else str(e.smtp_error)
        return f"{e.smtp_code} {' '.join(text.split())[:200]}"
    if isinstance(e, smtplib.SMTPRecipientsRefused):
        (code, text), = e.recipients.values()
        return f"{code} {' '.join(text.decode('utf-8', 'replace').split())[:200]}"
    if isinstance(e, TimeoutError):
        return "timed out"
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


def _quit(s) -> None:
    try:
        s.quit()
    except Exception:
        try:
            s.close()
        except Exception:
            pass


def verify(relay: Relay, address: str) -> str:
    """Ask the relay whether it takes mail for ``address`` (MAIL FROM, RCPT
    TO, RSET: nothing is sent).  Returns the relay's answer; raises
    ``ChannelError`` when it refuses or cannot be reached."""
    import smtplib

    s = _connect(relay)
    try:
        code, text = s.mail(relay.sender)
        if code >= 400:
            raise ChannelError(f"the mail relay refused the sender {relay.sender}: {code} "
                               f"{text.decode('utf-8', 'replace')[:200]}", permanent=True)
        code, text = s.rcpt(address)
        if code >= 400:
            raise ChannelError(f"the mail relay refuses mail for {address}: {code} "
                               f"{' '.join(text.decode('utf-8', 'replace').split())[:200]}", permanent=True)
        s.rset()
        return f"{code} {' '.join(text.decode('utf-8', 'replace').split())[:100]}"
    except (OSError, smtplib.SMTPException) as e:
        raise ChannelError(f"the mail relay {relay.host}:{relay.port} failed: {_why(e)}") from None
    finally:
        _quit(s)


def message(relay: Relay, to: str, doc: dict, message_id: str) -> bytes:
    from email.message import EmailMessage
    from email.utils import formatdate

    m = EmailMessage()
    m["From"] = relay.sender
    m["To"] = to
    m["Subject"] = f"bk: {doc['title']}"
    m["Date"] = formatdate(localtime=False)
    m["Message-ID"] = message_id
    m["Auto-Submitted"] = "auto-generated"
    m["X-Bk-Event"] = doc["event"]
    m.set_content(doc["text"] + "\n\n-- \nbk notify: change what you are told with bk notify set\n")
    m.add_attachment(json.dumps(doc, indent=1, sort_keys=True).encode(), maintype="application",
                     subtype="json", filename="event.json")
    return m.as_bytes()


def send(relay: Relay, to: str, doc: dict, message_id: str) -> str:
    """Send one notification; returns the relay's answer, raises ``ChannelError``."""
    import smtplib

    data = message(relay, to, doc, message_id)
    s = _connect(relay)
    try:
        s.sendmail(relay.sender, [to], data)
    except smtplib.SMTPRecipientsRefused as e:
        raise ChannelError(f"the mail relay refused {to}: {_why(e)}", permanent=True) from None
    except (OSError, smtplib.SMTPException) as e:
        raise ChannelError(f"the mail relay {relay.host}:{relay.port} failed: {_why(e)}") from None
    finally:
        _quit(s)
    return f"accepted by {relay.host}:{relay.port}"
