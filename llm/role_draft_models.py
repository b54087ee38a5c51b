"""Drafts of model-role changes, confirmed on one of the owner's devices.

Written only by ``llm.role_drafts``. A draft's proposed settings never change after it
is made (the device signs a digest of them); only its state, its probe result and its
confirmation are written later. A new provider key is sealed at once (``llm.keyring``,
bound to the draft's id) and never stored, shown or sent back in plaintext.
"""

from __future__ import annotations

import uuid

from django.db import models

from llm.role_models import ROLE_NAMES


class ModelRoleDraft(models.Model):
    class State(models.TextChoices):
        OPEN = "open"
        CONFIRMED = "confirmed"
        DISCARDED = "discarded"
        STALE = "stale"  # the role changed after the draft was made; refused on confirm

    class Creator(models.TextChoices):
        OWNER_CONSOLE = "owner_console"
        YIMI = "yimi"  # through the model_settings pack

    class KeyChange(models.TextChoices):
        UNCHANGED = "unchanged"
        NEW = "new key"

    class Probe(models.TextChoices):
        PENDING = "pending"
        OK = "ok"
        FAILED = "failed"
        UNSUPPORTED = "unsupported"  # the role's endpoint is not a chat completion (tts, asr_remote, realtime)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    role = models.CharField(max_length=24, choices=[(r, r) for r in ROLE_NAMES])
    provider = models.CharField(max_length=64)
    base_url = models.CharField(max_length=500)
    model = models.CharField(max_length=200)
    options = models.JSONField(default=dict, blank=True, help_text="validated, defaults filled in (llm.roles.validate_options)")
    key_change = models.CharField(max_length=16, choices=KeyChange.choices, default=KeyChange.UNCHANGED)
    # llm.keyring blob bound to this draft's id; null unless key_change is "new key".
    api_key_encrypted = models.TextField(null=True, blank=True)
    digest = models.CharField(max_length=64, help_text="sha256 of the canonical proposed settings (role_drafts.draft_digest)")
    created_by = models.CharField(max_length=16, choices=Creator.choices)
    note = models.CharField(max_length=300, blank=True)
    idempotency_key = models.CharField(max_length=64, null=True, blank=True, unique=True)
    # The role's own version when the draft was made (0: the role had no settings of its own).
    base_version = models.PositiveIntegerField(default=0)
    state = models.CharField(max_length=16, choices=State.choices, default=State.OPEN, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    probe_status = models.CharField(max_length=16, choices=Probe.choices, default=Probe.PENDING)
    probe_error_code = models.CharField(max_length=48, blank=True)
    probe_message = models.CharField(max_length=300, blank=True)
    probe_http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    probe_latency_ms = models.PositiveIntegerField(null=True, blank=True)
    probed_at = models.DateTimeField(null=True, blank=True)

    # The confirmation: which device signed what, with its attestation ({"unlocked": true, "method": ...}).
    confirmed_device_id = models.UUIDField(null=True, blank=True)
    confirm_nonce = models.CharField(max_length=64, null=True, blank=True, unique=True)
    confirm_issued_at = models.DateTimeField(null=True, blank=True)
    confirm_message = models.TextField(blank=True)
    confirm_signature = models.TextField(blank=True)
    attestation = models.JSONField(null=True, blank=True)
    applied_version = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        db_table = "brain_modelroledraft"  # the table it had before it moved to llm
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return f"draft {str(self.id)[:8]}: {self.role} → {self.provider} {self.model} ({self.state})"
