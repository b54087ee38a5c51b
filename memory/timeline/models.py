"""The timeline (L4): the owner's entries in order, numbered per owner by ``TimelineCounter``
(written only by ``memory.timeline.entries``; erased only by ``memory.timeline.erasure``),
the entries' vectors for recall's vector list (``memory.timeline.embeddings``) and the
history searches each run made (``memory.timeline.history_search``)."""

from __future__ import annotations

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
        IMAGE = "image"  # an image a device sent (memory.personal.images; the ImageRecord refers back to it)

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="timeline")
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=16, choices=Kind.choices)
    text = models.TextField()
    device = models.ForeignKey(
        "accounts.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="timeline_entries"
    )
    # The device's own id for an inbound frame; a resend with the same id is the same entry.
    client_id = models.CharField(max_length=64, null=True, blank=True)
    scope = models.CharField(max_length=16, blank=True)
    reply_to = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replies")
    notice_code = models.CharField(max_length=32, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Set when the owner erased the entry (``memory.timeline.erasure``): its text is empty from then on.
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
    """One history search a run made (``memory.timeline.history_search``): at most
    ``HISTORY_LOOKUPS_PER_RUN`` per run, counted here where the lookup is served. The run
    and the call come from the gateway's signed per-call capability; a call retried with
    the same call id is the same lookup."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    run_key = models.CharField(max_length=80)
    call_key = models.CharField(max_length=80)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run_key", "call_key"], name="history_lookup_once_per_call")]
