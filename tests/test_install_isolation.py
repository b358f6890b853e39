"""No code from the administrator's working directory or environment runs
as root (issue 22, item 1).

The attack: another user fills a directory the administrator works in
(``/tmp``, where the guide has ``bk.pyz`` copied) with an ``importlib/``
package, a ``marshal.py``, a ``sitecustomize.py``, a ``usercustomize.py``,
a ``.pth`` file and programs named like the ones an installer runs
(``systemctl``, ``useradd``, ``nvidia-smi``, ``python3``, ``env``, ...);
the administrator's environment names more such directories
(``PYTHONPATH``, ``PYTHONSTARTUP``, ``PYTHONUSERBASE``, a ``HOME`` with a
user site, a ``PATH`` that starts there).  Every planted file writes a
marker when it runs.  Then every admin command runs as root from that
directory through the built ``bk.pyz``, into a staging root: install
(``--dry-run``, apply, reconcile), the login hook and services actions,
``bk update --apply`` (an upgrade, and a broken archive rolled back), and
uninstall; and the installer from an installed package (the pip path).
No marker may appear.

The parent interpreter itself runs with ``-I``: a Python that honours
``PYTHONPATH`` is the administrator's own choice, and bk cannot protect
a process that imported the planted ``sitecustomize`` before bk started.
What bk answers for is every process it starts: the variables stay in its
``os.environ``, where a careless child would inherit them.

Root only; the planted directory belongs to a throwaway account.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers_broker import Accounts, make_base, needs_root

from tests.helpers_install import BASE, PYTHON, tree, variant

pytestmark = [pytest.mark.root, needs_root]

PROGRAMS = ("systemctl", "useradd", "groupadd", "mandb", "install", "nvidia-smi", "python3", "env", "sh",
            "setpriv", "sudo")


def _lib(prefix: Path) -> Path:
    """``PREFIX/lib/pythonX.Y``, as the planted interpreter's would be."""
    ver = subprocess.run([PYTHON, "-I", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return prefix / "lib" / f"python{ver}"


def _plant(directory: Path, marks: Path, tag: str, *, python: bool = True, programs: bool = False) -> None:
    """Files in ``directory`` that write ``marks/TAG-NAME`` if anything runs them."""
    directory.mkdir(parents=True, exist_ok=True)

    def code(name: str) -> str:
        return f"open({str(marks / f'{tag}-{name}')!r}, 'w').write('ran')\n"
    if python:
        for rel in ("importlib/__init__.py", "encodings/__init__.py", "marshal.py", "sitecustomize.py",
                    "usercustomize.py", "startup.py", "site.py", "zipimport.py", "runpy.py"):
            path = directory / rel
            path.parent.mkdir(exist_ok=True)
            path.write_text(code(rel.replace("/", "_")))
        (directory / "zz-planted.pth").write_text("import os; " + code("pth").strip() + "\n")
    if programs:
        for name in PROGRAMS:
            path = directory / name
            path.write_text(f"#!/bin/sh\necho ran > {marks / f'{tag}-{name}'}\nexit 0\n")
            os.chmod(path, 0o755)


@pytest.fixture(scope="module")
def attack(pyz):
    """A directory of another user's making, with bk.pyz copied in by root,
    and the environment that points into it."""
    base = make_base()
    accounts = Accounts(base)
    try:
        mallory = accounts.user()
        marks = base / "marks"
        marks.mkdir(mode=0o1777)
        os.chmod(marks, 0o1777)
        work = base / "shared"                   # the administrator's working directory
        _plant(work, marks, "cwd")
        _plant(work / "bin", marks, "path", python=False, programs=True)
        pythonpath = base / "pythonpath"
        _plant(pythonpath, marks, "pythonpath")
        home = base / "adminhome"
        _plant(_lib(home / ".local") / "site-packages", marks, "usersite")
        pythonhome = base / "pythonhome"            # a standard library of mallory's
        _plant(_lib(pythonhome), marks, "pythonhome")
        for d in (work, pythonpath, home, pythonhome):
            subprocess.run(["chown", "-R", f"{mallory.uid}:{mallory.gid}", str(d)], check=True)
        shutil.copy(pyz, work / "bk.pyz")          # root's copy, in mallory's directory
        os.chmod(work / "bk.pyz", 0o644)
        env = {"PATH": f"{work / 'bin'}:{work}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
               "PYTHONPATH": f"{pythonpath}:{work}", "PYTHONSTARTUP": str(pythonpath / "startup.py"),
               "PYTHONUSERBASE": str(home / ".local"), "PYTHONHOME": str(pythonhome),
               "SUDO_USER": mallory.name}
        root = base / "root"
        root.mkdir(mode=0o755)
        yield {"base": base, "work": work, "marks": marks, "env": env, "root": root, "pyz": work / "bk.pyz"}
    finally:
        accounts.cleanup()
        shutil.rmtree(base, ignore_errors=True)


def ran(attack) -> list[str]:
    return sorted(os.listdir(attack["marks"]))


def as_root(attack, *args: str) -> tuple[int, dict]:
    """``python3 -I bk.pyz ARGS`` as root, from the planted directory, in the planted environment."""
    p = subprocess.run([PYTHON, "-I", "bk.pyz", "--json", *args], capture_output=True, text=True, timeout=300,
                       cwd=attack["work"], env=attack["env"], stdin=subprocess.DEVNULL)
    try:
        return p.returncode, json.loads(p.stdout)
    except ValueError:
        raise AssertionError(f"bk {' '.join(args)}: rc {p.returncode}: {p.stdout!r} {p.stderr!r}") from None


def test_every_admin_command_leaves_the_planted_code_alone(attack, tmp_path):
    root = str(attack["root"])
    os.chmod(tmp_path, 0o755)
    new = variant(attack["pyz"], tmp_path / "new.pyz", version="9.8.7")
    broken = variant(attack["pyz"], tmp_path / "broken.pyz", version="9.8.8", broken=True)
    steps = [
        (("admin", "install", "--root", root, "--dry-run", *BASE), 0, "dry_run"),
        (("admin", "install", "--root", root, "--yes", "--no-start", *BASE), 0, "installed"),
        (("admin", "install", "--root", root, "--yes", "--no-start"), 0, "unchanged"),
        (("admin", "login-hook", "install", "--root", root), 0, None),
        (("admin", "services", "status", "--root", root), 0, "stopped"),
        (("admin", "services", "install", "--root", root, "--yes", "--no-start"), 0, "unchanged"),
        (("update", str(new), "--root", root), 0, "plan"),
        (("update", str(new), "--apply", "--yes", "--root", root), 0, "updated"),
        (("update", str(broken), "--apply", "--yes", "--root", root), 1, "rolled_back"),
        (("admin", "uninstall", "--root", root, "--yes", "--purge-data"), 0, "removed"),
    ]
    for args, rc, status in steps:
        got, env = as_root(attack, *args)
        assert ran(attack) == [], f"bk {' '.join(args[:3])}: planted code ran as root (rc {got}: {env})"
        assert got == rc, (args, env)
        if status is not None:
            assert env["data"]["status"] == status, (args, env["data"])
    assert os.listdir(root) == []


def test_the_installer_from_a_package_leaves_the_planted_code_alone(attack, monkeypatch, capsys):
    """The pip path: no archive runs the installer, so it builds one from the
    package, compiling in a child; here in this very process, its cwd and
    os.environ the planted ones."""
    from bk.cli.app import run

    root = attack["base"] / "pip-root"
    root.mkdir(mode=0o755)
    monkeypatch.chdir(attack["work"])
    for key, value in attack["env"].items():
        monkeypatch.setenv(key, value)
    rc = run(["--json", "admin", "install", "--root", str(root), "--yes", "--no-start", *BASE],
             env=dict(attack["env"]))
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["data"]["archive_from"] == "the installed bk package", out
    rc = run(["--json", "admin", "uninstall", "--root", str(root), "--yes", "--purge-data"], env=dict(attack["env"]))
    assert rc == 0, capsys.readouterr().out
    assert ran(attack) == []


def test_systemctl_is_found_on_roots_path_not_the_callers(attack, monkeypatch):
    """Where systemd runs, install, update and uninstall run systemctl;
    none of that runs here (no systemd), so the one place that runs it is
    called directly, with the caller's PATH planted first, with a harmless
    command."""
    from bk.admin import rootenv, services

    monkeypatch.setenv("PATH", attack["env"]["PATH"])
    monkeypatch.setenv("HOME", attack["env"]["HOME"])
    monkeypatch.chdir(attack["work"])
    out = services.run([["systemctl", "--version"]])
    services.active_units()
    assert ran(attack) == [], out
    assert str(attack["work"]) not in rootenv.trusted_path()
    for d in rootenv.trusted_path().split(":"):
        st = os.stat(d)
        assert st.st_uid == 0 and not st.st_mode & 0o022, d


def test_an_interpreter_another_user_can_replace_is_refused(attack):
    """``--python`` naming a link in the planted directory (to a real
    interpreter): the launcher, the units and the compiler as root would
    all run whatever that user puts there next."""
    link = attack["work"] / "bin" / "python3-link"
    os.symlink(PYTHON, link)
    root = attack["base"] / "py-root"
    root.mkdir(mode=0o755)
    before = tree(root)
    args = [a if a != PYTHON else str(link) for a in BASE]
    rc, env = as_root(attack, "admin", "install", "--root", str(root), "--yes", "--no-start", *args)
    assert rc == 2 and "someone other than root" in env["error"]["message"], env
    assert tree(root) == before
    assert ran(attack) == []


def test_an_update_does_not_run_the_callers_user_site_or_path(attack, tmp_path):
    """From a directory of root's, only HOME and PATH the caller's (the
    parent with ``-I`` again, so that its own user site stays out): the
    update's verification runs ``bk doctor`` through the launcher as root,
    which once took HOME (and with it the user site of that home) and PATH
    from the caller."""
    root = attack["base"] / "update-root"
    root.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    new = variant(attack["pyz"], tmp_path / "new.pyz", version="9.8.9")
    env = {k: attack["env"][k] for k in ("PATH", "HOME", "LANG", "SUDO_USER")}

    def bk(*args: str) -> tuple[int, dict]:
        p = subprocess.run([PYTHON, "-I", str(attack["pyz"]), "--json", *args], capture_output=True, text=True,
                           timeout=300, cwd=attack["base"], env=env, stdin=subprocess.DEVNULL)
        assert ran(attack) == [], f"bk {' '.join(args[:2])}: planted code ran as root: {p.stdout}"
        return p.returncode, json.loads(p.stdout)
    rc, out = bk("admin", "install", "--root", str(root), "--yes", "--no-start", *BASE)
    assert rc == 0, out
    rc, out = bk("update", str(new), "--apply", "--yes", "--root", str(root))
    assert rc == 0 and out["data"]["status"] == "updated", out
    rc, out = bk("admin", "uninstall", "--root", str(root), "--yes", "--purge-data")
    assert rc == 0, out
