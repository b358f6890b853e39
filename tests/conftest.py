"""Fixtures every test file may use."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_build import archive

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def pyz() -> Path:
    """The archive built once from this tree, for tests that run ``bk.pyz``
    as a user would (a fresh process, the zipapp's own imports).  Shared by
    the whole session: copy it (helpers_build.copy_to) to change it."""
    return archive()
