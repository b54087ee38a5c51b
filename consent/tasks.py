from __future__ import annotations

import asyncio

from celery import shared_task


@shared_task(name="consent.tasks.execute_approved", acks_late=True)
def execute_approved_task(card_id: str) -> str:
    from consent.execution import execute_approved

    return asyncio.run(execute_approved(card_id))


@shared_task(name="consent.tasks.expire_cards")
def expire_cards_task() -> int:
    from consent.services import expire_cards, settle_interrupted_executions

    return expire_cards() + settle_interrupted_executions()
