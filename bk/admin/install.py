"""``sudo bk admin install`` and ``bk admin uninstall``: a whole shared
server, recorded so it can be upgraded and removed without a trace.

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
``--dry-run`` shows exactly that plan.  ``apply()`` records each change in
the manifest (``bk.admin.manifest``) *before* making it, then verifies:
the config as every client will load it, the directories as the broker
checks them, and the launcher answering ``--version``.

What install never does.  It creates no accounts or groups; it never
writes over an unknown ``bk`` command (it leaves it and says so), never
over a tracked file changed by hand (drift: it shows the difference), and
never changes settings bound into the ledger: a second run takes its
defaults from the installed config and refuses flags that disagree with
it, naming them.  A second run is a reconcile: config and data kept,
tracked files refreshed, services restarted.

Uninstall removes exactly what the manifest lists, newest first, and puts
back what was there before (from the backups); it refuses while a service
runs, and on drift.  The data directory is kept unless ``--purge-data``.
"""

from __future__ import annotations

import difflib
import grp
import json
import os
import pwd
import stat
import sys

from bk.admin import init, services, units
from bk.admin import manifest as mf
from bk.core.errors import ConfigError, InvalidInput, PermissionDenied
from bk.core.record import dataclass, field
from bk.store.fsutil import Safety, fsync_dir_at, open_dir, replace_file

DEFAULT_COMMAND = "/usr/local/bin/bk"
SMALL = 256 << 10          # installed files up to this size are kept for drift diffs
BOUND_FLAGS = {"gpu_count": "--gpu-count", "slot_minutes": "--slot-minutes",
               "max_shared_users": "--max-shared-users"}
OWNER_FLAGS = {"service_user": "--service-user", "data_dir": "--data-dir", "access": "--access",
               "group": "--group"}
MAN_SECTIONS = ("1", "5", "8")
INIT_ROLES = {"parent directory": "parent", "data directory": "data", "socket directory": "runtime",
              "configuration directory": "parent", "trusted configuration": "config"}


@dataclass(frozen=True)
class Layout:
    """Every path of an installation, under ``root``."""

    root: str = "/"

    def p(self, path: str) -> str:
        return os.path.normpath(self.root.rstrip("/") + path) if self.root != "/" else path

    @property
    def opt(self) -> str:
        return self.p("/opt/gpubk")

    @property
    def pyz(self) -> str:
        return self.p("/opt/gpubk/bk.pyz")

    @property
    def launcher(self) -> str:
        return self.p("/opt/gpubk/bin/bk")

    @property
    def config_dir(self) -> str:
        return self.p("/etc/gpubk")

    @property
    def config(self) -> str:
        return self.p("/etc/gpubk/config.json")

    @property
    def socket(self) -> str:
        return self.p("/run/gpubk/broker.sock")

    @property
    def unit_dir(self) -> str:
        return self.p("/etc/systemd/system")

    @property
    def user_unit_dir(self) -> str:
        return self.p("/etc/systemd/user")

    @property
    def hook(self) -> str:
        return self.p("/etc/profile.d/gpubk.sh")

    def man(self, name: str) -> str:
        return self.p(f"/usr/local/share/man/man{name.rsplit('.', 1)[1]}/{name}")

    @property
    def bash_completion(self) -> str:
        return self.p("/usr/share/bash-completion/completions/bk")

    @property
    def zsh_completion(self) -> str:
        return self.p("/usr/local/share/zsh/site-functions/_bk")


@dataclass(frozen=True)
class Options:
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


@dataclass
class Action:
    """One change (or a note that a path is already right)."""

    op: str          # create | update | replace | adopt | keep | skip | mkdir | link | init
    path: str
    role: str
    why: str = ""
    kind: str = "file"
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    target: str | None = None
    data: bytes | None = None
    before: dict | None = None
    step: object = None              # an init.Step for op "init"

    def to_json(self) -> dict:
        out = {"op": self.op, "path": self.path, "role": self.role, "kind": self.kind,
               "mode": f"{self.mode:04o}", "uid": self.uid, "gid": self.gid, "why": self.why}
        if self.target is not None:
            out["target"] = self.target
        if self.data is not None:
            out["sha256"] = mf.sha256_bytes(self.data)
        if self.step is not None:
            out["op"] = self.step.action
        return out

    @property
    def changes(self) -> bool:
        return self.op not in ("keep", "skip") and not (self.step is not None and self.step.action == "keep")


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

    @property
    def changes(self) -> list[Action]:
        return [a for a in self.actions if a.changes]

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
                "warnings": self.warnings}

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


# ------------------------------------------------------------- planning

def _target(layout: Layout, path: str | None, flag: str) -> str | None:
    if path is None:
        return None
    if not os.path.isabs(path):
        raise InvalidInput(f"{flag} must be an absolute path, got {path!r}")
    return layout.p(os.path.normpath(path))


def _existing_config(path: str) -> dict | None:
    if not os.path.lexists(path):
        return None
    from bk.store.config import check_trusted

    check_trusted(path)
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read(1 << 20))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} exists but cannot be read as JSON: {e}", hint="fix it, then rerun") from None
    return doc if isinstance(doc, dict) else None


def _settle(options: Options, layout: Layout, cfg: dict | None) -> init.Options:
    """init's options: the flags, with what the installed config says for the
    ones not given; a flag that disagrees with the installed config is refused."""
    data_dir = _target(layout, options.data_dir, "--data-dir")
    given = {"gpu_count": options.gpu_count, "slot_minutes": options.slot_minutes,
             "max_shared_users": options.max_shared_users, "data_dir": data_dir,
             "access": options.access, "group": options.group}
    if cfg is not None:
        user = None
        if "service_uid" in cfg:
            try:
                user = pwd.getpwuid(int(cfg["service_uid"])).pw_name
            except (KeyError, ValueError, TypeError):
                user = None
        have = {"gpu_count": cfg.get("gpu_count"), "slot_minutes": cfg.get("slot_minutes"),
                "max_shared_users": cfg.get("max_shared_users"), "data_dir": cfg.get("data_dir"),
                "access": cfg.get("access", "all"), "group": cfg.get("group")}
        bound, owned = [], []
        for key, default in (("slot_minutes", 5), ("max_shared_users", 2), ("access", "all")):
            if have[key] is None and given[key] == default:
                given[key] = None       # the default, which the config leaves unsaid
        for key in ("slot_minutes", "max_shared_users"):
            have[key] = have[key] if have[key] is not None else {"slot_minutes": 5, "max_shared_users": 2}[key]
        for key, value in given.items():
            if value is not None and value != have[key] and not (key == "gpu_count" and have[key] is None):
                shown = f"{BOUND_FLAGS.get(key) or OWNER_FLAGS[key]} {value} (installed: {have[key]})"
                (bound if key in BOUND_FLAGS else owned).append(shown)
        if options.service_user is not None and user is not None and options.service_user != user:
            owned.append(f"--service-user {options.service_user} (installed: {user})")
        if bound:
            raise InvalidInput("these flags would change settings bound into the ledger at its first booking: "
                               + "; ".join(bound) + "; nothing was changed",
                               hint="leave them out to keep the installed ones (a reinstall keeps config and "
                                    "data); a new GPU count means a new ledger: see bk-admin(8)")
        if owned:
            raise InvalidInput("these flags disagree with the installed configuration: " + "; ".join(owned)
                               + "; nothing was changed",
                               hint="leave them out to keep the installed ones, or uninstall first")
        merged = {k: (v if v is not None else cfg.get(k)) for k, v in given.items()}
        service_user = options.service_user or user
    else:
        merged = dict(given)
        service_user = options.service_user
    return init.Options(service_user=service_user, data_dir=merged["data_dir"] or layout.p("/var/lib/gpubk"),
                        socket=layout.socket, access=merged["access"] or "all", group=merged["group"],
                        gpu_count=merged["gpu_count"], slot_minutes=merged["slot_minutes"],
                        max_shared_users=merged["max_shared_users"], config_file=layout.config)


def _python(options: Options, m: mf.Manifest | None) -> str:
    python = options.python or (m.options.get("python") if m else None) or sys.executable
    if not python or not os.path.isabs(python):
        raise InvalidInput(f"--python must be an absolute path, got {python!r}")
    if not os.access(python, os.X_OK):
        raise InvalidInput(f"{python} is not an executable interpreter", hint="e.g. --python /usr/bin/python3")
    units.check_path(python, "the interpreter")      # the launcher and units name it unquoted
    real = os.path.realpath(python)
    if real.startswith(("/home/", "/root/", "/run/user/")):
        # ProtectHome=yes in both units hides these from the services, and
        # other users usually cannot run an interpreter in root's home.
        raise InvalidInput(f"the interpreter {python} lives in a home directory ({real}), which the "
                           "services cannot see (ProtectHome=yes) and other users may not run",
                           hint="name a system interpreter: --python /usr/bin/python3")
    return python


def launcher_text(layout: Layout, python: str) -> bytes:
    lines = ["#!/bin/sh",
             "# bk: written by `bk admin install`; runs the installed archive with the",
             "# interpreter its bytecode was compiled for.  bk admin uninstall removes it."]
    if layout.root != "/":
        lines += ["# A staging root: the trusted config lives under it too.",
                  f': "${{BK_CONFIG_FILE:={layout.config}}}"', "export BK_CONFIG_FILE"]
    lines.append(f'exec {python} {layout.pyz} "$@"')
    return ("\n".join(lines) + "\n").encode()


def _parents(path: str, done: set[str]) -> list[Action]:
    """mkdir actions for the missing directories above ``path``, top first;
    the existing ones must be safe (root-owned, not writable by others)."""
    missing = []
    d = os.path.dirname(path)
    while not os.path.lexists(d) and d not in done:
        missing.append(d)
        d = os.path.dirname(d)
    if d not in done:
        init._check_ancestors(os.path.join(d, "x"), (0,))
    out = []
    for d in reversed(missing):
        done.add(d)
        out.append(Action("mkdir", d, "parent", kind="dir", mode=0o755))
    return out


def drift_text(entry: mf.Entry, config_dir: str) -> str:
    """How a tracked path differs from what install left there."""
    now = mf.state(entry.path)
    if now is None:
        return f"{entry.path}: removed since it was installed"
    if now.get("kind") != entry.kind:
        return f"{entry.path}: was a {entry.kind}, now a {now.get('kind')}"
    if entry.kind == "link":
        return f"{entry.path}: points to {now.get('target')}, installed pointing to {entry.target}"
    lines = []
    if entry.kind == "file" and now.get("sha256") != entry.sha256:
        try:
            old = mf.backup_bytes(config_dir, entry.sha256 or "")
            with open(entry.path, "rb") as f:
                new = f.read()
            diff = difflib.unified_diff(old.decode(errors="replace").splitlines(),
                                        new.decode(errors="replace").splitlines(),
                                        f"{entry.path} (installed)", f"{entry.path} (now)", lineterm="", n=1)
            lines += list(diff)[:60]
        except ConfigError:
            lines.append(f"{entry.path}: content changed (sha256 {now.get('sha256', '')[:12]}, installed "
                         f"{(entry.sha256 or '')[:12]})")
    for key in ("uid", "gid", "mode"):
        if now.get(key) != getattr(entry, key):
            lines.append(f"{entry.path}: {key} {now.get(key)}, installed {getattr(entry, key)}")
    return "\n".join(lines) or f"{entry.path}: changed"


def _refuse_drift(drifted: list[mf.Entry], config_dir: str, doing: str) -> None:
    text = "\n".join(drift_text(e, config_dir) for e in drifted)
    raise ConfigError(f"{len(drifted)} installed file{'s were' if len(drifted) != 1 else ' was'} changed by "
                      f"hand since the install; {doing} refuses to overwrite or remove "
                      f"{'them' if len(drifted) != 1 else 'it'}:\n{text}",
                      hint="put the installed version back (or move the file away), then rerun; for units "
                           "use a drop-in: sudo systemctl edit gpubk-broker",
                      details={"drift": [e.path for e in drifted]})


def file_action(path: str, data: bytes, mode: int, role: str, m: mf.Manifest | None,
                drifted: list[mf.Entry]) -> Action:
    now = mf.state(path)
    entry = m.find(path) if m else None
    want = {"kind": "file", "sha256": mf.sha256_bytes(data), "uid": 0, "gid": 0, "mode": f"{mode:04o}"}
    if entry is not None:
        if now is None:
            return Action("create", path, role, "installed file was missing", data=data, mode=mode)
        if not mf.same(now, entry.expected()):
            drifted.append(entry)
            return Action("keep", path, role, "changed by hand", mode=mode)
        if mf.same(now, want):
            return Action("keep", path, role, "up to date", mode=mode)
        return Action("update", path, role, "refresh", data=data, mode=mode)
    if now is None:
        return Action("create", path, role, data=data, mode=mode)
    if mf.same(now, want):
        return Action("adopt", path, role, "already there, identical", data=data, mode=mode, before=now)
    if now["kind"] != "file":
        raise ConfigError(f"{path} exists and is a {now['kind']}, not a file; not replacing it",
                          hint="move it away, then rerun")
    return Action("replace", path, role, "an older file is backed up in the manifest and restored by "
                  "uninstall", data=data, mode=mode, before=now)


def _link_action(path: str, target: str, m: mf.Manifest | None, warnings: list[str],
                 done: set[str]) -> list[Action]:
    directory = os.path.dirname(path)
    if os.path.isdir(directory):
        st = os.stat(directory)
        if st.st_uid != 0 or st.st_mode & 0o022:
            raise ConfigError(f"{directory} is not a root-owned directory only root can write (owner uid "
                              f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}); a bk command there could be "
                              "replaced by someone else",
                              hint="do not change its owner: check that /usr/bin/bk is absent, then rerun "
                                   "with --command-path /usr/bin/bk (or --no-command-link)")
    now = mf.state(path)
    entry = m.find(path) if m else None
    want = {"kind": "link", "target": target}
    if now is None:
        return [*_parents(path, done),
                Action("link", path, "command", "the bk command", kind="link", target=target)]
    if entry is not None and mf.same(now, entry.expected()) or mf.same(now, want):
        if entry is None:
            return [Action("adopt", path, "command", "an identical link was already there", kind="link",
                           target=target, before=now)]
        return [Action("keep", path, "command", "up to date", kind="link", target=target)]
    what = f"a link to {now['target']}" if now["kind"] == "link" else f"a {now['kind']}"
    warnings.append(f"{path} is {what} that bk did not install; left alone. Users run "
                    f"{target}, or choose another --command-path")
    return [Action("skip", path, "command", f"{what}, not bk's: left alone", kind="link", target=target)]


def plan(options: Options, env: dict) -> Plan:
    try:
        return _plan(options, env)
    except PermissionError as e:
        raise PermissionDenied(f"cannot inspect {e.filename}: {e.strerror}",
                               hint="run it as root: sudo bk admin install ...") from None


def _plan(options: Options, env: dict) -> Plan:
    from bk.admin import archive

    if not os.path.isabs(options.root):
        raise InvalidInput(f"--root must be an absolute path, got {options.root!r}")
    layout = Layout(os.path.normpath(options.root))
    if layout.root != "/" and not os.path.isdir(layout.root):
        raise InvalidInput(f"--root {layout.root} is not a directory", hint=f"mkdir -p {layout.root}")
    m = mf.load(layout.config_dir) if os.path.isdir(layout.config_dir) else None
    cfg = _existing_config(layout.config)
    iopts = _settle(options, layout, cfg)
    ip = init.plan(iopts, env)
    python = _python(options, m)
    hook = options.login_hook if options.login_hook is not None else bool(
        m and m.find(layout.hook) is not None)
    entries, source = archive.source_entries(options.archive)
    version = archive.build_record(entries).get("version") or "?"
    pyz = archive.archive_bytes(entries, python)

    group_access = ip.group_gid is not None
    gid = ip.group_gid if group_access else ip.service_gid
    monitor_uid = int(ip.config.get("monitor_uid", ip.service_uid))
    vals = units.values(bk=layout.launcher, uid=ip.service_uid, gid=gid, monitor_uid=monitor_uid,
                        data_dir=ip.options.data_dir, socket_dir=os.path.dirname(ip.options.socket),
                        group_access=group_access)
    res = _resources(entries, source)
    files: list[tuple[str, bytes, int, str]] = [
        (layout.pyz, pyz, 0o644, "archive"),
        (layout.launcher, launcher_text(layout, python), 0o755, "launcher"),
    ]
    for name in units.SYSTEM_UNITS:
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
    if hook:
        files.append((layout.hook, units.render(res.text(f"install/{units.LOGIN_HOOK}"),
                                                {"BK": layout.launcher}).encode(), 0o644, "login-hook"))

    actions: list[Action] = []
    drifted: list[mf.Entry] = []
    done: set[str] = {s.path for s in ip.steps if s.action == "mkdir"}
    # Directories init creates for the config come first: the manifest lives there.
    conf = [s for s in ip.steps if s.why == "configuration directory"]
    actions += [Action("init", s.path, "parent", s.why, kind="dir", mode=s.mode, uid=s.uid, gid=s.gid, step=s)
                for s in conf]
    for path, data, mode, role in files:
        actions += _parents(path, done)
        actions.append(file_action(path, data, mode, role, m, drifted))
    for s in ip.steps:
        if s.why != "configuration directory":
            actions.append(Action("init", s.path, INIT_ROLES.get(s.why, "parent"), s.why,
                                  kind="file" if s.action == "write" or s.why == "trusted configuration" else "dir",
                                  mode=s.mode, uid=s.uid, gid=s.gid, step=s))
    warnings: list[str] = []
    installed = m.options.get("command_path") if m else None
    link = options.command_link if options.command_link is not None else (
        m is None or "command_path" not in m.options or bool(installed))
    command_path = (options.command_path or installed or DEFAULT_COMMAND) if link else None
    if command_path is not None:
        actions += _link_action(_target(layout, command_path, "--command-path") or "",
                                layout.launcher, m, warnings, done)
    if m is not None:
        # Tracked files this install no longer writes (a hook turned off, a
        # man page dropped from the release) go, unless changed by hand.
        wanted = {a.path for a in actions}
        for e in m.entries:
            if e.path not in wanted and e.role in ("archive", "launcher", "unit", "user-unit", "man",
                                                    "completion", "login-hook", "command"):
                now = mf.state(e.path)
                if now is not None and not mf.same(now, e.expected()):
                    drifted.append(e)
                else:
                    actions.append(Action("remove", e.path, e.role, "no longer installed", kind=e.kind))
    if drifted:
        _refuse_drift(drifted, layout.config_dir, "bk admin install")
    systemd = services.systemd_running(layout.root)
    p = Plan(options, layout, m is not None, m, ip, python, source, version, actions, systemd,
             services.start_commands(m is None, options.start), warnings, command_path)
    if ip.options.data_dir.startswith(("/home/", "/root/", "/tmp/")) and layout.root == "/":
        warnings.append(f"the data directory {ip.options.data_dir} is hidden from the services "
                        "(ProtectHome=, PrivateTmp=)")
    return p


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


def _now_iso() -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ------------------------------------------------------------- applying

def need_root(command: str, euid: int | None = None) -> None:
    """``command`` as typed, e.g. ``bk admin install`` or ``bk update --apply``."""
    if (os.geteuid() if euid is None else euid) != 0:
        raise PermissionDenied(f"{command} changes system files and must run as root",
                               hint=f"sudo {command} ...")


def _mkdir(path: str, mode: int) -> None:
    os.mkdir(path, 0o700)
    os.chown(path, 0, 0, follow_symlinks=False)
    os.chmod(path, mode)
    fsync_dir_at(os.path.dirname(path))


def write_file(path: str, data: bytes, mode: int) -> None:
    directory, name = os.path.split(path)
    fd = open_dir(directory, Safety(0))
    if fd is None:
        raise ConfigError(f"{directory} disappeared during the install", hint="inspect it and rerun")
    try:
        replace_file(fd, name, directory, data, mode, owner=(0, 0))
    finally:
        os.close(fd)


def _link(path: str, target: str) -> None:
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(target, tmp)
    # rename over nothing: if a file appeared meanwhile, keep it (link(2)
    # cannot make a symlink; a last look is the best a rename can do).
    if os.path.lexists(path):
        os.unlink(tmp)
        raise ConfigError(f"{path} appeared during the install; left alone", hint="inspect it and rerun")
    os.replace(tmp, path)
    fsync_dir_at(os.path.dirname(path))


def entry_for(a: Action) -> mf.Entry:
    if a.kind == "link":
        return mf.Entry(a.path, "link", a.role, target=a.target, before=a.before)
    if a.step is not None:
        s = a.step
        before = mf.state(s.path) if s.action in ("adopt", "chmod", "write") else None
        if s.action == "write":
            return mf.Entry(s.path, "file", "config", s.uid, s.gid, f"{s.mode:04o}",
                            sha256=None, before=before, mutable=True)
        return mf.Entry(s.path, "dir", a.role, s.uid, s.gid, f"{s.mode:04o}", before=before,
                        mutable=a.role in ("data", "runtime"))
    if a.kind == "dir":
        return mf.Entry(a.path, "dir", a.role, 0, 0, f"{a.mode:04o}")
    return mf.Entry(a.path, "file", a.role, 0, 0, f"{a.mode:04o}",
                    sha256=mf.sha256_bytes(a.data or b""), before=a.before)


def _recorded_options(p: Plan) -> dict:
    return {"python": p.python, "command_path": p.command_path, "login_hook": p.hook_wanted,
            "data_dir": p.init_plan.options.data_dir, "socket": p.init_plan.options.socket,
            "service_uid": p.init_plan.service_uid}


def apply(p: Plan, *, euid: int | None = None, runner=None) -> Result:
    need_root("bk admin install", euid)
    layout = p.layout
    now = _now_iso()
    m = p.manifest or mf.Manifest(layout.root, p.version, now, now)
    # The settings first: an install interrupted halfway is rerun with them.
    m.options = _recorded_options(p)
    stopped = _stop_for_archive(p, runner)
    applied: list[Action] = []
    pending: list[mf.Entry] = []       # recorded once the manifest's directory exists
    for a in p.actions:
        if not a.changes:
            continue
        if a.op == "remove":
            _remove_tracked(m.find(a.path), layout.config_dir)
            m.drop(a.path)
            mf.save(layout.config_dir, m)
            applied.append(a)
            continue
        entry = entry_for(a)
        if a.op == "replace":
            entry.before = dict(a.before or {}, backup=mf.backup(layout.config_dir, a.path))
        if os.path.isdir(layout.config_dir):
            m.record(entry)
            mf.save(layout.config_dir, m)
        else:
            pending.append(entry)
        if a.op != "adopt":            # an identical file or link: recorded, not touched
            _do(a, p.init_plan.config)
            if a.role == "archive":
                _reread_if_running(a.path)
        if pending and os.path.isdir(layout.config_dir):
            for e in pending:
                m.record(e)
            pending = []
            mf.save(layout.config_dir, m)
        if a.step is not None and a.step.action == "write":
            entry.sha256 = mf.sha256_file(a.path)
            m.record(entry)
            mf.save(layout.config_dir, m)
        if a.kind == "file" and a.step is None and a.data is not None and len(a.data) <= SMALL:
            mf.backup(layout.config_dir, a.path)        # the installed text, for drift diffs
        applied.append(a)
    m.version = p.version
    m.updated_at = now
    m.options = _recorded_options(p)
    mf.save(layout.config_dir, m)
    os.chmod(mf.manifest_path(layout.config_dir), 0o600)
    init.verify(p.init_plan)
    _verify_launcher(layout)
    ran: list[dict] = []
    notes: list[str] = []
    if p.systemd:
        import subprocess

        ran = services.run(p.service_commands, runner or subprocess.run)
        if stopped and not p.options.start:
            notes.append("the services were stopped to replace the archive (--no-start): start them with "
                         "sudo systemctl start gpubk-broker gpubk-monitor")
        failed = [r for r in ran if r["rc"] != 0]
        if failed:
            notes.append("systemctl failed: " + "; ".join(f"{r['command']}: {r['stderr']}" for r in failed))
    else:
        why = "a staging root" if layout.root != "/" else "systemd is not running here (no /run/systemd/system)"
        notes.append(f"services not started: {why}; where systemd runs, start them with:")
        notes += ["  " + c for c in services.shown(services.start_commands(not p.reconcile, True))]
    status = "reconciled" if p.reconcile else "installed"
    if not applied:
        status = "unchanged"
    return Result(p, status, applied, ran, notes)


def _reread_if_running(path: str) -> None:
    """This process may run from the archive just replaced (``sudo bk update
    NEW.pyz --apply`` run by the installed bk).  zipimport keeps the table of
    contents it read at start-up and reopens the file by name for each
    import: the modules still to import would be read from the new file at
    the old offsets.  ``invalidate_caches`` makes it read the new table
    (zipimporter.invalidate_caches, Python 3.10+)."""
    from bk.admin.archive import running_archive

    running = running_archive()
    if running and os.path.realpath(running) == os.path.realpath(path):
        import importlib

        importlib.invalidate_caches()


def _stop_for_archive(p: Plan, runner) -> bool:
    """A running service must not see its archive replaced: zipimport keeps
    the old file's table of contents and reopens the file by name for every
    lazy import, so the new file's bytes would be read at the old offsets.
    With systemd the services are stopped first (and started again after);
    without it, a reconcile that changes the archive refuses while they run."""
    if not p.reconcile or not any(a.role == "archive" and a.changes for a in p.actions):
        return False
    if p.systemd:
        import subprocess

        services.run(services.stop_commands(), runner or subprocess.run)
        return True
    running = services.running_writers(p.init_plan.options.socket, p.init_plan.options.data_dir)
    if running:
        raise ConfigError("the services are running and the archive would change under them: "
                          + "; ".join(running), hint="stop them first, then rerun (or use sudo bk update --apply)")
    return False


def _do(a: Action, doc: dict) -> None:
    if a.step is not None:
        init._apply_step(a.step, doc)
    elif a.op == "mkdir":
        _mkdir(a.path, a.mode)
    elif a.kind == "link":
        _link(a.path, a.target or "")
    else:
        write_file(a.path, a.data or b"", a.mode)


def _verify_launcher(layout: Layout) -> None:
    import subprocess

    try:
        proc = subprocess.run([layout.launcher, "--version"], capture_output=True, text=True, timeout=60,
                              check=False, env={"PATH": "/usr/bin:/bin", "HOME": "/"})
    except (OSError, subprocess.SubprocessError) as e:
        raise ConfigError(f"the installed {layout.launcher} does not run: {e}",
                          hint="check the interpreter it names (--python)") from None
    if proc.returncode != 0 or not proc.stdout.startswith("bk "):
        raise ConfigError(f"the installed {layout.launcher} does not run: {proc.stderr.strip()[-300:]}",
                          hint="check the interpreter it names (--python)")


def dry_run(p: Plan) -> Result:
    notes = [] if p.systemd else ["services would not be started: "
                                  + ("a staging root" if p.layout.root != "/" else "systemd is not running here")]
    return Result(p, "dry_run", [], [], notes)


# ------------------------------------------------------------- uninstall

@dataclass
class Removal:
    op: str           # remove | restore | rmdir | purge | keep | gone
    entry: mf.Entry
    why: str = ""

    def to_json(self) -> dict:
        return {"op": self.op, "path": self.entry.path, "role": self.entry.role, "kind": self.entry.kind,
                "why": self.why}


@dataclass
class UninstallPlan:
    layout: Layout
    manifest: mf.Manifest
    removals: list[Removal]
    purge_data: bool
    only_services: bool
    running: list[str]
    systemd: bool

    def to_json(self) -> dict:
        return {"root": self.layout.root, "purge_data": self.purge_data, "services_only": self.only_services,
                "steps": [r.to_json() for r in self.removals], "running": self.running,
                "systemd": self.systemd}


SERVICE_ROLES = ("unit",)


def uninstall_plan(root: str, *, purge_data: bool = False, only_services: bool = False,
                   runner=None) -> UninstallPlan:
    layout = Layout(os.path.normpath(root))
    m = mf.load(layout.config_dir) if os.path.isdir(layout.config_dir) else None
    if m is None:
        raise ConfigError(f"nothing to uninstall: there is no install manifest {mf.manifest_path(layout.config_dir)}",
                          hint="bk admin uninstall removes only what bk admin install recorded")
    removals: list[Removal] = []
    drifted: list[mf.Entry] = []
    for e in reversed(m.entries):
        if only_services and e.role not in SERVICE_ROLES:
            continue
        now = mf.state(e.path)
        if e.mutable or e.role == "config":
            removals.append(_mutable(e, now, purge_data))
        elif now is None:
            removals.append(Removal("gone", e, "already removed"))
        elif mf.same(now, e.expected()):
            if e.kind == "dir":
                removals.append(Removal("rmdir", e, "if empty") if e.before is None
                                else Removal("keep", e, "was there before"))
            elif e.before is None:
                removals.append(Removal("remove", e))
            elif mf.same(e.before, e.expected()):
                removals.append(Removal("keep", e, "was there before, identical"))
            else:
                removals.append(Removal("restore", e, "put back what was there before"))
        elif e.before is not None and mf.same(now, e.before):
            removals.append(Removal("gone", e, "as it was before"))
        else:
            drifted.append(e)
    if drifted:
        _refuse_drift(drifted, layout.config_dir, "bk admin uninstall")
    socket_path = m.options.get("socket") or layout.socket
    data_dir = m.options.get("data_dir") or layout.p("/var/lib/gpubk")
    systemd = services.systemd_running(layout.root)
    if systemd:
        import subprocess

        running = [f"{u} is active" for u in services.active_units(runner or subprocess.run)]
    else:
        running = services.running_writers(socket_path, data_dir)
    return UninstallPlan(layout, m, removals, purge_data, only_services, running, systemd)


def _mutable(e: mf.Entry, now: dict | None, purge: bool) -> Removal:
    if now is None:
        return Removal("gone", e, "already removed")
    if e.role == "data" and not purge:
        return Removal("keep", e, "data kept (add --purge-data to remove it)")
    if e.role == "config":
        if e.before is not None and e.before.get("backup"):
            return Removal("restore", e, "put back the configuration that was there before")
        return Removal("remove", e, "the trusted configuration")
    if e.before is not None:
        return Removal("purge", e, "emptied; its owner and mode put back")
    return Removal("purge", e, "removed with its contents")


def uninstall(up: UninstallPlan, *, euid: int | None = None, runner=None) -> list[Removal]:
    need_root("bk admin uninstall", euid)
    if up.running:
        hint = ("sudo systemctl disable --now gpubk-monitor.service gpubk-broker.service" if up.systemd
                else "stop the broker and the monitor first (kill -TERM their pids)")
        raise ConfigError("the services are still running: " + "; ".join(up.running), hint=hint)
    if up.systemd and any(r.entry.role == "unit" and r.op == "remove" for r in up.removals):
        # Stopped is not disabled: enable's links in *.wants/ would dangle
        # once the unit files are gone.
        import subprocess

        services.run([["systemctl", "disable", *services.UNITS]], runner or subprocess.run)
    cfg_dir = up.layout.config_dir
    m = up.manifest
    # The manifest's own directory and those above it hold the manifest
    # until the very end: they go last, after it.
    holders = {cfg_dir}
    d = cfg_dir
    while d != os.path.dirname(d):
        d = os.path.dirname(d)
        holders.add(d)
    done: list[Removal] = []
    deferred: list[Removal] = []
    # The archive this very command may be running from goes last: zipimport
    # reopens the archive by name for every import, so after the unlink only
    # modules already loaded can run (the caller loads what it still needs).
    opt = up.layout.opt
    last = [r for r in up.removals if r.entry.path == opt or r.entry.path.startswith(opt + "/")
            or opt.startswith(r.entry.path + "/")]
    for r in [r for r in up.removals if r not in last] + last:
        e = r.entry
        if r.op == "rmdir" and e.path in holders:
            deferred.append(r)
            continue
        if r.op in ("remove", "restore"):
            _remove_or_restore(e, r.op, cfg_dir)
        elif r.op == "rmdir":
            try:
                os.rmdir(e.path)
            except OSError:
                r.why = "kept: not empty"
                continue
        elif r.op == "purge":
            _purge(e)
        else:
            continue
        done.append(r)
        m.drop(e.path)
        mf.save(cfg_dir, m)
    if up.only_services:
        return done
    # Everything the manifest listed is dealt with: the manifest and its
    # backups go, then the directories install made to hold them.
    mf.remove(cfg_dir)
    for r in sorted(deferred, key=lambda r: -len(r.entry.path)):
        try:
            os.rmdir(r.entry.path)
            done.append(r)
        except OSError:
            r.why = "kept: not empty"
    return done


def _remove_or_restore(e: mf.Entry, op: str, cfg_dir: str) -> None:
    if op == "restore" and e.kind == "file":
        b = e.before or {}
        data = mf.backup_bytes(cfg_dir, b.get("backup") or "")
        directory, name = os.path.split(e.path)
        fd = open_dir(directory, Safety(0))
        try:
            replace_file(fd, name, directory, data, int(b["mode"], 8), owner=(b["uid"], b["gid"]))
        finally:
            os.close(fd)
        return
    if op == "restore" and e.kind == "link" and e.before and e.before.get("kind") == "link":
        os.unlink(e.path)
        os.symlink(e.before["target"], e.path)
        return
    os.unlink(e.path)
    fsync_dir_at(os.path.dirname(e.path))


def _purge(e: mf.Entry) -> None:
    import shutil

    if e.before is not None and e.before.get("kind") == "dir":
        for name in os.listdir(e.path):
            full = os.path.join(e.path, name)
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)
        b = e.before
        os.chown(e.path, b["uid"], b["gid"], follow_symlinks=False)
        os.chmod(e.path, int(b["mode"], 8))
    else:
        shutil.rmtree(e.path)


def _remove_tracked(e: mf.Entry | None, cfg_dir: str) -> None:
    if e is None or mf.state(e.path) is None:
        return
    if e.before and e.before.get("backup"):
        data = mf.backup_bytes(cfg_dir, e.before["backup"])
        write_file(e.path, data, int(e.before["mode"], 8))
    elif not e.before:
        os.unlink(e.path)


def owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
