"""The ``bk`` command: a link (``/usr/local/bin/bk``, or ``--command-path``)
to the launcher ``/opt/gpubk/bin/bk``.

Facts.  A directory on everyone's PATH decides which program users run when
they type ``bk``, and whoever can write it can put another one there.
pip, a distribution package or another tool may already own the name.
rename(2) replaces whatever holds the name by then, and nothing creates a
symlink only if the name is free (link(2) cannot make one).

Rules.  The link goes only into a root-owned directory nobody else can
write.  It never replaces a file or link bk did not install: that one is
left alone, with a warning naming the command users can run instead.  An
identical link already there is adopted (recorded, not touched).  A
reinstall keeps the link where the install put it (``--command-path
/usr/bin/bk`` stays), and ``--no-command-link`` removes the one it made.
"""

from __future__ import annotations

import os
import stat

from bk.admin import manifest as mf
from bk.admin import tracked
from bk.admin.layout import Layout, target
from bk.admin.tracked import Action
from bk.core.errors import ConfigError
from bk.store.fsutil import fsync_dir_at

DEFAULT_COMMAND = "/usr/local/bin/bk"


def command_path(options, m: mf.Manifest | None) -> str | None:
    """Where the link goes, as on the server (no root prefix); None: no link.

    ``options`` is a ``bk.admin.install.Options``.  Unsaid, it is where the
    last install put it (or no link, when that install was told not to make
    one), else ``DEFAULT_COMMAND``."""
    installed = m.options.get("command_path") if m else None
    link = options.command_link if options.command_link is not None else (
        m is None or "command_path" not in m.options or bool(installed))
    return (options.command_path or installed or DEFAULT_COMMAND) if link else None


def link_actions(layout: Layout, command: str, m: mf.Manifest | None, warnings: list[str],
                 done: set[str]) -> list[Action]:
    """What the link at the server path ``command`` needs: made (with its
    missing parents), kept, adopted, or skipped with a warning."""
    path = target(layout, command, "--command-path") or ""
    launcher = layout.launcher
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
    want = {"kind": "link", "target": launcher}
    if now is None:
        return [*tracked.parents(path, done),
                Action("link", path, "command", "the bk command", kind="link", target=launcher)]
    if entry is not None and mf.same(now, entry.expected()) or mf.same(now, want):
        if entry is None:
            return [Action("adopt", path, "command", "an identical link was already there; kept after uninstall",
                           kind="link", target=launcher, before=now)]
        return [Action("keep", path, "command", "up to date", kind="link", target=launcher)]
    what = f"a link to {now['target']}" if now["kind"] == "link" else f"a {now['kind']}"
    warnings.append(f"{path} is {what} that bk did not install; left alone. Users run "
                    f"{launcher}, or choose another --command-path")
    return [Action("skip", path, "command", f"{what}, not bk's: left alone", kind="link", target=launcher)]


def make_link(path: str, points_to: str) -> None:
    """A symlink ``path`` -> ``points_to`` where nothing is, made under a temporary name and renamed."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(points_to, tmp)
    # rename over nothing: if a file appeared meanwhile, keep it (link(2)
    # cannot make a symlink; a last look is the best a rename can do).
    if os.path.lexists(path):
        os.unlink(tmp)
        raise ConfigError(f"{path} appeared during the install; left alone", hint="inspect it and rerun")
    os.replace(tmp, path)
    fsync_dir_at(os.path.dirname(path))
