"""The devices app's own tables: delivery ACKs, the state a device reports, push-to-talk
holds (the Mac relay's are ``devices.mac.models``)."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from accounts.models import Device
from devices.mac.models import MacKey, MacOperation, MacPause  # noqa: F401  (registered with the devices app)


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


# --- what a device last reported about itself ----------------------------------------------
# What a device last reported about itself (``device.state`` frames; devices/hud.py).

class DeviceState(models.Model):
    """The device's own report: ``riding`` (on a bike or scooter) turns off head gestures
    until the device reports otherwise. Written only by ``devices.hud.report_state``."""

    device = models.OneToOneField("accounts.Device", on_delete=models.CASCADE, primary_key=True, related_name="state")
    riding = models.BooleanField(default=False)
    reported_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.device_id}: {'riding' if self.riding else 'not riding'}"


# --- push-to-talk holds ---------------------------------------------------------------------
# The push-to-talk holds every process sees (``devices.push_to_talk``).

class PushToTalkHold(models.Model):
    """A push-to-talk key held on one voice session, where every process sees it: the
    Celery worker's cold-pack round starts no pack while one holds (``devices.push_to_talk``).
    The release deletes the row; a release that never came ends at ``expires_at``
    (``PTT_HOLD_SECONDS`` after the press). Written only by ``devices.push_to_talk``."""

    session = models.CharField(max_length=64, primary_key=True, help_text="the voice session's id")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="+")
    started_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["owner", "expires_at"], name="ptt_hold_owner_expiry")]
