from __future__ import annotations

import asyncio

from celery import shared_task
from django.conf import settings


@shared_task(name="brain.tasks.execute_run", acks_late=True)
def execute_run_task(run_id: str, stages: dict[str, float] | None = None) -> str:
    """``stages``: trace stages noted before the run reached the worker (``queued``)."""
    from brain.runner import execute_run

    return asyncio.run(execute_run(run_id, stages=stages))


@shared_task(name="brain.tasks.execute_agent_task", acks_late=True)
def execute_agent_task_task(task_id: str) -> str:
    from brain.agent_loop import execute_agent_task

    return asyncio.run(execute_agent_task(task_id))


@shared_task(name="brain.tasks.sweep_runs")
def sweep_runs() -> tuple[int, int]:
    from brain.recovery import recover_runs

    return asyncio.run(recover_runs())


# Its name from before it moved here from devices/: messages already queued carry that name.
@shared_task(name="devices.rebuild_vector_index", acks_late=True)
def rebuild_vector_index_task(model_id: str, version: str) -> str:
    from brain.vector_index import rebuild_vector_index

    return rebuild_vector_index(model_id, version)


def dispatch_rebuild(model_id: str, version: str) -> None:
    """On a Celery worker when a broker is configured; inline in the embedded default."""
    if settings.CELERY_BROKER_URL:
        rebuild_vector_index_task.delay(model_id, version)
    else:
        rebuild_vector_index_task.apply(args=(model_id, version))


from brain.execution_tasks import execute_approved_task, execute_payment_task  # noqa: E402,F401  (registers them)
from brain.reminder_tasks import fire_due_reminders_task  # noqa: E402,F401  (registers brain.tasks.fire_due_reminders)
from brain.schedule_tasks import fire_due_schedules_task, run_due_watches_task  # noqa: E402,F401  (registers brain.tasks.fire_due_schedules, run_due_watches)
