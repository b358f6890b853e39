"""Which configuration files bk trusts (SPEC 2, man 5 gpubk-config).

The rule: the file and every directory above it are root-owned and not
writable by group or others; a sticky directory (like /tmp) is accepted
directly above a root-owned directory nobody else can write; no symbolic
links.  Security keys come only from such a file.  Most cases need root to
make root-owned files; the last tests run the built archive and check the
exit status 78 that scripts and systemd see.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers_build import copy_to

from bk.core.errors import ConfigError
from bk.store.config import check_trusted, load, parse_document
from bk.store.paths import Locations, locate

ROOT = Path(__file__).resolve().parents[1]
NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make root-owned files")


@pytest.fixture
def base():
    d = Path(tempfile.mkdtemp(prefix="bkc_", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def write(path: Path, doc: dict, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    os.chmod(path, mode)
    return path


def shared(path: Path) -> Locations:
    return Locations("shared", "/var/lib/gpubk", str(path), True, "/nonexistent")


GOOD = {"socket": "/run/gpubk/broker.sock", "service_uid": 999, "data_dir": "/srv/gpubk"}


# ------------------------------------------------------------- accepted

@root_only
def test_root_owned_file_below_sticky_tmp_is_trusted(base):
    cfg = write(base / "etc" / "config.json", GOOD)
    check_trusted(str(cfg))
    settings = load(shared(cfg))
    assert settings["service_uid"] == 999 and settings.data_dir == "/srv/gpubk"


@root_only
def test_read_only_file_and_non_root_group_are_fine(base):
    cfg = write(base / "etc" / "config.json", GOOD, 0o440)
    os.chown(cfg, 0, NOBODY)      # group may read; it may not write
    check_trusted(str(cfg))


# ------------------------------------------------------------- refused

@root_only
@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
def test_group_or_other_writable_file_is_refused(base, mode):
    cfg = write(base / "etc" / "config.json", GOOD, mode)
    with pytest.raises(ConfigError, match="writable by group or others"):
        check_trusted(str(cfg))


@root_only
def test_file_owned_by_another_user_is_refused(base):
    cfg = write(base / "etc" / "config.json", GOOD)
    os.chown(cfg, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match="not root"):
        check_trusted(str(cfg))


@root_only
def test_parent_owned_by_another_user_is_refused(base):
    cfg = write(base / "etc" / "config.json", GOOD)
    os.chown(cfg.parent, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match="owned by uid 65534"):
        check_trusted(str(cfg))


@root_only
@pytest.mark.parametrize("mode", [0o775, 0o757, 0o1777])
def test_writable_parent_is_refused_even_when_sticky(base, mode):
    cfg = write(base / "etc" / "config.json", GOOD)
    os.chmod(cfg.parent, mode)    # sticky does not help the file's own directory
    with pytest.raises(ConfigError, match="writable by group or others"):
        check_trusted(str(cfg))


@root_only
def test_sticky_directory_above_a_writable_one_is_refused(base):
    cfg = write(base / "a" / "etc" / "config.json", GOOD)
    os.chmod(base / "a", 0o777)   # /tmp (sticky) -> a (writable) -> etc: a can be swapped
    with pytest.raises(ConfigError, match="writable by group or others"):
        check_trusted(str(cfg))


@root_only
def test_symlinked_file_and_symlinked_directory_are_refused(base):
    real = write(base / "etc" / "config.json", GOOD)
    (base / "link.json").symlink_to(real)
    with pytest.raises(ConfigError, match="symbolic link"):
        check_trusted(str(base / "link.json"))
    (base / "etc2").symlink_to(base / "etc")
    with pytest.raises(ConfigError, match="symbolic link"):
        check_trusted(str(base / "etc2" / "config.json"))


def test_missing_file_is_a_config_error(base):
    with pytest.raises(ConfigError, match="does not exist"):
        check_trusted(str(base / "nope.json"))


def test_security_keys_only_from_the_trusted_file():
    for key in ("data_dir", "socket", "service_uid", "service_gid", "monitor_uid", "access", "group"):
        value = {"data_dir": "/x", "socket": "/x.sock", "access": "all", "group": "g"}.get(key, 5)
        with pytest.raises(ConfigError, match="only from the trusted system file"):
            parse_document({key: value}, "user.json", allow_security=False)
    assert parse_document({"slot_minutes": 10}, "user.json", allow_security=False) == {"slot_minutes": 10}


def test_environment_cannot_make_a_private_config_trusted(tmp_path):
    cfg = write(tmp_path / "c.json", {"socket": "/tmp/evil.sock"})
    loc = locate({"BK_DATA_DIR": str(tmp_path), "BK_CONFIG_FILE": str(cfg), "HOME": str(tmp_path)})
    assert loc.mode == "private" and not loc.config_is_system
    with pytest.raises(ConfigError, match="trusted system file"):
        load(loc)


# ------------------------------------------------------------- paths through links

@root_only
def test_dotdot_through_a_symlink_cannot_escape_the_checked_directories(base):
    user_dir = base / "u"
    (user_dir / "inner").mkdir(parents=True)
    write(user_dir / "cfg" / "config.json", {"socket": "/tmp/evil.sock"})
    os.chown(user_dir, NOBODY, NOBODY)
    os.chown(user_dir / "cfg", NOBODY, NOBODY)  # the real parent belongs to a user
    (base / "cfg").mkdir()                      # the lexical parent looks fine
    (base / "link").symlink_to(user_dir / "inner")
    with pytest.raises(ConfigError):
        check_trusted(str(base / "link" / ".." / "cfg" / "config.json"))


@root_only
def test_dotdot_to_a_missing_directory_is_a_config_error(base):
    user_dir = base / "u"
    (user_dir / "inner").mkdir(parents=True)
    write(user_dir / "cfg" / "config.json", {"socket": "/tmp/evil.sock"})
    (base / "link").symlink_to(user_dir / "inner")
    path = base / "link" / ".." / "cfg" / "config.json"
    assert not (base / "cfg").exists()          # the lexical parent does not exist at all
    # The kernel opens user_dir/cfg/config.json; the text names base/cfg.
    # Refused as a path through a link, never a crash (FileNotFoundError)
    # and never trusted.
    with pytest.raises(ConfigError, match="its path goes through a symbolic link"):
        check_trusted(str(path))
    with pytest.raises(ConfigError, match="symbolic link"):
        load(shared(path))


# ------------------------------------------------------------- through the archive

@pytest.fixture(scope="module")
def pyz():
    d = Path(tempfile.mkdtemp(prefix="bkp_", dir="/tmp"))
    os.chmod(d, 0o755)
    yield copy_to(d / "bk.pyz")
    shutil.rmtree(d, ignore_errors=True)


def run_bk(pyz: Path, cfg: Path, *args: str, as_nobody: bool = False) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "BK_CONFIG_FILE": str(cfg), "LANG": "C.UTF-8"}
    extra = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if as_nobody else {}
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    return subprocess.run([python, str(pyz), *args], capture_output=True, text=True, env=env,
                          timeout=60, cwd="/", **extra)


@pytest.mark.slow
@root_only
@pytest.mark.parametrize("case", ["group-writable", "non-root-parent", "symlink"])
def test_untrusted_configs_exit_78_through_the_archive(base, pyz, case):
    cfg = write(base / "etc" / "config.json", GOOD)
    if case == "group-writable":
        os.chmod(cfg, 0o664)
    elif case == "non-root-parent":
        os.chown(cfg.parent, NOBODY, NOBODY)
    else:
        (base / "link.json").symlink_to(cfg)
        cfg = base / "link.json"
    for args, nobody in ((["l"], True), (["--json", "st"], True), (["broker", "--check"], False)):
        p = run_bk(pyz, cfg, *args, as_nobody=nobody)
        assert p.returncode == 78, (case, args, p.stdout, p.stderr)
        text = p.stdout if "--json" in args else p.stderr
        assert "untrusted config" in text, (case, args, text)
