"""The model client's connections (brain/client.py): one kept client per long-lived event
loop (a worker's run loop, the embedded default's server loop), a client per call anywhere
else, so a loop made for one call (``async_to_sync``) is not kept alive by an open
connection after it."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import threading
import weakref
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from brain import client as brain_client
from brain import roles
from brain.client import complete, keep_client_on
from tests.conftest import script

pytestmark = pytest.mark.django_db(transaction=True)  # usage records are written from other threads

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
    try:
        seen = []
        connections_before = brain.connections
        for _ in range(3):
            completion = asyncio.run_coroutine_threadsafe(complete(MESSAGES, role_settings=role), loop).result(WAIT)
            assert completion.text == "ok"
            seen.append(brain_client._clients[loop])
        assert len({id(c) for c in seen}) == 1 and not seen[0].is_closed
        # ... over one connection: each streamed body is read to its end after [DONE], so
        # the connection is ready for the next call (the fake keeps it open, as providers do).
        assert brain.connections - connections_before == 1
    finally:
        kept = brain_client._clients.pop(loop, None)
        if kept is not None:
            asyncio.run_coroutine_threadsafe(kept.aclose(), loop).result(WAIT)
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

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        role = dataclasses.replace(configured, base_url=f"http://127.0.0.1:{port}/v1")
        try:
            return (await asyncio.wait_for(complete(MESSAGES, role_settings=role), WAIT)).text
        finally:
            released.set()
            server.close()

    assert asyncio.run(scenario()) == "held"
