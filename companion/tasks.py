"""The end-of-call summary as a Celery task, sent at hang-up (``companion.topics``).

The task keeps the name it was registered under while it lived in the brain app,
``brain.tasks.summarize_call``: a summary queued on an installed instance before an upgrade
still runs. With a broker the task is sent to a worker; without one (the embedded default)
it runs in this process, on a thread of its own. Nothing here imports the brain: whether a
broker is configured is the settings' ``CELERY_BROKER_URL``, as ``brain.dispatch`` reads it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from asgiref.sync import sync_to_async
from celery import shared_task
from channels.db import database_sync_to_async
from django.conf import settings

from companion.topics import summarize_call
from yimi_project.logs import log_event

SUMMARIZE_CALL = "brain.tasks.summarize_call"  # the registered name (module docstring)
STALE_RETRIES = 3
_tasks: set[asyncio.Task[Any]] = set()


@shared_task(name=SUMMARIZE_CALL, bind=True, acks_late=True, max_retries=STALE_RETRIES)
def summarize_call_task(self: Any, call_pk: int) -> str:
    """Summarize one call. A job that lost to a privacy-epoch move wrote nothing; it is
    sent again (a new job, reading the transcript as it is now under the new epoch)."""
    outcome = summarize_call(call_pk)
    if outcome.status == "stale_epoch" and self.request.retries < STALE_RETRIES:
        raise self.retry(countdown=1)
    return outcome.status


def uses_broker() -> bool:
    return bool(settings.CELERY_BROKER_URL)


async def dispatch_call_summary(call_pk: int) -> None:
    """At hang-up: on a Celery worker when a broker is configured, else on this event loop
    (a thread of its own: the audio path never waits for it)."""
    if uses_broker():
        await sync_to_async(summarize_call_task.delay, thread_sensitive=False)(call_pk)
        return

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
