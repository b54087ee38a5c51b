"""The model client's connections (llm/client.py): one kept client per long-lived event
loop (a worker's run loop, the embedded default's server loop), a client per call anywhere
else, so a loop made for one call (``async_to_sync``) is not kept alive by an open
connection after it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import importlib.util
import json
import socket
import ssl
import threading
import weakref
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from llm import client as brain_client
from llm import roles
from llm.client import BrainError, complete, keep_client_on
from tests.conftest import script
from yimi_project.infra import http11

pytestmark = pytest.mark.django_db(transaction=True)  # usage records are written from other threads

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "user", "content": "hello"}]
WAIT = 60.0  # a limit for one call, never a timing assertion


def test_calls_on_throwaway_loops_keep_no_client_and_no_loop(brain: Any) -> None:
    script(brain, reply="ok")
    role = roles.resolve("brain")
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def call() -> str:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        return (await complete(MESSAGES, role_settings=role)).text

    kept_before = len(brain_client._clients)
    for _ in range(5):
        assert async_to_sync(call)() == "ok"
    gc.collect()
    assert len(brain_client._clients) == kept_before  # nothing kept for loops made for one call
    # ... and those loops are gone (asgiref still refers to the latest one it ran).
    assert [ref() for ref in loops[:-1]] == [None] * 4


def test_a_kept_loop_reuses_one_open_client(brain: Any) -> None:
    script(brain, reply="ok")
    role = roles.resolve("brain")
    loop = asyncio.new_event_loop()
    keep_client_on(loop)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    pool = http11.pool_of(loop)
    assert pool is not None
    try:
        connections_before = brain.connections
        for _ in range(3):
            completion = asyncio.run_coroutine_threadsafe(complete(MESSAGES, role_settings=role), loop).result(WAIT)
            assert completion.text == "ok"
            assert pool.idle() == 1  # the call's connection, back in the pool
        # ... over one connection: each streamed body is read to its end after [DONE], so
        # the connection is ready for the next call (the fake keeps it open, as providers do).
        assert brain.connections - connections_before == 1
        assert loop not in brain_client._clients  # httpx only for a proxied endpoint
        assert pool._proxied == {role.base_url.rstrip("/") + "/chat/completions": False}  # the environment read once
    finally:
        loop.call_soon_threadsafe(pool.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(WAIT)
        loop.close()


def test_a_body_that_does_not_end_after_done_still_completes_the_call(brain: Any, monkeypatch: Any) -> None:
    """An endpoint that sends ``[DONE]`` and then holds its body open: the answer is
    complete at ``[DONE]``; the client waits ``BODY_END_SECONDS`` at most for the body's end
    (so the connection could serve the next call) and then leaves it."""
    monkeypatch.setattr(brain_client, "BODY_END_SECONDS", 0.05)
    configured = roles.resolve("brain")
    released = threading.Event()

    async def scenario() -> str:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            event = b'data: {"choices": [{"delta": {"content": "held"}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.get_running_loop().run_in_executor(None, released.wait, WAIT)  # the body never ends
            writer.close()

        server, port = await _serve(serve)
        role = dataclasses.replace(configured, base_url=f"http://127.0.0.1:{port}/v1")
        try:
            return (await asyncio.wait_for(complete(MESSAGES, role_settings=role), WAIT)).text
        finally:
            released.set()
            server.close()

    assert asyncio.run(scenario()) == "held"


async def _serve(handler: Any, tls: ssl.SSLContext | None = None) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=tls)
    return server, server.sockets[0].getsockname()[1]


def _answer(text: str) -> bytes:
    event = json.dumps({"choices": [{"delta": {"content": text}, "finish_reason": "stop"}]}).encode()
    body = b"data: " + event + b"\n\ndata: [DONE]\n\n"
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    return head + await reader.readexactly(length)


def test_a_kept_connection_the_server_closed_while_idle_is_replaced(db: Any) -> None:
    """The server's keep-alive ran out between two calls and it closed the connection: the
    next call takes a new connection, and each request reaches the server once."""
    configured = roles.resolve("brain")
    bodies: list[bytes] = []
    connections: list[int] = []

    async def scenario() -> list[str]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections.append(len(connections) + 1)
            bodies.append(await _read_request(reader))
            writer.write(_answer(f"connection {len(connections)}"))
            await writer.drain()
            writer.close()  # keep-alive over

        server, port = await _serve(serve)
        role = dataclasses.replace(configured, base_url=f"http://127.0.0.1:{port}/v1")
        pool = http11.keep_connections_on(asyncio.get_running_loop())
        try:
            texts = [(await asyncio.wait_for(complete(MESSAGES, role_settings=role), WAIT)).text]
            kept = pool._idle[http11.Origin("http", "127.0.0.1", port)][0]
            assert await asyncio.wait_for(kept.reader.read(1), WAIT) == b""  # the client has seen the close
            texts.append((await asyncio.wait_for(complete(MESSAGES, role_settings=role), WAIT)).text)
            return texts
        finally:
            pool.close()
            server.close()

    assert asyncio.run(scenario()) == ["connection 1", "connection 2"]
    assert connections == [1, 2] and len(bodies) == 2


def test_a_request_written_whole_is_not_sent_again_when_the_connection_breaks(db: Any) -> None:
    """The endpoint read the whole request on a kept connection and then the connection
    broke before any answer: the call ends as brain_unreachable, and the request is not
    sent a second time (the endpoint may have been working on it: a second call is billed)."""
    configured = roles.resolve("brain")
    requests: list[bytes] = []

    async def scenario() -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            requests.append(await _read_request(reader))
            writer.write(_answer("first"))
            await writer.drain()
            requests.append(await _read_request(reader))  # the next request: read, then the connection breaks
            writer.transport.abort()

        server, port = await _serve(serve)
        role = dataclasses.replace(configured, base_url=f"http://127.0.0.1:{port}/v1")
        pool = http11.keep_connections_on(asyncio.get_running_loop())
        try:
            assert (await asyncio.wait_for(complete(MESSAGES, role_settings=role), WAIT)).text == "first"
            await asyncio.wait_for(complete(MESSAGES, role_settings=role), WAIT)
        finally:
            pool.close()
            server.close()

    with pytest.raises(BrainError) as raised:
        asyncio.run(scenario())
    assert raised.value.code == "brain_unreachable"
    assert len(requests) == 2


def test_an_idle_connection_past_its_keepalive_is_not_used(db: Any) -> None:
    """A kept connection idle for longer than KEEPALIVE_SECONDS may have been dropped
    silently on the way (a NAT, a load balancer): it is closed and a new one made. The
    pool's clock is the test's."""
    configured = roles.resolve("brain")
    connections: list[int] = []
    now = [1000.0]

    async def scenario() -> list[str]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections.append(len(connections) + 1)
            number = len(connections)
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                while True:
                    await _read_request(reader)
                    writer.write(_answer(f"connection {number}"))
                    await writer.drain()

        server, port = await _serve(serve)
        role = dataclasses.replace(configured, base_url=f"http://127.0.0.1:{port}/v1")
        pool = http11.keep_connections_on(asyncio.get_running_loop())
        pool.clock = lambda: now[0]
        texts = []
        try:
            for advance in (0.0, http11.KEEPALIVE_SECONDS - 1, http11.KEEPALIVE_SECONDS + 1):
                now[0] += advance
                texts.append((await asyncio.wait_for(complete(MESSAGES, role_settings=role), WAIT)).text)
            return texts
        finally:
            pool.close()
            server.close()

    assert asyncio.run(scenario()) == ["connection 1", "connection 1", "connection 2"]


def test_a_request_h11_refuses_to_write_is_a_brain_error_and_a_path_is_encoded(db: Any) -> None:
    """A key with a line break cannot be a header value: brain_unreachable, as before,
    never an exception the runner does not know. A space in the URL's path is sent
    percent-encoded."""
    configured = roles.resolve("brain")
    targets: list[bytes] = []

    async def scenario(role_change: dict[str, Any]) -> str:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            targets.append((await _read_request(reader)).split(b" ")[1])
            writer.write(_answer("ok"))
            await writer.drain()
            writer.close()

        server, port = await _serve(serve)
        role = dataclasses.replace(configured, **{"base_url": f"http://127.0.0.1:{port}/v1", **role_change})
        role = dataclasses.replace(role, base_url=role.base_url.replace("PORT", str(port)))
        try:
            return (await asyncio.wait_for(complete(MESSAGES, role_settings=role), WAIT)).text
        finally:
            server.close()

    with pytest.raises(BrainError) as raised:
        asyncio.run(scenario({"api_key": "sk-abc\n"}))
    assert raised.value.code == "brain_unreachable" and targets == []
    assert asyncio.run(scenario({"base_url": "http://127.0.0.1:PORT/my models/v1"})) == "ok"
    assert targets == [b"/my%20models/v1/chat/completions"]


def test_an_https_endpoint_is_called_over_tls_with_the_trust_store(db: Any, tmp_path: Any, monkeypatch: Any) -> None:
    """TLS with the platform's context: a certificate it trusts is accepted, one it does
    not trust ends the call as brain_unreachable."""
    spec = importlib.util.spec_from_file_location("yimi_front", ROOT / "docker" / "front" / "front.py")
    assert spec is not None and spec.loader is not None
    front = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(front)
    cert, key = front.ensure_certificates(tmp_path / "tls", ["localhost", "127.0.0.1"])
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    configured = roles.resolve("brain")

    async def scenario() -> str:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                await _read_request(reader)
                writer.write(_answer("over tls"))
                await writer.drain()
                writer.close()

        server, port = await _serve(serve, server_context)
        role = dataclasses.replace(configured, base_url=f"https://localhost:{port}/v1")
        try:
            return (await asyncio.wait_for(complete(MESSAGES, role_settings=role), WAIT)).text
        finally:
            server.close()

    with pytest.raises(BrainError) as raised:  # the local CA is not in the trust store
        asyncio.run(scenario())
    assert raised.value.code == "brain_unreachable"
    trusting = ssl.create_default_context(cafile=str(tmp_path / "tls" / "ca.pem"))
    monkeypatch.setattr(brain_client, "_tls_context", lambda: trusting)
    assert asyncio.run(scenario()) == "over tls"


def test_an_endpoint_behind_an_environment_proxy_is_called_through_it(brain: Any, monkeypatch: Any) -> None:
    """HTTP_PROXY applies to the endpoint: the call goes to the proxy (here: nothing
    listens there, so it fails) over httpx; NO_PROXY for the host: straight to it."""
    script(brain, reply="direct")
    role = roles.resolve("brain")
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{unused.getsockname()[1]}"
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert not http11.proxied(brain.base_url)
    monkeypatch.setenv("HTTP_PROXY", proxy)
    assert http11.proxied(brain.base_url) and not http11.proxied("https://api.example.com/v1")
    with pytest.raises(BrainError) as raised:
        asyncio.run(complete(MESSAGES, role_settings=role))
    assert raised.value.code == "brain_unreachable"
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert not http11.proxied(brain.base_url)
    assert asyncio.run(complete(MESSAGES, role_settings=role)).text == "direct"


def test_lines_end_in_cr_lf_or_crlf_and_a_character_may_come_in_two_pieces(db: Any) -> None:
    """SSE allows CR, LF or CRLF at a line's end (here: CR only); a UTF-8 character may be
    split between two chunks of the body."""
    configured = roles.resolve("brain")
    event = json.dumps({"choices": [{"delta": {"content": "你好"}, "finish_reason": "stop"}]}, ensure_ascii=False).encode()
    cut = event.index("好".encode()) + 1  # inside the character's three bytes
    pieces = [b"data: " + event[:cut], event[cut:] + b"\r", b"\rdata: [DONE]\r\r"]  # CR only

    async def scenario() -> str:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await _read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for piece in pieces:
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            writer.close()

        server, port = await _serve(serve)
        role = dataclasses.replace(configured, base_url=f"http://127.0.0.1:{port}/v1")
        try:
            return (await asyncio.wait_for(complete(MESSAGES, role_settings=role), WAIT)).text
        finally:
            server.close()

    assert asyncio.run(scenario()) == "你好"
