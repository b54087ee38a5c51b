from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone


class TimelineCounter(models.Model):
    """The last sequence number handed out for one owner (L4). Locked per append."""

    owner = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True)
    last_seq = models.BigIntegerField(default=0)


class TimelineEntry(models.Model):
    """One line of the owner's timeline: what was said, by which device, in which scope."""

    class Kind(models.TextChoices):
        UTTERANCE = "utterance"  # inbound text or speech from a device
        REPLY = "reply"  # Yimi's answer
        NOTICE = "notice"  # a system notice (a failure told honestly, an expiry, ...)
        IMAGE = "image"  # an image a device sent (memory.images; the ImageRecord refers back to it)

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="timeline")
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=16, choices=Kind.choices)
    text = models.TextField()
    device = models.ForeignKey(
        "devices.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="timeline_entries"
    )
    # The device's own id for an inbound frame; a resend with the same id is the same entry.
    client_id = models.CharField(max_length=64, null=True, blank=True)
    scope = models.CharField(max_length=16, blank=True)
    reply_to = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replies")
    notice_code = models.CharField(max_length=32, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Set when the owner erased the entry (``memory.erasure``): its text is empty from then on.
    erased_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["owner", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "seq"], name="timeline_seq_unique_per_owner"),
            models.UniqueConstraint(
                fields=["device", "client_id"],
                condition=models.Q(client_id__isnull=False),
                name="timeline_client_id_unique_per_device",
            ),
        ]
        verbose_name_plural = "timeline entries"

    def __str__(self) -> str:
        return f"#{self.seq} {self.kind}"


# --- L3: assertions ------------------------------------------------------------------------------
# Written only by ``memory.assertions`` (commit, forget, re-evaluation marks) and
# ``memory.injection`` (sessions). See docs/memory.md.


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


class TimelineEmbedding(models.Model):
    """The vector of one timeline entry under one embedding model (recall's vector list)."""

    entry = models.ForeignKey(TimelineEntry, on_delete=models.CASCADE, related_name="+")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    model = models.CharField(max_length=64)
    dim = models.PositiveSmallIntegerField()
    vector = models.BinaryField()  # float32, little-endian, L2-normalized

    class Meta:
        indexes = [models.Index(fields=["owner", "model", "entry"], name="timeline_embedding_owner")]
        constraints = [models.UniqueConstraint(fields=["entry", "model"], name="timeline_embedding_unique")]


class HistoryLookup(models.Model):
    """One history search a run made (``memory.history_search``): at most
    ``HISTORY_LOOKUPS_PER_RUN`` per run, counted here where the lookup is served. The run
    and the call come from the gateway's signed per-call capability; a call retried with
    the same call id is the same lookup."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    run_key = models.CharField(max_length=80)
    call_key = models.CharField(max_length=80)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run_key", "call_key"], name="history_lookup_once_per_call")]


from memory.ambient_models import AmbientRecord  # noqa: E402,F401  (registered with the memory app)
from memory.cold_models import ColdAlert, ColdPack, ObjectLocation  # noqa: E402,F401  (registered with the memory app)
from memory.health_models import HealthRecord  # noqa: E402,F401  (registered with the memory app)
from memory.image_models import ImageRecord  # noqa: E402,F401  (registered with the memory app)
from memory.location_models import LocationReport, Place  # noqa: E402,F401  (registered with the memory app)
from memory.raw_models import RawObject  # noqa: E402,F401  (registered with the memory app)
