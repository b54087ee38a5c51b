"""L3 assertions (docs/memory.md): written only by ``memory.assertions.store`` (commit,
forget, re-evaluation marks; a forget also resets the sessions told a forgotten fact) and
``memory.assertions.injection`` (sessions); a timeline erasure's receipt is
``memory.timeline.erasure``'s."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone


class Assertion(models.Model):
    """One L3 assertion: what Yimi currently believes about one thing, and since when.

    ``current_version`` moves only by compare-and-set under the owner's memory lock. A
    forgotten assertion is a tombstone: its id, predicate and version numbers stay, every
    version's payload is gone, and no commit to it is accepted again.
    """

    class State(models.TextChoices):
        ACTIVE = "active"
        FORGOTTEN = "forgotten"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="assertions")
    predicate = models.CharField(max_length=64, db_index=True)
    current_version = models.PositiveIntegerField(default=0)
    state = models.CharField(max_length=16, choices=State.choices, default=State.ACTIVE, db_index=True)
    # The current payload as one line of text, for lists and search; erased when forgotten.
    summary = models.CharField(max_length=500, blank=True)
    # Set when something upstream changed; never negates the conclusion, a new version clears it.
    needs_reevaluation = models.BooleanField(default=False, db_index=True)
    reevaluation_reason = models.CharField(max_length=300, blank=True)
    marked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(default=timezone.now)
    forgotten_at = models.DateTimeField(null=True, blank=True)
    forgotten_by = models.CharField(max_length=64, blank=True)  # the forget request id

    class Meta:
        indexes = [models.Index(fields=["owner", "state", "predicate"], name="assertion_owner_state_pred")]
        constraints = [
            models.UniqueConstraint(
                fields=["owner"],
                condition=models.Q(predicate="speaking.preferences", state="active"),
                name="one_active_speaking_preferences_per_owner",
            )
        ]

    def __str__(self) -> str:
        return f"{self.predicate} v{self.current_version} ({str(self.id)[:8]})"


class AssertionVersion(models.Model):
    """One committed version. ``payload`` and ``evidence`` are erased (None / []) when the
    assertion is forgotten; the row stays as part of the tombstone."""

    assertion = models.ForeignKey(Assertion, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    payload = models.JSONField(null=True, blank=True)
    # Timeline (L4) sequence numbers of the entries this version was read from.
    evidence = models.JSONField(default=list, blank=True)
    erased = models.BooleanField(default=False)
    actor = models.CharField(max_length=16)  # owner | agent | operator | import
    request_id = models.CharField(max_length=64)
    committed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["assertion", "version"]
        constraints = [models.UniqueConstraint(fields=["assertion", "version"], name="assertion_version_unique")]

    def __str__(self) -> str:
        return f"v{self.version} of {self.assertion_id}"


class AssertionDependency(models.Model):
    """``downstream`` at ``downstream_version`` was concluded from ``upstream`` at
    ``upstream_version``. Kept for every version, so forgetting can follow history."""

    downstream = models.ForeignKey(Assertion, on_delete=models.CASCADE, related_name="depends_on")
    downstream_version = models.PositiveIntegerField()
    upstream = models.ForeignKey(Assertion, on_delete=models.CASCADE, related_name="dependents")
    upstream_version = models.PositiveIntegerField()

    class Meta:
        indexes = [
            models.Index(fields=["upstream"], name="assertion_dep_upstream"),
            models.Index(fields=["downstream", "downstream_version"], name="assertion_dep_downstream"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["downstream", "downstream_version", "upstream"], name="assertion_dep_unique"
            )
        ]


class MemoryReceipt(models.Model):
    """The stored result of a memory write, keyed by the writer's request id: a retried
    request returns it instead of writing again."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    request_id = models.CharField(max_length=64)
    kind = models.CharField(max_length=16)  # commit | forget
    fingerprint = models.CharField(max_length=64)
    result = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "request_id"], name="memory_receipt_unique")]


class MemorySession(models.Model):
    """What one brain session has been told from memory (incremental injection).

    ``baseline`` maps assertion id → the version token the session knows; ``blocks`` are
    the memory messages already sent, each anchored at the timeline seq of the turn that
    carried it. Both advance only after a run's prompt was accepted (compare-and-set on
    ``revision``); an edit, a deletion or a scope change starts a new ``generation``.
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=64)
    scope = models.CharField(max_length=16, blank=True)
    baseline = models.JSONField(default=dict, blank=True)
    blocks = models.JSONField(default=list, blank=True)
    revision = models.PositiveIntegerField(default=0)
    generation = models.PositiveIntegerField(default=0)
    reset_reason = models.CharField(max_length=32, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "key"], name="memory_session_unique")]
