"""Paying with an authorization, once, and telling the owner how the payment ended.

The payment authority (``payments.services``) keeps the authorization (claim, settle); this
is the executor's side, in brain/ because its last step is a turn of the model.

Steps: 1. use the authorization (one-shot, within its 60 s, after any undo window);
2. call the executor's ``pay`` with the authorization id and amount injected — the
executor reads the checkout amount back and pays only if it equals the authorized
amount; 3. record the receipt; 4. settle: paid, replaced (a new card for the new
amount, at most 2 per intent), stopped, unknown or failed; 5. when the payment has
ended, one report turn, checked against the receipt, stored once per intent.

A payment card the owner denied is acknowledged instead (``acknowledge_declined``): a short
reply from a template, through the same delivery, once per intent.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings

from brain import reporting
from brain.dispatch import dispatch_payment
from capabilities import services
from capabilities.mcp_host.runtime import on_host_loop
from capabilities.models import ReceiptRecord
from payments import services as payments
from payments.models import PaymentAuthorization, PaymentIntent
from yimi_project.logs import log_event


async def execute_payment(authorization_id: Any, now: datetime | None = None) -> str:
    """Pay with the authorization if it can be used at ``now`` (default: the real clock)."""
    auth = await database_sync_to_async(payments.claim_authorization)(authorization_id, now)
    if auth is None:
        return "skipped"
    call = auth.call
    arguments = {
        **call.arguments,
        "payment_intent_id": str(auth.intent_id),
        "payment_authorization_id": str(auth.id),
        "authorized_amount": f"{auth.amount:.2f}",
    }
    capability = await database_sync_to_async(services.execution_capability)(call.id)
    result = await on_host_loop(
        lambda m: m.call(call.tool, arguments, timeout=settings.PACK_CALL_TIMEOUT_SECONDS, capability=capability)
    )
    transport_error = result.transport_error or (f"the tool reported an error: {result.text[:200]}" if result.is_error else None)
    stored = await database_sync_to_async(services.record_receipt)(call.id, result.structured, transport_error=transport_error)
    settlement = await database_sync_to_async(payments.settle)(auth, stored.record.receipt)
    log_event("payment_settled", intent_id=str(auth.intent_id), outcome=settlement.outcome)
    if settlement.new_authorization is not None and settlement.new_authorization.method == PaymentAuthorization.Method.AUTO:
        await dispatch_payment(settlement.new_authorization.id, delay=float(settings.PAYMENTS_AUTOPAY_UNDO_SECONDS))
    if settlement.outcome != "replaced":
        await report_payment(auth.intent_id)
    return settlement.outcome


async def report_payment(intent_id: Any) -> None:
    """A new turn tells the owner how the payment ended, once per intent."""

    def build() -> tuple[PaymentIntent, reporting.Report] | None:
        intent = PaymentIntent.objects.select_related("run", "run__inbound").get(id=intent_id)
        if intent.reported_entry_id is not None:
            return None
        call_ids = list(intent.authorizations.values_list("call_id", flat=True))
        record = ReceiptRecord.objects.select_related("call").filter(call_id__in=call_ids).order_by("-created_at", "-revision").first()
        header = [
            "[A payment the owner asked for has ended — tell the owner briefly how it went.]",
            f"Payee: {intent.merchant or intent.payee}; state: {intent.state}; card replacements: {intent.replacements}",
        ]
        return intent, reporting.report_for_records([record] if record else [], intent.owner_id, header)

    built = await database_sync_to_async(build)()
    if built is None:
        return
    intent, report = built
    await reporting.report_turn(
        intent.run, report, lambda entry_id: payments.mark_intent_reported(intent.id, entry_id), event=f"intent {intent.id}"
    )


async def acknowledge_declined(authorization_id: Any) -> bool:
    """The owner declined the payment card: a short reply ("好，不付了。") to the utterance
    that asked for the payment, stored at most once per intent (it is the intent's report)
    and delivered like a report. False when the card is not denied or the intent was
    already reported."""
    auth = await database_sync_to_async(
        lambda: PaymentAuthorization.objects.select_related("intent", "intent__run", "intent__run__inbound")
        .filter(id=authorization_id, state=PaymentAuthorization.State.DENIED)
        .first()
    )()
    if auth is None or auth.intent.reported_entry_id is not None:
        return False
    intent = auth.intent
    delivered = await reporting.deliver_reply(
        intent.run, reporting.declined_ack("spend"), lambda entry_id: payments.mark_intent_reported(intent.id, entry_id)
    )
    log_event("payment_declined_acknowledged", intent_id=str(intent.id), delivered=delivered)
    return delivered
