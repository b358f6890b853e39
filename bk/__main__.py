"""Entry point for ``python -m bk`` and the ``bk.pyz`` zipapp."""

import sys

from bk.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
