"""Where the owner is and the places they named (the ``location`` pack; docs/protocol.md,
"Location and health").

Written only by ``memory.location``. A ``LocationReport`` is one signed ``location.report``
frame from one of the owner's own phones (never a guest's), as the phone measured it; a
resend of the same frame id from the same device is the same row. A ``Place`` is a named
circle the owner keeps ("家", "公司"), one per name.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class LocationReport(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="location_reports")
    device = models.ForeignKey("devices.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    device_label = models.CharField(max_length=64, help_text="the device's name when it reported")
    client_id = models.CharField(max_length=64, help_text="the frame's id (a resend is the same report)")
    lat = models.FloatField(help_text="WGS 84 latitude, degrees (7 decimals)")
    lon = models.FloatField(help_text="WGS 84 longitude, degrees (7 decimals)")
    accuracy_m = models.FloatField(help_text="horizontal accuracy radius, metres")
    at = models.DateTimeField(help_text="when the phone measured it")
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["owner", "-at"], name="memory_location_owner_at")]
        constraints = [models.UniqueConstraint(fields=["device", "client_id"], name="memory_location_one_row_per_frame")]

    def __str__(self) -> str:
        return f"{self.lat:.5f}, {self.lon:.5f} ±{self.accuracy_m:.0f} m at {self.at:%Y-%m-%d %H:%M}"


class Place(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="places")
    name = models.CharField(max_length=64)
    lat = models.FloatField()
    lon = models.FloatField()
    radius_m = models.FloatField(help_text="the circle a geofence enters, metres")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="memory_place_name_unique_per_owner")]

    def __str__(self) -> str:
        return f"{self.name} ({self.lat:.5f}, {self.lon:.5f}, {self.radius_m:.0f} m)"
