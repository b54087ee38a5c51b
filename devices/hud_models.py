"""What a device last reported about itself (``device.state`` frames; devices/hud.py)."""

from __future__ import annotations

from django.db import models


class DeviceState(models.Model):
    """The device's own report: ``riding`` (on a bike or scooter) turns off head gestures
    until the device reports otherwise. Written only by ``devices.hud.report_state``."""

    device = models.OneToOneField("accounts.Device", on_delete=models.CASCADE, primary_key=True, related_name="state")
    riding = models.BooleanField(default=False)
    reported_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.device_id}: {'riding' if self.riding else 'not riding'}"
