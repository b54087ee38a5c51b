"""The health pack: read the owner's health records (rides and sport sessions from the
watch, daily summaries from the phone), through the platform.

Records are written only by the owner's own devices (``health.record`` frames,
``memory.personal.health``); this server reads them from ``/internal/health/read/`` with the
capability of the call it is executing. The fake (``fake/tools.py``) runs this same
handler against an in-memory platform.
"""

from __future__ import annotations

from typing import Any

from capabilities.packkit import PlatformLost, PlatformNotConfigured, ToolRegistry, platform_call, receipt, value

TOOLS = ToolRegistry()
SOURCE = "yimi health records"
KINDS = ["daily_summary", "cycling", "running", "walking", "hiking", "swimming", "workout"]

READ_SCHEMA = {
    "type": "object",
    "properties": {
        "after": {"type": "string", "description": "ISO 8601 time with a time zone: records starting at or after it"},
        "before": {"type": "string", "description": "ISO 8601 time with a time zone: records starting before it"},
        "kind": {"type": "string", "enum": KINDS},
        "limit": {"type": "integer", "minimum": 1, "maximum": 100, "description": "at most this many, newest first (default 50)"},
    },
}


def call(path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """One request to ``/internal/health/<path>``: (HTTP status, parsed JSON or None)."""
    return platform_call("POST", "health/" + path, body)


def refuse(code: str, message: str, *, retry: str = "forbidden") -> dict[str, Any]:
    return receipt("failed", summary=message, retry=retry, error=(code, message[:1000]))


@TOOLS("Read the owner's health records in a time range (after/before, ISO 8601): rides and sport sessions from the watch, daily summaries from the phone, each with its metrics.", READ_SCHEMA)
def read(args: dict[str, Any]) -> dict[str, Any]:
    body = {k: args[k] for k in ("after", "before", "kind", "limit") if k in args}
    try:
        status, payload = call("read/", body)
    except PlatformNotConfigured as exc:
        return refuse("not_configured", str(exc))
    except PlatformLost as exc:
        return receipt("unknown", summary=str(exc), unknowns=["the records"], retry="allowed", error=(exc.code, str(exc)))
    if status != 200 or not isinstance(payload, dict) or not isinstance(payload.get("records"), list):
        error = payload.get("error") if isinstance(payload, dict) else None
        code = str(error.get("code")) if isinstance(error, dict) and error.get("code") else f"http_{status}"
        message = str(error.get("message", "")) if isinstance(error, dict) else f"the platform answered HTTP {status}"
        return refuse(code, message or code, retry="allowed" if status >= 500 or status == 429 else "forbidden")
    records = payload["records"]
    kinds = sorted({r.get("kind") for r in records})
    summary = f"{len(records)} health records" + (f" ({', '.join(kinds)})" if kinds else "")
    return receipt("succeeded", summary=summary, values=[value("records", len(records), "record", SOURCE)], content={"items": records})
