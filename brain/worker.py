"""This worker process's one long-lived event loop, and the context each piece of work runs
in on it.

A Celery worker (``--pool threads``, ``YIMI_WORKER_RUNS`` slots) runs every run and task on
one loop (``worker_loop``, a daemon thread started by the first use): its Celery tasks hand
their coroutine over with ``on_worker_loop`` and wait for it; the run lane
(``brain.run_lane``) serves its runs on the same loop. Each piece of work runs in a
``ThreadSensitiveContext`` of its own (``in_own_context``), so its database calls get a
thread of their own. Nothing here knows what the work is.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from asgiref.sync import ThreadSensitiveContext

from llm.client import keep_client_on

T = TypeVar("T")


_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def on_worker_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on this worker process's one long-lived event loop (a daemon thread,
    started by the first task) and wait for its result.

    Why not ``asyncio.run`` per task: a new loop per task means new connections for
    everything bound to a loop — the channel layer's Redis connections first — on every
    run (7-14 ms measured on the dev machine, before the run did anything). The loop
    keeps them warm between runs.

    Runs overlap: the worker runs a thread pool (``--pool threads``, ``YIMI_WORKER_RUNS``
    slots; README "Worker"), each task thread submits its coroutine here and blocks until
    it ends, so up to that many runs share the loop at once, each waiting on the brain or
    the database without holding the others up. Each task holds its Celery slot and its
    late ack until its run ends, so acks and recovery (``brain.recovery``: heartbeat,
    redelivery of what a killed worker never acknowledged) are as with one run at a time.

    Each coroutine runs in a ``ThreadSensitiveContext`` of its own: its synchronous
    (``database_sync_to_async``) calls go to a thread of its own, as a Django request's
    do, instead of every run's database trips queueing for asgiref's one process-wide
    thread. That thread borrows a connection from the process's pool for each call and
    gives it back after it (``close_old_connections``, ``CONN_MAX_AGE`` 0)."""
    return asyncio.run_coroutine_threadsafe(in_own_context(coro), worker_loop()).result()


def worker_loop() -> asyncio.AbstractEventLoop:
    """This worker process's one long-lived event loop, started on first use (a daemon
    thread): the loop Celery tasks and the run lane (``brain.run_lane``) share."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            keep_client_on(loop)  # the model client's connections stay open between runs
            threading.Thread(target=loop.run_forever, name="yimi-run-loop", daemon=True).start()
            _loop = loop
        return _loop


# Single-thread executors of ended contexts, for the next one: a context used to start a
# thread of its own and stop it at its end, on every run (issue 14: thread start and
# shutdown were ~4% of the worker's CPU). There are never more of them than contexts were
# ever open at once (runs and tasks overlapping on the loop).
_idle_executors: list[ThreadPoolExecutor] = []


async def in_own_context(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` in a ``ThreadSensitiveContext`` of its own: its database calls get a
    thread of their own (a Celery task's work, a run from the run lane) — an idle thread
    an earlier context used, or a new one. Tasks ``coro`` starts must end with it
    (asgiref refuses their database calls after it); a long-lived task, such as a pack
    host, starts in a context of its own (``capabilities.mcp_host.manager``)."""
    executor = _idle_executors.pop() if _idle_executors else ThreadPoolExecutor(1, thread_name_prefix="yimi-run-db")
    try:
        async with ThreadSensitiveContext(executor=executor):
            result = await coro
    except BaseException:
        # A cancelled await leaves its database call running on the thread: the next run
        # must not queue behind it. The thread ends when that call does.
        executor.shutdown(wait=False)
        raise
    _idle_executors.append(executor)
    return result
