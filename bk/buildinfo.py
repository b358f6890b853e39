"""What this copy of bk is (version, build record) and where its data files are.

bk runs in three shapes:

- from ``bk.pyz``, written by ``build.py``: the archive carries
  ``bk/_build.json`` and the repository's ``install/`` and ``man/`` as
  ``bk/resources/install/`` and ``bk/resources/man/``, read through
  ``importlib.resources`` (the files are zip entries, not paths on disk);
- from a source checkout (``python -m bk``, the tests): no build record, and
  ``install/`` and ``man/`` sit beside the ``bk/`` directory, so the resource
  functions below read them there; a checkout is recognised by ``build.py``
  next to ``bk/``;
- installed by pip: no build record and no resources unless the package
  ships ``bk/resources``.

``build_info()`` is on the path of ``bk --version``, so this module imports
nothing beyond ``os``; ``json`` and ``importlib.resources`` load only when
needed.
"""

from __future__ import annotations

import os

import bk
from bk import __version__

BUILD_JSON = "_build.json"
# Top-level directories of the repository that build.py copies into bk/resources/.
MAPPED_DIRS = ("install", "man", "docs")
# The same rule as build.py's is_junk(): what the archive leaves out, a
# checkout's listing leaves out too, so an installer sees one set of files.
_JUNK_DIRS = frozenset({"__pycache__", "CVS"})
_JUNK_SUFFIXES = (".pyc", ".pyo", ".swp", ".swo", ".orig", ".rej", ".bak", ".tmp", "~")


def build_info() -> dict:
    """The build record: version, built_at, content_sha256, python, and source.

    ``source`` is ``"archive"`` (the record comes from ``bk/_build.json``),
    ``"checkout"`` or ``"installed"``; outside the archive the build fields
    are None.  A fresh dict each call.
    """
    raw = _read_build_record()
    if raw is None:
        return {
            "version": __version__,
            "built_at": None,
            "content_sha256": None,
            "python": None,
            "source": "checkout" if checkout_root() else "installed",
        }
    import json

    info = json.loads(raw)
    info["source"] = "archive"
    return info


def _read_build_record() -> bytes | None:
    # What pkgutil.get_data("bk", "_build.json") does, without importing
    # pkgutil (about 10 ms on a cold start): ask the loader that imported bk,
    # which for the archive is zipimport reading the zip entry.
    get_data = getattr(getattr(bk.__spec__, "loader", None), "get_data", None)
    package_file = getattr(bk, "__file__", None)
    if get_data is None or not package_file:
        return None
    try:
        return get_data(os.path.join(os.path.dirname(package_file), BUILD_JSON))
    except OSError:
        return None


def checkout_root() -> str | None:
    """The source tree bk runs from, or None (archive, pip install)."""
    package_file = getattr(bk, "__file__", None)
    if not package_file:
        return None
    root = os.path.dirname(os.path.dirname(os.path.abspath(package_file)))
    # Inside bk.pyz the parent is the archive file itself, so this is False.
    return root if os.path.isfile(os.path.join(root, "build.py")) else None


def _split(parts: tuple[str, ...]) -> list[str]:
    names = [name for part in parts for name in part.split("/")]
    if not names or any(name in ("", ".", "..") for name in names):
        raise ValueError(f"invalid resource path {'/'.join(parts)!r}")
    return names


def _locate(names: list[str]):
    """A Traversable (pathlib.Path in a checkout) for bk.resources/<names>."""
    root = checkout_root()
    if root is not None and names[0] in MAPPED_DIRS:
        from pathlib import Path

        return Path(root, *names)
    from importlib.resources import files

    try:
        node = files("bk.resources")
    except ModuleNotFoundError:
        raise FileNotFoundError(f"bk has no resources here: cannot read {'/'.join(names)}") from None
    for name in names:
        node = node / name
    return node


def resource_text(*parts: str, encoding: str = "utf-8") -> str:
    """The text of a resource, e.g. ``resource_text("man", "bk.1")`` or ``("man/bk.1")``.

    Raises FileNotFoundError when there is no such file.
    """
    node = _locate(_split(parts))
    if not node.is_file():
        raise FileNotFoundError(f"no resource {'/'.join(parts)!r}")
    return node.read_text(encoding=encoding)


def resource_path_names(subdir: str) -> list[str]:
    """Sorted '/'-separated paths of the files under a resource directory, relative to it.

    ``resource_path_names("install")`` -> ``["bk.service", "completion/bk.bash", ...]``;
    an absent directory gives ``[]``.
    """
    try:
        top = _locate(_split((subdir,)))
    except FileNotFoundError:
        return []
    names: list[str] = []
    pending = [(top, "")] if top.is_dir() else []
    while pending:
        node, prefix = pending.pop()
        for child in node.iterdir():
            if child.name.startswith((".", "#")) or child.name.endswith(_JUNK_SUFFIXES):
                continue
            if child.is_dir():
                if child.name not in _JUNK_DIRS:
                    pending.append((child, f"{prefix}{child.name}/"))
            elif child.is_file():
                names.append(prefix + child.name)
    return sorted(names)
