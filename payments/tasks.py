from __future__ import annotations

from celery import shared_task

from payments.services import expire_authorizations


@shared_task(name="payments.tasks.expire_authorizations")
def expire_authorizations_task() -> int:
    return expire_authorizations()
