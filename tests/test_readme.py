"""The README's first screen promises two commands to a newcomer; both must
work verbatim (the first is run here, the second is what CI runs, in a fresh
virtual environment from /usr/bin/python3), and its "Running the tests"
section must stay true: the fast lane, and the packages CI installs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


@pytest.mark.slow
def test_try_it_command_books_on_a_simulated_server(tmp_path):
    try_it = blocks()[0].strip()
    assert "build.py" in try_it and "BK_GPU_COUNT" in try_it
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    p = subprocess.run(["bash", "-c", try_it], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"booked 1 GPU \(\d\) shared", p.stdout), p.stdout
    assert re.search(r"^1\s+[0-9a-f]{8}\s", p.stdout, re.M), p.stdout    # bk l lists it as number 1


def test_ci_runs_the_test_command_the_readme_gives():
    venv_line, *commands = blocks()[1].strip().splitlines()
    assert venv_line == "python3 -m venv .venv && . .venv/bin/activate"
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    # CI makes its environment the way the README does, from Debian's own
    # interpreter rather than whatever python3 comes first on CI's PATH...
    assert "SYSTEM_PYTHON=/usr/bin/python3" in ci
    made = ci.index('"$SYSTEM_PYTHON" -m venv "$envdir/venv"')
    activated = ci.index('. "$envdir/venv/bin/activate"')
    # ... then runs the README's commands in it, each a line of its own, in order.
    at = [ci.index(part.strip()) for line in commands for part in line.split("&&")]
    assert made < activated < at[0] and at == sorted(at), at


@pytest.mark.slow
def test_the_readme_venv_line_makes_an_environment_from_the_system_python(tmp_path):
    venv_line = blocks()[1].strip().splitlines()[0]
    # A newcomer's shell on Debian: python3 is /usr/bin/python3.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    p = subprocess.run(["bash", "-c", venv_line + ' && python3 -c "import pip, sys; print(sys.prefix, sys.base_prefix)"'],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    prefix, base = p.stdout.split()
    assert prefix == str(tmp_path / ".venv") and base == "/usr"


def section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"## {title}\n")
    return text[start:text.index("\n## ", start + 1)]


def test_the_readme_gives_the_fast_lane_and_the_full_run_with_their_times():
    text = section("Running the tests")
    lanes = {m.group(1): m.group(2) for m in
             re.finditer(r'^(python3 -m pytest tests -n auto(?: -m "not slow")?)\s+#.*?about (\d+) min', text, re.M)}
    full, fast = "python3 -m pytest tests -n auto", 'python3 -m pytest tests -n auto -m "not slow"'
    assert set(lanes) == {full, fast}, lanes
    assert int(lanes[fast]) < int(lanes[full])
    assert "slow:" in (ROOT / "pyproject.toml").read_text()          # the marker is declared
    assert "](tests/README.md)" in text and (ROOT / "tests" / "README.md").exists()


def test_the_readme_names_the_packages_ci_installs():
    text = section("Running the tests")
    apt = re.search(r"^sudo apt install (.*)$", text, re.M)
    assert apt, "no apt line"
    ci = (ROOT / ".ci" / "run").read_text()
    installed = set(re.findall(r"need\+=\(([\w.-]+)\)", ci)) - {"python3"}
    assert set(apt.group(1).split()) == installed
    for pkg in ("openssh-server", "mandoc", "tmux", "zsh", "python3-venv"):
        assert pkg in installed


def test_tests_readme_names_every_test_file_and_every_package():
    text = (ROOT / "tests" / "README.md").read_text()
    named = set(re.findall(r"`(test_\w+\.py)`", text))
    files = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    assert not files - named, f"tests/README.md does not say what these test (add them to its table): {sorted(files - named)}"
    assert not named - files, f"tests/README.md names files that do not exist: {sorted(named - files)}"
    packages = {f"bk/{p.name}/" for p in (ROOT / "bk").iterdir() if (p / "__init__.py").exists()}
    rows = set(re.findall(r"`(bk/\w+/)`", text))
    assert not packages - rows, f"tests/README.md has no row for {sorted(packages - rows)}"
