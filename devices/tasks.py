"""Celery tasks of the devices app."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings


@shared_task(name="devices.rebuild_vector_index", acks_late=True)
def rebuild_vector_index_task(model_id: str, version: str) -> str:
    from devices.vector_index import rebuild_vector_index

    return rebuild_vector_index(model_id, version)


def dispatch_rebuild(model_id: str, version: str) -> None:
    """On a Celery worker when a broker is configured; inline in the embedded default."""
    if settings.CELERY_BROKER_URL:
        rebuild_vector_index_task.delay(model_id, version)
    else:
        rebuild_vector_index_task.apply(args=(model_id, version))
