"""L5: the hot store's originals and their cold copies.

L5 raw originals: the hot store's index (flow F7 of docs/architecture.md).

Written only by ``memory.archive.raw_store``. One row per original as it arrived from a device: an
archive batch of audio (500 ms, 20 frames or 64 KiB, whichever came first), one image, one
sensor event. The bytes live in one file under the hot root (``DATA_DIR/raw/``), at
``hot_path`` relative to it; the row is written only after the file and its directory were
fsynced, so a row always points at a durable file until ``hot_deleted_at`` is set.

``device_id`` is the device's primary key (a UUID) without a foreign key: memory sits below devices
in the layers, and an original outlives the device that captured it. Cold copies (packs on
WebDAV) are indexed by the cold-pack models that refer to these rows; this row never says
where a cold copy is.

L5 cold copies: packs on WebDAV and where each original is in them (flow F7 of
docs/architecture.md). Written only by ``memory.archive.cold_store``.

A ``ColdPack`` is one ``L5P1`` file on the cold storage. Life: ``sealed`` (made and being
uploaded; nothing relies on it yet) → ``verified`` (read back whole, its SHA-256 and every
chunk checked; only now are its ``ObjectLocation`` rows written) → hot copies released
(``released_at``: downloaded and verified a second time after the retention, then the hot
copies deleted). ``failed``: an upload or a verification failed; its objects keep their hot
copies (and go into a later pack when no verified copy exists). ``retired``: replaced by a
rewrite after an erasure (``replaced_by``) or emptied by it; its file is deleted."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone


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


class ColdPack(models.Model):
    class State(models.TextChoices):
        SEALED = "sealed"
        VERIFIED = "verified"
        FAILED = "failed"
        RETIRED = "retired"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="cold_packs")
    path = models.CharField(max_length=200, help_text="relative to the cold storage's base URL")
    state = models.CharField(max_length=16, choices=State.choices, default=State.SEALED, db_index=True)
    size = models.BigIntegerField(help_text="bytes on the wire")
    decoded_size = models.BigIntegerField()
    object_count = models.PositiveIntegerField()
    sha256 = models.CharField(max_length=64, help_text="of the whole pack file")
    started_at = models.DateTimeField(default=timezone.now, help_text="upload start (spaces the next pack's start)")
    verified_at = models.DateTimeField(null=True, blank=True)
    reverified_at = models.DateTimeField(null=True, blank=True, help_text="the second verification, before hot copies go")
    released_at = models.DateTimeField(null=True, blank=True, help_text="its hot copies were deleted")
    failure = models.CharField(max_length=40, blank=True)
    failure_detail = models.TextField(blank=True)
    replaced_by = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # The raw object ids in the file, whatever its state: an erasure finds every file that
    # still holds an original, a failed upload's leftover included.
    members = models.JSONField(default=list)
    file_deleted_at = models.DateTimeField(null=True, blank=True, help_text="its file was deleted from the cold storage")

    class Meta:
        indexes = [models.Index(fields=["state", "started_at"], name="coldpack_state_started")]

    def __str__(self) -> str:
        return f"pack {self.path} ({self.state})"


class ObjectLocation(models.Model):
    """Where an original's verified cold copy is: its chunk's byte range in the pack file
    (absolute, for one range read) and the chunk's codec and decoded size."""

    object = models.OneToOneField("memory.RawObject", on_delete=models.CASCADE, related_name="cold_location")
    pack = models.ForeignKey(ColdPack, on_delete=models.PROTECT, related_name="locations")
    offset = models.BigIntegerField()
    size = models.BigIntegerField()
    codec = models.CharField(max_length=8)
    decoded_size = models.BigIntegerField()


class ColdAlert(models.Model):
    """Something the owner and operator must see about cold copies: a verification that
    failed (that pack's hot copies are all kept), hot copies deleted early by emergency
    reclaim. Also logged."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="cold_alerts")
    pack = models.ForeignKey(ColdPack, null=True, blank=True, on_delete=models.SET_NULL, related_name="alerts")
    code = models.CharField(max_length=40)
    message = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.code}: {self.message[:60]}"
