"""``bk t`` frames as text: pure renders of a fixed world (clock, ledger,
GPUs) at 80x24 and 160x48, compared with golden files in tests/golden_tui/.

After a deliberate change of the screen, regenerate them with
``BK_REGEN_GOLDEN=1 python3 -m pytest tests/test_tui_render.py`` and read
the diff before committing it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import tui_world
from tui_world import NOW, world

from bk.core.record import replace
from bk.tui import keys, render, theme

GOLDEN = Path(__file__).resolve().parent / "golden_tui"


def frame(state, w=None, *, size=(80, 24), th="dark", cs=theme.UNICODE):
    w = w or world()
    state = replace(state, width=size[0], height=size[1])
    return render.render(state, w, size, theme.THEMES.get(th, theme.PLAIN), cs)


def check(name: str, f) -> None:
    text = f.text() + "\n"
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("BK_REGEN_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with BK_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from {path}"
    # Every frame is exactly the screen: as many lines, none wider.
    assert len(f.lines) == f.height
    for line in f.lines:
        assert sum(render.width_of(t) for t, _ in line) == f.width


def st(**kw) -> keys.ViewState:
    return keys.ViewState(**kw)


def test_browse_80x24():
    check("browse_80x24", frame(st()))


def test_browse_160x48_with_live_gpu():
    check("browse_160x48", frame(st(gpu=1), size=(160, 48)))


def test_ascii_80x24_draws_no_unicode():
    f = frame(st(), cs=theme.ASCII)
    check("browse_80x24_ascii", f)
    assert f.text().isascii()


def test_form_with_conflict_80x24():
    w = world()
    s, _ = keys.handle(st(), "a", w)           # a draft on GPU 0 at now, 1h: bob joins at 11:00
    check("form_80x24", frame(s, w))
    assert "!" in frame(s, w).text().splitlines()[4]


def test_table_focus_and_past_160x48():
    w = world()
    s = st(frm=NOW - 8 * 3600, step=1800, focus="table", sel=tui_world.RESERVATIONS[4].id)
    check("past_160x48", frame(s, w, size=(160, 48)))


def test_help_tour_and_too_small():
    check("help_80x24", frame(st(mode="help")))
    check("help_80x24_p2", frame(st(mode="help", tour_page=1)))
    check("tour_80x24", frame(st(mode="tour", tour_page=3)))
    f = frame(st(), size=(59, 16))
    check("small_59x16", f)
    assert "terminal too small (need 60x16)" in f.text()


def test_confirm_line():
    w = world()
    s = st(mode="confirm", confirm=tui_world.RESERVATIONS[0].id)
    assert ", running)? y: yes, other key: no" in frame(s, w).text()


def test_stored_text_cannot_drive_the_terminal():
    text = frame(st(), size=(160, 48)).text()
    assert "\x1b" not in text and "\u202e" not in text
    assert "carol?[" in text and "evil?note" in text      # the ESC and the override show as ?


def test_shortest_unique_ids():
    text = frame(st(frm=NOW - 8 * 3600, step=1800), size=(160, 48)).text()
    # 4a000004 and 4a000005 share "4a00000": both need all eight; the others four.
    assert " 4a000004 " in text and " 4a000005 " in text
    assert " 0000 " not in text                    # 00000001... share seven characters too
    assert " 00000001 " in text


def test_own_bookings_read_without_colour():
    """NO_COLOR: the plain theme has no colours, but own bookings are still
    letters and bold, the cursor still reversed."""
    plain = theme.theme_for("dark", {"NO_COLOR": "1"})
    assert plain is theme.PLAIN and not plain.color
    f = render.render(st(), world(), (80, 24), plain, theme.UNICODE)
    lane = f.lines[4]                               # GPU 0
    kinds = [(t, s) for t, s in lane]
    assert all(s.fg is None and s.bg is None for _, s in kinds)
    assert any("a" in t and s.bold for t, s in kinds)
    assert any(s.reverse for _, s in kinds)        # the cursor


def test_theme_detection():
    assert theme.detect_theme({"COLORFGBG": "0;15"}) == "light"
    assert theme.detect_theme({"COLORFGBG": "15;0"}) == "dark"
    assert theme.detect_theme({}) == "dark"
    assert theme.charset_for("UTF-8") is theme.UNICODE
    assert theme.charset_for("ANSI_X3.4-1968") is theme.ASCII


@pytest.mark.parametrize("size", [(60, 16), (80, 24), (100, 30), (160, 48), (250, 70)])
@pytest.mark.parametrize("mode", ["browse", "form", "help", "tour"])
def test_every_size_fits(size, mode):
    w = world()
    s = st(width=size[0], height=size[1])
    if mode == "form":
        s, _ = keys.handle(s, "a", w)
    else:
        s = replace(s, mode=mode)
    f = render.render(s, w, size, theme.THEMES["light"], theme.UNICODE)
    assert len(f.lines) == size[1]
    for line in f.lines:
        assert sum(render.width_of(t) for t, _ in line) == size[0]


def test_world_not_read_yet():
    f = render.render(st(), None, (80, 24), theme.THEMES["dark"], theme.UNICODE)
    assert "reading the bookings" in f.text()


def test_a_booking_reads_the_same_in_bk_l_and_in_the_table_of_bk_t():
    """One module of words (bk.core.timegrid) for the CLI and the screen: each
    booking's GPUs, mode, memory, window and status are the same cells in
    ``bk l --all``'s table and in the table of ``bk t``.  (They were two copies
    that disagreed: the screen said ``shared 1/2``, ``auto`` and ``10:00-11:30``
    where ``bk l`` said ``shared``, ``-`` and ``07-13 10:00-11:30``.)"""
    from datetime import timezone

    from bk.cli import common
    from bk.cli.render import Term
    from bk.service.views import View

    f = frame(st(), size=(160, 48))
    screen = f.text().splitlines()
    term = Term(width=160, color=False, unicode=True, tty=False)
    view = View(NOW, tui_world.ME, tui_world.POLICY, {}, {})
    live = [r for r in tui_world.RESERVATIONS if r.end > NOW]
    cli = common.reservations_table(live, view, term, tz=timezone.utc, show_user=True).splitlines()
    head = cli[0]
    cols = {name: head.index(name) for name in ("GPUS", "MODE", "MEM", "WHEN", "STATUS", "NOTE")}
    for r, line in zip(live, cli[1:], strict=True):
        cells = {name: line[cols[a]:cols[b]].strip() for name, a, b in
                 (("gpus", "GPUS", "MODE"), ("mode", "MODE", "MEM"), ("mem", "MEM", "WHEN"),
                  ("when", "WHEN", "STATUS"), ("status", "STATUS", "NOTE"))}
        row = next(s for s in screen if r.id[:8] in s)
        at = row.index(r.id[:8])
        for name, text in cells.items():
            assert text and text in row[at:], f"{r.id[:8]}: bk l's {name} {text!r} is not in bk t's {row!r}"


# ------------------------------------------------------------- letters and the full mark (issue 30, item 20)

def _lane(f, gpu: int) -> str:
    return next("".join(t for t, _ in line) for line in f.lines if "".join(t for t, _ in line).startswith(f"GPU {gpu}"))


def test_upper_case_only_where_the_gpu_is_full_while_the_booking_holds_it():
    """Mine 10:40-10:50, bob's exclusive 10:50-11:00: the 10:45 column of
    a 15-minute step ends full, but after mine left: a lower-case a."""
    left = (tui_world.res(1, tui_world.ME, "ada", [0], 0, 10),
            tui_world.res(2, tui_world.BOB, "bob", [0], 10, 20, mode="exclusive"))
    f = frame(st(frm=NOW - NOW % 900, step=900), world(reservations=left))
    lane = _lane(f, 0)
    assert "a" in lane and "A" not in lane, lane
    held = (tui_world.res(1, tui_world.ME, "ada", [0], 0, 10),
            tui_world.res(2, tui_world.BOB, "bob", [0], 5, 20))        # both share slots taken 10:45-10:50
    lane = _lane(frame(st(frm=NOW - NOW % 900, step=900), world(reservations=held)), 0)
    assert "A" in lane, lane


def test_letters_go_to_the_bookings_in_view_so_27_of_yours_still_read():
    """26 short bookings today, one of yours tomorrow: with the window on
    tomorrow that one is a, in the lane and in the table, not *."""
    today = tuple(tui_world.res(100 + k, tui_world.ME, "ada", [1], 30 + 10 * k, 35 + 10 * k) for k in range(26))
    tomorrow = tui_world.res(200, tui_world.ME, "ada", [0], 24 * 60, 24 * 60 + 60)
    w = world(reservations=(*today, tomorrow))
    f = frame(st(frm=NOW - NOW % 3600 + 23 * 3600, step=900), w, size=(160, 48))
    assert "a" in _lane(f, 0) and "*" not in _lane(f, 0)
    rows = ["".join(t for t, _ in line) for line in f.lines]
    (row,) = [r for r in rows if "07-14 10:40" in r]
    assert row.startswith(" a "), row
    assert not any(r.startswith((" * ", " b ")) for r in rows)     # today's, out of view, need no letter
