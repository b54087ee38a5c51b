"""The voice app's one table: what each utterance of a voice socket became (docs/voice.md).

``VoiceUtterance`` was the devices app's until the voice app was split out; its table keeps
the name it was created with (``devices_voiceutterance``), so an installed instance keeps its
rows (voice/migrations/0001_initial.py).
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class VoiceUtterance(models.Model):
    """One utterance segmented from a voice socket: its source, who spoke (as voice identity
    decided), and what it became. Ambient speech is recorded here and nowhere else; it
    never becomes a timeline entry or a run. Written only by ``voice.services``."""

    class Disposition(models.TextChoices):
        AMBIENT = "ambient"  # no wake word or follow-up window: an observation only
        REQUEST = "request"  # inside a request window: becomes an entry and a run
        ECHO = "echo"  # during Yimi's own playback and not the owner barging in
        ENROLLMENT = "enrollment"  # collected for a voiceprint enrollment

    class TranscriptSource(models.TextChoices):
        NONE = ""
        SERVER = "server_asr"
        DEVICE = "device"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="voice_utterances")
    device = models.ForeignKey("accounts.Device", on_delete=models.CASCADE, related_name="voice_utterances")
    channel = models.CharField(max_length=32)
    call = models.ForeignKey("accounts.VoiceCall", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    mode = models.CharField(max_length=16, default="normal")
    started_at = models.DateTimeField(help_text="wall clock of the first voiced sample")
    stream_start_ms = models.PositiveBigIntegerField()
    stream_end_ms = models.PositiveBigIntegerField()
    voiced_ms = models.PositiveIntegerField()
    quality = models.FloatField()
    voiceprint_model = models.CharField(max_length=160, blank=True)
    band = models.CharField(max_length=16, blank=True, help_text="verified, uncertain, unmatched, or empty")
    score = models.FloatField(null=True, blank=True)
    scope = models.CharField(max_length=16)
    reason = models.CharField(max_length=64)
    disposition = models.CharField(max_length=16, choices=Disposition.choices)
    transcript = models.TextField(blank=True)
    transcript_source = models.CharField(max_length=16, choices=TranscriptSource.choices, blank=True, default="")
    admission = models.OneToOneField(
        "accounts.AdmissionRecord", null=True, blank=True, on_delete=models.SET_NULL, related_name="voice_utterance"
    )
    entry = models.OneToOneField(
        "memory.TimelineEntry", null=True, blank=True, on_delete=models.SET_NULL, related_name="voice_utterance"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "devices_voiceutterance"  # made by the devices app, where the model was first
        indexes = [models.Index(fields=["owner", "created_at"])]

    def __str__(self) -> str:
        return f"{self.disposition} {self.channel} {self.voiced_ms} ms ({self.scope})"
