"""Issue 27 through the CLI, in-process, on the simulated 4-GPU server with
the fixed clock of helpers_cli (10:41:30 UTC; the slice starts 10:40):
limit refusals that name the rule, the numbers and the commands that pass;
bookings that move earlier when a cancellation frees room (first come, or
fair share); bookings shared with others; each user's share in bk u users.
Each test plays the problem with real store transactions."""

from __future__ import annotations

import json
import os
import shlex

import pytest
from helpers_cli import BOB, ME, SLICE, Result, bk_fixture

from bk.cli import app as cli_app
from bk.core.errors import PermissionDenied
from bk.core.models import iso, parse_iso
from bk.service.requests import Actor, BookRequest, CancelRequest, EditRequest

H = 3600
CAROL = Actor(3000, "carol")
DAVE = Actor(4000, "dave")


class FakeAccounts:
    """The account database of the fake users helpers_cli plays (the real
    ones are in tests/test_fair_e2e.py): ada, bob, carol, dave; group nlp
    holds bob and carol."""

    USERS = {"ada": 1000, "bob": 2000, "carol": 3000, "dave": 4000}
    GROUPS = {"nlp": {"bob", "carol"}}

    def uid_of(self, name):
        return self.USERS.get(name)

    def name_of(self, uid):
        return next((n for n, u in self.USERS.items() if u == uid), None)

    def group_exists(self, group):
        return group in self.GROUPS

    def groups_of(self, user):
        return frozenset(g for g, ms in self.GROUPS.items() if user in ms)

    def members_of(self, group):
        return frozenset(self.USERS[n] for n in self.GROUPS.get(group, ()))


@pytest.fixture
def bk(monkeypatch, capsys):
    from bk.store import accounts

    monkeypatch.setattr(accounts, "_shared", FakeAccounts())
    yield from bk_fixture(monkeypatch, capsys)


def run_as(bk, actor: Actor, *argv: str) -> Result:
    """``bk ARGV`` in-process as ``actor`` (the fixture's own runs as ada)."""
    from bk.service import open_app

    bk.capsys.readouterr()
    code = cli_app.run(list(argv), dict(os.environ), opener=lambda env: open_app(env, actor=actor))
    out, err = bk.capsys.readouterr()
    return Result(code, out, err)


def book_as(bk, actor: Actor, req: BookRequest):
    app = bk.service(actor)
    return app.run("book", req).reservation


def cancel_as(bk, actor: Actor, rid: str):
    app = bk.service(actor)
    return app.run("cancel", CancelRequest(rid))


# ------------------------------------------------------------ limits

def test_a_gpu_hours_refusal_says_the_numbers_what_passes_and_the_command(bk):
    """The issue's example: 20 of 24 future GPU-hours held, 8 more asked."""
    bk.config(limits={"*": {"gpu_hours": 24}})
    bk.ok("2", "10h", "-t", "11:00")                                  # 20 GPU-hours from 11:00
    r = bk("2", "4h", "-t", "12:00")
    assert r.code == 3
    assert ("you hold 20 of 24 future GPU-hours (limit gpu_hours for everyone); this needs 8; it fits "
            "if it ends 2h earlier (2h in all), or it has 1 GPU, or you book it at 13:00 or later, once "
            "your bookings have used enough") in r.err
    err = bk.json("2", "4h", "-t", "12:00").error
    d = err["details"]
    assert (err["code"], d["rule"], d["limit"], d["value"], d["source"]) == (
        "policy", "limit_gpu_hours", "gpu_hours", 24, "limits.*.gpu_hours")
    assert (d["held_gpu_hours"], d["needs_gpu_hours"]) == (20, 8)
    assert d["fits"] == {"duration": 2 * H, "count": 1, "book_from": "2026-07-13T13:00:00Z"}
    assert d["commands"][:2] == ["bk 2 2h --start 2026-07-13T12:00:00Z", "bk 1 4h --start 2026-07-13T12:00:00Z"]
    assert "run: bk 2 2h --start 2026-07-13T12:00:00Z" in err["hint"]
    # Waiting is enough too: not a command to run now, but what to run then
    # (the asked start will have passed: the booking starts when made).
    assert d["later"] == {"from": "2026-07-13T13:00:00Z", "command": "bk 2 4h"}
    assert "; at 13:00 or later: bk 2 4h;" in err["hint"]
    bk.mp.setenv("BK_NOW", "2026-07-13T13:00:00Z")
    assert bk.json(*shlex.split(d["later"]["command"])[1:], "--dry-run").code == 0
    bk.mp.setenv("BK_NOW", "2026-07-13T12:59:00Z")
    assert bk.json(*shlex.split(d["later"]["command"])[1:], "--dry-run").code == 3
    bk.mp.setenv("BK_NOW", "2026-07-13T10:41:30Z")
    # What it suggests now does pass now.
    assert bk.json(*shlex.split(d["commands"][0])[1:]).code == 0
    # With that one booked too, the earliest time rises to 12:30; at 12:30 the same request passes.
    d = bk.json("2", "2h", "-t", "14:00").error["details"]
    assert d["fits"]["book_from"] == "2026-07-13T12:30:00Z"
    bk.mp.setenv("BK_NOW", "2026-07-13T12:29:00Z")
    assert bk("2", "2h", "-t", "14:00").code == 3
    bk.mp.setenv("BK_NOW", "2026-07-13T12:30:00Z")
    assert bk("2", "2h", "-t", "14:00").code == 0


def test_gpus_at_once_tiers_and_exemptions(bk):
    bk.config(limits={"*": {"gpus": 2}, "students": {"booking_hours": 4}}, limit_tiers={"students": ["ada"]})
    held = bk.data("2", "1h")["reservation"]
    err = bk.json("1", "1h").error
    assert err["details"]["rule"] == "limit_gpus"
    assert err["message"] == ("you may hold at most 2 GPUs at once (limit gpus for everyone); from 10:41 to "
                              "11:40 you hold 2 (GPU 0, 1) and this adds 1; it fits if it starts from 11:40")
    assert err["details"]["holding"] == [held["id"]] and err["details"]["fits"] == {"start": "2026-07-13T11:40:00Z"}
    err = bk.json("1", "8h", "-t", "12:00").error
    assert err["details"]["rule"] == "limit_booking_hours" and err["details"]["level"] == "tier"
    assert "of the students tier" in err["message"] and err["details"]["commands"] == [
        "bk 1 4h --start 2026-07-13T12:00:00Z"]
    bk.config(limits={"*": {"gpus": 2}, "students": {"booking_hours": 4}}, limit_tiers={"students": ["ada"]},
              limit_exempt=["ada"])
    bk.ok("1", "1h")
    bk.ok("1", "8h", "-t", "12:00")


def test_a_user_rule_beats_the_tier_and_null_means_no_limit(bk):
    bk.config(limits={"*": {"booking_hours": 1}, "students": {"booking_hours": 2}, "ada": {"booking_hours": None}},
              limit_tiers={"students": ["ada"]})
    bk.ok("1", "9h")


def test_an_edit_may_not_break_a_limit_but_may_shrink_a_booking_over_one(bk):
    bk.config(limits={"*": {"booking_hours": 4}})
    r = bk.data("1", "2h")["reservation"]
    err = bk.json("e", "1", "-d", "6h").error
    assert err["details"]["rule"] == "limit_booking_hours"
    assert err["details"]["commands"] == [f"bk e {r['short_id']} -d 4h"]
    bk.config(limits={"*": {"booking_hours": 1}})           # tightened after it was made
    assert bk.data("e", "1", "-d", "90m")["status"] == "updated"
    assert bk.json("e", "1", "-d", "100m").error["details"]["rule"] == "limit_booking_hours"


def test_the_vram_limit_refuses_a_large_default_share_and_names_the_memory_that_fits(bk):
    bk.sim()                                        # 80 GB GPUs: a one-slot share counts ~39.6 GiB
    bk.config(limits={"*": {"shared_vram_gib": 24}})
    err = bk.json("1", "1h").error
    assert err["details"]["rule"] == "limit_shared_vram" and err["details"]["fits"] == {"mem_mib": 24576}
    assert err["details"]["commands"] == ["bk 1 1h 24g"]
    assert bk.json("1", "1h", "32g").error["details"]["rule"] == "limit_shared_vram"
    bk.ok("1", "1h", "24g")


# ------------------------------------------------------------ advances

def test_a_queued_booking_moves_earlier_when_a_cancellation_frees_room(bk):
    bob = book_as(bk, BOB, BookRequest(4, 2 * H, mode="exclusive"))
    r = bk.ok("1", "1h", "--advance")
    assert "queued: starts at 12:40" in r.out
    assert "advancing: moves earlier on its own if GPUs free up; starts 12:40 at the latest" in r.out
    mine = bk.data("l")["reservations"][0]
    assert mine["advance"] == {"position": 1, "latest_start": iso(SLICE + 2 * H), "after": iso(SLICE),
                               "since": "2026-07-13T10:41:30Z"}
    assert "1 [" in bk.ok("l").out and "(position 1 in line)" in bk.ok("l").out
    cancel_as(bk, BOB, bob.id)                     # bob's write makes room: the move is in its commit
    moved = bk.data("l")["reservations"][0]
    assert (moved["start"], moved["end"], moved["advance"]) == (iso(SLICE), iso(SLICE + H), None)
    assert "moved earlier: now 07-13 10:40–11:40 (was 07-13 12:40–13:40)" in " ".join(bk.ok("n").out.split())
    log = bk.data("lg", "-n", "10")["entries"]
    adv = [e for e in log if e["action"] == "booking_advanced"]
    assert len(adv) == 1 and adv[0]["uid"] == BOB.uid and adv[0]["owner"] == ME.uid
    assert (adv[0]["before"]["start"], adv[0]["after"]["start"]) == (SLICE + 2 * H, SLICE)
    assert "moved earlier on its own, after a change by bob: start 07-13 12:40 → 07-13 10:40" in \
        " ".join(bk.ok("lg").out.split())
    state = bk.service(ME).ledger()
    edit = state.find(moved["id"]).edits[-1]
    assert (edit.extra, edit.actor_uid, edit.before["start"], edit.after["start"]) == (
        {"cause": "booking_advanced"}, BOB.uid, SLICE + 2 * H, SLICE)


def test_the_owner_hears_moved_earlier_from_their_deliverer_even_after_their_own_cancel(tmp_path):
    """The notifier (issue 26) tells of an edit that moved a start earlier
    when someone else made it; an advance is bk's, so it is told also when
    the owner's own cancel made the room, and as moved, not as "can start
    earlier" (it already did)."""
    from test_notify import BOB as NBOB
    from test_notify import T0, World

    from bk.service.requests import CancelRequest as Cancel

    w = World(tmp_path, gpus=1)
    wall = w.book(count=1, duration=3600, mode="exclusive")             # ada's own, now
    bobs = w.book(NBOB, count=1, duration=3600, mode="exclusive")       # bob's, after it
    mine = w.book(count=1, duration=1800, advance=True)                 # ada's, queued after both
    assert mine.start == bobs.end and mine.advance is not None
    d = w.deliverer()
    assert not any("earlier" in x for x in w.at(T0 + 60, d))
    app = w.app()
    app.run("cancel", Cancel(wall.id))                   # ada's own write makes the room
    assert app.ledger().find(mine.id).start == T0
    lines = [x for x in w.at(T0 + 120, d) if "earlier" in x]
    assert lines == [f"booking {mine.short_id} moved earlier: it now starts 08:00 (was 10:00) on GPU 0"], lines
    assert not any("earlier" in x for x in w.at(T0 + 180, d))          # told once


def test_only_advancing_bookings_move_and_never_later(bk):
    bob = book_as(bk, BOB, BookRequest(4, 2 * H, mode="exclusive"))
    plain = bk.data("1", "1h", "--note", "stays")["reservation"]
    adv = book_as(bk, CAROL, BookRequest(4, H, mode="exclusive", advance=True))
    assert parse_iso(plain["start"]) == SLICE + 2 * H and adv.start == SLICE + 2 * H + H
    cancel_as(bk, BOB, bob.id)
    state = bk.service(ME).ledger()
    assert state.find(plain["id"]).start == SLICE + 2 * H             # not advancing: where it was
    # carol's wanted all four GPUs: it moves into the room before ada's, never past it.
    assert (state.find(adv.id).start, state.find(adv.id).end) == (SLICE, SLICE + H)


def test_advance_default_and_no_advance(bk):
    bk.config(advance_default=True)
    book_as(bk, BOB, BookRequest(4, H, mode="exclusive"))
    assert bk.data("1", "30m")["reservation"]["advance"]["latest_start"] == iso(SLICE + H)
    assert bk.data("1", "20m", "--no-advance")["reservation"]["advance"] is None
    r = bk.data("e", "2", "--advance")["reservation"]
    assert r["advance"] is not None
    assert bk.data("e", "2", "--no-advance")["reservation"]["advance"] is None


def _one_gpu_contest(bk, monkeypatch, **config):
    """One GPU of one slot held by bob; carol asks to advance first, ada
    second; dave books without advancing."""
    monkeypatch.setenv("BK_GPU_COUNT", "1")
    bk.config(max_shared_users=1, **config)
    bob = book_as(bk, BOB, BookRequest(1, H))
    carol = book_as(bk, CAROL, BookRequest(1, H, advance=True))
    ada = bk.data("1", "1h", "--advance")["reservation"]
    dave = book_as(bk, DAVE, BookRequest(1, H))
    return bob, carol, ada, dave


def test_first_come_first_served_without_fair_share(bk, monkeypatch):
    bob, carol, ada, dave = _one_gpu_contest(bk, monkeypatch)
    assert [carol.start, parse_iso(ada["start"]), dave.start] == [SLICE + H, SLICE + 2 * H, SLICE + 3 * H]
    cancel_as(bk, BOB, bob.id)
    state = bk.service(ME).ledger()
    assert state.find(carol.id).start == SLICE and state.find(ada["id"]).start == SLICE + H
    assert state.find(dave.id).start == SLICE + 3 * H


def test_fair_share_gives_contested_room_to_the_lighter_user(bk, monkeypatch):
    """carol used 10 GPU-hours yesterday, ada 1: with fair share ada's
    booking takes the freed hour though carol asked first; neither moves
    later than it was and dave's, not advancing, stays."""
    from bk.core.usage import MinuteRecord, Use
    from bk.store.usage import UsageStore

    bk.config(max_shared_users=1, fair_share=True)
    app = bk.service(ME)
    yesterday = SLICE - SLICE % 86400 - 86400
    UsageStore.for_settings(app.settings).append(
        [MinuteRecord(yesterday + 3600 * i, 0, 3600, uses=(Use(CAROL.uid, None, booked_s=3600),))
         for i in range(10)] + [MinuteRecord(yesterday + 3600 * 12, 0, 3600, uses=(Use(ME.uid, None, booked_s=3600),))],
        now=SLICE)
    bob, carol, ada, dave = _one_gpu_contest(bk, monkeypatch, fair_share=True)
    assert bk.data("l")["reservations"][0]["advance"]["position"] == 1       # ada is first in line
    cancel_as(bk, BOB, bob.id)
    state = bk.service(ME).ledger()
    assert state.find(ada["id"]).start == SLICE and state.find(carol.id).start == SLICE + H
    assert state.find(dave.id).start == SLICE + 3 * H
    users = {u["user"]: u["fair_share"] for u in bk.data("u", "users")["users"]}
    assert users["carol"]["share"] == pytest.approx(10 / 11, abs=1e-3) and users["ada"]["decayed_gpu_hours"] > 0
    assert "SHARE" in bk.ok("u", "users").out


# ------------------------------------------------------------ shared bookings

def test_a_shared_booking_is_usable_by_the_named_users_and_changed_only_by_its_owner(bk):
    bk.sim()
    r = bk.data("1", "2h", "-g", "2", "--with", "bob")["reservation"]
    assert r["shared_with"] == ["bob"]
    # bob's train.py on GPU 2 (SIM_GPUS) runs under ada's booking: ok, not unreserved.
    procs = {p["pid"]: p for g in bk.data("st")["gpus"] for p in g["processes"] or ()}
    assert procs[5151]["state"] == "ok"
    seen = run_as(bk, BOB, "--json", "l")
    rows = json.loads(seen.out)["data"]["reservations"]
    assert [(x["id"], x["number"], x["mine"], x["shared_with_you"]) for x in rows] == [(r["id"], None, False, True)]
    assert f"ada's, shared with you: run on it with bk run -r {r['short_id']}" in run_as(bk, BOB, "l").out
    from bk.service import RunTargetRequest

    app_bob = bk.service(BOB)
    res = app_bob.run("run_target", RunTargetRequest(r["short_id"])).reservation
    assert res.id == r["id"]
    app_carol = bk.service(CAROL)
    with pytest.raises(PermissionDenied):
        app_carol.run("run_target", RunTargetRequest(r["short_id"]))
    with pytest.raises(PermissionDenied):
        app_bob.run("edit", EditRequest(r["id"], duration=H))
    with pytest.raises(PermissionDenied):
        app_bob.run("cancel", CancelRequest(r["id"]))
    assert bk.data("e", "1", "--with", "none")["reservation"]["shared_with"] == []
    procs = {p["pid"]: p for g in bk.data("st")["gpus"] for p in g["processes"] or ()}
    assert procs[5151]["state"] == "unreserved"
    assert "edited by ada: shared_with bob → nobody" in bk.ok("lg").out


def test_bk_t_shows_a_booking_shared_through_a_group_as_yours_to_use(bk):
    """bob's booking shared with @nlp: carol (a member) sees it in bk t
    marked "+" and drawn as hers; dave (not a member) sees it as bob's."""
    from bk.tui import keys, render, theme
    from bk.tui.world import load_world

    r = book_as(bk, BOB, BookRequest(1, 2 * H, shared_with="@nlp"))

    def row_of(actor):
        w = load_world(bk.service(actor))
        f = render.render(keys.ViewState(width=100, height=30), w, (100, 30), theme.THEMES["dark"],
                          theme.UNICODE)
        line = next(ln for ln in f.lines if " bob " in (t := "".join(t for t, _ in ln)) and r.id[:4] in t)
        return w, "".join(t for t, _ in line), {k for _, k in line}

    mine = theme.THEMES["dark"].style("row_mine")
    w, text, styles = row_of(CAROL)
    assert w.usable == {r.id} and text.lstrip().startswith("+")
    assert mine in styles, styles
    w, text, styles = row_of(DAVE)
    assert w.usable == frozenset() and not text.lstrip().startswith("+")
    assert mine not in styles, styles


def test_with_refuses_what_is_not_a_name(bk):
    bk.ok("1", "1h")
    err = bk.json("e", "1", "--with", "bob;rm").error
    assert err["code"] == "invalid_input" and "--with" in err["message"]
    err = bk.json("e", "1", "--with", "bobb,@nlp").error          # a typo shares with nobody
    assert err["code"] == "invalid_input" and err["message"] == (
        "--with names bobb, which this server does not know")
    assert bk.data("e", "1", "--with", "@nlp")["reservation"]["shared_with"] == ["@nlp"]


def test_a_sharers_work_is_credited_to_them_under_the_booking():
    """The usage fold: bob's process on ada's shared booking is bob's active
    time under ada's booking; its booked time stays ada's, and the day's
    summary keeps ada as the booking's owner."""
    from bk.core.models import GpuInfo, GpuProcess, Reservation
    from bk.core.sharing import expand
    from bk.core.telemetry import Snapshot, attribute_all
    from bk.core.usage import Folder, summarise

    t0 = SLICE
    r = Reservation("r" * 36, ME.uid, "ada", "shared", (0,), 1, t0, t0 + H, t0, shared_with=("bob",))
    sharers = {r.id: frozenset({BOB.uid})}
    folder = Folder()
    for i in range(31):
        snap = Snapshot(gpus=[GpuInfo(0, "GPU-0", "sim", util=90, processes=[
            GpuProcess(99, sm=80, uid=BOB.uid, user="bob")])], taken_at=t0 + 2 * i, source="sim")
        atts = attribute_all(snap, expand([r], sharers), t0 + 2 * i)
        assert atts[(0, 99)].state == "ok"
        folder.add(t0 + 2 * i, snap, atts, [r], sharers=sharers)
    recs = folder.flush()
    uses = {(u.uid, u.reservation): u for rec in recs for u in rec.uses}
    assert uses[(BOB.uid, r.id)].active_s > 0 and uses[(BOB.uid, r.id)].booked_s == 0
    assert uses[(ME.uid, r.id)].booked_s > 0 and uses[(ME.uid, r.id)].active_s == 0
    assert summarise(recs).owners[r.id] == ME.uid
