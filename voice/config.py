"""Voice settings, read from Django settings with the defaults documented in docs/voice.md
(settings.py may set any of them; see the lines proposed there)."""

from __future__ import annotations

from django.conf import settings

from voice.audio import BYTES_PER_SECOND


def request_window_seconds() -> float:
    """How long a wake word keeps the request window open."""
    return float(getattr(settings, "VOICE_REQUEST_WINDOW_SECONDS", 8.0))


def followup_window_seconds() -> float:
    """How long a played reply keeps a follow-up window open."""
    return float(getattr(settings, "VOICE_FOLLOWUP_WINDOW_SECONDS", 8.0))


def max_audio_frame_bytes() -> int:
    """Largest binary frame: one second of audio by default."""
    return int(getattr(settings, "VOICE_MAX_AUDIO_FRAME_BYTES", BYTES_PER_SECOND))


def transcript_wait_seconds() -> float:
    """How long a request without server ASR waits for the device's transcript."""
    return float(getattr(settings, "VOICE_TRANSCRIPT_WAIT_SECONDS", 60.0))
