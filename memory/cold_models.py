"""L5 cold copies: packs on WebDAV and where each original is in them (flow F7 of
docs/architecture.md). Written only by ``memory.archive``.

A ``ColdPack`` is one ``L5P1`` file on the cold storage. Life: ``sealed`` (made and being
uploaded; nothing relies on it yet) → ``verified`` (read back whole, its SHA-256 and every
chunk checked; only now are its ``ObjectLocation`` rows written) → hot copies released
(``released_at``: downloaded and verified a second time after the retention, then the hot
copies deleted). ``failed``: an upload or a verification failed; its objects keep their hot
copies (and go into a later pack when no verified copy exists). ``retired``: replaced by a
rewrite after an erasure (``replaced_by``) or emptied by it; its file is deleted.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone


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
