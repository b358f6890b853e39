"""One account-name lookup (issue 24, item 6): ``bk.users.user_name`` is the
only code that turns a UID into a name, and a UID whose account is gone
answers ``None`` so that each caller shows its own fallback."""

from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path

import pytest
from helpers_broker import Accounts

from bk.users import user_name

ROOT = Path(__file__).resolve().parents[1]


def test_a_live_account_has_its_name_and_a_deleted_one_none(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: creates and deletes a user")
    accounts = Accounts(tmp_path)
    try:
        who = accounts.user()
        assert user_name(who.uid) == who.name
        subprocess.run(["userdel", who.name], check=True, capture_output=True)
        accounts.users.remove(who)
        assert user_name(who.uid) is None
    finally:
        accounts.cleanup()


def test_a_uid_past_uid_t_is_no_account():
    assert user_name(2**40) is None


def _name_lookups(path: Path) -> list[int]:
    """Lines where ``path`` reads ``.pw_name`` off ``getpwuid(...)``."""
    tree = ast.parse(path.read_text())
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr == "pw_name"
            and isinstance(node.value, ast.Call) and getattr(node.value.func, "attr", None) == "getpwuid"]


def test_no_module_but_bk_users_looks_up_an_account_name():
    copies = {str(p.relative_to(ROOT)): lines for p in sorted((ROOT / "bk").rglob("*.py"))
              if p.name != "users.py" or p.parent.name != "bk"
              for lines in [_name_lookups(p)] if lines}
    assert copies == {}, "use bk.users.user_name instead"
    assert _name_lookups(ROOT / "bk" / "users.py")
