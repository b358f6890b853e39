"""The text rule and the op-id rule through a real broker (real accounts).

The client refuses bad text before it sends anything; a raw client that
sends it anyway (a lone surrogate as JSON's ``\\ud800``, control characters,
a bidi override) in any text field of any operation is refused by the
broker's decoder before anything is committed, and every other user's
reads go on working.
"""

from __future__ import annotations

import pytest
from helpers_broker import connect, frame, needs_root, read_reply, site

pytestmark = [pytest.mark.slow, needs_root, pytest.mark.root]

BAD = ("x\ud800y", "x\x1b[31my", "x\x85y", "x\u202ey", "x\ny")


@pytest.fixture(scope="module")
def srv():
    with site() as s:
        s.users = (s.accounts.user(), s.accounts.user())
        p = s.init()
        assert p.returncode == 0, p.stderr
        s.start_broker()
        yield s


def test_the_client_refuses_bad_op_ids_and_notes_before_sending(srv):
    a, _ = srv.users
    before = srv.ledger_digest() if (srv.data / "ledger.json").exists() else None
    for args in (("--op-id", ""), ("--op-id", "a b"), ("--op-id", "k" * 129), ("--note", "n" * 1001),
                 ("--note", "x\x1b[31my"), ("--note", "a\udcffb")):        # \udcff: the byte 0xff in argv
        p = srv.run(a, "1", "30m", *args)
        assert p.returncode == 2, (args, p.returncode, p.stderr)
        assert "Traceback" not in p.stderr
    assert (srv.ledger_digest() if (srv.data / "ledger.json").exists() else None) == before
    rc, env = srv.run_json(a, "1", "30m", "--op-id", "job-7:a.b_c", "--note", "héllo ✓")
    assert rc == 0, env


def test_bad_text_in_every_field_of_every_operation_is_refused_by_the_broker(srv):
    a, b = srv.users
    rc, env = srv.run_json(b, "1", "30m", "--note", "mine")
    assert rc == 0, env
    rid = env["data"]["reservation"]["id"]
    digest = srv.ledger_digest()
    cases = []
    for bad in BAD:
        cases += [("book", {"count": 1, "duration": 1800, "note": bad}),
                  ("book", {"count": 1, "duration": 1800, "op_id": bad}),
                  ("edit", {"ref": rid, "note": bad}), ("edit", {"ref": rid, "duration": 3600, "op_id": bad}),
                  ("edit", {"ref": bad, "duration": 3600}),
                  ("cancel", {"ref": rid, "reason": bad}), ("cancel", {"ref": rid, "op_id": bad}),
                  ("cancel", {"ref": bad}), ("notice_publish", {"text": bad}),
                  ("notice_archive", {"ref": bad}), ("audit", {"reservation": bad})]
    with connect(srv.socket) as s:          # root: the administrator, so notices reach their decoder
        for op, fields in cases:
            s.sendall(frame({"v": 1, "op": op, "fields": fields}))
            reply = read_reply(s)
            assert reply is not None and reply["ok"] is False, (op, fields, reply)
            assert reply["error"]["code"] == "invalid_input", (op, fields, reply)
    assert srv.ledger_digest() == digest              # nothing committed
    for user in (a, b):
        for args in (("l", "--all"), ("lg",), ("history", rid[:8])):
            p = srv.run(user, *args)
            assert p.returncode == 0, (args, p.returncode, p.stderr)
