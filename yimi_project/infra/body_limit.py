"""A ceiling on HTTP request bodies, enforced before Django reads them.

Under ASGI, Django's handler reads the whole body into a temporary file before any view
runs, with no limit of its own, so a view's size check (``devices.images``) cannot stop a
client from filling the disk. ``BodyLimit`` wraps the HTTP application: a body declared
(``Content-Length``) or received beyond the limit for its path is refused with 413 and the
stable error body, and nothing more of it is read. Image uploads get ``IMAGE_MAX_BYTES``
(``image_too_large``); every other path ``YIMI_MAX_REQUEST_BYTES`` (``payload_too_large``).

Replaces: the unbounded read of Django's ``ASGIHandler.read_body`` (Django's
``DATA_UPLOAD_MAX_MEMORY_SIZE`` applies only once a view reads the body, after it is on
disk); ``yimi_project.asgi`` wraps the HTTP application in it
(docs/decisions/2026-12-03-body-limit.md). Drop it when Django's ASGI
handler refuses an oversized body before spooling it, with a limit per path.
Tests: tests/yimi_project/test_body_limit.py.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings

from yimi_project.errors import YimiError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

IMAGE_PATH = "/api/images/"


class _TooLarge(Exception):
    pass


def limit_for(path: str) -> YimiError:
    """The refusal a body beyond this path's limit gets; its ``limit`` detail is the limit."""
    if path.startswith(IMAGE_PATH):
        limit = settings.IMAGE_MAX_BYTES
        return YimiError("image_too_large", f"an image is limited to {limit} bytes", limit=limit)
    limit = settings.MAX_REQUEST_BYTES
    return YimiError("payload_too_large", f"a request body is limited to {limit} bytes", limit=limit)


class BodyLimit:
    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = limit_for(scope.get("path", ""))
        limit = refusal.details["limit"]
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await _refuse(send, refusal)
            return
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _TooLarge
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except _TooLarge:
            if not started:
                await _refuse(send, refusal)


async def _refuse(send: Send, refusal: YimiError) -> None:
    body = json.dumps({"error": refusal.payload()}).encode()
    await send({"type": "http.response.start", "status": 413, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close"),
    ]})
    await send({"type": "http.response.body", "body": body})
