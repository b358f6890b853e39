"""``bk t``'s writes through the service layer, on a real private store
with a fixed clock; and ``bk t`` where no screen can start."""

from __future__ import annotations

import os

import pytest
from helpers_cli import BOB, ME, NOW, SLICE, bk_fixture

from bk.core.record import replace
from bk.service import builders, open_app
from bk.tui import actions, keys
from bk.tui.world import Loader, load_world


@pytest.fixture
def bk(monkeypatch, capsys):
    yield from bk_fixture(monkeypatch, capsys)


def app_of(actor=ME):
    return open_app(dict(os.environ), actor=actor)


def live_ids(bk) -> list[str]:
    return [r["id"] for r in bk.data("l", "--all")["reservations"]]


def test_book_edit_cancel_through_the_service(bk):
    app = app_of()
    w = load_world(app)
    s, _ = keys.handle(keys.ViewState(gpu=2), "a", w)
    out = actions.book(app, s.draft)
    assert out.done and not out.error and out.message.startswith("booked ")
    got = bk.data("l")["reservations"]
    assert [r["id"] for r in got] == [out.reservation] and got[0]["gpus"] == [2]
    assert got[0]["start"].startswith("2026-07-13T10:40") and got[0]["end"].startswith("2026-07-13T11:40")

    w = load_world(app)
    s, _ = keys.handle(keys.ViewState(focus="table", sel=out.reservation), "e", w)
    assert s.draft.running
    s, _ = keys.handle(s, "RIGHT", w)
    edited = actions.edit(app, s.draft)
    assert edited.done and not edited.error, edited.message
    assert bk.data("l")["reservations"][0]["end"].startswith("2026-07-13T11:55")

    gone = actions.cancel(app, out.reservation)
    assert gone.done and gone.message == f"cancelled {out.reservation[:8]}"
    assert bk.data("l")["reservations"] == []


def test_upcoming_edit_moves_start_gpus_and_mode(bk):
    app = app_of()
    later = SLICE + 3 * 3600
    draft = keys.Draft(later, 3600, (0,))
    out = actions.book(app, draft)
    assert out.done, out.message
    w = load_world(app)
    d = keys.edit_draft(next(r for r in w.reservations if r.id == out.reservation), w)
    assert not d.running
    d = replace(d, start=later + 1800, duration=7200, gpus=(1, 3), mode="exclusive")
    res = actions.edit(app, d)
    assert res.done, res.message
    r = bk.data("l")["reservations"][0]
    assert (r["gpus"], r["mode"], r["start"], r["end"]) == ([1, 3], "exclusive", "2026-07-13T14:10:00Z",
                                                           "2026-07-13T16:10:00Z")


def test_a_booking_made_impossible_after_the_preview_writes_nothing(bk):
    """The preview showed GPU 0 free; bob takes it exclusively before Enter:
    the service refuses at submit, the screen says why, nothing is written."""
    app = app_of()
    w = load_world(app)
    s, _ = keys.handle(keys.ViewState(gpu=0), "a", w)
    assert w.reservations == ()
    bob = bk.service(BOB)
    call = bob.call()
    req, _ = builders.book_request(count_=1, duration_="2h", policy=call.policy, now=call.now, tz=call.tz,
                                   mode="exclusive", gpus="0", at="now")
    taken = bob.run("book", req, call=call).reservation
    before = live_ids(bk)
    out = actions.book(app, s.draft)
    assert out.error and not out.done
    assert out.message.startswith("nothing changed: ") and "GPU 0" in out.message
    assert live_ids(bk) == before == [taken.id]


def test_find_the_earliest_slot(bk):
    app = app_of()
    bob = bk.service(BOB)
    call = bob.call()
    req, _ = builders.book_request(count_=4, duration_="1h", policy=call.policy, now=call.now, tz=call.tz,
                                   mode="exclusive", at="now")
    bob.run("book", req, call=call)
    w = load_world(app)
    s, _ = keys.handle(keys.ViewState(), "a", w)
    s, _ = keys.handle(s, "DOWN", w)
    s, _ = keys.handle(s, "DOWN", w)
    s, _ = keys.handle(s, "1", w)                  # two GPUs: 0 and 1
    out = actions.find(app, s.draft)
    assert not out.error and out.draft.start == SLICE + 3600 and len(out.draft.gpus) == 2
    assert "Enter books it" in out.message
    assert live_ids(bk) and len(live_ids(bk)) == 1          # found, not booked


def test_choose_a_gpu_first(bk):
    out = actions.book(app_of(), keys.Draft(SLICE, 3600, ()))
    assert out.error and "choose at least one GPU" in out.message


def test_loader_reads_the_world_without_the_lock(bk):
    app = app_of()
    actions.book(app, keys.Draft(SLICE + 600, 3600, (1,)))
    loader = Loader(app, interval=60)
    w = loader.load_once()
    assert w.now == NOW and w.actor_user == "ada" and len(w.reservations) == 1
    assert w.monitor["state"] == "absent" and [g.index for g in w.gpus] == [0, 1, 2, 3]
    assert loader.snapshot is not None
    again = loader.load_once()
    assert again.seq == w.seq + 1 and again.reservations == w.reservations
    # A commit replaces the ledger file: the next look reads it again.
    actions.book(app, keys.Draft(SLICE + 7200, 3600, (2,)))
    assert len(loader.load_once().reservations) == 2


def test_without_a_terminal_bk_t_prints_the_text_timeline(bk):
    r = bk("t")
    assert r.code == 0
    assert "cannot open the full screen: no terminal" in r.err and "text timeline" in r.err
    assert "GPU 0" in r.out and "now" in r.out
    assert "unknown command" not in r.err


def test_bk_t_json_is_the_timeline_envelope(bk):
    r = bk.json("tui")
    assert r.code == 0
    env = r.envelope
    assert env["command"] == "tui" and env["data"]["tui"] == {
        "started": False, "reason": "--json asks for one envelope, not a screen"}
    assert len(env["data"]["gpus"]) == 4


def test_why_not(monkeypatch):
    from bk.tui.driver import why_not

    class Tty:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

        def fileno(self):
            return 1

    assert "no terminal" in why_not({"TERM": "xterm"}, Tty(False), Tty(True))
    assert "TERM=dumb" in why_not({"TERM": "dumb"}, Tty(True), Tty(True))
    assert "TERM=(unset)" in why_not({}, Tty(True), Tty(True))


def test_tutorial_tui_without_a_terminal_prints_the_tour(bk):
    r = bk("tutorial", "--tui")
    assert r.code == 0 and "1. The timeline" in r.out and "6. More" in r.out
    assert "needs its full screen" in r.err
    data = bk.data("tutorial", "--tui")
    assert [p["title"] for p in data["tour"]][:2] == ["The timeline", "Reading a cell"]
