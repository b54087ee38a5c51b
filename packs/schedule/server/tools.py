"""The schedule pack: reminders kept by the platform, reached over its internal API.

The platform (``schedules.reminders``) stores the reminders and fires them into the owner's
timeline; this server only calls its internal endpoints (``/internal/reminders/...`` on
the platform socket, ``YIMI_PLATFORM_SOCKET``, through ``packkit.platform_call``) with the
capability of the call it is executing. A connection that fails or times out is reported as ``DISCONNECTED`` or
``TIMEOUT`` with status ``unknown``: the platform may or may not have acted.
"""

from __future__ import annotations

import uuid
from typing import Any

from capabilities.packkit import PlatformLost, PlatformNotConfigured, ToolRegistry, effect, platform_call, receipt, value

TOOLS = ToolRegistry()
SOURCE = "yimi platform"

CREATE_SCHEMA = {
    "type": "object",
    "properties": {
        "text": {"type": "string", "minLength": 1, "maxLength": 500, "description": "what to remind the owner of"},
        "due_at": {"type": "string", "description": "ISO 8601 date and time with a timezone, e.g. 2026-12-01T09:00:00+08:00"},
        "idempotency_key": {"type": "string", "maxLength": 64},
    },
    "required": ["text", "due_at"],
}
LIST_SCHEMA = {"type": "object", "properties": {"include_done": {"type": "boolean"}}}
CANCEL_SCHEMA = {"type": "object", "properties": {"reminder_id": {"type": "string"}}, "required": ["reminder_id"]}


Lost = PlatformLost
NotConfigured = PlatformNotConfigured


def call(method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """One request to ``/internal/<path>``: (HTTP status, parsed JSON or None)."""
    return platform_call(method, "" + path, body)


def lost(exc: Lost, doubt: str) -> dict[str, Any]:
    return receipt("unknown", summary=str(exc), unknowns=[doubt], retry="after_check", check_with="list_reminders",
                   error=(exc.code, str(exc)))


def refuse(code: str, message: str, retry: str = "forbidden") -> dict[str, Any]:
    return receipt("failed", summary=message, retry=retry, error=(code, message))


def http_failure(status: int, payload: Any, *, changes: bool) -> dict[str, Any]:
    error = payload.get("error") if isinstance(payload, dict) else None
    code = str(error.get("code")) if isinstance(error, dict) and error.get("code") else f"http_{status}"
    message = str(error.get("message", "")) if isinstance(error, dict) else f"the platform answered HTTP {status}"
    if status >= 500 and changes:
        return receipt("unknown", summary=f"the platform failed during the call (HTTP {status})", unknowns=["whether the change was made"],
                       retry="after_check", check_with="list_reminders", error=(code, message[:1000]))
    return refuse(code, message[:1000] or code, retry="allowed" if status >= 500 or status == 429 else "forbidden")


def reminder_effect(reminder: dict[str, Any], action: str) -> dict[str, Any]:
    return effect(f"reminder:{reminder['id']}", action, "service_ack")


@TOOLS("Remind the owner of something at a given time (ISO 8601 with a timezone).", CREATE_SCHEMA)
def create_reminder(args: dict[str, Any]) -> dict[str, Any]:
    body = {k: args.get(k) for k in ("text", "due_at", "idempotency_key") if k in args}
    try:
        status, payload = call("POST", "reminders/", body)
    except NotConfigured as exc:
        return refuse("not_configured", str(exc))
    except Lost as exc:
        return lost(exc, "whether the reminder was created")
    if status not in (200, 201) or not isinstance(payload, dict) or not isinstance(payload.get("reminder"), dict):
        return http_failure(status, payload, changes=True)
    reminder, replayed = payload["reminder"], not payload.get("created", True)
    summary = f"reminder set for {reminder['due_at']}: {reminder['text']}" + (" (set by the earlier call)" if replayed else "")
    return receipt("succeeded", summary=summary, effects=[reminder_effect(reminder, "create")], content={"items": [reminder]},
                   values=[value("due_at", reminder["due_at"], None, SOURCE), value("replayed", replayed, None, SOURCE)])


@TOOLS("List the owner's scheduled reminders (with include_done, fired and cancelled ones too).", LIST_SCHEMA)
def list_reminders(args: dict[str, Any]) -> dict[str, Any]:
    include_done = args.get("include_done", False)
    if not isinstance(include_done, bool):
        return refuse("invalid_request", "include_done must be true or false")
    try:
        status, payload = call("GET", "reminders/" + ("?include_done=1" if include_done else ""))
    except NotConfigured as exc:
        return refuse("not_configured", str(exc))
    except Lost as exc:
        return lost(exc, "which reminders are scheduled")
    if status != 200 or not isinstance(payload, dict) or not isinstance(payload.get("reminders"), list):
        return http_failure(status, payload, changes=False)
    items = payload["reminders"]
    return receipt("succeeded", summary=f"{len(items)} reminders", content={"items": items},
                   values=[value("reminder_count", len(items), "reminder", SOURCE)])


@TOOLS("Cancel a scheduled reminder by its id.", CANCEL_SCHEMA)
def cancel_reminder(args: dict[str, Any]) -> dict[str, Any]:
    try:
        rid = str(uuid.UUID(str(args.get("reminder_id"))))
    except ValueError:
        return refuse("not_found", "there is no such reminder")
    try:
        status, payload = call("POST", f"reminders/{rid}/cancel/", {})
    except NotConfigured as exc:
        return refuse("not_configured", str(exc))
    except Lost as exc:
        return lost(exc, "whether the reminder was cancelled")
    if status != 200 or not isinstance(payload, dict) or not isinstance(payload.get("reminder"), dict):
        return http_failure(status, payload, changes=True)
    reminder = payload["reminder"]
    return receipt("succeeded", summary=f"cancelled the reminder for {reminder['due_at']}: {reminder['text']}",
                   effects=[reminder_effect(reminder, "cancel")], content={"items": [reminder]})
