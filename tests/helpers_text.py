"""Hostile text for the display tests: one sample of each class of
character the one text policy (bk.core.safetext) neutralises, and the
pattern no human view may print."""

from __future__ import annotations

import re

# One of each class the text policy neutralises (bk.core.safetext), with
# what a terminal would do with it.
CLASSES = {
    "C0 ESC (CSI: clear the screen)": "\x1b[2J",
    "C0 BEL ending an OSC title change": "\x1b]0;owned\x07",
    "OSC 8 hyperlink": "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\",
    "OSC 52 clipboard write": "\x1b]52;c;cm0gLXJmIH4K\x07",
    "CSI 8m hidden text": "\x1b[8msecret\x1b[0m",
    "C0 CR overwrite": "rm -rf /\rls      ",
    "C0 backspace": "a\bb",
    "DEL": "\x7f",
    "C1 one-byte CSI": "\x9b2J",
    "C1 one-byte OSC": "\x9d0;t\x9c",
    "bidi override": "\u202eabc\u202c",
    "bidi embeddings": "\u202a\u202b\u202d",
    "bidi isolates": "\u2066\u2067\u2068\u2069",
    "bidi marks": "\u200e\u200f\u061c",
    "zero-width space, joiners, word joiner, BOM": "a\u200bb\u200cc\u200dd\u2060e\ufefff",
    "soft hyphen and other Cf": "\u00ad\u180e\ufff9",
    "tag characters": "\U000e0001\U000e0041",
    "line and paragraph separators": "\u2028\u2029",
    "lone surrogate": "\ud800",
    "Hangul fillers": "\u3164\u115f\u1160\uffa0",
}
# What no human view may print: every C0 control but the newline, DEL, C1,
# and every character of the classes above.
STRICT = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u00ad\u061c\u115f\u1160\u180e\u200b-\u200f"
                    "\u2028-\u202e\u2060-\u2069\u3164\ufeff\uffa0\ufff9-\ufffb\ud800-\udfff"
                    "\U000e0000-\U000e007f]")

# Everything at once, for views that show one field.
EVERY = "".join(CLASSES.values())
