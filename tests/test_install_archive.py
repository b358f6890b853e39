"""The installer's archive writer and build.py agree byte for byte.

Both write through ``bk/admin/pyzfile.py``: ``build.py`` loads that file of
its tree by path (it must build with only the standard library), and
``bk.admin.pyzfile`` writes ``/opt/gpubk/bk.pyz``; the same entries compiled
by the same interpreter must give the same archive, so an installed bk
reports the build's content hash and a reinstall of the same archive
changes nothing.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from bk.admin import pyzfile

ROOT = Path(__file__).resolve().parent.parent


def _build_module():
    spec = importlib.util.spec_from_file_location("bk_build_for_archive_test", ROOT / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


@pytest.mark.slow
def test_rewriting_the_built_archive_for_the_same_python_gives_the_same_bytes(pyz):
    rebuilt = pyzfile.archive_bytes(pyzfile.read_entries(str(pyz)), sys.executable)
    assert rebuilt == pyz.read_bytes()


def test_build_py_writes_through_the_one_archive_module():
    build = _build_module()
    assert Path(build.archive.__file__) == ROOT / "bk" / "admin" / "pyzfile.py" == Path(pyzfile.__file__)
    # No second copy of the format in build.py: what it needs, it takes from there.
    for name in ("SHEBANG", "MAIN_PY", "RESOURCES_INIT_PY", "_COMPILE_WORKER", "CODE_PREFIX", "FILE_ATTR",
                 "content_sha256", "compile_pycs", "directories", "is_junk", "write_zip"):
        assert not hasattr(build, name), name
    entries = {"b/x.py": b"x = 1\n", "a.txt": b"a", "bk/_build.json": b"{}"}
    assert pyzfile.content_sha256(entries) == build.archive.content_sha256(entries)


def test_a_foreign_zip_is_not_taken_for_an_archive(tmp_path):
    import zipfile

    import pytest

    from bk.core.errors import ConfigError

    path = tmp_path / "other.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("hello.txt", "hi")
    with pytest.raises(ConfigError, match="not a bk archive"):
        pyzfile.read_entries(str(path))
    (tmp_path / "junk.pyz").write_bytes(b"#!/bin/sh\nnot a zip\n")
    with pytest.raises(ConfigError, match="not a readable bk archive"):
        pyzfile.read_entries(str(tmp_path / "junk.pyz"))
