#!/usr/bin/env python3
"""Regenerate man/bk.1 and the bash and zsh completions from bk's argparse tree.

    python3 tools/gen_docs.py           write the files that changed
    python3 tools/gen_docs.py --check   exit 1 if any is out of date (CI)

The generator is ``bk/cli/manpage.py``; the help texts live with each
command in ``bk/cli/*.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gen_docs.py", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when a generated file is out of date")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    # Documentation must not depend on this machine's terminal or locale.
    os.environ["COLUMNS"] = "80"
    from bk.cli.manpage import generate_all

    stale = []
    for rel, text in generate_all().items():
        path = ROOT / rel
        old = path.read_text(encoding="utf-8") if path.exists() else None
        if old == text:
            continue
        stale.append(rel)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
            print(f"wrote {rel}")
    if args.check and stale:
        for rel in stale:
            print(f"out of date: {rel}", file=sys.stderr)
        print("hint: run python3 tools/gen_docs.py and commit the result", file=sys.stderr)
        return 1
    if not stale:
        print("man page and completions are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
