"""The everyday words read without argparse: a shortcut that cannot disagree.

Importing argparse (and the ``re`` and gettext it brings) costs more than
``bk l`` does on a small ledger, so the everyday command lines (``l``, ``st``,
``n``, ``g``, a booking, ``d``, ``e``) are read here.  The shortcut takes
only the exact forms it fully understands, the ones where argparse's answer
is a plain function of the words:

- the command word and options of that command only, spelled out in full
  (``--dry-run``, never the ``--dry`` argparse would also take), each flag on
  its own (``-q -y``, not ``-qy``), a value after its option or after ``=``
  on a long one (``--note=x``, never ``-m=2g``);
- ``--json`` anywhere, options before the command word (``bk -q 1 30m``:
  argparse's hoisting, see ``bk.cli.app._split_leading``), ``-d -15m``;
- values as argparse would store them: a choice among its choices, ``-n`` and
  ``-s`` as whole numbers of ASCII digits, converted by the same functions.

Anything else returns None and goes to argparse untouched: help, any unknown
word or option, ``--``, a value that starts with ``-``, a missing or extra
word, a malformed number, two options that exclude each other.  What the
shortcut does accept it turns into the namespace argparse would (the same
attributes with the same values, the same ``handler``), and the command runs
through ``bk.cli.dispatch`` as it would after argparse.  So the two differ
only in time taken: ``tests/test_cli_fast.py`` checks every form the
grammar takes against ``bk.cli.app.parse_argv``, and that what it refuses
argparse refuses or reads some other way.
"""

from __future__ import annotations

import os
import sys

from bk.core.errors import BkError

# What an option does: a flag (store_true), a value (any word not starting
# with "-"), a whole number (converted as the command's argparse type), or
# one of a few words.
FLAG, VALUE, LIMIT, POSITIVE = "flag", "value", "limit", "positive"
SHARED_OR_EXCLUSIVE = ("shared", "exclusive")

_PLACE = {"-g": "gpu", "--gpu": "gpu", "-e": "exclude", "--exclude": "exclude", "-m": "mem", "--mem": "mem"}
_WRITE = {"--op-id": ("op_id", VALUE), "--dry-run": ("dry_run", FLAG)}
_FAIR = {"--advance": ("advance", FLAG), "--no-advance": ("no_advance", FLAG),
         "--with": ("shared_with", VALUE)}
_START = {"-t": ("at", VALUE), "--at": ("at", VALUE), "--start": ("start", VALUE)}


def _options(*tables, **extra) -> dict:
    out = {}
    for t in tables:
        out.update({k: v if isinstance(v, tuple) else (v, VALUE) for k, v in t.items()})
    out.update(extra)
    return out


_DUR = {"-d": ("duration", VALUE), "--duration": ("duration", VALUE)}
_SHARE = {"-s": ("share", POSITIVE), "--share": ("share", POSITIVE)}
_BOOK = _options(_DUR, _PLACE, _SHARE, _START, _WRITE, _FAIR, {
    "--queue": ("queue", FLAG), "--note": ("note", VALUE), "--idle-release": ("idle_release", VALUE),
    "-y": ("yes", FLAG), "--yes": ("yes", FLAG), "-q": ("quiet", FLAG), "--quiet": ("quiet", FLAG),
    "--again": ("again", FLAG), "-v": ("verbose", FLAG), "--verbose": ("verbose", FLAG)})


class Grammar:
    """One command's words: ``module`` holds its handler; ``positionals``:
    the names of its words ("count", "words", "ref") and how many it takes."""

    def __init__(self, module: str, handler: str, command: str, options: dict, *,
                 positionals: tuple[str, ...] = (), least: int = 0, most: int = 0, defaults=None,
                 exclusive: tuple[str, ...] = ()):
        self.module, self.handler, self.command, self.options = module, handler, command, options
        self.positionals, self.least, self.most = positionals, least, most
        self.defaults = defaults or (lambda m: {})
        self.exclusive = exclusive


def _book_defaults(mode):
    return lambda m: {"mode": mode, "takes_command": True, "attached": None}


def _book(command: str, mode: str) -> Grammar:
    return Grammar("bk.cli.cmd_book", "run", command, _BOOK, positionals=("count", "words"),
                   least=1, most=-1, defaults=_book_defaults(mode))


_LIST = Grammar("bk.cli.cmd_list", "run", "list",
                {"--all": ("all", FLAG), "--history": ("history", FLAG),
                 "-n": ("limit", LIMIT), "--limit": ("limit", LIMIT)},
                defaults=lambda m: {"limit": m.DEFAULT_LIMIT}, exclusive=("all", "history"))
_STATUS = Grammar("bk.cli.cmd_status", "run", "status", {"-v": ("verbose", FLAG), "--verbose": ("verbose", FLAG)})
_NOTICES = Grammar("bk.cli.cmd_notices", "run", "notices", {"--all": ("all", FLAG)})
_GPU = Grammar("bk.cli.cmd_slots", "run_gpu", "gpu",
               _options(_DUR, _PLACE, _SHARE, {"--mode": ("mode", SHARED_OR_EXCLUSIVE)}),
               positionals=("count",), most=1,
               defaults=lambda m: {"duration": m.common.DEFAULT_DURATION, "mode": "shared"})
_CANCEL = Grammar("bk.cli.cmd_cancel", "run", "cancel",
                  _options(_WRITE, {"-y": ("yes", FLAG), "--yes": ("yes", FLAG),
                                    "-q": ("quiet", FLAG), "--quiet": ("quiet", FLAG)}),
                  positionals=("ref",), least=1, most=1)
_EDIT = Grammar("bk.cli.cmd_edit", "run", "edit", _options(_DUR, _START, _PLACE, _SHARE, _WRITE, _FAIR, {
    "--mode": ("mode", SHARED_OR_EXCLUSIVE), "--queue": ("queue", FLAG), "--note": ("note", VALUE),
    "--idle-release": ("idle_release", VALUE), "--keep-for": ("keep_for", VALUE),
    "-q": ("quiet", FLAG), "--quiet": ("quiet", FLAG)}), positionals=("ref",), least=1, most=1,
    defaults=lambda m: {"mode": None})

WORDS: dict[str, Grammar] = {
    **dict.fromkeys(("l", "ls", "list"), _LIST), **dict.fromkeys(("st", "status"), _STATUS),
    **dict.fromkeys(("n", "notices"), _NOTICES), **dict.fromkeys(("g", "gpu"), _GPU),
    **dict.fromkeys(("d", "del", "rm", "cancel"), _CANCEL), **dict.fromkeys(("e", "edit"), _EDIT),
    "book": _book("book", "shared"), "s": _book("book", "shared"),
    "x": _book("exclusive", "exclusive"), "exclusive": _book("exclusive", "exclusive"),
}

# Options of some command that take a value (``bk.cli.app._value_options``):
# typed before the command word, the word after such an option is its value.
# The ones the shortcut knows before a command word; tests/test_cli_fast.py
# checks this set, and that every flag here takes no value in any command.
LEADING_VALUE = frozenset({"-d", "--duration", "-g", "--gpu", "-e", "--exclude", "-m", "--mem", "-s",
                           "--share", "-t", "--at", "--start", "--op-id", "--with", "--note",
                           "--idle-release", "--keep-for", "--mode", "-n", "--limit"})
# "--quiet" takes a value in some command, so it is not here: ``bk --quiet 1 30m``
# goes to argparse, which reads it its own way.
LEADING_FLAGS = frozenset({"--dry-run", "--advance", "--no-advance", "--queue", "-y", "--yes", "-q",
                           "--again", "-v", "--verbose", "--all", "--history"})


class Namespace:
    """What ``argparse.Namespace`` is to a handler: attributes (and equality
    by them, as argparse's has)."""

    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)

    def __eq__(self, other):
        return vars(self) == vars(other)

    def __repr__(self) -> str:
        return f"Namespace({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


def parse(argv: list[str]):
    """``(namespace, as_json, words)`` for a command line the shortcut reads,
    as ``bk.cli.app.run`` would have (words: argv without ``--json``, after
    ``normalise``); None for any other."""
    if "--" in argv:
        return None
    words = [a for a in argv if a != "--json"]
    as_json = len(words) < len(argv)
    lead = []
    while words and words[0][:1] == "-":           # options before the command word
        opt = words[0]
        if opt in LEADING_FLAGS:
            lead.append(words.pop(0))
        elif opt in LEADING_VALUE and len(words) > 1 and words[1][:1] != "-":
            lead += [words.pop(0), words.pop(0)]
        else:
            return None
    if not words:
        return None
    word = words[0]
    if word.isdigit():
        word, rest = "book", words
    else:
        rest = words[1:]
    grammar = WORDS.get(word)
    if grammar is None:
        return None
    hoisted = {o for o in lead if o[:1] == "-"}
    if any(o not in grammar.options for o in hoisted):
        return None                     # argparse says which command takes it
    got = _read(grammar, rest + lead)
    if got is None:
        return None
    # __import__, not importlib.import_module: the importlib package (and the
    # warnings module it imports) is more to load than the command module.
    __import__(grammar.module)
    module = sys.modules[grammar.module]
    ns = {"json": False, "command_word": word}
    for dest, _kind in grammar.options.values():
        ns.setdefault(dest, False if _kind == FLAG else None)
    for name in grammar.positionals:
        ns[name] = [] if name == "words" else None
    ns.update(grammar.defaults(module))
    ns.update({"handler": getattr(module, grammar.handler), "command": grammar.command})
    values, positionals = got
    for dest, (kind, raw) in values.items():
        if kind in (LIMIT, POSITIVE):
            convert = module._limit if kind == LIMIT else module.common.positive_int
            try:
                raw = convert(raw)
            except BkError:             # argparse refuses it, in its own words
                return None
        ns[dest] = raw
    if grammar.positionals:
        ns[grammar.positionals[0]] = positionals[0] if positionals else None
        if len(grammar.positionals) > 1:
            ns[grammar.positionals[1]] = positionals[1:]
    return Namespace(**ns), as_json, _glued([word, *rest, *lead])


def _read(grammar: Grammar, words: list[str]):
    """``({dest: (kind, raw value)}, positionals)``, or None."""
    values, positionals, i = {}, [], 0
    while i < len(words):
        w = words[i]
        i += 1
        if w[:1] != "-":
            positionals.append(w)
            continue
        opt, eq, inline = w.partition("=")
        spec = grammar.options.get(opt)
        if spec is None or (eq and (spec[1] == FLAG or not opt.startswith("--"))):
            return None
        dest, kind = spec
        if kind == FLAG:
            values[dest] = (FLAG, True)
            continue
        if eq:
            raw = inline
        elif i < len(words):
            raw = words[i]
            i += 1
            signed = dest == "duration" and raw[:1] == "-" and raw[1:2].isdigit() and raw[1:2].isascii()
            if raw[:1] == "-" and not signed:
                return None
        else:
            return None
        if not _valid(kind, raw):
            return None
        values[dest] = (kind, raw)
    if not grammar.least <= len(positionals) <= (grammar.most if grammar.most >= 0 else len(positionals)):
        return None
    if grammar.exclusive and all(values.get(d, (None, False))[1] is True for d in grammar.exclusive):
        return None
    return values, positionals


def _valid(kind, raw: str) -> bool:
    if kind in (LIMIT, POSITIVE):
        return raw.isdigit() and raw.isascii()
    if isinstance(kind, tuple):
        return raw in kind
    return True


def _glued(words: list[str]) -> list[str]:
    """``-d -15m`` -> ``-d-15m``, as ``bk.cli.app.normalise`` writes it."""
    out, i = [], 0
    while i < len(words):
        a = words[i]
        if a in ("-d", "--duration") and i + 1 < len(words) and words[i + 1][:1] == "-":
            out.append(f"{a}={words[i + 1]}" if a.startswith("--") else f"{a}{words[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def run(argv: list[str]) -> int | None:
    """Run ``argv`` if the shortcut reads it: its exit status; None otherwise
    (nothing done, nothing printed: argparse takes it from the start)."""
    got = parse(argv)
    if got is None:
        return None
    args, as_json, words = got
    from bk.cli.dispatch import Context, failure, finish, stdin_is_tty
    from bk.cli.render import Term, setup_streams

    env = dict(os.environ)
    setup_streams()
    ctx = None
    try:
        ctx = Context(env=env, json=as_json, argv=words, term=Term.detect(env=env), stdin_tty=stdin_is_tty())
        return finish(args, ctx)
    except (Exception, KeyboardInterrupt) as exc:
        return failure(exc, command=args.command, args=args, ctx=ctx, as_json=as_json, env=env)
