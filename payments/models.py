from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class PaymentIntent(models.Model):
    """The owner's own request to pay a payee, in one run. States move by conditional
    UPDATEs: open → authorizing → paying → paid | failed | unknown | stopped | cancelled."""

    class State(models.TextChoices):
        OPEN = "open"  # created at the checkout; no card yet
        AUTHORIZING = "authorizing"  # a card is waiting for the owner
        PAYING = "paying"
        PAID = "paid"
        FAILED = "failed"
        UNKNOWN = "unknown"
        STOPPED = "stopped"  # the amount changed too often
        CANCELLED = "cancelled"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="payment_intents")
    run = models.ForeignKey("brain.Run", on_delete=models.CASCADE, related_name="payment_intents")
    payee = models.CharField(max_length=200, blank=True)
    merchant = models.CharField(max_length=200, blank=True)
    currency = models.CharField(max_length=8, default="CNY")
    amount = models.DecimalField(max_digits=12, decimal_places=2, null=True, blank=True, help_text="read back at the checkout")
    budget = models.DecimalField(max_digits=12, decimal_places=2, null=True, blank=True, help_text="the owner's own limit, if stated")
    items = models.JSONField(default=list, blank=True)
    eta = models.CharField(max_length=100, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.OPEN, db_index=True)
    replacements = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    # The reply that told the owner how the payment ended (at most one per intent).
    reported_entry = models.ForeignKey("memory.TimelineEntry", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    def __str__(self) -> str:
        return f"{self.merchant or self.payee} {self.amount} {self.currency} ({self.state})"


class PaymentAuthorization(models.Model):
    """One authorization for one payment: never remembered, one-shot, valid 60 s.

    pending (card shown) → authorized → used | voided | expired | denied.
    """

    class State(models.TextChoices):
        PENDING = "pending"
        AUTHORIZED = "authorized"
        USED = "used"
        VOIDED = "voided"
        EXPIRED = "expired"
        DENIED = "denied"

    class Method(models.TextChoices):
        PHONE_CARD = "phone_card"
        VOICE = "voice"
        AUTO = "auto"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    intent = models.ForeignKey(PaymentIntent, on_delete=models.CASCADE, related_name="authorizations")
    call = models.ForeignKey("capabilities.ToolCall", on_delete=models.CASCADE, related_name="payment_authorizations")
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    payee = models.CharField(max_length=200)
    method = models.CharField(max_length=16, choices=Method.choices, default=Method.PHONE_CARD)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    card_expires_at = models.DateTimeField()
    authorized_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="authorized_at + 60 s")
    undo_until = models.DateTimeField(null=True, blank=True, help_text="small auto-pay: the owner may undo until then")
    used_at = models.DateTimeField(null=True, blank=True)
    authorized_by = models.ForeignKey("accounts.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    void_reason = models.CharField(max_length=100, blank=True)
    # The phone card as it was issued (the ``payment.card`` frame): a phone that connects
    # later is sent exactly this, never a card rebuilt from an intent that moved on.
    card = models.JSONField(default=dict, blank=True)


class UnlockLease(models.Model):
    """A device's signed word that it is unlocked, valid for a short time."""

    device = models.ForeignKey("accounts.Device", on_delete=models.CASCADE, related_name="unlock_leases")
    granted_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True)
