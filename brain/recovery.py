"""Recovery: runs whose worker died, or whose queue message was lost, are put on the queue
again; runs older than 3 minutes are expired with a notice instead of answered late.

A run is put on the queue again only when its latest message is older than the sweep
interval and the broker holds no message for it (``runs_on_queue``): a backlog of queued
runs is left to drain, so the queue never holds more run messages than there are runs
waiting for one (``brain.services.runs_to_recover``, ``mark_requeued``).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

import redis
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async

from brain import executors, reporting, run_lane, services
from brain.agents import tasks_to_recover
from brain.dispatch import dispatch_run, dispatch_task, uses_broker
from yimi_project.celery import app as celery_app
from yimi_project.logs import log_event

RUN_TASK = executors.RUN
RUN_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# kombu's Redis transport: a queue is one list per priority step (the base name for 0,
# then "<name>\x06\x16<step>"); messages a worker reserved wait in the "unacked" hash.
PRIORITY_SEPARATOR = "\x06\x16"
PRIORITY_STEPS = (3, 6, 9)
UNACKED_KEY = "unacked"


def _run_id(message: Any) -> str | None:
    headers = message.get("headers") if isinstance(message, dict) else None
    if not isinstance(headers, dict) or headers.get("task") != RUN_TASK:
        return None
    found = RUN_ID.search(str(headers.get("argsrepr") or ""))
    return found.group(0) if found else None


def runs_on_queue() -> set[str]:
    """Ids of the runs that have a message on the broker: waiting on the run lane
    (``brain.run_lane``) or in the Celery queue, or reserved by a worker that has not
    started it. Empty without a broker (the embedded
    default starts a run on its own event loop at once). Read in one transaction, so a
    message is never missed between the queue and the reserved set."""
    if not uses_broker():
        return set()
    conf = celery_app.conf  # where this process publishes (brain.dispatch)
    prefix = (conf.broker_transport_options or {}).get("global_keyprefix", "") or ""
    queue = prefix + conf.task_default_queue
    client = redis.Redis.from_url(conf.broker_url, socket_timeout=10)
    try:
        pipe = client.pipeline(transaction=True)
        for key in (queue, *(f"{queue}{PRIORITY_SEPARATOR}{step}" for step in PRIORITY_STEPS)):
            pipe.lrange(key, 0, -1)
        pipe.hvals(prefix + UNACKED_KEY)
        run_lane.waiting(pipe)
        *lists, reserved, lane = pipe.execute()
    finally:
        client.close()
    messages = [json.loads(raw) for waiting in lists for raw in waiting]
    messages += [entry[0] for entry in (json.loads(raw) for raw in reserved) if isinstance(entry, list) and entry]
    return {run_id for run_id in map(_run_id, messages) if run_id is not None} | run_lane.run_ids(lane)


async def recover_runs(*, now: datetime | None = None) -> tuple[int, int]:
    """One sweep, as of ``now``: expire what is too old, put on the queue again what lost
    its message. Returns (runs put on the queue again, runs expired)."""
    on_queue = await sync_to_async(runs_on_queue, thread_sensitive=False)()
    again, expire = await database_sync_to_async(services.runs_to_recover)(now=now, on_queue=on_queue)
    expired = 0
    for run_id in expire:
        outcome = await database_sync_to_async(services.expire_run)(run_id)
        if outcome is not None:
            expired += 1
            await reporting.announce_outcome(*outcome)
    requeued = 0
    for run_id in again:
        if await database_sync_to_async(services.mark_requeued)(run_id, now=now):  # another sweep may have been first
            requeued += 1
            await dispatch_run(run_id)
    for task_id in await database_sync_to_async(tasks_to_recover)():
        await dispatch_task(task_id)
    if requeued or expired:
        log_event("runs_recovered", recovered=requeued, expired=expired, on_queue=len(on_queue))
    return requeued, expired
