"""The Celery app. With ``REDIS_URL`` set it uses Redis as broker; without it the
platform runs tasks in-process (see ``brain.dispatch``) and no worker is needed. A worker
recovers runs when it is ready (connected by ``BrainConfig.ready``)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "yimi_project.settings")

app = Celery("yimi")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
