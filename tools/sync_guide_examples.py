#!/usr/bin/env python3
"""Copy the English guide's examples into the Chinese guide, in place.

    python3 tools/sync_guide_examples.py           rewrite what differs in GUIDE.zh-CN.md
    python3 tools/sync_guide_examples.py --check   write nothing; exit 1 if any differs

bk prints English, so both guides show the same examples: every fenced block
of docs/GUIDE.md, with the `<!-- example: ... -->` directives right above it,
appears in docs/GUIDE.zh-CN.md in the same order, byte for byte; only the
prose around them is translated.  When a change to bk changes an output, edit
GUIDE.md and run this to carry the block over.  A block added or removed in
GUIDE.md has no place in the Chinese prose yet: the tool then changes nothing,
names the block and its line, and exits 2, for a person to add it (or take it
out) in the matching paragraph; after that the tool carries its content.
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
    changed = [i for i, (e, z) in enumerate(zip(en_ex, zh_ex, strict=True)) if e != z]
    for i in changed:
        print(f"GUIDE.zh-CN.md:{line_of(zh, zh_spans[i][0])} differs from "
              f"GUIDE.md:{line_of(en, en_spans[i][0])}")
    if args.check or not changed:
        return 1 if changed else 0
    out, last = [], 0
    for (a, b), new in zip(zh_spans, en_ex, strict=True):
        out += [zh[last:a], new]
        last = b
    ZH.write_text("".join(out) + zh[last:], encoding="utf-8")
    print(f"carried {len(changed)} example(s) into {ZH.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
