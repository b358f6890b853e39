"""Guided flows: ``bk a`` (a booking, one question at a time) and ``bk e ID``
without flags (an edit the same way).

Both are built on one small question engine, ``Dialog``: a list of
``Question`` objects, each with a parser that turns the typed answer into a
value or raises ``BkError`` with the explanation.  The engine knows the
conversation words: Enter takes the ``[default]``, ``back`` returns to the
previous question, ``cancel`` (or Ctrl-D) leaves with nothing changed, ``?``
explains the question.  A question's text may be computed from the answers
so far (the preview before the confirmation); if computing it fails, the
error is shown and the user is taken back to the question whose answer
caused it (the question's ``blame`` names it; else the one asked last).
The write after the confirmation can still be refused (another booking took
the time meanwhile, the clock passed the start): ``Dialog.converse`` shows
that error too and asks the blamed question again, with every other answer
kept, instead of ending the dialog.

A flow never books by itself.  Its answers are typed values (seconds, MiB,
a resolved start, GPU tuples); it hands them to the request builders
(``bk.service.builders``) that ``bk N DUR`` and ``bk e ID`` use for their
words, makes the same service call, and shows the result with the same
renderer (``cmd_book.book_output``, ``cmd_edit.edit_output``), so the result
looks exactly like the command's own.  Only the line to type next time is
written out as words, for the person to read.

The engine reads through ``ask(prompt) -> str`` and writes through
``say(text)``: at a terminal these are ``input()`` (with readline editing
when available) and stdout; tests pass plain streams.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from bk.cli import cmd_book, common
from bk.cli.render import Output, safe_lines
from bk.core import timegrid
from bk.core.errors import BkError, Conflict, InvalidInput, PolicyRefused
from bk.core.models import EXCLUSIVE, SHARED
from bk.service import builders

BACK_WORDS = ("back", "b")
CANCEL_WORDS = ("cancel", "c", "quit", "q")
HELP_WORDS = ("?", "help")
YES = ("y", "yes")
NO = ("n", "no")
CANCELLED_TEXT = "cancelled, nothing booked"
# The guided edit's answer "forget the memory figure"; builders.edit_request
# reads it (one of its CLEAR_MEM_WORDS) as ``-m none`` on the command line.
CLEAR_MEM = "none"
# Refusals that another answer can cure; any other error (busy, I/O, not
# found, permission) ends the dialog as it ends the command.
ANSWER_ERRORS = (InvalidInput, Conflict, PolicyRefused)


class Cancelled(Exception):
    """The user left the dialog (``cancel``, ``n`` at the confirmation, Ctrl-D)."""


class Question:
    """One question.  ``text`` may be computed from the answers so far (and
    may raise BkError, e.g. a preview that does not fit); ``parse`` turns the
    answer into a value or raises BkError; ``when`` says whether to ask at
    all; ``shown`` is how the default appears in brackets (``Y/n``);
    ``blame(answers, err)`` names the key of the question to ask again when
    ``text`` (or the write after this question) fails with ``err``."""

    # A plain class, not a dataclass: this module is imported by every bk
    # command (the parser registers ``bk a``), and start-up time counts.
    def __init__(self, key: str, text: str | Callable[[dict], str], parse: Callable[[str], Any],
                 default: str | Callable[[dict], str | None] | None = None, *,
                 when: Callable[[dict], bool] | None = None, help: str = "", shown: str | None = None,
                 blame: Callable[[dict, BkError], str | None] | None = None):
        self.key, self.text, self.parse, self.default = key, text, parse, default
        self.when, self.help, self.shown, self.blame = when, help, shown, blame


class Dialog:
    """Ask questions in order with back/cancel/help; returns the answers."""

    def __init__(self, ask: Callable[[str], str], say: Callable[[str], None]):
        self.ask = ask
        self.say = say

    @classmethod
    def from_streams(cls, inp, out) -> Dialog:
        def ask(prompt: str) -> str:
            out.write(prompt)
            out.flush()
            line = inp.readline()
            if not line:
                raise EOFError
            return line.rstrip("\n")

        def say(text: str) -> None:
            out.write(text + "\n")
            out.flush()
        return cls(ask, say)

    @classmethod
    def terminal(cls) -> Dialog:
        try:
            import readline  # noqa: F401 - importing it gives input() line editing
        except ImportError:
            readline = None

        def ask(prompt: str) -> str:
            # Answers are not commands: inside the bk> prompt, keep them out
            # of its history and do not complete them as command words.
            if readline is None:
                return input(prompt)
            completer = readline.get_completer()
            readline.set_auto_history(False)
            readline.set_completer(None)
            try:
                return input(prompt)
            finally:
                readline.set_auto_history(True)
                readline.set_completer(completer)

        def say(text: str) -> None:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
        return cls(ask, say)

    def error(self, err: BkError) -> None:
        # Messages may quote what was typed: shown escaped, like stored text.
        self.say(f"error: {safe_lines(err.message)}")
        if err.hint:
            self.say(f"hint: {safe_lines(err.hint)}")

    @staticmethod
    def _applies(q: Question, answers: dict) -> bool:
        return q.when is None or q.when(answers)

    def _blamed(self, questions: list[Question], q: Question, answers: dict, err: BkError,
                asked: list[int]) -> int | None:
        """The index of an answered question that ``q.blame`` names, if any."""
        key = q.blame(answers, err) if q.blame is not None else None
        for j in asked:
            if questions[j].key == key:
                return j
        return None

    def run(self, questions: list[Question], answers: dict | None = None, *,
            resume: str | None = None) -> dict:
        """Ask until every question that applies has a valid answer.
        ``resume``: start at the question with that key, the answers before
        it kept (``back`` still walks them), and then go on to the last
        question, asking only those that apply and have no answer yet.
        Raises ``Cancelled`` when the user leaves."""
        answers = dict(answers or {})
        asked: list[int] = []      # indices answered, for `back`
        i = 0
        # After going back to a blamed question, the answers between it and
        # the question that failed stand: those strictly between ``redo``
        # (the one asked again) and ``keep_to`` (the one that failed).
        redo = keep_to = -1
        if resume is not None:
            i = next(j for j, q in enumerate(questions) if q.key == resume)
            asked = [j for j, q in enumerate(questions[:i])
                     if q.key in answers and self._applies(q, answers)]
            redo, keep_to = i, len(questions) - 1
        while i < len(questions):
            q = questions[i]
            if q.when is not None and not q.when(answers):
                answers.pop(q.key, None)
                i += 1
                continue
            if redo < i < keep_to and q.key in answers:
                asked.append(i)
                i += 1
                continue
            try:
                text = q.text(answers) if callable(q.text) else q.text
            except BkError as err:
                self.error(err)
                if not asked:
                    raise Cancelled from None
                j = self._blamed(questions, q, answers, err, asked)
                keep_to = i
                i = redo = asked.pop() if j is None else j
                del asked[asked.index(i) if i in asked else len(asked):]
                continue
            default = q.default(answers) if callable(q.default) else q.default
            head, _, last = text.rpartition("\n")
            if head:
                self.say(head)
            shown = q.shown or default
            prompt = f"{last} [{shown}] " if shown else f"{last} "
            try:
                word = self.ask(prompt).strip()
            except EOFError:
                self.say("")
                raise Cancelled from None
            low = word.lower()
            if low in CANCEL_WORDS:
                raise Cancelled
            if low in BACK_WORDS:
                keep_to = -1
                if asked:
                    i = asked.pop()
                else:
                    self.say("(this is the first question; cancel leaves)")
                continue
            if low in HELP_WORDS:
                self.say(q.help or "answer the question, or: back, cancel")
                self.say("Enter takes the value in [brackets]; back goes to the previous question; "
                         "cancel leaves with nothing changed.")
                continue
            if not word and default is not None:
                word = default
            try:
                answers[q.key] = q.parse(word)
            except BkError as err:
                self.error(err)
                continue
            asked.append(i)
            i += 1
        return answers

    def converse(self, questions: list[Question], submit: Callable[[dict], Any]) -> Any:
        """``run``, then ``submit(answers)``; when the submit is refused for
        a reason an answer can cure (``ANSWER_ERRORS``), show why and ask the
        question the last question's ``blame`` names (else the one answered
        last before it) again, keeping the other answers."""
        answers: dict = {}
        resume = None
        while True:
            answers = self.run(questions, answers, resume=resume)
            try:
                return submit(answers)
            except ANSWER_ERRORS as err:
                self.error(err)
                asked = [j for j, q in enumerate(questions[:-1])
                         if q.key in answers and self._applies(q, answers)]
                if not asked:
                    raise
                j = self._blamed(questions, questions[-1], answers, err, asked)
                resume = questions[asked[-1] if j is None else j].key


def require_terminal(ctx, args, what: str, hint: str) -> None:
    """A dialog needs a person: a terminal on stdin and stdout, no --json, no --yes."""
    out_tty = hasattr(sys.stdout, "isatty") and sys.stdout.isatty()
    if ctx.json or getattr(args, "yes", False) or not ctx.interactive or not out_tty:
        why = ("--json" if ctx.json else "--yes" if getattr(args, "yes", False)
               else "no terminal")
        raise InvalidInput(f"{what} asks questions and needs a terminal ({why})", hint=hint)


# ------------------------------------------------------------ a booking

def _with_footer(out: Output, footer: str) -> Output:
    human = out.human

    def text(term) -> str:
        body = human(term) if callable(human) else (human or "")
        return body.rstrip("\n") + "\n" + footer
    out.human = text
    return out


def _cancelled(command: str, exit_code: int = 0) -> Output:
    return Output(command, {"status": "cancelled"}, CANCELLED_TEXT, exit_code=exit_code)


# ------------------------------------------------------------------ parsers

def parse_yes(word: str) -> bool:
    w = word.lower()
    if w in YES:
        return True
    if w in NO:
        raise Cancelled
    raise InvalidInput(f"answer y or n, not {word!r}")


def parse_mode(word: str) -> str:
    w = word.lower()
    if w in ("s", "sh", "shared"):
        return SHARED
    if w in ("x", "e", "ex", "excl", "exclusive"):
        return EXCLUSIVE
    raise InvalidInput(f"{word!r} is neither shared nor exclusive", hint="type s for shared, x for exclusive")


def _mode_letter(mode: str) -> str:
    return "x" if mode == EXCLUSIVE else "s"


def _count_parser(policy) -> Callable[[str], int]:
    usable = [g for g in range(policy.gpu_count) if g not in policy.disabled_gpus]

    def parse(word: str) -> int:
        n = builders.count(word)
        if n > len(usable):
            raise InvalidInput(f"this server has {timegrid.counted(len(usable), 'GPU')} "
                               f"you can book; {n} is too many")
        return n
    return parse


def _mem_parser(required: bool, *, none_means: Any = None) -> Callable[[str], Any]:
    def parse(word: str):
        if word.lower() in ("", "none", "-", "no"):
            if required:
                raise InvalidInput("this server needs the memory per GPU for shared bookings",
                                   hint=f"e.g. {timegrid.MEMORY_EXAMPLES}")
            return none_means
        return timegrid.parse_memory(word)
    return parse


# --------------------------------------------------------------- bk a (add)

ADD_EPILOG = """Examples:
  bk a                     answer a few questions, see where it goes, confirm
  bk add

In the dialog: Enter takes the [default] (learned from your recent bookings),
back returns to the previous question, cancel leaves with nothing booked.
The same booking with flags is printed at the end, e.g. bk 2 1h 12g."""


def register(sub) -> None:
    p = sub.add_parser("add", aliases=["a"], help="guided booking: one question at a time",
                       description="Book step by step: how many GPUs, shared or exclusive, how "
                       "long, memory per GPU, when; then a preview and a confirmation. Needs a "
                       "terminal; scripts use bk N DUR with flags.",
                       epilog=ADD_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-y", "--yes", action="store_true",
                   help="refused: a guided booking always asks (use bk N DUR to book without questions)")
    p.set_defaults(handler=run_add, command="add")


def run_add(args, ctx, dialog: Dialog | None = None) -> Output:
    require_terminal(ctx, args, "bk a", "book with flags instead: bk N DUR [MEM] [-t TIME], "
                                        "e.g. bk 2 1h 12g or bk x 1 2h -t 20:00")
    app, call = ctx.app(), ctx.call()
    from bk.service import Empty

    dialog = dialog or Dialog.terminal()
    defaults = app.run("defaults", Empty(), call=call).to_json()
    n = defaults["learned"]
    where = ("bk's defaults" if not n else "from your last booking" if n == 1
             else f"from your last {n} bookings")
    dialog.say(f"Book GPUs step by step. Enter takes the [default] ({where}); "
               "back, cancel and ? work at every question.")
    import shlex

    def submit(answers: dict) -> Output:
        # The exact instant the preview used ("20:00" read again later could
        # roll to tomorrow); a queued preview books the earliest fit after it.
        spec = answers["start"][1]
        req = add_request(answers, call, queue=not spec.is_now and answers.get("_queued_start") is not None)
        # The booking is made now, however long the dialog stayed open ("now"
        # answers leave the start to the write; others are the instants shown).
        out = cmd_book.book_and_show(app, ctx.fresh_call(), ctx, req,
                                     command="exclusive" if answers["mode"] == EXCLUSIVE else "book")
        return _with_footer(out, "next time: " + shlex.join(["bk", *add_typed(answers)]))
    try:
        return dialog.converse(add_questions(app, call, defaults), submit)
    except (Cancelled, KeyboardInterrupt) as e:
        return _cancelled("add", 130 if isinstance(e, KeyboardInterrupt) else 0)


def add_questions(app, call, defaults: dict) -> list[Question]:
    policy, tz, now = call.policy, call.tz, call.now
    slot = policy.slot_minutes
    required = policy.require_shared_memory

    def shared(a: dict) -> bool:
        return a.get("mode") == SHARED

    def parse_duration(word: str) -> int:
        return timegrid.parse_duration(word, slot)

    def parse_start(word: str):
        return word, timegrid.parse_start(word, now, tz, slot)

    def preview(a: dict) -> str:
        req = add_request(a, call)
        option = app.run("recommend", builders.recommend_request(req, 1), call=call).options[0]
        n = len(option.gpus)
        mem = f", {timegrid.format_memory(a['mem'])} per GPU" if a.get("mem") else ""
        lines = [f"Preview: {timegrid.counted(n, 'GPU')} ({common.gpus_text(option.gpus)}) "
                 f"{a['mode']}{mem}, {timegrid.format_span(option.start, option.end, tz, now)}"]
        a["_queued_start"] = option.start if option.queued else None
        if option.queued:
            asked = "now" if req.start is None else timegrid.format_local_short(req.start, tz, now)
            lines.append(f"  queued: {asked} is full; the earliest start that fits is "
                         f"{timegrid.format_local_short(option.start, tz, now)}")
        return "\n".join(lines) + "\nBook it?"

    mem_default = (timegrid.format_memory(defaults["mem_mib"]) if defaults.get("mem_mib")
                   else None)
    return [
        Question("count", "How many GPUs?", _count_parser(policy), str(defaults["count"]),
                 help="a whole number, e.g. 2"),
        Question("mode", "Shared or exclusive? (s/x)", parse_mode, _mode_letter(defaults["mode"]),
                 help="shared (s): others may use the same GPU within its share slots; "
                      "exclusive (x): the whole GPU is yours"),
        Question("duration", "For how long?", parse_duration,
                 timegrid.format_duration(defaults["duration"]),
                 help=f"e.g. {timegrid.DURATION_EXAMPLES}; bookings last whole {slot}-minute slices"),
        Question("mem", "Memory per GPU?" + (" (required here)" if required else " (none to skip)"),
                 _mem_parser(required), mem_default, when=shared,
                 shown=None if required else (mem_default or "none"),
                 help=f"the VRAM you expect to use on each GPU, e.g. {timegrid.MEMORY_EXAMPLES}"),
        Question("start", "Start when?", parse_start, "now",
                 help=f"e.g. {timegrid.START_EXAMPLES}"),
        Question("confirm", preview, parse_yes, "y", shown="Y/n",
                 help="y books it; n leaves with nothing booked; back changes the answers"),
    ]


def add_request(a: dict, call, *, queue: bool = False):
    """The answers as the typed request ``bk N DUR [MEM] --start ISO`` makes;
    a start of "now" is left out, as a bare booking (which may be queued)."""
    spec = a["start"][1]
    req, _ = builders.book_request(
        count_=a["count"], duration_=a["duration"], mode=a["mode"],
        mem=a.get("mem") if a["mode"] == SHARED else None, start_at=None if spec.is_now else spec.t,
        queue=queue, policy=call.policy, now=call.now, tz=call.tz)
    return req


def add_typed(a: dict) -> list[str]:
    """The words a person would type next time for the same booking."""
    typed = ["x"] if a["mode"] == EXCLUSIVE else []
    typed += [str(a["count"]), timegrid.format_duration(a["duration"])]
    if a["mode"] == SHARED and a.get("mem"):
        typed.append(timegrid.format_memory(a["mem"]))
    word, spec = a["start"]
    if not spec.is_now:
        typed += ["-t", word]
    return typed


# ------------------------------------------------------------ bk e (edit)

EDIT_FIELDS = ("duration", "start", "gpus", "memory", "mode", "share")


def _fields_parser(choices: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    def parse(word: str) -> tuple[str, ...]:
        out = []
        for part in word.replace(",", " ").split():
            hits = [c for c in choices if c.startswith(part.lower())]
            if part.lower() == "mem":
                hits = ["memory"]
            if len(hits) != 1:
                raise InvalidInput(f"{part!r} is {'ambiguous' if hits else 'not something to change'}",
                                   hint="choose from: " + ", ".join(choices))
            if hits[0] not in out:
                out.append(hits[0])
        if not out:
            raise InvalidInput("choose at least one", hint="choose from: " + ", ".join(choices))
        return tuple(out)
    return parse


def edit_flow(args, ctx, dialog: Dialog | None = None) -> Output:
    """``bk e ID`` with no change flags: ask what to change, preview, confirm, edit."""
    require_terminal(ctx, args, "bk e ID without flags",
                     "give the change as flags, e.g. bk e 1 -d 2h, bk e 1 -t 20:00, bk e 1 -g 0,1")
    from bk.cli.cmd_edit import edit_output

    app, call = ctx.app(), ctx.call()
    from bk.service import ResolveRequest

    res = app.run("resolve", ResolveRequest(args.ref), call=call).reservation
    now, tz = call.now, call.tz
    status = res.status(now)
    if status in ("ended", "cancelled"):
        raise InvalidInput(f"reservation {res.short_id} has {status}; it can no longer be edited",
                           hint="book again with: bk N DUR")
    cap = call.policy.max_shared_users
    dialog = dialog or Dialog.terminal()
    dialog.say(f"Editing {common.summary_line(res, capacity=cap, tz=tz, now=now)} "
               f"({common.status_text(res, now=now)})")
    if status == "active":
        dialog.say("It has started: only its end can move.")
    import shlex

    def submit(answers: dict) -> Output:
        req = edit_request(res, answers, call)
        # The answers are instants the user was shown; the write itself
        # happens now, however long the dialog stayed open.
        write = ctx.fresh_call()
        out = edit_output(app.run("edit", req, call=write), write)
        return _with_footer(out, "next time: " + shlex.join(["bk", "e", res.short_id, *edit_typed(answers)]))
    try:
        return dialog.converse(edit_questions(app, call, res, ctx, active=status == "active"), submit)
    except (Cancelled, KeyboardInterrupt) as e:
        return Output("edit", {"status": "cancelled"}, "cancelled, nothing changed",
                      exit_code=130 if isinstance(e, KeyboardInterrupt) else 0)


def edit_questions(app, call, res, ctx, *, active: bool) -> list[Question]:
    policy, tz, now = call.policy, call.tz, call.now
    slot = policy.slot_minutes
    cap = policy.max_shared_users

    def chosen(name: str) -> Callable[[dict], bool]:
        return lambda a: name in a.get("what", ())

    def parse_end(word: str) -> tuple[str, int]:
        return word, timegrid.parse_end_change(word, res.start, res.end, now, tz, slot)

    def parse_duration(word: str) -> int:
        return timegrid.parse_duration(word, slot)

    def parse_start(word: str):
        return word, timegrid.parse_start(word, now, tz, slot)

    def parse_share(word: str) -> int:
        n = common.positive_int(word)
        if n > cap:
            raise InvalidInput(f"a GPU has {timegrid.counted(cap, 'share slot')}; {n} is too many",
                               hint="for the whole GPU choose mode x")
        return n

    def preview(a: dict) -> str:
        # The preview is the same edit as a dry run: what it shows is what
        # the confirmation will do.
        from bk.cli.cmd_edit import edit_output

        result = app.run("edit", edit_request(res, a, call, dry_run=True), call=call)
        if result.status == "unchanged":
            raise InvalidInput("that changes nothing",
                               hint="type another value, back to pick another field, "
                                    "or cancel to leave the booking as it is")
        out = edit_output(result, call)
        text = out.human(ctx.term) if callable(out.human) else (out.human or "")
        return text.rstrip("\n") + "\nSave the change?"

    def blame(a: dict, err: BkError) -> str | None:
        # Which answer made the change fail: the first field that fails on
        # its own (a dry run of that field alone); when only the combination
        # fails, the dialog goes back to the field asked last.
        fields = [k for k in ("end", *EDIT_FIELDS) if k in a and (k == "end" or k in a.get("what", ()))]
        if len(fields) < 2:
            return fields[0] if fields else None
        for k in fields:
            try:
                app.run("edit", edit_request(res, {k: a[k]}, call, dry_run=True), call=call)
            except BkError:
                return k
        return None

    confirm = Question("confirm", preview, parse_yes, "y", shown="Y/n", blame=blame,
                       help="y saves the change; n leaves with nothing changed; back changes the answers")
    if active:
        return [Question("end", "New end? (+30m, -15m, 20:00, total 2h)", parse_end, "+30m",
                         help=f"e.g. {timegrid.END_EXAMPLES}"),
                confirm]
    mem_now = timegrid.format_memory(res.mem_mib) if res.mem_mib else CLEAR_MEM
    return [
        Question("what", "Change what? (" + ", ".join(EDIT_FIELDS) + "; several with commas)",
                 _fields_parser(EDIT_FIELDS), "duration",
                 help="the parts to change, e.g. duration or start,duration"),
        Question("duration", "New duration?", parse_duration,
                 timegrid.format_duration(res.end - res.start), when=chosen("duration"),
                 help=f"the new total length, e.g. {timegrid.DURATION_EXAMPLES}"),
        Question("start", "New start?", parse_start,
                 timegrid.format_local(res.start, tz, now=now, compact=True), when=chosen("start"),
                 help=f"e.g. {timegrid.START_EXAMPLES}"),
        Question("gpus", "Which GPUs?", lambda w: builders.gpu_list(w, "GPUs"),
                 ",".join(map(str, res.gpus)), when=chosen("gpus"),
                 help="GPU indices like 0,1 or 0-3; their number is the new GPU count"),
        Question("memory", "Memory per GPU? (none to clear)",
                 _mem_parser(policy.require_shared_memory and res.mode == SHARED, none_means=CLEAR_MEM),
                 mem_now, when=chosen("memory"), help=f"e.g. {timegrid.MEMORY_EXAMPLES}, or none"),
        Question("mode", "Shared or exclusive? (s/x)", parse_mode, _mode_letter(res.mode),
                 when=chosen("mode")),
        Question("share", f"Share slots per GPU? (1-{cap})", parse_share,
                 str(1 if res.mode == EXCLUSIVE else res.share), when=chosen("share"),
                 help="how many of each GPU's share slots the booking takes"),
        confirm,
    ]


def edit_request(res, a: dict, call, *, dry_run: bool = False):
    """The answers as the typed change ``bk e ID`` makes: the new length in
    seconds, the new end and start as the instants the user was shown (not
    "20:00" read again later), GPU indices, MiB or CLEAR_MEM."""
    return builders.edit_request(
        res, length=a.get("duration"), end=a["end"][1] if "end" in a else None,
        start_at=a["start"][1].t if "start" in a else None, gpus=a.get("gpus"),
        mem=None if a.get("memory") == CLEAR_MEM else a.get("memory"), clear_mem=a.get("memory") == CLEAR_MEM,
        share=a.get("share"), mode=a.get("mode"), dry_run=dry_run,
        policy=call.policy, now=call.now, tz=call.tz)


def edit_typed(a: dict) -> list[str]:
    """The ``bk e`` flags a person would type next time for the answers."""
    typed: list[str] = []
    if "end" in a:
        typed += ["-d", a["end"][0]]
    if "duration" in a:
        typed += ["-d", timegrid.format_duration(a["duration"])]
    if "start" in a:
        typed += ["-t", a["start"][0]]
    if "gpus" in a:
        typed += ["-g", ",".join(map(str, a["gpus"]))]
    if "memory" in a:
        typed += ["-m", CLEAR_MEM if a["memory"] == CLEAR_MEM else timegrid.format_memory(a["memory"])]
    if "mode" in a:
        typed += ["--mode", a["mode"]]
    if "share" in a:
        typed += ["-s", str(a["share"])]
    return typed
