"""The end-of-call summary as a Celery task, sent at hang-up (``brain.topic_state``)."""

from __future__ import annotations

import asyncio
from typing import Any

from asgiref.sync import sync_to_async
from celery import shared_task
from channels.db import database_sync_to_async

from brain.dispatch import uses_broker
from yimi_project.logs import log_event

STALE_RETRIES = 3
_tasks: set[asyncio.Task[Any]] = set()


@shared_task(name="brain.tasks.summarize_call", bind=True, acks_late=True, max_retries=STALE_RETRIES)
def summarize_call_task(self: Any, call_pk: int) -> str:
    """Summarize one call. A job that lost to a privacy-epoch move wrote nothing; it is
    sent again (a new job, reading the transcript as it is now under the new epoch)."""
    from brain.topic_state import summarize_call

    outcome = summarize_call(call_pk)
    if outcome.status == "stale_epoch" and self.request.retries < STALE_RETRIES:
        raise self.retry(countdown=1)
    return outcome.status


async def dispatch_call_summary(call_pk: int) -> None:
    """At hang-up: on a Celery worker when a broker is configured, else on this event loop
    (a thread of its own: the audio path never waits for it)."""
    if uses_broker():
        await sync_to_async(summarize_call_task.delay, thread_sensitive=False)(call_pk)
        return
    from brain.topic_state import summarize_call

    async def run() -> None:
        try:
            await database_sync_to_async(summarize_call)(call_pk)
        except Exception as exc:  # noqa: BLE001 - a failed summary loses continuity, never the call
            log_event("call_summary_failed", call=call_pk, error=type(exc).__name__)

    task = asyncio.ensure_future(run())
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


async def settle() -> None:
    """Wait for the summaries this process runs in-process (no broker) to finish."""
    while _tasks:
        await asyncio.gather(*list(_tasks), return_exceptions=True)
