"""The push-to-talk holds every process sees (``devices.push_to_talk``)."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from accounts.models import Device


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
