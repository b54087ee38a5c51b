"""The messaging pack: messages written to a local outbox on this host (a Maildir under
``YIMI_MAIL_DIR``). No mail server is configured yet, so nothing leaves this host.

``send`` writes an RFC 5322 message from ``Yimi <yimi@localhost>`` into the folder ``outbox``
and reads it back by key. Its receipt says exactly that: ``failed`` with the error
``not_sent`` (the message was not handed to any mail server, nobody received it), and one
effect, ``save`` on ``local outbox``, ``verified`` only when the copy read back with the
same Message-ID, recipient and body. ``draft`` stores the message in ``drafts`` instead
(``succeeded``: a draft stays with Yimi).

With an ``idempotency_key`` (injected by the gateway), a retried call returns the message
the first call stored (same Message-ID) instead of storing a second one. Checks and writes
run under an exclusive lock on the Maildir, so two retries cannot both store.
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
SOURCE = "local outbox"
FOLDERS = {"send": "outbox", "draft": "drafts"}
OUTBOX = "local outbox"  # the target of a send's effect: where the message really is
NOT_SENT = "no mail server is configured: the message was written to the local outbox on this host and not handed to any mail server"
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
        "folder": {"type": "string", "enum": ["outbox", "drafts", "all"]},
        "to": {"type": "string", "maxLength": 320},
        "limit": {"type": "integer", "minimum": 1, "maximum": 200},
    },
}


def mail_root() -> Path:
    root = Path(os.environ.get("YIMI_MAIL_DIR", "mail")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    return root


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
    again = " (the earlier call's message; nothing new stored)" if replayed else ""
    values = [
        value("recipients", 1, "person", SOURCE),
        value("size", size, "byte", SOURCE),
        value("replayed", replayed, None, SOURCE),
    ]
    item = describe(msg, FOLDERS[action])
    target, verb = (OUTBOX, "save") if action == "send" else (address, action)
    if not verified:
        return receipt("unknown", summary=f"stored {item['message_id']} but could not read it back", effects=[effect(target, verb, "not_verified")],
                       values=values, content={"items": [item]}, unknowns=["whether the message was stored intact"],
                       retry="after_check", check_with="list")
    if action == "send":
        summary = f"wrote {str(msg['Subject'])!r} for {address} to the local outbox on this host; not handed to any mail server{again}"
        return receipt("failed", summary=summary, effects=[effect(OUTBOX, "save", "verified")], values=values,
                       content={"items": [item]}, retry="forbidden", error=("not_sent", NOT_SENT))
    return receipt("succeeded", summary=f"kept a draft of {str(msg['Subject'])!r} to {address}{again}", effects=[effect(address, action, "verified")],
                   values=values, content={"items": [item]}, retry="allowed")


@TOOLS("Write a message to one recipient into the local outbox (action send; no mail server is configured, so it is not sent), "
       "or keep it as a draft (action draft).", SEND_SCHEMA)
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
        return done(msg, action, reads_back(target, stored_key, msg), replayed=True)

    msg = EmailMessage(policy=email.policy.default)
    msg["From"] = SENDER
    msg["To"] = address
    msg["Subject"] = subject
    msg["Date"] = format_datetime(datetime.now(UTC))
    msg["Message-ID"] = make_msgid(domain="yimi.localhost")
    if key:
        msg[KEY_HEADER] = key
    msg.set_content(body, charset="utf-8")
    stored_key = target.add(msg.as_bytes())
    return done(msg, action, reads_back(target, stored_key, msg), replayed=False)


def _list(args: dict[str, Any]) -> dict[str, Any]:
    which, to, limit = args.get("folder", "all"), args.get("to"), args.get("limit", 50)
    if which not in ("outbox", "drafts", "all"):
        return refuse("invalid_request", "folder must be outbox, drafts or all")
    if to is not None and valid_recipient(to) is None:
        return refuse("invalid_recipient", f"{to!r} is not one email address")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 200:
        return refuse("invalid_request", "limit must be an integer from 1 to 200")
    wanted = valid_recipient(to) if to is not None else None
    items = []
    with locked() as box:
        for name in (list(FOLDERS.values()) if which == "all" else [which]):
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
TOOLS("List the messages in the local outbox (not sent) and the drafts kept, newest first.", LIST_SCHEMA)(_list)
