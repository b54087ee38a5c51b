"""The model client's connections (brain/client.py): one kept client per long-lived event
loop (a worker's run loop, the embedded default's server loop), a client per call anywhere
else, so a loop made for one call (``async_to_sync``) is not kept alive by an open
connection after it."""

from __future__ import annotations

import asyncio
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
        for _ in range(3):
            completion = asyncio.run_coroutine_threadsafe(complete(MESSAGES, role_settings=role), loop).result(WAIT)
            assert completion.text == "ok"
            seen.append(brain_client._clients[loop])
        assert len({id(c) for c in seen}) == 1 and not seen[0].is_closed
    finally:
        kept = brain_client._clients.pop(loop, None)
        if kept is not None:
            asyncio.run_coroutine_threadsafe(kept.aclose(), loop).result(WAIT)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(WAIT)
        loop.close()
