"""The architecture, checked: imports are parsed with ``ast`` (also those
inside functions, since lazy imports are still dependencies)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "bk"

# The pure core may not touch the outside world.
IMPURE = {"os", "time", "socket", "fcntl", "subprocess", "curses", "select", "signal", "shutil",
          "threading", "multiprocessing", "pathlib", "tempfile", "io", "pwd", "grp", "random",
          "asyncio", "selectors", "mmap", "ctypes", "sqlite3", "urllib", "http", "zoneinfo"}
# Front ends reach storage and GPUs only through the service layer.
FRONT_ENDS = ("bk.cli", "bk.tui", "bk.mcp", "bk.broker.handlers")
BACKDOORS = ("bk.store", "bk.gpu")
OPTIONAL_THIRD_PARTY = {"pynvml": "bk.gpu.nvml"}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    mod = module_name(path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against this package
                base = mod.split(".")
                if path.name != "__init__.py":
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append(name)
            out.extend(f"{name}.{a.name}" for a in node.names)
    return out


SOURCES = sorted(PKG.rglob("*.py"))


def _is(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_layer_rules(path: Path):
    mod = module_name(path)
    problems = []
    for name in imports_of(path):
        top = name.split(".")[0]
        if _is(mod, "bk.core"):
            if top in IMPURE:
                problems.append(f"pure core imports {name}")
            if top == "bk" and not _is(name, "bk.core") and name != "bk":
                problems.append(f"pure core imports {name} (outside bk.core)")
        if any(_is(mod, fe) for fe in FRONT_ENDS):
            if any(_is(name, b) for b in BACKDOORS):
                problems.append(f"front end imports {name}; go through bk.service")
        if top not in sys.stdlib_module_names and top not in ("bk", "__future__"):
            allowed = OPTIONAL_THIRD_PARTY.get(top)
            if allowed != mod:
                problems.append(f"imports third-party {name} (only {OPTIONAL_THIRD_PARTY} allowed)")
    assert not problems, f"{mod}: " + "; ".join(problems)


def test_checker_catches_violations(tmp_path, monkeypatch):
    """The rules above must be able to fail: feed them a bad module."""
    bad_core = PKG / "core" / "_layer_probe_tmp.py"
    bad_core.write_text("import os\nfrom bk.store import config\n")
    try:
        with pytest.raises(AssertionError, match="pure core imports os"):
            test_layer_rules(bad_core)
    finally:
        bad_core.unlink()
    bad_cli = PKG / "cli" / "_layer_probe_tmp.py"
    bad_cli.write_text("def f():\n    from bk.store.ledger import Store\n    import numpy\n")
    try:
        with pytest.raises(AssertionError, match="front end imports bk.store"):
            test_layer_rules(bad_cli)
    finally:
        bad_cli.unlink()
