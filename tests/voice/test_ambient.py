"""Ambient context and analysis bounds (docs/voice.md, "Ambient log"): ambient
speech transcribed into the ambient log with its source over /ws/voice/ (the remote engine
against a local /v1/audio/transcriptions server) and never turned into a run; the brain's
recent context takes the last 600 s within 12,000 bytes, marked as overheard; the analysis
scheduler's bounds on an injected clock; forgetting redacts the ambient log's copies."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from brain import prompts
from brain.models import Run
from memory import short_context
from memory.assertions import store as assertions
from memory.assertions.store import CommitRequest
from memory.copies import REDACTED
from memory.models import TimelineEntry
from memory.personal import ambient as ambient_log
from memory.personal.ambient import AmbientSource
from memory.personal.models import AmbientRecord
from tests.conftest import db_async, receive_until
from tests.support import voice_support
from tests.voice import test_asr
from tests.voice.test_asr import TranscriptionServer, utterance
from tests.voice.test_voice_session import open_voice, start, stream
from voice import ambient
from voice.ambient import CHUNK_OVERLAP, CHUNK_SAMPLES, AnalysisScheduler, chunk_bounds
from voice.models import VoiceUtterance
from yimi_project.errors import YimiError

voice_assets = voice_support.voice_assets
voice_catalog = voice_support.voice_catalog
transcription_server = test_asr.transcription_server
remote_asr = test_asr.remote_asr


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def speech(samples: int) -> np.ndarray:
    return np.arange(samples, dtype=np.float32)  # sample i holds i: offsets are checkable


# --- chunking -----------------------------------------------------------------------------------------------


def test_continuous_speech_is_cut_into_160000_sample_chunks_overlapping_8000() -> None:
    assert (CHUNK_SAMPLES, CHUNK_OVERLAP) == (160_000, 8_000)
    assert chunk_bounds(5_000, 160_000) == [(5_000, 165_000)]
    assert chunk_bounds(0, 160_001) == [(0, 160_000), (152_000, 160_001)]
    assert chunk_bounds(0, 312_000) == [(0, 160_000), (152_000, 312_000)]
    assert chunk_bounds(0, 320_000) == [(0, 160_000), (152_000, 312_000), (304_000, 320_000)]
    assert chunk_bounds(0, 0) == []
    scheduler = AnalysisScheduler(clock=Clock())
    queued = scheduler.submit("s", 48_000, speech(320_000)).queued
    assert [(c.start, c.end) for c in queued] == [(48_000, 208_000), (200_000, 360_000), (352_000, 368_000)]
    for chunk in queued:  # each chunk holds exactly the stream's samples at its offsets
        assert chunk.samples[0] == chunk.start - 48_000 and chunk.samples.size == chunk.end - chunk.start


# --- the scheduler's bounds ---------------------------------------------------------------------------------------


def test_a_third_stream_is_refused_until_one_of_two_ends() -> None:
    scheduler = AnalysisScheduler(clock=Clock())
    scheduler.submit("a", 0, speech(100))
    scheduler.submit("b", 0, speech(100))
    with pytest.raises(YimiError) as refused:
        scheduler.submit("c", 0, speech(320_000))
    assert refused.value.code == "analysis_streams_full"
    assert scheduler.streams == ["a", "b"] and scheduler.counts["refused_streams_full"] == 3
    assert scheduler.close_stream("a") == 1 and scheduler.counts["dropped_stream_closed"] == 1
    scheduler.submit("c", 0, speech(100))
    assert scheduler.streams == ["b", "c"]


def test_the_65th_pending_chunk_drops_the_oldest_counted() -> None:
    clock = Clock()
    scheduler = AnalysisScheduler(clock=clock)
    for i in range(64):
        assert scheduler.submit("a", i * 1000, speech(100)).dropped == []
        clock.now += 1
    result = scheduler.submit("a", 64_000, speech(100))
    assert [c.start for c in result.dropped] == [0] and scheduler.pending("a") == 64
    assert scheduler.counts["dropped_queue_full"] == 1 and scheduler.counts["queued"] == 65
    assert scheduler.take().start == 1000  # type: ignore[union-attr]  (the oldest left)


def test_at_most_32_candidates_in_total() -> None:
    scheduler = AnalysisScheduler(clock=Clock())
    for i in range(40):
        scheduler.submit("a", i * 1000, speech(100))
        scheduler.submit("b", i * 1000, speech(100))
    taken = [scheduler.take() for _ in range(32)]
    assert all(taken) and scheduler.candidates == 32
    assert [c.stream for c in taken[:4]] == ["a", "b", "a", "b"]  # type: ignore[union-attr]  (round robin)
    assert scheduler.take() is None
    scheduler.finish(taken[0])  # type: ignore[arg-type]
    assert scheduler.take() is not None and scheduler.candidates == 32


def test_analysis_yields_during_a_call_and_push_to_talk() -> None:
    clock = Clock()
    scheduler = AnalysisScheduler(clock=clock)
    scheduler.submit("a", 0, speech(100))
    scheduler.hold("call:s1")
    assert scheduler.take() is None and scheduler.pending("a") == 1
    scheduler.release("call:s1")
    scheduler.hold("ptt:s1", 120)
    clock.now += 119.9
    assert scheduler.take() is None
    clock.now += 0.2  # a lost release: the push-to-talk hold ends by itself
    chunk = scheduler.take()
    assert chunk is not None and chunk.start == 0


# --- the ambient log and the recent context ----------------------------------------------------------------------


def source(device: Any, scope: str = "owner_uncertain") -> AmbientSource:
    return AmbientSource(device.id, device.name, "phone_app", uuid.uuid4(), scope, "voiceprint_uncertain")


@pytest.mark.django_db
def test_recent_context_takes_the_last_600_s_within_12000_bytes_marked_as_overheard(make_device: Any) -> None:
    sim = make_device()
    owner_id, now = sim.device.owner_id, datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    ambient_log.record(owner_id, source(sim.device), start_sample=0, end_sample=10, heard_at=now - timedelta(seconds=601), text="too old to tell")
    ambient_log.record(owner_id, source(sim.device, "owner"), start_sample=0, end_sample=10, heard_at=now - timedelta(seconds=599), text="the oldest kept")
    line = "我们明天下午三点在公司楼下见面吧" * 10  # 160 CJK characters: 480 bytes
    for i in range(40):
        ambient_log.record(owner_id, source(sim.device), start_sample=i, end_sample=i + 1, heard_at=now - timedelta(seconds=300 - i), text=f"{i:02d} {line}")
    context = ambient_log.recent(owner_id, now=now)
    assert context.bytes <= 12_000 and context.left_out > 0
    assert context.text.startswith("Overheard nearby") and "never the owner's request" in context.text
    assert "too old to tell" not in context.text
    kept = [int(row.split(": ", 1)[1][:2]) for row in context.text.splitlines()[1:] if line in row]
    assert kept == sorted(kept) and kept[-1] == 39  # the newest are kept, in the order they were said
    assert len(kept) == (12_000 - len(ambient_log.HEADER.encode())) // (len(context.text.splitlines()[-1].encode()) + 1)
    # the short older line still fits after the long ones stop fitting
    assert "the oldest kept" in context.text and "the owner (voiceprint)" in context.text
    assert f"{sim.device.name} / phone_app" in context.text
    assert ambient_log.recent(owner_id, now=now - timedelta(seconds=700)).text == ""


@pytest.mark.django_db
def test_the_run_prompt_gets_the_ambient_log_as_overheard_never_as_the_request(make_device: Any) -> None:
    sim = make_device()
    owner_id = sim.device.owner_id
    ambient_log.record(owner_id, source(sim.device, "guest"), start_sample=0, end_sample=10, heard_at=datetime.now(UTC), text="buy the red car now")
    messages = prompts.build_messages("owner", "what did they say?", [])
    memory = prompts.prepare_memory(owner_id, "owner", 0)
    out = prompts.with_memory(messages, [], memory)
    assert out[-1] == {"role": "user", "content": "what did they say?"}
    [overheard] = [m for m in out if "buy the red car now" in m["content"]]
    assert overheard["role"] == "system" and overheard["content"].startswith("Overheard nearby") and "someone else" in overheard["content"]
    guest = prompts.prepare_memory(owner_id, "guest", 0)
    assert guest.ambient == "" and all("red car" not in m["content"] for m in prompts.with_memory(prompts.build_messages("guest", "hi", []), [], guest))
    assert "buy the red car now" in short_context.timeline_source(owner_id)  # the call's short context too


@pytest.mark.django_db
def test_forgetting_redacts_the_ambient_logs_copies(make_device: Any) -> None:
    sim = make_device()
    owner_id = sim.device.owner_id
    secret = "my locker code is 4711 at the gym"
    kept = ambient_log.record(owner_id, source(sim.device), start_sample=0, end_sample=10, heard_at=datetime.now(UTC), text=f"she said {secret} yesterday")
    other = ambient_log.record(owner_id, source(sim.device), start_sample=10, end_sample=20, heard_at=datetime.now(UTC), text="nothing to do with it")
    result = assertions.commit(CommitRequest(owner_id=owner_id, request_id="c-1", predicate="note.locker", payload={"text": secret}, expected_version=0))
    forgot = assertions.forget(owner_id, result.assertion_id, request_id="f-1")
    assert forgot.redacted.get("memory.ambient_log") == 1, forgot.redacted
    assert AmbientRecord.objects.get(id=kept.id).text == f"she said {REDACTED} yesterday"  # type: ignore[union-attr]
    assert AmbientRecord.objects.get(id=other.id).text == "nothing to do with it"  # type: ignore[union-attr]


# --- over the voice socket ------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_ambient_speech_is_transcribed_into_the_log_with_its_source_and_never_becomes_a_run(
    voice_catalog: dict[str, Any], remote_asr: TranscriptionServer, make_device: Any
) -> None:
    remote_asr.reply = " the train leaves at nine "
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    started = await start(comm)
    assert started["transcription"] == "server"
    await stream(comm, voice_catalog["speech"].say(voice_support.SENTENCES[0]))  # no wake word
    heard = await utterance(comm, timeout=30)
    assert heard["disposition"] == "ambient" and heard["run_id"] is None, heard
    assert heard["ambient"]["analysis"] == "queued" and heard["ambient"]["chunks"] == 1, heard
    await ambient.analysis.idle()
    record = await db_async(AmbientRecord.objects.get)()
    voice = await db_async(VoiceUtterance.objects.get)()
    assert (record.text, record.channel, record.device_id, record.device_label) == ("the train leaves at nine", "phone_app", sim.device.id, sim.device.name)
    assert (record.utterance_id, record.speaker_scope, record.engine) == (voice.id, voice.scope, "remote")
    assert record.stream_start_sample == voice.stream_start_ms * 16 and record.heard_at == voice.started_at
    assert record.stream_end_sample - record.stream_start_sample == voice.voiced_ms * 16
    assert voice.transcript == "" and voice.entry_id is None  # ambient: no request transcript, no entry
    assert await db_async(Run.objects.count)() == 0 and await db_async(TimelineEntry.objects.count)() == 0
    await comm.disconnect()
    assert ambient.analysis.scheduler.streams == []


@pytest.mark.django_db(transaction=True)
async def test_ambient_analysis_waits_while_the_owner_is_in_a_call(
    voice_catalog: dict[str, Any], remote_asr: TranscriptionServer, make_device: Any
) -> None:
    remote_asr.reply = "background chatter"
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    started = await start(comm)
    await comm.send_json_to({"type": "call.start", "call_id": "c1"})
    await receive_until(comm, "call.started")
    await stream(comm, voice_catalog["speech"].say(voice_support.SENTENCES[1]))
    heard = await utterance(comm, timeout=30)
    assert heard["disposition"] == "ambient" and heard["ambient"]["analysis"] == "queued", heard
    await ambient.analysis.idle()
    assert remote_asr.requests == [] and ambient.analysis.scheduler.pending(started["session_id"]) == 1
    assert await db_async(AmbientRecord.objects.count)() == 0
    await comm.send_json_to({"type": "call.end", "call_id": "c1"})
    await receive_until(comm, "call.ended")
    await ambient.analysis.idle()
    assert len(remote_asr.requests) == 1 and await db_async(AmbientRecord.objects.count)() == 1
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_push_to_talk_makes_speech_a_request_and_ambient_analysis_waits_while_held(
    voice_catalog: dict[str, Any], remote_asr: TranscriptionServer, make_device: Any, brain: Any
) -> None:
    remote_asr.reply = "what time is it"
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    started = await start(comm)
    await comm.send_json_to({"type": "push_to_talk", "id": "p", "state": "down"})
    down = await receive_until(comm, "push_to_talk.ack", "error")
    assert (down["type"], down["state"], down["window_until_ms"] - down["window_from_ms"]) == ("push_to_talk.ack", "down", 120_000), down
    assert ambient.analysis.scheduler.yielding
    await stream(comm, voice_catalog["speech"].say(voice_support.SENTENCES[2]))
    heard = await utterance(comm, timeout=30)
    assert heard["disposition"] == "request" and heard["ambient"] is None and heard["run_id"], heard
    await receive_until(comm, "reply.done", "notice", timeout=30)
    await comm.send_json_to({"type": "push_to_talk", "state": "up"})
    up = await receive_until(comm, "push_to_talk.ack", "error")
    assert up["state"] == "up" and down["window_from_ms"] == up["window_from_ms"] < up["window_until_ms"] < down["window_until_ms"], up
    assert not ambient.analysis.scheduler.yielding
    await stream(comm, voice_catalog["speech"].say(voice_support.SENTENCES[3]), tail=1.0)
    after = await utterance(comm, timeout=30)
    assert after["disposition"] == "ambient", after  # the window ended where the key was released
    await comm.send_json_to({"type": "push_to_talk", "state": "sideways"})
    bad = await receive_until(comm, "error")
    assert bad["code"] == "invalid_frame"
    await ambient.analysis.idle()
    assert started["session_id"] in ambient.analysis.scheduler.streams
    await comm.disconnect()
    assert ambient.analysis.scheduler.streams == []
