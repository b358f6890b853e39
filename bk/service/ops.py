"""The operation table's former address: the table is the face of the
service layer now (``bk.service``); these names stay importable from here."""

from __future__ import annotations

from bk.service import (  # noqa: F401
    ADMIN,
    ANYONE,
    HOST,
    OPERATIONS,
    OWNER,
    READ,
    WRITE,
    Operation,
    get,
    served,
    writes,
)
