"""Where runs execute: a Celery worker when a broker is configured (``REDIS_URL``),
otherwise tasks on the web server's own event loop (the embedded default)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from asgiref.sync import SyncToAsync, sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings

from brain.consent_execution import execute_approved
from brain.trace import now_ms
from consent.services import expire_cards, settle_interrupted_executions
from llm.client import keep_client_on
from payments.services import expire_authorizations
from yimi_project.logs import log_event

_tasks: set[asyncio.Task] = set()
_sweeper: asyncio.Task | None = None
_due_sweeps: list[Callable[[], Awaitable[None]]] = []


def uses_broker() -> bool:
    return bool(settings.CELERY_BROKER_URL)


async def dispatch_run(run_id: Any) -> None:
    """Start a run: on a Celery worker, or on this event loop. The time it was queued
    travels with it (the ``queued`` stage of its trace, ``brain.trace``)."""
    if uses_broker() and await sync_to_async(publish_run, thread_sensitive=False)(run_id):
        return
    from brain.runner import execute_run

    _start(execute_run(run_id, stages={"queued": now_ms()}))


def publish_run(run_id: Any) -> bool:
    """From synchronous code, after the run's transaction committed: queue the run on the
    run lane (``brain.run_lane``: one Redis list entry a free worker slot pops, with its
    ``queued`` stage) and return True; False in the embedded default, where the caller
    starts it with ``dispatch_run``. The device socket calls it in the same database trip as
    the admission, so a text costs one thread hop, not two. Redis unreachable: logged, and
    the run, already stored, is sent by the recovery sweep."""
    if not uses_broker():
        return False
    import redis

    from brain import run_lane

    try:
        run_lane.push(run_id, {"queued": now_ms()})
    except redis.RedisError as exc:  # the run is stored: the recovery sweep sends it once Redis is back
        log_event("run_not_queued", run_id=str(run_id), error=type(exc).__name__)
    return True


async def dispatch_task(task_id: Any) -> None:
    """Start a sub-agent task: on a Celery worker, or on this event loop."""
    if uses_broker():
        from brain.tasks import execute_agent_task_task

        await sync_to_async(execute_agent_task_task.delay, thread_sensitive=False)(str(task_id))
        return
    from brain.agent_loop import execute_agent_task

    _start(execute_agent_task(task_id))


async def dispatch_card_execution(card_id: Any) -> None:
    """Run an approved card's call (exactly once, guarded by its execution token)."""
    if uses_broker():
        from brain.execution_tasks import execute_approved_task

        await sync_to_async(execute_approved_task.delay, thread_sensitive=False)(str(card_id))
        return
    _start(execute_approved(card_id))


async def dispatch_payment(authorization_id: Any, *, delay: float = 0.0) -> None:
    """Pay with an authorization (after ``delay``: a small auto-payment's undo window)."""
    if uses_broker():
        from brain.execution_tasks import execute_payment_task

        await sync_to_async(lambda: execute_payment_task.apply_async((str(authorization_id),), countdown=delay), thread_sensitive=False)()
        return
    from brain.payment_execution import execute_payment

    async def later() -> None:
        await asyncio.sleep(delay)
        await execute_payment(authorization_id)

    _start(later())


def start_payment(authorization_id: Any, *, delay: float) -> None:
    """From synchronous code: start the payment (after ``delay``) on a worker, or on the
    server's event loop. The payment authority asks for it after its transaction commits
    (``yimi_project.push.start_after_commit``; registered by ``BrainConfig.ready``)."""
    if uses_broker():
        from brain.execution_tasks import execute_payment_task

        execute_payment_task.apply_async((str(authorization_id),), countdown=delay)
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
    _keep(asyncio.get_running_loop().create_task(coro, context=contextvars.Context()))


def _keep(task: asyncio.Task) -> None:
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    task.add_done_callback(_log_failure)


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        exc = task.exception()
        log_event("inprocess_task_failed", error=type(exc).__name__, detail=str(exc)[:300])


def register_due_sweep(sweep: Callable[[], Awaitable[None]]) -> None:
    """A higher app's due work for the embedded sweeper, what beat sends it with a broker
    (``schedules.tasks.sweep_due``: reminders, schedules, watches; from
    ``SchedulesConfig.ready``). Each round runs them in registration order, before cards
    and authorizations expire."""
    if sweep not in _due_sweeps:
        _due_sweeps.append(sweep)


def ensure_embedded_sweeper() -> None:
    """Embedded default only (no Celery beat): recover runs left by a previous process
    and then every ``RUN_RECOVERY_SECONDS`` (30 s), and every ``DUE_SWEEP_SECONDS`` (10 s)
    run the registered due sweeps (``register_due_sweep``: reminders, schedules, watches)
    and expire unanswered cards and unused authorizations, on the web
    server's event loop; every ``ARCHIVE_ROUND_SECONDS`` (60 s) start a cold-pack round
    beside it (``_archive_round``). Started by the first websocket connection."""
    global _sweeper
    remember_loop()
    if uses_broker() or not settings.YIMI_EMBEDDED_SWEEPER or (_sweeper is not None and not _sweeper.done()):
        return
    _sweeper = asyncio.ensure_future(_sweep_forever())


async def stop_embedded_sweeper() -> None:
    """Cancel the embedded sweeper (if this process runs one) and wait for it to end."""
    global _sweeper
    sweeper, _sweeper = _sweeper, None
    if sweeper is None or sweeper.done():
        return
    sweeper.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sweeper


def _archive_round() -> asyncio.Task:
    """Beat's ``archive-round`` for the embedded default: one cold-pack migration round
    (``memory.tasks.archive_round``), as a task beside the sweep on a database thread of its
    own, since a round uploads for seconds and must hold up neither the due sweeps nor the
    sockets' database calls."""
    from django.db import connections

    from memory.tasks import archive_round_task

    def one_round() -> None:
        try:
            archive_round_task()
        finally:
            connections.close_all()  # this pool thread's own connections

    task = asyncio.ensure_future(sync_to_async(one_round, thread_sensitive=False)())
    _keep(task)
    return task


async def _sweep_forever() -> None:
    from brain.recovery import recover_runs

    loop = asyncio.get_running_loop()
    last_recovery = loop.time() - settings.RUN_RECOVERY_SECONDS
    last_archive, archive = loop.time() - settings.ARCHIVE_ROUND_SECONDS, None
    while True:
        try:
            if loop.time() - last_recovery >= settings.RUN_RECOVERY_SECONDS:
                last_recovery = loop.time()
                await recover_runs()
            if loop.time() - last_archive >= settings.ARCHIVE_ROUND_SECONDS and (archive is None or archive.done()):
                last_archive, archive = loop.time(), _archive_round()
            for sweep in _due_sweeps:
                await sweep()
            await sync_to_async(expire_cards)()
            await sync_to_async(settle_interrupted_executions)()  # as beat's consent.tasks.expire_cards
            await sync_to_async(expire_authorizations)()
        except Exception as exc:  # noqa: BLE001 - the sweeper must outlive one bad round
            log_event("embedded_sweep_failed", error=type(exc).__name__)
        await asyncio.sleep(settings.DUE_SWEEP_SECONDS)
