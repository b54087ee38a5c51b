"""The Celery tasks that execute what the owner approved: an approved card's call and a
payment (``brain.consent_execution``, ``brain.payment_execution``), and the registration of
both executors under those tasks' names (``brain.executors``), which ``brain.dispatch``
starts them by. Their names are from before they moved here from consent/ and payments/:
messages already queued carry them. Registered through ``brain.tasks``."""

from __future__ import annotations

import asyncio

from celery import shared_task

from brain import executors
from brain.consent_execution import execute_approved
from brain.payment_execution import execute_payment
from payments.services import EXECUTE_PAYMENT_TASK

executors.register(executors.CARD_EXECUTION, execute_approved)
executors.register(EXECUTE_PAYMENT_TASK, execute_payment)


@shared_task(name=executors.CARD_EXECUTION, acks_late=True)
def execute_approved_task(card_id: str) -> str:
    return asyncio.run(execute_approved(card_id))


@shared_task(name=EXECUTE_PAYMENT_TASK, acks_late=True)
def execute_payment_task(authorization_id: str) -> str:
    return asyncio.run(execute_payment(authorization_id))
