"""The owner's personal records: health, location and named places, images, the ambient log.

The owner's health records (the ``health`` pack; docs/protocol.md, "Location and health").

Written only by ``memory.personal.health``. One ``health.record`` frame from one of the owner's own
watches or phones: a ride or another sport session from the watch, a daily summary from
the phone. ``metrics`` is a small bounded dict of numbers (at most 32 keys, 4 KiB). A
resend of the same frame id from the same device is the same row.

Where the owner is and the places they named (the ``location`` pack; docs/protocol.md,
"Location and health").

Written only by ``memory.personal.location``. A ``LocationReport`` is one signed ``location.report``
frame from one of the owner's own phones (never a guest's), as the phone measured it; a
resend of the same frame id from the same device is the same row. A ``Place`` is a named
circle the owner keeps ("家", "公司"), one per name.

Images from devices (a first-person photo from the glasses, a picture from the phone).

Written only by ``memory.personal.images`` (and purged with the entries they belong to by
``memory.timeline.erasure``). The bytes live under ``DATA_DIR/images/<owner>/``
(``path``, relative to the data directory) next to a JSON file with their source; this row
is the index: who sent it, when it was captured, which timeline entry refers to it, which
utterance it is about, and how long it is kept.

The ambient log: what was overheard, with its source (docs/voice.md, "Ambient log").

Written only by ``memory.personal.ambient``. One row per analysed chunk of ambient speech (speech
that reached no request window): the words the server's speech recognition heard, where
they came from (device, capture channel, the chunk's exact sample offsets in that
socket's stream), when they were said, and who said them if the voiceprint could tell.
An observation, never a request: nothing here becomes a timeline entry or a run."""

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
    device = models.ForeignKey("accounts.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
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


class LocationReport(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="location_reports")
    device = models.ForeignKey("accounts.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
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


class ImageRecord(models.Model):
    """One image: ``uploaded`` (bytes stored, not yet announced by an ``image`` frame) →
    ``attached`` (a timeline entry of kind ``image`` refers to it) → ``purged`` (the bytes
    are deleted; the row stays, without people, as a tombstone)."""

    class State(models.TextChoices):
        UPLOADED = "uploaded"
        ATTACHED = "attached"
        PURGED = "purged"

    class Retention(models.TextChoices):
        KEEP = "keep"  # an owner's image: kept like the rest of the owner's memory
        REQUEST = "request"  # a guest's image: deleted once the request it served ended

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="images")
    device = models.ForeignKey("accounts.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="images")
    scope = models.CharField(max_length=16)  # the sending device's scope: owner or guest
    state = models.CharField(max_length=16, choices=State.choices, default=State.UPLOADED, db_index=True)
    retention = models.CharField(max_length=16, choices=Retention.choices)
    content_type = models.CharField(max_length=32)  # image/jpeg or image/png
    width = models.PositiveIntegerField()
    height = models.PositiveIntegerField()
    size_bytes = models.PositiveIntegerField()
    sha256 = models.CharField(max_length=64)
    path = models.CharField(max_length=300, blank=True)  # relative to DATA_DIR; "" once purged
    uploaded_at = models.DateTimeField()
    # Set by the ``image`` frame that announces it.
    client_id = models.CharField(max_length=64, null=True, blank=True)  # the frame's id (idempotent)
    captured_at = models.DateTimeField(null=True, blank=True)
    attached_at = models.DateTimeField(null=True, blank=True)
    entry = models.OneToOneField(
        "memory.TimelineEntry", null=True, blank=True, on_delete=models.SET_NULL, related_name="image"
    )
    about_client_id = models.CharField(max_length=64, blank=True)  # the utterance (text/voice id) it is about
    # People the image analyzers recognized (``memory.personal.images.register_image_analyzer``), as
    # [{"name": ..., ...}]: facts for the vision request. Never a guess about an unknown face.
    people = models.JSONField(default=list, blank=True)
    analyzed_at = models.DateTimeField(null=True, blank=True)
    used_by_run = models.UUIDField(null=True, blank=True)  # the last run that sent it to the vision role
    purged_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["device", "state", "attached_at"], name="image_device_recent")]
        constraints = [
            models.UniqueConstraint(
                fields=["device", "client_id"], condition=models.Q(client_id__isnull=False), name="image_client_id_unique_per_device"
            )
        ]

    def __str__(self) -> str:
        return f"image {str(self.id)[:8]} {self.width}×{self.height} ({self.state})"


class AmbientRecord(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ambient_records")
    device = models.ForeignKey("accounts.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    device_label = models.CharField(max_length=64, help_text="the device's name when it was heard")
    channel = models.CharField(max_length=32, help_text="capture channel (phone_app, glasses, mac, ...)")
    utterance_id = models.UUIDField(help_text="the VoiceUtterance this chunk was cut from")
    stream_start_sample = models.PositiveBigIntegerField(help_text="first sample of the chunk in its socket's stream (16 kHz)")
    stream_end_sample = models.PositiveBigIntegerField(help_text="one past the chunk's last sample")
    heard_at = models.DateTimeField(help_text="wall clock of the chunk's first sample")
    speaker_scope = models.CharField(max_length=16, help_text="owner, owner_uncertain or guest, as voice identity decided")
    speaker_reason = models.CharField(max_length=32, blank=True)
    text = models.TextField()
    engine = models.CharField(max_length=32, blank=True, help_text="faster-whisper, sherpa-onnx or remote")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["owner", "heard_at"], name="memory_ambient_owner_heard")]
        constraints = [
            models.UniqueConstraint(fields=["utterance_id", "stream_start_sample"], name="memory_ambient_one_row_per_chunk"),
        ]
