"""Celery tasks of the releases app (beat: ``CELERY_BEAT_SCHEDULE`` in settings)."""

from __future__ import annotations

from functools import partial

from celery import shared_task

from releases import idle, pointers, processes, requested
from releases.request_models import RollbackRequest


@shared_task(name="releases.tasks.execute_rollback_requests")
def execute_rollback_requests() -> int:
    """Execute the owner's waiting rollback requests if this host is idle now (else they
    wait for the next beat). Returns how many were decided."""
    if not RollbackRequest.objects.filter(state=RollbackRequest.State.PENDING).exists():
        return 0
    root = pointers.releases_root()
    outcomes = requested.execute_pending(
        idle_check=partial(idle.blockers, root=root), services=processes.load_services(root), root=root
    )
    return len(outcomes)
