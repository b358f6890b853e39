"""``bk.core.textfold.wrap`` is ``textwrap.wrap`` (for the options bk
passes): every text up to a length over the characters its rules look at
(letters, digits, hyphens, punctuation, ASCII and other whitespace, tabs),
at every width that matters for it, and random long texts."""

from __future__ import annotations

import itertools
import random
import textwrap

import pytest

from bk.core import textfold

ALPHABET = "a1- .\t_\u3000é"


def same(text: str, width: int, **options) -> None:
    assert textfold.wrap(text, width, **options) == textwrap.wrap(text, width, **options), \
        (text, width, options)


@pytest.mark.parametrize("hyphens", [True, False])
def test_every_short_text(hyphens):
    for n in range(6):
        for chars in itertools.product(ALPHABET, repeat=n):
            text = "".join(chars)
            assert textfold.chunks(textfold._plain(text), hyphens) == \
                textwrap.TextWrapper(break_on_hyphens=hyphens)._split_chunks(text), text
            if n <= 4:
                for width in (1, 2, 3):
                    same(text, width, break_on_hyphens=hyphens)


def test_random_texts_widths_and_indents():
    seed = random.randrange(2 ** 32)
    rnd = random.Random(seed)
    words = ["sim-count", "a-b-c", "ab-cd-ef", "--", "---", "x--y", "e.g.--it", "-b", "1-2", "é-ß", "well-",
             "-x", "_-_", "/proc/driver/nvidia/version", "a", "word", "longerwordthanthewidth", "12g",
             "07-13", "20:00–21:30", "\t", "\n", "  ", "\u3000", "\x1b[1m", "ab--", "--ab", "x-\u3000y"]
    for _ in range(6000):
        text = "".join(rnd.choice(words) + rnd.choice(["", " ", "  ", "-", "\n"]) for _ in range(rnd.randrange(12)))
        width = rnd.choice([1, 2, 4, 7, 10, 20, 40, 80])
        # (An indent as wide as the line can make textwrap loop forever; bk's are narrower.)
        indents = [i for i in ("", "  ", "hint: ", "    ", "x" * 12) if len(i) < width]
        options = {"initial_indent": rnd.choice(indents), "subsequent_indent": rnd.choice(indents),
                   "break_long_words": rnd.random() < 0.8, "break_on_hyphens": rnd.random() < 0.7}
        try:
            same(text, width, **options)
        except AssertionError:
            raise AssertionError(f"seed {seed}") from None


def test_a_width_below_one_is_refused_as_textwrap_does():
    for width in (0, -3):
        with pytest.raises(ValueError) as ours:
            textfold.wrap("a b", width)
        with pytest.raises(ValueError) as theirs:
            textwrap.wrap("a b", width)
        assert str(ours.value) == str(theirs.value)
