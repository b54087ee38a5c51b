"""The messaging pack: messages delivered into a local Maildir (``YIMI_MAIL_DIR``).

``send`` writes an RFC 5322 message from ``Yimi <yimi@localhost>`` into the folder ``sent``
and a copy into the recipient's folder (``inbox-<slug of the address>``), then re-reads
both by key: the effect is ``verified`` only when both copies read back with the same
Message-ID, recipient and body. ``draft`` stores the message in ``drafts`` instead.

With an ``idempotency_key`` (injected by the gateway), a retried call returns the message
the first call stored (same Message-ID) instead of storing a second one; a send that was
interrupted after the ``sent`` copy gets its recipient copy completed. Checks and writes
run under an exclusive lock on the Maildir, so two retries cannot both deliver.
"""

from __future__ import annotations

import email.policy
import fcntl
import mailbox
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from email.message import EmailMessage
from email.parser import BytesHeaderParser, BytesParser
from email.utils import format_datetime, make_msgid, parseaddr, parsedate_to_datetime
from pathlib import Path
from typing import Any

from capabilities.packkit import ToolRegistry, effect, receipt, value

TOOLS = ToolRegistry()
SENDER = "Yimi <yimi@localhost>"
KEY_HEADER = "X-Yimi-Idempotency-Key"
SOURCE = "local maildir"
FOLDERS = {"send": "sent", "draft": "drafts"}
MAX_BODY = 100_000
ADDRESS = re.compile(r"^[^@\s<>\"(),;:]+@[A-Za-z0-9.-]+$")

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
        "folder": {"type": "string", "enum": ["sent", "drafts", "all"]},
        "to": {"type": "string", "maxLength": 320},
        "limit": {"type": "integer", "minimum": 1, "maximum": 200},
    },
}


def mail_root() -> Path:
    root = Path(os.environ.get("YIMI_MAIL_DIR", "mail")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    return root


def recipient_folder(address: str) -> str:
    """The Maildir folder holding a recipient's copies: ``inbox-`` + a safe slug."""
    return "inbox-" + (re.sub(r"[^a-z0-9]+", "-", address.lower()).strip("-")[:80] or "unknown")


def folder(box: mailbox.Maildir, name: str) -> mailbox.Maildir:
    try:
        return box.get_folder(name)
    except mailbox.NoSuchMailboxError:
        return box.add_folder(name)


@contextmanager
def locked() -> Iterator[mailbox.Maildir]:
    root = mail_root()
    with open(root / ".yimi-lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield mailbox.Maildir(root, factory=None, create=True)
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def refuse(code: str, message: str) -> dict[str, Any]:
    return receipt("failed", summary=message, retry="forbidden", error=(code, message))


def valid_recipient(to: Any) -> str | None:
    if not isinstance(to, str) or "\r" in to or "\n" in to or len(to) > 320:
        return None
    _, address = parseaddr(to)
    return address if ADDRESS.match(address or "") else None


def find(box: mailbox.Maildir, key_value: str) -> tuple[str, bytes] | None:
    """The stored message whose idempotency header equals ``key_value`` (key, bytes)."""
    for key in box.iterkeys():
        data = box.get_bytes(key)
        if BytesHeaderParser(policy=email.policy.default).parsebytes(data).get(KEY_HEADER) == key_value:
            return key, data
    return None


def has_message_id(box: mailbox.Maildir, message_id: str) -> bool:
    return any(
        BytesHeaderParser(policy=email.policy.default).parsebytes(box.get_bytes(k)).get("Message-ID") == message_id
        for k in box.iterkeys()
    )


def reads_back(box: mailbox.Maildir, key: str, expected: EmailMessage) -> bool:
    """Re-read the message stored under ``key`` and compare what matters."""
    try:
        stored = BytesParser(policy=email.policy.default).parsebytes(box.get_bytes(key))
    except (KeyError, OSError):
        return False
    return (
        stored["Message-ID"] == expected["Message-ID"]
        and stored["To"] == expected["To"]
        and stored.get_content() == expected.get_content()
    )


def describe(msg: EmailMessage, folder_name: str) -> dict[str, Any]:
    return {
        "message_id": str(msg["Message-ID"]),
        "folder": folder_name,
        "to": parseaddr(str(msg["To"]))[1],
        "subject": str(msg["Subject"] or ""),
        "date": parsedate_to_datetime(str(msg["Date"])).astimezone(UTC).isoformat() if msg["Date"] else None,
    }


def done(msg: EmailMessage, action: str, verified: bool, replayed: bool) -> dict[str, Any]:
    address = parseaddr(str(msg["To"]))[1]
    size = len(msg.as_bytes())
    verb = "sent" if action == "send" else "kept a draft of"
    summary = f"{verb} {str(msg['Subject'])!r} to {address}" + (" (the earlier call's message; nothing new stored)" if replayed else "")
    values = [
        value("recipients", 1, "person", SOURCE),
        value("size", size, "byte", SOURCE),
        value("replayed", replayed, None, SOURCE),
    ]
    item = describe(msg, FOLDERS[action])
    if not verified:
        return receipt("unknown", summary=f"stored {item['message_id']} but could not read it back", effects=[effect(address, action, "not_verified")],
                       values=values, content={"items": [item]}, unknowns=["whether the message was stored intact"],
                       retry="after_check", check_with="list")
    return receipt("succeeded", summary=summary, effects=[effect(address, action, "verified")], values=values,
                   content={"items": [item]}, retry="forbidden" if action == "send" else "allowed")


@TOOLS("Send a message to one recipient (action send), or keep it as a draft (action draft).", SEND_SCHEMA)
def send(args: dict[str, Any]) -> dict[str, Any]:
    action, subject, body, key = args.get("action"), args.get("subject"), args.get("body"), args.get("idempotency_key")
    if action not in FOLDERS:
        return refuse("invalid_request", "action must be send or draft")
    address = valid_recipient(args.get("to"))
    if address is None:
        return refuse("invalid_recipient", f"{args.get('to')!r} is not one email address (a person the owner named is "
                      "resolved to one first: personal__resolve_recipient; ambiguous or unknown: ask the owner)")
    if not isinstance(subject, str) or len(subject) > 200 or "\r" in subject or "\n" in subject:
        return refuse("invalid_request", "subject must be one line of at most 200 characters")
    if not isinstance(body, str) or len(body) > MAX_BODY:
        return refuse("invalid_request", f"body must be text of at most {MAX_BODY} characters")
    if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= 128 or "\r" in key or "\n" in key):
        return refuse("invalid_request", "idempotency_key must be one line of 1 to 128 characters")
    try:
        with locked() as box:
            return _store(box, action, address, subject, body, key)
    except OSError as exc:
        return receipt("unknown", summary="the mail store failed during the call", unknowns=[f"whether the message was stored ({type(exc).__name__})"],
                       retry="after_check", check_with="list", error=("store_failed", str(exc)[:500]))


def _store(box: mailbox.Maildir, action: str, address: str, subject: str, body: str, key: str | None) -> dict[str, Any]:
    target = folder(box, FOLDERS[action])
    earlier = find(target, key) if key else None
    if earlier is not None:
        stored_key, data = earlier
        msg = BytesParser(policy=email.policy.default).parsebytes(data)
        verified = reads_back(target, stored_key, msg)
        if action == "send":
            inbox = folder(box, recipient_folder(parseaddr(str(msg["To"]))[1]))
            if not has_message_id(inbox, str(msg["Message-ID"])):
                inbox.add(data)  # an interrupted send: complete its delivery, same bytes
            verified = verified and has_message_id(inbox, str(msg["Message-ID"]))
        return done(msg, action, verified, replayed=True)

    msg = EmailMessage(policy=email.policy.default)
    msg["From"] = SENDER
    msg["To"] = address
    msg["Subject"] = subject
    msg["Date"] = format_datetime(datetime.now(UTC))
    msg["Message-ID"] = make_msgid(domain="yimi.localhost")
    if key:
        msg[KEY_HEADER] = key
    msg.set_content(body, charset="utf-8")
    data = msg.as_bytes()
    stored_key = target.add(data)
    verified = reads_back(target, stored_key, msg)
    if action == "send":
        inbox = folder(box, recipient_folder(address))
        inbox_key = inbox.add(data)
        verified = verified and reads_back(inbox, inbox_key, msg)
    return done(msg, action, verified, replayed=False)


def _list(args: dict[str, Any]) -> dict[str, Any]:
    which, to, limit = args.get("folder", "all"), args.get("to"), args.get("limit", 50)
    if which not in ("sent", "drafts", "all"):
        return refuse("invalid_request", "folder must be sent, drafts or all")
    if to is not None and valid_recipient(to) is None:
        return refuse("invalid_recipient", f"{to!r} is not one email address")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 200:
        return refuse("invalid_request", "limit must be an integer from 1 to 200")
    wanted = valid_recipient(to) if to is not None else None
    items = []
    with locked() as box:
        for name in (["sent", "drafts"] if which == "all" else [which]):
            box_folder = folder(box, name)
            for key in box_folder.iterkeys():
                msg = BytesHeaderParser(policy=email.policy.default).parsebytes(box_folder.get_bytes(key))
                item = describe(msg, name)
                if wanted is None or item["to"].lower() == wanted.lower():
                    items.append(item)
    items.sort(key=lambda i: (i["date"] or "", i["message_id"]), reverse=True)
    return receipt("succeeded", summary=f"{len(items)} messages", content={"items": items[:limit]},
                   values=[value("message_count", len(items), "message", SOURCE)])


_list.__name__ = "list"  # the tool is called ``list``; the function keeps the builtin usable
TOOLS("List the messages sent and the drafts kept, newest first.", LIST_SCHEMA)(_list)
