"""Human output fits the terminal (80 columns, and uses 132 when it has
them) and carries colour only where it may: a TTY without NO_COLOR and
without TERM=dumb."""

from __future__ import annotations

import io
import sys

import pytest
from helpers_cli import BOB, ROOT, bk_fixture

from bk.core.models import iso
from bk.service.requests import BookRequest, NoticeRequest

LONG_USER = BOB.__class__(2001, "maximilian_vonlongname")

COMMANDS = [
    [], ["st"], ["st", "-v"], ["l"], ["l", "--all"], ["l", "--history"], ["tl"], ["tl", "2d"],
    ["tl", "--from", "-1h", "--window", "4h"], ["slots", "2", "1h", "12g"], ["slots", "4", "2h", "-n", "5"],
    ["g"], ["g", "2"], ["n"], ["history", "1"], ["lg"], ["info"], ["config"], ["doctor"], ["tutorial"],
    ["login"], ["help"], ["help", "book"], ["help", "edit"], ["help", "timeline"], ["e", "2", "-d", "+30m"],
    ["8", "1h", "20g", "-t", "tomorrow 22:00", "--note", "a long note " * 6, "--dry-run", "-v"],
    ["x", "4", "1d12h", "--queue", "-t", "23:00", "--dry-run"], ["d", "1", "--dry-run"],
]

SIM = {"gpus": [{"name": "NVIDIA H100 80GB HBM3 Extended Memory Edition", "mem_total_mib": 81559,
                 "mem_used_mib": 70000, "util": 100,
                 "processes": [{"pid": 100000 + i, "uid": 2001, "user": LONG_USER.user,
                                "label": "python3 -m torch.distributed.run", "mem_mib": 9000}
                               for i in range(3)]}
                for _ in range(8)]}


@pytest.fixture
def bk(monkeypatch, capsys):
    gen = bk_fixture(monkeypatch, capsys)
    b = next(gen)
    b.sim(SIM)
    b.ok("2", "1h", "12g", "--note", "fine-tuning the large model, do not preempt please")
    b.ok("1", "2h", "-t", "20:00")
    b.ok("1", "30m", "-t", "13:00")
    b.ok("d", "3")
    other = b.service(LONG_USER)
    other.run("book", BookRequest(count=3, duration=5 * 3600, note="x" * 80))
    other.run("book", BookRequest(count=8, duration=86400, mode="exclusive", start=None, queue=False))
    b.service(ROOT).run("notice_publish", NoticeRequest("Scheduled maintenance of the whole cluster on Friday from "
                                                 "18:00 to 22:00; running jobs will be stopped " * 2,
                                                 level="critical"))
    yield b
    next(gen, None)


@pytest.mark.parametrize("width", [80, 132])
def test_no_line_is_wider_than_the_terminal(bk, monkeypatch, width):
    monkeypatch.setenv("COLUMNS", str(width))      # argparse's help reads it from os.environ
    widest = 0
    for argv in COMMANDS:
        r = bk(*argv, COLUMNS=str(width))
        assert r.code in (0, 3), (argv, r.code, r.err)
        for line in (r.out + r.err).splitlines():
            assert len(line) <= width, f"bk {' '.join(argv)}: {len(line)} > {width}:\n{line}"
            widest = max(widest, len(line))
    assert widest > 70          # the check saw real tables, not empty output


def test_wide_terminals_get_more(bk):
    narrow = bk.ok("tl", COLUMNS="80").out
    wide = bk.ok("tl", COLUMNS="132").out
    assert max(map(len, wide.splitlines())) > max(map(len, narrow.splitlines())) + 40
    cut = bk.ok("l", "--all", COLUMNS="80").out
    full = bk.ok("l", "--all", COLUMNS="200").out
    assert "…" in cut and "do not preempt please" in full


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _on_a_tty(bk, monkeypatch, argv, **env) -> str:
    real, fake = sys.stdout, FakeTty()
    monkeypatch.setattr(sys, "stdout", fake)
    try:
        r = bk(*argv, COLUMNS="100", **env)
    finally:
        monkeypatch.setattr(sys, "stdout", real)
    assert r.code == 0, r.err
    assert fake.getvalue(), "the command printed nothing"
    return fake.getvalue()


@pytest.mark.parametrize("argv", [["st", "-v"], ["l", "--all"], ["tl"], ["doctor"], ["tutorial"]])
def test_colour_only_on_a_tty_and_never_with_no_color_or_dumb(bk, monkeypatch, argv):
    assert "\x1b" in _on_a_tty(bk, monkeypatch, argv)              # the control: colour works
    assert "\x1b" not in _on_a_tty(bk, monkeypatch, argv, NO_COLOR="1")
    assert "\x1b" in _on_a_tty(bk, monkeypatch, argv, NO_COLOR="")  # no-color.org: empty keeps it
    assert "\x1b" not in _on_a_tty(bk, monkeypatch, argv, TERM="dumb")
    plain = bk(*argv)                                              # not a tty
    assert plain.out and "\x1b" not in plain.out


def test_times_are_local(bk, monkeypatch):
    from bk import clock

    monkeypatch.setenv("TZ", "Europe/Berlin")                    # UTC+2 in July
    clock.local_tz.cache_clear()
    out = bk.ok("l").out
    assert "07-13 12:40–13:40" in out                            # booked 10:40 UTC
    assert bk.data("l")["reservations"][0]["start"] == iso(1783939200)
