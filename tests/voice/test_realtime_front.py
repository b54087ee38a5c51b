"""The realtime voice front (voice/realtime.py) against a local fake realtime
server speaking the OpenAI Realtime wire protocol (tests/support/realtime_fake.py): small talk is
answered by the front with no run; ``handoff_to_brain`` turns the owner's utterance into a
run with the handoff's thinking switch, the front speaks a bridge sentence and the brain's
reply is spoken by TTS; a guest's handoff is refused and answered politely."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest

from brain.models import Run
from tests.conftest import db_async, script
from tests.support import voice_support
from tests.support.realtime_fake import BRIDGE_REPLY, REFUSAL_REPLY, SMALL_TALK_REPLY, FakeRealtimeServer
from tests.support.voice_support import SENTENCES
from tests.voice.test_tts import frames_until
from tests.voice.test_voice_session import open_voice, start, stream, utterance
from voice import realtime
from voice.models import VoiceUtterance

voice_assets = voice_support.voice_assets
voice_catalog = voice_support.voice_catalog

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def front_server(tmp_path: Any, settings: Any) -> Iterator[FakeRealtimeServer]:
    """The fake realtime model configured as the ``realtime`` role (its key sealed under a
    master key of this test's own)."""
    from llm import keyring, roles

    settings.DATA_DIR, settings.SECRETS_DIR = tmp_path / "data", tmp_path / "secrets"
    settings.DATA_DIR.mkdir()
    settings.SECRETS_DIR.mkdir()
    settings.VOICE_REALTIME_TRANSCRIPTION_MODEL = "fake-transcribe"
    keyring.ensure_master_key()
    server = FakeRealtimeServer().start()
    roles.import_from_environment({})
    roles.apply("realtime", provider="fake-realtime", base_url=server.base_url, model="omni-test", options={},
                api_key="sk-rt-test", source="console", note="the test's realtime front")
    yield server
    server.stop()


async def spoken_request(comm: Any, speech: Any, text: str) -> dict[str, Any]:
    await comm.send_json_to({"type": "wake"})
    await frames_until(comm, "wake.ack")
    await stream(comm, speech.say(text))
    heard = await utterance(comm)
    assert heard["disposition"] == "request" and heard["front"] is True and heard["needs_transcript"] is False
    assert heard["run_id"] is None
    return heard


async def test_small_talk_is_answered_by_the_front_and_never_becomes_a_run(
    voice_catalog: dict[str, Any], make_device: Any, front_server: FakeRealtimeServer, brain: Any
) -> None:
    front_server.heard = ["how are you today"]
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    assert (await start(comm))["front"] == "realtime"
    heard = await spoken_request(comm, voice_catalog["speech"], SENTENCES[0])
    frames = await frames_until(comm, "front.said")
    audio = [f for f in frames if f["type"] == "front.audio"]
    assert [f["part"] for f in audio] == [0, 1, 2] and all(f["kind"] == "answer" and f["sample_rate"] == 16000 for f in audio)
    pcm = b"".join(base64.b64decode(f["audio"]) for f in audio)
    assert abs(len(pcm) // 2 - 4800) <= 4  # the front's 0.3 s at 24 kHz, resampled to 16 kHz
    assert (frames[-1]["kind"], frames[-1]["text"]) == ("answer", SMALL_TALK_REPLY)
    assert await db_async(Run.objects.count)() == 0

    # What the fake received: the session with the one tool, the utterance's audio, a response.
    assert front_server.paths[-1] == "/v1/realtime?model=omni-test"
    assert front_server.headers[-1]["authorization"] == "Bearer sk-rt-test"
    session = front_server.of_type("session.update")[0]["session"]
    assert [t["name"] for t in session["tools"]] == ["handoff_to_brain"]
    assert set(session["tools"][0]["parameters"]["required"]) == {"difficulty", "intent", "thinking"}
    sent = b"".join(base64.b64decode(e["audio"]) for e in front_server.of_type("input_audio_buffer.append"))
    record = await db_async(VoiceUtterance.objects.get)(id=heard["utterance_id"])
    assert abs(len(sent) // 2 - record.voiced_ms * 24) <= 48  # the utterance, at the front's 24 kHz
    assert len(front_server.of_type("input_audio_buffer.commit")) == 1

    # The device cannot turn the front's utterance into a run behind its back.
    await comm.send_json_to({"type": "voice.transcript", "utterance_id": heard["utterance_id"], "text": "hi"})
    assert (await frames_until(comm, "error"))[-1]["code"] == "transcript_not_needed"
    assert await db_async(Run.objects.count)() == 0
    await comm.disconnect()


async def test_a_handoff_becomes_a_run_with_thinking_and_its_reply_is_spoken(
    voice_catalog: dict[str, Any], make_device: Any, front_server: FakeRealtimeServer, brain: Any
) -> None:
    front_server.heard = ["what's on my calendar tomorrow"]
    script(brain, reply="Tomorrow looks quiet. Enjoy the free time.")
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    await start(comm)
    heard = await spoken_request(comm, voice_catalog["speech"], SENTENCES[1])
    frames = await frames_until(comm, "front.handoff")
    handoff = frames[-1]
    assert (handoff["status"], handoff["thinking"], handoff["utterance_id"]) == ("handed_off", True, heard["utterance_id"])
    frames = await frames_until(comm, "tts.done", timeout=30)
    bridge = [f for f in frames if f["type"] == "front.said"]
    assert [(f["kind"], f["text"]) for f in bridge] == [("bridge", BRIDGE_REPLY)]
    assert any(f["type"] == "front.audio" and f["kind"] == "bridge" for f in frames)
    spoken = [f["text"] for f in frames if f["type"] == "tts.audio" and f["part"] == 0]
    assert spoken == ["Tomorrow looks quiet.", "Enjoy the free time."]
    assert all(f["run_id"] == handoff["run_id"] for f in frames if f["type"] in ("tts.audio", "tts.done"))

    run = await db_async(Run.objects.select_related("inbound").get)()
    assert str(run.id) == handoff["run_id"] and run.thinking is True
    assert run.inbound.text == "what's on my calendar tomorrow"  # the front heard it; no server ASR here
    record = await db_async(VoiceUtterance.objects.get)(id=heard["utterance_id"])
    assert record.entry_id == run.inbound_id and record.transcript_source == "server_asr"
    outputs = [json.loads(e["item"]["output"]) for e in front_server.of_type("conversation.item.create")]
    assert outputs == [{"status": "handed_off", "run_id": handoff["run_id"]}]
    await comm.disconnect()


async def test_a_guests_handoff_is_refused_and_answered_politely(
    voice_catalog: dict[str, Any], make_device: Any, front_server: FakeRealtimeServer, brain: Any
) -> None:
    front_server.heard = ["what's on my calendar"]
    sim = await db_async(make_device)(guest=True)
    comm = await open_voice(sim)
    await start(comm)
    heard = await spoken_request(comm, voice_catalog["speech"], SENTENCES[1])
    assert heard["speaker"]["scope"] == "guest"
    frames = await frames_until(comm, "front.handoff")
    assert (frames[-1]["status"], frames[-1]["code"]) == ("refused", "handoff_refused")
    frames = await frames_until(comm, "front.said")
    assert (frames[-1]["kind"], frames[-1]["text"]) == ("refusal", REFUSAL_REPLY)
    outputs = [json.loads(e["item"]["output"]) for e in front_server.of_type("conversation.item.create")]
    assert outputs == [{"status": "refused", "reason": "guest"}]
    assert await db_async(Run.objects.count)() == 0
    assert (await db_async(VoiceUtterance.objects.get)(id=heard["utterance_id"])).entry_id is None
    await comm.disconnect()


async def test_without_a_reachable_front_requests_go_to_the_brain_as_before(
    voice_catalog: dict[str, Any], make_device: Any, front_server: FakeRealtimeServer, brain: Any
) -> None:
    front_server.stop()  # configured, but nobody answers: the session says so and goes on without it
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    started = await start(comm)
    assert (started["front"], started["problems"].get("realtime")) == ("unavailable", "realtime_unavailable")
    await comm.send_json_to({"type": "wake"})
    await frames_until(comm, "wake.ack")
    await stream(comm, voice_catalog["speech"].say(SENTENCES[2]))
    heard = await utterance(comm)
    assert heard["front"] is False and heard["needs_transcript"] is True
    await comm.disconnect()


def test_the_realtime_url_follows_the_role() -> None:
    assert realtime.realtime_url("https://dashscope.aliyuncs.com/api-ws/v1", "qwen-omni") == (
        "wss://dashscope.aliyuncs.com/api-ws/v1/realtime?model=qwen-omni"
    )
    assert realtime.realtime_url("http://127.0.0.1:9/v1/", "m") == "ws://127.0.0.1:9/v1/realtime?model=m"
