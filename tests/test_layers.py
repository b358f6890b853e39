"""The architecture, checked: every import of every module of ``bk`` is
parsed with ``ast`` (also those inside functions, since lazy imports are
still dependencies) and held against the dependency matrix below, the same
table that the "Layers" section of docs/ARCHITECTURE.md writes down
(``test_docs_table_is_the_matrix`` keeps the two equal).

Imports written as strings are imports too: a ``"bk.x.y:attr"`` reference
(the operation table's lazy rows), a string that names a module of bk
(``"bk.cli.cmd_book"``, imported later by name), and the argument of
``import_module("bk...")`` or ``__import__("bk...")``.  An arrow hidden in a
string is still an arrow.

A *unit* is a top-level package of bk (``bk.core``, ``bk.cli``, ...), one of
the top-level modules ``bk.clock``, ``bk.users``, ``bk.buildinfo`` and ``bk.daemon``, the entry point
``bk.__main__``, or ``bk`` itself (``bk/__init__.py``: the version).  A unit
may always import its own modules; anything else it imports must be in its
row of ``LAYERS``, or in ``EXCEPTIONS`` for that one module.  A package with
no row fails: a new package starts by saying where it sits.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "bk"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"

BASE = frozenset({"bk.core", "bk.clock", "bk.users"})  # what everything above the store may use
# unit -> the other units it may import (its own modules are always allowed).
LAYERS: dict[str, frozenset[str]] = {
    "bk": frozenset(),                           # bk/__init__.py: the version, nothing else
    "bk.__main__": frozenset({"bk.cli"}),        # python -m bk
    "bk.core": frozenset(),                      # pure; see IMPURE below
    "bk.clock": frozenset({"bk.core"}),          # the clock seam: core's errors and ISO parser
    "bk.users": frozenset(),                     # the account seam: uid -> name, for every layer
    "bk.buildinfo": frozenset({"bk"}),           # the version and the build record
    "bk.store": frozenset({"bk.core", "bk.users"}),  # state files; the clock is an argument
    # The daemons' frame: account check, single-instance lock (the store's), stop signals, log lines, readiness.
    "bk.daemon": frozenset({"bk.core", "bk.users", "bk.store"}),
    "bk.gpu": frozenset({"bk.core", "bk.users"}),  # the one GPU gateway
    "bk.ipc": frozenset({"bk.core"}),            # the broker's wire, shared by service and broker
    "bk.jobs": frozenset({"bk.core", "bk.store", "bk.daemon"}),  # job specs, logs, launcher, worker loop
    "bk.notify": frozenset({"bk.core", "bk.store"}),  # notification files, channels, deliverer (for the service)
    # The exports' renderers: pure, like the core (see PURE below).
    "bk.export": frozenset({"bk.core"}),
    "bk.service": BASE | {"bk", "bk.store", "bk.gpu", "bk.ipc", "bk.jobs", "bk.notify", "bk.export"},
    "bk.cli": BASE | {"bk", "bk.buildinfo", "bk.service", "bk.export"},
    "bk.broker": BASE | {"bk.ipc", "bk.service", "bk.daemon"},
    # Set-up runs before any configuration exists, so no service can be
    # opened: it writes the config with the store's code and asks the GPU
    # gateway how many GPUs there are.
    # Install and update also read the version and the shipped resources.
    "bk.admin": BASE | {"bk", "bk.buildinfo", "bk.store", "bk.gpu"},
    # The packages to come.
    "bk.monitor": BASE | {"bk.store", "bk.gpu", "bk.service", "bk.export", "bk.daemon"},
    "bk.tui": BASE | {"bk.service"},
    # The agent surface is a front end: rows in, envelopes out; the cluster's
    # tools are composed with the built-in ones by a plain import.
    "bk.agent": BASE | {"bk", "bk.service", "bk.cluster"},
    "bk.mcp": BASE | {"bk.service", "bk.agent"},
    # The catalog is a trusted file (the store's trust check and atomic
    # replace); nodes are reached through the one ssh module.
    "bk.cluster": BASE | {"bk.ipc", "bk.service", "bk.store", "bk.remote"},
    "bk.remote": frozenset({"bk.core"}),          # runs ssh: bounded, timed, killed by PID
    # Hard enforcement: bpf() and the cgroup tree; the ledger and the monitor's
    # snapshot through the store, container patterns through the GPU gateway.
    "bk.enforce": BASE | {"bk.store", "bk.gpu", "bk.daemon"},
}
# module -> {unit: why}: single modules allowed one edge more than their unit.
EXCEPTIONS: dict[str, dict[str, str]] = {
    "bk.cli.cmd_broker": {
        "bk.broker": "`bk broker` runs the daemon in this process; imported only when that command runs",
    },
    "bk.cli.cmd_admin": {
        "bk.admin": "`bk admin init` runs the set-up in this process; imported only when that command runs",
    },
    "bk.cli.cmd_install": {
        "bk.admin": "`bk admin install`, `uninstall`, `services`, `login-hook` and `bk update` run in this "
                    "process; imported only when those commands run",
    },
    "bk.cli.cmd_tui": {
        "bk.tui": "`bk t` runs the full-screen timeline in this process; imported only when that command runs",
    },
    "bk.cli.cmd_monitor": {
        "bk.monitor": "`bk m` runs the monitor daemon in this process; imported only when that command runs",
    },
    "bk.cli.cmd_mcp": {
        "bk.mcp": "`bk mcp` runs the MCP server in this process; imported only when that command runs",
    },
    "bk.cli.cmd_agent": {
        "bk.agent": "`bk agent` runs the agent surface's tools in this process; imported only when that "
                    "command runs",
    },
    "bk.cli.cmd_cluster": {
        "bk.cluster": "`bk c` and `bk @NODE` are the cluster client, and `bk c node` its node half",
    },
    "bk.cli.cmd_admin_cluster": {
        "bk.admin": "`bk admin cluster` edits the catalog in this process",
        "bk.cluster": "the catalog's parser and node identity, which `bk admin cluster` writes",
    },
    "bk.admin.cluster": {
        "bk.cluster": "the catalog's one parser and writer, and the node id it stores",
    },
    "bk.cli.cmd_enforce": {
        "bk.enforce": "`bk admin enforce` plans, applies and runs the enforcer in this process; imported only "
                      "when that command runs",
    },
    "bk.service.doctor": {
        "bk.enforce": "`bk doctor` checks enforcement (kernel support, the enforcer, the programs per user); "
                      "imported only when the configuration turns enforcement on",
    },
    "bk.broker.server": {
        "bk.store": "the daemon's start-up: it loads the trusted config and checks the owner and mode of "
                    "its directories with the store's rule",
    },
}

# The pure core may not touch the outside world.
IMPURE = {"os", "time", "socket", "fcntl", "subprocess", "curses", "select", "signal", "shutil",
          "threading", "multiprocessing", "pathlib", "tempfile", "io", "pwd", "grp", "random",
          "asyncio", "selectors", "mmap", "ctypes", "sqlite3", "urllib", "http", "zoneinfo"}
OPTIONAL_THIRD_PARTY = {"pynvml": "bk.gpu.nvml"}
PURE = ("bk.core", "bk.export")          # units held to the core's no-I/O rule


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _on_disk_units() -> set[str]:
    units = {"bk"}
    for p in PKG.iterdir():
        if p.is_dir() and (p / "__init__.py").exists():
            units.add(f"bk.{p.name}")
        elif p.suffix == ".py" and p.name != "__init__.py":
            units.add(f"bk.{p.stem}")
    return units


UNITS = _on_disk_units() | set(LAYERS)


def unit_of(name: str) -> str:
    """The unit a dotted module name belongs to: ``bk.store.ledger`` ->
    ``bk.store``, ``bk`` -> ``bk``."""
    parts = name.split(".")
    return "bk" if len(parts) == 1 else f"bk.{parts[1]}"


def _from_name(node: ast.ImportFrom, mod: str, is_package: bool) -> str:
    """The module a ``from ... import`` reads from, relative ones resolved
    against ``mod``."""
    if not node.level:
        return node.module or ""
    base = mod.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(source: str, mod: str, *, is_package: bool = False) -> list[tuple[str, int]]:
    """Every module name ``source`` imports, with its line: ``import a.b``
    gives ``a.b``; ``from a import b`` gives ``a`` and ``a.b`` (``b`` may be
    a module)."""
    out = []
    for node in ast.walk(ast.parse(source, filename=mod)):
        if isinstance(node, ast.Import):
            out.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            name = _from_name(node, mod, is_package)
            out.append((name, node.lineno))
            out.extend((f"{name}.{a.name}", node.lineno) for a in node.names)
    return out


def bk_dependencies(source: str, mod: str, *, is_package: bool = False) -> list[tuple[str, str, int]]:
    """The units of bk that ``source`` depends on: ``(unit, imported name, line)``.

    ``from bk import clock`` depends on ``bk.clock`` only, not on ``bk``
    itself (importing any bk module runs ``bk/__init__.py`` anyway); ``from bk
    import __version__`` and ``import bk`` depend on ``bk``."""
    out = []
    for node in ast.walk(ast.parse(source, filename=mod)):
        if isinstance(node, ast.Import):
            out.extend((unit_of(a.name), a.name, node.lineno) for a in node.names if _is_bk(a.name))
        elif isinstance(node, ast.ImportFrom):
            name = _from_name(node, mod, is_package)
            if name == "bk":
                for a in node.names:
                    sub = f"bk.{a.name}"
                    out.append((sub if sub in UNITS else "bk", sub, node.lineno))
            elif _is_bk(name):
                out.append((unit_of(name), name, node.lineno))
    out.extend((unit_of(name), name, line) for name, line in string_imports(source, mod))
    return out


def _is_bk(name: str) -> bool:
    return name == "bk" or name.startswith("bk.")


# "bk.x.y" or "bk.x.y:attr": a module named in a string, imported later by name.
_STRING_REF = re.compile(r"bk(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?")
_IMPORT_CALLS = ("import_module", "__import__")


def _on_disk(name: str) -> bool:
    path = ROOT / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def string_imports(source: str, mod: str) -> list[tuple[str, int]]:
    """The modules of bk that ``source`` imports by a name written as a
    string: ``(module, line)``."""
    tree = ast.parse(source, filename=mod)
    called = set()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
            arg = node.args[0].value
            if name in _IMPORT_CALLS and isinstance(arg, str) and _is_bk(arg):
                out.append((arg, node.lineno))
                called.add(id(node.args[0]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in called:
            if _STRING_REF.fullmatch(node.value):
                name, colon, _ = node.value.partition(":")
                if colon or _on_disk(name):
                    out.append((name, node.lineno))
    return out


def problems_of(mod: str, source: str, *, is_package: bool = False) -> list[str]:
    """Every rule that module ``mod`` with this ``source`` breaks."""
    own = unit_of(mod)
    problems = []
    allowed = LAYERS.get(own)
    if allowed is None:
        problems.append(f"{own} has no row in LAYERS: add one here and in docs/ARCHITECTURE.md")
        allowed = frozenset()
    extra = EXCEPTIONS.get(mod, {})
    for unit, name, line in bk_dependencies(source, mod, is_package=is_package):
        if unit == own or unit in allowed or unit in extra:
            continue
        may = f"only {', '.join(sorted(allowed))}" if allowed else "nothing else in bk"
        problems.append(f"line {line}: imports {name}, but {own} may import {may}")
    for name, line in imports_of(source, mod, is_package=is_package):
        top = name.split(".")[0]
        if own in PURE and top in IMPURE:
            problems.append(f"line {line}: pure {'core' if own == 'bk.core' else own} imports {name}")
        if top not in sys.stdlib_module_names and top not in ("bk", "__future__"):
            if OPTIONAL_THIRD_PARTY.get(top) != mod:
                problems.append(f"line {line}: imports third-party {name} "
                                f"(only {OPTIONAL_THIRD_PARTY} allowed)")
    return problems


SOURCES = sorted(PKG.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_layer_rules(path: Path):
    mod = module_name(path)
    problems = problems_of(mod, path.read_text(), is_package=path.name == "__init__.py")
    assert not problems, f"{mod}: " + "; ".join(problems)


def _check(mod: str, source: str, *, is_package: bool = False) -> str:
    return "; ".join(problems_of(mod, source, is_package=is_package))


@pytest.mark.parametrize(("mod", "source", "message"), [
    ("bk.cli.x", "from bk.store.ledger import Store\n", "imports bk.store.ledger, but bk.cli may import only"),
    ("bk.cli.x", "def f():\n    import bk.gpu\n", "line 2: imports bk.gpu, but bk.cli"),
    ("bk.cli.x", "import bk.ipc.client\n", "imports bk.ipc.client"),
    ("bk.cli.cmd_book", "from bk.broker import server\n", "imports bk.broker"),  # the exception is cmd_broker's
    ("bk.cli.x", "from bk import broker\n", "imports bk.broker"),
    ("bk.ipc.client", "from bk.service import app\n", "imports bk.service, but bk.ipc may import only bk.core"),
    ("bk.ipc.client", "from ..service import app\n", "imports bk.service"),     # relative
    ("bk.ipc", "from bk import __version__\n", "imports bk.__version__, but bk.ipc"),
    ("bk.store.ledger", "def f():\n    from bk.service.app import Service\n", "imports bk.service.app"),
    ("bk.store.ledger", "from bk import clock\n", "imports bk.clock, but bk.store may import only bk.core"),
    ("bk.service.app", "from bk.broker import handlers\n", "imports bk.broker"),
    ("bk.service.app", "from bk.cli import render\n", "imports bk.cli"),
    ("bk.broker.handlers", "from bk.store.ledger import Store\n", "imports bk.store.ledger"),
    ("bk.broker.handlers", "from bk.gpu import open_backend\n", "imports bk.gpu"),
    ("bk.broker.server", "from bk.gpu import open_backend\n", "imports bk.gpu"),
    ("bk.admin.init", "from bk.broker.server import check_owned_dir\n", "imports bk.broker.server"),
    ("bk.gpu.sim", "from bk.store import fsutil\n", "imports bk.store"),
    ("bk.core.models", "import os\n", "pure core imports os"),
    ("bk.core.models", "def f():\n    from time import time\n", "pure core imports time"),
    ("bk.core.models", "from bk import clock\n", "imports bk.clock, but bk.core may import nothing else in bk"),
    ("bk.core.models", "from bk.store import config\n", "imports bk.store"),
    ("bk.export.prom", "import os\n", "pure bk.export imports os"),
    ("bk.export.html", "from bk.service import exports\n", "imports bk.service, but bk.export may import only bk.core"),
    ("bk.clock", "from bk.service import app\n", "imports bk.service"),
    ("bk", "from bk.cli.main import main\n", "imports bk.cli.main, but bk may import nothing else in bk"),
    ("bk.__main__", "from bk.service import open_app\n", "imports bk.service, but bk.__main__ may import only bk.cli"),
    ("bk.tui.app", "from bk.store.ledger import Store\n", "imports bk.store.ledger, but bk.tui"),
    ("bk.mcp.server", "from bk.ipc import client\n", "imports bk.ipc"),
    ("bk.cluster.client", "from bk.agent import tools\n", "imports bk.agent, but bk.cluster"),
    ("bk.service.status", "from bk.agent import tools\n", "imports bk.agent, but bk.service"),
    ("bk.monitor.daemon", "from bk.cli import render\n", "imports bk.cli"),
    ("bk.jobs.worker", "from bk.service import app\n", "imports bk.service"),
    ("bk.cluster.ssh", "from bk.gpu import open_backend\n", "imports bk.gpu"),
    ("bk.foo.bar", "from bk.core.errors import BkError\n", "bk.foo has no row in LAYERS"),
    ("bk.foo", "import json\n", "bk.foo has no row in LAYERS"),
    ("bk.service.app", "from bk.foo import bar\n", "imports bk.foo, but bk.service"),
    ("bk.cli.x", "def f():\n    import numpy\n", "imports third-party numpy"),
    # Imports written as strings.
    ("bk.service.agent", 'PROVIDERS = ["bk.cluster.agent:tools"]\n', "imports bk.cluster.agent, but bk.service"),
    ("bk.service.x", 'ROW = ("list", "bk.cli.render:safe")\n', "line 1: imports bk.cli.render"),
    ("bk.service.x", 'import importlib\nm = importlib.import_module("bk.broker.handlers")\n',
     "line 2: imports bk.broker.handlers"),
    ("bk.service.x", 'from importlib import import_module\nm = import_module("bk.tui.world")\n',
     "imports bk.tui.world"),
    ("bk.core.x", 'm = __import__("bk.store.ledger", fromlist=("Store",))\n', "imports bk.store.ledger"),
    ("bk.core.x", 'WHERE = "bk.store.ledger"\n', "imports bk.store.ledger"),
    ("bk.gpu.sim", "import pynvml\n", "imports third-party pynvml"),
])
def test_checker_catches_violations(mod, source, message):
    """The rules above must be able to fail: synthetic modules, one broken rule each."""
    assert message in _check(mod, source)


@pytest.mark.parametrize(("mod", "source"), [
    ("bk.cli.cmd_broker", "def run():\n    from bk.broker import server\n"),
    ("bk.cli.cmd_admin", "def run():\n    from bk.admin import init\n"),
    ("bk.broker.server", "from bk.store.fsutil import unsafe_ancestor\n"),
    ("bk.broker.server", "from bk import clock\nfrom bk.ipc import protocol\nfrom bk.service.app import Service\n"),
    ("bk.service.doctor", "from bk import __version__\nfrom bk.store.config import KEYS\n"),
    ("bk.cli.version", "from bk import __version__\nfrom bk.buildinfo import build_info\n"),
    ("bk.ipc.client", "from . import protocol\nfrom bk.core import errors\n"),
    ("bk.tui.app", "from bk.service import open_app\nfrom bk import clock\n"),
    ("bk.agent.surface", "from bk import service\ndef f():\n    from bk.agent import cluster\n"),
    ("bk.agent.cluster", "from bk.cluster.client import Cluster\n"),
    ("bk.gpu.nvml", "import pynvml\n"),
    ("bk.core.models", "from bk.core.record import dataclass\nimport re\n"),
    ("bk.service.x", 'ROW = "bk.service.booking:apply_book"\n'),
    ("bk.cli.app", 'MODULES = ("bk.cli.cmd_book", "bk.cli.cmd_list")\n'),
    ("bk.cli.x", '"""Rows live in bk.service.booking, see bk.store.ledger."""\nHINT = "run bk.x by hand"\n'),
    ("bk.core.x", 'DATA = "bk.resources"\n'),          # made by build.py: not a module of the tree
])
def test_checker_allows_the_matrix(mod, source):
    """...and must let through what the matrix and the exceptions allow."""
    assert _check(mod, source) == ""


def test_every_package_has_a_row():
    assert _on_disk_units() - set(LAYERS) == set(), "add a row to LAYERS and to docs/ARCHITECTURE.md"


def test_matrix_is_consistent():
    for unit, allowed in LAYERS.items():
        assert unit not in allowed, f"{unit} lists itself"
        assert allowed <= set(LAYERS), f"{unit} may import units with no row: {allowed - set(LAYERS)}"
    for mod, extra in EXCEPTIONS.items():
        assert (PKG.parent / (mod.replace(".", "/") + ".py")).exists(), f"exception for a missing module {mod}"
        assert set(extra) <= set(LAYERS) and unit_of(mod) not in extra
        assert not set(extra) & LAYERS[unit_of(mod)], f"{mod}: exception already allowed by its row"


def test_matrix_has_no_cycle():
    """Layers, not a web: with the exceptions counted, no unit can reach
    itself again."""
    edges = {u: set(a) for u, a in LAYERS.items()}
    for mod, extra in EXCEPTIONS.items():
        edges[unit_of(mod)] |= set(extra)

    def reach(start):
        seen, todo = set(), list(edges[start])
        while todo:
            u = todo.pop()
            if u not in seen:
                seen.add(u)
                todo.extend(edges[u])
        return seen

    assert [u for u in edges if u in reach(u)] == []


def _doc_unit(cell: str) -> str:
    """``bk/core/`` -> ``bk.core``, ``bk/clock.py`` -> ``bk.clock``,
    ``bk/__init__.py`` -> ``bk``, ``bk.cli.cmd_broker`` stays."""
    name = re.search(r"`([^`]+)`", cell).group(1).rstrip("/").removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


def _doc_tables() -> dict[str, list[list[str]]]:
    """The tables of the Layers section, by the first word of their header."""
    text = ARCHITECTURE.read_text()
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    tables: dict[str, list[list[str]]] = {}
    current = None
    for line in section.splitlines():
        if not line.startswith("|"):
            current = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if current is None:
            current = tables.setdefault(cells[0], [])
        elif not set(cells[0]) <= set("-: "):
            current.append(cells)
    return tables


def _doc_names(cell: str) -> set[str]:
    return {n for n in re.findall(r"`(bk[\w.]*)`", cell)}


def test_docs_table_is_the_matrix():
    """docs/ARCHITECTURE.md's Layers tables say exactly what LAYERS and
    EXCEPTIONS say."""
    tables = _doc_tables()
    rows = {_doc_unit(r[0]): _doc_names(r[2]) for r in tables["package"]}
    assert rows == {u: set(a) for u, a in LAYERS.items()}
    extra = {}
    for r in tables["module"]:
        extra.setdefault(_doc_unit(r[0]), set()).update(_doc_names(r[1]))
    assert extra == {m: set(e) for m, e in EXCEPTIONS.items()}


# --- front ends reach the service through its face ---------------------------------------
#
# The service layer has one face (``bk.service``: the operation table, open_app, the request and
# result types in its ``__all__``), the request builders for words a person typed, and the
# result types.  A front end imports nothing else of it, by name or by string, so that no rule
# lives in a front end that another front end copies (issue 24).

FACE = frozenset({"bk.service", "bk.service.builders", "bk.service.results"})
FRONT_ENDS = sorted([*PKG.glob("cli/cmd_*.py"), *PKG.glob("tui/*.py"), *PKG.glob("mcp/*.py"),
                     *PKG.glob("agent/*.py")])


def service_imports(source: str, mod: str, *, is_package: bool = False) -> list[tuple[str, int]]:
    """The modules of ``bk.service`` that ``source`` imports: ``from bk.service
    import X`` names module ``bk.service.X`` only when X is one."""
    out = []
    for node in ast.walk(ast.parse(source, filename=mod)):
        if isinstance(node, ast.Import):
            out.extend((a.name, node.lineno) for a in node.names if a.name.startswith("bk.service"))
        elif isinstance(node, ast.ImportFrom):
            name = _from_name(node, mod, is_package)
            if name == "bk":
                out.extend((f"bk.{a.name}", node.lineno) for a in node.names if a.name == "service")
            elif name == "bk.service":
                out.append((name, node.lineno))
                out.extend((f"bk.service.{a.name}", node.lineno) for a in node.names
                           if _on_disk(f"bk.service.{a.name}"))
            elif name.startswith("bk.service."):
                out.append((name, node.lineno))
    out.extend((n, line) for n, line in string_imports(source, mod) if n.startswith("bk.service"))
    return out


def face_problems(mod: str, source: str, *, is_package: bool = False) -> list[str]:
    return [f"line {line}: imports {name}, not the face of bk.service ({', '.join(sorted(FACE))})"
            for name, line in service_imports(source, mod, is_package=is_package) if name not in FACE]


@pytest.mark.parametrize("path", FRONT_ENDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_front_ends_import_only_the_face_of_the_service(path: Path):
    mod = module_name(path)
    problems = face_problems(mod, path.read_text(), is_package=path.name == "__init__.py")
    assert not problems, f"{mod}: " + "; ".join(problems)


@pytest.mark.parametrize(("source", "message"), [
    ("from bk.service.status import live_gpus\n", "imports bk.service.status"),
    ("from bk.service import jobs\n", "imports bk.service.jobs"),
    ("def f():\n    import bk.service.usage\n", "line 2: imports bk.service.usage"),
    ('ROW = "bk.service.agent:tools"\n', "imports bk.service.agent"),
    ('import importlib\nm = importlib.import_module("bk.service.presets")\n', "imports bk.service.presets"),
])
def test_the_face_check_catches_an_inner_import(source, message):
    assert message in "; ".join(face_problems("bk.cli.cmd_x", source))


def test_the_face_check_allows_the_face():
    source = ("from bk.service import ListRequest, open_app\nfrom bk.service import builders\n"
              "from bk import service\nfrom bk.service.results import BookResult\n")
    assert face_problems("bk.cli.cmd_x", source) == []


def test_the_face_names_what_front_ends_import():
    """Every name a front end imports from ``bk.service`` is in its
    ``__all__`` (or is ``builders``): the face is written down."""
    import bk.service as face

    for path in FRONT_ENDS:
        mod = module_name(path)
        for node in ast.walk(ast.parse(path.read_text(), filename=mod)):
            if isinstance(node, ast.ImportFrom) and _from_name(node, mod, False) == "bk.service":
                for a in node.names:
                    if a.name != "builders":
                        assert a.name in face.__all__, f"{mod}: {a.name} is not in bk.service.__all__"
                        assert getattr(face, a.name) is not None


def _map_of_init() -> dict[str, str]:
    """``bk/__init__.py``'s package map: unit -> its role, continuation lines joined."""
    found: dict[str, str] = {}
    last = None
    for line in (PKG / "__init__.py").read_text().splitlines():
        if not line.startswith("#   "):
            continue
        m = re.match(r"#   (bk/\S+)\s+(.*)", line)
        if m:
            last = m.group(1)
            found[last] = m.group(2).strip()
        elif last is not None:
            found[last] += " " + line[4:].strip()
    return found


def _roles_of_docs() -> dict[str, str]:
    """The layer table's units and the first words of each role (up to the first
    ``: `` or ``; ``), backticks dropped: what the package map must say."""
    roles = {}
    for line in ARCHITECTURE.read_text().splitlines():
        m = re.match(r"\| `(bk/[^`]*)` \| (.*?) \| [^|]* \|$", line)
        if m:
            role = m.group(2).replace("`", "")
            cuts = [i for i in (role.find(": "), role.find("; ")) if i >= 0]
            roles[m.group(1)] = role[:min(cuts)] if cuts else role
        elif roles:
            break
    return roles


def test_package_map_is_the_docs_table():
    on_disk = {"bk/" + (p.name + "/" if p.is_dir() else p.name) for p in PKG.iterdir()
               if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}
    docs, init = _roles_of_docs(), _map_of_init()
    assert on_disk - set(docs) == set(), "a unit of bk/ missing from docs/ARCHITECTURE.md's layer table"
    assert init == docs, "bk/__init__.py's package map differs from docs/ARCHITECTURE.md's layer table"
