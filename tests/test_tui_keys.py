"""``bk t``'s keys as a pure function: ``handle(state, key, world)``."""

from __future__ import annotations

import tui_world
from tui_world import NOW, world

from bk.core.record import replace
from bk.tui import keys, layout
from bk.tui.keys import ViewState, handle


def press(state, *names, w=None):
    w = w or world()
    action = None
    for k in names:
        state, action = handle(state, k, w)
    return state, action


def test_zoom_runs_from_five_minutes_to_a_day():
    s = ViewState()
    s, _ = press(s, *["+"] * 12)
    assert s.step == 300 and "finest" in s.message
    s, _ = press(s, *["-"] * 20)
    assert s.step == 86400 and "widest" in s.message
    # A 15-minute slice allows no 5- or 10-minute columns.
    w = world(policy=replace(tui_world.POLICY, slot_minutes=15))
    s, _ = press(ViewState(), *["+"] * 5, w=w)
    assert s.step == 900


def test_pan_into_the_past_and_back_to_now():
    w = world()
    s, _ = press(ViewState(), "PGUP", "PGUP", w=w)
    frm, n, step = keys.window(s, w)
    assert frm < NOW - 10 * 3600
    s, _ = press(s, "n", w=w)
    assert s.frm is None and keys.cursor_time(s, w) <= NOW < keys.cursor_time(s, w) + s.step


def test_cursor_pans_at_the_edges():
    w = world()
    s, _ = press(ViewState(), "LEFT", "LEFT", "LEFT", w=w)
    assert s.col == 0 and s.frm == layout.home(NOW, s.step) - 2 * s.step


def test_add_toggle_type_and_submit():
    w = world()
    s, a = press(ViewState(gpu=1), "a", w=w)
    assert s.mode == "form" and s.draft.gpus == (1,) and s.draft.start == NOW - NOW % 300
    s, _ = press(s, "DOWN", "DOWN", "2", "3", w=w)           # gpus field: toggle 2 and 3
    assert s.draft.gpus == (1, 2, 3)
    s, _ = press(s, " ", w=w)                               # the GPU cursor is on 1: off
    assert s.draft.gpus == (2, 3)
    s, _ = press(s, "UP", "=", "1", "h", "3", "0", "m", w=w)  # duration: type 1h30m
    assert s.draft.typing == "1h30m"
    s, _ = press(s, "ENTER", w=w)
    assert s.draft.duration == 5400 and s.draft.typing is None
    s, _ = press(s, "x", w=w)
    assert s.draft.mode == "exclusive"
    s, a = press(s, "ENTER", w=w)
    assert a.kind == "book" and a.draft.gpus == (2, 3) and a.draft.mode == "exclusive"


def test_a_typo_is_said_and_changes_nothing():
    w = world()
    s, _ = press(ViewState(), "a", "DOWN", "=", "z", "z", "ENTER", w=w)
    assert s.error and "zz" in s.message and s.draft.duration == 3600 and s.draft.typing == "zz"
    s, _ = press(s, "ESC", w=w)
    assert s.draft.typing is None and s.mode == "form"
    s, _ = press(s, "ESC", w=w)
    assert s.mode == "browse" and s.draft is None and s.message == "nothing booked"


def test_start_typed_as_on_the_command_line():
    w = world()
    s, _ = press(ViewState(), "a", "1", "4", ":", "0", "0", "ENTER", w=w)
    assert s.draft.start == NOW - NOW % 86400 + 14 * 3600
    frm, n, step = keys.window(s, w)
    assert frm <= s.draft.start < frm + n * step        # the window followed the draft


def test_share_and_memory():
    w = world()
    s, _ = press(ViewState(), "a", "DOWN", "DOWN", "DOWN", "DOWN", "RIGHT", "RIGHT", w=w)
    assert s.draft.share == 2                            # at most the capacity
    s, _ = press(s, "DOWN", "RIGHT", "RIGHT", w=w)
    assert s.draft.mem_mib == 2048
    s, _ = press(s, "=", "1", "2", "g", "ENTER", w=w)
    assert s.draft.mem_mib == 12288
    s, _ = press(s, "LEFT", w=w)
    assert s.draft.mem_mib == 11264


def test_edit_of_a_running_booking_moves_only_its_end():
    w = world()
    mine = tui_world.RESERVATIONS[0]                    # ada's, running
    s, _ = press(ViewState(focus="table", sel=mine.id), "e", w=w)
    assert s.mode == "form" and s.draft.running and keys.FIELDS[s.draft.field] == "duration"
    s, _ = press(s, "RIGHT", w=w)
    assert s.draft.end == mine.end + 900
    s, _ = press(s, "UP", "RIGHT", w=w)                  # start: refused
    assert s.error and "only its end" in s.message and s.draft.start == mine.start
    s, a = press(s, "ENTER", w=w)
    assert a.kind == "edit" and a.draft.edit_of == mine.id


def test_only_your_own_bookings_change():
    w = world()
    bob = tui_world.RESERVATIONS[1]
    for k in ("e", "d"):
        s, a = press(ViewState(focus="table", sel=bob.id), k, w=w)
        assert a is None and s.error and "bob's booking" in s.message


def test_cancel_asks_first():
    w = world()
    mine = tui_world.RESERVATIONS[3]
    s, a = press(ViewState(focus="table", sel=mine.id), "d", w=w)
    assert s.mode == "confirm" and a is None
    kept, a = press(s, "n", w=w)
    assert kept.mode == "browse" and a is None and kept.message == "kept it"
    _, a = press(s, "y", w=w)
    assert a.kind == "cancel" and a.ref == mine.id


def test_the_past_is_read_only():
    w = world()
    past = tui_world.RESERVATIONS[4]
    s, a = press(ViewState(focus="table", sel=past.id, frm=NOW - 8 * 3600), "e", w=w)
    assert a is None and s.error


def test_table_selection_moves_through_the_bookings_in_view():
    w = world()
    s, _ = press(ViewState(), "TAB", w=w)
    first = s.sel
    s, _ = press(s, "DOWN", "DOWN", w=w)
    ids = [r.id for r in keys.rows(s, w)]
    assert ids.index(s.sel) == ids.index(first) + 2
    s, _ = press(s, *["DOWN"] * 20, w=w)
    assert s.sel == ids[-1]


def test_find_help_tour_theme_quit():
    w = world()
    s, a = press(ViewState(), "a", "f", w=w)
    assert a.kind == "find"
    s, _ = press(ViewState(), "?", w=w)
    assert s.mode == "help"
    s, _ = press(s, "q", w=w)
    assert s.mode == "browse"
    from bk.tui.text import TOUR

    s, _ = press(ViewState(), "t", *["n"] * len(TOUR), w=w)
    assert s.mode == "browse" and "tour done" in s.message
    s, _ = press(ViewState(), "T", w=w)
    assert s.theme == "light"
    _, a = press(ViewState(), "q", w=w)
    assert a.kind == "quit"


def test_keys_between_two_worlds_keep_the_draft():
    """A refresh replaces the world between two keys: the draft and the
    cursor are the state's, so nothing typed is lost."""
    s, _ = press(ViewState(), "a", "DOWN", "=", "2", w=world())
    later = world(now=NOW + 60, reservations=tui_world.RESERVATIONS[:2], seq=2)
    s, _ = press(s, "h", "ENTER", w=later)
    assert s.draft.duration == 7200 and s.mode == "form"
