"""``bk lg`` tells the administrator's and the worker's actions in words, not
as the audit log's action constants, and ``bk st`` shows a booking's job like
``bk l`` does."""

from __future__ import annotations

import pytest
from helpers_cli import bk_fixture

from bk.cli.cmd_log import describe


@pytest.fixture
def bk(monkeypatch, capsys):
    yield from bk_fixture(monkeypatch, capsys)


@pytest.mark.parametrize("entry, words", [
    ({"action": "blackout_add", "user": "root", "after": {"reason": "driver update"}},
     "maintenance window set by root: driver update"),
    ({"action": "blackout_end", "user": "root", "result": "ended"}, "maintenance window ended by root"),
    ({"action": "notice_publish", "user": "root", "after": {"text": "reboot at 18:00"}},
     "announcement published by root: reboot at 18:00"),
    ({"action": "notice_archive", "user": "root", "before": {"text": "old"}},
     "announcement archived by root: old"),
    ({"action": "notice_edit", "user": "root", "after": {"text": "new"}}, "announcement edited by root: new"),
    ({"action": "policy_bind", "user": "root"}, "GPU policy bound to the ledger by root"),
    ({"action": "recover", "user": "root"}, "lost commits accepted by root"),
    ({"action": "job", "user": "ada", "before": {"job": "pending"}, "after": {"job": "running"}},
     "job pending -> running by ada"),
    ({"action": "someday_new", "user": "root", "result": "done"}, "someday_new by root: done"),
])
def test_actions_in_words(entry, words):
    assert describe(entry, None, 0) == words


def test_words_are_escaped():
    text = describe({"action": "notice_publish", "user": "root", "after": {"text": "\x1b[31mred"}}, None, 0)
    assert "\x1b" not in text


def test_status_shows_the_job_of_a_booking(bk):
    bk.ok("1", "30m", "-t", "20:00", "--", "python3", "train.py")
    out = bk.ok("st").out
    assert "job of 1 [" in out and "pending (python3 +1 arg)" in out
