"""The hand-written scanners of ``bk.core.timegrid`` take exactly what the
patterns they replace take, with the same groups: every string over the
characters that matter up to a length, and random longer ones (Unicode
digits and spaces included: ``\\d`` and ``\\s`` are Unicode-wide, and so
are ``str.isdecimal`` and ``str.isspace``)."""

from __future__ import annotations

import itertools
import random
import re

import pytest

from bk.core import timegrid

DURATION = re.compile(r"(?:(\d{1,9})\s*d)?\s*(?:(\d{1,9})\s*h)?\s*(?:(\d{1,9})\s*m)?")
MEMORY = re.compile(r"(\d{0,15})(?:\.(\d{1,9}))?\s*([gm])(?:i?b)?")


def duration_by_pattern(s: str):
    m = DURATION.fullmatch(s)
    return None if m is None else m.groups()


def memory_by_pattern(s: str):
    m = MEMORY.fullmatch(s)
    return None if m is None else m.groups()


CASES = [
    (timegrid._duration_parts, duration_by_pattern, "1 dhm2x\u0663\u3000", ["1" * 9 + "m", "1" * 10 + "m",
     "1d 2h 3m", " 30m", " 1d", "+30m", "1h30m", "\u0661\u0662h", "1d\u20031h", "1d2d", "1m1h", "", " "]),
    (timegrid._memory_parts, memory_by_pattern, "1.gmib 5\u0665x", ["1" * 15 + "g", "1" * 16 + "g",
     "1." + "5" * 9 + "g", "1." + "5" * 10 + "g", ".5g", "1.g", "12gib", "12gb", "12ib", "12 m", "1.5.g",
     "g", "", "\u0661.\u0665g", "12gi", "12gbb"]),
]


@pytest.mark.parametrize("scan, pattern, alphabet, examples", CASES, ids=["duration", "memory"])
def test_scanner_is_its_pattern(scan, pattern, alphabet, examples):
    for n in range(6):
        for chars in itertools.product(alphabet, repeat=n):
            s = "".join(chars)
            assert scan(s) == pattern(s), s
    for s in examples:
        assert scan(s) == pattern(s), s
    seed = random.randrange(2 ** 32)
    rnd = random.Random(seed)
    pieces = ["1", "12", "123456789", "1234567890", " ", "d", "h", "m", "g", "ib", "b", ".", ".5", "\u0662",
              "\u2009", "x", "-", "+"]
    for _ in range(20000):
        s = "".join(rnd.choice(pieces) for _ in range(rnd.randrange(1, 9)))
        assert scan(s) == pattern(s), (s, f"seed {seed}")


def test_the_words_read_as_before():
    # What the parsers make of the scanners' parts, end to end.
    assert timegrid.parse_duration("1d 2h 30m", 5) == ((24 + 2) * 60 + 30) * 60
    assert timegrid.parse_duration(" 30m".strip(), 30) == 1800
    assert timegrid.parse_memory("1.5g") == 1536
    assert timegrid.parse_memory("\u0661\u0662 GiB") == 12 * 1024
    assert timegrid.parse_memory(".5g") == 512
    for bad in ("", "m", "1d2d", "1.5h", "30", "-1h"):
        with pytest.raises(timegrid.InvalidInput):
            timegrid.parse_duration(bad, 5)
    for bad in ("1.g", "g", "12", "0g", "1.0000000001g"):
        with pytest.raises(timegrid.InvalidInput):
            timegrid.parse_memory(bad)
