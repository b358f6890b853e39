"""Regular expressions compiled when first used, not at import.

Every bk command is a new process.  A module-level ``re.compile`` runs at
import whether or not the command ever matches anything: 50-500 us a pattern
(a large character class, such as the terminal-unsafe characters, costs the
most), and the everyday commands import a dozen such patterns while a read
like ``bk l`` uses one or two.  ``Pattern`` stands in for the compiled
pattern: the first call of a matching method compiles it and puts the
compiled pattern's own bound methods on the instance, so every later call
goes straight to ``re`` with no extra Python frame (it matters for the
per-cell patterns of a 10,000-row table).  ``re`` itself is imported then
too: with ``enum`` and the pattern compiler it costs about 3 ms, more than
``bk l`` spends on anything else, and most commands never match a pattern.
"""

from __future__ import annotations

_METHODS = ("match", "fullmatch", "search", "sub", "subn", "findall", "finditer", "split")


class Pattern:
    """``re.compile(pattern, flags)``, deferred to the first use."""

    def __init__(self, pattern: str, flags: int = 0):
        self.pattern, self.flags = pattern, flags

    def compiled(self):
        import re

        done = re.compile(self.pattern, self.flags)
        # Instance attributes win over these methods (functions are non-data
        # descriptors), so later calls skip this class entirely.
        for name in _METHODS:
            setattr(self, name, getattr(done, name))
        self.compiled = lambda: done
        return done

    def match(self, *args, **kwargs):
        return self.compiled().match(*args, **kwargs)

    def fullmatch(self, *args, **kwargs):
        return self.compiled().fullmatch(*args, **kwargs)

    def search(self, *args, **kwargs):
        return self.compiled().search(*args, **kwargs)

    def sub(self, *args, **kwargs):
        return self.compiled().sub(*args, **kwargs)

    def subn(self, *args, **kwargs):
        return self.compiled().subn(*args, **kwargs)

    def findall(self, *args, **kwargs):
        return self.compiled().findall(*args, **kwargs)

    def finditer(self, *args, **kwargs):
        return self.compiled().finditer(*args, **kwargs)

    def split(self, *args, **kwargs):
        return self.compiled().split(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Pattern({self.pattern!r})"
