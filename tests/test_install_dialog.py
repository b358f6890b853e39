"""The installer's questions and messages, as a new administrator meets
them (issue 23, item 6): at a terminal (a real pty), through the built
archive, into a staging root.

- the administrator contact is asked, defaulting to the person who ran
  sudo (``SUDO_USER``, with the full name from the password database), and
  ``bk info`` then names that person rather than the service account;
- a missing service account is answered with the exact ``useradd`` line;
- no question shows its default twice (``[Y/n] [Y/n]``), and every default
  is what ``--yes`` takes: Enter all the way installs what ``--yes`` does;
- after the review, Enter applies the plan; declining says how to apply it
  later, and that line works;
- ``bk update`` with the installed archive says "already up to date";
- the plan names adopted files "kept after uninstall", and uninstall says
  ``rm -rf /opt/gpubk`` only when that directory is still there;
- the README's removal recipe, run as written (``--root`` added), leaves
  nothing behind.

Root only (a throwaway account for SUDO_USER).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from helpers_broker import Accounts, make_base, needs_root

from tests.helpers_install import BASE, PYTHON, bk, converse, install, staging_root, tree  # noqa: F401

pytestmark = [pytest.mark.root, needs_root]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ada():
    """A person who runs sudo: a real account with a full name."""
    base = make_base()
    accounts = Accounts(base)
    try:
        a = accounts.user()
        subprocess.run(["usermod", "-c", "Ada Lovelace,Room 4.12", a.name], check=True, capture_output=True)
        yield a
    finally:
        accounts.cleanup()
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def terminal_env(ada) -> dict:
    return {"PATH": "/usr/bin:/bin", "HOME": "/root", "TERM": "dumb", "LANG": "C.UTF-8", "SUDO_USER": ada.name}


def test_enter_all_the_way_installs_what_yes_installs(pyz, root, ada, tmp_path):
    argv = [PYTHON, str(pyz), "admin", "install", "--root", str(root), "--no-start", *BASE]
    answers = [("Service account", b"\n"), ("Administrator contact", b"\n"), ("How many GPUs", b"\n"),
               ("Who may book", b"\n"),
               ("Slice length", b"\n"), ("Share slots", b"\n"), ("Data directory", b"\n"),
               ("The bk command", b"\n"), ("Show notices at login", b"\n"), ("Apply this plan?", b"\n")]
    rc, text = converse(argv, terminal_env(ada), answers)
    assert rc == 0, text[-3000:]
    contact = f"Ada Lovelace ({ada.name})"
    assert f"Administrator contact shown by bk info [{contact}]" in text
    assert "Show notices at login [y/N]" in text
    assert not re.search(r"\[[^\]]*\] \[", text), "a default shown twice"
    assert "Apply this plan? [Y/n]" in text and "bk admin install will:" in text
    assert "How many GPUs to schedule [4]" in text       # --gpu-count given: its value is the default
    cfg = json.loads((root / "etc/gpubk/config.json").read_text())
    assert cfg["admin_contact"] == contact
    # bk info names the person, not the service account.
    p = subprocess.run([str(root / "opt/gpubk/bin/bk"), "--json", "info"], capture_output=True, text=True,
                       timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": "/root"})
    assert json.loads(p.stdout)["data"]["admin"] == {"contact": contact, "source": "config", "account": None}

    # The same flags with --yes (the same SUDO_USER) install the same.
    other = tmp_path / "yes-root"
    other.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    p = subprocess.run([PYTHON, str(pyz), "--json", "admin", "install", "--root", str(other), "--yes",
                        "--no-start", *BASE], capture_output=True, text=True, timeout=300,
                       env={"PATH": "/usr/bin:/bin", "HOME": "/root", "SUDO_USER": ada.name})
    assert p.returncode == 0, p.stdout + p.stderr
    yes_cfg = json.loads((other / "etc/gpubk/config.json").read_text())
    assert {k: v for k, v in yes_cfg.items() if k not in ("data_dir", "socket")} == \
        {k: v for k, v in cfg.items() if k not in ("data_dir", "socket")}
    manifest = [e for e in tree(root) if "install-backup" not in e]
    yes_manifest = [e for e in tree(other) if "install-backup" not in e]
    assert sorted(manifest) == sorted(yes_manifest)          # the same files: no login hook in either


def test_declining_says_how_to_apply_and_that_line_works(pyz, root, ada):
    before = tree(root)
    argv = [PYTHON, str(pyz), "admin", "install", "--root", str(root), "--no-start", "--python", PYTHON]
    answers = [("Service account", b"nobody-" + ada.name.encode() + b"\n"),    # no such account
               ("useradd", b"nobody\n"), ("Administrator contact", b"Grace, room 1\n"),
               ("How many GPUs", b"4\n"), ("Who may book", b"\n"), ("Slice length", b"10\n"),
               ("Share slots", b"\n"), ("Data directory", b"\n"), ("The bk command", b"\n"),
               ("Show notices at login", b"y\n"), ("Apply this plan?", b"n\n")]
    rc, text = converse(argv, terminal_env(ada), answers)
    assert rc == 1, text[-3000:]
    assert (f"create it first: sudo useradd --system --no-create-home --shell /usr/sbin/nologin "
            f"nobody-{ada.name}") in text
    assert tree(root) == before
    m = re.search(r"nothing changed; to apply this plan later: (.*)", text)
    assert m, text[-2000:]
    words = shlex.split(m.group(1))
    assert words[:5] == ["sudo", "python3", str(pyz), "admin", "install"] and "--yes" in words, words
    p = subprocess.run([PYTHON, *words[2:3], "--json", *words[3:]], capture_output=True, text=True, timeout=300,
                       env={"PATH": "/usr/bin:/bin", "HOME": "/root"})
    assert p.returncode == 0, p.stdout + p.stderr
    cfg = json.loads((root / "etc/gpubk/config.json").read_text())
    assert cfg["admin_contact"] == "Grace, room 1" and cfg["slot_minutes"] == 10 and cfg["gpu_count"] == 4
    assert (root / "etc/profile.d/gpubk.sh").exists()


def test_the_exact_useradd_line_without_a_terminal(pyz, root):
    p = bk(pyz, "--json", "admin", "install", "--root", str(root), "--yes", "--dry-run", "--service-user",
           "bk-no-such-account", "--gpu-count", "2", "--python", PYTHON, check=False)
    err = json.loads(p.stdout)["error"]
    assert p.returncode == 2
    assert err["hint"] == ("create it first: sudo useradd --system --no-create-home --shell /usr/sbin/nologin "
                           "bk-no-such-account")


def test_update_with_the_installed_archive_is_already_up_to_date(pyz, root):
    install(pyz, root)
    before = tree(root)
    p = bk(pyz, "update", "--root", str(root))
    assert "already up to date: bk" in p.stdout and "would:" not in p.stdout, p.stdout
    p = bk(pyz, "--json", "update", "--apply", "--yes", "--root", str(root))
    data = json.loads(p.stdout)["data"]
    assert data["status"] == "up_to_date" and data["up_to_date"] is True and data["steps"] == []
    assert tree(root) == before


def test_adopted_files_are_named_kept_and_the_rm_hint_only_when_needed(pyz, root):
    (root / "usr/local/bin").mkdir(parents=True)
    os.symlink(f"{root}/opt/gpubk/bin/bk", root / "usr/local/bin/bk")
    p = bk(pyz, "admin", "install", "--root", str(root), "--dry-run", *BASE)
    line = next(ln for ln in p.stdout.splitlines() if f"{root}/usr/local/bin/bk " in ln)
    assert "kept after uninstall" in line, line
    install(pyz, root)
    p = bk(pyz, "admin", "uninstall", "--root", str(root), "--yes", "--purge-data")
    assert "rm -rf" not in p.stdout and not (root / "opt/gpubk").exists(), p.stdout
    assert os.readlink(root / "usr/local/bin/bk") == f"{root}/opt/gpubk/bin/bk"    # kept, as the plan said
    # /opt/gpubk made by the administrator, with a file of theirs: it stays, and the hint says so.
    (root / "opt/gpubk").mkdir(parents=True)
    (root / "opt/gpubk/NOTES").write_text("mine\n")
    install(pyz, root)
    p = bk(pyz, "admin", "uninstall", "--root", str(root), "--yes", "--purge-data")
    assert f"sudo rm -rf {root}/opt/gpubk" in p.stdout, p.stdout
    assert (root / "opt/gpubk/NOTES").exists()


def test_the_readme_removal_recipe_leaves_nothing(pyz, root):
    """The README's lines as written: the systemctl line is for where systemd
    runs (not here); every bk line gets --root."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index("To remove it"):]
    recipe = re.search(r"```sh\n(.*?)```", block, re.S).group(1).strip().splitlines()
    assert recipe[0].startswith("sudo systemctl disable --now")
    assert not any("rm -rf" in ln or "services uninstall" in ln for ln in recipe), recipe
    install(pyz, root, "--login-hook")
    for line in recipe[1:]:
        words = shlex.split(line.split("#")[0])
        assert words[0] == "sudo" and words[1] == "/opt/gpubk/bin/bk", line
        p = subprocess.run([str(root / "opt/gpubk/bin/bk"), *words[2:], "--root", str(root)], capture_output=True,
                           text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": "/"})
        assert p.returncode == 0, p.stdout + p.stderr
    assert os.listdir(root) == []
