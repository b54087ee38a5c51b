"""The on-server audio models, built from catalog entries through sherpa-onnx (and
faster-whisper for Whisper ASR models in CTranslate2 format).

Before a model is loaded into this process: 1. its files are checked against their
trusted digests and its metadata is validated with ``onnx`` (``catalog.check_entry``);
2. it is built and run once in a child process (``probe``), so a model that would abort
a native library kills only that child. Loaded engines are cached per catalog key and
digest; the speaker-embedding extractor is shared by every session (one lock), while
each session gets its own voice activity detector (it is stateful).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings

from llm.catalog import CatalogEntry, check_entry, verify_files
from voice.audio import SAMPLE_RATE
from voice.probe import build, whisper_transcribe
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

PROBE_TIMEOUT_SECONDS = 120.0

_lock = threading.Lock()
_probed: set[tuple[str, str, str]] = set()
_engines: dict[tuple[str, str, str], Any] = {}


def _ident(entry: CatalogEntry) -> tuple[str, str, str]:
    return (entry.kind, entry.key, entry.digest_summary)


def probe(entry: CatalogEntry) -> dict[str, Any]:
    """Build and exercise the model in a child process; raises ``model_load_failed`` if the
    child failed or died. Callers check digests and metadata first."""
    spec = {"kind": entry.kind, "files": {f.role: f.path for f in entry.files}, "metadata": entry.metadata, "engine": entry.engine}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "voice.probe", json.dumps(spec)],
            cwd=str(Path(settings.BASE_DIR)),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise YimiError("model_load_failed", f"{entry.kind} {entry.key}: a trial load did not finish in time") from None
    if done.returncode != 0:
        log_event("model_probe_failed", kind=entry.kind, model=entry.key, exit_status=done.returncode)
        raise YimiError(
            "model_load_failed",
            f"{entry.kind} {entry.key}: the model failed a trial load in a separate process (exit status {done.returncode})",
            exit_status=done.returncode,
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def prepare(entry: CatalogEntry) -> None:
    """Digests, metadata and (once per process and digest) the trial load."""
    check_entry(entry)
    ident = _ident(entry)
    with _lock:
        if ident in _probed:
            return
    probe(entry)
    with _lock:
        _probed.add(ident)


def _cached(entry: CatalogEntry, make: Any) -> Any:
    ident = _ident(entry)
    with _lock:
        engine = _engines.get(ident)
    if engine is not None:
        verify_files(entry)  # cheap unless a file changed on disk
        return engine
    prepare(entry)
    engine = make()
    with _lock:
        return _engines.setdefault(ident, engine)


def forget_engines() -> None:
    """Drop every loaded engine (what a new process starts with)."""
    with _lock:
        _engines.clear()
        _probed.clear()


# --- speaker embeddings ---------------------------------------------------------------------


@dataclass
class SpeakerEmbedder:
    entry: CatalogEntry
    extractor: Any
    lock: threading.Lock

    @property
    def model_key(self) -> str:
        return self.entry.key

    @property
    def dim(self) -> int:
        return int(self.extractor.dim)

    def embed(self, samples: np.ndarray) -> np.ndarray:
        """The unit-length embedding of one utterance (float32 samples in [-1, 1])."""
        with self.lock:
            stream = self.extractor.create_stream()
            stream.accept_waveform(sample_rate=SAMPLE_RATE, waveform=samples)
            stream.input_finished()
            if not self.extractor.is_ready(stream):
                raise YimiError("audio_too_short", "the utterance is too short for a speaker embedding")
            vector = np.asarray(self.extractor.compute(stream), dtype=np.float64)
        if vector.size != self.dim or not np.all(np.isfinite(vector)):
            raise YimiError("model_output_invalid", f"voiceprint {self.model_key} returned an unusable embedding")
        norm = float(np.linalg.norm(vector))
        if norm == 0.0:
            raise YimiError("model_output_invalid", f"voiceprint {self.model_key} returned a zero embedding")
        return vector / norm


def speaker_embedder(entry: CatalogEntry) -> SpeakerEmbedder:
    if entry.kind != "voiceprint":
        raise YimiError("unknown_model", f"{entry.key} is not a voiceprint model")
    return _cached(entry, lambda: SpeakerEmbedder(entry, build("voiceprint", _files(entry), entry.metadata), threading.Lock()))


# --- voice activity detection -----------------------------------------------------------------


def voice_activity_detector(entry: CatalogEntry) -> Any:
    """A new Silero detector for one session (the trial load happens once per process)."""
    if entry.kind != "vad":
        raise YimiError("unknown_model", f"{entry.key} is not a vad model")
    prepare(entry)
    return build("vad", _files(entry), entry.metadata)


# --- transcription and wake words ---------------------------------------------------------------


@dataclass
class Transcriber:
    """A local ASR model, loaded once per process and shared by every session (one lock:
    one transcription at a time per model; ``voice.asr`` runs it off the event
    loop on its own worker thread). ``engine`` says which runtime: sherpa-onnx or
    faster-whisper (CTranslate2)."""

    entry: CatalogEntry
    recognizer: Any
    lock: threading.Lock

    local = True

    @property
    def engine(self) -> str:
        return self.entry.engine or "sherpa-onnx"

    @property
    def model_key(self) -> str:
        return self.entry.key

    def transcribe(self, samples: np.ndarray) -> str:
        with self.lock:
            if self.engine == "faster-whisper":
                return whisper_transcribe(self.recognizer, samples, self.entry.metadata)
            stream = self.recognizer.create_stream()
            stream.accept_waveform(SAMPLE_RATE, samples)
            self.recognizer.decode_stream(stream)
            return str(stream.result.text).strip()


def transcriber(entry: CatalogEntry) -> Transcriber:
    if entry.kind != "asr":
        raise YimiError("unknown_model", f"{entry.key} is not an asr model")
    return _cached(entry, lambda: Transcriber(entry, build("asr", _files(entry), entry.metadata, entry.engine), threading.Lock()))


class WakeWordStream:
    """One session's keyword-spotter stream; the spotter itself is shared."""

    def __init__(self, spotter: Any, lock: threading.Lock) -> None:
        self.spotter, self.lock = spotter, lock
        self.stream = spotter.create_stream()

    def accept(self, samples: np.ndarray) -> list[str]:
        """Feed samples; returns the keywords detected in them."""
        found: list[str] = []
        with self.lock:
            self.stream.accept_waveform(SAMPLE_RATE, samples)
            while self.spotter.is_ready(self.stream):
                self.spotter.decode_stream(self.stream)
                keyword = self.spotter.get_result(self.stream)
                if keyword:
                    found.append(str(keyword))
                    self.spotter.reset_stream(self.stream)
        return found


@dataclass
class WakeWordSpotter:
    entry: CatalogEntry
    spotter: Any
    lock: threading.Lock

    def new_stream(self) -> WakeWordStream:
        return WakeWordStream(self.spotter, self.lock)


def wake_word_spotter(entry: CatalogEntry) -> WakeWordSpotter:
    if entry.kind != "wake_word":
        raise YimiError("unknown_model", f"{entry.key} is not a wake_word model")
    return _cached(entry, lambda: WakeWordSpotter(entry, build("wake_word", _files(entry), entry.metadata), threading.Lock()))


def _files(entry: CatalogEntry) -> dict[str, str]:
    return {f.role: f.path for f in entry.files}
