"""Fake schedule: the same tools and receipts, with reminders kept in memory.

It applies the platform's rules (``schedules.reminders``): the idempotency key is looked up
first, the text is 1-500 characters, ``due_at`` is ISO 8601 with a timezone and in the
future, a cancelled reminder cancels again without error. Nothing ever fires.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from capabilities.packkit import ToolRegistry, effect, receipt, value

TOOLS = ToolRegistry()
SOURCE = "yimi platform"
REMINDERS: dict[str, dict[str, Any]] = {}
KEYS: dict[str, str] = {}

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


def refuse(code: str, message: str) -> dict[str, Any]:
    return receipt("failed", summary=message, retry="forbidden", error=(code, message))


def utc(value: datetime) -> str:
    return value.astimezone(UTC).isoformat()


@TOOLS("Remind the owner of something at a given time (ISO 8601 with a timezone).", CREATE_SCHEMA)
def create_reminder(args: dict[str, Any]) -> dict[str, Any]:
    text, due_at, key = args.get("text"), args.get("due_at"), args.get("idempotency_key")
    if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= 64):
        return refuse("invalid_request", "idempotency_key must be a string of 1 to 64 characters")
    replayed = key is not None and key in KEYS
    if replayed:
        reminder = REMINDERS[KEYS[key]]
    else:
        if not isinstance(text, str) or not text.strip() or len(text.strip()) > 500:
            return refuse("invalid_request", "text must be 1 to 500 characters")
        try:
            due = datetime.fromisoformat(due_at.strip()) if isinstance(due_at, str) else None
        except ValueError:
            due = None
        if due is None:
            return refuse("invalid_request", "due_at must be an ISO 8601 date and time with a timezone")
        if due.tzinfo is None or due.utcoffset() is None:
            return refuse("invalid_request", "due_at needs a timezone (for example 2026-12-01T09:00:00+08:00)")
        if due <= datetime.now(UTC):
            return refuse("invalid_request", "due_at must be in the future")
        reminder = {
            "id": str(uuid.uuid4()),
            "text": text.strip(),
            "due_at": utc(due),
            "state": "scheduled",
            "created_at": utc(datetime.now(UTC)),
            "fired_at": None,
            "cancelled_at": None,
        }
        REMINDERS[reminder["id"]] = reminder
        if key is not None:
            KEYS[key] = reminder["id"]
    summary = f"reminder set for {reminder['due_at']}: {reminder['text']}" + (" (set by the earlier call)" if replayed else "")
    return receipt("succeeded", summary=summary, effects=[effect(f"reminder:{reminder['id']}", "create", "service_ack")],
                   content={"items": [dict(reminder)]},
                   values=[value("due_at", reminder["due_at"], None, SOURCE), value("replayed", replayed, None, SOURCE)])


@TOOLS("List the owner's scheduled reminders (with include_done, fired and cancelled ones too).", LIST_SCHEMA)
def list_reminders(args: dict[str, Any]) -> dict[str, Any]:
    include_done = args.get("include_done", False)
    if not isinstance(include_done, bool):
        return refuse("invalid_request", "include_done must be true or false")
    items = sorted(
        (dict(r) for r in REMINDERS.values() if include_done or r["state"] == "scheduled"),
        key=lambda r: (r["due_at"], r["created_at"]),
    )
    return receipt("succeeded", summary=f"{len(items)} reminders", content={"items": items},
                   values=[value("reminder_count", len(items), "reminder", SOURCE)])


@TOOLS("Cancel a scheduled reminder by its id.", CANCEL_SCHEMA)
def cancel_reminder(args: dict[str, Any]) -> dict[str, Any]:
    try:
        rid = str(uuid.UUID(str(args.get("reminder_id"))))
    except ValueError:
        return refuse("not_found", "there is no such reminder")
    reminder = REMINDERS.get(rid)
    if reminder is None:
        return refuse("not_found", "there is no such reminder")
    if reminder["state"] == "fired":
        return refuse("reminder_already_fired", "this reminder has already fired; it cannot be cancelled")
    if reminder["state"] == "scheduled":
        reminder["state"], reminder["cancelled_at"] = "cancelled", utc(datetime.now(UTC))
    return receipt("succeeded", summary=f"cancelled the reminder for {reminder['due_at']}: {reminder['text']}",
                   effects=[effect(f"reminder:{rid}", "cancel", "service_ack")], content={"items": [dict(reminder)]})
