"""COMMAND_WORDS (which module owns which command word) must match what the
modules really register, or a command would build the wrong parser."""

from __future__ import annotations

import importlib

from bk.cli import app


def test_command_words_match_registration():
    parser = app.Parser(prog="bk")
    sub = parser.add_subparsers(dest="w", parser_class=app.Parser)
    for module in app.COMMAND_MODULES:
        before = set(sub.choices)
        importlib.import_module(module).register(sub)
        added = set(sub.choices) - before
        assert added == set(app.COMMAND_WORDS[module]), module


def test_one_word_builds_one_group():
    parser = app.build_parser("l")
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert set(sub.choices) == {"l", "ls", "list"}
    full = app.build_parser("no-such-word")
    sub = next(a for a in full._actions if a.__class__.__name__ == "_SubParsersAction")
    assert set(sub.choices) >= {"l", "book", "help", "admin"}


def _walk(parser, path=()):
    import argparse

    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    yield path, parser
    for a in subs:
        seen = set()
        for name, sp in a.choices.items():
            if id(sp) not in seen:
                seen.add(id(sp))
                yield from _walk(sp, (*path, name))


def test_one_meaning_per_flag_letter():
    meaning: dict[str, set] = {}
    for _, parser in _walk(app.build_parser()):
        for a in parser._actions:
            longs = tuple(o for o in a.option_strings if o.startswith("--"))
            for short in (o for o in a.option_strings if len(o) == 2):
                meaning.setdefault(short, set()).add(longs)
    clashes = {k: v for k, v in meaning.items() if len(v) > 1}
    assert not clashes, clashes
    assert meaning["-g"] == {("--gpu",)} and meaning["-t"] == {("--at",)}


WRITES = {("book",), ("exclusive",), ("edit",), ("cancel",), ("preset", "use"), ("preset", "save"),
          ("preset", "delete"), ("admin", "init"), ("admin", "cancel"), ("admin", "notice", "publish"),
          ("admin", "notice", "archive")}
BOOKING_WRITES = {("book",), ("exclusive",), ("edit",), ("cancel",), ("preset", "use"),
                  ("admin", "cancel")}


def test_every_write_has_dry_run_and_booking_writes_have_op_id():
    found = {}
    for path, parser in _walk(app.build_parser()):
        found[path] = {o for a in parser._actions for o in a.option_strings}
    for path in WRITES:
        assert "--dry-run" in found[path], path
    for path in BOOKING_WRITES:
        assert "--op-id" in found[path], path
