"""Command-line front end.  ``main.py`` stays tiny so ``bk --version`` is fast;
everything else is imported only when a command needs it."""
