"""Speech synthesis: replies to voice requests are spoken by the server (docs/voice.md,
"Spoken replies").

Two synthesizers, chosen per voice session by ``synthesizer()``:

- ``SpeechEndpoint``: an OpenAI-compatible speech endpoint, ``POST {base_url}/audio/speech``
  with ``model``, ``input``, ``voice`` and ``response_format: "pcm"`` (raw 16-bit mono PCM,
  24 kHz unless ``VOICE_TTS_ENDPOINT_SAMPLE_RATE`` says otherwise), used when the ``tts``
  model role is configured (``llm.roles``; the production choice is Qwen TTS);
- ``Espeak``: Debian's espeak-ng in a child process (``espeak-ng --stdout``, the text on
  stdin), the embedded default.

Both return 16 kHz 16-bit mono PCM, the voice socket's own format (resampled here). Both
run off the event loop (a child process, an async HTTP request) and stop at once when
cancelled: the child is killed, the request dropped. ``ReplySpeaker`` (one per voice
socket) speaks the replies of the runs that socket started, sentence by sentence as the
checked reply streams in, and stops on barge-in.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import shutil
import struct
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import numpy as np
from django.conf import settings

from capabilities.truth.claims import split_sentences
from llm import roles
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

SAMPLE_RATE = 16000
FRAME_BYTES = 32000  # one tts.audio frame carries at most 1 s of 16 kHz PCM16
MAX_SENTENCE_CHARS = 400  # a longer sentence is spoken in pieces of at most this many characters
MAX_ENDPOINT_BYTES = 16 * 1024 * 1024  # a speech endpoint's answer is refused beyond this
CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_ENDS = tuple("。！？!?；;.…\n")
_CLOSERS = "”’\"'）)」』】 \t"


def tts_concurrency() -> int:
    """How many sentences this process synthesizes at once (all sockets together)."""
    return int(getattr(settings, "VOICE_TTS_CONCURRENCY", 2))


def tts_timeout_seconds() -> float:
    """The longest one sentence's synthesis may take before it fails (``tts_failed``)."""
    return float(getattr(settings, "VOICE_TTS_TIMEOUT_SECONDS", 20.0))


# --- PCM helpers -----------------------------------------------------------------------------------


class Resampler:
    """Linear-interpolation resampling of a PCM16 stream from ``source`` Hz to ``target`` Hz,
    fed in pieces: the last input sample and the fractional position carry over, so pieces
    join without a seam."""

    def __init__(self, source: int, target: int) -> None:
        if source <= 0 or target <= 0:
            raise ValueError("sample rates must be positive")
        self.step = source / target
        self.pos = 0.0
        self.carry = np.zeros(0, dtype=np.float64)

    def feed(self, pcm: bytes) -> bytes:
        if len(pcm) % 2:
            pcm = pcm[:-1]
        x = np.concatenate([self.carry, np.frombuffer(pcm, dtype="<i2").astype(np.float64)])
        if len(x) < 2:
            self.carry = x
            return b""
        if self.step == 1.0:
            self.carry = np.zeros(0, dtype=np.float64)
            return x.astype("<i2").tobytes()
        t = np.arange(self.pos, len(x) - 1, self.step)
        y = np.interp(t, np.arange(len(x)), x)
        self.pos = (t[-1] + self.step) - (len(x) - 1) if len(t) else self.pos - (len(x) - 1)
        self.carry = x[-1:]
        return np.clip(np.rint(y), -32768, 32767).astype("<i2").tobytes()


def resample(pcm: bytes, source: int, target: int = SAMPLE_RATE) -> bytes:
    return pcm if source == target else Resampler(source, target).feed(pcm)


def wav_to_pcm(data: bytes) -> tuple[bytes, int]:
    """PCM16 mono samples and their rate from a RIFF/WAVE file, also one written to a pipe
    (espeak-ng --stdout writes placeholder sizes: the data runs to the end)."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise YimiError("tts_failed", "the synthesizer did not return a WAV file")
    pos, rate, channels, bits = 12, 0, 0, 0
    while pos + 8 <= len(data):
        kind, size = data[pos : pos + 4], struct.unpack("<I", data[pos + 4 : pos + 8])[0]
        body = pos + 8
        if kind == b"fmt ":
            _, channels, rate, _, _, bits = struct.unpack("<HHIIHH", data[body : body + 16])
        elif kind == b"data":
            if channels != 1 or bits != 16 or not rate:
                raise YimiError("tts_failed", "the synthesizer's WAV is not 16-bit mono PCM")
            return data[body : min(len(data), body + size)], rate
        pos = body + size + (size & 1)
    raise YimiError("tts_failed", "the synthesizer's WAV has no audio")


# --- synthesizers ----------------------------------------------------------------------------------


class Synthesizer(Protocol):
    name: str

    async def synthesize(self, text: str) -> bytes:
        """16 kHz, 16-bit mono PCM for ``text``; ``YimiError("tts_failed")`` if it cannot."""
        ...


class Espeak:
    """espeak-ng in a child process: Mandarin (``cmn``) for text with CJK characters,
    otherwise ``en-us``. The text goes on stdin (never into argv)."""

    name = "espeak-ng"

    def __init__(self, binary: str = "espeak-ng", *, speed: int = 170) -> None:
        self.binary, self.speed = binary, speed

    async def synthesize(self, text: str) -> bytes:
        voice = "cmn" if CJK.search(text) else "en-us"
        proc = await asyncio.create_subprocess_exec(
            self.binary, "--stdout", "-v", voice, "-s", str(self.speed),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(text.encode("utf-8")), tts_timeout_seconds())
        except BaseException:  # cancelled (barge-in) or timed out: the child goes at once
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(Exception):
                await proc.wait()
            raise
        if proc.returncode != 0:
            raise YimiError("tts_failed", f"espeak-ng exited with {proc.returncode}")
        pcm, rate = wav_to_pcm(out)
        return resample(pcm, rate)


class SpeechEndpoint:
    """An OpenAI-compatible ``/audio/speech`` endpoint (the ``tts`` model role)."""

    name = "speech_endpoint"

    def __init__(
        self, base_url: str, model: str, api_key: str | None, *, voice: str, source_rate: int,
        timeout: float, connect_timeout: float,
    ) -> None:
        self.url = base_url.rstrip("/") + "/audio/speech"
        self.model, self.api_key, self.voice, self.source_rate = model, api_key, voice, source_rate
        self.timeout = httpx.Timeout(timeout, connect=connect_timeout)

    async def synthesize(self, text: str) -> bytes:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        body = {"model": self.model, "input": text, "voice": self.voice, "response_format": "pcm"}
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as client, client.stream(
                "POST", self.url, json=body, headers=headers
            ) as response:
                if response.status_code != 200:
                    raise YimiError("tts_failed", f"the speech endpoint answered HTTP {response.status_code}")
                data = bytearray()
                async for piece in response.aiter_bytes():
                    data += piece
                    if len(data) > MAX_ENDPOINT_BYTES:
                        raise YimiError("tts_failed", "the speech endpoint's answer is too large")
        except httpx.HTTPError as exc:
            raise YimiError("tts_failed", f"the speech endpoint failed: {type(exc).__name__}") from None
        return resample(bytes(data), self.source_rate)


def synthesizer() -> tuple[Synthesizer | None, str | None]:
    """The synthesizer for a new voice session and the error code of a configured one that
    cannot be used (then espeak-ng speaks instead, and the session reports the problem).
    The ``tts`` role when configured; espeak-ng when installed; else none (the device
    speaks the reply text itself)."""
    problem = None
    try:
        role = roles.resolve("tts")
    except YimiError as exc:
        if exc.code != "role_not_configured":
            problem = exc.code
            log_event("tts_role_unusable", error_code=exc.code)
    else:
        return SpeechEndpoint(
            role.base_url, role.model, role.api_key, voice=str(getattr(settings, "VOICE_TTS_VOICE", "alloy")),
            source_rate=int(getattr(settings, "VOICE_TTS_ENDPOINT_SAMPLE_RATE", 24000)),
            timeout=role.timeout_seconds, connect_timeout=role.connect_timeout_seconds,
        ), None
    binary = shutil.which("espeak-ng")
    return (Espeak(binary) if binary else None), problem


_limits: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def synthesis_slot() -> asyncio.Semaphore:
    """The process's bound on concurrent syntheses (one per event loop)."""
    loop = asyncio.get_running_loop()
    if loop not in _limits:
        _limits[loop] = asyncio.Semaphore(tts_concurrency())
    return _limits[loop]


# --- speaking the replies of one voice socket ----------------------------------------------------


def speakable(text: str) -> list[str]:
    """``text`` (whole sentences) as the pieces one ``tts.audio`` sentence index each:
    sentences of at most ``MAX_SENTENCE_CHARS``, a longer one cut at a space or comma."""
    out: list[str] = []
    for sentence in split_sentences(text):
        rest = sentence.strip()
        while len(rest) > MAX_SENTENCE_CHARS:
            head = rest[:MAX_SENTENCE_CHARS]
            cut = max(head.rfind(" "), head.rfind(","), head.rfind("，"), head.rfind("、"))
            cut = cut + 1 if cut > MAX_SENTENCE_CHARS // 2 else MAX_SENTENCE_CHARS
            out.append(rest[:cut].strip())
            rest = rest[cut:].strip()
        if rest:
            out.append(rest)
    return out


@dataclass
class SpokenReply:
    """One run's reply being spoken on this socket."""

    run_id: str
    buffer: str = ""  # text received, not yet a complete sentence
    queued: int = 0  # sentence indexes handed out
    sent: int = 0  # sentences whose audio was sent completely
    seq: int | None = None  # the reply's timeline entry, from reply.done
    ended: bool = False  # reply.done came and every sentence is queued
    finished: bool = False  # tts.done sent
    stopped: bool = False
    played_through: int = -1  # the device played sentences 0..played_through
    told: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class ReplySpeaker:
    """Speaks the replies of the runs one voice socket started.

    Steps: 1. ``expect(run_id)`` when the socket starts a run (only those are spoken);
    2. ``chunk`` takes each ``reply.chunk``: complete sentences are queued at once (the
    checked stream sends whole sentences, so the first sentence is queued before the
    reply ends); 3. one worker per socket synthesizes the queue in order (first sentence
    first, ``synthesis_slot`` bounds the process) and sends each sentence as ``tts.audio``
    frames, the last one ``final``; 4. ``done`` (``reply.done``) queues the rest and, once
    every sentence is out, ``tts.done`` with the reply's ``seq``; 5. ``played`` (the
    device's ``tts.played``, in-order playback) — when the device has played every
    sentence of a finished reply, ``on_told(seq)`` records the ``played`` delivery, so the
    reply's facts count as told; 6. ``stop`` (barge-in, a new request, the session's end)
    cancels the synthesis in progress (the child is killed), drops the queue, and answers
    ``tts.stopped``: a reply interrupted before its end is not told.
    """

    def __init__(self, synth: Synthesizer, send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        self.synth = synth
        self.send = send
        self.replies: dict[str, SpokenReply] = {}
        self.queue: asyncio.Queue[tuple[SpokenReply, int, str] | tuple[SpokenReply, None, None]] = asyncio.Queue()
        self.worker: asyncio.Task[None] | None = None
        self.on_told: Callable[[int], Awaitable[None]] | None = None  # records the played delivery

    def expect(self, run_id: Any) -> None:
        key = str(run_id)
        self.replies.setdefault(key, SpokenReply(key))
        while len(self.replies) > 32:  # a socket remembers its last 32 spoken replies
            self.replies.pop(next(iter(self.replies)))

    def speaking(self, run_id: Any) -> bool:
        reply = self.replies.get(str(run_id))
        return reply is not None and not reply.stopped and not reply.finished

    async def chunk(self, run_id: Any, text: Any) -> None:
        reply = self.replies.get(str(run_id))
        if reply is None or reply.stopped or reply.ended or not isinstance(text, str):
            return
        reply.buffer += text
        pieces = split_sentences(reply.buffer)
        complete = pieces if pieces and pieces[-1].rstrip(_CLOSERS).endswith(_ENDS) else pieces[:-1]
        reply.buffer = "".join(pieces[len(complete):])
        for sentence in speakable("".join(complete)):
            self._queue(reply, sentence)

    async def done(self, run_id: Any, seq: Any) -> None:
        reply = self.replies.get(str(run_id))
        if reply is None or reply.stopped or reply.ended:
            return
        for sentence in speakable(reply.buffer):
            self._queue(reply, sentence)
        reply.buffer, reply.ended = "", True
        reply.seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else None
        self.queue.put_nowait((reply, None, None))
        self._ensure_worker()

    def _queue(self, reply: SpokenReply, sentence: str) -> None:
        self.queue.put_nowait((reply, reply.queued, sentence))
        reply.queued += 1
        self._ensure_worker()

    def _ensure_worker(self) -> None:
        if self.worker is None or self.worker.done():
            self.worker = asyncio.ensure_future(self._work())

    async def _work(self) -> None:
        while not self.queue.empty():
            reply, index, sentence = self.queue.get_nowait()
            if reply.stopped:
                continue
            if index is None or sentence is None:
                reply.finished = True
                await self.send({"type": "tts.done", "run_id": reply.run_id, "seq": reply.seq, "sentences": reply.sent})
                await self._maybe_told(reply)
                continue
            try:
                async with synthesis_slot():
                    pcm = await self.synth.synthesize(sentence)
            except YimiError as exc:  # the device still has the reply's text: it speaks it itself
                reply.stopped = True
                log_event("tts_failed", run_id=reply.run_id, error_code=exc.code, synthesizer=self.synth.name)
                await self.send({"type": "tts.stopped", "run_id": reply.run_id, "reason": "error", "code": exc.code,
                                 "sentences": reply.sent})
                continue
            await self._send_sentence(reply, index, sentence, pcm)

    async def _send_sentence(self, reply: SpokenReply, index: int, sentence: str, pcm: bytes) -> None:
        parts = [pcm[i : i + FRAME_BYTES] for i in range(0, len(pcm), FRAME_BYTES)] or [b""]
        for part, data in enumerate(parts):
            frame: dict[str, Any] = {
                "type": "tts.audio", "run_id": reply.run_id, "sentence": index, "part": part,
                "final": part == len(parts) - 1, "sample_rate": SAMPLE_RATE, "encoding": "pcm_s16le",
                "audio": base64.b64encode(data).decode("ascii"),
            }
            if part == 0:
                frame["text"] = sentence
            await self.send(frame)
        reply.sent = index + 1

    async def played(self, run_id: Any, sentence: Any) -> SpokenReply:
        """The device played sentences 0..``sentence`` of ``run_id``'s reply."""
        reply = self.replies.get(str(run_id)) if isinstance(run_id, str) else None
        if reply is None:
            raise YimiError("unknown_run", "no reply of that run was spoken on this socket")
        if isinstance(sentence, bool) or not isinstance(sentence, int) or not 0 <= sentence < reply.sent:
            raise YimiError("invalid_frame", "sentence must be the index of a sentence sent as tts.audio")
        reply.played_through = max(reply.played_through, sentence)
        await self._maybe_told(reply)
        return reply

    async def _maybe_told(self, reply: SpokenReply) -> None:
        if reply.told or not reply.finished or reply.stopped or reply.seq is None:
            return
        if reply.sent and reply.played_through >= reply.sent - 1 and self.on_told is not None:
            reply.told = True
            await self.on_told(reply.seq)

    async def stop(self, reason: str) -> list[str]:
        """Stop speaking at once; returns the runs whose speech was cut."""
        cut = [r.run_id for r in self.replies.values() if not r.stopped and not r.finished and (r.queued or not r.ended)]
        for run_id in cut:
            self.replies[run_id].stopped = True
        worker, self.worker = self.worker, None
        if worker is not None and not worker.done():
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        while not self.queue.empty():
            self.queue.get_nowait()
        for run_id in cut:
            reply = self.replies[run_id]
            await self.send({"type": "tts.stopped", "run_id": run_id, "reason": reason, "sentences": reply.sent})
        return cut
