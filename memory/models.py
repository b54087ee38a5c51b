from __future__ import annotations

from django.conf import settings
from django.db import models


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
