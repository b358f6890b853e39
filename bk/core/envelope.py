"""The one JSON envelope (SPEC 6.3) that the CLI, broker replies, MCP tools
and cluster calls all share.  Pure: builds dicts, never prints."""

from __future__ import annotations

from bk.core.errors import BkError

SCHEMA = "gpubk.v1"


def success(command: str, data: dict, warnings: list[str] | None = None) -> dict:
    return {"schema": SCHEMA, "command": command, "ok": True, "data": data,
            "warnings": list(warnings or [])}


def failure(command: str, error: BkError, warnings: list[str] | None = None) -> dict:
    return {"schema": SCHEMA, "command": command, "ok": False, "error": error.to_json(),
            "warnings": list(warnings or [])}


def is_envelope(obj: object) -> bool:
    """True when ``obj`` has the envelope's required keys and types."""
    if not isinstance(obj, dict) or obj.get("schema") != SCHEMA:
        return False
    if not isinstance(obj.get("command"), str) or not isinstance(obj.get("warnings"), list):
        return False
    if obj.get("ok") is True:
        return isinstance(obj.get("data"), dict)
    if obj.get("ok") is False:
        err = obj.get("error")
        return isinstance(err, dict) and isinstance(err.get("code"), str) and "message" in err
    return False


# A read the broker shares between ordinary users (a probe measured for
# another caller moments ago) says so in a warning that starts with this:
# ``bk doctor`` shows it beside its checks instead of counting it a failure.
SHARED_RESULT = "this result was measured "


def shared_result_note(age_s: float, op_name: str, every_s: float) -> str:
    return (f"{SHARED_RESULT}{age_s:.0f} s ago for another caller (ordinary users share one {op_name} "
            f"per {every_s:g} s); the administrator's is always fresh")
