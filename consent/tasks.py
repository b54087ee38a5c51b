from __future__ import annotations

from celery import shared_task

from consent.services import expire_cards, settle_interrupted_executions


@shared_task(name="consent.tasks.expire_cards")
def expire_cards_task() -> int:
    return expire_cards() + settle_interrupted_executions()
