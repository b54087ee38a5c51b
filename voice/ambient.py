"""Ambient speech analysis within fixed bounds (docs/voice.md, "Ambient log").

Ambient speech (an utterance that reached no request window) is transcribed when the
session has a server ASR engine and kept in the ambient log (``memory.personal.ambient``) with its
source. The work goes through one ``AnalysisScheduler`` per process, whose bounds are
fixed:

- at most ``MAX_STREAMS`` (2) continuous streams — one voice socket's capture channel is
  one stream. A third is **refused**: its chunks are not analysed (``analysis_streams_full``,
  counted and logged per chunk) until one of the two ends (``voice.stop`` or the socket
  closing). Refusing rather than queueing: a queued stream would hold audio nobody bounds.
- at most ``MAX_PENDING`` (64) pending chunks per stream. The 65th **drops the oldest**
  pending chunk of that stream (``analysis_queue_full``, counted and logged): the recent
  context only ever shows the last 600 s, so the newest speech is the one worth keeping.
- at most ``MAX_CANDIDATES`` (32) candidates in total: chunks taken for analysis and not
  yet finished. ``take`` hands out nothing more until one finishes.
- continuous speech is cut into chunks of ``CHUNK_SAMPLES`` (160,000 samples, 10 s at
  16 kHz) overlapping ``CHUNK_OVERLAP`` (8,000, 0.5 s): starts at 0, 152,000, 304,000, …
  of the speech, each chunk's offsets exact in its stream; the last chunk is what is left
  (shorter), and none is made of speech the previous chunk already covered.
- analysis **yields** while the owner is in a call, holding push-to-talk, or while a
  request is being transcribed: ``take`` hands out nothing while a hold is active (a
  push-to-talk hold ends by itself after ``PTT_HOLD_SECONDS`` if its release is lost). A
  chunk already on the engine finishes (a decode cannot be interrupted); no new one starts.

The scheduler is plain data with an injected clock (``clock`` returns seconds); the
process's drain task (``AmbientAnalysis``) runs it on the event loop and transcribes off
it through ``voice.asr.transcribe`` (the same bounded engine thread as requests).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
from channels.db import database_sync_to_async

from memory.personal import ambient as ambient_log
from memory.personal.ambient import AmbientSource
from voice import asr
from voice.audio import SAMPLE_RATE
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

MAX_STREAMS = 2
MAX_PENDING = 64
MAX_CANDIDATES = 32
CHUNK_SAMPLES = 160_000
CHUNK_OVERLAP = 8_000
PTT_HOLD_SECONDS = 120.0


def chunk_bounds(start: int, length: int, size: int = CHUNK_SAMPLES, overlap: int = CHUNK_OVERLAP) -> list[tuple[int, int]]:
    """``[start, end)`` stream offsets of the chunks of ``length`` samples of continuous
    speech beginning at stream sample ``start`` (module docstring)."""
    if length <= 0:
        return []
    step = size - overlap
    bounds = [(start, start + min(size, length))]
    offset = step
    while offset + overlap < length:  # something beyond what the previous chunk covered
        bounds.append((start + offset, start + min(offset + size, length)))
        offset += step
    return bounds


@dataclass
class Chunk:
    stream: str
    start: int  # stream offsets, samples
    end: int
    samples: np.ndarray = field(repr=False)
    payload: Any = field(default=None, repr=False)  # what the analyser needs (source, engine, ...)
    queued_at: float = 0.0


@dataclass
class Submitted:
    queued: list[Chunk]
    dropped: list[Chunk]  # the oldest pending chunks pushed out by these (analysis_queue_full)


class AnalysisScheduler:
    """The analysis queue's bounds (module docstring). Not thread-safe: one event loop
    uses it. Every refusal and drop is counted in ``counts`` and logged."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_streams: int = MAX_STREAMS,
        max_pending: int = MAX_PENDING,
        max_candidates: int = MAX_CANDIDATES,
        chunk_samples: int = CHUNK_SAMPLES,
        chunk_overlap: int = CHUNK_OVERLAP,
    ) -> None:
        self.clock = clock
        self.max_streams, self.max_pending, self.max_candidates = max_streams, max_pending, max_candidates
        self.chunk_samples, self.chunk_overlap = chunk_samples, chunk_overlap
        self._pending: dict[str, deque[Chunk]] = {}  # stream → its pending chunks, oldest first (insertion order = open order)
        self._candidates: set[int] = set()  # id() of chunks taken and not finished
        self._holds: dict[str, float | None] = {}  # key → expiry (clock seconds) or None
        self._next = 0  # round-robin position over streams
        self.counts = {
            "queued": 0, "taken": 0, "finished": 0,
            "dropped_queue_full": 0, "dropped_stream_closed": 0, "refused_streams_full": 0,
        }

    # --- streams -----------------------------------------------------------------------------

    @property
    def streams(self) -> list[str]:
        return list(self._pending)

    def pending(self, stream: str) -> int:
        return len(self._pending.get(stream, ()))

    @property
    def candidates(self) -> int:
        return len(self._candidates)

    def close_stream(self, stream: str) -> int:
        """The stream ended: its slot is free and its pending chunks are dropped (counted,
        logged); chunks already taken finish normally. Returns how many were dropped."""
        chunks = self._pending.pop(stream, None)
        if not chunks:
            return 0
        self.counts["dropped_stream_closed"] += len(chunks)
        log_event("ambient_chunks_dropped", reason="stream_closed", chunks=len(chunks))
        return len(chunks)

    def submit(self, stream: str, start: int, samples: np.ndarray, payload: Any = None) -> Submitted:
        """Cut continuous speech (``samples`` starting at stream sample ``start``) into
        chunks and queue them on ``stream`` (opened on its first chunk).

        ``analysis_streams_full`` when ``stream`` is not open and ``max_streams`` are: its
        chunks are refused (counted, logged) and it may try again later. Beyond
        ``max_pending`` the oldest pending chunks of the stream are dropped (returned in
        ``dropped``, counted, logged)."""
        queue = self._pending.get(stream)
        bounds = chunk_bounds(start, int(samples.size), self.chunk_samples, self.chunk_overlap)
        if queue is None:
            if len(self._pending) >= self.max_streams:
                self.counts["refused_streams_full"] += len(bounds)
                log_event("ambient_chunks_refused", reason="analysis_streams_full", chunks=len(bounds), streams=len(self._pending))
                raise YimiError("analysis_streams_full", f"{self.max_streams} continuous streams are already being analysed")
            queue = self._pending[stream] = deque()
        now = self.clock()
        queued = [Chunk(stream, s, e, samples[s - start : e - start], payload, now) for s, e in bounds]
        dropped: list[Chunk] = []
        for chunk in queued:
            if len(queue) >= self.max_pending:
                dropped.append(queue.popleft())
            queue.append(chunk)
        self.counts["queued"] += len(queued)
        if dropped:
            self.counts["dropped_queue_full"] += len(dropped)
            log_event(
                "ambient_chunks_dropped", reason="analysis_queue_full", chunks=len(dropped),
                oldest_age_ms=int((now - dropped[0].queued_at) * 1000),
            )
        return Submitted(queued, dropped)

    # --- yielding ----------------------------------------------------------------------------

    def hold(self, key: str, seconds: float | None = None) -> None:
        """Analysis yields while ``key`` is held (a call, push-to-talk, a request being
        transcribed); ``seconds``: the hold ends by itself after that long."""
        self._holds[key] = None if seconds is None else self.clock() + seconds

    def release(self, key: str) -> None:
        self._holds.pop(key, None)

    @property
    def yielding(self) -> bool:
        now = self.clock()
        for key, until in list(self._holds.items()):
            if until is not None and until <= now:
                del self._holds[key]
        return bool(self._holds)

    # --- analysis ----------------------------------------------------------------------------

    def take(self) -> Chunk | None:
        """The next chunk to analyse — the oldest pending chunk of the next stream in
        turn — or None: nothing pending, analysis yielding, or ``max_candidates`` out."""
        if self.yielding or len(self._candidates) >= self.max_candidates:
            return None
        streams = [s for s in self._pending if self._pending[s]]
        if not streams:
            return None
        stream = streams[self._next % len(streams)]
        self._next += 1
        chunk = self._pending[stream].popleft()
        self._candidates.add(id(chunk))
        self.counts["taken"] += 1
        return chunk

    def finish(self, chunk: Chunk) -> None:
        """The chunk's analysis ended (kept, empty or failed): it is no longer a candidate."""
        if id(chunk) in self._candidates:
            self._candidates.discard(id(chunk))
            self.counts["finished"] += 1


# --- the process's analysis ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AmbientWork:
    """What one chunk needs to be analysed and kept: the engine, the owner, the source and
    the wall-clock time of the utterance's first sample."""

    recognizer: Any  # voice.asr.Recognizer
    owner_id: int
    source: AmbientSource
    utterance_start: int  # stream sample of the utterance's start
    started_at: Any  # datetime


class AmbientAnalysis:
    """The scheduler of this process and the task that drains it on the event loop: one
    chunk at a time (the local engine has one thread), transcribed off the loop, kept in
    the ambient log. A drain runs while there is work and the scheduler allows it; it is
    started again by ``kick`` (a new chunk, a hold released)."""

    def __init__(self, scheduler: AnalysisScheduler | None = None) -> None:
        self.scheduler = scheduler or AnalysisScheduler()
        self._task: asyncio.Task[None] | None = None
        self.kept = 0
        self.failed = 0

    def kick(self) -> None:
        task = self._task
        loop = asyncio.get_running_loop()
        if task is not None and not task.done() and task.get_loop() is loop:
            return
        self._task = loop.create_task(self._drain())

    async def idle(self) -> None:
        """Wait for the running drain to end (tests and the benchmark)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def _drain(self) -> None:
        while (chunk := self.scheduler.take()) is not None:
            try:
                await self._analyse(chunk)
            finally:
                self.scheduler.finish(chunk)

    async def _analyse(self, chunk: Chunk) -> None:
        work: AmbientWork = chunk.payload
        try:
            text = await asr.transcribe(work.recognizer, chunk.samples)
        except YimiError as exc:
            self.failed += 1
            log_event("ambient_chunk_failed", engine=work.recognizer.engine, error_code=exc.code)
            return
        heard_at = work.started_at + timedelta(seconds=(chunk.start - work.utterance_start) / SAMPLE_RATE)
        try:
            kept = await database_sync_to_async(ambient_log.record)(
                work.owner_id, work.source, start_sample=chunk.start, end_sample=chunk.end, heard_at=heard_at,
                text=text, engine=work.recognizer.engine,
            )
        except Exception as exc:  # noqa: BLE001 - one lost observation must not stop the drain
            self.failed += 1
            log_event("ambient_chunk_failed", engine=work.recognizer.engine, error_code=type(exc).__name__)
            return
        if kept is not None:
            self.kept += 1


analysis = AmbientAnalysis()
