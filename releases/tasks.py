"""Celery tasks of the releases app (beat: ``CELERY_BEAT_SCHEDULE`` in settings)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from functools import partial

from celery import shared_task

from releases import idle, pointers, processes, requested
from releases.request_models import RollbackRequest
from yimi_project.logs import log_event


def inside_a_service(services: Sequence[processes.ProcessService]) -> bool:
    """Is this process one of the services a rollback stops (its process group is one a
    service's pid file records)? Then it must not run the rollback: it would stop itself
    half-way. The watchdog process, which no rollback stops, takes the request instead."""
    group = os.getpgid(0)
    for service in services:
        path = service.pid_file
        try:
            if path is not None and int(json.loads(path.read_text())["pid"]) == group:
                return True
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return False


@shared_task(name="releases.tasks.execute_rollback_requests")
def execute_rollback_requests() -> int:
    """Execute the owner's waiting rollback requests if this host is idle now (else they
    wait for the next beat). Returns how many were decided."""
    if not RollbackRequest.objects.filter(state__in=[RollbackRequest.State.PENDING, RollbackRequest.State.EXECUTING]).exists():
        return 0
    root = pointers.releases_root()
    services = processes.load_services(root)
    if inside_a_service(services):
        log_event("rollback_request_left_to_watchdog")
        return 0
    outcomes = requested.execute_pending(idle_check=partial(idle.blockers, root=root), services=services, root=root)
    return len(outcomes)
