"""A run's database thread (brain.worker.in_own_context): an idle thread an earlier run used
is reused, but never one a cancelled run left busy."""

from __future__ import annotations

import asyncio
import threading

from asgiref.sync import sync_to_async

from brain import worker

WAIT = 30.0  # a limit for the test, never a timing assertion


def test_a_finished_runs_thread_is_reused_and_a_cancelled_runs_is_not() -> None:
    release = threading.Event()

    async def thread_name() -> int:  # the thread's identity (the stuck one is still alive at the end)
        return await sync_to_async(threading.get_ident)()

    started = threading.Event()

    def blocked() -> None:  # a database call that does not return yet
        started.set()
        release.wait(WAIT)

    async def stuck() -> None:
        await sync_to_async(blocked)()

    async def scenario() -> tuple[int, int, int, bool]:
        worker._idle_executors.clear()
        first = await worker.in_own_context(thread_name())
        second = await worker.in_own_context(thread_name())  # the same idle thread
        cancelled = asyncio.ensure_future(worker.in_own_context(stuck()))
        await asyncio.to_thread(started.wait, WAIT)  # its call runs on the thread
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        third = await asyncio.wait_for(worker.in_own_context(thread_name()), WAIT)  # does not queue behind it
        release.set()
        return first, second, third, bool(worker._idle_executors)

    try:
        first, second, third, idle = asyncio.run(scenario())
    finally:
        release.set()
    assert first == second and third != first and idle
