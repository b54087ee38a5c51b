from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class ToolCall(models.Model):
    """One capability call as the gateway decided it (flow F2), plus what
    ``observe`` recorded about its execution. The id is the trusted call id."""

    class Decision(models.TextChoices):
        ALLOW = "allow"
        REWRITE = "rewrite"
        BLOCK = "block"
        ASK = "ask"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tool_calls")
    run = models.ForeignKey("brain.Run", on_delete=models.CASCADE, related_name="tool_calls")
    agent_id = models.CharField(max_length=64, blank=True, help_text="the agent in the run's delegation tree")
    tool = models.CharField(max_length=128)
    category = models.CharField(max_length=16, blank=True)
    arguments = models.JSONField(default=dict, help_text="the arguments as executed (trusted fields injected)")
    owner_requested = models.BooleanField(default=False)
    fingerprint = models.CharField(max_length=64, db_index=True, help_text="tool + the model's arguments")
    idempotency_key = models.CharField(max_length=64)
    decision = models.CharField(max_length=8, choices=Decision.choices)
    decision_code = models.CharField(max_length=48, blank=True)
    decision_reason = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    observed_error = models.CharField(max_length=300, blank=True)
    observed_at = models.DateTimeField(null=True, blank=True)
    # The content digest of the published pack version the call was decided on (empty for
    # a shipped pack): the registry's monitoring compares versions by it.
    pack_version = models.CharField(max_length=64, blank=True, default="", db_index=True)

    def __str__(self) -> str:
        return f"{self.tool} → {self.decision}"


class ReceiptRecord(models.Model):
    """The receipt ledger: one row per (task id, call id, revision), never updated.

    A long task's current state is its latest revision; earlier revisions stay as history.
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="receipts")
    call = models.ForeignKey(ToolCall, on_delete=models.CASCADE, related_name="receipts")
    task_id = models.CharField(max_length=128)
    revision = models.PositiveIntegerField(default=1)
    # The call's fingerprint, copied here so "did this exact call already succeed?" is one
    # indexed lookup.
    call_fingerprint = models.CharField(max_length=64, default="")
    status = models.CharField(max_length=16, db_index=True)
    receipt = models.JSONField(help_text="the normalized receipt")
    content_fingerprint = models.CharField(max_length=64, help_text="sha256 of what the tool returned")
    violations = models.JSONField(default=list)
    contradictions = models.JSONField(default=list)
    written_by_gateway = models.BooleanField(default=False, help_text="a block or an ask, not a pack result")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task_id", "call", "revision"], name="receipt_unique_task_call_revision"),
            # revisions of one task are strictly ordered, whichever call reported them
            models.UniqueConstraint(fields=["task_id", "revision"], name="receipt_unique_task_revision"),
        ]
        indexes = [
            models.Index(fields=["task_id", "-revision"]),
            models.Index(fields=["owner", "call_fingerprint", "-created_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} r{self.revision}: {self.status}"


class ToldFact(models.Model):
    """A fact carried by a reply; it counts as told once a device ACK covers that reply."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="told_facts")
    fact_id = models.CharField(max_length=32)
    entry = models.ForeignKey("memory.TimelineEntry", on_delete=models.CASCADE, related_name="told_facts")
    acknowledged_at = models.DateTimeField(null=True, blank=True, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["fact_id", "entry"], name="told_fact_once_per_entry")]
        indexes = [models.Index(fields=["owner", "fact_id"])]


# The pack registry's tables live in their own module (issue 18).
from capabilities.registry_models import PackCandidate, PackVersion, RegisteredPack  # noqa: E402

__all__ = ["PackCandidate", "PackVersion", "ReceiptRecord", "RegisteredPack", "ToldFact", "ToolCall"]
