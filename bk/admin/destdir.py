"""``bk admin install --destdir DIR``: the files of an install, staged for
a distribution package (Debian's ``debian/gpubk``, RPM's ``%{buildroot}``).

How it differs from ``--root``.  ``--root DIR`` makes a working server
under DIR: its files name the staged paths (the units run
``DIR/opt/gpubk/bin/bk``), and it writes the configuration, the data
directory and the manifest.  ``--destdir DIR`` writes what a package
ships, each file naming the path it will have once the package is
installed (``ExecStart=/opt/gpubk/bin/bk broker``), in the paths a package
uses (``bk.admin.layout.Layout(packaged=True)``: units in
``/usr/lib/systemd``, man pages and completion in ``/usr/share``), plus
the ``sysusers.d`` and ``tmpfiles.d`` files that make the service account
and the data directory on the target.  It writes no configuration, no
data directory and no manifest: the package manager tracks the files,
and the configuration names numbers (``service_uid``) that exist only on
the target, after ``systemd-sysusers`` ran.  So the account need not exist
where the package is built; the units name it (``User=gpubk``).

It needs no root (a package is built by an ordinary user, with fakeroot
or ``--root-owner-group``): files are written with their modes, owned by
whoever runs it, replaced atomically; DIR is the packager's to empty.
"""

from __future__ import annotations

import os

from bk.admin import settings, units
from bk.admin.layout import Layout
from bk.core.errors import ConfigError, InvalidInput
from bk.core.record import dataclass, field

DEFAULT_USER = "gpubk"
DEFAULT_COMMAND = "/usr/bin/bk"


@dataclass
class Staged:
    destdir: str
    version: str
    archive_from: str
    python: str
    user: str
    files: list[tuple[str, str]] = field(default_factory=list)      # (final path, role)
    link: tuple[str, str] | None = None                             # (final path, target)
    dry_run: bool = False

    def to_json(self) -> dict:
        return {"status": "dry_run" if self.dry_run else "staged", "dry_run": self.dry_run,
                "destdir": self.destdir, "version": self.version, "archive_from": self.archive_from,
                "python": self.python, "service_user": self.user,
                "files": [{"path": p, "role": r} for p, r in self.files],
                "command_link": {"path": self.link[0], "target": self.link[1]} if self.link else None,
                "next": self.next_steps()}

    def next_steps(self) -> list[str]:
        return ["systemd-sysusers gpubk.conf", "systemd-tmpfiles --create gpubk.conf",
                f"bk admin init --service-user {self.user} --gpu-count N  (writes /etc/gpubk/config.json)",
                "systemctl enable --now gpubk-broker.service gpubk-monitor.service"]


def stage(options, *, dry_run: bool = False) -> Staged:
    """Write (or, ``dry_run``, list) the package payload under ``options.destdir``."""
    from bk.admin import install, pyzfile

    dest = options.destdir
    if not os.path.isabs(dest):
        raise InvalidInput(f"--destdir must be an absolute path, got {dest!r}")
    dest = os.path.normpath(dest)
    if dest == "/":
        raise InvalidInput("--destdir / would write a package's files over this system",
                           hint="install here with: sudo bk admin install (no --destdir)")
    if options.root != "/":
        raise InvalidInput("--destdir and --root do not go together",
                           hint="--root makes a working staged server; --destdir stages a package")
    given = [flag for flag, value in (("--gpu-count", options.gpu_count), ("--slot-minutes", options.slot_minutes),
                                      ("--max-shared-users", options.max_shared_users),
                                      ("--simulated-gpus", getattr(options, "simulated_gpus", None)))
             if value is not None]
    if given:
        raise InvalidInput(f"{', '.join(given)} {'belongs' if len(given) == 1 else 'belong'} in the configuration, "
                           "which --destdir does not write",
                           hint="give them to bk admin init on the server, after the package is installed")
    user = options.service_user or DEFAULT_USER
    if not units._NAME.fullmatch(user):
        raise InvalidInput(f"--service-user {user!r} is not a name a unit and sysusers.d can carry",
                           hint="e.g. --service-user gpubk")
    access = options.access or "all"
    if access == "group" and not options.group:
        raise InvalidInput("--access group needs --group NAME", hint="e.g. --access group --group gpu-users")
    if access == "all" and options.group:
        raise InvalidInput("--group needs --access group", hint="add --access group")
    group = options.group if access == "group" else _primary_group(user)
    if not units._NAME.fullmatch(group):
        raise InvalidInput(f"--group {group!r} is not a name a unit can carry")
    named = Layout("/", packaged=True)
    layout = Layout(dest, packaged=True)
    data_dir = os.path.normpath(options.data_dir or "/var/lib/gpubk")
    if not os.path.isabs(data_dir):
        raise InvalidInput(f"--data-dir must be an absolute path, got {data_dir!r}")
    python = settings.interpreter(options, None)
    entries, source = pyzfile.source_entries(options.archive)
    version = pyzfile.build_record(entries).get("version") or "?"
    vals = units.values(bk=named.launcher, user=user, group=group, monitor_user=user, data_dir=data_dir,
                        socket_dir="/run/gpubk", group_access=access == "group")
    res = install._resources(entries, source)
    pyz = b"" if dry_run else pyzfile.archive_bytes(entries, python)
    files = install.payload(layout, named, vals, python, pyz, res, bool(options.login_hook))
    command = None if options.command_link is False else (options.command_path or DEFAULT_COMMAND)
    if command is not None and not os.path.isabs(command):
        raise InvalidInput(f"--command-path must be an absolute path, got {command!r}")
    out = Staged(dest, version, source, python, user, dry_run=dry_run)
    out.files = [(_final(dest, path), role) for path, _, _, role in files]
    out.link = (command, named.launcher) if command else None
    if dry_run:
        return out
    for path, data, mode, _role in files:
        _write(dest, path, data, mode)
    if command:
        _link(dest, layout.p(command), named.launcher)
    return out


def _primary_group(user: str) -> str:
    """The account's group where it exists here; else the group of the same
    name that sysusers.d's ``u`` line creates with it."""
    import grp
    import pwd

    try:
        return grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name
    except KeyError:
        return user


def _final(dest: str, path: str) -> str:
    return "/" + os.path.relpath(path, dest)


def _mkdirs(dest: str, directory: str) -> None:
    if not os.path.isdir(dest):
        raise InvalidInput(f"--destdir {dest} is not a directory", hint=f"mkdir -p {dest}")
    missing = []
    d = directory
    while d != dest and not os.path.lexists(d):
        missing.append(d)
        d = os.path.dirname(d)
    if os.path.islink(d) or not os.path.isdir(d):
        raise ConfigError(f"{d} is not a plain directory; staging stops there", hint=f"empty {dest} and rerun")
    for d in reversed(missing):
        os.mkdir(d, 0o755)
        os.chmod(d, 0o755)


def _write(dest: str, path: str, data: bytes, mode: int) -> None:
    directory = os.path.dirname(path)
    _mkdirs(dest, directory)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _link(dest: str, path: str, points_to: str) -> None:
    _mkdirs(dest, os.path.dirname(path))
    if os.path.lexists(path) and not os.path.islink(path):
        raise ConfigError(f"{path} exists and is not a link; not replacing it", hint=f"empty {dest} and rerun")
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{os.getpid()}")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(points_to, tmp)
    os.replace(tmp, path)
