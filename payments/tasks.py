from __future__ import annotations

import asyncio

from celery import shared_task


@shared_task(name="payments.tasks.execute_payment", acks_late=True)
def execute_payment_task(authorization_id: str) -> str:
    from payments.execution import execute_payment

    return asyncio.run(execute_payment(authorization_id))


@shared_task(name="payments.tasks.expire_authorizations")
def expire_authorizations_task() -> int:
    from payments.services import expire_authorizations

    return expire_authorizations()
