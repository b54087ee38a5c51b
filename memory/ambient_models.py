"""The ambient log: what was overheard, with its source (docs/voice.md, "Ambient log").

Written only by ``memory.ambient``. One row per analysed chunk of ambient speech (speech
that reached no request window): the words the server's speech recognition heard, where
they came from (device, capture channel, the chunk's exact sample offsets in that
socket's stream), when they were said, and who said them if the voiceprint could tell.
An observation, never a request: nothing here becomes a timeline entry or a run.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class AmbientRecord(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ambient_records")
    device = models.ForeignKey("devices.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
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
