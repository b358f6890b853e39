"""The ``--json PATH`` file every benchmark writes (read by ``ab.py``)."""

from __future__ import annotations

import json
import os


def write_cells(path: str, benchmark: str, cells: dict, settings: dict) -> None:
    """Write the cells file atomically: a reader never sees half of it."""
    doc = {"benchmark": benchmark, "format": 1, "settings": settings, "cells": cells}
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
