"""setuptools hook for ``pip install .``: ship ``install/`` and ``man/``
inside the package, where ``bk.pyz`` carries them.

Everything else is declared in pyproject.toml.  The repository keeps the
systemd units, the login hook, the completions and the man pages at its top
level (SPEC section 1), while bk reads them as package resources,
``bk/resources/install/...`` and ``bk/resources/man/...`` through
``importlib.resources`` (``bk.buildinfo``).  ``build.py`` decides which
files those are for the archive (its ``collect``: the same junk rules, the
generated ``bk/resources/__init__.py``); this hook asks it for the same
entries and writes them into the wheel, so a pip install and the archive
hold the same resources under the same names.

An editable install (``pip install -e .``) runs from the checkout, which
bk recognises (``build.py`` beside ``bk/``) and reads ``install/`` and
``man/`` in place, so nothing is copied there.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _archive_builder():
    """build.py as a module (by path: "build" is also the name of a PyPA tool)."""
    spec = importlib.util.spec_from_file_location("_bk_build_script", ROOT / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module        # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


class BuildPyWithResources(build_py):
    """build_py, plus the archive's resource entries under ``bk/resources/``."""

    def initialize_options(self):
        super().initialize_options()
        self._resources: list[str] = []

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        builder = _archive_builder()
        prefix = builder.archive.RESOURCE_PACKAGE + "/"
        for name, data in sorted(builder.collect(ROOT).items()):
            if not name.startswith(prefix):
                continue
            target = Path(self.build_lib, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            self._resources.append(str(target))

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + list(self._resources)


setup(cmdclass={"build_py": BuildPyWithResources})
