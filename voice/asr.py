"""Server speech recognition for the voice socket (docs/voice.md, "Server transcription").

Which engine a session uses, running it off the event loop, and what happens when it fails:

- **remote**: the model role ``asr_remote`` (``llm.roles``: an OpenAI-compatible base URL,
  a model name and a sealed key). Each utterance is ``POST {base_url}/audio/transcriptions``,
  multipart with ``file`` (a 16 kHz mono 16-bit WAV), ``model`` and ``response_format=json``;
  the answer is ``{"text": ...}``. A configured role wins over the local catalog: a deployer
  who set a provider prefers it. It is resolved per session, so a change applies to the
  next ``voice.start``.
- **local**: the catalog's ``asr`` model (``voice.engines.Transcriber``: sherpa-onnx
  or faster-whisper), checked (digests, child-process probe) and loaded once per process.

Bounds: local transcriptions run on **one worker thread per process** (one at a time: the
model is shared and a second concurrent decode would only halve the speed of both); remote
calls on up to ``REMOTE_WORKERS`` threads. At most ``MAX_PENDING`` utterances wait or run per
process; beyond that an utterance is not transcribed (``transcription_busy``) and goes the
way of a failed one: it is recorded, the device's own transcript is accepted for it, and
the device gets a ``voice.notice`` it can speak when it has none.
"""

from __future__ import annotations

import asyncio
import io
import re
import threading
import unicodedata
import wave
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any, Protocol

import httpx
import numpy as np

from llm import roles
from voice.audio import SAMPLE_RATE
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

MAX_PENDING = 8
REMOTE_WORKERS = 4
MAX_RESPONSE_BYTES = 1 << 20
NOTICE_TEXT = "Sorry, I could not make out that request: speech recognition is not working right now. Please say it again, or type it."

_local_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="yimi-asr")
_remote_pool = ThreadPoolExecutor(max_workers=REMOTE_WORKERS, thread_name_prefix="yimi-asr-remote")
_pending = 0
_pending_lock = threading.Lock()


class Recognizer(Protocol):
    """What a session transcribes with: a local ``engines.Transcriber`` or ``RemoteTranscriber``."""

    @property
    def local(self) -> bool: ...

    @property
    def engine(self) -> str: ...

    @property
    def model_key(self) -> str: ...

    def transcribe(self, samples: np.ndarray) -> str: ...


# --- the remote engine (OpenAI-compatible /audio/transcriptions) ------------------------------------


def wav_bytes(samples: np.ndarray) -> bytes:
    """Float samples in [-1, 1] as a 16 kHz mono 16-bit WAV file."""
    pcm = (np.clip(samples, -1.0, 32767 / 32768) * 32768.0).astype("<i2").tobytes()
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm)
    return out.getvalue()


@dataclass(frozen=True)
class RemoteTranscriber:
    base_url: str
    model: str
    api_key: str | None
    timeout_seconds: float
    connect_timeout_seconds: float

    local = False
    engine = "remote"

    @property
    def model_key(self) -> str:
        return self.model

    def transcribe(self, samples: np.ndarray) -> str:
        """One utterance; ``transcription_timeout`` or ``transcription_failed`` (HTTP error,
        unreachable, or an answer without a ``text`` string) when the provider fails."""
        url = self.base_url.rstrip("/") + "/audio/transcriptions"
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            response = httpx.post(
                url,
                files={"file": ("utterance.wav", wav_bytes(samples), "audio/wav")},
                data={"model": self.model, "response_format": "json"},
                headers=headers,
                timeout=httpx.Timeout(self.timeout_seconds, connect=self.connect_timeout_seconds),
            )
        except httpx.TimeoutException:
            raise YimiError("transcription_timeout", f"the transcription service did not answer within {self.timeout_seconds:g} s") from None
        except httpx.HTTPError:
            raise YimiError("transcription_failed", "the transcription service could not be reached") from None
        if response.status_code != 200:
            raise YimiError("transcription_failed", f"the transcription service answered HTTP {response.status_code}", status=response.status_code)
        if len(response.content) > MAX_RESPONSE_BYTES:
            raise YimiError("transcription_failed", "the transcription service's answer is too large")
        try:
            body = response.json()
        except ValueError:
            body = None
        text = body.get("text") if isinstance(body, dict) else None
        if not isinstance(text, str):
            raise YimiError("transcription_failed", "the transcription service's answer has no text")
        return text.strip()


def remote_transcriber(problems: dict[str, str]) -> RemoteTranscriber | None:
    """The ``asr_remote`` role as an engine; None when it is not configured. A configured
    role that cannot be used (its key does not decrypt, ...) is reported in ``problems``
    and the session falls back to the catalog."""
    try:
        role = roles.resolve("asr_remote")
    except YimiError as exc:
        if exc.code != "role_not_configured":
            problems["asr"] = exc.code
            log_event("voice_model_unavailable", kind="asr_remote", error_code=exc.code)
        return None
    return RemoteTranscriber(role.base_url, role.model, role.api_key, role.timeout_seconds, role.connect_timeout_seconds)


# --- running it --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Heard:
    """What the server made of one utterance: ``text`` (None when it did not transcribe it)
    or the ``error`` that stopped it."""

    text: str | None = None
    error: YimiError | None = None


async def transcribe(recognizer: Recognizer, samples: np.ndarray) -> str:
    """Transcribe off the event loop, within the process's bounds (module docstring)."""
    global _pending
    with _pending_lock:
        if _pending >= MAX_PENDING:
            raise YimiError("transcription_busy", f"{MAX_PENDING} utterances are already being transcribed in this process")
        _pending += 1
    try:
        pool = _local_pool if recognizer.local else _remote_pool
        return await asyncio.get_running_loop().run_in_executor(pool, recognizer.transcribe, samples)
    except YimiError:
        raise
    except Exception as exc:  # noqa: BLE001 - a native engine's failure is this utterance's, not the socket's
        log_event("voice_transcription_crashed", engine=recognizer.engine, exc_type=type(exc).__name__)
        raise YimiError("transcription_failed", f"the {recognizer.engine} engine failed on this utterance") from None
    finally:
        with _pending_lock:
            _pending -= 1


async def hear(recognizer: Recognizer | None, samples: np.ndarray) -> Heard:
    """The utterance's server transcript, or why there is none. Never raises."""
    if recognizer is None:
        return Heard()
    try:
        return Heard(text=await transcribe(recognizer, samples))
    except YimiError as exc:
        log_event("voice_transcription_failed", engine=recognizer.engine, error_code=exc.code)
        return Heard(error=exc)


# --- a device transcript next to the server's ----------------------------------------------------------


def _normalized(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    text = "".join(" " if unicodedata.category(c)[0] in "PS" else c for c in text)
    return re.sub(r"\s+", " ", text).strip()


def compare_transcripts(server: str, device: str) -> dict[str, Any]:
    """How far a device's transcript is from the server's, without either's words: their
    lengths and a similarity (``difflib`` ratio of the case-folded text without
    punctuation, 1.0 = the same words)."""
    a, b = _normalized(server), _normalized(device)
    return {
        "server_chars": len(server),
        "device_chars": len(device),
        "similarity": round(SequenceMatcher(None, a, b, autojunk=False).ratio(), 3),
        "same_words": a == b,
    }
