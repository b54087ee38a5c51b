"""Recovery: runs whose worker died are picked up again; runs older than 3 minutes are
expired with a notice instead of answered late (seed 002, inbound recovery)."""

from __future__ import annotations

from channels.db import database_sync_to_async

from brain import services
from brain.agents import tasks_to_recover
from brain.dispatch import dispatch_run, dispatch_task
from brain.runner import _announce
from yimi_project.logs import log_event


async def recover_runs() -> tuple[int, int]:
    again, expire = await database_sync_to_async(services.runs_to_recover)()
    expired = 0
    for run_id in expire:
        outcome = await database_sync_to_async(services.expire_run)(run_id)
        if outcome is not None:
            expired += 1
            await _announce(*outcome)
    for run_id in again:
        await dispatch_run(run_id)
    for task_id in await database_sync_to_async(tasks_to_recover)():
        await dispatch_task(task_id)
    if again or expired:
        log_event("runs_recovered", recovered=len(again), expired=expired)
    return len(again), expired
