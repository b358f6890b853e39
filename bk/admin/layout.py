"""Where an installation lives: every path ``bk admin install`` writes,
under ``--root``, and the checks every command that changes them makes.

One table of paths serves install, uninstall, update and the login hook, so
no two commands can disagree about where the archive, the launcher or the
config is.  Under a staging root (``--root DIR``) each path is the server's
path with DIR in front, and the files install writes *name* the staged
paths too (see ``bk.admin.install``), so a staged install runs as it is.
"""

from __future__ import annotations

import grp
import os

from bk.core.errors import InvalidInput, PermissionDenied
from bk.core.record import dataclass


@dataclass(frozen=True)
class Layout:
    """Every path of an installation, under ``root``.

    ``packaged``: the paths a distribution package uses (``--destdir``):
    units in ``/usr/lib/systemd``, man pages and completion in
    ``/usr/share``.  Otherwise the administrator's own trees: units in
    ``/etc/systemd``, man pages and completion under ``/usr/local``, so a
    hand install never writes where the package manager keeps its files
    (the guide under ``/usr/share/doc/gpubk`` either way, where bk(1)
    points)."""

    root: str = "/"
    packaged: bool = False

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
        return self.p("/usr/lib/systemd/system" if self.packaged else "/etc/systemd/system")

    @property
    def user_unit_dir(self) -> str:
        return self.p("/usr/lib/systemd/user" if self.packaged else "/etc/systemd/user")

    @property
    def hook(self) -> str:
        return self.p("/etc/profile.d/gpubk.sh")

    @property
    def share(self) -> str:
        """``/usr/share`` for a package, ``/usr/local/share`` for the administrator's install."""
        return "/usr/share" if self.packaged else "/usr/local/share"

    def man(self, name: str) -> str:
        return self.p(f"{self.share}/man/man{name.rsplit('.', 1)[1]}/{name}")

    @property
    def bash_completion(self) -> str:
        # bash-completion looks in $XDG_DATA_DIRS/bash-completion/completions,
        # /usr/local/share before /usr/share by default.
        return self.p(f"{self.share}/bash-completion/completions/bk")

    @property
    def zsh_completion(self) -> str:
        return self.p(f"{self.share}/zsh/site-functions/_bk")

    @property
    def doc_dir(self) -> str:
        return self.p("/usr/share/doc/gpubk")

    @property
    def sysusers(self) -> str:
        return self.p("/usr/lib/sysusers.d/gpubk.conf")

    @property
    def tmpfiles(self) -> str:
        return self.p("/usr/lib/tmpfiles.d/gpubk.conf")


def default_root() -> str:
    """The root of the install this bk runs from: ``R`` when it is
    ``R/opt/gpubk/bk.pyz`` beside a trusted config ``R/etc/gpubk/config.json``
    (a staged install, run through its own launcher or command link), else
    ``/``.  So the commands that act on an install (update, uninstall,
    services, login-hook) act on the one they were run from, as they do on
    a real server, without ``--root`` again."""
    from bk.admin.pyzfile import running_archive

    running = running_archive()
    if running is None:
        return "/"
    real = os.path.realpath(running)
    tail = Layout().pyz
    if not real.endswith(tail) or real == tail:
        return "/"
    root = real[: -len(tail)] or "/"
    return root if os.path.isfile(Layout(root).config) else "/"


def target(layout: Layout, path: str | None, flag: str) -> str | None:
    """The server path ``path`` given as ``flag``, under the root; None stays None."""
    if path is None:
        return None
    if not os.path.isabs(path):
        raise InvalidInput(f"{flag} must be an absolute path, got {path!r}")
    return layout.p(os.path.normpath(path))


def need_root(command: str, euid: int | None = None) -> None:
    """``command`` as typed, e.g. ``bk admin install`` or ``bk update --apply``."""
    if (os.geteuid() if euid is None else euid) != 0:
        raise PermissionDenied(f"{command} changes system files and must run as root",
                               hint=f"sudo {command} ...")


def owner_name(uid: int) -> str:
    from bk.users import user_name

    return user_name(uid) or str(uid)


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
