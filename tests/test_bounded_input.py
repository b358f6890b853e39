"""Bounded input, checked before any work, and one text rule everywhere.

Every size a user supplies (GPU ranges, counts, words, notes, op-ids) is
checked against its limit first; every text field (note, reason, notice
text, op-id, refs) is valid Unicode with no control characters or bidi
overrides, and the SAME rule holds in the builders, in private mode (the
local gateway validates a typed request against its operation's field
spec) and in the broker (the spec's decoder).  A reply that cannot be
encoded after a commit is made impossible (``protocol.encode`` escapes
lone surrogates), and readers of a ledger that already holds such text do
not crash before display.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers_cli import NOW_ISO, bk_fixture
from helpers_cli import ROOT as ROOT_ACTOR

from bk.core.errors import InvalidInput
from bk.core.record import replace
from bk.ipc import protocol
from bk.service import builders, fields, fieldspecs, ops
from bk.service.requests import (
    AuditRequest,
    BookRequest,
    CancelRequest,
    EditRequest,
    NoticeArchiveRequest,
    NoticeRequest,
)

REPO = Path(__file__).resolve().parents[1]

# Text the rule refuses: a lone surrogate (JSON's \ud800, or argv bytes that
# are not UTF-8 via surrogateescape), C0 (ESC, newline), C1 (NEL) and a bidi
# override.
BAD_TEXT = {"surrogate": "x\ud800y", "escaped_byte": "a\udcffb", "escape": "x\x1b[31my",
            "newline": "x\ny", "c1": "x\x85y", "bidi": "x\u202ey"}


@pytest.fixture
def bk(monkeypatch, capsys):
    yield from bk_fixture(monkeypatch, capsys)


# ------------------------------------------------------------- the one rule

@pytest.mark.parametrize("kind", sorted(BAD_TEXT))
def test_check_text_refuses_each_kind_of_bad_text(kind):
    with pytest.raises(InvalidInput) as e:
        fields.check_text(BAD_TEXT[kind], "--note", max_len=100)
    assert e.value.message.startswith("--note ")


def test_check_text_lengths_and_patterns():
    assert fields.check_text("héllo wörld ✓", "--note", max_len=100) == "héllo wörld ✓"
    with pytest.raises(InvalidInput, match="too long"):
        fields.check_text("x" * 101, "--note", max_len=100)
    with pytest.raises(InvalidInput, match="must be a string"):
        fields.check_text(b"x", "--note", max_len=100)


@pytest.mark.parametrize("good", ["a", "retry-7", "job.42:step_3", "A" * fieldspecs.MAX_OP_ID,
                                  "3f6c0a1e-0000-4000-8000-000000000000"])
def test_op_id_alphabet_accepts(good):
    assert builders.op_id_text(good) == good


@pytest.mark.parametrize("bad", ["", "A" * (fieldspecs.MAX_OP_ID + 1), "a b", "a/b", "é", "x\ud800", "a\x00"])
def test_op_id_alphabet_refuses(bad):
    with pytest.raises(InvalidInput, match="--op-id"):
        builders.op_id_text(bad)
    with pytest.raises(InvalidInput, match="op_id"):      # the broker's decoder: the same rule
        ops.get("book").decode({"count": 1, "duration": 1800, "op_id": bad})


def test_note_maximum_is_the_specs_and_the_same_in_builder_and_decoder():
    ok = "n" * fieldspecs.MAX_NOTE
    assert builders.note_text(ok) == ok
    with pytest.raises(InvalidInput, match="--note is too long"):
        builders.note_text(ok + "n")
    with pytest.raises(InvalidInput, match="too long"):
        ops.get("book").decode({"count": 1, "duration": 1800, "note": ok + "n"})


# ------------------------------------------------------------- sizes before work

class _Policy:
    slot_minutes, gpu_count = 5, 4


def test_a_huge_gpu_range_is_refused_by_its_ends_not_expanded():
    t0 = time.monotonic()
    for flag in ("-g", "-e"):
        with pytest.raises(InvalidInput) as e:
            builders.book_request(count_=1, duration_="30m", policy=_Policy, now=0, tz=None,
                                  **{"gpus" if flag == "-g" else "exclude": "0-99999999"})
        assert e.value.message == "no GPU 4-99999999: this server has GPUs 0-3"
    with pytest.raises(InvalidInput, match="no GPU 4-" + "9" * 150):
        builders.gpu_list("0-" + "9" * 150, "-g", 4)
    with pytest.raises(InvalidInput, match="too long"):
        builders.gpu_list("0-" + "9" * 5000, "-g", 4)
    with pytest.raises(InvalidInput, match="^no GPU 7: this server has GPUs 0-3$"):
        builders.gpu_list("0,7", "-g", 4)
    with pytest.raises(InvalidInput, match="^no GPU 4: this server has GPUs 0-3$"):
        builders.gpu_list("3-4", "-g", 4)
    with pytest.raises(InvalidInput, match="GPU indices are 0-63"):
        builders.gpu_list("0-99999999", "-g")          # the policy unknown: the wire's bound
    with pytest.raises(InvalidInput, match="no GPU 9"):
        builders.gpu_list([0, 9], "-g", 4)
    assert builders.gpu_list("0-3", "-g", 4) == (0, 1, 2, 3)
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("word", ["9" * 5000, "65", "0", "-1", "٣"])
def test_gpu_counts_are_bounded_without_converting_huge_numbers(word):
    with pytest.raises(InvalidInput, match="GPU count"):
        builders.count(word)


def _bk_limited(pyz: Path, tmp: Path, *argv: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update(BK_DATA_DIR=str(tmp / "data"), BK_GPU_COUNT="4", BK_NOW=NOW_ISO, TZ="UTC",
               HOME=str(tmp), XDG_CONFIG_HOME=str(tmp / "config"), XDG_STATE_HOME=str(tmp / "state"),
               XDG_CACHE_HOME=str(tmp / "cache"), NO_COLOR="1", LANG="C.UTF-8")

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    t0 = time.monotonic()
    p = subprocess.run([sys.executable, str(pyz), *argv], env=env, capture_output=True, timeout=60,
                       preexec_fn=limit, stdin=subprocess.DEVNULL)
    return p, time.monotonic() - t0


@pytest.mark.slow
@pytest.mark.parametrize("argv, message", [
    (("1", "30m", "-g", "0-99999999"), "no GPU 4-99999999: this server has GPUs 0-3"),
    (("1", "30m", "-e", "2-99999999999999"), "no GPU 4-99999999999999: this server has GPUs 0-3"),
    (("1", "30m", "-g", "0-" + "9" * 5000), "-g is too long"),
    (("9" * 5000, "30m"), "the GPU count must be 1-64"),
    (("1", "9" * 5000 + "h"), "too long"),
    (("1", "30m", "--note", "n" * 100_000), "--note is too long"),
    (("1", "30m", "--op-id", "k" * 100_000), "--op-id is too long"),
    (("1", "30m", "--op-id", ""), "--op-id is empty"),
])
def test_huge_input_through_the_archive_is_answered_fast_in_bounded_memory(pyz, tmp_path, argv, message):
    p, took = _bk_limited(pyz, tmp_path, *argv)
    err = p.stderr.decode()
    assert p.returncode == 2, (p.returncode, err)
    assert message in err and "Traceback" not in err
    assert took < 5, took
    assert not (tmp_path / "data" / "ledger.json").exists()         # nothing was written


@pytest.mark.slow
def test_bad_text_through_the_archive_is_refused_in_private_mode(pyz, tmp_path):
    # A note that is not UTF-8 reaches Python as a lone surrogate (surrogateescape).
    for argv in ((b"1", b"30m", b"--note", b"a\xffb"), (b"1", b"30m", b"--note", b"x\x1b[31my"),
                 (b"1", b"30m", b"--op-id", b"k\xff"), (b"1", b"30m", b"--op-id", b"a b")):
        p, _ = _bk_limited(pyz, tmp_path, *(a.decode("utf-8", "surrogateescape") for a in argv))
        assert p.returncode == 2, (argv, p.returncode, p.stderr)
        assert b"Traceback" not in p.stderr
    assert not (tmp_path / "data" / "ledger.json").exists()
    p, _ = _bk_limited(pyz, tmp_path, "1", "30m", "--note", "héllo ✓", "--op-id", "job-1:a.b_c")
    assert p.returncode == 0, p.stderr
    p, _ = _bk_limited(pyz, tmp_path, "--json", "l")
    assert json.loads(p.stdout)["data"]["reservations"][0]["note"] == "héllo ✓"


# ------------------------------------------------------------- private mode: the gateway checks

def _write_requests(booked_id: str) -> list[tuple[str, object, str]]:
    """(op, request, field) for every text field of every write, holding ``{}``."""
    return [("book", BookRequest(1, 1800, note="{}"), "note"),
            ("book", BookRequest(1, 1800, op_id="{}"), "op_id"),
            ("edit", EditRequest(booked_id, note="{}"), "note"),
            ("edit", EditRequest(booked_id, duration=3600, op_id="{}"), "op_id"),
            ("edit", EditRequest("{}", duration=3600), "ref"),
            ("cancel", CancelRequest(booked_id, reason="{}"), "reason"),
            ("cancel", CancelRequest(booked_id, op_id="{}"), "op_id"),
            ("cancel", CancelRequest("{}"), "ref"),
            ("notice_publish", NoticeRequest("{}"), "text"),
            ("notice_archive", NoticeArchiveRequest("{}"), "ref")]


def _fill(req, field: str, value: str):
    return replace(req, **{field: value})


@pytest.mark.parametrize("kind", sorted(BAD_TEXT))
def test_private_mode_refuses_bad_text_in_every_field_of_every_operation(bk, kind):
    app = bk.service(ROOT_ACTOR)             # the administrator: notices too
    call = app.call()
    booked = app.run("book", BookRequest(1, 1800, note="ok"), call=call).reservation
    ledger = Path(os.environ["BK_DATA_DIR"]) / "ledger.json"
    before = ledger.read_bytes()
    for name, req, field in _write_requests(booked.id):
        bad = _fill(req, field, BAD_TEXT[kind])
        with pytest.raises(InvalidInput, match=f"field '{field}'"):
            app.run(name, bad, call=app.call())
        with pytest.raises(InvalidInput):            # the broker's decoder says the same
            ops.get(name).decode(json.loads(json.dumps(fields.encode(bad))))
    with pytest.raises(InvalidInput, match="field 'reservation'"):
        app.run("audit", AuditRequest(reservation=BAD_TEXT[kind]), call=app.call())
    assert ledger.read_bytes() == before
    # Other users' reads are unaffected.
    assert bk.ok("l", "--all").code == 0 and bk.ok("lg").code == 0


def test_private_mode_and_the_broker_bound_the_same_numbers(bk):
    app = bk.service()
    for req in (BookRequest(1, 1800, share=65), BookRequest(1, fields.MAX_WIRE_INT + 1),
                BookRequest(1, 1800, pinned=(99,)), AuditRequest(limit=fieldspecs.MAX_AUDIT_LIMIT + 1)):
        name = "audit" if isinstance(req, AuditRequest) else "book"
        with pytest.raises(InvalidInput):
            app.run(name, req, call=app.call())
        with pytest.raises(InvalidInput):
            ops.get(name).decode(fields.encode(req))


# ------------------------------------------------------------- replies and old ledgers

def test_a_reply_holding_a_lone_surrogate_encodes_and_decodes_to_the_same_text():
    env = {"ok": True, "data": {"note": "x\ud800y\\\udfffz", "op_id": "o\udcffp", "t": "é✓"}}
    frame = protocol.encode(env)
    body = frame[protocol.HEADER.size:]
    body.decode("utf-8")                                 # valid UTF-8 on the wire
    assert protocol.decode(body) == env


def test_readers_survive_a_ledger_that_already_holds_bad_text(bk):
    # Made by an older bk (before the rule): a note and an op-id with a lone
    # surrogate and an escape sequence, in the ledger and the audit log.
    bk.ok("1", "30m", "--note", "PLACEHOLDER", "--op-id", "OPID")
    data = Path(os.environ["BK_DATA_DIR"])
    for f in [data / "ledger.json", data / "audit.jsonl", *(data / "backups").iterdir()]:
        f.write_text(f.read_text().replace("PLACEHOLDER", "x\\ud800\\u001b[31my\\u202e")
                     .replace("OPID", "o\\udfffp"))
    assert "\\ud800" in (data / "ledger.json").read_text()
    for argv in (("l", "--all"), ("lg",), ("history", "1")):
        r = bk.json(*argv)
        assert r.code == 0, (argv, r.out, r.err)
        json.loads(r.out)                                # the JSON envelope was written whole
    # and a new booking by another user still works next to it
    assert bk.service().run("book", BookRequest(1, 1800, note="fine"), call=bk.service().call()).status == "created"
