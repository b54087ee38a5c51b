"""L5 raw originals: the hot store's index (flow F7 of docs/architecture.md).

Written only by ``memory.raw_store``. One row per original as it arrived from a device: an
archive batch of audio (500 ms, 20 frames or 64 KiB, whichever came first), one image, one
sensor event. The bytes live in one file under the hot root (``DATA_DIR/raw/``), at
``hot_path`` relative to it; the row is written only after the file and its directory were
fsynced, so a row always points at a durable file until ``hot_deleted_at`` is set.

``device_id`` is the device's primary key (a UUID) without a foreign key: memory sits below devices
in the layers, and an original outlives the device that captured it. Cold copies (packs on
WebDAV) are indexed by the cold-pack models that refer to these rows; this row never says
where a cold copy is.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class RawObject(models.Model):
    """One original. Life: stored (hot file present) → hot copy deleted (``hot_deleted_at``:
    retention or emergency reclaim, only once a verified cold copy exists) → erased
    (``erased_at``: the owner erased it; hot file gone, cold copy rewritten or tombstoned)."""

    class Kind(models.TextChoices):
        AUDIO = "audio"
        IMAGE = "image"
        SENSOR = "sensor"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="raw_objects")
    device_id = models.UUIDField(null=True, blank=True, help_text="the capturing device's id (no FK: memory sits below devices)")
    channel = models.CharField(max_length=32, help_text="capture channel (phone_app, glasses, mac, ...)")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    codec = models.CharField(max_length=64, help_text='e.g. "pcm_s16le_16k_mono", "image/jpeg", "application/json"')
    # Audio: the capture stream (one voice socket's stream) and this batch's first sample in it,
    # so consecutive batches join into one segment; "" / 0 for images and sensor events.
    stream = models.CharField(max_length=64, blank=True)
    stream_offset = models.BigIntegerField(default=0, help_text="first sample (audio) of this object in its stream")
    meta = models.JSONField(default=dict, blank=True, help_text="small facts about the original (image size, sensor name)")
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField()
    size = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    hot_path = models.CharField(max_length=300, help_text="relative to the hot root")
    stored_at = models.DateTimeField(auto_now_add=True)
    hot_deleted_at = models.DateTimeField(null=True, blank=True)
    erased_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["owner", "started_at"], name="raw_owner_started"),
            models.Index(fields=["hot_deleted_at", "stored_at"], name="raw_hot_stored"),
        ]

    def __str__(self) -> str:
        return f"raw {self.pk} {self.kind} {self.codec} {self.size} B"
