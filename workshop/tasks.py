"""The Celery task that runs a workshop build (``workshop.builds.start_build``)."""

from __future__ import annotations

from celery import shared_task

from workshop.builds import execute_build


@shared_task(name="workshop.tasks.run_build", acks_late=True)
def run_build_task(build_id: str) -> str:
    return execute_build(build_id).state
