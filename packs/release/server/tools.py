"""The release pack: the owner's "I don't want this version", through the platform.

The platform (``releases.requested``) is the only authority: ``rollback`` calls
``/internal/releases/rollback/`` with the capability of the call it is executing (the
gateway decided it ``self_change`` because the owner asked); the request is queued and
executed at the next idle moment, or refused with the reason. ``rollback_status`` reads it
back. A connection that fails during ``rollback`` is ``unknown`` (check with
``rollback_status``): the platform may or may not have queued it.
The fake (``fake/tools.py``) runs these same handlers against an in-memory platform.
"""

from __future__ import annotations

from typing import Any

from capabilities.packkit import PlatformLost, PlatformNotConfigured, ToolRegistry, effect, platform_call, receipt, value

TOOLS = ToolRegistry()
SOURCE = "yimi releases"
WHAT_IT_DOES_NOT = "only code and configuration go back: the database is not restored and nothing done outside is undone"

ROLLBACK_SCHEMA = {
    "type": "object",
    "properties": {"reason": {"type": "string", "minLength": 1, "maxLength": 2000, "description": "the owner's own words"}},
    "required": ["reason"],
}
STATUS_SCHEMA = {"type": "object", "properties": {"request_id": {"type": "string", "maxLength": 64}}}


def call(method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """One request to ``/internal/releases/<path>``: (HTTP status, parsed JSON or None)."""
    return platform_call(method, "releases/" + path, body)


def refuse(code: str, message: str, *, retry: str = "forbidden") -> dict[str, Any]:
    return receipt("failed", summary=message, retry=retry, error=(code, message[:1000]))


def failure(status: int, payload: Any, *, changes: bool) -> dict[str, Any]:
    error = payload.get("error") if isinstance(payload, dict) else None
    code = str(error.get("code")) if isinstance(error, dict) and error.get("code") else f"http_{status}"
    message = str(error.get("message", "")) if isinstance(error, dict) else f"the platform answered HTTP {status}"
    if status >= 500 and changes:
        return receipt("unknown", summary=f"the platform failed while queueing (HTTP {status})", unknowns=["whether the request was queued"],
                       retry="after_check", check_with="rollback_status", error=(code, message[:1000]))
    return refuse(code, message or code, retry="allowed" if status >= 500 or status == 429 else "forbidden")


def request_values(payload: dict[str, Any]) -> list[dict[str, Any]]:
    return [value("state", payload.get("state"), None, SOURCE), value("from_build", payload.get("from_build") or None, None, SOURCE)]


@TOOLS("Queue going back to the previous version of Yimi because the owner does not want this one; reason = the owner's own words.", ROLLBACK_SCHEMA)
def rollback(args: dict[str, Any]) -> dict[str, Any]:
    reason = args.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        return refuse("invalid_request", "rollback needs the owner's own words as the reason")
    try:
        status, payload = call("POST", "rollback/", {"reason": reason})
    except PlatformNotConfigured as exc:
        return refuse("not_configured", str(exc))
    except PlatformLost as exc:
        return receipt("unknown", summary=str(exc), unknowns=["whether the request was queued"], retry="after_check",
                       check_with="rollback_status", error=(exc.code, str(exc)))
    if status != 200 or not isinstance(payload, dict) or "request_id" not in payload:
        return failure(status, payload, changes=True)
    return receipt(
        "succeeded",
        summary=f"the request to go back to the previous version is {payload['state']}; it runs at the next quiet moment ({WHAT_IT_DOES_NOT})",
        effects=[effect(f"rollback_request:{payload['request_id']}", "queue", "service_ack")],
        values=request_values(payload),
        content=payload,
        retry="forbidden",
    )


@TOOLS("How the owner's latest request to go back to the previous version went, or the one with this request_id.", STATUS_SCHEMA)
def rollback_status(args: dict[str, Any]) -> dict[str, Any]:
    body = {"request_id": args["request_id"]} if isinstance(args.get("request_id"), str) and args["request_id"] else {}
    try:
        status, payload = call("POST", "status/", body)
    except PlatformNotConfigured as exc:
        return refuse("not_configured", str(exc))
    except PlatformLost as exc:
        return receipt("unknown", summary=str(exc), unknowns=["how the request went"], retry="allowed", error=(exc.code, str(exc)))
    if status != 200 or not isinstance(payload, dict) or "request_id" not in payload:
        return failure(status, payload, changes=False)
    summary = f"the request to go back to the previous version is {payload['state']}"
    if payload.get("state_reason"):
        summary += f": {payload['state_reason']}"
    return receipt("succeeded", summary=summary, values=request_values(payload), content=payload)
