"""One voice socket's audio stream: voice activity detection, segmentation into
utterances, speaker embeddings, wake words, and the request/playback windows.

No database here: ``VoiceSession`` turns PCM into ``Utterance`` objects; what they
become is decided by ``voice.services``. Positions are in samples of this
stream (16 kHz), so windows are exact whatever the network does; wall-clock times
(for trust windows) are the moments the frames holding the speech arrived.
"""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
from django.utils import timezone

from voice.asr import Recognizer
from voice.audio import SAMPLE_RATE, estimate_quality
from voice.engines import SpeakerEmbedder, WakeWordStream
from yimi_project.errors import YimiError

VAD_WINDOW = 512  # samples per Silero window at 16 kHz
REQUEST_PREROLL_SECONDS = 2.0  # the wake word is said just before the device reports it
MIN_EMBEDDING_SAMPLES = 1600  # 100 ms: below that an embedding says nothing


def ms(samples: int) -> int:
    return samples * 1000 // SAMPLE_RATE


@dataclass
class Utterance:
    id: str
    start_sample: int
    end_sample: int
    samples: np.ndarray = field(repr=False)
    quality: float
    started_at: datetime
    embedding: np.ndarray | None = field(default=None, repr=False)
    model_key: str = ""

    @property
    def voiced_ms(self) -> int:
        return ms(self.samples.size)

    @property
    def start_ms(self) -> int:
        return ms(self.start_sample)

    @property
    def end_ms(self) -> int:
        return ms(self.end_sample)


@dataclass
class StreamOutput:
    utterances: list[Utterance] = field(default_factory=list)
    wake_words: list[tuple[int, str]] = field(default_factory=list)  # (sample position, keyword)


class VoiceSession:
    """Segment one capture channel's stream into utterances.

    ``embedder`` computes identity embeddings (the effective voiceprint model);
    ``enroll_embedder`` is used instead while enrolling (the selected model).
    """

    def __init__(
        self,
        *,
        channel: str,
        vad: Any,
        embedder: SpeakerEmbedder | None,
        enroll_embedder: SpeakerEmbedder | None = None,
        transcriber: Recognizer | None = None,
        wake_stream: WakeWordStream | None = None,
        mode: str = "normal",
        clock: Callable[[], datetime] = timezone.now,
    ) -> None:
        self.id = uuid.uuid4().hex
        self.channel, self.mode = channel, mode
        self.vad, self.embedder, self.enroll_embedder = vad, embedder, enroll_embedder or embedder
        self.transcriber, self.wake_stream, self.clock = transcriber, wake_stream, clock
        self.position = 0  # samples received
        self.enrolling = False
        self._pending = np.zeros(0, dtype=np.float32)
        self._arrivals: list[tuple[int, datetime]] = []  # (stream position after a frame, when it arrived)
        self._request_windows: list[tuple[int, int]] = []
        self._playback: list[tuple[int, int | None]] = []

    # --- audio -----------------------------------------------------------------------------

    def feed(self, samples: np.ndarray) -> StreamOutput:
        """Accept float32 samples; returns the utterances that ended and wake words heard."""
        out = StreamOutput()
        if self.wake_stream is not None:
            out.wake_words.extend((self.position + samples.size, kw) for kw in self.wake_stream.accept(samples))
        self.position += samples.size
        self._arrivals.append((self.position, self.clock()))
        if len(self._arrivals) > 2048:
            del self._arrivals[:1024]
        buffered = np.concatenate([self._pending, samples]) if self._pending.size else samples
        usable = buffered.size // VAD_WINDOW * VAD_WINDOW
        for i in range(0, usable, VAD_WINDOW):
            self.vad.accept_waveform(buffered[i : i + VAD_WINDOW])
            self._drain(out)
        self._pending = buffered[usable:].copy()
        return out

    def finish(self) -> StreamOutput:
        """End of stream: flush the detector and return the last utterance, if any."""
        out = StreamOutput()
        if self._pending.size:
            self.vad.accept_waveform(np.pad(self._pending, (0, VAD_WINDOW - self._pending.size)))
            self._pending = np.zeros(0, dtype=np.float32)
        self.vad.flush()
        self._drain(out)
        return out

    def _drain(self, out: StreamOutput) -> None:
        while not self.vad.empty():
            segment = self.vad.front
            start, samples = int(segment.start), np.asarray(segment.samples, dtype=np.float32)
            self.vad.pop()
            out.utterances.append(self._utterance(start, samples))

    def _utterance(self, start: int, samples: np.ndarray) -> Utterance:
        end = start + samples.size
        utt = Utterance(uuid.uuid4().hex, start, end, samples, estimate_quality(samples), self.arrived_at(start))
        embedder = self.enroll_embedder if self.enrolling else self.embedder
        if embedder is not None and samples.size >= MIN_EMBEDDING_SAMPLES:
            try:
                utt.embedding, utt.model_key = embedder.embed(samples), embedder.model_key
            except YimiError:
                utt.embedding = None  # too short or unusable: identity will say "not known"
        return utt

    def arrived_at(self, position: int) -> datetime:
        """When the frame holding this sample arrived: the wall-clock time of speech as the
        server observed it (trust windows are judged on it)."""
        index = bisect.bisect_right(self._arrivals, position, key=lambda a: a[0])
        if index < len(self._arrivals):
            return self._arrivals[index][1]
        return self._arrivals[-1][1] if self._arrivals else self.clock()

    def transcribe(self, utt: Utterance) -> str | None:
        """The utterance's text from the server's ASR engine, or None without one (blocking:
        the socket uses ``voice.asr.hear``, which runs it off the event loop)."""
        if self.transcriber is None:
            return None
        return self.transcriber.transcribe(utt.samples)

    # --- windows -----------------------------------------------------------------------------

    def open_request_window(self, at_sample: int, seconds: float, preroll: float = REQUEST_PREROLL_SECONDS) -> tuple[int, int]:
        """A wake word (the device's or ours) or a played reply opens a request window:
        speech overlapping [at − preroll, at + seconds] is a request. The 2 s pre-roll
        covers the wake word itself, said just before the device reported it."""
        window = (max(0, at_sample - int(preroll * SAMPLE_RATE)), at_sample + int(seconds * SAMPLE_RATE))
        self._request_windows = [w for w in self._request_windows if w[1] > self.position - 60 * SAMPLE_RATE]
        self._request_windows.append(window)
        return window

    def end_request_window(self, at_sample: int) -> tuple[int, int] | None:
        """Push-to-talk released: the window it opened (the latest one) ends at ``at_sample``."""
        if not self._request_windows:
            return None
        start, end = self._request_windows[-1]
        self._request_windows[-1] = (start, max(start, min(end, at_sample)))
        return self._request_windows[-1]

    def in_request_window(self, utt: Utterance) -> bool:
        return any(start < utt.end_sample and utt.start_sample < end for start, end in self._request_windows)

    def playback(self, state: str, at_sample: int) -> None:
        """Yimi's own speech is playing on the device (``start``) or stopped (``end``)."""
        if state == "start":
            if not self._playback or self._playback[-1][1] is not None:
                self._playback.append((at_sample, None))
        elif self._playback and self._playback[-1][1] is None:
            self._playback[-1] = (self._playback[-1][0], at_sample)
        self._playback = [p for p in self._playback if p[1] is None or p[1] > self.position - 60 * SAMPLE_RATE]

    def during_playback(self, utt: Utterance) -> bool:
        return any(start < utt.end_sample and (end is None or utt.start_sample < end) for start, end in self._playback)
