"""Render the deployment files of ``install/`` (systemd units, the login
hook) for one server.

The templates are plain files in the repository's ``install/`` directory,
shipped in the archive as ``bk/resources/install/``.  The installer renders
the templates of the archive it installs (for an upgrade, the new one's),
not those of the bk that runs it.  They hold
``@NAME@`` tokens; rendering replaces every one and refuses a template that
names a value it was not given (or a value that would break the unit
syntax), so a new token can never reach a server unrendered.
"""

from __future__ import annotations

import re

from bk.core.errors import ConfigError

BROKER_UNIT = "gpubk-broker.service"
MONITOR_UNIT = "gpubk-monitor.service"
WORKER_UNIT = "bk-worker.service"
LOGIN_HOOK = "profile.d/gpubk.sh"
SYSUSERS = "install/sysusers.d/gpubk.conf"
TMPFILES = "install/tmpfiles.d/gpubk.conf"
ENFORCER_UNIT = "gpubk-enforcer.service"
SYSTEM_UNITS = (BROKER_UNIT, MONITOR_UNIT)
# Installed with the others but never enabled or started by the installer:
# hard enforcement is the administrator's opt-in (bk admin enforce on).
OPTIONAL_UNITS = (ENFORCER_UNIT,)
_TOKEN = re.compile(r"@([A-Z_]+)@")
# systemd splits on white space and gives % and \ and quotes meaning; the
# paths bk writes into a unit are its own and never need them.
_UNSAFE = re.compile(r"[\s%\\\"'$;`]")


def render(text: str, values: dict[str, str]) -> str:
    missing = sorted({m for m in _TOKEN.findall(text) if m not in values})
    if missing:
        raise ConfigError(f"the template needs {', '.join(missing)}, which the installer does not know",
                          hint="this archive's install/ and its installer disagree: rebuild it")
    return _TOKEN.sub(lambda m: values[m.group(1)], text)


def check_path(path: str, what: str) -> str:
    if _UNSAFE.search(path):
        raise ConfigError(f"{what} {path!r} holds a space, quote or other character a systemd unit "
                          "would read differently", hint="choose a plain path")
    return path


# What systemd accepts as a User=/Group= name without reading it as a
# number or a specifier (systemd.exec(5), "User="; the portable subset of
# POSIX names that useradd also accepts).
_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,30}")


def account_name(number: int, name: str | None) -> str:
    """``User=``/``Group=`` by name (what a packager's unit says, and what
    ``systemctl show`` prints), or by number when the account has no name
    a unit can carry.  The broker and the monitor check the number from
    the trusted config whichever is written, so a name that later names
    another account makes them refuse to start (exit 77), never run as it."""
    return name if name is not None and _NAME.fullmatch(name) else str(number)


def values(*, bk: str, user: str, group: str, monitor_user: str, data_dir: str, socket_dir: str,
           group_access: bool) -> dict[str, str]:
    """The tokens of the units.  ``socket_dir`` is written to when it is not
    systemd's own runtime directory (a staging root)."""
    rw = [check_path(data_dir, "the data directory")]
    if socket_dir != "/run/gpubk":
        rw.append(check_path(socket_dir, "the socket directory"))
    return {"BK": check_path(bk, "the bk launcher"), "USER": user, "GROUP": group,
            "MONITOR_USER": monitor_user, "RUNTIME_MODE": "2750" if group_access else "0755",
            "DATA_DIR": rw[0], "DATA_MODE": "0750" if group_access else "0755",
            "READ_WRITE": " ".join(rw), "MONITOR_READ_WRITE": " ".join(rw)}

