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
import pwd

from bk.core.errors import InvalidInput, PermissionDenied
from bk.core.record import dataclass


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
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
