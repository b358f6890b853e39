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
