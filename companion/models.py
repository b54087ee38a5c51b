"""The voice companion (issue 21, part one): persona versions, content cards, the frozen
snapshot of each call, the owner's privacy epoch and the continuity switch.

Written only by ``brain.persona`` (persona versions), ``brain.call_snapshot`` (snapshots)
and ``brain.privacy_epoch`` (epoch and settings); the admin calls those services.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class PersonaVersion(models.Model):
    """One published version of the companion's persona for one owner.

    Never edited after it is published: a change (a new name included) is a new version.
    Exactly one version per owner is ``effective`` (a partial unique index); a call keeps
    the version its snapshot froze, so publishing never changes a call in progress.
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="persona_versions")
    version = models.PositiveIntegerField()
    name = models.CharField(max_length=32, help_text="what she is called; the owner may rename her")
    identity = models.TextField(max_length=1200, help_text="who she is and how she treats the owner")
    rhythm = models.TextField(max_length=1200, help_text="reply rhythm: short sentences, few easy questions")
    fact_boundaries = models.TextField(max_length=1200, help_text="what she never invents")
    # [{"owner": "...", "reply": "..."}]: a few short example exchanges
    examples = models.JSONField(default=list, blank=True)
    note = models.CharField(max_length=200, blank=True, help_text="why this version was published")
    effective = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "version"], name="persona_version_unique"),
            models.UniqueConstraint(fields=["owner"], condition=Q(effective=True), name="persona_one_effective_per_owner"),
        ]
        ordering = ["owner_id", "-version"]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}{' (effective)' if self.effective else ''}"


class ContentCard(models.Model):
    """A small, reviewable piece of content a call may offer (at most one per call).

    ``version`` moves on every change made through the admin; a snapshot copies the card
    as it was. A story with a blank ``source`` is told as a story, never as news.
    """

    class Mode(models.TextChoices):
        CHAT = "chat"
        REMINISCENCE = "reminiscence"
        STORY = "story"
        GUESS = "guess"

    id = models.SlugField(primary_key=True, max_length=64)
    version = models.PositiveIntegerField(default=1)
    mode = models.CharField(max_length=16, choices=Mode.choices)
    title = models.CharField(max_length=80)
    opening = models.CharField(max_length=200, help_text="the first line, said as it is")
    # ["...", ...]: the next small steps, one at a time, only if the owner wants more
    followups = models.JSONField(default=list, blank=True)
    source = models.CharField(max_length=200, blank=True, help_text="blank: told as a story, never as news")
    # interests this card suits (matched against the owner's authorized interests); empty: any owner
    tags = models.JSONField(default=list, blank=True)
    estimated_duration = models.PositiveIntegerField(help_text="seconds")
    active = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.id} v{self.version} ({self.mode})"


class CallSnapshot(models.Model):
    """What one call was started with, frozen at ``call.start``: the persona version, the
    opening line, the background and at most one content card.

    One row per call (``call`` is unique). A retried start of the same call reuses it,
    unless the owner's privacy epoch moved since (``epoch`` older) or it is a fallback
    (``fallback``: it could not be built; ``error`` says why), which are built again.
    """

    call = models.OneToOneField("accounts.VoiceCall", on_delete=models.CASCADE, related_name="snapshot")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="call_snapshots")
    persona_version = models.ForeignKey(PersonaVersion, on_delete=models.PROTECT, related_name="snapshots")
    opening = models.CharField(max_length=200)
    opening_key = models.CharField(max_length=48, blank=True, help_text="which candidate made the opening")
    # {"address", "interests": [...], "latest_summary", "resume_thread", "avoid_topics": [...],
    #  "sources": [...]}: the data sections of this call's prompt (brain.call_snapshot)
    background = models.JSONField(default=dict, blank=True)
    card = models.ForeignKey(ContentCard, null=True, blank=True, on_delete=models.SET_NULL, related_name="snapshots")
    card_version = models.PositiveIntegerField(null=True, blank=True)
    card_content = models.JSONField(null=True, blank=True, help_text="the card as it was when the call started")
    continuity = models.BooleanField(default=True, help_text="continuity was on when the snapshot was built")
    epoch = models.BigIntegerField(help_text="the owner's privacy epoch the background was read under")
    built_at = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=1)
    fallback = models.BooleanField(default=False)
    error = models.TextField(blank=True)

    class Meta:
        indexes = [models.Index(fields=["owner", "-built_at"], name="call_snapshot_owner_built")]

    def __str__(self) -> str:
        return f"snapshot of call {self.call_id}{' (fallback)' if self.fallback else ''}"


class PrivacyEpoch(models.Model):
    """The owner's privacy epoch: moves (never back) when a memory source is forgotten,
    edited or withdrawn and when continuity is turned off. Anything derived under an
    older value (a snapshot, a summary, a topic row, an asynchronous job's result) is
    invalid at once."""

    owner = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="privacy_epoch")
    value = models.BigIntegerField(default=0)
    changed_at = models.DateTimeField(null=True, blank=True)
    reason = models.CharField(max_length=64, blank=True)

    def __str__(self) -> str:
        return f"epoch {self.value} ({self.reason or '-'})"


class CompanionSettings(models.Model):
    """Per-owner switches of the companion. Without continuity a call gets the persona and
    an opening, but no summary, thread to resume or interests from memory."""

    owner = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="companion_settings")
    continuity_enabled = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "companion settings"

    def __str__(self) -> str:
        return f"continuity {'on' if self.continuity_enabled else 'off'}"
