#!/usr/bin/env python3
"""Build ``dist/bk.pyz``: a reproducible zipapp of the bk package.

What goes in.  Every ``*.py`` of ``bk/``, the repository's ``install/`` and
``man/`` directories as ``bk/resources/install/...`` and
``bk/resources/man/...`` (read at run time with ``importlib.resources``, see
``bk/buildinfo.py``), a ``.pyc`` beside every source, ``bk/_build.json``, and
a top-level ``__main__.py`` that runs ``bk/__main__.py``, and an entry for
every directory.

How zipimport finds bytecode.  It never looks in ``__pycache__``: for module
``bk.x`` it tries ``bk/x.pyc`` and then ``bk/x.py`` inside the archive, and
it cannot write a compiled file back into the zip.  Without ``.pyc`` entries
every start-up recompiles every imported module.  A ``.pyc`` whose magic
number belongs to another Python version raises ImportError inside
zipimport, which it swallows before trying the source: other interpreters
still work, they just compile (and decompress the unused ``.pyc`` first).

Why unchecked hash-based pycs (PEP 552).  A timestamp pyc is validated by
zipimport against the zip entry's DOS time, which it converts with the
*local* time zone, so a pyc stamped at build time can look stale on a
machine in another zone and be silently ignored.  A checked-hash pyc makes
zipimport read and hash the source of every module on every start-up, which
is the cost the pyc exists to avoid.  Unchecked means "trust the pyc": the
price is that hand-editing a ``.py`` inside the archive has no effect while
its ``.pyc`` is there.  The archive is rebuilt as a whole, never patched, and
``content_sha256`` covers the sources, so that price is acceptable.

Why a child process compiles.  The bytes of a ``.pyc`` depend on more than
the source.  On Python 3.10 a set constant (``x in {"a", "b"}``) is stored
in iteration order, which follows the per-process hash seed; 3.11 and later
sort it.  The seed can only be fixed when an interpreter starts.  And marshal
flags an object for back-references only when its reference count is above
one, so objects the compiling process already holds can change the output
(CPython bpo-34093).  A fresh interpreter with ``PYTHONHASHSEED=0``, fixed
flags and an empty environment, compiling the files in sorted order, starts
from the same state every time, whoever calls ``build()``.  On 3.10 the hash
of ``None`` and ``...`` is their address, so a set constant holding them has
no stable order under any seed: a 3.10 build refuses it (use a tuple).

Reproducible means: the same tree, built by the same Python build (its
bytecode and its zlib), gives the same bytes.  Entries are sorted, every
entry carries the same timestamp (``SOURCE_DATE_EPOCH``, else the last git
commit, else 1980-01-01), mode 0644, no extra fields, deflate level 9.
``content_sha256`` identifies the sources and resources independently of
the interpreter and zlib; ``--check`` recomputes it from an archive.

Where the format lives.  ``bk admin install`` writes an archive too (for the
server's interpreter, from a pip install as well as from bk.pyz), so the
format, the child compiler and the zip writer are one module shipped inside
bk: ``bk/admin/pyzfile.py``.  This script loads that file from the tree it
sits in (``ROOT``), by its path, not as ``bk.admin.pyzfile``: importing the
package would run the tree's ``bk/__init__.py`` and the admin package's
imports, while the module itself imports only the standard library.  What stays here is the
command line and what only a build does: reading a source tree, choosing the
timestamp, refusing bad outputs, replacing the output atomically.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
DEFAULT_OUTPUT = Path("dist") / "bk.pyz"
PACKAGE = "bk"
EXIT_FAILED = 1
EXIT_USAGE = 2


def _load_archive_format():
    path = ROOT / PACKAGE / "admin" / "pyzfile.py"
    spec = importlib.util.spec_from_file_location("_bk_archive_format", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except FileNotFoundError:
        sys.exit(f"error: {path} not found\nhint: run build.py from a bk source tree")
    return module


archive = _load_archive_format()


class BuildError(Exception):
    """The build cannot go on; ``exit_code`` says whether the user or the tree is at fault."""

    def __init__(self, message: str, hint: str | None = None, exit_code: int = EXIT_FAILED):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code


@dataclass(frozen=True)
class BuildResult:
    path: Path
    size: int
    sha256: str  # of the archive file
    content_sha256: str
    entries: int
    info: dict  # the content of bk/_build.json


def collect(root: Path) -> dict[str, bytes]:
    """Archive name -> bytes for every source and resource entry (no pycs, no _build.json)."""
    entries: dict[str, bytes] = {"__main__.py": archive.MAIN_PY}
    package = root / PACKAGE
    if not (package / "__init__.py").is_file():
        raise BuildError(f"{package}/__init__.py not found", "run build.py from a bk source tree")
    for rel, path in archive.walk_files(package):
        if rel.endswith(".py"):
            entries[f"{PACKAGE}/{rel}"] = Path(path).read_bytes()
    entries.setdefault(f"{archive.RESOURCE_PACKAGE}/__init__.py", archive.RESOURCES_INIT_PY)
    for directory in archive.RESOURCE_DIRS:
        if not (root / directory).is_dir():
            continue
        for rel, path in archive.walk_files(root / directory):
            name = f"{archive.RESOURCE_PACKAGE}/{directory}/{rel}"
            if name in entries:
                raise BuildError(f"{directory}/{rel} would overwrite {name} from the bk package")
            entries[name] = Path(path).read_bytes()
    return entries


def read_version(root: Path) -> str:
    """``__version__`` from bk/__init__.py, parsed: importing would run the tree's code."""
    init = root / PACKAGE / "__init__.py"
    for node in ast.parse(init.read_bytes(), str(init)).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    raise BuildError(f"{init} has no __version__ = '...' assignment")


def build_time(root: Path, environ: dict[str, str] | None = None) -> int:
    """Seconds since the epoch to stamp the build with; never the clock."""
    environ = os.environ if environ is None else environ
    value = environ.get("SOURCE_DATE_EPOCH", "").strip()
    if value:
        if not (value.isascii() and value.isdigit()):
            raise BuildError(
                f"SOURCE_DATE_EPOCH={value!r} is not a non-negative integer",
                "set it to a Unix time, e.g. SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)",
                EXIT_USAGE,
            )
        return int(value)
    # Only ask git about this very tree: a copy inside another repository
    # must not pick up that repository's history.
    if (root / ".git").exists():
        try:
            proc = subprocess.run(
                ["git", "-C", str(root), "log", "-1", "--format=%ct"],
                capture_output=True, text=True, timeout=30, check=False,
            )
        except (OSError, subprocess.SubprocessError):
            proc = None
        words = proc.stdout.split() if proc is not None and proc.returncode == 0 else []
        if words and words[-1].isdigit():
            return int(words[-1])
    return archive.ZIP_TIME_MIN


def check_output(output: Path, root: Path) -> None:
    """Refuse outputs that would end up inside the archive or destroy a non-archive."""
    resolved = Path(os.path.realpath(output))
    for directory in (PACKAGE, *archive.RESOURCE_DIRS):
        inside = Path(os.path.realpath(root / directory))
        if resolved == inside or inside in resolved.parents:
            raise BuildError(
                f"refusing to write {output}: it is inside {directory}/, which goes into the archive",
                f"write it elsewhere, e.g. --output {DEFAULT_OUTPUT}",
                EXIT_USAGE,
            )
    if resolved.is_dir():
        raise BuildError(f"{output} is a directory", "give the archive's file name", EXIT_USAGE)
    if resolved.exists():
        with open(resolved, "rb") as f:
            is_archive = f.read(2) == b"#!"
        if not (is_archive and zipfile.is_zipfile(resolved)):
            raise BuildError(
                f"refusing to overwrite {output}: it is not a zipapp",
                "remove it or choose another --output",
                EXIT_USAGE,
            )


def _write_atomically(output: Path, entries: dict[str, bytes], epoch: int) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            archive.write_zip(f, entries, epoch)
            # Executable before it appears under its final name, whatever the umask.
            os.fchmod(f.fileno(), 0o755)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, output)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dirfd = os.open(output.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dirfd)  # make the rename itself durable
    finally:
        os.close(dirfd)


def build(output: Path, *, root: Path = ROOT, epoch: int | None = None) -> BuildResult:
    """Write the zipapp of the tree at ``root`` to ``output``, with bytecode for this Python.

    ``epoch`` (seconds since 1970) defaults to :func:`build_time`.
    """
    root = Path(root)
    output = Path(output)
    check_output(output, root)
    epoch = build_time(root) if epoch is None else epoch
    sources = collect(root)
    content = archive.content_sha256(sources)
    info = {
        "version": read_version(root),
        "built_at": archive.iso_utc(epoch),
        "content_sha256": content,
        "python": "{}.{}".format(*sys.version_info[:2]),
    }
    try:
        entries = archive.assemble(sources, info)
    except archive.ArchiveError as exc:
        raise BuildError(exc.message, exc.hint) from None
    _write_atomically(output, entries, epoch)
    data = output.read_bytes()
    return BuildResult(output, len(data), hashlib.sha256(data).hexdigest(), content, len(entries), info)


def read_archive(path: Path) -> dict[str, bytes]:
    """Every entry of a built archive, by name."""
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def check_archive(path: Path, root: Path = ROOT) -> list[str]:
    """Problems found comparing an archive with what it records and with the tree."""
    try:
        entries = read_archive(path)
        recorded = json.loads(entries[archive.BUILD_JSON])["content_sha256"]
    except (zipfile.BadZipFile, KeyError, TypeError, ValueError) as exc:
        return [f"{path} is not a bk archive with a build record ({exc.__class__.__name__}: {exc})"]
    actual = archive.content_sha256({n: b for n, b in entries.items() if archive.is_content_entry(n)})
    problems = []
    if actual != recorded:
        problems.append(f"{path}: content hash {actual} differs from the recorded {recorded}")
    tree = archive.content_sha256(collect(root))
    if tree != actual:
        problems.append(f"{path}: content hash {actual} differs from this tree's {tree}")
    return problems


def _display(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="build.py",
        description="Build the reproducible bk zipapp.  SOURCE_DATE_EPOCH, when set, is the "
                    "timestamp of every entry (default: the last git commit, else 1980-01-01).",
        epilog="Examples:\n  python3 build.py\n  SOURCE_DATE_EPOCH=$(git log -1 --format=%%ct) "
               "python3 build.py -o /tmp/bk.pyz\n  python3 build.py --check dist/bk.pyz",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help=f"where to write the archive (default: {DEFAULT_OUTPUT} in the source tree)")
    parser.add_argument("--check", type=Path, metavar="PYZ",
                        help="instead of building, recompute PYZ's content hash and compare it with "
                             "the one it records and with this tree; exit 1 on a mismatch")
    args = parser.parse_args(argv)
    try:
        if args.check is not None:
            problems = check_archive(args.check)
            for problem in problems:
                print(f"error: {problem}", file=sys.stderr)
            if not problems:
                print(f"{_display(args.check)}: content matches this tree")
            return EXIT_FAILED if problems else 0
        output = args.output if args.output is not None else ROOT / DEFAULT_OUTPUT
        result = build(output)
    except BuildError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{_display(result.path)}: {result.size} bytes, content sha256 {result.content_sha256[:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
