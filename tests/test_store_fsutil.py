"""The storage primitives every writer shares: ``replace_file`` (the one
durable atomic replace) and ``unsafe_stat`` (the one owner/mode rule)."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from bk.core.errors import ConfigError, IOFailure
from bk.store import fsutil


@pytest.fixture
def dirfd(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def names(path):
    return sorted(os.listdir(path))


def test_replace_file_gives_exact_content_and_mode_whatever_the_umask(tmp_path, dirfd):
    old = os.umask(0o077)
    try:
        fsutil.replace_file(dirfd, "f.json", str(tmp_path), b"one\n", 0o644)
        fsutil.replace_file(dirfd, "f.json", str(tmp_path), b"two\n", 0o644)
    finally:
        os.umask(old)
    assert (tmp_path / "f.json").read_bytes() == b"two\n"
    assert stat.S_IMODE(os.lstat(tmp_path / "f.json").st_mode) == 0o644
    assert names(tmp_path) == ["f.json"]


def test_replace_file_steps_fire_in_protocol_order(tmp_path, dirfd):
    seen = []
    fsutil.replace_file(dirfd, "f", str(tmp_path), b"x", 0o600, step=seen.append)
    assert seen == ["tmp_written", "tmp_synced", "replaced", "dir_synced"]
    seen.clear()
    fsutil.replace_file(dirfd, "f", str(tmp_path), b"x", 0o600, step=seen.append, sync=False)
    assert seen == ["tmp_written", "replaced"]


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path, dirfd):
    fsutil.replace_file(dirfd, "f", str(tmp_path), b"old", 0o600)

    def full(fd, data):
        os.write(fd, data[:1])
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(IOFailure, match="no space left") as e:
        fsutil.replace_file(dirfd, "f", str(tmp_path), b"new", 0o600, write=full)
    assert e.value.exit_code == 74
    assert (tmp_path / "f").read_bytes() == b"old" and names(tmp_path) == ["f"]


def test_a_refusing_check_abandons_the_write(tmp_path, dirfd):
    seen = []

    def check(path):
        seen.append((os.path.basename(path), (tmp_path / os.path.basename(path)).read_bytes()))
        raise ConfigError("no")

    with pytest.raises(ConfigError):
        fsutil.replace_file(dirfd, "f", str(tmp_path), b"new", 0o600, check=check)
    assert seen[0][0].startswith(".f.tmp-") and seen[0][1] == b"new"
    assert names(tmp_path) == []


def test_without_overwrite_an_existing_name_wins(tmp_path, dirfd):
    (tmp_path / "f").write_bytes(b"theirs")
    with pytest.raises(FileExistsError):
        fsutil.replace_file(dirfd, "f", str(tmp_path), b"mine", 0o644, overwrite=False)
    assert (tmp_path / "f").read_bytes() == b"theirs" and names(tmp_path) == ["f"]
    fsutil.replace_file(dirfd, "g", str(tmp_path), b"mine", 0o644, overwrite=False)
    assert (tmp_path / "g").read_bytes() == b"mine" and os.lstat(tmp_path / "g").st_nlink == 1
    assert names(tmp_path) == ["f", "g"]


def test_the_target_is_replaced_never_followed(tmp_path, dirfd):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / "f").symlink_to(victim)
    fsutil.replace_file(dirfd, "f", str(tmp_path), b"new", 0o600)
    assert victim.read_bytes() == b"keep"
    assert not (tmp_path / "f").is_symlink() and (tmp_path / "f").read_bytes() == b"new"
# ------------------------------------------------------------- unsafe_stat

def fake_stat(mode, uid=1000, nlink=1):
    return os.stat_result((mode, 0, 0, nlink, uid, 0, 0, 0, 0, 0))


@pytest.mark.parametrize("st, want_dir, why", [
    (fake_stat(stat.S_IFREG | 0o644), False, None),
    (fake_stat(stat.S_IFDIR | 0o755), True, None),
    (fake_stat(stat.S_IFLNK | 0o777), False, "kind"),
    (fake_stat(stat.S_IFDIR | 0o755), False, "kind"),
    (fake_stat(stat.S_IFREG | 0o644), True, "kind"),
    (fake_stat(stat.S_IFIFO | 0o600), False, "kind"),
    (fake_stat(stat.S_IFREG | 0o644, nlink=2), False, "links"),
    (fake_stat(stat.S_IFDIR | 0o755, nlink=5), True, None),      # directories have many
    (fake_stat(stat.S_IFREG | 0o644, nlink=0), False, None),     # renamed over while open
    (fake_stat(stat.S_IFREG | 0o644, uid=0), False, "owner"),
    (fake_stat(stat.S_IFREG | 0o664), False, "writable"),
    (fake_stat(stat.S_IFDIR | 0o757), True, "writable"),
    (fake_stat(stat.S_IFREG | 0o666, uid=0, nlink=2), False, "links"),   # the first rule broken
])
def test_unsafe_stat_names_the_first_rule_broken(st, want_dir, why):
    got = fsutil.unsafe_stat(st, 1000, want_dir=want_dir)
    assert (got and got[0]) == why


def test_unsafe_stat_can_allow_hard_links():
    st = fake_stat(stat.S_IFREG | 0o644, nlink=3)
    assert fsutil.unsafe_stat(st, 1000, want_dir=False, single_link=False) is None


def test_name_patterns_take_what_their_regular_expressions_take():
    # bk.store's numbered file names are matched without re (start-up cost);
    # each NamePattern takes exactly what the pattern it replaced takes.
    import itertools
    import re

    from bk.store.fsutil import NamePattern

    cases = [(NamePattern("ledger-", 10, ".json"), r"^ledger-(\d{10})\.json$", "ledger-0000000042.json"),
             (NamePattern("audit-", 10, "-", 10, ".jsonl"), r"^audit-(\d{10})-(\d{10})\.jsonl$",
              "audit-0000000001-0000000009.jsonl"),
             (NamePattern(4, "-", 2, ".jsonl"), r"^(\d{4})-(\d{2})\.jsonl$", "2026-07.jsonl")]
    for ours, text, good in cases:
        regex = re.compile(text)
        names = {good, good + "\n", good + "\n\n", "\n" + good, good[:-1], good + "x", "", "\n", good.upper(),
                 good.replace("0", "\u0660"), good.replace("1", "\uff11"), good.replace("-", "_"), "x" + good}
        for i, c in itertools.product(range(len(good) + 1), "0a-.\n\u0663"):
            names |= {good[:i] + c + good[i:], good[:i] + c + good[i + 1:], good[:i] + good[i + 1:]}
        for name in names:
            m = regex.match(name)
            got = ours.match(name)
            assert (got is None) == (m is None), name
            if m is not None:
                assert tuple(got) == m.groups() and got.group(1) == m.group(1), name
