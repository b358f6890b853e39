"""bk(1) and the shell completions, generated from the argparse tree.

The parser is the one source of truth for commands, aliases, options and
their help.  This module walks ``bk.cli.app.build_parser()`` and writes:

* ``man/bk.1``: every command (with its aliases, synopsis, description,
  arguments, options and examples), wrapped in hand-written sections
  (DESCRIPTION, ENVIRONMENT, FILES, EXIT STATUS from
  ``bk.core.errors.EXIT_TABLE``, JSON OUTPUT, EXAMPLES, SEE ALSO); the
  administrator's commands get a short entry pointing to
* ``man/bk-admin.8`` (``bk/cli/manpage_admin.py``): every ``bk admin``
  action at any depth, ``bk update`` and the daemons, in full;
* ``install/completion/bk.bash`` and ``install/completion/_bk`` (zsh).

``python3 tools/gen_docs.py`` regenerates all four; ``tests/test_manpage.py``
fails when the committed files differ from what the tree generates, so a
new option cannot ship undocumented.

The output must not depend on the machine: no terminal width (argparse's
own usage formatter reads ``COLUMNS``, so synopses are built here), no
clock (the page's date is ``DATE``, moved by hand at a release), no
locale.  roff is written for ``mandoc -T lint`` to pass: every line that
starts with ``.`` or ``'`` is escaped, option dashes are ``\\-``, and
characters beyond ASCII become roff escapes.
"""

from __future__ import annotations

import argparse

from bk.core.record import dataclass, field

DATE = "2026-11-30"          # the man page's date: bump it with the version
SKIP_OPTIONS = ("-h", "--help")

# Characters argparse help strings use that roff spells differently.
_ROFF_CHARS = {"\\": "\\e", "–": "\\(en", "—": "\\(em", "…": "...", "·": "\\(pc", "→": "\\(->",
               "×": "\\(mu", "≥": "\\(>=", "≤": "\\(<=", "’": "'", "‘": "`", "“": "\\(lq", "”": "\\(rq"}


# ----------------------------------------------------------- the tree

@dataclass
class Opt:
    flags: list[str]             # ["-g", "--gpu"]; empty for a positional
    metavar: str | None          # "LIST", "N", or None for a switch
    help: str
    positional: bool = False
    choices: list[str] = field(default_factory=list)
    optional: bool = True        # a positional with nargs ? or *


@dataclass
class Command:
    path: list[str]              # ["preset", "save"]
    aliases: list[str]
    help: str
    description: str
    epilog: str
    options: list[Opt]
    children: list[Command]


def _subparsers(parser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _help_text(action, prog: str) -> str:
    text = action.help or ""
    if "%" in text:
        params = dict(vars(action), prog=prog)
        params["choices"] = ", ".join(map(str, action.choices or ()))
        try:
            text = text % params
        except (KeyError, TypeError, ValueError):
            text = text.replace("%%", "%")
    return " ".join(text.split())


# argparse's own help for the options it adds, in the page's words.
_BUILTIN_HELP = {argparse._HelpAction: "print the help of bk (or, after a command, of that command) and exit",
                 argparse._VersionAction: "print bk's version and content hash and exit (with --json, its "
                                          "build record)"}


def _opt(action, prog: str) -> Opt:
    choices = [str(c) for c in action.choices] if action.choices and not isinstance(action.choices, dict) else []
    if isinstance(action.metavar, tuple):
        metavar = " ".join(action.metavar)
    elif action.metavar is not None:
        metavar = action.metavar
    elif choices:
        # "shared|exclusive", as a man page writes alternatives; argparse's
        # "{shared,exclusive}" is its own usage notation.
        metavar = "|".join(choices)
    elif action.option_strings:
        metavar = action.dest.upper() if action.nargs != 0 else None
    else:
        metavar = action.dest
    text = _BUILTIN_HELP.get(type(action)) or _help_text(action, prog)
    return Opt(flags=list(action.option_strings), metavar=metavar, help=text,
               positional=not action.option_strings, choices=choices,
               optional=action.nargs in ("?", "*", argparse.REMAINDER))


def walk(parser, path: list[str] | None = None) -> list[Command]:
    """The commands under ``parser``, in the order they were registered."""
    path = path or []
    sub = _subparsers(parser)
    if sub is None:
        return []
    helps = {c.dest: c.help for c in sub._choices_actions}
    names: dict[int, list[str]] = {}
    parsers = {}
    for name, p in sub.choices.items():
        names.setdefault(id(p), []).append(name)
        parsers[id(p)] = p
    out = []
    for key, (name, *aliases) in names.items():
        if name not in helps or helps[name] == argparse.SUPPRESS:
            continue            # hidden on purpose
        p = parsers[key]
        options = [_opt(a, p.prog) for a in p._actions
                   if not isinstance(a, argparse._SubParsersAction)
                   and not set(a.option_strings) & set(SKIP_OPTIONS)
                   and a.help != argparse.SUPPRESS]
        out.append(Command([*path, name], aliases, " ".join((helps[name] or "").split()),
                           " ".join((p.description or "").split()), (p.epilog or "").strip("\n"),
                           options, walk(p, [*path, name])))
    return out


def flatten(commands: list[Command]) -> list[Command]:
    out = []
    for c in commands:
        out.append(c)
        out.extend(flatten(c.children))
    return out


def global_options(parser) -> list[Opt]:
    return [_opt(a, parser.prog) for a in parser._actions
            if a.option_strings and a.help != argparse.SUPPRESS]


# ----------------------------------------------------------- roff

def esc(text: str) -> str:
    """Plain text -> roff text: backslashes, dashes, non-ASCII."""
    out = []
    for ch in text:
        if ch in _ROFF_CHARS:
            out.append(_ROFF_CHARS[ch])
        elif ch == "-":
            out.append("\\-")
        elif ord(ch) > 126:
            out.append(f"\\[u{ord(ch):04X}]")
        else:
            out.append(ch)
    return "".join(out)


def line(text: str) -> str:
    """One input line of running text; a leading . or ' would be a request."""
    s = esc(text)
    return "\\&" + s if s.startswith((".", "'")) else s


def _flag_roff(o: Opt) -> str:
    flags = ", ".join(f"\\fB{esc(f)}\\fR" for f in o.flags)
    if o.metavar:
        flags += f" \\fI{esc(o.metavar)}\\fR"
    return flags


def _synopsis(c: Command) -> str:
    parts = [f"\\fBbk {esc(' '.join(c.path))}\\fR"]
    for o in c.options:
        if o.positional:
            name = f"\\fI{esc(o.metavar or '')}\\fR"
            parts.append(f"[{name}]" if o.optional else name)
    if any(not o.positional for o in c.options):
        parts.append("[\\fIOPTIONS\\fR]")
    if c.children:
        parts.append("[\\fIACTION\\fR]")
    return " ".join(parts)


def _preformatted(text: str) -> list[str]:
    out = [".PP", ".nf", ".RS 4"]
    for raw in text.splitlines():
        out.append(line(raw.rstrip()) if raw.strip() else ".sp")
    return out + [".RE", ".fi"]


def command_section(c: Command) -> list[str]:
    title = " ".join(c.path)
    if c.aliases:
        title += f" ({', '.join(c.aliases)})"
    out = [f'.SS "{esc(title)}"', _synopsis(c), ".PP"]
    desc = c.description or c.help
    out.append(line(desc[0].upper() + desc[1:] if desc else ""))
    for o in c.options:
        out += [".TP", f"\\fI{esc(o.metavar or '')}\\fR" if o.positional else _flag_roff(o),
                line(o.help or "(no description)")]
    if c.epilog:
        out += _preformatted(c.epilog)
    return out


HEAD = r""".\" Generated by tools/gen_docs.py from bk's argparse tree: do not edit.
.\" Change the help texts in bk/cli/*.py or the sections in bk/cli/manpage.py,
.\" then run: python3 tools/gen_docs.py
.TH BK 1 {date} "bk {version}" "User Commands"
.SH NAME
bk \- book GPUs on shared Linux servers
.SH SYNOPSIS
\fBbk\fR
.br
\fBbk\fR [\fB\-\-json\fR] \fIN\fR \fIDUR\fR [\fIMEM\fR] [\fIOPTIONS\fR]
.br
\fBbk\fR [\fB\-\-json\fR] \fICOMMAND\fR [\fIARGS\fR] [\fIOPTIONS\fR]
.br
\fBbk \-\-version\fR [\fB\-\-json\fR]
.SH DESCRIPTION
\fBbk\fR books GPUs on a shared Linux server, shared or exclusive, now or
later, and shows who uses which GPU.
It coordinates people; Linux device permissions stay the final boundary.
.PP
Without arguments \fBbk\fR prints the status (GPUs, your bookings, notices)
and, at a terminal, opens an interactive \fBbk>\fR prompt that takes the
same commands without the leading \fBbk\fR.
Errors never leave the prompt; \fBexit\fR, \fBquit\fR or Ctrl\-D do.
A number first is a booking: \fBbk 2 1h\fR is \fBbk book 2 1h\fR.
.PP
In private mode (the default, or whenever \fBBK_DATA_DIR\fR is set) the
ledger belongs to you alone.
On a shared server (\fB/etc/gpubk/config.json\fR exists) a broker owned by
a service account writes the ledger; \fBbk\fR reads it directly and sends
every change to the broker, which knows who you are from the kernel.
.PP
Bookings start and last whole slices of \fIslot_minutes\fR (default 5).
Durations: \fB30m\fR, \fB2h\fR, \fB1h30m\fR, \fB1d12h\fR.
Memory per GPU: \fB12g\fR, \fB512m\fR, \fB1.5g\fR (GiB = 1024 MiB).
Start times (\fB\-t\fR): \fBnow\fR, \fB+30m\fR, \fB20:00\fR, \fB9pm\fR
(the next occurrence), \fBtomorrow 09:00\fR, \fB07\-13 20:00\fR,
\fB2026\-07\-13 20:00\fR, or ISO 8601 with an offset.
A booking is named by its list number (\fBbk l\fR) or by a unique prefix of
at least four characters of its ID.
.PP
Every command takes \fB\-h\fR/\fB\-\-help\fR (never with side effects) and
\fB\-\-json\fR.
One letter means one thing everywhere: \fB\-g\fR GPUs, \fB\-e\fR excluded
GPUs, \fB\-m\fR memory, \fB\-s\fR share slots, \fB\-t\fR start,
\fB\-d\fR duration, \fB\-n\fR limit, \fB\-y\fR yes, \fB\-q\fR quiet,
\fB\-v\fR verbose.
.SH OPTIONS
"""

ENVIRONMENT = r""".SH ENVIRONMENT
.TP
.B BK_DATA_DIR
Private mode with the ledger in this absolute directory (created 0700).
.TP
.B BK_CONFIG_FILE
A trusted configuration file to use instead of \fB/etc/gpubk/config.json\fR
(it must be root\-owned and not writable by others).
.TP
.B BK_GPU_COUNT
Simulate this many GPUs (1 to 64) with unknown live data, for trying bk
without GPUs.
.TP
.B BK_GPU_SIM_FILE
Simulate the GPUs described in this JSON file (names, memory, utilisation,
processes).
.TP
.B BK_NOW
Fix the clock (epoch seconds or ISO 8601 with an offset); for tests and
demos only. \fB@\fR\fIFILE\fR reads the instant from \fIFILE\fR at every
look, so the clock of running daemons can be moved.
.TP
.B BK_DEBUG
Set to 1 to show the traceback of an unexpected error instead of one line.
.TP
.B BK_CLUSTER_FILE
A cluster catalog to use instead of \fI/etc/gpubk/cluster.json\fR (\fBbk c\fR,
\fBbk @NODE\fR); it is checked like the trusted configuration.
.TP
.B BK_RESERVATION_ID\fR, \fBBK_RESERVED_GPUS
Set by \fBbk run\fR and the worker in a command's environment: the booking's
ID and its GPU indices (\fB0,1\fR).
.TP
.B CUDA_VISIBLE_DEVICES\fR, \fBCUDA_DEVICE_ORDER
Set for a command that \fBbk run\fR or the worker starts: the booked GPUs (their
UUIDs on real GPUs, indices in a simulation) and \fBPCI_BUS_ID\fR; \fBbk g\fR
prints the line that sets them.
.TP
.B BK_JOB_MARKER
Set by the worker in each job's environment: an exact marker by which the next
worker finds a job that outlived a crashed worker, to stop it and mark it
\fBuncertain\fR. Do not set it yourself.
.TP
.B TZ
The time zone of every time shown and of times you type (\fB\-t 20:00\fR);
default the system's. JSON is always UTC.
.TP
.B COLUMNS
The terminal width for \fBbk tl\fR and tables when standard output is not a
terminal.
.TP
.B NO_COLOR
When set to a non\-empty value, never colour the output.
.TP
.B TERM
\fBdumb\fR turns off colours and other escape sequences; \fBbk t\fR then
prints the text timeline.
.TP
.B TERM_PROGRAM\fR, \fBTMUX\fR, \fBSTY
Read by your notification deliverer from the environment of the programs
running in each of your terminals (not from its own): a terminal whose
program is known to show pop\-ups (iTerm2: OSC 9; WezTerm, Ghostty, foot,
rxvt\-unicode: OSC 777) gets one; inside tmux or screen none is sent (see
\fBbk notify\fR).
.TP
.B COLORFGBG
Set by some terminals; \fBbk t\fR starts with its light theme when it names a
light background.
.TP
.B LANG\fR, \fBLC_ALL\fR, \fBLC_CTYPE
Under a UTF\-8 locale \fBbk t\fR and \fBbk u\fR draw Unicode lines and blocks,
otherwise plain ASCII.
.TP
.B XDG_DATA_HOME
Private mode keeps its ledger in \fI$XDG_DATA_HOME/bk\fR (absolute values
only; default \fI~/.local/share/bk\fR).
.TP
.B XDG_CONFIG_HOME
Private mode reads \fI$XDG_CONFIG_HOME/bk/config.json\fR (default
\fI~/.config/bk/config.json\fR); your notification settings are
\fI$XDG_CONFIG_HOME/bk/notify.json\fR (in \fI$BK_DATA_DIR/state\fR for a
trial run).
.TP
.B XDG_CACHE_HOME
The GPU inventory (count, UUIDs, names, memory) is cached in
\fI$XDG_CACHE_HOME/bk\fR (default \fI~/.cache/bk\fR), keyed by a cheap
fingerprint of the hardware; deleting it only costs the next command a look.
.TP
.B XDG_STATE_HOME
Presets and the prompt history live in \fI$XDG_STATE_HOME/bk\fR (default
\fI~/.local/state/bk\fR); with \fBBK_DATA_DIR\fR set (a trial run), in
\fI$BK_DATA_DIR/state\fR instead, so a demo leaves your real presets alone.
.TP
.B XDG_SESSION_ID
The login session (set by systemd\-logind): advice such as how to start a
worker is given once per session.  Without it, each terminal session (its
login shell) is one.
.SH FILES
.TP
.I /etc/gpubk/config.json
The trusted configuration of a shared server (see \fBgpubk\-config\fR(5)).
.TP
.I /var/lib/gpubk
The shared ledger, its lock, backups and audit log (default data directory).
.TP
.I /run/gpubk/broker.sock
The broker's socket (default).
.TP
.I ~/.local/share/bk
The private\-mode data directory.
.TP
.I ~/.config/bk/config.json
Private\-mode settings (no security keys).
.TP
.I ~/.local/state/bk/presets.json
Your presets (\fBbk preset\fR), mode 0600.
.TP
.I ~/.local/state/bk/prompt_history
Lines typed at the \fBbk>\fR prompt, the last 1000.
.TP
.I ~/.cache/bk/
The cached GPU inventory (see \fBXDG_CACHE_HOME\fR).
.TP
.I ~/.config/bk/notify.json
Your notification settings (\fBbk notify set\fR), mode 0600: events,
channels, quiet hours, your email address and webhook URL, which no shared
file holds.
.TP
.I ~/.local/state/bk/notify/
Your deliverer's \fIdeliveries.json\fR (what was sent, per channel, and each
channel's health), its \fIdeliverer.lock\fR and \fIlog.lock\fR (0700, files
0600).
.TP
.I ~/.local/state/bk/jobs/
Your scheduled commands (0700): \fIspecs/ID.json\fR (a command line, its
directory and \fBPATH\fR, 0600), \fIlogs/ID.log\fR (its output), and the
worker's \fIworker.lock\fR and \fIworker.json\fR.
.TP
.I /var/lib/gpubk/monitor/
The monitor's \fIsnapshot.json\fR, \fIheartbeat.json\fR and \fImonitor.lock\fR
(see \fBbk m\fR and docs/TELEMETRY.md).
.TP
.I /var/lib/gpubk/usage/
The usage history that \fBbk u\fR reads: \fIraw/DAY.jsonl\fR minute records,
\fIhourly/DAY.jsonl\fR roll\-ups, and each day's \fI.seal\fR.
.TP
.I /etc/gpubk/cluster.json
The cluster catalog for \fBbk c\fR and \fBbk @NODE\fR (root\-owned).
.TP
.I /etc/systemd/user/bk\-worker.service
The per\-user worker unit (\fBsystemctl \-\-user enable \-\-now bk\-worker\fR).
"""

JSON_AND_EXAMPLES = r""".SH JSON OUTPUT
With \fB\-\-json\fR (before or after the command) \fBbk\fR prints exactly one
JSON object on standard output, for success and failure alike:
.PP
.nf
.RS 4
{"schema": "gpubk.v1", "command": "book", "ok": true,
 "data": {...}, "warnings": [...]}
{"schema": "gpubk.v1", "command": "book", "ok": false,
 "error": {"code": "conflict", "message": "...", "hint": "..."},
 "warnings": [...]}
.RE
.fi
.PP
Times in JSON are ISO 8601 in UTC; human output shows local time.
\fBerror.code\fR is one of {codes}.
The fields of each command's \fBdata\fR are documented in \fIdocs/JSON.md\fR;
they change only with a new schema version.
.SH EXAMPLES
.nf
.RS 4
bk                  # status and interactive prompt
bk 1 30m            # reserve one GPU for 30 minutes
bk 2 1h30m 12g      # two GPUs, 90 minutes, 12 GiB per GPU
bk x 1 2h           # exclusive reservation
bk a                # guided reservation
bk l                # list your reservations
bk g                # show your current GPU, or suggest one
bk g 4              # inspect a simultaneous 4\-GPU recommendation
bk tl               # text timeline of every GPU
bk d 1              # cancel your first booking
bk p save train 2 1h 12g && bk p train
BK_DATA_DIR=$(mktemp \-d) BK_GPU_COUNT=4 bk 1 30m   # try it without GPUs
.RE
.fi
.SH REPORTING BUGS
Report a problem to the administrator of your server (\fBbk info\fR names
them; on your own machine, to the gpubk project): what you ran, what it
printed, and the output of \fBbk \-\-version\fR, which names this copy of bk
(its version and content hash).
.SH SEE ALSO
.BR gpubk\-config (5),
.BR bk\-admin (8)
.PP
\fBbk help\fR \fICOMMAND\fR, \fBbk tutorial\fR, and the guide
\fI/usr/share/doc/gpubk/GUIDE.md\fR (\fIdocs/GUIDE.md\fR in the source tree;
in Chinese, \fIGUIDE.zh\-CN.md\fR beside it).
"""


def manpage(parser=None) -> str:
    from bk import __version__
    from bk.core.errors import EXIT_TABLE

    parser = parser or _parser()
    out = [HEAD.format(date=DATE, version=__version__).rstrip("\n")]
    for o in global_options(parser):
        out += [".TP", _flag_roff(o), line(o.help)]
    out.append(".SH COMMANDS")
    out.append("Each command is listed with its aliases in parentheses.")
    from bk.cli.manpage_admin import ADMIN_WORDS, short_entry

    for top in walk(parser):
        if top.path[0] in ADMIN_WORDS:
            out += short_entry(top)      # the whole sub-tree is in bk-admin(8)
            continue
        for c in flatten([top]):
            out += command_section(c)
    out.append(ENVIRONMENT.rstrip("\n"))
    out.append(".SH EXIT STATUS")
    out.append("The same for every command:")
    for code, meaning in EXIT_TABLE:
        out += [".TP", f".B {code}", line(meaning[0].upper() + meaning[1:] + ".")]
    out += [".TP", ".B 130", line("Interrupted (Ctrl-C).")]
    from bk.core.errors import ERROR_CODES

    # The codes come from the one code map, so the page cannot lag behind it.
    out.append(JSON_AND_EXAMPLES.rstrip("\n").replace("{codes}", ", ".join(ERROR_CODES)))
    return "\n".join(out) + "\n"


def _parser():
    from bk.cli.app import build_parser

    return build_parser()


# ----------------------------------------------------------- completion
#
# Both scripts carry the tree as tables keyed by a command path ("/",
# "/preset", "/admin/notice"): which word leads from a path to a child
# (aliases included), and which words complete at a path.  The shell walks
# the words typed so far through the first table, stopping at the first
# word that is not a sub-command (an argument), and completes from the
# second.  Any depth works, and a new command needs no new shell code.
# (The walking variable is "node": in zsh "path" is the array tied to PATH.)

def _tables(parser) -> tuple[dict, dict, dict, dict]:
    """(next, commands, options, choices) keyed by path.

    next: "path|word" -> child path; commands: path -> [(word, help)];
    options: path -> [(flag, help)]; choices: "path|flag" -> [choice]."""
    nxt: dict[str, str] = {}
    cmds: dict[str, list] = {}
    opts: dict[str, list] = {"/": [(f, o.help) for o in global_options(parser) for f in o.flags]}
    choices: dict[str, list] = {}

    def visit(children: list[Command], path: str) -> None:
        for c in children:
            child = "/" + "/".join(c.path)
            for word in [c.path[-1], *c.aliases]:
                nxt[f"{path}|{word}"] = child
                cmds.setdefault(path, []).append((word, c.help))
            opts[child] = [(f, o.help) for o in c.options for f in o.flags] + \
                [("--json", "print one JSON envelope on stdout")]
            for o in c.options:
                for f in o.flags:
                    if o.choices:
                        choices[f"{child}|{f}"] = o.choices
            visit(c.children, child)
    visit(walk(parser), "/")
    return nxt, cmds, opts, choices


def _shq(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def _assoc(name: str, items: dict[str, str]) -> list[str]:
    out = [f"declare -gA {name}=("]
    out += [f"    [{_shq(k)}]={_shq(v)}" for k, v in items.items()]
    return out + [")"]


def bash_completion(parser=None) -> str:
    nxt, cmds, opts, choices = _tables(parser or _parser())
    words = {path: " ".join([w for w, _ in cmds.get(path, [])] + [f for f, _ in opts.get(path, [])])
             for path in sorted(set(cmds) | set(opts))}
    lines = ["# bash completion for bk (generated by tools/gen_docs.py from the argparse tree; do not edit)",
             "# shellcheck shell=bash disable=SC2034",
             *_assoc("_bk_next", nxt),
             *_assoc("_bk_words", words),
             *_assoc("_bk_choices", {k: " ".join(v) for k, v in choices.items()}),
             "",
             "_bk() {",
             '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
             "    local node=/ i w next",
             "    for ((i = 1; i < COMP_CWORD; i++)); do",
             '        w="${COMP_WORDS[i]}"',
             "        [[ $w == -* ]] && continue",
             "        if [[ $node == / && $w =~ ^[0-9]+$ ]]; then node=/book; break; fi  # bk 2 1h",
             '        next="${_bk_next[$node|$w]}"',
             '        [[ -n $next ]] || break',
             '        node="$next"',
             "    done",
             '    if [[ -n ${_bk_choices[$node|$prev]} ]]; then',
             '        mapfile -t COMPREPLY < <(compgen -W "${_bk_choices[$node|$prev]}" -- "$cur")',
             "        return",
             "    fi",
             '    mapfile -t COMPREPLY < <(compgen -W "${_bk_words[$node]}" -- "$cur")',
             "}",
             "complete -F _bk bk"]
    return "\n".join(lines) + "\n"


def zsh_completion(parser=None) -> str:
    nxt, cmds, opts, choices = _tables(parser or _parser())

    def described(pairs) -> str:
        # _describe reads "word:description"; a colon in the word is escaped.
        return "\n".join(w.replace(":", "\\:") + ":" + " ".join((h or w).split()) for w, h in pairs)

    def table(name: str, items: dict[str, str]) -> list[str]:
        return [f"typeset -gA {name}", f"{name}=("] + \
            [f"  {_shq(k)} {_shq(v)}" for k, v in items.items()] + [")"]

    lines = ["#compdef bk",
             "# zsh completion for bk (generated by tools/gen_docs.py from the argparse tree; do not edit)",
             "",
             *table("_bk_next", nxt),
             *table("_bk_cmds", {k: described(v) for k, v in cmds.items()}),
             *table("_bk_opts", {k: described(v) for k, v in opts.items()}),
             *table("_bk_choices", {k: " ".join(v) for k, v in choices.items()}),
             "",
             "_bk() {",
             "  local node=/ i w",
             "  local -a entries",
             "  for (( i = 2; i < CURRENT; i++ )); do",
             "    w=${words[i]}",
             "    [[ $w == -* ]] && continue",
             "    if [[ $node == / && $w == <-> ]]; then node=/book; break; fi  # bk 2 1h",
             '    (( ${+_bk_next[$node|$w]} )) || break',
             "    node=${_bk_next[$node|$w]}",
             "  done",
             '  if (( ${+_bk_choices[$node|${words[CURRENT-1]}]} )); then',
             '    compadd -- ${=_bk_choices[$node|${words[CURRENT-1]}]}',
             "  elif [[ $PREFIX == -* ]]; then",
             '    entries=("${(@f)_bk_opts[$node]}")',
             "    _describe -t options 'option' entries",
             '  elif (( ${+_bk_cmds[$node]} )); then',
             '    entries=("${(@f)_bk_cmds[$node]}")',
             "    _describe -t commands 'bk command' entries",
             "  else",
             "    _default",
             "  fi",
             "}",
             "",
             '_bk "$@"']
    return "\n".join(lines) + "\n"


def admin_manpage(parser=None) -> str:
    from bk.cli.manpage_admin import admin_page

    return admin_page(parser or _parser())


GENERATED = {
    "man/bk.1": manpage,
    "man/bk-admin.8": admin_manpage,
    "install/completion/bk.bash": bash_completion,
    "install/completion/_bk": zsh_completion,
}


def generate_all() -> dict[str, str]:
    """Repository path -> generated text, from one parser."""
    parser = _parser()
    return {path: make(parser) for path, make in GENERATED.items()}
