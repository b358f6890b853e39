"""A node's reply is data from another machine (issue 30, item 1; issue 22,
item 7): wrong field types make that node's row ``bad_reply`` while the
other nodes go on, and no text a node sends reaches the terminal raw.

The nodes are ``local`` catalog nodes whose program is a real child
process (tests/helpers_cluster.py): a ``/bin/sh`` fake that answers what
the test wrote, and the built bk.pyz with its own data directory."""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys

import pytest
from helpers_cluster import NOW, FakeNode, good_data, option, real_node, write_catalog
from helpers_text import EVERY, STRICT

from bk.cli import app as cli_app

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the cluster catalog must be root's")

LIAR_ID = "d-" + "1" * 24
GOOD_ID = "d-" + "2" * 24


@pytest.fixture
def base(tmp_path):
    os.chmod(tmp_path, 0o755)
    return tmp_path


def client_env(base, catalog) -> dict:
    return {"PATH": "/usr/bin:/bin", "HOME": str(base), "LANG": "C.UTF-8", "TZ": "UTC", "COLUMNS": "200",
            "BK_CLUSTER_FILE": str(catalog), "BK_DATA_DIR": str(base / "client"), "BK_GPU_COUNT": "1"}


def pyz_bk(pyz, env, *argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(pyz), *argv], capture_output=True, text=True, env=env, timeout=120)


def no_traceback(p) -> None:
    assert p.returncode != 70 and "Traceback" not in p.stderr, (p.returncode, p.stdout, p.stderr)


# ------------------------------------------------- one lying node, one good

LIES = {
    "reservations[0].short_id null": ("list", lambda d: d["reservations"][0].update(short_id=None)),
    "reservations[0].start garbage": ("list", lambda d: d["reservations"][0].update(start="garbage")),
    "reservations[0].gpus '0,1'": ("list", lambda d: d["reservations"][0].update(gpus="0,1")),
    "options[0].start soon": ("slots", lambda d: d["options"][0].update(start="soon")),
}


@pytest.fixture
def two(base, pyz):
    """A good node (the real bk.pyz, one booking on it) and a lying fake
    that is preferred (priority -1)."""
    liar = FakeNode(base, "liar", LIAR_ID)
    good, data = real_node(base, "good", pyz)
    cat = write_catalog(base / "cluster.json", {"liar": liar.entry(priority=-1), "good": good})
    env = client_env(base, cat)
    booked = pyz_bk(pyz, {"PATH": "/usr/bin:/bin", "HOME": str(base), "BK_DATA_DIR": str(data),
                          "BK_GPU_COUNT": "2"}, "1", "1h", "-t", "+3h", "-q")
    assert booked.returncode == 0, booked.stderr
    return liar, env, booked.stdout.strip()


@pytest.mark.parametrize("lie", sorted(LIES))
def test_bk_c_rec_and_book_go_on_past_a_lying_node(pyz, two, lie):
    liar, env, good_booking = two
    kind, mutate = LIES[lie]
    data = good_data()
    mutate(data[kind])
    liar.answer(kind, data[kind])
    field = lie.split()[0]

    if kind == "list":
        # bk c: every node's bookings; the liar's row says what was wrong.
        p = pyz_bk(pyz, env, "c", "--json")
        no_traceback(p)
        out = json.loads(p.stdout)
        states = {n["name"]: n for n in out["data"]["nodes"]}
        assert p.returncode == 1 and states["good"]["state"] == "ok", out
        assert states["liar"]["state"] == "bad_reply" and field in states["liar"]["error"]["message"], out
        assert [r["short_id"] for r in out["data"]["reservations"]] == [good_booking]
        human = pyz_bk(pyz, env, "c")
        no_traceback(human)
        assert human.returncode == 1 and good_booking in human.stdout and "bad_reply" in human.stdout
        return

    # bk c rec: the liar's options are not believed.
    p = pyz_bk(pyz, env, "c", "rec", "1", "30m", "--json")
    no_traceback(p)
    rec = json.loads(p.stdout)["data"]
    rows = {n["name"]: n for n in rec["nodes"]}
    assert p.returncode == 1 and rows["liar"]["state"] == "bad_reply" and field in rows["liar"]["problem"]
    assert rec["best"]["node"] == "good"
    human = pyz_bk(pyz, env, "c", "rec", "1", "30m")
    no_traceback(human)
    assert "bad_reply" in human.stdout and "best: good" in human.stdout

    # bk c N DUR: booked on the good node.
    p = pyz_bk(pyz, env, "c", "1", "30m", "--json")
    no_traceback(p)
    assert p.returncode == 0 and json.loads(p.stdout)["data"]["node"] == "good", p.stdout
    listed = pyz_bk(pyz, env, "@good", "l", "--json")
    assert len(json.loads(listed.stdout)["data"]["reservations"]) == 2


def test_a_lying_write_reply_is_a_lost_reply_never_a_crash(pyz, two):
    """The liar is the best node and its options are good, but its
    booking reply is a lie: the client asks the op-id (not found here),
    sends once more, and then says the outcome is unknown, by op-id."""
    liar, env, _ = two
    data = good_data()
    data["write"]["reservation"]["end"] = "2000-01-01T00:00:00Z"      # ends before it starts
    liar.answer("write", data["write"])
    liar.answer("slots", {"options": [option(start=NOW - 3600)]})       # earlier than any real option
    p = pyz_bk(pyz, env, "c", "1", "30m", "--json")
    no_traceback(p)
    err = json.loads(p.stdout)["error"]
    assert p.returncode == 69 and err["details"]["state"] == "outcome_unknown", err
    assert "reservation.end" in err["message"] and "--op-id" in err["hint"]


# ------------------------------------------------------------- fuzz

WRONG = [None, "garbage", "0,1", -1, 1 << 40, 1.5, True, [], {}, ["x"], {"a": 1}, "2026-13-45T99:00:00Z"]


def _paths(doc, prefix=()):
    """Every field path of ``doc`` (objects and lists, one level of list items)."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list) and doc:
        yield (*prefix, 0)
        yield from _paths(doc[0], (*prefix, 0))


def _set(doc, path, value):
    for k in path[:-1]:
        doc = doc[k]
    doc[path[-1]] = value


@pytest.fixture
def fakes(base):
    liar, good = FakeNode(base, "liar", LIAR_ID), FakeNode(base, "good", GOOD_ID)
    cat = write_catalog(base / "cluster.json", {"liar": liar.entry(priority=-1), "good": good.entry()})
    return liar, good, client_env(base, cat)


def _run(capsys, env, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli_app.run(list(argv), env)
    out, err = capsys.readouterr()
    return code, out, err


CASES = [("list", ("c",)), ("slots", ("c", "rec", "1", "30m")), ("write", ("c", "1", "30m")),
         ("worker", ("c", "check")), ("op", ("c", "1", "30m", "--op-id", "c-fuzz"))]


@pytest.mark.parametrize("kind,argv", CASES, ids=[c[0] for c in CASES])
def test_every_field_of_a_reply_with_every_wrong_type(capsys, fakes, kind, argv):
    """Each field of a good reply replaced by each value of another type
    (a seeded sample: BK_FUZZ_SEED and BK_FUZZ_CASES choose it; the seed is
    in every failure): never exit 70, the good node
    always answers, the liar is either believed (the value fits) or
    ``bad_reply``, and both renderings work."""
    liar, good, env = fakes
    seed = int(os.environ.get("BK_FUZZ_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    paths = list(_paths(good_data()[kind]))
    cases = [(p, w) for p in paths for w in WRONG]
    rng.shuffle(cases)
    for path, wrong in cases[:int(os.environ.get("BK_FUZZ_CASES", 40))]:
        data = copy.deepcopy(good_data()[kind])
        _set(data, path, wrong)
        liar.answer(kind, data)
        for as_json in (True, False):
            code, out, err = _run(capsys, env, *argv, *(["--json"] if as_json else []))
            where = f"seed {seed}: {kind} {'.'.join(map(str, path))} = {wrong!r} (json={as_json})"
            assert code != 70 and "Traceback" not in err, f"{where}: {code} {out} {err}"
            if as_json:
                doc = json.loads(out)
                nodes = (doc.get("data") or {}).get("nodes") or (doc.get("data") or {}).get(
                    "recommendation", {}).get("nodes") or []
                states = {n["name"]: n["state"] for n in nodes}
                if states:
                    assert states.get("good") in ("ok", "disabled"), f"{where}: {states}"
                    # No option at all is believed as the node's refusal, the
                    # way bk slots refuses it (a conflict: state error).
                    empty = kind == "slots" and list(path) == ["options"] and wrong == []
                    assert states.get("liar") in ("ok", "bad_reply", *(("error",) if empty else ())), \
                        f"{where}: {states}"
    liar.answer(kind, good_data()[kind])


def test_the_wrapper_and_identity_fields_are_checked_too(capsys, fakes):
    liar, good, env = fakes
    for field, wrong in (("now_epoch", "soon"), ("capabilities", "node.v1"), ("hostname", 7), ("id", None)):
        liar.answer("list", good_data()["list"], identity={**liar.identity, field: wrong})
        code, out, err = _run(capsys, env, "c", "--json")
        states = {n["name"]: n["state"] for n in json.loads(out)["data"]["nodes"]}
        assert code == 1 and states["good"] == "ok", out
        assert states["liar"] == ("wrong_identity" if field == "id" else "bad_reply"), (field, states)
    liar.raw("list", {"schema": "gpubk.v1", "command": "cluster node", "ok": False, "warnings": [],
                      "error": "not an object"})
    code, out, err = _run(capsys, env, "c", "--json")
    assert code == 1 and {n["name"]: n["state"] for n in json.loads(out)["data"]["nodes"]}["liar"] == "bad_reply"
    liar.answer("list", good_data()["list"], warnings=[{"not": "text"}])
    code, out, err = _run(capsys, env, "c", "--json")
    assert {n["name"]: n["state"] for n in json.loads(out)["data"]["nodes"]}["liar"] == "bad_reply"


def test_fields_the_client_does_not_know_are_not_passed_on(capsys, fakes):
    liar, good, env = fakes
    data = good_data()["list"]
    data["reservations"][0]["smuggled"] = EVERY
    liar.answer("list", data)
    code, out, err = _run(capsys, env, "c", "--json")
    assert code == 0 and "smuggled" not in out


# ------------------------------------------------------------- display

def test_at_node_shows_a_nodes_text_and_stderr_escaped_with_its_lines(pyz, fakes):
    liar, good, env = fakes
    liar.text(f"line one {EVERY}\nline two\n", f"warning: {EVERY}\nsecond\n", 3)
    p = pyz_bk(pyz, env, "@liar", "l")
    assert p.returncode == 3, p.stderr
    assert not STRICT.search(p.stdout) and not STRICT.search(p.stderr), (p.stdout, p.stderr)
    assert p.stdout.splitlines()[1] == "line two" and p.stderr.splitlines()[1] == "second"
    for shown in ("\\x1b]52;c;", "\\x1b]8;;http", "\\x1b[8m", "\\u202e", "\\u200b", "\\x9b", "\\r"):
        assert shown in p.stdout and shown in p.stderr, shown


def test_at_node_write_confirmation_and_quiet_id_are_escaped(pyz, fakes):
    liar, good, env = fakes
    data = good_data()["write"]
    data["status"] = "created\x1b]0;owned\x07"
    data["reservation"]["short_id"] = "ab\x1b[2J\u202ecd"
    liar.answer("write", data, warnings=[f"node says {EVERY}"])
    for argv in (("@liar", "1", "30m"), ("@liar", "1", "30m", "-q"), ("c", "e", "liar/ab", "-d", "+1h"),
                 ("c", "d", "liar/ab"), ("c", "d", "liar/ab", "-y"), ("c", "1", "30m")):
        p = pyz_bk(pyz, env, *argv)
        assert p.returncode == 0, (argv, p.stdout, p.stderr)
        assert "ab\\x1b[2J\\u202ecd" in p.stdout, (argv, p.stdout)
        assert not STRICT.search(p.stdout + p.stderr), (argv, p.stdout, p.stderr)


def test_cluster_views_escape_what_nodes_say(pyz, fakes):
    """Names, notes, hostnames, problems and errors from a node, in bk c,
    bk c check, bk c rec and bk c probe."""
    liar, good, env = fakes
    data = good_data()
    data["list"]["reservations"][0].update(user="mal" + EVERY, note=EVERY)
    liar.answer("list", data["list"])
    liar.identity["hostname"] = "host" + EVERY
    liar.answer_all({"worker": data["worker"]})
    liar.answer("slots", error={"code": "conflict", "message": "refused " + EVERY, "hint": "try " + EVERY})
    good.answer("list", error={"code": "unavailable", "message": "broker down " + EVERY})
    for argv in (("c",), ("c", "check"), ("c", "rec", "1", "30m"),
                 ("c", "probe", "x", "local", "--remote-command", f"/bin/sh {liar.script}")):
        p = pyz_bk(pyz, env, *argv)
        no_traceback(p)
        assert not STRICT.search(p.stdout + p.stderr), (argv, p.stdout, p.stderr)
        assert "\\x1b" in p.stdout + p.stderr, (argv, p.stdout, p.stderr)
