"""Fake messaging: the same tools and receipts, kept in memory (nothing leaves it: a send
is ``failed``/``not_sent`` with a verified ``save`` on the local outbox, as the real server's)."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from email.utils import parseaddr
from typing import Any

from capabilities.packkit import ToolRegistry, effect, receipt, value

TOOLS = ToolRegistry()
SOURCE = "local outbox"
FOLDERS = {"send": "outbox", "draft": "drafts"}
OUTBOX = "local outbox"
NOT_SENT = "no mail server is configured: the message was written to the local outbox on this host and not handed to any mail server"
MAX_BODY = 100_000
ADDRESS = re.compile(r"^[^@\s<>\"(),;:]+@[A-Za-z0-9.-]+$")
STORE: dict[str, list[dict[str, Any]]] = {"outbox": [], "drafts": []}

SEND_SCHEMA = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": ["send", "draft"]},
        "to": {"type": "string", "minLength": 3, "maxLength": 320, "description": "one email address"},
        "subject": {"type": "string", "maxLength": 200},
        "body": {"type": "string", "maxLength": MAX_BODY},
        "idempotency_key": {"type": "string", "maxLength": 128},
    },
    "required": ["action", "to", "subject", "body"],
}
LIST_SCHEMA = {
    "type": "object",
    "properties": {
        "folder": {"type": "string", "enum": ["outbox", "drafts", "all"]},
        "to": {"type": "string", "maxLength": 320},
        "limit": {"type": "integer", "minimum": 1, "maximum": 200},
    },
}


def refuse(code: str, message: str) -> dict[str, Any]:
    return receipt("failed", summary=message, retry="forbidden", error=(code, message))


def valid_recipient(to: Any) -> str | None:
    if not isinstance(to, str) or "\r" in to or "\n" in to or len(to) > 320:
        return None
    _, address = parseaddr(to)
    return address if ADDRESS.match(address or "") else None


def public(msg: dict[str, Any]) -> dict[str, Any]:
    return {k: msg[k] for k in ("message_id", "folder", "to", "subject", "date")}


def done(msg: dict[str, Any], action: str, replayed: bool) -> dict[str, Any]:
    again = " (the earlier call's message; nothing new stored)" if replayed else ""
    values = [value("recipients", 1, "person", SOURCE), value("size", msg["size"], "byte", SOURCE), value("replayed", replayed, None, SOURCE)]
    if action == "send":
        summary = f"wrote {msg['subject']!r} for {msg['to']} to the local outbox on this host; not handed to any mail server{again}"
        return receipt("failed", summary=summary, effects=[effect(OUTBOX, "save", "verified")], values=values,
                       content={"items": [public(msg)]}, retry="forbidden", error=("not_sent", NOT_SENT))
    return receipt("succeeded", summary=f"kept a draft of {msg['subject']!r} to {msg['to']}{again}", effects=[effect(msg["to"], action, "verified")],
                   values=values, content={"items": [public(msg)]}, retry="allowed")


@TOOLS("Write a message to one recipient into the local outbox (action send; no mail server is configured, so it is not sent), "
       "or keep it as a draft (action draft).", SEND_SCHEMA)
def send(args: dict[str, Any]) -> dict[str, Any]:
    action, subject, body, key = args.get("action"), args.get("subject"), args.get("body"), args.get("idempotency_key")
    if action not in FOLDERS:
        return refuse("invalid_request", "action must be send or draft")
    address = valid_recipient(args.get("to"))
    if address is None:
        return refuse("invalid_recipient", f"{args.get('to')!r} is not one email address")
    if not isinstance(subject, str) or len(subject) > 200 or "\r" in subject or "\n" in subject:
        return refuse("invalid_request", "subject must be one line of at most 200 characters")
    if not isinstance(body, str) or len(body) > MAX_BODY:
        return refuse("invalid_request", f"body must be text of at most {MAX_BODY} characters")
    if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= 128 or "\r" in key or "\n" in key):
        return refuse("invalid_request", "idempotency_key must be one line of 1 to 128 characters")
    folder = STORE[FOLDERS[action]]
    for msg in folder:
        if key and msg["key"] == key:
            return done(msg, action, replayed=True)
    msg = {
        "message_id": f"<{uuid.uuid4().hex}@yimi.localhost>",
        "folder": FOLDERS[action],
        "to": address,
        "subject": subject,
        "body": body,
        "date": datetime.now(UTC).replace(microsecond=0).isoformat(),
        "key": key,
        "size": len(body.encode("utf-8")) + 200,  # headers included, roughly
    }
    folder.append(msg)
    return done(msg, action, replayed=False)


def _list(args: dict[str, Any]) -> dict[str, Any]:
    which, to, limit = args.get("folder", "all"), args.get("to"), args.get("limit", 50)
    if which not in ("outbox", "drafts", "all"):
        return refuse("invalid_request", "folder must be outbox, drafts or all")
    if to is not None and valid_recipient(to) is None:
        return refuse("invalid_recipient", f"{to!r} is not one email address")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 200:
        return refuse("invalid_request", "limit must be an integer from 1 to 200")
    wanted = valid_recipient(to) if to is not None else None
    items = [
        public(m)
        for name in (list(FOLDERS.values()) if which == "all" else [which])
        for m in STORE[name]
        if wanted is None or m["to"].lower() == wanted.lower()
    ]
    items.sort(key=lambda i: (i["date"], i["message_id"]), reverse=True)
    return receipt("succeeded", summary=f"{len(items)} messages", content={"items": items[:limit]},
                   values=[value("message_count", len(items), "message", SOURCE)])


_list.__name__ = "list"  # the tool is called ``list``; the function keeps the builtin usable
TOOLS("List the messages in the local outbox (not sent) and the drafts kept, newest first.", LIST_SCHEMA)(_list)
