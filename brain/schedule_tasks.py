"""The Celery tasks beat runs for schedules and watches (every ``DUE_SWEEP_SECONDS``)."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="brain.tasks.fire_due_schedules")
def fire_due_schedules_task() -> int:
    from brain.dispatch import publish_run
    from brain.schedules import fire_due_schedules

    run_ids = fire_due_schedules()
    for run_id in run_ids:
        publish_run(run_id)  # the run lane (brain.run_lane), as a device's text
    return len(run_ids)


@shared_task(name="brain.tasks.run_due_watches")
def run_due_watches_task() -> int:
    from brain.watches import run_due_watches

    return run_due_watches()
