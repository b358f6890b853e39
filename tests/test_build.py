"""build.py and bk.buildinfo: the zipapp is reproducible, complete, and runs.

Most tests build a snapshot of the tree copied into a temporary directory, so
that colleagues saving files mid-run cannot make two builds differ, and the
checks that need only the build machinery use a tiny synthetic tree.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EPOCH = 1700000000  # 2023-11-14T22:13:20Z: even, so the 2-second DOS time keeps it exact


def _load_build_script():
    spec = importlib.util.spec_from_file_location("bk_build_script", ROOT / "build.py")
    module = importlib.util.module_from_spec(spec)
    # dataclasses looks the defining module up in sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


build = _load_build_script()


def copy_tree(dest: Path, root: Path = ROOT) -> Path:
    """The parts of a source tree that build.py reads: bk/, build.py, install/, man/."""
    dest.mkdir(parents=True)
    shutil.copytree(root / "bk", dest / "bk", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(root / "build.py", dest / "build.py")
    for name in build.archive.RESOURCE_DIRS:
        if (root / name).is_dir():
            shutil.copytree(root / name, dest / name)
    return dest


def make_tree(dest: Path, files: dict[str, str]) -> Path:
    """A minimal tree: build.py, bk/__init__.py, bk/buildinfo.py, the archive
    format build.py loads (bk/admin/pyzfile.py), plus ``files``."""
    (dest / "bk" / "admin").mkdir(parents=True)
    shutil.copy2(ROOT / "build.py", dest / "build.py")
    for name in ("__init__.py", "buildinfo.py", "admin/pyzfile.py"):
        shutil.copy2(ROOT / "bk" / name, dest / "bk" / name)
    for name, text in files.items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_text(text)
    return dest


def run_build(tree: Path, output: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "SOURCE_DATE_EPOCH": str(EPOCH), **env}
    return subprocess.run(
        [sys.executable, str(tree / "build.py"), "--output", str(output)],
        capture_output=True, text=True, env=environ, timeout=120, check=False,
    )


def built(tree: Path, output: Path, **env: str) -> bytes:
    proc = run_build(tree, output, **env)
    assert proc.returncode == 0, proc.stderr
    return output.read_bytes()


@functools.cache
def interpreter(which: str) -> tuple[str, dict[str, str]] | None:
    """(executable, environment) for "current", "3.10" or "3.13", or None if absent."""
    if which == "current":
        return sys.executable, dict(os.environ)
    pyenv_version = {"3.10": "3.10.13", "3.13": "3.13.0"}[which]
    exe = shutil.which(f"python{which}")
    if exe is None:
        return None
    env = dict(os.environ, PYENV_VERSION=pyenv_version)
    try:
        ok = subprocess.run([exe, "-c", "pass"], env=env, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return (exe, env) if ok else None


def run_python(which: str, code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    found = interpreter(which)
    if found is None:
        pytest.skip(f"python{which} is not installed")
    exe, env = found
    return subprocess.run([exe, "-I", "-c", code, *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120, check=False)


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory) -> Path:
    return copy_tree(tmp_path_factory.mktemp("snapshot") / "tree")


@pytest.fixture(scope="module")
def pyz(snapshot, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("dist") / "bk.pyz"
    built(snapshot, output)
    return output


# -- reproducibility ---------------------------------------------------------


@pytest.mark.slow
def test_same_tree_gives_same_bytes(snapshot, pyz, tmp_path):
    first = pyz.read_bytes()
    # Another process with another hash seed, and the same tree at another path.
    assert built(snapshot, tmp_path / "b" / "bk.pyz", PYTHONHASHSEED="2") == first
    moved = shutil.copytree(snapshot, tmp_path / "elsewhere" / "tree")
    assert built(moved, tmp_path / "c" / "bk.pyz") == first
    # In this long-lived process too: compilation happens in a fresh child.
    result = build.build(tmp_path / "d" / "bk.pyz", root=snapshot, epoch=EPOCH)
    assert result.path.read_bytes() == first
    assert result.sha256 == hashlib.sha256(first).hexdigest()


def build_with(which: str, tree: Path, output: Path, **env: str) -> subprocess.CompletedProcess:
    found = interpreter(which)
    if found is None:
        pytest.skip(f"python{which} is not installed")
    exe, environ = found
    return subprocess.run([exe, str(tree / "build.py"), "--output", str(output)], capture_output=True,
                          text=True, env={**environ, "SOURCE_DATE_EPOCH": str(EPOCH), **env},
                          timeout=120, check=False)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["current", "3.10"])
def test_set_constants_are_compiled_reproducibly(which, tmp_path):
    # 3.10 stores set constants in hash order: the build must fix the seed.
    words = ", ".join(repr(f"word{i}") for i in range(40))
    tree = make_tree(tmp_path / "tree", {"bk/sets.py": f"def known(x):\n    return x in {{{words}}}\n"})
    first = build_with(which, tree, tmp_path / "a.pyz", PYTHONHASHSEED="1")
    assert first.returncode == 0, first.stderr
    second = build_with(which, tree, tmp_path / "b.pyz", PYTHONHASHSEED="2")
    assert second.returncode == 0, second.stderr
    assert (tmp_path / "a.pyz").read_bytes() == (tmp_path / "b.pyz").read_bytes()


@pytest.mark.slow
def test_set_constant_without_stable_order_is_refused_on_3_10(tmp_path):
    tree = make_tree(tmp_path / "tree", {"bk/bad.py": "def f(x):\n    return x in {None, 'a'}\n"})
    proc = build_with("3.10", tree, tmp_path / "bk.pyz")
    assert proc.returncode == 1
    assert "bk/bad.py: the set constant" in proc.stderr
    assert not (tmp_path / "bk.pyz").exists()
    # 3.11 and later sort set constants when marshalling, so they build it.
    assert build.build(tmp_path / "ok.pyz", root=tree, epoch=EPOCH).size > 0


@pytest.mark.slow
def test_syntax_error_names_file_and_line(tmp_path):
    tree = make_tree(tmp_path / "tree", {"bk/broken.py": "x = 1\ndef (:\n"})
    proc = run_build(tree, tmp_path / "bk.pyz")
    assert proc.returncode == 1
    assert "bk/broken.py:2" in proc.stderr
    assert not (tmp_path / "bk.pyz").exists()


# -- refusals ----------------------------------------------------------------


@pytest.mark.parametrize("inside", ["bk/bk.pyz", "bk/core/x.pyz", "install/bk.pyz", "man/bk.pyz",
                                    "dist/../bk/bk.pyz"])
def test_refuses_output_inside_archived_dirs(inside, capsys):
    target = ROOT / inside
    assert build.main(["--output", str(target)]) == build.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("error: refusing to write") and "\nhint: " in err
    assert not target.exists()


@pytest.mark.slow
def test_refusal_is_exit_status_2(tmp_path):
    tree = make_tree(tmp_path / "tree", {})
    proc = run_build(tree, tree / "bk" / "bk.pyz")
    assert proc.returncode == 2
    assert "inside bk/" in proc.stderr and proc.stdout == ""
    # Nothing of build.py's own; __pycache__ is Python's, where it writes bytecode (a newcomer's does).
    def left(d: Path) -> list[str]:
        return sorted(p.name for p in d.iterdir() if p.name != "__pycache__")
    assert left(tree / "bk") == ["__init__.py", "admin", "buildinfo.py"]
    assert left(tree / "bk" / "admin") == ["pyzfile.py"]


def test_refuses_to_overwrite_a_file_that_is_not_an_archive(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me\n")
    assert build.main(["--output", str(notes)]) == build.EXIT_USAGE
    assert "not a zipapp" in capsys.readouterr().err
    assert notes.read_text() == "keep me\n"


@pytest.mark.slow
def test_invalid_source_date_epoch(tmp_path):
    tree = make_tree(tmp_path / "tree", {})
    proc = run_build(tree, tmp_path / "bk.pyz", SOURCE_DATE_EPOCH="yesterday")
    assert proc.returncode == 2
    assert "SOURCE_DATE_EPOCH" in proc.stderr


# -- what the archive holds --------------------------------------------------


@pytest.mark.slow
def test_archive_layout(pyz, snapshot):
    data = pyz.read_bytes()
    assert data.startswith(b"#!/usr/bin/env python3\n")
    assert pyz.stat().st_mode & 0o777 == 0o755
    with zipfile.ZipFile(pyz) as archive:
        infos = archive.infolist()
        entries = {info.filename: archive.read(info) for info in infos}
    names = [info.filename for info in infos]
    assert names == sorted(names)
    for info in infos:
        assert info.date_time == time.gmtime(EPOCH)[:6]
        assert info.create_system == 3
        assert info.extra == b""
        if info.is_dir():
            assert (info.compress_type, info.external_attr >> 16) == (zipfile.ZIP_STORED, 0o40755)
        elif info.filename.endswith(".pyc"):     # read at every start-up: stored, not inflated
            assert (info.compress_type, info.external_attr >> 16) == (zipfile.ZIP_STORED, 0o100644)
        else:
            assert (info.compress_type, info.external_attr >> 16) == (zipfile.ZIP_DEFLATED, 0o100644)
    assert {n for n in names if n.endswith("/")} == build.archive.directories(names)

    sources = {f"bk/{p.relative_to(snapshot / 'bk').as_posix()}" for p in (snapshot / "bk").rglob("*.py")}
    assert sources <= set(entries)
    assert {"__main__.py", "bk/resources/__init__.py", "bk/_build.json"} <= set(entries)
    assert not [n for n in names if "__pycache__" in n or "/." in n]

    modules = [n for n in names if n.endswith(".py")]
    for name in modules:
        pyc = entries[name[:-3] + ".pyc"]
        assert pyc[:4] == importlib.util.MAGIC_NUMBER
        assert int.from_bytes(pyc[4:8], "little") == 0b01  # hash-based, unchecked
        assert pyc[8:16] == importlib.util.source_hash(entries[name])
    assert len([n for n in names if n.endswith(".pyc")]) == len(modules)

    record = json.loads(entries["bk/_build.json"])
    assert set(record) == {"version", "built_at", "content_sha256", "python"}
    assert record["version"] == build.read_version(snapshot)
    assert record["built_at"] == "2023-11-14T22:13:20Z"
    assert record["python"] == "{}.{}".format(*sys.version_info[:2])
    content = {n: b for n, b in entries.items()
               if not n.endswith((".pyc", "/")) and n != "bk/_build.json"}
    assert record["content_sha256"] == build.archive.content_sha256(content)
    assert build.check_archive(pyz, snapshot) == []
    assert "not a bk archive" in build.check_archive(snapshot / "build.py", snapshot)[0]


@pytest.mark.slow
def test_content_hash_follows_every_source_byte(snapshot, tmp_path):
    tree = copy_tree(tmp_path / "tree", snapshot)
    original = build.build(tmp_path / "1.pyz", root=tree, epoch=EPOCH).content_sha256
    # The same tree at another time: the content hash ignores the timestamp.
    assert build.build(tmp_path / "2.pyz", root=tree, epoch=0).content_sha256 == original

    source = tree / "bk" / "__main__.py"
    text = source.read_bytes()
    source.write_bytes(text + b"#")
    changed = build.build(tmp_path / "3.pyz", root=tree, epoch=EPOCH)
    assert changed.content_sha256 != original
    assert build.check_archive(tmp_path / "1.pyz", tree) != []  # the old archive no longer matches

    source.write_bytes(text)
    (tree / "man").mkdir(exist_ok=True)
    (tree / "man" / "extra.txt").write_text("x\n")
    assert build.build(tmp_path / "4.pyz", root=tree, epoch=EPOCH).content_sha256 != original


def test_timestamps_before_1980_are_clamped_in_the_zip_only(tmp_path):
    tree = make_tree(tmp_path / "tree", {})
    result = build.build(tmp_path / "bk.pyz", root=tree, epoch=0)
    assert result.info["built_at"] == "1970-01-01T00:00:00Z"
    with zipfile.ZipFile(result.path) as archive:
        assert {info.date_time for info in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}


def test_build_time_sources(tmp_path):
    tree = make_tree(tmp_path / "tree", {})
    assert build.build_time(tree, {"SOURCE_DATE_EPOCH": "1234567890"}) == 1234567890
    assert build.build_time(tree, {"SOURCE_DATE_EPOCH": ""}) == build.archive.ZIP_TIME_MIN
    assert build.build_time(tree, {}) == build.archive.ZIP_TIME_MIN  # no .git
    with pytest.raises(build.BuildError) as caught:
        build.build_time(tree, {"SOURCE_DATE_EPOCH": "-5"})
    assert caught.value.exit_code == build.EXIT_USAGE
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.org",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.org",
               GIT_COMMITTER_DATE="@1600000000 +0000", GIT_AUTHOR_DATE="@1600000000 +0000")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "x"]):
        subprocess.run(["git", "-C", str(tree), *args], env=env, check=True, capture_output=True)
    assert build.build_time(tree, {}) == 1600000000
    assert build.build_time(tree, {"SOURCE_DATE_EPOCH": "7"}) == 7


def test_prints_one_line(tmp_path):
    tree = make_tree(tmp_path / "tree", {})
    proc = run_build(tree, tmp_path / "out" / "bk.pyz")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1
    size = (tmp_path / "out" / "bk.pyz").stat().st_size
    assert lines[0].startswith(f"{tmp_path / 'out' / 'bk.pyz'}: {size} bytes, content sha256 ")


# -- running the archive -----------------------------------------------------

RESOURCE_PROBE = """\
import importlib.resources, json, sys
sys.path.insert(0, sys.argv[1])
from bk import buildinfo
print(json.dumps({
    "direct": (importlib.resources.files("bk.resources") / "man" / "bk.1").read_text()
              if buildinfo.checkout_root() is None else None,
    "text": buildinfo.resource_text("man", "bk.1"),
    "nested": buildinfo.resource_text("install/systemd/bk.service"),
    "install": buildinfo.resource_path_names("install"),
    "man": buildinfo.resource_path_names("man"),
    "missing": buildinfo.resource_path_names("nothing"),
    "source": buildinfo.build_info()["source"],
    "origin": buildinfo.__spec__.origin.rsplit("/", 1)[-1],
    "namespace_package": __import__("bk.ns.mod").ns.mod.VALUE,
}))
"""


@pytest.fixture(scope="module")
def resource_tree(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("resources")
    return make_tree(tmp / "tree", {
        "man/bk.1": ".TH BK 1\n.SH NAME\nbk \\- book GPUs\n",
        "man/bk.1.orig": "junk\n",
        "man/.bk.1.swp": "junk\n",
        "install/systemd/bk.service": "[Unit]\nDescription=bk\n",
        "install/helper.py": "print('not a module of bk')\n",
        "install/notes~": "junk\n",
        "install/__pycache__/helper.cpython-311.pyc": "junk\n",
        "bk/.hidden.py": "junk = 1\n",
        "bk/#autosave#.py": "junk = 1\n",
        "bk/__pycache__/x.cpython-311.pyc": "junk\n",
        "bk/ns/mod.py": "VALUE = 42\n",  # a package without __init__.py (PEP 420)
    })


@pytest.fixture(scope="module")
def resource_pyz(resource_tree, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("resources-dist") / "bk.pyz"
    built(resource_tree, output)
    return output


@pytest.mark.slow
def test_junk_is_left_out_and_resources_are_not_compiled(resource_pyz):
    with zipfile.ZipFile(resource_pyz) as archive:
        names = archive.namelist()
    assert names == [
        "__main__.py", "__main__.pyc",
        "bk/", "bk/__init__.py", "bk/__init__.pyc", "bk/_build.json",
        "bk/admin/", "bk/admin/pyzfile.py", "bk/admin/pyzfile.pyc", "bk/buildinfo.py", "bk/buildinfo.pyc",
        "bk/ns/", "bk/ns/mod.py", "bk/ns/mod.pyc",
        "bk/resources/", "bk/resources/__init__.py", "bk/resources/__init__.pyc",
        "bk/resources/install/", "bk/resources/install/helper.py",
        "bk/resources/install/systemd/", "bk/resources/install/systemd/bk.service",
        "bk/resources/man/", "bk/resources/man/bk.1",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("which", ["current", "3.10", "3.13"])
def test_resources_read_the_same_from_checkout_and_archive(which, resource_tree, resource_pyz):
    from_archive = run_python(which, RESOURCE_PROBE, str(resource_pyz), cwd=resource_pyz.parent)
    assert from_archive.returncode == 0, from_archive.stderr
    from_checkout = run_python(which, RESOURCE_PROBE, str(resource_tree), cwd=resource_pyz.parent)
    assert from_checkout.returncode == 0, from_checkout.stderr
    archive, checkout = json.loads(from_archive.stdout), json.loads(from_checkout.stdout)

    man = (resource_tree / "man" / "bk.1").read_text()
    assert archive["direct"] == archive["text"] == checkout["text"] == man
    assert archive["nested"] == checkout["nested"] == "[Unit]\nDescription=bk\n"
    assert archive["install"] == checkout["install"] == ["helper.py", "systemd/bk.service"]
    assert archive["man"] == checkout["man"] == ["bk.1"]
    assert archive["missing"] == checkout["missing"] == []
    assert (archive["source"], checkout["source"]) == ("archive", "checkout")
    assert archive["namespace_package"] == checkout["namespace_package"] == 42
    # The building interpreter runs the bytecode; the others compile the source.
    assert archive["origin"] == ("buildinfo.pyc" if which == "current" else "buildinfo.py")


def test_build_info_in_a_checkout():
    from bk import __version__
    from bk.buildinfo import build_info

    assert build_info() == {"version": __version__, "built_at": None, "content_sha256": None,
                            "python": None, "source": "checkout"}


@pytest.mark.slow
def test_build_info_in_the_archive(pyz):
    code = "import json, sys; sys.path.insert(0, sys.argv[1]); import bk.buildinfo as b; " \
           "print(json.dumps(b.build_info()))"
    proc = run_python("current", code, str(pyz), cwd=pyz.parent)
    assert proc.returncode == 0, proc.stderr
    with zipfile.ZipFile(pyz) as archive:
        record = json.loads(archive.read("bk/_build.json"))
    assert json.loads(proc.stdout) == {**record, "source": "archive"}


@pytest.mark.slow
@pytest.mark.parametrize("which", ["current", "3.10", "3.13"])
def test_version_through_the_archive(which, pyz, snapshot):
    found = interpreter(which)
    if found is None:
        pytest.skip(f"python{which} is not installed")
    exe, env = found
    proc = subprocess.run([exe, str(pyz), "--version"], capture_output=True, text=True,
                          env=env, cwd=pyz.parent, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"bk {build.read_version(snapshot)}\n"


@pytest.mark.slow
def test_archive_runs_by_its_shebang_and_reports_its_hash(pyz):
    if shutil.which("python3") is None:
        pytest.skip("no python3 on PATH for the shebang")
    proc = subprocess.run([str(pyz), "--version", "--json"], capture_output=True, text=True,
                          cwd=pyz.parent, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    with zipfile.ZipFile(pyz) as archive:
        content = json.loads(archive.read("bk/_build.json"))["content_sha256"]
    assert content in proc.stdout
