"""``sudo bk admin install``: a whole shared server, recorded so it can be
upgraded and removed without a trace.  This module is the plan: what
install would change, worked out without changing anything.

What install is.  ``bk admin init`` (the trusted config, the data and
socket directories; its plan, trust checks and order are reused as they
are) plus everything around it: the archive ``/opt/gpubk/bk.pyz`` with
bytecode for this interpreter, the launcher ``/opt/gpubk/bin/bk``, the
``bk`` command link, the systemd units, man pages, shell completion and,
if asked, the login hook.  Every path lies under ``--root`` (default
``/``); under a staging root the files also *name* the staged paths (the
config names the staged data directory, the units the staged launcher, and
the launcher exports ``BK_CONFIG_FILE`` for the staged config), so a staged
install runs as it is: the units' ``ExecStart=`` can be run by hand and
``systemd-analyze verify`` finds the binaries they name.

Plan, apply, verify.  ``plan()`` inspects everything and changes nothing;
``--dry-run`` shows exactly that plan.  ``bk.admin.install_apply.apply()``
records each change in the manifest (``bk.admin.manifest``) *before* making
it, then verifies: the config as every client will load it, the
directories as the broker checks them, and the launcher answering
``--version``.  ``bk.admin.uninstall`` undoes what the manifest lists.

What install never does.  It creates no accounts or groups; it never
writes over an unknown ``bk`` command (it leaves it and says so:
``bk.admin.cmdlink``), never over a tracked file changed by hand (drift: it
shows the difference, ``bk.admin.tracked``), and never changes settings
bound into the ledger: a second run takes its defaults from the installed
config and refuses flags that disagree with it, naming them
(``bk.admin.settings``).  A second run is a reconcile: config and data
kept, tracked files refreshed, services restarted.

The pieces, each readable alone: ``layout`` (where every path is),
``settings`` (the flags against the installed config), ``tracked`` (one
path's action, drift, safe writes), ``cmdlink`` (the ``bk`` link),
this module (the whole plan), ``install_apply`` (doing it, then
verifying), ``uninstall`` (undoing it), ``destdir`` (a package's files
instead: ``--destdir``), ``unitfile`` and ``supervise`` (the installed
units run without systemd: ``bk admin services run``).
"""

from __future__ import annotations

import os

from bk.admin import cmdlink, init, services, settings, tracked, units
from bk.admin import manifest as mf
from bk.admin.layout import Layout
from bk.admin.tracked import Action
from bk.core.errors import ConfigError, InvalidInput, PermissionDenied
from bk.core.record import dataclass, field, replace

MAN_SECTIONS = ("1", "5", "8")
INIT_ROLES = {"parent directory": "parent", "data directory": "data", "socket directory": "runtime",
              "configuration directory": "parent", "trusted configuration": "config"}


@dataclass(frozen=True)
class Options:
    """The flags of ``bk admin install``; None means "as installed", else the default."""

    root: str = "/"
    service_user: str | None = None
    data_dir: str | None = None            # as seen on the server (the root is added)
    access: str | None = None
    group: str | None = None
    gpu_count: int | None = None
    slot_minutes: int | None = None
    max_shared_users: int | None = None
    command_path: str | None = None         # None: as installed, else /usr/local/bin/bk
    command_link: bool | None = None        # None: as installed (a link on a first install)
    login_hook: bool | None = None          # None: as installed (no hook on a first install)
    python: str | None = None
    archive: str | None = None              # install this archive instead of the running bk
    start: bool = True
    simulated_gpus: int | None = None        # a trial server: this many simulated GPUs, on purpose
    destdir: str | None = None               # stage a package's files (bk.admin.destdir)
    admin_contact: str | None = None        # None: as installed, else default_contact(); "": none


@dataclass
class Plan:
    options: Options
    layout: Layout
    reconcile: bool
    manifest: mf.Manifest | None
    init_plan: init.Plan
    python: str
    archive_from: str
    version: str
    actions: list[Action] = field(default_factory=list)
    systemd: bool = False
    service_commands: list[list[str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    command_path: str | None = None   # as on the server (no root prefix); None: no link
    installed_version: str | None = None   # the installed archive's, on a reconcile
    direction: str = "new"            # new | upgrade | same | downgrade | unknown (version_order)

    @property
    def changes(self) -> list[Action]:
        return [a for a in self.actions if a.changes]

    @property
    def downgrade(self) -> bool:
        return self.direction == "downgrade"

    def to_json(self) -> dict:
        ip = self.init_plan
        return {"root": self.layout.root, "reconcile": self.reconcile, "version": self.version,
                "archive_from": self.archive_from, "python": self.python,
                "service_user": ip.service_user, "service_uid": ip.service_uid,
                "config_file": ip.options.config_file, "config": ip.config,
                "data_dir": ip.options.data_dir, "socket": ip.options.socket,
                "command_path": self.command_path,
                "login_hook": self.hook_wanted,
                "actions": [a.to_json() for a in self.actions],
                "systemd": self.systemd, "service_commands": [" ".join(c) for c in self.service_commands],
                "warnings": self.warnings, "installed_version": self.installed_version,
                "direction": self.direction, "admin_contact": ip.config.get("admin_contact"),
                "kept_ledger_policy": ip.kept}

    @property
    def hook_wanted(self) -> bool:
        return any(a.role == "login-hook" for a in self.actions)


@dataclass
class Result:
    plan: Plan
    status: str                 # installed | reconciled | unchanged | dry_run
    applied: list[Action]
    services: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"status": self.status, "dry_run": self.status == "dry_run", **self.plan.to_json(),
                "changed": [a.path for a in self.applied], "services_run": self.services,
                "notes": self.notes}


def plan(options: Options, env: dict, *, doing: str = "bk admin install",
         roles: tuple[str, ...] | None = None) -> Plan:
    """Everything install would change, and why; changes nothing.  ``doing``
    names the command in a refusal; ``roles``: only the files of these
    roles are to be changed (``bk admin login-hook``), so only their hand
    edits refuse it."""
    try:
        return _plan(options, env, doing, roles)
    except PermissionError as e:
        raise PermissionDenied(f"cannot inspect {e.filename}: {e.strerror}",
                               hint="run it as root: sudo bk admin install ...") from None


def _plan(options: Options, env: dict, doing: str = "bk admin install",
          roles: tuple[str, ...] | None = None) -> Plan:
    from bk.admin import pyzfile

    if not os.path.isabs(options.root):
        raise InvalidInput(f"--root must be an absolute path, got {options.root!r}")
    layout = Layout(os.path.normpath(options.root))
    if layout.root != "/" and not os.path.isdir(layout.root):
        raise InvalidInput(f"--root {layout.root} is not a directory", hint=f"mkdir -p {layout.root}")
    m = mf.load(layout.config_dir) if os.path.isdir(layout.config_dir) else None
    cfg = settings.existing_config(layout.config)
    iopts = settings.settle(options, layout, cfg)
    iopts = replace(iopts, admin_contact=_contact(options, cfg, env))
    ip = init.plan(iopts, env, may_change=settings.CHANGEABLE if cfg is not None else ())
    python = settings.interpreter(options, m)
    hook = options.login_hook if options.login_hook is not None else bool(
        m and m.find(layout.hook) is not None)
    entries, source = pyzfile.source_entries(options.archive)
    version = pyzfile.build_record(entries).get("version") or "?"
    pyz = pyzfile.archive_bytes(entries, python)
    files = _files(layout, ip, python, pyz, _resources(entries, source), hook)

    actions: list[Action] = []
    drifted: list[mf.Entry] = []
    done: set[str] = {s.path for s in ip.steps if s.action == "mkdir"}
    # Directories init creates for the config come first: the manifest lives there.
    conf = [s for s in ip.steps if s.why == "configuration directory"]
    actions += [Action("init", s.path, "parent", s.why, kind="dir", mode=s.mode, uid=s.uid, gid=s.gid, step=s)
                for s in conf]
    for path, data, mode, role in files:
        actions += tracked.parents(path, done)
        actions.append(tracked.file_action(path, data, mode, role, m, drifted))
    for s in ip.steps:
        if s.why != "configuration directory":
            role = INIT_ROLES.get(s.why.split(" (")[0], "parent")
            actions.append(Action("init", s.path, role, s.why,
                                  kind="file" if role == "config" else "dir",
                                  mode=s.mode, uid=s.uid, gid=s.gid, step=s))
    warnings: list[str] = []
    command_path = cmdlink.command_path(options, m)
    if command_path is not None:
        actions += cmdlink.link_actions(layout, command_path, m, warnings, done)
    if m is not None:
        actions += _no_longer_installed(m, {a.path for a in actions}, drifted)
    if roles is not None:
        drifted = [e for e in drifted if e.role in roles]
    if drifted:
        tracked.refuse_drift(drifted, layout.config_dir, doing)
    systemd = services.systemd_running(layout.root)
    installed = (pyzfile.version_of(layout.pyz) or m.version) if m is not None else None
    p = Plan(options, layout, m is not None, m, ip, python, source, version, actions, systemd,
             services.start_commands(m is None, options.start), warnings, command_path, installed,
             version_order(installed, version) if m is not None else "new")
    if ip.options.data_dir.startswith(("/home/", "/root/", "/tmp/")) and layout.root == "/":
        warnings.append(f"the data directory {ip.options.data_dir} is hidden from the services "
                        "(ProtectHome=, PrivateTmp=)")
    return p


def default_contact(env: dict) -> str | None:
    """Who ``bk info`` names as the administrator unless told: the person
    who ran sudo (``SUDO_USER``), with the full name the password database
    gives; None for root itself or without sudo."""
    import pwd

    name = env.get("SUDO_USER")
    if not name or name == "root":
        return None
    try:
        full = pwd.getpwnam(name).pw_gecos.split(",")[0].strip()
    except KeyError:
        full = ""
    return f"{full} ({name})" if full and full != name else name


def _contact(options: Options, cfg: dict | None, env: dict) -> str | None:
    """``admin_contact`` for the config init writes (None: leave it unsaid).
    A reinstall keeps the installed one (the reconcile never writes the
    config), and refuses a flag that disagrees with it, like any other."""
    if cfg is not None:
        have = cfg.get("admin_contact")
        if options.admin_contact is not None and (options.admin_contact or None) != have:
            raise InvalidInput(f"--admin-contact {options.admin_contact!r} disagrees with the installed "
                               f"configuration (installed: {have!r}); nothing was changed",
                               hint="leave it out to keep the installed one, or edit admin_contact in the "
                                    "configuration (man 5 gpubk-config)")
        return None
    if options.admin_contact is not None:
        return options.admin_contact or None
    return default_contact(env)


def version_key(version: str) -> tuple | None:
    """A sortable key for a release number as bk writes them (``1.2``,
    ``1.2.3``, ``1.2.3rc1``, ``1.2.3.post1``, ``1.2.3.dev4``), in PEP 440's
    order; None for anything else."""
    import re

    m = re.fullmatch(r"v?(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?(?:\.post(\d+))?(?:\.dev(\d+))?", version.strip())
    if m is None:
        return None
    release = [int(x) for x in m.group(1).split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    if m.group(2):
        pre = (("a", "b", "rc").index(m.group(2)), int(m.group(3)))
    else:   # a development release of a final comes before its pre-releases
        pre = (-1, 0) if m.group(5) is not None and m.group(4) is None else (3, 0)
    post = int(m.group(4)) if m.group(4) is not None else -1
    dev = (0, int(m.group(5))) if m.group(5) is not None else (1, 0)
    return tuple(release), pre, post, dev


def version_order(installed: str | None, new: str) -> str:
    """``upgrade``, ``same``, ``downgrade`` or ``unknown`` (a version that is not a release number)."""
    a, b = version_key(installed or ""), version_key(new)
    if a is None or b is None:
        return "unknown"
    return "upgrade" if b > a else "downgrade" if b < a else "same"


def _files(layout: Layout, ip: init.Plan, python: str, pyz: bytes, res: _Resources,
           hook: bool) -> list[tuple[str, bytes, int, str]]:
    """(path, content, mode, role) of every file install writes, the units
    rendered for this server's accounts and paths."""
    group_access = ip.group_gid is not None
    gid = ip.group_gid if group_access else ip.service_gid
    monitor_uid = int(ip.config.get("monitor_uid", ip.service_uid))
    vals = units.values(bk=layout.launcher, user=_user_name(ip.service_uid),
                        group=_group_name(gid), monitor_user=_user_name(monitor_uid),
                        data_dir=ip.options.data_dir, socket_dir=os.path.dirname(ip.options.socket),
                        group_access=group_access)
    return payload(layout, layout, vals, python, pyz, res, hook)


def payload(layout: Layout, named: Layout, vals: dict[str, str], python: str, pyz: bytes,
            res: _Resources, hook: bool) -> list[tuple[str, bytes, int, str]]:
    """The files of an install: written at ``layout``'s paths, naming
    ``named``'s (the same layout, except for ``--destdir``, whose files
    name the paths they will have once packaged and installed)."""
    files = [
        (layout.pyz, pyz, 0o644, "archive"),
        (layout.launcher, launcher_text(named, python), 0o755, "launcher"),
    ]
    for name in units.SYSTEM_UNITS + units.OPTIONAL_UNITS:
        files.append((os.path.join(layout.unit_dir, name),
                      units.render(res.text(f"install/{name}"), vals).encode(), 0o644, "unit"))
    files.append((os.path.join(layout.user_unit_dir, units.WORKER_UNIT),
                  units.render(res.text(f"install/{units.WORKER_UNIT}"), vals).encode(), 0o644, "user-unit"))
    for name in sorted(n for n in res if n.startswith("man/") and n.rsplit(".", 1)[-1] in MAN_SECTIONS):
        files.append((layout.man(name[4:]), res[name], 0o644, "man"))
    if "install/completion/bk.bash" in res:
        files.append((layout.bash_completion, res["install/completion/bk.bash"], 0o644, "completion"))
    if "install/completion/_bk" in res:
        files.append((layout.zsh_completion, res["install/completion/_bk"], 0o644, "completion"))
    for name in sorted(n for n in res if n.startswith("docs/") and n.endswith(".md")):
        files.append((os.path.join(layout.doc_dir, name[5:]), res[name], 0o644, "doc"))
    if layout.packaged:
        files.append((layout.sysusers, units.render(res.text(units.SYSUSERS), vals).encode(), 0o644, "sysusers"))
        files.append((layout.tmpfiles, units.render(res.text(units.TMPFILES), vals).encode(), 0o644, "tmpfiles"))
    if hook:
        files.append((layout.hook, units.render(res.text(f"install/{units.LOGIN_HOOK}"),
                                                {"BK": named.launcher}).encode(), 0o644, "login-hook"))
    return files


def _user_name(uid: int) -> str:
    from bk.users import user_name

    name = user_name(uid)
    return units.account_name(uid, name) if name is not None else str(uid)


def _group_name(gid: int) -> str:
    import grp

    try:
        return units.account_name(gid, grp.getgrgid(gid).gr_name)
    except KeyError:
        return str(gid)


def _no_longer_installed(m: mf.Manifest, wanted: set[str], drifted: list[mf.Entry]) -> list[Action]:
    """Tracked files this install no longer writes (a hook turned off, a man
    page dropped from the release) go, unless changed by hand (``drifted``)."""
    out = []
    for e in m.entries:
        if e.path not in wanted and e.role in ("archive", "launcher", "unit", "user-unit", "man",
                                                "completion", "doc", "login-hook", "command"):
            now = mf.state(e.path)
            if now is not None and not mf.same(now, e.expected()):
                drifted.append(e)
            else:
                out.append(Action("remove", e.path, e.role, "no longer installed", kind=e.kind))
    return out


def launcher_text(layout: Layout, python: str) -> bytes:
    """``/opt/gpubk/bin/bk``: runs the archive with the interpreter its bytecode is for."""
    lines = ["#!/bin/sh",
             "# bk: written by `bk admin install`; runs the installed archive with the",
             "# interpreter its bytecode was compiled for.  bk admin uninstall removes it."]
    if layout.root != "/":
        # As /etc/gpubk/config.json would be, except for a private trial
        # (BK_DATA_DIR), which reads no system config on a real server either.
        lines += ["# A staging root: the trusted config lives under it too.",
                  'if [ -z "${BK_DATA_DIR:-}" ]; then',
                  f'  : "${{BK_CONFIG_FILE:={layout.config}}}"', "  export BK_CONFIG_FILE", "fi"]
    lines.append(f'exec {python} {layout.pyz} "$@"')
    return ("\n".join(lines) + "\n").encode()


class _Resources(dict):
    """The archive's ``bk/resources/`` entries by their repository names (``install/...``, ``man/...``)."""

    source = ""

    def text(self, name: str) -> str:
        try:
            return self[name].decode()
        except KeyError:
            raise ConfigError(f"the archive {self.source} has no {name} to install",
                              hint="install from a bk.pyz built by python3 build.py from a complete tree") from None


def _resources(entries: dict[str, bytes], source: str) -> _Resources:
    prefix = "bk/resources/"
    res = _Resources({n[len(prefix):]: b for n, b in entries.items() if n.startswith(prefix) and not n.endswith("/")})
    res.source = source
    return res


def dry_run(p: Plan) -> Result:
    notes = [] if p.systemd else ["services would not be started: "
                                  + ("a staging root" if p.layout.root != "/" else "systemd is not running here"),
                                  services.foreground(p.layout.launcher)]
    return Result(p, "dry_run", [], [], notes)
