from __future__ import annotations

from django.db import models

from accounts.models import Device


class Delivery(models.Model):
    """A device's ACK that a timeline entry reached its person: ``rendered`` (text) or
    ``played`` (speech). Facts count as told only when such an ACK covers them."""

    class Status(models.TextChoices):
        RENDERED = "rendered"
        PLAYED = "played"

    entry = models.ForeignKey("memory.TimelineEntry", on_delete=models.CASCADE, related_name="deliveries")
    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="deliveries")
    status = models.CharField(max_length=16, choices=Status.choices)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["entry", "device", "status"], name="one_delivery_ack_per_status")
        ]
        verbose_name_plural = "deliveries"


from devices.hud_models import DeviceState  # noqa: E402,F401  (registered with the devices app)
from devices.mac.models import MacKey, MacOperation, MacPause  # noqa: E402,F401  (registered with the devices app)
from devices.push_to_talk_models import PushToTalkHold  # noqa: E402,F401  (registered with the devices app)
