from __future__ import annotations

import asyncio

from celery import shared_task


@shared_task(name="brain.tasks.execute_run", acks_late=True)
def execute_run_task(run_id: str) -> str:
    from brain.runner import execute_run

    return asyncio.run(execute_run(run_id))


@shared_task(name="brain.tasks.execute_agent_task", acks_late=True)
def execute_agent_task_task(task_id: str) -> str:
    from brain.agent_loop import execute_agent_task

    return asyncio.run(execute_agent_task(task_id))


@shared_task(name="brain.tasks.sweep_runs")
def sweep_runs() -> tuple[int, int]:
    from brain.recovery import recover_runs

    return asyncio.run(recover_runs())


from brain.reminder_tasks import fire_due_reminders_task  # noqa: E402,F401  (registers brain.tasks.fire_due_reminders)
