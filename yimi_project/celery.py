"""The Celery app. With ``REDIS_URL`` set it uses Redis as broker; without it the
platform runs tasks in-process (see ``brain.dispatch``) and no worker is needed."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "yimi_project.settings")

app = Celery("yimi")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_ready.connect
def _recover_runs_on_worker_start(**_: object) -> None:
    import asyncio

    from brain.recovery import recover_runs

    asyncio.run(recover_runs())
