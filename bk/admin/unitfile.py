"""Reading an installed systemd unit the way systemd reads it, for the
commands that run a unit's process without systemd (``bk admin services
run``, ``bk update``'s verification).

Facts (systemd.syntax(7), systemd.exec(5), systemd.service(5)).  A unit
is ini-like: ``[Section]`` headers, ``Key=value`` lines, ``#`` and ``;``
comments, a trailing backslash continues a line.  A key may repeat; for
list settings (``ExecStartPre=``, ``Environment=``) every line adds, and
an empty assignment resets the list.  For a single-valued key the last
line wins.  ``User=`` and ``Group=`` take a name or a number.
``Environment=`` holds space-separated ``KEY=VALUE`` words, quoted as
systemd quotes them (double or single quotes; ``shlex`` reads the same).
Time spans are seconds unless they carry a unit (``2s``, ``5min``).

Only what bk's own units say is understood; a unit that needs more (an
``EnvironmentFile=``, an Exec prefix that changes privileges) is refused
by name, so a process is never started with less than the unit meant.
"""

from __future__ import annotations

import re
import shlex

from bk.core.errors import ConfigError
from bk.core.record import dataclass, field

# Keys that add to a list rather than replace; an empty value resets.
_LISTS = frozenset({"ExecStartPre", "ExecStartPost", "Environment", "RestartPreventExitStatus",
                    "SystemCallFilter", "ReadWritePaths", "DeviceAllow", "Documentation", "After"})
_SPAN = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|sec|min|m|h)?")
_SPAN_UNIT = {None: 1.0, "s": 1.0, "sec": 1.0, "ms": 0.001, "min": 60.0, "m": 60.0, "h": 3600.0}
# Settings a process started without systemd cannot honour and bk's units
# never use: refusing them beats silently running without them.
_UNSUPPORTED = ("EnvironmentFile", "PassEnvironment", "WorkingDirectory", "RootDirectory",
                "SupplementaryGroups", "DynamicUser")


def parse(text: str) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not pending and stripped.startswith(("#", ";")):
            continue
        line = pending + stripped
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, eq, value = line.partition("=")
        if not eq or current is None:
            continue
        key, value = key.strip(), value.strip()
        if key in _LISTS:
            if value:
                current.setdefault(key, []).append(value)
            else:
                current[key] = []
        else:
            current[key] = [value]
    return sections


def span(value: str, what: str) -> float:
    """A systemd time span in seconds ("2s", "5min", "300")."""
    total, pos, text = 0.0, 0, value.replace(" ", "")
    if not text:
        raise ConfigError(f"{what}: an empty time span")
    while pos < len(text):
        m = _SPAN.match(text, pos)
        if m is None or m.end() == pos:
            raise ConfigError(f"{what}: {value!r} is not a time span bk understands (e.g. 2s, 5min)")
        total += float(m.group(1)) * _SPAN_UNIT[m.group(2)]
        pos = m.end()
    return total


@dataclass
class Service:
    """What a ``[Service]`` section asks for, for running it without systemd."""

    path: str
    exec_start: list[str]
    exec_start_pre: list[list[str]]          # each: argv; failures are fatal unless "-"
    pre_may_fail: list[bool]
    user: str
    group: str | None
    umask: int = 0o022
    environment: dict[str, str] = field(default_factory=dict)
    type: str = "simple"
    restart: str = "no"
    restart_sec: float = 0.1
    prevent_restart: frozenset = frozenset()
    start_limit_interval: float = 10.0
    start_limit_burst: int = 5
    timeout_stop: float = 90.0
    runtime_directory: str | None = None
    runtime_directory_mode: int = 0o755


def _one(section: dict[str, list[str]], key: str, default: str | None = None) -> str | None:
    got = section.get(key)
    return got[-1] if got else default


def _command(value: str, path: str) -> tuple[list[str], bool]:
    may_fail = value.startswith("-")
    value = value.lstrip("-")
    if value[:1] in ("+", "!", "@", ":"):
        raise ConfigError(f"{path}: the prefix {value[0]!r} of an Exec line changes how systemd runs it, "
                          "which bk cannot do without systemd", hint="reinstall the unit: sudo bk admin install")
    argv = shlex.split(value)
    if not argv:
        raise ConfigError(f"{path}: an empty Exec line")
    return argv, may_fail


def load(path: str) -> Service:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 20)
    except OSError as e:
        raise ConfigError(f"cannot read the unit {path}: {e.strerror}",
                          hint="install the units: sudo bk admin install") from None
    sections = parse(text)
    unit, svc = sections.get("Unit", {}), sections.get("Service", {})
    for key in _UNSUPPORTED:
        if key in svc:
            raise ConfigError(f"{path} sets {key}=, which bk cannot apply without systemd",
                              hint="move it out (a drop-in is read only by systemd), or run it under systemd")
    start = svc.get("ExecStart") or []
    if len(start) != 1 or not _one(svc, "User"):
        raise ConfigError(f"{path} has no single ExecStart= or no User=", hint="reinstall: sudo bk admin install")
    pre = [_command(v, path) for v in svc.get("ExecStartPre", [])]
    env: dict[str, str] = {}
    for line in svc.get("Environment", []):
        for word in shlex.split(line):
            key, eq, value = word.partition("=")
            if eq:
                env[key] = value
    prevent = frozenset(int(w) for line in svc.get("RestartPreventExitStatus", []) for w in line.split()
                        if w.isdigit())
    rt = _one(svc, "RuntimeDirectory")
    return Service(
        path=path, exec_start=_command(start[0], path)[0], exec_start_pre=[a for a, _ in pre],
        pre_may_fail=[f for _, f in pre], user=_one(svc, "User") or "", group=_one(svc, "Group"),
        umask=int(_one(svc, "UMask", "0022") or "0022", 8), environment=env,
        type=_one(svc, "Type", "simple") or "simple", restart=_one(svc, "Restart", "no") or "no",
        restart_sec=span(_one(svc, "RestartSec", "100ms") or "100ms", f"{path}: RestartSec="),
        prevent_restart=prevent,
        start_limit_interval=span(_one(unit, "StartLimitIntervalSec", "10s") or "10s",
                                  f"{path}: StartLimitIntervalSec="),
        start_limit_burst=int(_one(unit, "StartLimitBurst", "5") or "5"),
        timeout_stop=span(_one(svc, "TimeoutStopSec", "90s") or "90s", f"{path}: TimeoutStopSec="),
        runtime_directory=rt.split()[0] if rt else None,
        runtime_directory_mode=int(_one(svc, "RuntimeDirectoryMode", "0755") or "0755", 8))


def uid_of(name: str, what: str) -> int:
    """``User=`` (a name or a number) as a number."""
    import pwd

    if name.isdigit():
        return int(name)
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        raise ConfigError(f"{what} names the account {name!r}, which does not exist",
                          hint="create it, or reinstall: sudo bk admin install") from None


def gid_of(name: str | None, uid: int, what: str) -> int:
    """``Group=`` as a number; unset: the user's primary group (as systemd)."""
    import grp
    import pwd

    if name is None:
        try:
            return pwd.getpwuid(uid).pw_gid
        except KeyError:
            raise ConfigError(f"{what}: uid {uid} has no account, so no primary group",
                              hint="set Group= or reinstall: sudo bk admin install") from None
    if name.isdigit():
        return int(name)
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise ConfigError(f"{what} names the group {name!r}, which does not exist",
                          hint="create it, or reinstall: sudo bk admin install") from None
