"""Reminders, scheduled tasks and watches (geofences, followed parcels): what Yimi does at a
time or when a state moves, without the owner saying anything then. It sits above ``brain``:
a schedule or a watch fires a real run (``brain.services.create_scheduled_run``), and
brain's embedded sweeper reaches this app only through what ``ready`` registers."""

from django.apps import AppConfig


class SchedulesConfig(AppConfig):
    name = "schedules"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Here, not at the top: the sweep's modules import models, which exist only once the
        # app registry is ready (brain.sweeper is a layer below; no cycle is being dodged).
        from brain import sweeper
        from schedules.tasks import sweep_due

        sweeper.register_due_sweep(sweep_due)  # the embedded default's beat: reminders, schedules, watches
