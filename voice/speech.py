"""The speech-synthesis seam. Replies travel as text (``reply.chunk`` / ``reply.done``);
a device speaks them with its own voice or an outside TTS service and ACKs ``played``.
A server-side synthesizer, when one is added, implements ``SpeechSynthesizer`` and is
returned by ``synthesizer()``; none is configured today."""

from __future__ import annotations

from typing import Protocol


class SpeechSynthesizer(Protocol):
    def synthesize(self, text: str, *, voice: str | None = None) -> bytes:
        """16 kHz, 16-bit mono PCM for ``text``."""
        ...


def synthesizer() -> SpeechSynthesizer | None:
    return None
