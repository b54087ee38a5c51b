"""The payment authority (F3 part B): the only code that writes ``PaymentIntent``,
``PaymentAuthorization`` and ``UnlockLease``.

- An intent exists only because of the owner's own request in this run (scope ``owner``,
  ``owner_requested``): it is opened when the executor reaches the checkout. Without one the
  pack's CheckoutStop refuses to enter the checkout.
- Every payment gets its own authorization, never remembered: by default a card on the
  phone, answered unlocked with a device signature; one-shot, valid 60 s.
- Before paying, the amount read back at the checkout must equal the authorized amount;
  otherwise the card is voided and a new one issued, at most 2 times per intent, then stop.
- Voice pay and small auto-pay are off by default; when any condition fails, the phone
  card is used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone

from accounts.models import AdmissionRecord, Device, User
from accounts.voice_checks import voice_request_verified
from capabilities.authorities import GateQuestion, RunBinding, TrustedField, Verdict
from capabilities.models import ToolCall
from capabilities.services import record_gateway_receipt
from memory.locks import lock_owner_payments
from memory.models import TimelineEntry
from payments.models import PaymentAuthorization, PaymentIntent, UnlockLease
from yimi_project import push
from yimi_project.errors import YimiError
from yimi_project.ids import uuid_or_nil
from yimi_project.logs import log_event

# Device.Kind values: payment cards go to the owner's phones; an unlock lease is held by a
# phone or glasses.
PHONE = "phone"
UNLOCK_DEVICE_KINDS = ("phone", "glasses")
# The Celery task that pays with an authorization; brain/ runs it and registers how to start
# it (yimi_project.push.start_after_commit). The name predates its move to brain/.
EXECUTE_PAYMENT_TASK = "payments.tasks.execute_payment"
CENT = Decimal("0.01")
LIVE_INTENT = (PaymentIntent.State.OPEN, PaymentIntent.State.AUTHORIZING)
# "authorized, paying, paid or unknown" — what the 30-minute same-payee rule counts.
COMMITTED_INTENT = (PaymentIntent.State.PAYING, PaymentIntent.State.PAID, PaymentIntent.State.UNKNOWN)


def money(value: Any) -> Decimal | None:
    try:
        amount = Decimal(str(value)).quantize(CENT)
    except (InvalidOperation, ValueError, TypeError):
        return None
    return amount if amount.is_finite() and amount >= 0 else None


# --- intents ---------------------------------------------------------------------------------


def open_intent(binding: RunBinding, owner_requested: bool) -> PaymentIntent | None:
    """The intent for a checkout in this run: only the owner's own request opens one.

    Returns None (so the executor stops at the checkout) for any other scope, for a call
    the owner did not ask for, and inside scheduled tasks.
    """
    if binding.scope != "owner" or not owner_requested or binding.origin == "scheduled":
        return None
    existing = PaymentIntent.objects.filter(run_id=binding.run_id, state__in=LIVE_INTENT).order_by("-created_at").first()
    if existing is not None:
        return existing
    return PaymentIntent.objects.create(owner_id=binding.owner_id, run_id=binding.run_id)


def checkout_read(intent_id: Any, receipt: dict[str, Any]) -> None:
    """Record what the checkout page said (amount, payee, items, ETA) on the intent."""
    if receipt.get("status") != "succeeded":
        return
    content = receipt.get("content") or {}
    values = {v["name"]: v for v in receipt.get("values", [])}
    amount = money(content.get("amount") or (values.get("amount") or {}).get("value"))
    PaymentIntent.objects.filter(id=intent_id, state__in=LIVE_INTENT).update(
        amount=amount,
        payee=str(content.get("payee", ""))[:200],
        merchant=str(content.get("merchant", ""))[:200],
        items=content.get("items") or [],
        eta=str(content.get("eta", ""))[:100],
    )


def set_budget(intent_id: Any, budget: Any) -> None:
    amount = money(budget)
    if amount is not None:
        PaymentIntent.objects.filter(id=intent_id).update(budget=amount)


def gate(binding: RunBinding) -> Verdict:
    """A ``spend`` call: it needs an open intent from the owner's own request in this run
    whose checkout amount was read; then it asks for a fresh authorization. An intent whose
    authorization is already waiting is ``already_waiting`` (the gateway decides under the
    owner's lock, so of two spend calls at once the second sees the first's). An ``ask``
    verdict's ticket is the intent."""
    if binding.scope != "owner":
        return Verdict("block", "payment_not_owner_scope", "only the owner's own request can lead to a payment")
    if binding.origin == "scheduled":
        return Verdict("block", "needs_confirmation_in_scheduled_task", "a payment needs the owner's authorization, which a scheduled task cannot ask for")
    intent = PaymentIntent.objects.filter(run_id=binding.run_id, state=PaymentIntent.State.OPEN).order_by("-created_at").first()
    if intent is None:
        if PaymentIntent.objects.filter(run_id=binding.run_id, state=PaymentIntent.State.AUTHORIZING).exists():
            return Verdict("block", "already_waiting", "this payment is already waiting for the owner's authorization; not paid again")
        return Verdict("block", "no_payment_intent", "no payment intent from the owner's own request in this run; go through the checkout first")
    if intent.amount is None or not intent.payee:
        return Verdict("block", "checkout_not_read", "the checkout amount has not been read back yet")
    return Verdict("ask", "waiting_for_authorization", "waiting for the owner's payment authorization; not paid", ticket=intent)


# --- authorizations -------------------------------------------------------------------------------


def open_authorization(intent: PaymentIntent, call: Any) -> PaymentAuthorization:
    """Issue the authorization request for the intent's current amount (inside the
    gateway's transaction, or the settlement's for a replacement card).

    Steps, in one transaction: 1. take the owner's payment lock
    (``memory.locks.lock_owner_payments``); 2. conditional UPDATE of the intent ``open`` →
    ``authorizing`` — a row count other than 1 means another authorization was issued for
    it first: ``already_waiting``, and everything rolls back; 3. the small auto-pay check:
    today's auto-paid sum and the same-payee rule count every auto-payment committed
    before, because a concurrent one waits for the lock and sees this one after it
    commits (so together they never exceed the daily cap or pay one payee twice in 30
    minutes); 4. insert the authorization: authorized at once with an undo window when
    every auto-pay condition holds, otherwise a card for the phone.
    """
    with transaction.atomic():
        lock_owner_payments(intent.owner_id)
        claimed = PaymentIntent.objects.filter(id=intent.id, state=PaymentIntent.State.OPEN).update(state=PaymentIntent.State.AUTHORIZING)
        if claimed != 1:
            raise YimiError("already_waiting", "this payment already has an authorization waiting; not paid again")
        now = timezone.now()
        intent.refresh_from_db()
        assert intent.amount is not None, "gate() lets a payment ask only after the checkout amount was read"
        auto = autopay_check(intent, now)
        auth = PaymentAuthorization(
            intent=intent,
            call=call,
            amount=intent.amount,
            payee=intent.payee,
            method=PaymentAuthorization.Method.AUTO if auto.ok else PaymentAuthorization.Method.PHONE_CARD,
            card_expires_at=now + timedelta(seconds=settings.PAYMENT_CARD_TTL_SECONDS),
        )
        if not auto.ok:
            auth.card = _issued_card(auth, intent)  # what the phone is shown, now and on reconnect
        auth.save(force_insert=True)
        if auto.ok:
            authorize(auth, method=PaymentAuthorization.Method.AUTO, device=None, undo_seconds=settings.PAYMENTS_AUTOPAY_UNDO_SECONDS)
    log_event("payment_authorization_opened", intent_id=str(intent.id), method=auth.method, reasons=auto.reasons)
    return auth


def authorize(auth: PaymentAuthorization, *, method: str, device: Device | None, undo_seconds: int = 0) -> bool:
    """``pending`` → ``authorized``, valid 60 s from now (after the undo window, if any).

    One conditional UPDATE: the card must still be pending and not past its end. False
    (nothing changed) when another answer or the expiry sweeper closed it first."""
    now = timezone.now()
    undo_until = now + timedelta(seconds=undo_seconds) if undo_seconds else None
    starts = undo_until or now
    changed = PaymentAuthorization.objects.filter(
        id=auth.id, state=PaymentAuthorization.State.PENDING, card_expires_at__gt=now
    ).update(
        state=PaymentAuthorization.State.AUTHORIZED,
        method=method,
        authorized_at=now,
        authorized_by=device,
        undo_until=undo_until,
        expires_at=starts + timedelta(seconds=settings.PAYMENT_AUTHORIZATION_SECONDS),
    )
    auth.refresh_from_db()
    return bool(changed)


def payment_card_message(auth: PaymentAuthorization, answer: str) -> bytes:
    """The canonical card and answer the phone signs; ``unlocked`` is the phone's own
    statement that it was unlocked when the owner answered."""
    return "\n".join(
        ["yimi-payment-v1", str(auth.id), auth.payee, f"{auth.amount:.2f}", auth.intent.currency, auth.card_expires_at.isoformat(), answer, "unlocked"]
    ).encode()


def card_frame(auth: PaymentAuthorization) -> dict[str, Any]:
    """The ``payment.card`` frame: the card as it was issued (stored with the
    authorization), so every push of it, before or after a reconnect, says the same."""
    if auth.card:
        return dict(auth.card)
    return _issued_card(auth, auth.intent)


def _issued_card(auth: PaymentAuthorization, intent: PaymentIntent) -> dict[str, Any]:
    return {
        "type": "payment.card",
        "authorization_id": str(auth.id),
        "payee": auth.payee,
        "merchant": intent.merchant,
        "amount": f"{auth.amount:.2f}",
        "currency": intent.currency,
        "items": intent.items,
        "eta": intent.eta,
        "expires_at": auth.card_expires_at.isoformat(),
        "replacement": intent.replacements,
        "method": auth.method,
        "undo_until": auth.undo_until.isoformat() if auth.undo_until else None,
        "voice_pay": voice_pay_check(intent).ok,
    }


def card_devices(owner_id: int) -> list[Any]:
    """Payment cards go to the owner's phones (any owner device if there is none)."""
    return push.owner_devices(owner_id, (PHONE,))


def pending_cards(owner_id: int, now: datetime | None = None) -> list[PaymentAuthorization]:
    """Open payment cards: phone cards still waiting for the owner's answer and not
    expired at ``now``, oldest first. A phone that connects later is sent each of them
    once per connection (``devices.consumers.cards``); an answered or expired card is not."""
    now = now or timezone.now()
    return list(
        PaymentAuthorization.objects.select_related("intent")
        .filter(
            intent__owner_id=owner_id,
            method=PaymentAuthorization.Method.PHONE_CARD,
            state=PaymentAuthorization.State.PENDING,
            card_expires_at__gt=now,
        )
        .order_by("created_at", "id")
    )


def push_card_after_commit(auth: PaymentAuthorization) -> None:
    """Send the card to the owner's phones once the transaction commits."""

    def send() -> None:
        fresh = PaymentAuthorization.objects.select_related("intent").get(id=auth.id)
        push.to_owner_devices_sync(fresh.intent.owner_id, (PHONE,), card_frame(fresh))

    transaction.on_commit(send)


def answer_card(device: Device, authorization_id: Any, answer: Any, signature: Any) -> PaymentAuthorization:
    """The owner answers a payment card on the phone.

    Steps: 1. valid answer, the owner's own non-guest phone; 2. the signature over the
    canonical card, answer and "unlocked" must be the device's (else nothing changes);
    3. an expired card is closed; 4. approve: ``pending`` → ``authorized`` (valid 60 s),
    a conditional UPDATE that also checks the card has not ended (``authorize``); deny:
    ``pending`` → ``denied`` and the intent is cancelled. An answer that loses the race to
    another answer or to the expiry sweeper is ``card_closed`` and changes nothing.
    """
    if answer not in ("approve", "deny"):
        raise YimiError("invalid_frame", "answer must be approve or deny")
    if device.is_guest or device.kind != PHONE:
        raise YimiError("forbidden", "payment cards are answered on the owner's phone")
    auth = _authorization_for(device, authorization_id)
    if not device.verify_signature(payment_card_message(auth, answer), signature):
        raise YimiError("bad_signature", "the answer is not signed by this phone over this card")
    now = timezone.now()
    if auth.state == PaymentAuthorization.State.PENDING and auth.card_expires_at <= now:
        expire_authorization(auth, now)
        raise YimiError("card_expired", "this payment card has expired; nothing was paid")
    if answer == "deny":
        with transaction.atomic():
            if not PaymentAuthorization.objects.filter(id=auth.id, state=PaymentAuthorization.State.PENDING).update(
                state=PaymentAuthorization.State.DENIED
            ):
                raise YimiError("card_closed", "this payment card was already answered")
            _close_intent(auth, PaymentIntent.State.CANCELLED, "the owner declined the payment; nothing was paid")
    elif not authorize(auth, method=PaymentAuthorization.Method.PHONE_CARD, device=device):
        raise YimiError("card_closed", "this payment card was already answered or has expired")
    auth.refresh_from_db()
    log_event("payment_answered", authorization_id=str(auth.id), answer=answer)
    return auth


def _authorization_for(device: Device, authorization_id: Any) -> PaymentAuthorization:
    auth = (
        PaymentAuthorization.objects.select_related("intent")
        .filter(id=uuid_or_nil(authorization_id), intent__owner_id=device.owner_id)
        .first()
    )
    if auth is None:
        raise YimiError("not_found", "there is no such payment card")
    return auth


def _close_intent(auth: PaymentAuthorization, state: str, reason: str) -> None:
    PaymentIntent.objects.filter(id=auth.intent_id).exclude(state__in=[PaymentIntent.State.PAID]).update(state=state)
    record_gateway_receipt(auth.call_id, "cancelled", reason)


def _due(now: datetime) -> Q:
    """An authorization past its end at ``now``: a card nobody answered in time, or an
    authorization nobody used within its 60 s."""
    return Q(state=PaymentAuthorization.State.PENDING, card_expires_at__lte=now) | Q(
        state=PaymentAuthorization.State.AUTHORIZED, expires_at__lte=now
    )


def expire_authorization(auth: PaymentAuthorization, now: datetime | None = None) -> bool:
    """Close one authorization past its end: a conditional UPDATE that checks again, on
    the row as it is now, that it is still pending or authorized *and* past its end. An
    answer, an undo or a use that got there first wins (nothing changes, False): an
    approval is never expired after it was accepted. Otherwise the intent is cancelled
    with a ``cancelled`` receipt."""
    now = now or timezone.now()
    with transaction.atomic():
        changed = PaymentAuthorization.objects.filter(_due(now), id=auth.id).update(state=PaymentAuthorization.State.EXPIRED)
        if changed:
            _close_intent(auth, PaymentIntent.State.CANCELLED, "the payment authorization expired; nothing was paid")
    return bool(changed)


def expire_authorizations(now: datetime | None = None) -> int:
    """The sweeper: expire every authorization past its end at ``now`` (each checked again
    as it is closed, so one answered meanwhile is left alone)."""
    now = now or timezone.now()
    return sum(expire_authorization(a, now) for a in PaymentAuthorization.objects.filter(_due(now)))


def undo(device: Device, authorization_id: Any, signature: Any, now: datetime | None = None) -> PaymentAuthorization:
    """Undo a small auto-payment within its 5-second window (before ``undo_until``, at
    ``now``): ``authorized`` → ``voided``."""
    if device.is_guest:
        raise YimiError("forbidden", "a guest device cannot undo the owner's payments")
    auth = _authorization_for(device, authorization_id)
    if not device.verify_signature(payment_card_message(auth, "undo"), signature):
        raise YimiError("bad_signature", "the undo is not signed by this device")
    with transaction.atomic():
        changed = PaymentAuthorization.objects.filter(
            id=auth.id, state=PaymentAuthorization.State.AUTHORIZED, undo_until__gt=now or timezone.now()
        ).update(state=PaymentAuthorization.State.VOIDED, void_reason="undone by the owner")
        if not changed:
            raise YimiError("too_late", "the undo window has passed or the payment is not waiting")
        _close_intent(auth, PaymentIntent.State.CANCELLED, "the owner undid the payment; nothing was paid")
    auth.refresh_from_db()
    return auth


def claim_authorization(authorization_id: Any, now: datetime | None = None) -> PaymentAuthorization | None:
    """Use an authorization, once: ``authorized`` → ``used``, only within its 60 s and
    after any undo window (at ``now``). A second use, or one after 60 s, gets None."""
    now = now or timezone.now()
    with transaction.atomic():
        claimed = (
            PaymentAuthorization.objects.filter(id=uuid_or_nil(authorization_id), state=PaymentAuthorization.State.AUTHORIZED, expires_at__gt=now)
            .filter(Q(undo_until__isnull=True) | Q(undo_until__lte=now))
            .update(state=PaymentAuthorization.State.USED, used_at=now)
        )
        if claimed != 1:
            return None
        auth = PaymentAuthorization.objects.select_related("intent", "call").get(id=authorization_id)
        PaymentIntent.objects.filter(id=auth.intent_id).update(state=PaymentIntent.State.PAYING)
    return auth


def authorization_in_use(call_id: Any) -> bool:
    """An authorization for this pay call was just used: the executor is paying with it."""
    recent = timezone.now() - timedelta(seconds=settings.PACK_CALL_TIMEOUT_SECONDS + 60)
    return PaymentAuthorization.objects.filter(call_id=call_id, state=PaymentAuthorization.State.USED, used_at__gte=recent).exists()


@dataclass
class Settlement:
    outcome: str  # paid, replaced, stopped, unknown, failed
    new_authorization: PaymentAuthorization | None = None


def settle(auth: PaymentAuthorization, receipt: dict[str, Any]) -> Settlement:
    """After the executor tried to pay with ``auth``.

    Steps: succeeded → the intent is paid. The checkout amount differed
    (``AMOUNT_CHANGED``) → the old authorization is void; within 2 replacements the intent
    takes the new amount and a new card is issued, after that the intent stops. unknown →
    the intent is unknown (it must be checked, never paid again blindly). Anything else
    failed.
    """
    status = receipt.get("status")
    error = str((receipt.get("error") or {}).get("code", "")).upper()
    with transaction.atomic():
        lock_owner_payments(auth.intent.owner_id)  # before the intent's row: the order open_authorization takes them in
        intent = PaymentIntent.objects.select_for_update().get(id=auth.intent_id)
        if status == "succeeded":
            PaymentIntent.objects.filter(id=intent.id).update(state=PaymentIntent.State.PAID)
            return Settlement("paid")
        if error == "AMOUNT_CHANGED":
            PaymentAuthorization.objects.filter(id=auth.id).update(void_reason="the checkout amount changed")
            values = {v["name"]: v.get("value") for v in receipt.get("values", [])}
            new_amount = money(values.get("checkout_amount"))
            if intent.replacements >= settings.PAYMENT_MAX_REPLACEMENTS or new_amount is None:
                _close_intent(auth, PaymentIntent.State.STOPPED, "the checkout amount kept changing; stopped without paying")
                return Settlement("stopped")
            PaymentIntent.objects.filter(id=intent.id).update(
                replacements=intent.replacements + 1, amount=new_amount, state=PaymentIntent.State.OPEN
            )
            intent.refresh_from_db()
            record_gateway_receipt(auth.call_id, "waiting", "the amount changed; waiting for a new authorization; not paid")
            new = open_authorization(intent, auth.call)
            if new.method == PaymentAuthorization.Method.PHONE_CARD:
                push_card_after_commit(new)
            return Settlement("replaced", new)
        if status == "unknown":
            PaymentIntent.objects.filter(id=intent.id).update(state=PaymentIntent.State.UNKNOWN)
            return Settlement("unknown")
        PaymentIntent.objects.filter(id=intent.id).update(state=PaymentIntent.State.FAILED)
        return Settlement("failed")


def mark_intent_reported(intent_id: Any, entry_id: int) -> bool:
    return bool(PaymentIntent.objects.filter(id=intent_id, reported_entry=None).update(reported_entry_id=entry_id))


# --- unlock leases, voice pay, small auto-pay ---------------------------------------------------


def unlock_message(device_id: Any, nonce: str) -> bytes:
    return f"yimi-unlock-v1\n{device_id}\n{nonce}".encode()


def grant_unlock_lease(device: Device, nonce: str, signature: Any) -> UnlockLease:
    """The phone or glasses says, signed, that it is unlocked; the lease lasts a few minutes.
    ``nonce`` is the websocket's challenge nonce, so a lease cannot be replayed later."""
    if device.is_guest or device.kind not in UNLOCK_DEVICE_KINDS:
        raise YimiError("forbidden", "only the owner's phone or glasses hold an unlock lease")
    if not device.verify_signature(unlock_message(device.id, nonce), signature):
        raise YimiError("bad_signature", "the unlock statement is not signed by this device")
    return UnlockLease.objects.create(
        device=device, expires_at=timezone.now() + timedelta(seconds=settings.PAYMENT_UNLOCK_LEASE_SECONDS)
    )


def unlock_lease_valid(device_id: Any) -> bool:
    return UnlockLease.objects.filter(device_id=device_id, expires_at__gt=timezone.now()).exists()


@dataclass
class Check:
    ok: bool
    reasons: list[str] = field(default_factory=list)


def _voice_request(intent: PaymentIntent) -> Any:
    return AdmissionRecord.objects.select_related("device").filter(run__id=intent.run_id).first()


def voice_pay_check(intent: PaymentIntent) -> Check:
    """Voice pay: enabled; a recent voice request from the owner's phone or glasses with
    a valid unlock lease; a known payee (paid before); within the request budget and the
    per-payment limit (default 200)."""
    reasons = []
    if not settings.PAYMENTS_VOICE_PAY_ENABLED:
        reasons.append("voice pay is off")
    admission = _voice_request(intent)
    recent = timezone.now() - timedelta(seconds=settings.PAYMENT_RECENT_VOICE_REQUEST_SECONDS)
    if admission is None or admission.channel != "voice" or admission.scope != "owner" or admission.created_at < recent:
        reasons.append("no recent voice request from the owner")
    elif admission.device.kind not in UNLOCK_DEVICE_KINDS or not unlock_lease_valid(admission.device_id):
        reasons.append("no valid unlock lease on the phone or glasses")
    if not known_payee(intent.owner_id, intent.payee, exclude=intent.id):
        reasons.append("the payee is not known")
    if intent.amount is None or intent.amount > Decimal(settings.PAYMENTS_VOICE_PAY_MAX):
        reasons.append(f"over the voice pay limit of {settings.PAYMENTS_VOICE_PAY_MAX}")
    if intent.budget is None or intent.amount is None or intent.amount > intent.budget:
        reasons.append("not within the request's budget")
    return Check(not reasons, reasons)


def autopay_check(intent: PaymentIntent, now: datetime | None = None) -> Check:
    """Small auto-pay: every voice pay condition, plus the voice request was verified by
    voiceprint, ≤ 50 per payment, ≤ 150 per day (the owner's time zone), and no other
    authorized, paying, paid or unknown payment to the same payee created in the last 30
    minutes."""
    now = now or timezone.now()
    voice = voice_pay_check(intent)
    reasons = list(voice.reasons)
    if not settings.PAYMENTS_AUTOPAY_ENABLED:
        reasons.append("small auto-pay is off")
    admission = _voice_request(intent)
    if admission is None or not voice_request_verified(admission):
        reasons.append("the voice request was not verified by voiceprint")
    amount = intent.amount or Decimal("0")
    if amount > Decimal(settings.PAYMENTS_AUTOPAY_MAX):
        reasons.append(f"over the per-payment limit of {settings.PAYMENTS_AUTOPAY_MAX}")
    if autopaid_today(intent.owner_id, now) + amount > Decimal(settings.PAYMENTS_AUTOPAY_DAILY_MAX):
        reasons.append(f"over the daily limit of {settings.PAYMENTS_AUTOPAY_DAILY_MAX}")
    if recent_payment_to_same_payee(intent, now):
        reasons.append("another payment to this payee in the last 30 minutes")
    return Check(not reasons, reasons)


def known_payee(owner_id: int, payee: str, exclude: Any = None) -> bool:
    return bool(payee) and PaymentIntent.objects.filter(owner_id=owner_id, payee=payee, state=PaymentIntent.State.PAID).exclude(id=exclude).exists()


def owner_day_start(owner_id: int, now: datetime) -> datetime:
    tz_name = User.objects.filter(id=owner_id).values_list("time_zone", flat=True).first() or "UTC"
    local = now.astimezone(ZoneInfo(tz_name))
    return local.replace(hour=0, minute=0, second=0, microsecond=0)


def autopaid_today(owner_id: int, now: datetime) -> Decimal:
    """What small auto-pay has committed since midnight in the owner's time zone."""
    total = PaymentAuthorization.objects.filter(
        intent__owner_id=owner_id,
        method=PaymentAuthorization.Method.AUTO,
        authorized_at__gte=owner_day_start(owner_id, now),
        authorized_at__lte=now,
        state__in=[PaymentAuthorization.State.AUTHORIZED, PaymentAuthorization.State.USED],
    ).exclude(intent__state__in=[PaymentIntent.State.CANCELLED, PaymentIntent.State.FAILED, PaymentIntent.State.STOPPED]).aggregate(s=Sum("amount"))["s"]
    return total or Decimal("0")


def recent_payment_to_same_payee(intent: PaymentIntent, now: datetime) -> bool:
    since = now - timedelta(seconds=settings.PAYMENTS_SAME_PAYEE_WINDOW_SECONDS)
    others = PaymentIntent.objects.filter(owner_id=intent.owner_id, payee=intent.payee, created_at__gte=since).exclude(id=intent.id)
    return others.filter(
        Q(state__in=COMMITTED_INTENT) | Q(authorizations__state=PaymentAuthorization.State.AUTHORIZED)
    ).exists()


def voice_confirm(device: Device, authorization_id: Any, utterance_seq: Any) -> PaymentAuthorization:
    """"付吧" said on the phone or glasses for a recent voice request from the same device:
    the utterance must be a voice request in scope owner, from that device, after the card."""
    auth = _authorization_for(device, authorization_id)
    intent = auth.intent
    check = voice_pay_check(intent)
    if not check.ok:
        raise YimiError("voice_pay_unavailable", "; ".join(check.reasons))
    request = _voice_request(intent)
    if request is None or request.device_id != device.id:
        raise YimiError("forbidden", "say it on the device the request came from")
    entry = TimelineEntry.objects.filter(owner_id=device.owner_id, seq=utterance_seq, device=device).first()
    admission = AdmissionRecord.objects.filter(run__inbound=entry).first() if entry else None
    said = (entry.text if entry else "").strip().rstrip("。！!.")
    # Payment never rests on a trust window or a call anchor: the voiceprint itself must verify it.
    if entry is None or admission is None or not voice_request_verified(admission) or entry.created_at < auth.created_at or said != "付吧":
        raise YimiError("not_confirmed", "no spoken 付吧 from the owner, verified by voiceprint, on this device after the card")
    if not authorize(auth, method=PaymentAuthorization.Method.VOICE, device=device):
        raise YimiError("card_closed", "this payment card was already answered")
    return auth


# --- in the gateway ------------------------------------------------------------------------------


class PaymentGate:
    """The payment authority's gate (``capabilities.authorities.Gate``), registered by
    ``PaymentsConfig.ready`` for spend calls."""

    waiting_summary = "waiting for your payment authorization; not paid"

    def decide(self, question: GateQuestion) -> Verdict:
        return gate(question.binding)

    def ask(self, call: ToolCall, question: GateQuestion, verdict: Verdict, *, preview: str, arguments_digest: str) -> str:
        """Open the authorization for the verdict's intent: a card for the phone, sent after
        commit, or an auto-payment, paid after its undo window by the payment task."""
        auth = open_authorization(verdict.ticket, call)
        if auth.method == PaymentAuthorization.Method.PHONE_CARD:
            push_card_after_commit(auth)
        else:
            push.start_after_commit(EXECUTE_PAYMENT_TASK, auth.id, delay=float(settings.PAYMENTS_AUTOPAY_UNDO_SECONDS))
        return str(auth.id)

    def executing(self, call_id: Any) -> bool:
        return authorization_in_use(call_id)


def _checkout_intent(binding: RunBinding, owner_requested: bool, budget: Any) -> str:
    """``payment_intent_id`` for a checkout call: the intent only the owner's own request
    opens (``open_intent``; empty otherwise, and the executor's CheckoutStop refuses to go
    further), with the owner's own spending limit when the request gave one."""
    intent = open_intent(binding, owner_requested)
    if intent is not None and budget is not None:
        set_budget(intent.id, budget)
    return str(intent.id) if intent else ""


def _checkout_result(call: ToolCall, intent_id: str, receipt: dict[str, Any]) -> None:
    """What the checkout page said, recorded on the intent (a spend call's own result is
    settled by ``settle`` instead)."""
    if call.category != "spend":
        checkout_read(intent_id, receipt)


CHECKOUT_INTENT = TrustedField(provide=_checkout_intent, on_receipt=_checkout_result)
