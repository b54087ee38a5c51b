"""Load a model in a throw-away process before the server loads it.

sherpa-onnx aborts the process (``exit 255``, or a segfault) on some malformed models, and
Python cannot catch that. The catalog validates what it knows with the ``onnx`` package;
this probe is the second line: the server first builds the engine here, in a child
process, and only loads the model itself when the child exited cleanly.

Run as ``python -m devices.voice.probe '<json>'`` with ``{"kind", "files", "metadata"}``
(and ``engine`` for ASR: ``sherpa-onnx`` or ``faster-whisper``).
Prints one JSON line ``{"ok": true, "dim": ...}``; any crash shows up as the exit status.
Imports no Django, so it starts in about 0.1 s.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def build(kind: str, files: dict[str, str], metadata: dict[str, Any], engine: str = "") -> Any:
    """Construct the engine object for one catalog entry (shared with the server)."""
    if kind == "asr" and engine == "faster-whisper":
        return build_whisper(files, metadata)
    import sherpa_onnx

    if kind == "voiceprint":
        config = sherpa_onnx.SpeakerEmbeddingExtractorConfig(model=files["model"], num_threads=1, provider="cpu")
        if not config.validate():
            raise ValueError("speaker embedding config does not validate")
        return sherpa_onnx.SpeakerEmbeddingExtractor(config)
    if kind == "vad":
        config = sherpa_onnx.VadModelConfig()
        config.silero_vad.model = files["model"]
        config.silero_vad.window_size = 512
        config.silero_vad.threshold = float(metadata.get("threshold", 0.5))
        config.silero_vad.min_silence_duration = float(metadata.get("min_silence_duration", 0.5))
        config.silero_vad.min_speech_duration = float(metadata.get("min_speech_duration", 0.2))
        config.silero_vad.max_speech_duration = float(metadata.get("max_speech_duration", 20.0))
        config.sample_rate = 16000
        config.num_threads = 1
        return sherpa_onnx.VoiceActivityDetector(config, buffer_size_in_seconds=30)
    if kind == "asr":
        asr_type = metadata["type"]
        common = {"num_threads": int(metadata.get("num_threads", 1)), "provider": "cpu"}
        if asr_type == "transducer":
            return sherpa_onnx.OfflineRecognizer.from_transducer(
                encoder=files["encoder"], decoder=files["decoder"], joiner=files["joiner"], tokens=files["tokens"],
                modeling_unit=str(metadata.get("modeling_unit", "cjkchar")), **common,
            )
        if asr_type == "paraformer":
            return sherpa_onnx.OfflineRecognizer.from_paraformer(paraformer=files["model"], tokens=files["tokens"], **common)
        if asr_type == "whisper":
            return sherpa_onnx.OfflineRecognizer.from_whisper(
                encoder=files["encoder"], decoder=files["decoder"], tokens=files["tokens"],
                language=str(metadata.get("language", "")), **common,
            )
        if asr_type == "sense_voice":
            return sherpa_onnx.OfflineRecognizer.from_sense_voice(
                model=files["model"], tokens=files["tokens"], language=str(metadata.get("language", "")),
                use_itn=bool(metadata.get("use_itn", True)), **common,
            )
        raise ValueError(f"unknown asr type {asr_type!r}")
    if kind == "wake_word":
        return sherpa_onnx.KeywordSpotter(
            tokens=files["tokens"], encoder=files["encoder"], decoder=files["decoder"], joiner=files["joiner"],
            keywords_file=files["keywords"], num_threads=1,
            keywords_score=float(metadata.get("keywords_score", 1.0)),
            keywords_threshold=float(metadata.get("keywords_threshold", 0.25)),
        )
    raise ValueError(f"kind {kind!r} is not loaded by sherpa-onnx")


def build_whisper(files: dict[str, str], metadata: dict[str, Any]) -> Any:
    """A faster-whisper (CTranslate2) model from its directory, never from the hub."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from faster_whisper import WhisperModel

    return WhisperModel(
        os.path.dirname(files["model"]), device="cpu", compute_type=str(metadata.get("compute_type", "int8")),
        cpu_threads=int(metadata.get("num_threads", 1)), num_workers=1, local_files_only=True,
    )


def whisper_transcribe(model: Any, samples: Any, metadata: dict[str, Any]) -> str:
    """One utterance (float32 16 kHz samples) through faster-whisper: greedy by default, no
    VAD of its own (the session's VAD already cut the utterance), no carried-over context."""
    segments, _info = model.transcribe(
        samples, language=metadata.get("language") or None, beam_size=int(metadata.get("beam_size", 1)),
        vad_filter=False, condition_on_previous_text=False, without_timestamps=True,
    )
    return "".join(segment.text for segment in segments).strip()


def exercise(kind: str, engine: Any, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one second of silence through the engine: loading alone does not touch every path."""
    silence = [0.0] * 16000
    if kind == "asr" and not hasattr(engine, "create_stream"):  # faster-whisper
        import numpy as np

        whisper_transcribe(engine, np.zeros(16000, dtype=np.float32), metadata or {})
        return {}
    if kind == "voiceprint":
        stream = engine.create_stream()
        stream.accept_waveform(sample_rate=16000, waveform=silence)
        stream.input_finished()
        embedding = engine.compute(stream)
        if len(embedding) != engine.dim:
            raise ValueError(f"the model returned {len(embedding)} values, its metadata says {engine.dim}")
        return {"dim": engine.dim}
    if kind == "vad":
        for i in range(0, 16000, 512):
            engine.accept_waveform(silence[i : i + 512])
        engine.flush()
        return {}
    if kind == "asr":
        stream = engine.create_stream()
        stream.accept_waveform(16000, silence)
        engine.decode_stream(stream)
        return {}
    if kind == "wake_word":
        stream = engine.create_stream()
        stream.accept_waveform(16000, silence)
        while engine.is_ready(stream):
            engine.decode_stream(stream)
        return {}
    return {}


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    metadata = spec.get("metadata", {})
    engine = build(spec["kind"], spec["files"], metadata, spec.get("engine", ""))
    print(json.dumps({"ok": True, **exercise(spec["kind"], engine, metadata)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
