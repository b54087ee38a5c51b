"""Model roles: which OpenAI-compatible endpoint and model each role of Yimi uses.

Written only by ``llm.roles`` (and ``llm.management.commands.model_settings``, which
calls it) and ``llm.role_backup`` (restoring a backup, rotating the master key). Provider keys are stored encrypted (``llm.keyring``); the plaintext never
reaches a row, a log line or the admin.
"""

from __future__ import annotations

from django.db import models

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
