"""``bk admin login-hook install|status|uninstall``: the profile.d script
that prints ``bk login`` once per interactive login.

The script (``install/profile.d/gpubk.sh``) is rendered with the path of
the installed launcher and written to ``<root>/etc/profile.d/gpubk.sh``;
it is an ordinary tracked file of the install manifest, so ``bk admin
install --login-hook`` and this command share one code path
(``bk.admin.tracked.file_action``, then ``bk.admin.install_apply.apply``)
and ``bk admin uninstall`` removes it with the rest.
"""

from __future__ import annotations

import os

from bk.admin import manifest as mf
from bk.core.errors import ConfigError

ROLE = "login-hook"


def status(layout) -> dict:
    """installed | modified | absent | foreign, with the path."""
    path = layout.hook
    m = mf.load(layout.config_dir)
    entry = m.find(path) if m else None
    now = mf.state(path)
    if entry is None:
        state = "absent" if now is None else "foreign"
    elif now is None:
        state = "absent"
    else:
        state = "installed" if mf.same(now, entry.expected()) else "modified"
    return {"status": state, "path": path, "launcher": layout.launcher,
            "launcher_present": os.path.exists(layout.launcher)}


def require_installed(layout) -> None:
    if not os.path.exists(layout.launcher):
        raise ConfigError(f"{layout.launcher} is missing: the login hook runs the installed bk",
                          hint="install bk first: sudo python3 bk.pyz admin install")
