"""The owner's health records (the ``health`` pack; docs/protocol.md, "Location and health").

Written only by ``memory.health``. One ``health.record`` frame from one of the owner's own
watches or phones: a ride or another sport session from the watch, a daily summary from
the phone. ``metrics`` is a small bounded dict of numbers (at most 32 keys, 4 KiB). A
resend of the same frame id from the same device is the same row.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class HealthRecord(models.Model):
    class Kind(models.TextChoices):
        DAILY_SUMMARY = "daily_summary"  # the phone's summary of one day
        CYCLING = "cycling"
        RUNNING = "running"
        WALKING = "walking"
        HIKING = "hiking"
        SWIMMING = "swimming"
        WORKOUT = "workout"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="health_records")
    device = models.ForeignKey("devices.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    device_label = models.CharField(max_length=64)
    device_kind = models.CharField(max_length=16)
    client_id = models.CharField(max_length=64)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    start = models.DateTimeField()
    end = models.DateTimeField()
    metrics = models.JSONField(default=dict, help_text="name -> number (at most 32, 4 KiB)")
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["owner", "-start"], name="memory_health_owner_start")]
        constraints = [models.UniqueConstraint(fields=["device", "client_id"], name="memory_health_one_row_per_frame")]

    def __str__(self) -> str:
        return f"{self.kind} {self.start:%Y-%m-%d %H:%M}"
