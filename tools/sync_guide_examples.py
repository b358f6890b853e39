#!/usr/bin/env python3
"""Copy the English guide's examples into the Chinese guide, in place.

    python3 tools/sync_guide_examples.py           rewrite what differs in GUIDE.zh-CN.md
    python3 tools/sync_guide_examples.py --check   write nothing; exit 1 if any differs

bk prints English, so both guides show the same examples: every fenced block
of docs/GUIDE.md, with the `<!-- example: ... -->` directives right above it,
appears in docs/GUIDE.zh-CN.md in the same order, byte for byte, except the
prose comments inside them (``code_only``), which each guide writes in its own
language: a shell comment after a command (`$ bk c  # why`), a whole-line
`# comment` of a ```sh recipe, and the description after a recipe's command
(`bk w start    or run it in a terminal`).  Program output is never a comment.
When a change to bk changes an output, edit GUIDE.md and run this to carry the
block over; a line whose command is unchanged keeps its Chinese comment.  A
block added or removed in GUIDE.md has no place in the Chinese prose yet: the
tool then changes nothing, names the block and its line, and exits 2, for a
person to add it (or take it out) in the matching paragraph; after that the
tool carries its content.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EN, ZH = ROOT / "docs" / "GUIDE.md", ROOT / "docs" / "GUIDE.zh-CN.md"
FENCE = re.compile(r"^( *)```[^\n]*\n.*?^\1```[ \t]*$", re.M | re.S)
DIRECTIVES_ABOVE = re.compile(r"(?:^<!--\s*example:[^\n]*-->[ \t]*\n)+\Z", re.M)


def examples(text: str) -> list[tuple[int, int]]:
    """(start, end) of each example: a fenced block and the directive lines
    written directly above it."""
    spans = []
    for m in FENCE.finditer(text):
        above = DIRECTIVES_ABOVE.search(text, 0, m.start())
        spans.append((above.start() if above else m.start(), m.end()))
    return spans


PROMPT = re.compile(r"^(?:\$|ada\$|bob\$|gpubk\$|root#) ")
TRAILING = re.compile(r"(?<=\S)(\s+#\s.*)$")            # `cmd   # why`
COMMAND = re.compile(r"^(?:sudo |bk |bk$|systemctl |loginctl |journalctl |[A-Z_]+=\S+ )")
DESCRIBED = re.compile(r"(?<=\S)(  +\S.*)$")             # `bk w start    what it does`


def split_comment(line: str, kind: str) -> tuple[str, str]:
    """(the line without its prose comment, the comment) for a line of a
    block of ``kind``: ``session`` (prompt lines carry comments, output
    lines none), ``sh`` (``#`` comments) or ``recipe`` (commands with a
    description after two spaces, or a ``#`` comment)."""
    if kind == "session":
        m = TRAILING.search(line) if PROMPT.match(line) else None
    elif kind == "sh" and line.lstrip().startswith("# "):
        return line[:len(line) - len(line.lstrip())] + "#", line.lstrip()
    elif kind in ("sh", "recipe"):
        m = TRAILING.search(line)
        if m is None and kind == "recipe" and COMMAND.match(line):
            m = DESCRIBED.search(line)
    else:
        m = None
    return (line, "") if m is None else (line[:m.start()], m.group(1))


def _kind(example: str) -> str:
    fence = re.search(r"^ *```([^\n]*)\n", example, re.M)
    lang = fence.group(1).strip() if fence else ""
    body = example[fence.end():] if fence else ""
    first = next((ln for ln in body.splitlines() if ln.strip()), "")
    if PROMPT.match(first):
        return "session"
    if lang == "sh":
        return "sh"
    if lang in ("", "text", "console") and first and COMMAND.match(first):
        return "recipe"
    return "other"


def code_only(example: str) -> str:
    """An example without its prose comments: what both guides must share."""
    kind = _kind(example)
    return "\n".join(split_comment(ln, kind)[0] for ln in example.split("\n"))


def carry(en: str, zh: str) -> str:
    """The English example, keeping the Chinese comment of each line whose
    command is unchanged."""
    kind = _kind(en)
    theirs = {}
    for ln in zh.split("\n"):
        code, comment = split_comment(ln, kind)
        if comment:
            theirs.setdefault(code, ln)
    out = []
    for ln in en.split("\n"):
        code, comment = split_comment(ln, kind)
        out.append(theirs.get(code, ln) if comment else ln)
    return "\n".join(out)


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sync_guide_examples.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when an example differs, 2 when the count does")
    args = parser.parse_args(argv)
    en, zh = EN.read_text(encoding="utf-8"), ZH.read_text(encoding="utf-8")
    en_spans, zh_spans = examples(en), examples(zh)
    en_ex = [en[a:b] for a, b in en_spans]
    zh_ex = [zh[a:b] for a, b in zh_spans]
    if len(en_ex) != len(zh_ex):
        print(f"GUIDE.md has {len(en_ex)} examples, GUIDE.zh-CN.md {len(zh_ex)}; nothing was "
              "changed. Add or remove these in GUIDE.zh-CN.md by hand, in the matching paragraph:",
              file=sys.stderr)
        sm = difflib.SequenceMatcher(None, zh_ex, en_ex, autojunk=False)
        for op, i1, i2, j1, j2 in sm.get_opcodes():
            for j in range(j1, j2) if op in ("insert", "replace") else ():
                first = en_ex[j].strip().splitlines()[0][:70]
                print(f"  only in GUIDE.md:{line_of(en, en_spans[j][0])}: {first}", file=sys.stderr)
            for i in range(i1, i2) if op in ("delete", "replace") else ():
                first = zh_ex[i].strip().splitlines()[0][:70]
                print(f"  only in GUIDE.zh-CN.md:{line_of(zh, zh_spans[i][0])}: {first}",
                      file=sys.stderr)
        return 2
    changed = [i for i, (e, z) in enumerate(zip(en_ex, zh_ex, strict=True)) if code_only(e) != code_only(z)]
    for i in changed:
        print(f"GUIDE.zh-CN.md:{line_of(zh, zh_spans[i][0])} differs from "
              f"GUIDE.md:{line_of(en, en_spans[i][0])}")
    if args.check or not changed:
        return 1 if changed else 0
    out, last = [], 0
    for i, ((a, b), new) in enumerate(zip(zh_spans, en_ex, strict=True)):
        out += [zh[last:a], carry(new, zh_ex[i]) if i in changed else zh_ex[i]]
        last = b
    ZH.write_text("".join(out) + zh[last:], encoding="utf-8")
    print(f"carried {len(changed)} example(s) into {ZH.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
