"""The models of the ``llm`` app: the local model catalog's selections and signed switches
(``docs/voice.md``), model roles and their revisions, drafts of role changes, and model
usage, each section with its own notes.

Every table keeps the name it had before the app existed (``db_table``): ``brain_*`` for
roles, drafts and usage, ``devices_*`` for selections and switches. The models moved here
from brain by state only (``llm/migrations/0001_initial.py``); an installed instance keeps
its rows.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone


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


# --- model roles, their revisions and settings imports -------------------------------------
# Model roles: which OpenAI-compatible endpoint and model each role of Yimi uses.
#
# Written only by ``llm.roles`` (and ``llm.management.commands.model_settings``, which
# calls it) and ``llm.role_backup`` (restoring a backup, rotating the master key). Provider
# keys are stored encrypted (``llm.keyring``); the plaintext never reaches a row, a log line
# or the admin.

ROLE_NAMES = (
    "brain",
    "delegation",
    "vision",
    "executor_fast",
    "executor_thorough",
    "realtime",
    "tts",
    "asr_remote",
    "workshop_repair",
)


class RoleSource(models.TextChoices):
    ENVIRONMENT = "environment"  # imported from the deployment environment at first start
    CONSOLE = "console"  # set in the console
    DRAFT = "draft"  # a draft confirmed on one of the owner's devices
    IMPORT = "import"  # restored with ``manage.py model_settings import``


class ModelRoleFields(models.Model):
    """What one role's settings are; shared by the current row and its revisions."""

    role = models.CharField(max_length=24, choices=[(r, r) for r in ROLE_NAMES])
    provider = models.CharField(max_length=64)
    base_url = models.CharField(max_length=500)
    model = models.CharField(max_length=200)
    # {thinking_field, timeout_seconds, connect_timeout_seconds, max_tokens}
    options = models.JSONField(default=dict, blank=True)
    # ``llm.keyring`` blob (versioned, with the master key's id); null: no key is sent.
    api_key_encrypted = models.TextField(null=True, blank=True)
    source = models.CharField(max_length=16, choices=RoleSource.choices)
    source_note = models.CharField(max_length=200, blank=True)
    version = models.PositiveIntegerField(default=1)

    class Meta:
        abstract = True


class ModelRole(ModelRoleFields):
    """The current settings of one role (one row per configured role)."""

    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "brain_modelrole"  # the table it had before it moved to llm
        constraints = [models.UniqueConstraint(fields=["role"], name="model_role_unique_role")]

    def __str__(self) -> str:
        return f"{self.role}: {self.provider} {self.model} (v{self.version})"


class ModelRoleRevision(ModelRoleFields):
    """Every version a role has had, kept so a run that started on one finishes on it
    (``llm.roles.for_run``). Written in the same transaction as the ``ModelRole`` change."""

    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "brain_modelrolerevision"  # the table it had before it moved to llm
        constraints = [models.UniqueConstraint(fields=["role", "version"], name="model_role_revision_unique")]

    def __str__(self) -> str:
        return f"{self.role} v{self.version}: {self.provider} {self.model}"


class ModelSettingsImport(models.Model):
    """The marker that the first-start import from the deployment environment happened
    (one row, ``id=1``); later starts see it and never read those variables again."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    imported_at = models.DateTimeField()
    roles = models.JSONField(default=list, help_text="the roles the environment configured")

    class Meta:
        db_table = "brain_modelsettingsimport"  # the table it had before it moved to llm

    def __str__(self) -> str:
        return f"imported from the environment at {self.imported_at:%Y-%m-%d %H:%M}"


# --- drafts of model role changes -----------------------------------------------------------
# Drafts of model-role changes, confirmed on one of the owner's devices.
#
# Written only by ``llm.role_drafts``. A draft's proposed settings never change after it
# is made (the device signs a digest of them); only its state, its probe result and its
# confirmation are written later. A new provider key is sealed at once (``llm.keyring``,
# bound to the draft's id) and never stored, shown or sent back in plaintext.

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


# --- model usage -----------------------------------------------------------------------------
# One row per model call: who asked (role, run, sub-agent task), which model, what the
# provider says it cost in tokens, and what that costs by the deployer's price table.
#
# Honesty is in the columns, not in the numbers: a count the provider did not report is
# NULL with ``tokens_source = unknown`` (never 0); a count made on this host is
# ``estimated``; a cost without a price for the provider and model is NULL with
# ``cost_source = unknown``. Written only by ``llm.usage``.

class ModelUsage(models.Model):
    class TokensSource(models.TextChoices):
        REPORTED = "reported"  # the provider's own ``usage`` object
        ESTIMATED = "estimated"  # counted on this host (llm.usage.estimate_tokens)
        UNKNOWN = "unknown"  # the provider said nothing and nothing was counted

    class CostSource(models.TextChoices):
        PRICED = "priced"  # reported tokens × a listed price
        ESTIMATED = "estimated"  # estimated tokens, or a price that had to stand in for a missing one
        UNKNOWN = "unknown"  # no price for this provider and model, or no token counts

    role = models.CharField(max_length=32, db_index=True)
    provider = models.CharField(max_length=128, blank=True)
    model = models.CharField(max_length=200, blank=True)
    run = models.ForeignKey("brain.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="model_calls")
    agent_task = models.ForeignKey(
        "brain.AgentTask", null=True, blank=True, on_delete=models.SET_NULL, related_name="model_calls"
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    input_tokens = models.PositiveIntegerField(null=True, blank=True, help_text="all input tokens, cached ones included")
    output_tokens = models.PositiveIntegerField(null=True, blank=True)
    cache_read_tokens = models.PositiveIntegerField(null=True, blank=True, help_text="part of the input read from the cache")
    cache_write_tokens = models.PositiveIntegerField(null=True, blank=True, help_text="part of the input written to the cache")
    tokens_source = models.CharField(max_length=16, choices=TokensSource.choices, default=TokensSource.UNKNOWN)
    cost = models.DecimalField(max_digits=16, decimal_places=8, null=True, blank=True)
    currency = models.CharField(max_length=8, blank=True)
    cost_source = models.CharField(max_length=16, choices=CostSource.choices, default=CostSource.UNKNOWN)
    duration_ms = models.PositiveIntegerField(default=0)
    outcome = models.CharField(max_length=32, default="ok", help_text="ok, or the BrainError code")

    class Meta:
        db_table = "brain_modelusage"  # the table it had before it moved to llm
        verbose_name = "model usage"
        verbose_name_plural = "model usage"
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return f"{self.role} {self.model} {self.created_at:%Y-%m-%d %H:%M} ({self.outcome})"
