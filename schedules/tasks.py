"""The due sweeps of this app: reminders, schedules and watches, every ``DUE_SWEEP_SECONDS``.

With a broker, beat sends the three Celery tasks below by name (``CELERY_BEAT_SCHEDULE``).
They keep the names they were registered under while they lived in the ``brain`` app
(``brain.tasks.fire_due_reminders``, ``brain.tasks.fire_due_schedules``,
``brain.tasks.run_due_watches``), so beat entries and tasks already queued on an installed
instance still run. Without a broker (the embedded default) ``sweep_due`` does the same on
the web server's event loop: ``SchedulesConfig.ready`` registers it with brain's embedded
sweeper (``brain.sweeper.register_due_sweep``).
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from celery import shared_task

from brain.dispatch import dispatch_run, publish_run
from schedules.reminders import fire_due_reminders
from schedules.schedules import fire_due_schedules
from schedules.watches import run_due_watches


@shared_task(name="brain.tasks.fire_due_reminders")
def fire_due_reminders_task() -> int:
    return fire_due_reminders()


@shared_task(name="brain.tasks.fire_due_schedules")
def fire_due_schedules_task() -> int:
    run_ids = fire_due_schedules()
    for run_id in run_ids:
        publish_run(run_id)  # the run lane (brain.run_lane), as a device's text
    return len(run_ids)


@shared_task(name="brain.tasks.run_due_watches")
def run_due_watches_task() -> int:
    return run_due_watches()


async def sweep_due() -> None:
    """One round of the embedded sweeper (no broker, no beat): fire due reminders, fire due
    schedules and start their runs on this event loop, check due watches. An error ends
    the round; the sweeper logs it and tries again next round."""
    await sync_to_async(fire_due_reminders)()
    for run_id in await sync_to_async(fire_due_schedules)():
        await dispatch_run(run_id)
    await sync_to_async(run_due_watches)()
