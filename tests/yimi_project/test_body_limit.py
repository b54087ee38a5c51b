"""Request bodies beyond their path's limit are refused before Django reads them
(yimi_project/infra/body_limit.py): by the declared length, and by counting what arrives."""

from __future__ import annotations

import json
from typing import Any

from yimi_project.infra.body_limit import BodyLimit


class App:
    """An inner application that reads the whole body, as Django's handler does."""

    def __init__(self) -> None:
        self.read = 0
        self.called = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.called = True
        more = True
        while more:
            message = await receive()
            self.read += len(message.get("body", b""))
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def run(path: str, chunks: list[bytes], headers: list[tuple[bytes, bytes]] | None = None) -> tuple[App, list[Any], int]:
    app, sent = App(), []
    pending = list(chunks)
    pulled = 0

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        body = pending.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(pending)}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "path": path, "headers": headers or []}
    await BodyLimit(app)(scope, receive, send)
    return app, sent, pulled


def status_and_error(sent: list[Any]) -> tuple[int, dict[str, Any]]:
    body = json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body") or b"{}")
    return sent[0]["status"], body.get("error", {})


async def test_a_declared_length_over_the_image_limit_is_refused_without_reading(settings: Any) -> None:
    settings.IMAGE_MAX_BYTES = 1000
    app, sent, pulled = await run("/api/images/", [b"x" * 10], [(b"content-length", b"1001")])
    assert not app.called and pulled == 0
    status, error = status_and_error(sent)
    assert (status, error["code"], error["details"]["limit"]) == (413, "image_too_large", 1000)


async def test_an_undeclared_body_is_cut_off_once_it_passes_the_limit(settings: Any) -> None:
    settings.MAX_REQUEST_BYTES = 100
    app, sent, pulled = await run("/api/timeline/", [b"x" * 60, b"x" * 60, b"x" * 60, b"x" * 60])
    assert pulled == 2 and app.read == 60  # the second chunk crossed the limit; nothing after it was read
    status, error = status_and_error(sent)
    assert (status, error["code"]) == (413, "payload_too_large")


async def test_a_body_within_the_limit_reaches_the_application(settings: Any) -> None:
    settings.MAX_REQUEST_BYTES = 100
    app, sent, _ = await run("/api/timeline/", [b"x" * 50, b"x" * 50], [(b"content-length", b"100")])
    assert app.read == 100 and sent[0]["status"] == 200


async def test_the_asgi_application_refuses_an_oversized_body_before_django_reads_it(settings: Any) -> None:
    """The wiring: ``yimi_project.asgi`` wraps its HTTP application in ``BodyLimit``, so an
    upload declared over the limit is refused without one byte of it being read."""
    import asyncio

    from yimi_project.asgi import application

    settings.IMAGE_MAX_BYTES = 1000
    sent: list[Any] = []
    pulled = 0

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        if pulled == 1:
            return {"type": "http.request", "body": b"x" * 1001, "more_body": False}
        await asyncio.Event().wait()  # no disconnect: the client waits for the answer
        raise AssertionError("unreachable")

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/api/images/", "raw_path": b"/api/images/", "root_path": "", "query_string": b"",
        "headers": [(b"host", b"testserver"), (b"content-length", b"1001"), (b"content-type", b"image/jpeg")],
        "server": ("testserver", 80), "client": ("127.0.0.1", 50000),
    }
    await asyncio.wait_for(application(scope, receive, send), 30)
    assert pulled == 0
    status, error = status_and_error(sent)
    assert (status, error["code"], error["details"]["limit"]) == (413, "image_too_large", 1000)
