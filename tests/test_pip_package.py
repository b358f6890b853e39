"""``pip install .`` ships ``install/`` and ``man/`` as package data, under
the names the archive uses (``bk/resources/...``), and bk finds them the
same way: a source distribution is built from a copy of this tree, pip
installs it into a target directory (a wheel built from the sdist, so the
sdist's contents are tested too), and the installed bk reads its units, hook,
completions and man pages through ``bk.buildinfo``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
COPY_IGNORE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                     ".ruff_cache", ".hypothesis", "*.pyc")


def _archive_resources() -> dict[str, bytes]:
    """What build.py puts under bk/resources/ in bk.pyz."""
    sys.path.insert(0, str(ROOT))
    try:
        import build as archive_builder
    finally:
        sys.path.remove(str(ROOT))
    prefix = archive_builder.archive.RESOURCE_PACKAGE + "/"
    return {name: data for name, data in archive_builder.collect(ROOT).items() if name.startswith(prefix)}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("pip")
    src = base / "src"
    shutil.copytree(ROOT, src, ignore=COPY_IGNORE)
    sdist_dir = base / "sdist"
    build = subprocess.run(
        [sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
         "print(b.build_sdist(sys.argv[1]))", str(sdist_dir)],
        cwd=src, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    sdist = sdist_dir / build.stdout.split()[-1]
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for rel in ("build.py", "setup.py", "install/gpubk-broker.service", "install/completion/bk.bash",
                "man/bk.1", "man/bk-admin.8", "man/gpubk-config.5"):
        assert rel in names, f"the sdist lacks {rel}"
    target = base / "target"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q",
                          "--target", str(target), str(sdist)],
                         capture_output=True, text=True, timeout=600, cwd=base)
    if pip.returncode != 0 and "No matching distribution found for setuptools" in pip.stderr:
        pytest.skip("pip cannot fetch setuptools for an isolated build here")
    assert pip.returncode == 0, pip.stderr[-3000:]
    return target


def _installed_python(target: Path, code: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BK_")}
    env["PYTHONPATH"] = str(target)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=env, cwd=target.parent)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_the_wheel_carries_the_archive_resources(installed):
    want = _archive_resources()
    top = installed / "bk" / "resources"
    got = {}
    for path in sorted(top.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            got["bk/resources/" + path.relative_to(top).as_posix()] = path.read_bytes()
    assert sorted(got) == sorted(want)
    assert got == want
    assert any(n.startswith("bk/resources/man/") for n in got)
    assert any(n.startswith("bk/resources/install/") for n in got)


def test_installed_bk_reads_them_through_importlib_resources(installed):
    out = _installed_python(installed, """
import json
from bk import buildinfo
print(json.dumps({
    "source": buildinfo.build_info()["source"],
    "file": __import__("bk").__file__,
    "install": buildinfo.resource_path_names("install"),
    "man": buildinfo.resource_path_names("man"),
    "admin": buildinfo.resource_text("man", "bk-admin.8"),
    "unit": buildinfo.resource_text("install/gpubk-broker.service"),
}))
""")
    got = json.loads(out)
    assert got["source"] == "installed" and got["file"].startswith(str(installed))
    want = _archive_resources()
    assert got["install"] == sorted(n.removeprefix("bk/resources/install/") for n in want
                                    if n.startswith("bk/resources/install/"))
    assert got["man"] == ["bk-admin.8", "bk.1", "gpubk-config.5"]
    assert got["admin"] == (ROOT / "man" / "bk-admin.8").read_text()
    assert got["unit"] == (ROOT / "install" / "gpubk-broker.service").read_text()


def test_the_console_script_runs(installed):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BK_")}
    env["PYTHONPATH"] = str(installed)
    p = subprocess.run([sys.executable, str(installed / "bin" / "bk"), "--version", "--json"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)["data"]
    from bk import __version__

    assert data["version"] == __version__
