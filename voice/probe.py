"""Load a model in a throw-away process before the server loads it.

sherpa-onnx aborts the process (``exit 255``, or a segfault) on some malformed models, and
Python cannot catch that. The catalog validates what it knows with the ``onnx`` package;
this probe is the second line: the server first builds the engine here, in a child
process, and only loads the model itself when the child exited cleanly.

Run as ``python -m voice.probe '<json>'`` with ``{"kind", "files", "metadata"}``
(and ``engine`` for ASR: ``sherpa-onnx`` or ``faster-whisper``).
Prints one JSON line ``{"ok": true, "dim": ...}``; any crash shows up as the exit status.
Imports no Django, so it starts in about 0.1 s.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

# Silence that ends an utterance. 0.35 s: with Silero's 32-ms windows and its probability
# trailing the last voiced sample, the measured wait after end of speech is 0.41-0.49 s
# (0.5 s gave 0.57-0.65 s); a pause longer than this inside a sentence splits it.
MIN_SILENCE_SECONDS = 0.35


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
        config.silero_vad.min_silence_duration = float(metadata.get("min_silence_duration", MIN_SILENCE_SECONDS))
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


# Whisper pads every input to a 30-s window; for a short utterance most of the encoder's
# (and the cross-attention's) work is on that padding. ``whisper_transcribe`` encodes a
# window of max(``min_window_seconds``, length + 3 s) instead (CTranslate2 takes any even
# number of mel frames up to 3,000). Measured on tiny.en with espeak-ng speech (2-18 s,
# 2 voices): about 3x faster and no fewer words right than the 30-s window; below about
# 8 s of window, or with less than ~3 s of padding after the speech, it starts repeating
# itself or dropping words, hence the floor and the margin.
MIN_WINDOW_SECONDS = 10.0
WINDOW_MARGIN_SECONDS = 3.0
# faster-whisper's own defaults for its temperature fallback and no-speech skip
COMPRESSION_RATIO_LIMIT = 2.4
LOG_PROB_LIMIT = -1.0
NO_SPEECH_LIMIT = 0.6


def whisper_transcribe(model: Any, samples: Any, metadata: dict[str, Any]) -> str:
    """One utterance (float32 16 kHz samples) through faster-whisper: greedy by default, no
    VAD of its own (the session's VAD already cut the utterance), no carried-over context.

    With the language known (``metadata.language``, or an English-only model), a short
    window first (see ``MIN_WINDOW_SECONDS``; ``min_window_seconds: 30`` in the catalog
    metadata turns it off). Its answer is kept unless it looks wrong the way faster-whisper
    itself checks a decode: repetitive (gzip compression ratio > 2.4), unsure (average log
    probability < -1) or cut at the token cap (8 tokens per second of audio + 16); then the
    utterance is transcribed again the standard way (30-s window, temperature fallback).
    Silence is "" as faster-whisper's no-speech rule (no-speech probability > 0.6 and
    average log probability < -1) would make it."""
    import numpy as np

    language = metadata.get("language") or None
    window = float(metadata.get("min_window_seconds", MIN_WINDOW_SECONDS))
    seconds = len(samples) / 16000
    if window < 30 and seconds + WINDOW_MARGIN_SECONDS < 30 and (language or not model.model.is_multilingual):
        text = _short_window(model, np.asarray(samples, dtype=np.float32), language or "en", max(window, seconds + WINDOW_MARGIN_SECONDS))
        if text is not None:
            return text
    segments, _info = model.transcribe(
        samples, language=language, beam_size=int(metadata.get("beam_size", 1)),
        vad_filter=False, condition_on_previous_text=False, without_timestamps=True,
    )
    return "".join(segment.text for segment in segments).strip()


def _short_window(model: Any, samples: Any, language: str, window_seconds: float) -> str | None:
    """Greedy decode of ``samples`` encoded in a ``window_seconds`` window; None when the
    result fails faster-whisper's checks (the caller then uses the 30-s window)."""
    import zlib

    import ctranslate2
    import numpy as np
    from faster_whisper.tokenizer import Tokenizer
    from faster_whisper.transcribe import get_suppressed_tokens

    extractor = model.feature_extractor
    features = extractor(samples)[:, :-1]  # as faster-whisper: the last frame is the padding's
    frames = int(round(window_seconds / extractor.time_per_frame))
    frames += frames % 2  # the encoder's stride-2 convolution
    if features.shape[-1] > frames or frames > extractor.nb_max_frames:
        return None
    features = np.pad(features, ((0, 0), (0, frames - features.shape[-1])))  # zeros, as faster-whisper pads
    encoded = model.model.encode(ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None], dtype=np.float32)))
    tokenizer = Tokenizer(model.hf_tokenizer, model.model.is_multilingual, task="transcribe", language=language)
    prompt = [*tokenizer.sot_sequence, tokenizer.no_timestamps]
    cap = min(len(prompt) + 16 + int(8 * samples.size / 16000), model.max_length)
    result = model.model.generate(
        encoded, [prompt], beam_size=1, max_length=cap, return_scores=True, return_no_speech_prob=True,
        suppress_blank=True, suppress_tokens=list(get_suppressed_tokens(tokenizer, (-1,)) or ()),
    )[0]
    tokens = result.sequences_ids[0]
    avg_logprob = result.scores[0] * len(tokens) / (len(tokens) + 1)
    if result.no_speech_prob > NO_SPEECH_LIMIT and avg_logprob < LOG_PROB_LIMIT:
        return ""
    text = str(tokenizer.decode(tokens)).strip()
    if len(prompt) + len(tokens) >= cap or avg_logprob < LOG_PROB_LIMIT:
        return None
    if text and len(text.encode()) / len(zlib.compress(text.encode())) > COMPRESSION_RATIO_LIMIT:
        return None
    return text


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
