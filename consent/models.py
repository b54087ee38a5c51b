from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class ConsentCard(models.Model):
    """A confirmation card for one call the gateway would not run without the owner.

    ``pending`` → ``approved`` | ``denied`` | ``expired``, by conditional UPDATEs. What the
    owner approves is exactly the stored call (its arguments are fixed at decide time).
    """

    class State(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        DENIED = "denied"
        EXPIRED = "expired"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="consent_cards")
    call = models.OneToOneField("capabilities.ToolCall", on_delete=models.CASCADE, related_name="consent_card")
    run = models.ForeignKey("brain.Run", on_delete=models.CASCADE, related_name="consent_cards")
    category = models.CharField(max_length=16)
    tool = models.CharField(max_length=128)
    target = models.CharField(max_length=300, blank=True)
    task_type = models.CharField(max_length=64, blank=True)
    preview = models.CharField(max_length=500, blank=True)
    owner_requested = models.BooleanField(default=False)
    arguments_digest = models.CharField(max_length=64)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True)
    answered_at = models.DateTimeField(null=True, blank=True)
    answered_by = models.ForeignKey("accounts.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # The reply that told the owner how the approved action went, or acknowledged the denial
    # (at most one per card).
    reported_entry = models.ForeignKey("memory.TimelineEntry", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    def __str__(self) -> str:
        return f"{self.category} {self.tool} → {self.target or '-'} ({self.state})"


class ExecutionToken(models.Model):
    """The right to execute an approved card's call once: ``ready`` → ``executing`` → ``done``."""

    class State(models.TextChoices):
        READY = "ready"
        EXECUTING = "executing"
        DONE = "done"

    card = models.OneToOneField(ConsentCard, on_delete=models.CASCADE, related_name="token")
    state = models.CharField(max_length=16, choices=State.choices, default=State.READY)
    claimed_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, blank=True)


class RememberedConsent(models.Model):
    """An owner-requested send the owner approved once: the same (recipient, task type)
    goes ahead without asking again, until revoked."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="remembered_consents")
    recipient = models.CharField(max_length=300)
    task_type = models.CharField(max_length=64)
    card = models.ForeignKey(ConsentCard, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "recipient", "task_type"],
                condition=models.Q(revoked_at__isnull=True),
                name="one_live_consent_per_recipient_and_task_type",
            )
        ]

    def __str__(self) -> str:
        return f"{self.task_type} → {self.recipient}"


class RidePermission(models.Model):
    """The owner's permission for ride hailing (physical), valid until it expires."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ride_permissions")
    granted_by = models.ForeignKey("accounts.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    granted_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
