"""The Celery task that fires due reminders (beat runs it every 10 s)."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="brain.tasks.fire_due_reminders")
def fire_due_reminders_task() -> int:
    from brain.reminders import fire_due_reminders

    return fire_due_reminders()
