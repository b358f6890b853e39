"""The README's first screen promises two commands to a newcomer; both must
work verbatim (the first is run here, the second is what CI runs)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


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
    test_cmd = blocks()[1].strip()
    ci = (ROOT / ".ci" / "run").read_text()
    for part in test_cmd.split("&&"):
        assert part.strip() in ci, part
