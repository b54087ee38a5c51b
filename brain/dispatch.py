"""Starting work: a run, a sub-agent task, an approved card's call, a payment, a feature's
Celery task. With a broker (``REDIS_URL``) each goes to a Celery worker, sent by its task
name (a run goes on the run lane, ``brain.run_lane``); in the embedded default it runs as a
task on the web server's own event loop, executed by the coroutine registered under the
same name (``brain.executors``). This module never imports what executes the work: the
executors import it (``keep_claim``, ``dispatch_task``, ``dispatch_payment``). It also keeps
the server's event loop (``remember_loop``) so synchronous code can hand work back to it
(``start_payment``), and the in-process tasks until they end (``keep``). The embedded
default's sweeper is ``brain.sweeper``."""

from __future__ import annotations

import asyncio
import contextvars
import os
from collections.abc import Coroutine
from typing import Any

import redis
from asgiref.sync import SyncToAsync, sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings

from brain import executors, run_lane
from brain.trace import now_ms
from llm.client import keep_client_on
from payments.services import EXECUTE_PAYMENT_TASK
from yimi_project.celery import app as celery_app
from yimi_project.logs import log_event

_tasks: set[asyncio.Task] = set()


def uses_broker() -> bool:
    return bool(settings.CELERY_BROKER_URL)


async def dispatch_run(run_id: Any) -> None:
    """Start a run: on a Celery worker, or on this event loop. The time it was queued
    travels with it (the ``queued`` stage of its trace, ``brain.trace``)."""
    if uses_broker() and await sync_to_async(publish_run, thread_sensitive=False)(run_id):
        return
    _start(executors.executor(executors.RUN)(run_id, stages={"queued": now_ms()}))


def publish_run(run_id: Any) -> bool:
    """From synchronous code, after the run's transaction committed: queue the run on the
    run lane (``brain.run_lane``: one Redis list entry a free worker slot pops, with its
    ``queued`` stage) and return True; False in the embedded default, where the caller
    starts it with ``dispatch_run``. The device socket calls it in the same database trip as
    the admission, so a text costs one thread hop, not two. Redis unreachable: logged, and
    the run, already stored, is sent by the recovery sweep.

    ``YIMI_RUN_DISPATCH=celery`` is a bench-only switch (``bench/roundtrip.py --dispatch
    celery``), not a product path: the run is sent as the Celery task ``executors.RUN``
    (late ack, prefetch 1) instead, to measure the lane against it
    (docs/decisions/2026-12-03-run-lane.md)."""
    if not uses_broker():
        return False
    try:
        if os.environ.get("YIMI_RUN_DISPATCH") == "celery":  # bench-only switch (bench/roundtrip.py --dispatch celery)
            _send(executors.RUN, str(run_id), {"queued": now_ms()})
            return True
        run_lane.push(run_id, {"queued": now_ms()})
    except redis.RedisError as exc:  # the run is stored: the recovery sweep sends it once Redis is back
        log_event("run_not_queued", run_id=str(run_id), error=type(exc).__name__)
    return True


async def dispatch_task(task_id: Any) -> None:
    """Start a sub-agent task: on a Celery worker, or on this event loop."""
    if uses_broker():
        await sync_to_async(_send, thread_sensitive=False)(executors.AGENT_TASK, str(task_id))
        return
    _start(executors.executor(executors.AGENT_TASK)(task_id))


async def dispatch_card_execution(card_id: Any) -> None:
    """Run an approved card's call (exactly once, guarded by its execution token)."""
    if uses_broker():
        await sync_to_async(_send, thread_sensitive=False)(executors.CARD_EXECUTION, str(card_id))
        return
    _start(executors.executor(executors.CARD_EXECUTION)(card_id))


async def dispatch_payment(authorization_id: Any, *, delay: float = 0.0) -> None:
    """Pay with an authorization (after ``delay``: a small auto-payment's undo window)."""
    if uses_broker():
        await sync_to_async(_send, thread_sensitive=False)(EXECUTE_PAYMENT_TASK, str(authorization_id), countdown=delay)
        return
    execute_payment = executors.executor(EXECUTE_PAYMENT_TASK)

    async def later() -> None:
        await asyncio.sleep(delay)
        await execute_payment(authorization_id)

    _start(later())


def start_payment(authorization_id: Any, *, delay: float) -> None:
    """From synchronous code: start the payment (after ``delay``) on a worker, or on the
    server's event loop. The payment authority asks for it after its transaction commits
    (``yimi_project.push.start_after_commit``; registered by ``BrainConfig.ready``)."""
    if uses_broker():
        _send(EXECUTE_PAYMENT_TASK, str(authorization_id), countdown=delay)
        return
    # Called in a sync_to_async thread: asgiref remembers the loop that called it.
    loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None) or _main_loop
    if loop is None:
        log_event("payment_not_scheduled", reason="no event loop in this process")
        return
    # A fresh context: the task must not inherit this sync thread's asgiref state.
    loop.call_soon_threadsafe(
        lambda: asyncio.ensure_future(dispatch_payment(authorization_id, delay=delay)), context=contextvars.Context()
    )


def _send(task_name: str, *args: Any, countdown: float | None = None) -> None:
    """Publish the Celery task ``task_name`` with ``args`` (after ``countdown`` seconds), by
    name: the message a registered task's ``apply_async`` publishes."""
    celery_app.send_task(task_name, args=args, countdown=countdown)


_main_loop: asyncio.AbstractEventLoop | None = None


def remember_loop() -> None:
    """Called on the server's event loop, so synchronous code can hand work back to it."""
    global _main_loop
    _main_loop = asyncio.get_running_loop()
    keep_client_on(_main_loop)  # the embedded default's runs: the model client stays open between them


async def keep_claim(beat: Any) -> None:
    """Refresh a claim (a run's or a sub-agent task's heartbeat) every
    ``RUN_HEARTBEAT_SECONDS`` (5 s) until ``beat`` says the claim was lost; the caller
    cancels it when the work ends."""
    while True:
        await asyncio.sleep(settings.RUN_HEARTBEAT_SECONDS)
        if not await database_sync_to_async(beat)():
            return


def _start(coro: Coroutine[Any, Any, Any]) -> None:
    """An in-process task (the embedded default) in a fresh context: not the device
    socket's that started it, whose database thread (``DeviceConsumer.__call__``) ends with
    the socket while the run may go on. Its database calls go to the process's shared
    thread, as before sockets had threads of their own."""
    keep(asyncio.get_running_loop().create_task(coro, context=contextvars.Context()))


def keep(task: asyncio.Task) -> None:
    """Hold an in-process task until it ends (the loop keeps only weak references) and log
    its failure."""
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    task.add_done_callback(_log_failure)


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        exc = task.exception()
        log_event("inprocess_task_failed", error=type(exc).__name__, detail=str(exc)[:300])
