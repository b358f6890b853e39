"""``sudo bk admin init``: what it creates, and what it refuses to touch.

Runs as root (it chowns to the service account); skipped otherwise.  The
service account here is ``nobody``: init never creates accounts, so the
tests use one that exists, and check that /etc/passwd and /etc/group are
byte-for-byte unchanged.  Paths live in a root-owned temporary directory.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from bk.cli.app import run

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="needs root"), pytest.mark.root]
NOBODY = 65534


@pytest.fixture
def base():
    d = Path(tempfile.mkdtemp(prefix="bki_", dir="/tmp"))
    os.chmod(d, 0o755)
    before = _accounts()
    yield d
    # init never makes an account: none of the names it could make appeared.
    # (Only those: on a shared machine other work adds and removes users.)
    assert {n for n in _accounts() - before if n.split(":", 1)[1].startswith(("gpubk", "bk_no_such"))} == set()
    shutil.rmtree(d, ignore_errors=True)


def _accounts() -> set[str]:
    """Every user and group name, as ``user:NAME`` / ``group:NAME``."""
    return {f"{kind}:{line.split(':', 1)[0]}" for kind in ("user", "group")
            for line in Path(f"/etc/{'passwd' if kind == 'user' else 'group'}").read_text().splitlines() if line}


def paths(base: Path) -> dict:
    return {"cfg": base / "etc" / "gpubk" / "config.json", "data": base / "var" / "gpubk",
            "sock": base / "run" / "gpubk" / "broker.sock"}


def init(base: Path, capsys, *extra: str, env: dict | None = None, user: str | None = "nobody"):
    p = paths(base)
    argv = ["--json", "admin", "init", "--config-file", str(p["cfg"]), "--data-dir", str(p["data"]),
            "--socket", str(p["sock"]), *extra]
    if user:
        argv[3:3] = ["--service-user", user]
    if "--gpu-count" not in extra and "--no-gpu-count" not in extra:
        argv += ["--gpu-count", "4"]
    argv = [a for a in argv if a != "--no-gpu-count"]
    rc = run(argv, env=env or {"PATH": "/usr/bin:/bin", "HOME": str(base)})
    out = capsys.readouterr().out
    return rc, json.loads(out)


def owner_mode(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def test_dry_run_shows_the_plan_and_changes_nothing(base, capsys):
    rc, env = init(base, capsys, "--dry-run", "--gpu-count", "8")
    assert rc == 0 and env["data"]["status"] == "dry_run"
    actions = [(s["action"], s["path"]) for s in env["data"]["steps"]]
    p = paths(base)
    assert ("mkdir", str(p["data"])) in actions and ("write", str(p["cfg"])) in actions
    assert actions[-1] == ("write", str(p["cfg"]))            # the config comes last
    assert env["data"]["config"]["gpu_count"] == 8
    assert os.listdir(base) == []


def test_init_creates_owned_directories_and_a_trusted_config(base, capsys):
    rc, env = init(base, capsys, "--gpu-count", "4", "--slot-minutes", "10", "--max-shared-users", "3", "--yes")
    assert rc == 0 and env["data"]["status"] == "created", env
    p = paths(base)
    assert owner_mode(p["data"]) == (NOBODY, NOBODY, 0o755)
    assert owner_mode(p["sock"].parent) == (NOBODY, NOBODY, 0o755)
    assert owner_mode(p["cfg"]) == (0, 0, 0o644)
    assert owner_mode(p["cfg"].parent) == (0, 0, 0o755)
    doc = json.loads(p["cfg"].read_text())
    assert doc == {"access": "all", "data_dir": str(p["data"]), "socket": str(p["sock"]),
                   "service_uid": NOBODY, "service_gid": NOBODY, "gpu_count": 4, "slot_minutes": 10,
                   "max_shared_users": 3}
    from bk.store.config import load
    from bk.store.paths import locate

    settings = load(locate({"BK_CONFIG_FILE": str(p["cfg"]), "HOME": str(base)}))
    assert settings.data_dir == str(p["data"]) and settings["slot_minutes"] == 10
    # Again, identically: nothing to do.  An extra key the administrator added is kept.
    doc["admin_contact"] = "ops@example.org"
    p["cfg"].write_text(json.dumps(doc))
    rc, env = init(base, capsys, "--gpu-count", "4", "--slot-minutes", "10", "--max-shared-users", "3", "--yes")
    assert rc == 0 and env["data"]["status"] == "unchanged" and env["data"]["changed"] == []
    assert json.loads(p["cfg"].read_text())["admin_contact"] == "ops@example.org"


def test_a_different_existing_config_is_never_overwritten(base, capsys):
    assert init(base, capsys, "--yes")[0] == 0
    cfg = paths(base)["cfg"]
    before = cfg.read_bytes()
    rc, env = init(base, capsys, "--gpu-count", "2", "--yes")
    assert rc == 78 and env["error"]["code"] == "config"
    assert "gpu_count" in env["error"]["message"] and "not overwriting" in env["error"]["message"]
    assert cfg.read_bytes() == before


def test_foreign_non_empty_data_is_refused_and_nothing_is_written(base, capsys):
    p = paths(base)
    p["data"].mkdir(parents=True)
    (p["data"] / "ledger.json").write_text("{}")      # root's files, not the service account's
    rc, env = init(base, capsys, "--yes")
    assert rc == 78 and "refusing to take it over" in env["error"]["message"]
    assert not p["cfg"].exists() and not p["sock"].parent.exists()
    assert owner_mode(p["data"])[0] == 0


def test_an_empty_foreign_directory_is_adopted(base, capsys):
    p = paths(base)
    p["data"].mkdir(parents=True, mode=0o700)
    rc, env = init(base, capsys, "--yes")
    assert rc == 0
    assert ("adopt", str(p["data"])) in [(s["action"], s["path"]) for s in env["data"]["steps"]]
    assert owner_mode(p["data"]) == (NOBODY, NOBODY, 0o755)


def test_group_access_makes_group_directories(base, capsys):
    import grp

    group = grp.getgrgid(NOBODY).gr_name if NOBODY in [g.gr_gid for g in grp.getgrall()] else "nogroup"
    gid = grp.getgrnam(group).gr_gid
    rc, env = init(base, capsys, "--access", "group", "--group", group, "--yes")
    assert rc == 0, env
    p = paths(base)
    assert owner_mode(p["data"]) == (NOBODY, gid, 0o750)
    assert owner_mode(p["sock"].parent) == (NOBODY, gid, 0o2750)
    assert json.loads(p["cfg"].read_text())["group"] == group


@pytest.mark.parametrize("extra, code", [
    (["--service-user", "bk_no_such_user_x"], "invalid_input"),
    (["--service-user", "root"], "invalid_input"),
    (["--access", "group", "--group", "bk_no_such_group_x"], "invalid_input"),
    (["--access", "group"], "invalid_input"),
    (["--group", "root"], "invalid_input"),
    (["--slot-minutes", "7"], "invalid_input"),
    (["--data-dir", "relative/dir"], "invalid_input"),
])
def test_refusals_create_nothing(base, capsys, extra, code):
    rc, env = init(base, capsys, *extra, "--yes")
    assert rc == 2 and env["error"]["code"] == code, env
    assert os.listdir(base) == []


def test_the_service_account_defaults_to_the_sudo_invoker(base, capsys):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(base), "SUDO_USER": "nobody"}
    rc, out = init(base, capsys, "--dry-run", env=env, user=None)
    assert rc == 0 and out["data"]["service_uid"] == NOBODY
    rc, out = init(base, capsys, "--dry-run", env={"PATH": "/usr/bin"}, user=None)
    assert rc == 2 and "--service-user" in out["error"]["hint"]


def test_without_yes_and_without_a_terminal_it_asks_for_yes(base, capsys):
    rc, env = init(base, capsys)
    assert rc == 2 and "--yes" in env["error"]["message"]
    assert os.listdir(base) == []


def test_an_untrusted_config_location_is_refused_before_writing(base, capsys):
    (base / "etc").mkdir()
    os.chown(base / "etc", NOBODY, NOBODY)               # a user could swap etc/gpubk
    rc, env = init(base, capsys, "--yes")
    assert rc == 78 and env["error"]["code"] == "config", env
    assert not paths(base)["cfg"].exists()


def test_the_gpu_count_is_required_when_nothing_can_detect_it(base, capsys):
    """It is bound into the ledger at the first booking: never a guess."""
    rc, env = init(base, capsys, "--no-gpu-count", "--yes")
    assert rc == 2 and env["error"]["code"] == "invalid_input", env
    assert "--gpu-count is required" in env["error"]["message"]
    assert not paths(base)["cfg"].exists()
