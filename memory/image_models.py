"""Images from devices (a first-person photo from the glasses, a picture from the phone).

Written only by ``memory.images``. The bytes live under ``DATA_DIR/images/<owner>/``
(``path``, relative to the data directory) next to a JSON file with their source; this row
is the index: who sent it, when it was captured, which timeline entry refers to it, which
utterance it is about, and how long it is kept.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


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
    device = models.ForeignKey("devices.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="images")
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
    # People the image analyzers recognized (``memory.images.register_image_analyzer``), as
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
