"""The consent authority (F3 part A): the only code that writes ``ConsentCard``,
``ExecutionToken``, ``RememberedConsent`` and ``RidePermission``.

``required = sending || !requested``: an owner-requested action goes ahead, except a send,
which asks the first time per (owner, recipient, task type) and is then remembered. An
action the owner did not ask for always asks. Asking never blocks: the gateway answers
with a ``waiting`` receipt at once and the card goes to the owner's phone (and glasses).
Inside scheduled tasks nothing is carded: what would need a card is blocked.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import Device
from capabilities.authorities import GateQuestion, Verdict
from capabilities.models import ToolCall
from capabilities.services import canonical, record_gateway_receipt, sha256
from consent.models import ConsentCard, ExecutionToken, RememberedConsent, RidePermission
from memory.copies import ForgottenContent, redacted_text, rows_in_chunks
from yimi_project import push
from yimi_project.errors import YimiError
from yimi_project.ids import uuid_or_nil
from yimi_project.logs import log_event

DOOR_LOCK_TASK_TYPES = frozenset({"door_lock", "lock"})
RIDE_TASK_TYPES = frozenset({"ride"})
ANSWERS = ("approve", "deny")
CARD_DEVICE_KINDS = ("phone", "glasses")  # Device.Kind values: where consent cards go


@dataclass(frozen=True)
class ConsentQuestion:
    owner_id: int
    origin: str  # "interactive" or "scheduled"
    category: str
    owner_requested: bool
    target: str | None
    task_type: str
    tool: str


def gate(q: ConsentQuestion) -> Verdict:
    """Decide whether a call in a consent category may run, must ask, or is blocked.

    Steps: 1. physical: door locks are read-only; a ride needs the owner's ride permission;
    2. ``required = sending || !requested``, except that an owner-requested send to a
    remembered (recipient, task type) is not required; 3. not required: allow;
    4. required inside a scheduled task: block (nobody is there to answer a card);
    5. otherwise ask.
    """
    if q.category == "physical":
        if q.task_type in DOOR_LOCK_TASK_TYPES:
            return Verdict("block", "door_locks_read_only", "door locks are read-only for Yimi")
        if q.task_type in RIDE_TASK_TYPES and not ride_permission_active(q.owner_id):
            return Verdict("block", "ride_permission_missing", "a ride needs the owner's ride permission")
    sending = q.category == "send"
    required = sending or not q.owner_requested
    if sending and q.owner_requested and q.target and is_remembered(q.owner_id, q.target, q.task_type):
        return Verdict("allow", "remembered_send", "the owner approved this kind of send to this recipient before")
    if not required:
        return Verdict("allow", "owner_requested", "the owner asked for this")
    if q.origin == "scheduled":
        return Verdict("block", "needs_confirmation_in_scheduled_task", "this needs the owner's confirmation, which a scheduled task cannot ask for")
    return Verdict("ask", "waiting_for_owner", "waiting for the owner's confirmation; not executed")


def is_remembered(owner_id: int, recipient: str, task_type: str) -> bool:
    return RememberedConsent.objects.filter(
        owner_id=owner_id, recipient=recipient, task_type=task_type, revoked_at__isnull=True
    ).exists()


def ride_permission_active(owner_id: int) -> bool:
    return RidePermission.objects.filter(owner_id=owner_id, revoked_at__isnull=True, expires_at__gt=timezone.now()).exists()


def ride_permission_message(device_id: Any, nonce: str, minutes: int) -> bytes:
    return f"yimi-ride-v1\n{device_id}\n{nonce}\n{minutes}".encode()


def grant_ride_permission_from_device(device: Device, nonce: str, minutes: Any, signature: Any) -> RidePermission:
    """The owner grants ride hailing from a device, signed over this connection's nonce."""
    if device.is_guest:
        raise YimiError("forbidden", "a guest device cannot grant ride permission")
    if isinstance(minutes, bool) or not isinstance(minutes, int):
        raise YimiError("invalid_frame", "minutes must be an integer")
    if not device.verify_signature(ride_permission_message(device.id, nonce, minutes), signature):
        raise YimiError("bad_signature", "the ride permission is not signed by this device")
    return grant_ride_permission(device.owner_id, minutes=minutes, device=device)


def grant_ride_permission(owner_id: int, *, minutes: int, device: Device | None = None) -> RidePermission:
    if not 1 <= minutes <= 24 * 60:
        raise YimiError("invalid_request", "a ride permission lasts 1 minute to 24 hours")
    return RidePermission.objects.create(
        owner_id=owner_id, granted_by=device, expires_at=timezone.now() + timedelta(minutes=minutes)
    )


# --- cards --------------------------------------------------------------------------------------


def open_card(*, call: Any, run_id: Any, q: ConsentQuestion, preview: str, arguments_digest: str) -> ConsentCard:
    """Create the card for a call the gateway just decided to ask about (inside its transaction)."""
    return ConsentCard.objects.create(
        owner_id=q.owner_id,
        call=call,
        run_id=run_id,
        category=q.category,
        tool=q.tool,
        target=(q.target or "")[:300],
        task_type=q.task_type[:64],
        preview=preview[:500],
        owner_requested=q.owner_requested,
        arguments_digest=arguments_digest,
        expires_at=timezone.now() + timedelta(seconds=settings.CONSENT_CARD_TTL_SECONDS),
    )


def card_message(card: ConsentCard, answer: str) -> bytes:
    """The canonical form of a card and an answer, which the owner's device signs."""
    return "\n".join(
        [
            "yimi-consent-v1",
            str(card.id),
            card.category,
            card.tool,
            card.target,
            card.arguments_digest,
            card.expires_at.isoformat(),
            answer,
        ]
    ).encode()


def card_frame(card: ConsentCard) -> dict[str, Any]:
    return {
        "type": "consent.card",
        "card_id": str(card.id),
        "category": card.category,
        "tool": card.tool,
        "target": card.target,
        "preview": card.preview,
        "arguments_digest": card.arguments_digest,
        "expires_at": card.expires_at.isoformat(),
        "owner_requested": card.owner_requested,
    }


def card_devices(owner_id: int) -> list[Any]:
    """Where cards go: the owner's phones and glasses; any owner device if there are none."""
    return push.owner_devices(owner_id, CARD_DEVICE_KINDS)


def pending_cards(owner_id: int) -> list[ConsentCard]:
    return list(ConsentCard.objects.filter(owner_id=owner_id, state=ConsentCard.State.PENDING, expires_at__gt=timezone.now()))


def answer_card(device: Device, card_id: Any, answer: Any, signature: Any) -> ConsentCard:
    """The owner approves or denies a card from a device.

    Steps: 1. the answer and the card must be valid and the card the device owner's;
    2. the signature over the canonical card and answer must be the device's (otherwise
    nothing changes); 3. an expired card is closed as expired; 4. conditional UPDATE
    ``pending`` → ``approved``/``denied`` that also checks the card has not ended (a
    second or replayed answer, or one that loses the race to the expiry sweeper, finds it
    closed: ``card_closed``, nothing changes); 5. denied: a ``cancelled`` receipt;
    approved: an execution token, and an owner-requested send is remembered for
    (recipient, task type).
    """
    if answer not in ANSWERS:
        raise YimiError("invalid_frame", "answer must be approve or deny")
    if device.is_guest:
        raise YimiError("forbidden", "a guest device cannot answer the owner's cards")
    card = ConsentCard.objects.filter(id=uuid_or_nil(card_id), owner_id=device.owner_id).select_related("call").first()
    if card is None:
        raise YimiError("not_found", "there is no such card")
    if not device.verify_signature(card_message(card, answer), signature):
        raise YimiError("bad_signature", "the answer is not signed by this device over this card")
    now = timezone.now()
    if card.state == ConsentCard.State.PENDING and card.expires_at <= now:
        expire_card(card, now)
        raise YimiError("card_expired", "this card has expired; nothing was done")
    new_state = ConsentCard.State.APPROVED if answer == "approve" else ConsentCard.State.DENIED
    with transaction.atomic():
        changed = ConsentCard.objects.filter(id=card.id, state=ConsentCard.State.PENDING, expires_at__gt=now).update(
            state=new_state, answered_at=now, answered_by=device
        )
        if not changed:
            raise YimiError("card_closed", "this card was already answered or has expired")
        if new_state == ConsentCard.State.DENIED:
            _cancel_call(card, "the owner said no; not executed")
        else:
            ExecutionToken.objects.create(card=card)
            if card.category == "send" and card.owner_requested and card.target:
                _remember(card)
    card.refresh_from_db()
    log_event("consent_answered", card_id=str(card.id), answer=answer)
    return card


def _remember(card: ConsentCard) -> None:
    try:
        with transaction.atomic():
            RememberedConsent.objects.create(owner_id=card.owner_id, recipient=card.target, task_type=card.task_type, card=card)
    except IntegrityError:
        pass  # already remembered


def _cancel_call(card: ConsentCard, reason: str) -> None:
    record_gateway_receipt(card.call_id, "cancelled", reason)


def expire_card(card: ConsentCard, now: datetime | None = None) -> bool:
    """Close one card past its end: a conditional UPDATE ``pending`` → ``expired`` that
    checks again, on the row as it is now, that it is still pending and past its end at
    ``now``. An answer that got there first wins (nothing changes, False): an approved card
    is never expired, so it runs once or not at all. Otherwise a ``cancelled`` receipt."""
    now = now or timezone.now()
    with transaction.atomic():
        changed = ConsentCard.objects.filter(id=card.id, state=ConsentCard.State.PENDING, expires_at__lte=now).update(
            state=ConsentCard.State.EXPIRED, answered_at=now
        )
        if changed:
            _cancel_call(card, "the card expired without an answer; not executed")
    return bool(changed)


def expire_cards(now: datetime | None = None) -> int:
    """The sweeper: close every pending card past its end at ``now`` with a ``cancelled``
    receipt (each checked again as it is closed, so one answered meanwhile is left alone)."""
    now = now or timezone.now()
    due = ConsentCard.objects.filter(state=ConsentCard.State.PENDING, expires_at__lte=now)
    return sum(expire_card(card, now) for card in due)


def revoke_remembered(consent_id: Any) -> bool:
    return bool(RememberedConsent.objects.filter(id=consent_id, revoked_at__isnull=True).update(revoked_at=timezone.now()))


# --- exactly-once execution -----------------------------------------------------------------------


def claim_execution(card_id: Any) -> ConsentCard | None:
    """Take the card's execution token (``ready`` → ``executing``). Only one caller ever
    gets it: a second approval, a replayed answer or a racing worker gets None.

    One conditional UPDATE whose ``state = ready`` is a condition on the token row itself.
    (Filtering through the card, ``card__state``, would make Django write ``UPDATE ...
    WHERE id IN (SELECT ... JOIN card ... WHERE state = 'ready')``: PostgreSQL re-checks
    a row that a concurrent claim just updated against that subquery's old snapshot, so
    two workers waiting on each other would both claim it.) The card's approval is checked
    through a subquery on the card alone; an approved card never changes state again."""
    approved = ConsentCard.objects.filter(id=uuid_or_nil(card_id), state=ConsentCard.State.APPROVED).values("id")
    claimed = ExecutionToken.objects.filter(
        card_id=uuid_or_nil(card_id), state=ExecutionToken.State.READY, card_id__in=approved
    ).update(state=ExecutionToken.State.EXECUTING, claimed_at=timezone.now())
    if claimed != 1:
        return None
    return ConsentCard.objects.select_related("call", "run", "run__inbound").get(id=card_id)


def execution_in_progress(call_id: Any) -> bool:
    """An approved card's call is being executed right now (its token is ``executing``)."""
    return ExecutionToken.objects.filter(
        card__call_id=call_id, card__state=ConsentCard.State.APPROVED, state=ExecutionToken.State.EXECUTING
    ).exists()


def finish_execution(card_id: Any, outcome: str) -> None:
    ExecutionToken.objects.filter(card_id=card_id, state=ExecutionToken.State.EXECUTING).update(
        state=ExecutionToken.State.DONE, finished_at=timezone.now(), outcome=outcome[:16]
    )


def settle_interrupted_executions() -> int:
    """An execution whose worker died leaves its token ``executing``: the action may or
    may not have happened, so it is recorded ``unknown`` (check first), never retried."""
    limit = timezone.now() - timedelta(seconds=settings.PACK_CALL_TIMEOUT_SECONDS + 60)
    settled = 0
    for token in ExecutionToken.objects.filter(state=ExecutionToken.State.EXECUTING, claimed_at__lt=limit).select_related("card"):
        changed = ExecutionToken.objects.filter(id=token.id, state=ExecutionToken.State.EXECUTING).update(
            state=ExecutionToken.State.DONE, finished_at=timezone.now(), outcome="unknown"
        )
        if changed:
            record_gateway_receipt(token.card.call_id, "unknown", "the execution was interrupted; check before trying again", check_first=True)
            settled += 1
    return settled


def mark_card_reported(card_id: Any, entry_id: int) -> bool:
    """At most one report per event (the card)."""
    return bool(ConsentCard.objects.filter(id=card_id, reported_entry=None).update(reported_entry_id=entry_id))



def push_card_after_commit(card: ConsentCard) -> None:
    """Send the card to the owner's phone and glasses once the transaction commits."""
    transaction.on_commit(lambda: push.to_owner_devices_sync(card.owner_id, CARD_DEVICE_KINDS, card_frame(card)))


def pending_card_exists(owner_id: int, fingerprint: str) -> bool:
    return ConsentCard.objects.filter(
        owner_id=owner_id, call__fingerprint=fingerprint, state=ConsentCard.State.PENDING, expires_at__gt=timezone.now()
    ).exists()


# --- the gate in the gateway ---------------------------------------------------------------------


def _consent_question(q: GateQuestion) -> ConsentQuestion:
    return ConsentQuestion(
        owner_id=q.binding.owner_id, origin=q.binding.origin, category=q.category, owner_requested=q.owner_requested,
        target=q.target, task_type=q.task_type, tool=q.tool,
    )


class ConsentGate:
    """The consent authority's gate (``capabilities.authorities.Gate``), registered by
    ``ConsentConfig.ready`` for owner_data, send, account, delete and physical calls."""

    waiting_summary = "waiting for your confirmation; not executed"

    def decide(self, question: GateQuestion) -> Verdict:
        """The same action already waiting for a card is ``already_waiting``; otherwise ``gate``."""
        if pending_card_exists(question.binding.owner_id, question.fingerprint):
            return Verdict("block", "already_waiting", "this exact action is already waiting for the owner's confirmation")
        return gate(_consent_question(question))

    def ask(self, call: ToolCall, question: GateQuestion, verdict: Verdict, *, preview: str, arguments_digest: str) -> str:
        card = open_card(
            call=call, run_id=question.binding.run_id, q=_consent_question(question), preview=preview,
            arguments_digest=arguments_digest,
        )
        push_card_after_commit(card)
        return str(card.id)

    def executing(self, call_id: Any) -> bool:
        return execution_in_progress(call_id)


# --- forgetting -------------------------------------------------------------------------------------


def redact_payload(owner_id: int, content: ForgottenContent) -> dict[str, int]:
    """Redact copies of forgotten memory payloads in the owner's cards, and withdraw the
    cards that would still run one. Memory's ``forget`` calls this (registered in
    ``memory.copies``) inside its transaction.

    Steps: 1. every card's preview and target are redacted where they hold a copy, and
    written back where something changed; 2. a card still waiting — ``pending``, or
    ``approved`` with its execution token still ``ready`` — whose call's arguments hold a
    copy, or no longer match the digest the owner was shown (the gateway redacted them
    already), is withdrawn: ``pending`` → ``expired``, or the token ``ready`` → ``done``
    (outcome ``withdrawn``), each a conditional UPDATE, with a ``cancelled`` receipt for
    the call; a card answered meanwhile keeps its answer. Returns rows changed per place.
    """
    previews = withdrawn = 0
    cards = ConsentCard.objects.filter(owner_id=owner_id).select_related("call", "token").only(
        "id", "preview", "target", "state", "arguments_digest", "call__id", "call__arguments", "token__state"
    )
    for chunk in rows_in_chunks(cards):
        for card in chunk:
            preview, target = redacted_text(content, card.preview, 500), redacted_text(content, card.target, 300)
            if (preview, target) != (card.preview, card.target):
                ConsentCard.objects.filter(id=card.id).update(preview=preview, target=target)
                previews += 1
            ready = card.state == ConsentCard.State.APPROVED and hasattr(card, "token") and card.token.state == ExecutionToken.State.READY
            if card.state != ConsentCard.State.PENDING and not ready:
                continue
            arguments = card.call.arguments
            if content.redact(arguments) == arguments and sha256(canonical(arguments)) == card.arguments_digest:
                continue
            if card.state == ConsentCard.State.PENDING:
                closed = ConsentCard.objects.filter(id=card.id, state=ConsentCard.State.PENDING).update(
                    state=ConsentCard.State.EXPIRED, answered_at=timezone.now()
                )
            else:
                closed = ExecutionToken.objects.filter(card_id=card.id, state=ExecutionToken.State.READY).update(
                    state=ExecutionToken.State.DONE, finished_at=timezone.now(), outcome="withdrawn"
                )
            if closed:
                reason = "withdrawn: it held something the owner asked Yimi to forget; not executed"
                record_gateway_receipt(card.call_id, "cancelled", reason)
                withdrawn += 1
    return {"card_previews": previews, "cards_withdrawn": withdrawn}
