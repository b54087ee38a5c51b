"""The models of the ``llm`` app: the local model catalog's selections and signed switches
(``docs/voice.md``) here; model roles and their revisions (``llm.role_models``), drafts of
role changes (``llm.role_draft_models``) and model usage (``llm.usage_models``) beside it.

Every table keeps the name it had before the app existed (``db_table``): ``brain_*`` for
roles, drafts and usage, ``devices_*`` for selections and switches. The models moved here
from brain by state only (``llm/migrations/0001_initial.py``); an installed instance keeps
its rows.
"""

from __future__ import annotations

from django.db import models


class ModelSelection(models.Model):
    """Which catalog model is selected for one kind, which one is effective, and the one
    that was effective before. Written only by ``llm.model_settings``."""

    class State(models.TextChoices):
        NONE = "none"  # nothing selected (no catalog entry of this kind)
        EFFECTIVE = "effective"  # selected == effective
        PENDING_RESTART = "pending_restart"  # ASR/VAD/wake word: a running process keeps its model
        NEEDS_ENROLLMENT = "needs_enrollment"  # voiceprint: channels in use must be re-enrolled
        REBUILDING = "rebuilding"  # embedding: the derived vector index is being rebuilt
        FAILED = "failed"  # see error_code / error_message; the effective model is unchanged
        LISTED = "listed"  # face: listed only, switched through face enrollment

    kind = models.CharField(max_length=16, unique=True)
    selected_id = models.CharField(max_length=80, blank=True)
    selected_version = models.CharField(max_length=64, blank=True)
    effective_id = models.CharField(max_length=80, blank=True)
    effective_version = models.CharField(max_length=64, blank=True)
    previous_id = models.CharField(max_length=80, blank=True)
    previous_version = models.CharField(max_length=64, blank=True)
    state = models.CharField(max_length=24, choices=State.choices, default=State.NONE)
    progress_done = models.PositiveIntegerField(default=0)
    progress_total = models.PositiveIntegerField(default=0)
    error_code = models.CharField(max_length=48, blank=True)
    error_message = models.CharField(max_length=500, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "devices_modelselection"  # the table it had in devices, before it moved to brain and then here

    @property
    def selected_key(self) -> str:
        return f"{self.selected_id}@{self.selected_version}" if self.selected_id else ""

    @property
    def effective_key(self) -> str:
        return f"{self.effective_id}@{self.effective_version}" if self.effective_id else ""

    @property
    def previous_key(self) -> str:
        return f"{self.previous_id}@{self.previous_version}" if self.previous_id else ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.selected_key or '-'} ({self.state})"


class ModelSwitch(models.Model):
    """A model switch signed on one of the owner's devices (kept as evidence)."""

    kind = models.CharField(max_length=16)
    model_id = models.CharField(max_length=80)
    version = models.CharField(max_length=64)
    device = models.ForeignKey("accounts.Device", on_delete=models.PROTECT, related_name="model_switches")
    issued_at = models.DateTimeField()
    nonce = models.CharField(max_length=64, unique=True, help_text="single use: replay guard")
    message = models.TextField(help_text="the canonical message the device signed")
    signature = models.CharField(max_length=128)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "devices_modelswitch"  # the table it had in devices, before it moved to brain and then here
        verbose_name_plural = "model switches"


from llm.role_draft_models import ModelRoleDraft  # noqa: E402,F401  (registered with the llm app)
from llm.role_models import ModelRole, ModelRoleRevision, ModelSettingsImport  # noqa: E402,F401  (registered with the llm app)
from llm.usage_models import ModelUsage  # noqa: E402,F401  (registered with the llm app)
