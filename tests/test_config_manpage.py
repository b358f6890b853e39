"""man/gpubk-config.5 documents every key of bk.store.config.KEYS, puts the
security keys under their own heading, and passes mandoc's linter."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bk.store.config import KEYS

PAGE = Path(__file__).resolve().parent.parent / "man" / "gpubk-config.5"


def entries(text: str) -> dict[str, str]:
    """Key name -> the subsection (``.SS``) whose ``.TP`` entry documents it."""
    out, section = {}, ""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(".SS"):
            section = line[4:].strip('"')
        elif line == ".TP" and i + 1 < len(lines):
            m = re.fullmatch(r"\.B ([a-z][a-z0-9_]*)", lines[i + 1])
            if m:
                out[m.group(1)] = section
    return out


def test_every_key_has_an_entry():
    documented = entries(PAGE.read_text())
    missing = sorted(set(KEYS) - set(documented))
    assert not missing, f"keys without an entry in {PAGE.name}: {missing}"
    unknown = sorted(k for k, sec in documented.items() if sec and k not in KEYS
                     and not sec.startswith(("ENVIRONMENT", "FILES")))
    assert not unknown, f"entries for keys bk does not have: {unknown}"


def test_security_keys_are_under_the_security_heading():
    documented = entries(PAGE.read_text())
    for name, key in KEYS.items():
        under_security = documented[name].startswith("Security")
        assert under_security == key.security, f"{name}: security={key.security}, page says {documented[name]!r}"


def test_defaults_are_stated():
    text = PAGE.read_text()
    for name, key in KEYS.items():
        if isinstance(key.default, (int, float)) and not isinstance(key.default, bool) and key.default:
            block = text.split(f".TP\n.B {name}\n", 1)[1].split(".TP", 1)[0]
            assert f"default {key.default:g}" in block.replace("\\", ""), name


@pytest.mark.skipif(not shutil.which("mandoc"), reason="mandoc is not installed")
def test_mandoc_lint_is_clean():
    p = subprocess.run(["mandoc", "-T", "lint", "-W", "warning", str(PAGE)], capture_output=True, text=True)
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), p.stdout + p.stderr
