"""What a child process of an admin command gets: a program found only in
root's own directories, an environment bk wrote itself, and ``/`` as its
working directory.

Facts.  ``sudo bk admin install``, ``bk update --apply`` and the rest run
as root, and they start other programs: ``systemctl``, the interpreter the
archive is compiled for (``bk.admin.pyzfile``), the installed launcher
(``bk --version``, ``bk doctor``).  Each would take from its parent:

- a name without a slash is looked up on ``PATH``; the first directory
  that holds the name wins, and the caller's PATH may start with a
  directory someone else can write (``~/bin``, ``.``, a project's
  ``node_modules/.bin``);
- Python reads ``PYTHONPATH``, ``PYTHONSTARTUP``, ``PYTHONHOME`` and its
  other variables, and the user site directory under ``$HOME``
  (``usercustomize``, ``.pth`` files), where ``HOME`` may still name the
  administrator's (or another user's) home;
- ``python3 -c CODE`` puts the working directory first on ``sys.path``, so
  an ``importlib/`` package or a ``marshal.py`` in ``/tmp`` (where the
  guide has the administrator copy ``bk.pyz``) is imported instead of the
  standard library's.

Decision.  No child of an admin command inherits any of it.  Programs are
found on ``trusted_path()``: the fixed system directories that only root
can change (the directory and every one above it, ``bk.store.fsutil``'s
rule), never the caller's PATH.  The environment is ``environment()``:
that PATH, root's own home from the password database, a UTF-8 locale,
nothing else.  The working directory is ``/``.  An interpreter started to
run bk's own code is isolated besides (``bk.admin.pyzfile``): no site, no
user site, no working directory on its path.
"""

from __future__ import annotations

import os

SYSTEM_DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
CWD = "/"


def _root_only(directory: str) -> bool:
    from bk.store.fsutil import unsafe_ancestor

    return unsafe_ancestor(directory, (0,), sticky_ok=False) is None


def trusted_path() -> str:
    """``PATH`` for root's children: the system directories that exist and
    that nobody but root can change.  A directory that is a symbolic link
    (``/bin`` on a merged-/usr system) is left out; what it points to is
    already on the list."""
    return ":".join(d for d in SYSTEM_DIRS if _root_only(d))


def root_home() -> str:
    """root's home from the password database when only root can change
    it, else ``/``; never the ``HOME`` the command was started with."""
    import pwd

    try:
        home = pwd.getpwuid(0).pw_dir
    except KeyError:
        return "/"
    return home if home and os.path.isabs(home) and _root_only(home) else "/"


def environment(**extra: str) -> dict[str, str]:
    """The whole environment of a child of an admin command, plus ``extra``."""
    return {"PATH": trusted_path(), "HOME": root_home(), "LANG": "C.UTF-8", **extra}
