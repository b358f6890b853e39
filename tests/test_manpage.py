"""bk(1) and the shell completions are generated from the argparse tree
(bk/cli/manpage.py, written by tools/gen_docs.py): the committed files must
be what the tree generates, mention every command, alias and option, and
pass mandoc's linter and bash's parser."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from bk.cli import manpage
from bk.core.errors import EXIT_TABLE

ROOT = Path(__file__).resolve().parent.parent
REGENERATE = "run: python3 tools/gen_docs.py (and commit man/bk.1 and install/completion/)"


@pytest.fixture(scope="module")
def generated():
    return manpage.generate_all()


@pytest.fixture(scope="module")
def commands():
    return manpage.flatten(manpage.walk(manpage._parser()))


@pytest.mark.parametrize("rel", sorted(manpage.GENERATED))
def test_committed_file_is_generated(generated, rel):
    path = ROOT / rel
    assert path.exists(), f"{rel} is missing; {REGENERATE}"
    assert path.read_text(encoding="utf-8") == generated[rel], \
        f"{rel} is out of date with the commands' help texts; {REGENERATE}"


def test_every_command_alias_and_option_is_in_the_man_page(generated, commands):
    page = generated["man/bk.1"]
    missing = []
    for c in commands:
        for name in [" ".join(c.path), *c.aliases]:
            if manpage.esc(name) not in page:
                missing.append(f"command {name}")
        for o in c.options:
            for flag in o.flags:
                if f"\\fB{manpage.esc(flag)}\\fR" not in page:
                    missing.append(f"{' '.join(c.path)} {flag}")
    for flag in ("-h", "--help", "--version", "--json"):
        if f"\\fB{manpage.esc(flag)}\\fR" not in page:
            missing.append(flag)
    assert not missing, f"undocumented: {missing}"
    assert len(commands) > 10


def test_sections_and_exit_table(generated):
    page = generated["man/bk.1"]
    for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "COMMANDS", "ENVIRONMENT", "FILES",
                    "EXIT STATUS", "JSON OUTPUT", "EXAMPLES", "SEE ALSO"):
        assert f".SH {section}\n" in page
    for var in ("BK_DATA_DIR", "BK_CONFIG_FILE", "BK_GPU_COUNT", "BK_GPU_SIM_FILE", "BK_NOW", "BK_DEBUG",
                "NO_COLOR", "TERM", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME"):
        assert f".B {var}\n" in page
    status = page.split(".SH EXIT STATUS", 1)[1].split(".SH ", 1)[0]
    for code, _ in EXIT_TABLE:
        assert f".B {code}\n" in status


def test_generation_does_not_depend_on_the_terminal(monkeypatch, generated):
    monkeypatch.setenv("COLUMNS", "37")
    assert manpage.generate_all() == generated


def test_mandoc_lint_is_clean():
    if shutil.which("mandoc") is None:
        pytest.skip("mandoc is not installed")
    proc = subprocess.run(["mandoc", "-T", "lint", "-W", "warning", str(ROOT / "man" / "bk.1")],
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout + proc.stderr == "", proc.stdout + proc.stderr


def test_completions_name_every_command(generated, commands):
    for rel in ("install/completion/bk.bash", "install/completion/_bk"):
        text = generated[rel]
        for c in commands:
            for name in [c.path[-1], *c.aliases]:
                assert name in text, f"{rel} lacks {name}"
    assert generated["install/completion/_bk"].startswith("#compdef bk\n")


def test_bash_accepts_the_bash_completion():
    proc = subprocess.run(["bash", "-n", str(ROOT / "install" / "completion" / "bk.bash")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_bash_completion_completes(tmp_path):
    script = f"""
source {ROOT / 'install' / 'completion' / 'bk.bash'}
COMP_WORDS=(bk pre); COMP_CWORD=1; _bk; echo "${{COMPREPLY[*]}}"
COMP_WORDS=(bk p sa); COMP_CWORD=2; _bk; echo "${{COMPREPLY[*]}}"
COMP_WORDS=(bk e 1 --mo); COMP_CWORD=3; _bk; echo "${{COMPREPLY[*]}}"
COMP_WORDS=(bk 2 1h --dr); COMP_CWORD=3; _bk; echo "${{COMPREPLY[*]}}"
"""
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["preset", "save", "--mode", "--dry-run"]


def test_zsh_accepts_the_zsh_completion():
    if shutil.which("zsh") is None:
        pytest.skip("zsh is not installed")
    proc = subprocess.run(["zsh", "-n", str(ROOT / "install" / "completion" / "_bk")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_examples_use_only_commands_that_exist():
    """The EXAMPLES section must not advertise commands a later release adds."""
    import re

    from bk.cli.app import COMMAND_WORDS

    text = (ROOT / "man" / "bk.1").read_text()
    examples = text.split(".SH EXAMPLES", 1)[1].split(".SH ", 1)[0]
    words = {w for ws in COMMAND_WORDS.values() for w in ws}
    for m in re.finditer(r"(?:^|&& |\s)bk (\S+)", examples, re.M):
        word = m.group(1)
        assert word in words or word.isdigit() or word.startswith("#") or word.startswith("\\-"), word
