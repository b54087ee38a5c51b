"""Running an approved card's call exactly once, and telling the owner how it went.

The consent authority (``consent.services``) keeps the card and its execution token (claim,
finish); this is the executor's side, in brain/ because its last step is a turn of the model.

Steps: 1. claim the card's execution token (only one caller ever does); 2. recheck the
call with the approval as credential (a failed recheck is a ``cancelled`` receipt);
3. execute the stored arguments over MCP; a disconnect or timeout is recorded
``unknown`` and must be checked before any retry; 4. record the receipt as the call's next
revision; 5. one report turn, checked against the receipt, stored at most once per card.

A denied card is acknowledged instead (``acknowledge_denied``): a short reply from a
template, through the same delivery, once per card.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings

from brain import reporting
from capabilities import services
from capabilities.mcp_host.runtime import on_host_loop
from capabilities.models import ReceiptRecord
from consent import services as consent
from consent.models import ConsentCard
from yimi_project.logs import log_event


async def execute_approved(card_id: Any) -> str:
    card = await database_sync_to_async(consent.claim_execution)(card_id)
    if card is None:
        return "skipped"
    decision = await database_sync_to_async(services.recheck_approved)(card.call_id)
    if not decision.executes:
        await database_sync_to_async(services.record_gateway_receipt)(card.call_id, "cancelled", f"not executed: {decision.reason}")
        outcome = "cancelled"
    else:
        call = card.call
        result = await on_host_loop(
            lambda m: m.call(call.tool, call.arguments, timeout=settings.PACK_CALL_TIMEOUT_SECONDS, capability=decision.pack_capability)
        )
        transport_error = result.transport_error or (f"the tool reported an error: {result.text[:200]}" if result.is_error else None)
        stored = await database_sync_to_async(services.record_receipt)(call.id, result.structured, transport_error=transport_error)
        outcome = stored.record.status
    await database_sync_to_async(consent.finish_execution)(card.id, outcome)
    log_event("consent_executed", card_id=str(card.id), outcome=outcome)
    await report_card(card.id)
    return outcome


async def report_card(card_id: Any) -> None:
    """A new turn tells the owner what happened to the approved action, once per card."""

    def build() -> tuple[Any, reporting.Report] | None:
        card = ConsentCard.objects.select_related("run", "run__inbound", "call").get(id=card_id)
        if card.reported_entry_id is not None:
            return None
        record = ReceiptRecord.objects.select_related("call").filter(call_id=card.call_id).order_by("-revision").first()
        header = [
            "[An action the owner approved has been handled — tell the owner briefly how it went.]",
            f"Action: {card.tool} ({card.category}) for {card.target or '-'}",
        ]
        return card, reporting.report_for_records([record] if record else [], card.owner_id, header)

    built = await database_sync_to_async(build)()
    if built is None:
        return
    card, report = built
    await reporting.report_turn(card.run, report, lambda entry_id: consent.mark_card_reported(card.id, entry_id), event=f"card {card.id}")


async def acknowledge_denied(card_id: Any) -> bool:
    """The owner said no: a short reply to the utterance that led to the card
    (``reporting.declined_ack`` by the card's category, e.g. "好，不发了。"), stored at most once
    per card (it is the card's report) and delivered like a report. False when the card is
    not denied or was already reported."""
    card = await database_sync_to_async(
        lambda: ConsentCard.objects.select_related("run", "run__inbound").filter(id=card_id, state=ConsentCard.State.DENIED).first()
    )()
    if card is None or card.reported_entry_id is not None:
        return False
    delivered = await reporting.deliver_reply(
        card.run, reporting.declined_ack(card.category), lambda entry_id: consent.mark_card_reported(card.id, entry_id)
    )
    log_event("consent_denied_acknowledged", card_id=str(card.id), delivered=delivered)
    return delivered
