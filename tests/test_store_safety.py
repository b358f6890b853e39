"""Managed paths: links, FIFOs, devices, sockets, wrong owners and modes are
refused (never chmod-ed or followed); new files get exact modes."""

from __future__ import annotations

import os
import socket
import stat
import uuid

import pytest

from bk.core.errors import EXIT_CONFIG, EXIT_WRONG_ACCOUNT, ConfigError, WrongAccount
from bk.core.models import Mutation, Policy, Reservation
from bk.store.ledger import Store

T = 1_780_000_000
POLICY = Policy(gpu_count=2).bound()
ROOT = os.geteuid() == 0


def add_old_and_new(state):
    n = len(state.reservations)      # every call books later slots: never over capacity
    for start in (T - 3 * 86400 - n * 600, T + n * 600):
        state.reservations.append(Reservation(str(uuid.uuid4()), 1, "u", "shared", (0,), 1,
                                              start, start + 600, start))
    return Mutation(True)


def commit(store):
    return store.transact(add_old_and_new, policy=POLICY, actor_uid=1, actor="u")


def populated(tmp_path, **kw) -> Store:
    store = Store(str(tmp_path / "data"), clock=lambda: T, min_free_bytes=0, **kw)
    commit(store)
    commit(store)      # the second commit archives the old booking: every path exists
    return store


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def umask():
    old = os.umask(0)
    yield os.umask
    os.umask(old)


def refused(store, match, *, read=True):
    """Both the read path (where it applies) and a write refuse, exit 78."""
    calls = ([store.read] if read else []) + [lambda: commit(store)]
    for call in calls:
        with pytest.raises(ConfigError, match=match) as e:
            call()
        assert e.value.exit_code == EXIT_CONFIG and e.value.hint


@pytest.mark.parametrize("name", ["ledger.json", "audit.jsonl", "ledger.lock", "backups", "archive"])
def test_symlinks_are_refused(tmp_path, name):
    store = populated(tmp_path)
    path = os.path.join(store.paths.data_dir, name)
    os.rename(path, str(tmp_path / "real"))
    os.symlink(str(tmp_path / "real"), path)
    refused(store, "symbolic link", read=name == "ledger.json")
    assert os.path.islink(path)


def test_symlinked_data_dir_is_refused(tmp_path):
    store = populated(tmp_path)
    os.symlink(store.paths.data_dir, str(tmp_path / "link"))
    refused(Store(str(tmp_path / "link"), clock=lambda: T), "symbolic link")


@pytest.mark.parametrize("name", ["ledger.json", "audit.jsonl"])
def test_hard_links_are_refused(tmp_path, name):
    store = populated(tmp_path)
    path = os.path.join(store.paths.data_dir, name)
    os.link(path, str(tmp_path / "second-name"))
    refused(store, "2 hard links", read=name == "ledger.json")


def test_a_lock_file_with_a_second_name_is_replaced_not_refused(tmp_path):
    """A lock file holds no data, and refusing it would let whoever made the
    second name stop every write; it is replaced by a fresh 0600 file
    (bk.store.lock), and the other name keeps the old inode."""
    store = populated(tmp_path)
    path = store.paths.lock
    os.link(path, str(tmp_path / "second-name"))
    old = os.lstat(path).st_ino
    commit(store)
    st = os.lstat(path)
    assert (st.st_nlink, stat.S_IMODE(st.st_mode)) == (1, 0o600) and st.st_ino != old
    assert os.lstat(tmp_path / "second-name").st_ino == old


def test_backup_with_a_hard_link_is_refused_on_fallback(tmp_path):
    store = populated(tmp_path)
    newest = sorted(os.listdir(store.paths.backups_dir))[-1]
    os.link(os.path.join(store.paths.backups_dir, newest), str(tmp_path / "x"))
    with open(store.paths.ledger, "wb") as f:
        f.write(b"garbage")
    with pytest.raises(ConfigError, match="hard links"):
        store.read()


@pytest.mark.parametrize("kind", ["fifo", "socket", "directory", "device"])
@pytest.mark.parametrize("name", ["ledger.json", "audit.jsonl"])
def test_special_files_are_refused(tmp_path, kind, name):
    store = populated(tmp_path)
    path = os.path.join(store.paths.data_dir, name)
    os.unlink(path)
    if kind == "fifo":
        os.mkfifo(path, 0o600)       # opening it for reading would block forever
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)
        s.close()
    elif kind == "directory":
        os.mkdir(path, 0o700)
    else:
        if not ROOT:
            pytest.skip("creating a device node needs root")
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    want = {"fifo": "a FIFO", "socket": "a socket", "directory": "a directory",
            "device": "a character device"}[kind]
    refused(store, want, read=name == "ledger.json")


@pytest.mark.parametrize("name", ["", "ledger.json", "audit.jsonl", "ledger.lock", "backups"])
def test_group_writable_is_refused_and_left_alone(tmp_path, name):
    store = populated(tmp_path)
    path = os.path.join(store.paths.data_dir, name) if name else store.paths.data_dir
    os.chmod(path, 0o770 if os.path.isdir(path) else 0o620)
    before = mode(path)
    refused(store, "writable by group or others", read=name in ("", "ledger.json"))
    assert mode(path) == before                          # never chmod-ed silently
    with pytest.raises(ConfigError) as e:
        commit(store)
    assert e.value.hint == f"chmod go-w {path.rstrip('/')}"


def test_wrong_owner_is_refused(tmp_path):
    store = populated(tmp_path)
    other = os.geteuid() + 4242
    with pytest.raises(ConfigError, match=f"expected uid {other}"):
        Store(store.paths.data_dir, owner_uid=other, private=False).read()
    if ROOT:
        os.chown(store.paths.ledger, 12345, -1)
        refused(store, "owned by uid 12345")
        assert os.stat(store.paths.ledger).st_uid == 12345


def test_writer_must_be_the_owner(tmp_path):
    store = populated(tmp_path)
    with pytest.raises(WrongAccount) as e:
        Store(store.paths.data_dir, owner_uid=os.geteuid() + 1, private=False).transact(
            add_old_and_new, policy=POLICY, actor_uid=1, actor="u")
    assert e.value.exit_code == EXIT_WRONG_ACCOUNT


@pytest.mark.parametrize("mask", [0o000, 0o077])
def test_private_mode_is_0700_and_0600(tmp_path, umask, mask):
    umask(mask)
    store = populated(tmp_path)
    p = store.paths
    assert mode(p.data_dir) == mode(p.backups_dir) == mode(p.archive_dir) == 0o700
    files = [p.ledger, p.lock, p.audit] + [os.path.join(d, n) for d in (p.backups_dir, p.archive_dir)
                                           for n in os.listdir(d)]
    assert len(files) > 4 and {mode(f) for f in files} == {0o600}


def test_shared_mode_modes(tmp_path, umask):
    umask(0o077)
    store = populated(tmp_path, private=False)
    p = store.paths
    assert mode(p.data_dir) == mode(p.backups_dir) == mode(p.archive_dir) == 0o755
    assert (mode(p.ledger), mode(p.audit), mode(p.lock)) == (0o644, 0o640, 0o600)
    for d in (p.backups_dir, p.archive_dir):
        assert {mode(os.path.join(d, n)) for n in os.listdir(d)} == {0o644}


def test_missing_parent_directories_are_created(tmp_path):
    store = Store(str(tmp_path / "a" / "b" / "data"), clock=lambda: T)
    assert store.read().source == "empty" and not os.path.exists(tmp_path / "a")   # reads create nothing
    commit(store)
    assert mode(store.paths.data_dir) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own directories as root and others")
def test_unsafe_ancestor_rules(tmp_path):
    from bk.store.fsutil import unsafe_ancestor

    base = tmp_path / "u"
    safe = base / "safe"
    safe.mkdir(parents=True)
    for d in (tmp_path, base, safe):
        os.chown(d, 0, 0)
        d.chmod(0o755)
    assert unsafe_ancestor(str(safe), (0,)) is None
    base.chmod(0o1777)                    # sticky and world-writable, above a safe directory
    assert unsafe_ancestor(str(safe), (0,)) is None
    got = unsafe_ancestor(str(base), (0,), sticky_ok=False)   # holding the trusted thing itself
    assert got[0] == str(base) and got[2] == "writable"
    base.chmod(0o777)                     # writable and not sticky: anyone can swap safe/
    assert unsafe_ancestor(str(safe), (0,))[0:3:2] == (str(base), "writable")
    base.chmod(0o755)
    os.chown(base, 65534, 65534)
    assert unsafe_ancestor(str(safe), (0,))[0:3:2] == (str(base), "owner")
    assert unsafe_ancestor(str(safe), (0, 65534)) is None
    assert unsafe_ancestor(str(tmp_path / "missing"), (0,))[2] == "unreadable"
