"""PCM frames and a plain signal-quality measure.

The wire format is fixed (docs/voice.md): 16 kHz, 16-bit little-endian, mono PCM, 32,000
bytes per second. A device declares it in ``voice.start``; anything else is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from yimi_project.errors import YimiError

SAMPLE_RATE = 16000
SAMPLE_WIDTH = 2
CHANNELS = 1
ENCODING = "pcm_s16le"
BYTES_PER_SECOND = SAMPLE_RATE * SAMPLE_WIDTH * CHANNELS  # 32,000
WIRE_FORMAT = {"encoding": ENCODING, "sample_rate": SAMPLE_RATE, "channels": CHANNELS}


def check_format(declared: Any) -> None:
    """``voice.start`` may omit ``format``; if present it must be exactly the wire format."""
    if declared is None:
        return
    if not isinstance(declared, dict):
        raise YimiError("unsupported_audio_format", "format must be an object")
    expected = dict(WIRE_FORMAT)
    for key, value in declared.items():
        if key not in expected or declared[key] != expected[key] or isinstance(value, bool):
            raise YimiError(
                "unsupported_audio_format",
                "audio must be 16 kHz, 16-bit little-endian, mono PCM: "
                '{"encoding": "pcm_s16le", "sample_rate": 16000, "channels": 1}',
            )


def pcm_to_float(frame: bytes, *, max_bytes: int) -> np.ndarray:
    """Check one binary frame and convert it to float32 samples in [-1, 1]."""
    if not frame:
        raise YimiError("empty_audio_frame", "an audio frame carries at least one sample")
    if len(frame) > max_bytes:
        raise YimiError("audio_frame_too_large", f"audio frames are limited to {max_bytes} bytes")
    if len(frame) % SAMPLE_WIDTH:
        raise YimiError("invalid_sample_format", "16-bit samples: a frame has an even number of bytes")
    return np.frombuffer(frame, dtype="<i2").astype(np.float32) / 32768.0


def float_to_pcm(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1.0, 32767 / 32768) * 32768.0).astype("<i2").tobytes()


def estimate_quality(samples: np.ndarray) -> float:
    """A quality in [0, 1] for one utterance, from its own signal only.

    ``quality = snr_factor × clip_factor``: the signal-to-noise ratio is estimated as the
    ratio of the loudest 20-ms frames (90th percentile RMS) to the quietest (10th
    percentile, the pauses between words), mapped linearly from 5 dB (0) to 25 dB (1);
    every 1 % of clipped samples costs the whole clip factor. A simple measurement, not a
    trained quality model: it tells a clean close-talk recording from a noisy or
    overdriven one, which is all the learning rule (quality ≥ 0.5) needs.
    """
    if samples.size < 320:
        return 0.0
    frames = samples[: samples.size // 320 * 320].reshape(-1, 320)
    rms = np.sqrt(np.mean(frames.astype(np.float64) ** 2, axis=1))
    loud, quiet = float(np.percentile(rms, 90)), float(np.percentile(rms, 10))
    if loud <= 1e-5:
        return 0.0
    snr_db = 20.0 * np.log10(loud / max(quiet, 1e-5))
    snr_factor = min(1.0, max(0.0, (snr_db - 5.0) / 20.0))
    clipped = float(np.mean(np.abs(samples) >= 0.999))
    clip_factor = max(0.0, 1.0 - clipped * 100.0)
    return round(snr_factor * clip_factor, 3)
