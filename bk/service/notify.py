"""``bk notify``: a user's notification choices, the proof that each channel
works, the delivery log, and the doctor's line.

Choices live in the user's own file (``$XDG_CONFIG_HOME/bk/notify.json``,
0600; ``bk.notify.files``): which events, which channels, quiet hours, the
email address and the webhook URL.  The address and the URL are the
user's alone: no shared file holds them, the broker never sees them, and
only the user's own deliverer (in the user's worker) reads them.  What a
user has not chosen comes from the administrator's defaults in the trusted
configuration (``notify_*`` keys), then from bk's.

A choice that cannot work is refused when it is made, with the reason: an
unknown event or channel (with the nearest name), a malformed address or
URL, a webhook host that resolves to an address webhooks may not use, a
mail relay that refuses the address (asked with RCPT TO, nothing sent), a
channel chosen without what it needs.

The rows (``bk.service``: ``notify_show``, ``notify_set``, ``notify_test``,
``notify_log``) are local: they touch only the caller's own files and
terminals, so every caller runs them in its own process (``served=False``),
never the broker; ``notify_set`` is a local write (the caller's own file).
"""

from __future__ import annotations

import os

from bk.core import notify as N
from bk.core.errors import BkError, ConfigError, InvalidInput
from bk.core.models import iso
from bk.core.record import dataclass, field
from bk.core.timegrid import counted
from bk.service.fields import Field

# The requests' list fields travel as comma-separated text.
NAMES = "[a-z_,]*"
MINUTES = "[0-9,]*|default"


@dataclass(frozen=True)
class NotifySetRequest:
    events: str | None = None          # "ends_soon,ended", "all" or "default"
    channels: str | None = None        # "terminal,email" or "default"
    quiet: str | None = None           # "22:00-07:00", "off" or "default"
    email: str | None = None           # an address, or "off"
    webhook: str | None = None         # a URL, or "off"
    preset: str | None = None          # json, slack, matrix, ntfy
    start_minutes: str | None = None   # "10" or "default"
    end_minutes: str | None = None     # "30,15,5" or "default"
    desktop: str | None = None         # auto, osc9, osc777, off
    reset: bool = False                # forget every choice first
    dry_run: bool = False


@dataclass(frozen=True)
class NotifyTestRequest:
    channels: str | None = None        # only these (default: every chosen one)


@dataclass(frozen=True)
class NotifyLogRequest:
    limit: int = 20


_SET = (Field("events", "text", max_len=400, pattern=NAMES + "|all|default", help="event names, comma-separated"),
        Field("channels", "text", max_len=100, pattern=NAMES + "|default", help="channel names, comma-separated"),
        Field("quiet", "text", max_len=20, help="HH:MM-HH:MM, off or default"),
        Field("email", "text", max_len=254, help="an email address, or off"),
        Field("webhook", "text", max_len=2000, help="an http(s) URL, or off"),
        Field("preset", "choice", choices=N.PRESETS),
        Field("start_minutes", "text", max_len=60, pattern=MINUTES),
        Field("end_minutes", "text", max_len=60, pattern=MINUTES),
        Field("desktop", "choice", choices=N.DESKTOP_MODES),
        Field("reset", "bool", help="forget every choice first"),
        Field("dry_run", "bool", help="check and show; change nothing"))
SET_FIELDS = _SET
TEST_FIELDS = (Field("channels", "text", max_len=100, pattern=NAMES, help="only these channels"),)
LOG_FIELDS = (Field("limit", "int", lo=1, hi=1000),)


@dataclass(frozen=True)
class NotifyResult:
    """What a notify row returns: its JSON, made once by the serve function."""

    json: dict | None = field(default=None, compare=False)

    def rendered(self, view) -> NotifyResult:
        return self

    def to_json(self) -> dict:
        return self.json or {}


# ------------------------------------------------------------ the choices

@dataclass(frozen=True)
class Prefs:
    """The choices in force: the user's, else the administrator's, else bk's."""

    events: tuple
    channels: tuple
    quiet: tuple | None
    quiet_text: str | None
    email: str | None
    webhook: str | None
    preset: str
    start_minutes: tuple
    end_minutes: tuple
    desktop: str
    source: dict

    def to_json(self) -> dict:
        return {"events": list(self.events), "channels": list(self.channels), "quiet": self.quiet_text,
                "email": self.email, "webhook": self.webhook, "preset": self.preset,
                "start_minutes": list(self.start_minutes), "end_minutes": list(self.end_minutes),
                "desktop": self.desktop, "source": dict(self.source)}

    def timing(self) -> N.Timing:
        return N.Timing(self.start_minutes, self.end_minutes)


def prefs_path(settings) -> str:
    from bk.notify.files import PREFS_FILE

    base = settings.locations.config_dir or settings.locations.state_dir
    return os.path.join(base, PREFS_FILE)


def log_dir(settings) -> str:
    from bk.notify.files import notify_dir

    return notify_dir(settings.locations.state_dir)


def _checked(stored: dict, path: str) -> dict:
    """The stored choices, each checked as ``set`` would; a file edited by
    hand into something bk would not write is refused, naming the key."""
    out = {}
    try:
        for k, v in stored.items():
            if k == "events":
                out[k] = N.check_names(v, N.EVENTS, "event")
            elif k == "channels":
                out[k] = N.check_names(v, N.CHANNELS, "channel")
            elif k in ("start_minutes", "end_minutes"):
                out[k] = N.check_minutes(v, k)
            elif k == "quiet":
                N.parse_quiet(v)
                out[k] = v
            elif k == "email":
                out[k] = N.check_email(v)
            elif k == "webhook":
                if not isinstance(v, dict) or not isinstance(v.get("url"), str) \
                        or v.get("preset", "json") not in N.PRESETS:
                    raise N.Invalid("webhook must be {\"url\": ..., \"preset\": ...}")
                out[k] = v
            elif k == "desktop":
                if v not in N.DESKTOP_MODES:
                    raise N.Invalid(f"desktop must be one of {', '.join(N.DESKTOP_MODES)}")
                out[k] = v
    except N.Invalid as e:
        raise ConfigError(f"{path}: {e}", hint="fix it with bk notify set (bk notify set --reset starts over)") from None
    return out


def effective(stored: dict, settings, user: str) -> Prefs:
    source = {}

    def pick(name: str, key: str):
        if name in stored:
            source[name] = "you"
            return stored[name]
        source[name] = "administrator" if key in settings.explicit else "bk"
        return settings[key]
    events = tuple(pick("events", "notify_events"))
    channels = tuple(pick("channels", "notify_channels"))
    quiet_text = pick("quiet", "notify_quiet_hours")
    if quiet_text == "off":
        quiet_text = None
    start = tuple(pick("start_minutes", "notify_start_minutes"))
    end = tuple(pick("end_minutes", "notify_end_minutes"))
    email = stored.get("email")
    source["email"] = "you" if email else None
    if not email and settings["notify_email_domain"]:
        email = f"{user}@{settings['notify_email_domain']}"
        source["email"] = "administrator"
    hook = stored.get("webhook") or {}
    source["webhook"] = "you" if hook else None
    desktop = stored.get("desktop", "auto")
    source["desktop"] = "you" if "desktop" in stored else "bk"
    return Prefs(events, channels, N.parse_quiet(quiet_text), quiet_text, email, hook.get("url"),
                 hook.get("preset", "json"), start, end, desktop, source)


def load(app) -> tuple[dict, Prefs]:
    from bk.notify.files import read_prefs

    path = prefs_path(app.settings)
    stored = _checked(read_prefs(path), path)
    return stored, effective(stored, app.settings, app.actor.user)


# ------------------------------------------------------------ the channels' settings

def relay_of(settings):
    """The administrator's mail relay, or None when none is set."""
    from bk.notify.mail import Relay

    host = settings["notify_smtp_host"]
    if not host:
        return None
    import socket

    sender = settings["notify_mail_from"] or f"bk@{socket.getfqdn() or 'localhost'}"
    return Relay(host, settings["notify_smtp_port"], settings["notify_smtp_starttls"], sender,
                 settings["notify_timeout_seconds"])


def message_id(key: str) -> str:
    import hashlib
    import socket

    return f"<{hashlib.sha256(key.encode()).hexdigest()[:32]}@bk.{socket.gethostname() or 'localhost'}>"


def post_target(prefs: Prefs) -> tuple[str, str | None]:
    """Where a webhook posts and the ntfy topic: ntfy takes JSON at its root
    URL with the topic in the body."""
    from bk.notify import webhook

    if prefs.preset != "ntfy":
        return prefs.webhook, None
    t = webhook.split_url(prefs.webhook)
    root = f"{t.scheme}://{t.host}" + ("" if t.port in (80, 443) else f":{t.port}") + "/"
    return root, N.topic_of(t.path)


def senders(settings) -> dict:
    """``channel -> (event doc, prefs) -> detail`` for the deliverer and ``test``."""
    from bk.notify import mail, webhook

    def email(doc: dict, prefs: Prefs) -> str:
        relay = relay_of(settings)
        if relay is None:
            raise mail.ChannelError("the administrator has set no mail relay (notify_smtp_host)", permanent=True)
        if not prefs.email:
            raise mail.ChannelError("no email address (bk notify set --email ADDR)", permanent=True)
        return mail.send(relay, prefs.email, doc, message_id(doc["id"]))

    def hook(doc: dict, prefs: Prefs) -> str:
        if not prefs.webhook:
            raise mail.ChannelError("no webhook URL (bk notify set --webhook URL)", permanent=True)
        try:
            url, topic = post_target(prefs)
        except N.Invalid as e:
            raise mail.ChannelError(str(e), permanent=True) from None
        return webhook.post(url, N.webhook_body(prefs.preset, doc, topic),
                            allow_private=settings["notify_webhook_allow_private"],
                            timeout=settings["notify_timeout_seconds"], event_id=doc["id"],
                            resolver=webhook.RESOLVER)
    return {N.EMAIL: email, N.WEBHOOK: hook}


# ------------------------------------------------------------ bk notify set

def _names(text: str, allowed: tuple, what: str, default_all: bool = False) -> tuple | None:
    """``"a,b"`` -> the names; ``"default"`` -> None (the administrator's); ``"all"``."""
    if text == "default":
        return None
    if text == "all" and default_all:
        return tuple(allowed)
    if text == "none":
        return ()
    return N.check_names([w for w in text.split(",") if w], allowed, what)


def _minutes(text: str, what: str) -> tuple | None:
    if text == "default":
        return None
    try:
        values = [int(w) for w in text.split(",") if w]
    except ValueError:
        raise N.Invalid(f"{text!r} is not a list of minutes, e.g. 30,15,5") from None
    return N.check_minutes(values, what)


def _refuse(e: N.Invalid, flag: str) -> InvalidInput:
    return InvalidInput(f"{flag}: {e}", hint=e.hint)


def serve_set(app, req: NotifySetRequest, call) -> NotifyResult:
    """Check every choice, then keep them; nothing is kept unless all pass."""
    from bk.notify import files, mail, webhook

    path = prefs_path(app.settings)
    stored = {} if req.reset else dict(_checked(files.read_prefs(path), path))
    checks = []
    for name, flag, parse in (("events", "--events", lambda t: _names(t, N.EVENTS, "event", True)),
                              ("channels", "--channels", lambda t: _names(t, N.CHANNELS, "channel")),
                              ("start_minutes", "--start-minutes", lambda t: _minutes(t, "--start-minutes")),
                              ("end_minutes", "--end-minutes", lambda t: _minutes(t, "--end-minutes"))):
        text = getattr(req, name)
        if text is None:
            continue
        try:
            value = parse(text)
        except N.Invalid as e:
            raise _refuse(e, flag) from None
        if value is None:
            stored.pop(name, None)
        else:
            stored[name] = list(value)
    if req.quiet is not None:
        if req.quiet == "default":
            stored.pop("quiet", None)
        else:
            try:
                N.parse_quiet(req.quiet)
            except N.Invalid as e:
                raise _refuse(e, "--quiet") from None
            stored["quiet"] = req.quiet.strip()
    if req.desktop is not None:
        stored["desktop"] = req.desktop
    if req.email is not None:
        if req.email == "off":
            stored.pop("email", None)
        else:
            try:
                stored["email"] = N.check_email(req.email)
            except N.Invalid as e:
                raise _refuse(e, "--email") from None
            relay = relay_of(app.settings)
            if relay is None:
                raise InvalidInput("--email: the administrator has set no mail relay on this server "
                                   "(notify_smtp_host), so bk cannot send mail",
                                   hint="use a webhook or your terminals, or ask the administrator")
            try:
                said = mail.verify(relay, stored["email"])
            except mail.ChannelError as e:
                raise InvalidInput(f"--email: {e}", hint="check the address; bk notify test sends one") from None
            checks.append({"channel": N.EMAIL, "detail": f"the relay takes mail for it ({said})"})
    hook = dict(stored.get("webhook") or {})
    if req.webhook is not None:
        if req.webhook == "off":
            hook = {}
        else:
            try:
                target = webhook.check(req.webhook, allow_private=app.settings["notify_webhook_allow_private"],
                                       resolver=webhook.RESOLVER)
            except N.Invalid as e:
                raise _refuse(e, "--webhook") from None
            except mail.ChannelError as e:
                raise InvalidInput(f"--webhook: {e}") from None
            hook["url"] = req.webhook
            checks.append({"channel": N.WEBHOOK, "detail": f"{target.host} resolves to addresses a "
                           "webhook may use"})
    if req.preset is not None:
        if not hook:
            raise InvalidInput("--preset: there is no webhook URL to apply it to", hint="add --webhook URL")
        hook["preset"] = req.preset
    if hook:
        hook.setdefault("preset", "json")
        if hook["preset"] == "ntfy":
            try:
                N.topic_of(webhook.split_url(hook["url"]).path)
            except N.Invalid as e:
                raise _refuse(e, "--preset ntfy") from None
        stored["webhook"] = hook
    else:
        stored.pop("webhook", None)
    prefs = effective(stored, app.settings, app.actor.user)
    # Only a choice of the user's own is refused here: the administrator's
    # defaults may name a channel a user has not set up (it is then skipped).
    chosen = prefs.channels if "channels" in stored else ()
    if N.EMAIL in chosen:
        if not prefs.email:
            raise InvalidInput("--channels: email needs an address", hint="add --email ADDR")
        if relay_of(app.settings) is None:
            raise InvalidInput("--channels: email needs a mail relay, and the administrator has set "
                               "none (notify_smtp_host)")
    if N.WEBHOOK in chosen and not prefs.webhook:
        raise InvalidInput("--channels: webhook needs a URL", hint="add --webhook URL")
    if not req.dry_run:
        files.write_prefs(path, stored)
    return NotifyResult({"status": "dry_run" if req.dry_run else "saved", "file": path,
                         "settings": prefs.to_json(), "checks": checks})


# ------------------------------------------------------------ bk notify (show)

def terminals_json(uid: int) -> list[dict]:
    """The terminals a line would go to now, and why one would not."""
    import stat

    from bk.notify import terminals

    out = []
    for t in terminals.find(uid):
        try:
            st = os.stat(t.path)
        except OSError:
            continue
        if st.st_uid != uid:
            state = "not-yours"
        elif not st.st_mode & stat.S_IWGRP:
            state = "mesg-n"
        else:
            state = "ok"
        out.append({"path": t.path, "state": state, "desktop": terminals.desktop_kind(t.env, "auto"),
                    "term": t.env.get("TERM"), "term_program": t.env.get("TERM_PROGRAM")})
    return out


def deliverer_json(app) -> dict:
    from bk.core.models import iso
    from bk.notify.files import deliverer_status

    st = deliverer_status(log_dir(app.settings))
    return {**st, "since": iso(st["since"]) if st["since"] else None}


def _health(doc: dict) -> dict:
    out = {}
    for ch, h in (doc.get("health") or {}).items():
        failing = bool(h.get("failures")) and (h.get("last_failure") or 0) >= (h.get("last_ok") or 0)
        out[ch] = {"failing": failing, "failures": h.get("failures") or 0, "error": h.get("error"),
                   "last_ok": iso(h.get("last_ok")), "last_failure": iso(h.get("last_failure"))}
    return out


def serve_show(app, req, call) -> NotifyResult:
    from bk.notify.files import DeliveryLog

    stored, prefs = load(app)
    try:
        health = _health(DeliveryLog(log_dir(app.settings)).read())
    except BkError:
        health = {}
    return NotifyResult({"settings": prefs.to_json(), "file": prefs_path(app.settings),
                         "relay": relay_of(app.settings) is not None,
                         "terminals": terminals_json(app.actor.uid), "deliverer": deliverer_json(app),
                         "health": health})


# ------------------------------------------------------------ bk notify test

def serve_test(app, req: NotifyTestRequest, call) -> NotifyResult:
    """One test notification on each chosen channel (or those named), sent
    now from this process; each channel's outcome, and its health recorded."""
    from bk.notify import terminals
    from bk.notify.deliverer import record_health
    from bk.notify.files import DeliveryLog
    from bk.notify.mail import ChannelError

    _, prefs = load(app)
    chans = prefs.channels if req.channels is None else _names(req.channels, N.CHANNELS, "channel")
    uid, now = app.actor.uid, call.now
    ev = N.test_event(uid, app.actor.user, now, os.urandom(4).hex())
    text = N.render(ev, call.tz, now)
    import socket

    doc = N.to_json(ev, text, host=socket.gethostname(), sent_at=now)
    send = senders(app.settings)
    results, health = [], []
    for ch in chans:
        if ch in N.LOCAL_CHANNELS:
            outs = terminals.deliver(uid, text, N.title(ev), host=doc["host"] or "",
                                     when=_clock_text(now, call.tz), desktop_mode=prefs.desktop,
                                     want_line=ch == N.TERMINAL, want_desktop=ch == N.DESKTOP)
            sent = [o for o in outs if o.status == "sent" and (ch == N.TERMINAL or o.desktop)]
            detail = (f"written to {', '.join(o.path for o in sent)}" if sent else
                      "no terminal of yours takes messages" if outs else "you have no terminal open")
            skipped = [f"{o.path}: {o.status}" for o in outs if o not in sent]
            if skipped:
                detail += "; not to " + ", ".join(skipped)
            results.append({"channel": ch, "ok": bool(sent), "detail": detail})
            continue
        try:
            said = send[ch](doc, prefs)
        except ChannelError as e:
            results.append({"channel": ch, "ok": False, "detail": str(e)})
            health.append((ch, False, str(e)))
            continue
        results.append({"channel": ch, "ok": True, "detail": said})
        health.append((ch, True, None))
    if health:
        def change(d):
            for ch, ok, err in health:
                record_health(d, ch, ok, now, err)
        try:
            DeliveryLog(log_dir(app.settings)).update(change, now=now)
        except BkError as e:
            call.warn(f"the outcome was not recorded: {e.message}")
    return NotifyResult({"event": doc, "channels": results, "ok": all(r["ok"] for r in results)})


def _clock_text(now: int, tz) -> str:
    from bk.core.timegrid import format_local_short

    return format_local_short(now, tz, now)


# ------------------------------------------------------------ bk notify log

def serve_log(app, req: NotifyLogRequest, call) -> NotifyResult:
    from bk.notify.files import DeliveryLog

    doc = DeliveryLog(log_dir(app.settings)).read()
    rows = sorted(doc["entries"].items(), key=lambda kv: (kv[1].get("created") or 0, kv[0]), reverse=True)
    out = []
    for key, e in rows[:req.limit]:
        out.append({"id": key, "event": e.get("event"), "due": iso(e.get("due")), "created": iso(e.get("created")),
                    "booking": e.get("booking"), "text": (e.get("doc") or {}).get("text"),
                    "channels": {ch: {"state": st.get("state"), "detail": st.get("detail"),
                                      "tries": st.get("tries")} for ch, st in e.get("channels", {}).items()}})
    return NotifyResult({"deliveries": out, "health": _health(doc)})


# ------------------------------------------------------------ bk doctor

def doctor_check(app, call) -> dict | None:
    """A channel that has been failing (its last delivery failed after its
    tries), or choices made with no deliverer to act on them.  None when
    there is nothing to say (most users never set anything)."""
    from bk.notify.files import DeliveryLog

    try:
        health = _health(DeliveryLog(log_dir(app.settings)).read())
    except BkError as e:
        return {"name": "notifications", "ok": False, "status": "fail", "detail": e.message, "fix": e.hint}
    failing = {ch: h for ch, h in health.items() if h["failing"]}
    if failing:
        parts = [f"{ch} failed {counted(h['failures'], 'time')} in a row "
                 f"(last at {h['last_failure']}): {h['error']}" for ch, h in sorted(failing.items())]
        return {"name": "notifications", "ok": False, "status": "fail", "detail": "; ".join(parts),
                "fix": "check the setting (bk notify), change it (bk notify set), then: bk notify test"}
    if not os.path.exists(prefs_path(app.settings)):
        return None
    _, prefs = load(app)
    st = deliverer_json(app)
    if st["state"] != "running":
        return {"name": "notifications", "ok": True, "status": "warn",
                "detail": f"you chose {', '.join(prefs.channels) or 'no channels'}, but no deliverer runs for you",
                "fix": "it runs inside your worker: systemctl --user enable --now bk-worker "
                       "(and loginctl enable-linger $USER), or bk w start"}
    return {"name": "notifications", "ok": True, "status": "ok",
            "detail": f"{', '.join(prefs.channels) or 'no channels'}; delivered by your worker (pid {st['pid']})",
            "fix": None}


def check_set(req: NotifySetRequest) -> None:
    """The row's checks, wherever the request was made: the field spec's
    bounds and patterns (words typed at ``bk notify set`` too), then that
    something is set."""
    from bk.service.fields import check

    check(req, SET_FIELDS)
    if all(getattr(req, f) is None for f in ("events", "channels", "quiet", "email", "webhook", "preset",
                                              "start_minutes", "end_minutes", "desktop")) and not req.reset:
        raise InvalidInput("nothing to set", hint="e.g. bk notify set --end-minutes 15,5, or --reset")


def check_test(req: NotifyTestRequest) -> None:
    from bk.service.fields import check

    check(req, TEST_FIELDS)


def check_log(req: NotifyLogRequest) -> None:
    from bk.service.fields import check

    check(req, LOG_FIELDS)
