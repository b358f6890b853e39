"""``bk`` alone: the status, then an interactive ``bk> `` prompt.

The prompt is the command line without the ``bk``: each line is split like
a shell would (``shlex``) and run through ``bk.cli.app.run``, the same
parser, handlers and renderer as a command typed in the shell, so the two
can never disagree.  ``bk 1 30m`` and ``1 30m`` both work.  Every line gets
a fresh context: the ledger and the GPUs are looked at again, never served
from an earlier line.

Nothing typed at the prompt ends it except ``exit``, ``quit`` or Ctrl-D:
errors (usage errors included) are printed like in the shell, ``-h``
cannot exit the process, and Ctrl-C clears the line being typed (or stops
the running command).

Line editing and history come from ``readline`` when the interpreter has
it.  The history is kept in the user's state directory (through
the ``prompt_history`` rows, bounded to 1000 lines); lines typed in this session
are appended to what is on disk when the prompt ends, so two prompts open
at once do not erase each other's lines.
"""

from __future__ import annotations

import shlex
import sys

PROMPT = "bk> "
EXIT_WORDS = ("exit", "quit", "logout")
INTRO = "type a command without 'bk' (l, 1 30m, a, help); exit or Ctrl-D leaves"


def dispatch_line(line: str, ctx) -> int:
    """Run one prompt line as a bk command; return its exit status.  Never raises
    for anything the user typed, never exits the process."""
    try:
        words = shlex.split(line)
    except ValueError as e:          # an unclosed quote
        sys.stderr.write(f"error: cannot read that line: {e}\n")
        sys.stderr.write('hint: close the quote, e.g. --note "my run"\n')
        return 2
    if words and words[0] == "bk":
        words = words[1:]
    if not words:
        return 0
    if all(w == "--json" for w in words):
        words = ["st", *words]       # `bk --json` alone is the status, never a nested prompt
    from bk.cli.app import run

    try:
        return run(words, ctx.env, opener=ctx.opener)
    except SystemExit as e:          # nothing typed here may end the prompt
        return e.code if isinstance(e.code, int) else 2


def run_prompt(ctx) -> int:
    """The status summary, then read-eval-print until exit (0)."""
    status = dispatch_line("st", ctx)
    if not (ctx.interactive and sys.stdout.isatty()):
        return status                # a script gets the status once, never a hanging prompt
    history = _History(ctx)
    sys.stdout.write(f"\n{INTRO}\n")
    sys.stdout.flush()
    try:
        while True:
            try:
                line = input(PROMPT)
            except EOFError:         # Ctrl-D
                sys.stdout.write("\n")
                break
            except KeyboardInterrupt:  # Ctrl-C clears the line
                sys.stdout.write("\n")
                continue
            text = line.strip()
            if not text:
                continue
            if text in EXIT_WORDS:
                break
            dispatch_line(text, ctx)
            sys.stdout.flush()
    finally:
        history.save()
    return 0


class _History:
    """readline set-up: history from the state directory, completion of command words."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.loaded = 0
        try:
            import readline
        except ImportError:          # no line editing here; the prompt still works
            self.readline = None
            return
        self.readline = readline
        readline.set_auto_history(True)
        for line in self._disk():
            readline.add_history(line)
        self.loaded = readline.get_current_history_length()
        self.words = _command_words()
        readline.set_completer(self.complete)
        readline.set_completer_delims(" \t")
        readline.parse_and_bind("tab: complete")

    def _disk(self) -> list[str]:
        from bk.core.errors import BkError
        from bk.service import Empty

        try:
            return list(self.ctx.app().run("prompt_history", Empty()).lines)
        except BkError:
            return []

    def complete(self, text: str, state: int) -> str | None:
        before = self.readline.get_line_buffer()[: self.readline.get_begidx()].split()
        first = before in ([], ["bk"])      # only the command word is completed
        options = [w + " " for w in self.words if w.startswith(text)] if first else []
        return options[state] if state < len(options) else None

    def save(self) -> None:
        if self.readline is None:
            return
        rl = self.readline
        new = [rl.get_history_item(i) for i in range(self.loaded + 1, rl.get_current_history_length() + 1)]
        new = [line for line in new if line and line.strip() not in EXIT_WORDS]
        if not new:
            return
        from bk.core.errors import BkError
        from bk.service import PromptHistoryRequest

        try:
            self.ctx.app().run("prompt_history_save", PromptHistoryRequest(tuple(self._disk() + new)))
        except BkError as err:       # history is a convenience; say so and go on
            sys.stderr.write(f"warning: prompt history not saved: {err.message}\n")


def _command_words() -> list[str]:
    from bk.cli.app import COMMAND_WORDS

    return sorted([w for words in COMMAND_WORDS.values() for w in words] + list(EXIT_WORDS))
