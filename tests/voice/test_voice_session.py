"""The voice websocket, /ws/voice/, on the real ASGI app: a simulated device streams
espeak-ng speech as 16 kHz PCM frames; the server segments it with Silero VAD, embeds it
with the test speaker model through sherpa-onnx, decides who spoke and what it becomes."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from channels.testing import WebsocketCommunicator

from accounts import voice
from accounts.models import AdmissionRecord, VoiceprintEnrollment
from accounts.signatures import auth_message
from brain.models import Run
from devices.models import Delivery
from memory.models import TimelineEntry
from tests.conftest import db_async, device_socket, receive_until
from tests.support import voice_support
from tests.support.voice_support import GUEST_VOICE, OWNER_VOICE, SENTENCES, frames, pcm, silence
from voice.models import VoiceUtterance

# fixtures
voice_assets = voice_support.voice_assets
voice_catalog = voice_support.voice_catalog

pytestmark = pytest.mark.django_db(transaction=True)
FORMAT = {"encoding": "pcm_s16le", "sample_rate": 16000, "channels": 1}


async def open_voice(sim: Any) -> WebsocketCommunicator:
    comm = device_socket("/ws/voice/")
    connected, _ = await comm.connect()
    assert connected
    challenge = await comm.receive_json_from()
    await comm.send_json_to(
        {"type": "auth", "device_id": str(sim.device.id), "signature": sim.sign(auth_message(challenge["nonce"], str(sim.device.id)))}
    )
    assert (await comm.receive_json_from())["type"] == "ready"
    return comm


async def start(comm: WebsocketCommunicator, **extra: Any) -> dict[str, Any]:
    await comm.send_json_to({"type": "voice.start", "id": "s", "channel": "phone_app", "format": FORMAT, **extra})
    started = await receive_until(comm, "voice.started", "error", timeout=30)
    assert started["type"] == "voice.started", started
    return started


async def stream(comm: WebsocketCommunicator, samples: np.ndarray, *, tail: float = 1.0) -> None:
    """Stream speech followed by ``tail`` seconds of silence (so the VAD closes the segment)."""
    for frame in frames(np.concatenate([samples, silence(tail)])):
        await comm.send_to(bytes_data=frame)


async def utterance(comm: WebsocketCommunicator) -> dict[str, Any]:
    frame = await receive_until(comm, "voice.utterance", "error", timeout=20)
    assert frame["type"] == "voice.utterance", frame
    return frame


# --- protocol errors ---------------------------------------------------------------------------------


async def test_voice_socket_refuses_audio_before_auth(owner: Any) -> None:
    comm = device_socket("/ws/voice/")
    await comm.connect()
    await comm.receive_json_from()
    await comm.send_to(bytes_data=b"\0\0" * 160)
    assert (await comm.receive_json_from())["code"] == "not_authenticated"
    assert (await comm.receive_output())["code"] == 4401


@pytest.mark.parametrize(
    "frame, code",
    [
        ({"type": "voice.start", "channel": "phone_app", "format": {"encoding": "pcm_s16le", "sample_rate": 48000}}, "unsupported_audio_format"),
        ({"type": "voice.start", "channel": "phone_app", "format": {"encoding": "opus"}}, "unsupported_audio_format"),
        ({"type": "voice.start", "channel": "phone_app", "format": {"channels": True}}, "unsupported_audio_format"),
        ({"type": "voice.start", "channel": "glasses"}, "unknown_channel"),
        ({"type": "voice.start", "channel": "Phone App"}, "invalid_frame"),
        ({"type": "voice.start", "channel": "phone_app", "mode": "sudo"}, "invalid_frame"),
        ({"type": "wake"}, "voice_not_started"),
        ({"type": "call.start", "call_id": "c1"}, "voice_not_started"),
        ({"type": "voice.transcript", "utterance_id": "0" * 32, "text": "hi"}, "unknown_utterance"),
        ({"type": "voice.transcript", "utterance_id": "nope", "text": ""}, "invalid_frame"),
        ({"type": "trust.open", "attestation_id": "a1", "method": "face_id", "issued_at": 1, "signature": "AAAA"}, "attestation_expired"),
        ({"type": "trust.open", "attestation_id": "a1", "method": "pin", "issued_at": 1, "signature": "AAAA"}, "invalid_frame"),
        ({"type": "enroll.commit"}, "voice_not_started"),
        ({"type": "voice.stop"}, "voice_not_started"),
    ],
)
async def test_bad_voice_control_frames_get_a_stable_code_and_change_nothing(
    voice_catalog: dict[str, Any], make_device: Any, frame: dict[str, Any], code: str
) -> None:
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    await comm.send_json_to(frame)
    error = await receive_until(comm, "error")
    assert error["code"] == code, error
    assert await db_async(VoiceUtterance.objects.count)() == 0
    assert await db_async(TimelineEntry.objects.count)() == 0
    await comm.send_json_to({"type": "ping", "id": "p"})
    assert (await receive_until(comm, "pong"))["id"] == "p"
    await comm.disconnect()


async def test_bad_control_frames_inside_a_session_change_nothing(voice_catalog: dict[str, Any], make_device: Any) -> None:
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    await start(comm)
    for frame, code in [
        ({"type": "voice.start", "channel": "phone_app"}, "voice_already_started"),
        ({"type": "wake", "at_ms": -5}, "invalid_frame"),
        ({"type": "wake", "at_ms": 10**9}, "invalid_frame"),
        ({"type": "playback", "state": "paused"}, "invalid_frame"),
        ({"type": "call.end", "call_id": "never"}, "unknown_call"),
        ({"type": "call.start", "call_id": "bad id with spaces"}, "invalid_frame"),
        ({"type": "enroll.start"}, "trust_window_required"),
        ({"type": "enroll.commit"}, "not_enrolling"),
    ]:
        await comm.send_json_to(frame)
        error = await receive_until(comm, "error")
        assert error["code"] == code, (frame, error)
    assert await db_async(VoiceUtterance.objects.count)() == 0
    await comm.disconnect()


async def test_wrong_sample_format_and_oversized_audio_frames_are_refused(voice_catalog: dict[str, Any], make_device: Any) -> None:
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    await comm.send_to(bytes_data=b"\0\0" * 100)
    assert (await receive_until(comm, "error"))["code"] == "voice_not_started"
    started = await start(comm)
    limit = started["limits"]["max_audio_frame_bytes"]
    assert limit == 32000
    for data, code in [(b"\0" * 321, "invalid_sample_format"), (b"\0" * (limit + 2), "audio_frame_too_large")]:
        await comm.send_to(bytes_data=data)
        assert (await receive_until(comm, "error"))["code"] == code
    await comm.send_json_to({"type": "voice.stop", "id": "x"})
    stopped = await receive_until(comm, "voice.stopped")
    assert stopped["stream_ms"] == 0  # nothing of the refused frames entered the stream
    await comm.disconnect()


async def test_audio_rechecks_the_device_so_a_revocation_whose_close_was_lost_ends_the_stream(
    voice_catalog: dict[str, Any], make_device: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Audio frames come tens a second: each re-checks the device once
    ``DEVICE_RECHECK_SECONDS`` have passed since the last re-check, on the consumer's clock
    (the test's here), so a revoked device's stream ends within that time even when the
    revocation's close message never reached the socket."""
    from django.utils import timezone

    from accounts.models import Device
    from devices.consumers.voice import DEVICE_RECHECK_SECONDS, VoiceConsumer

    now = [1000.0]
    monkeypatch.setattr(VoiceConsumer, "recheck_clock", staticmethod(lambda: now[0]))
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    await start(comm)
    await comm.send_to(bytes_data=pcm(silence(0.2)))  # the first audio frame re-checks: still paired
    await db_async(Device.objects.filter(id=sim.device.id).update)(revoked_at=timezone.now())  # no group message
    now[0] += DEVICE_RECHECK_SECONDS
    await comm.send_to(bytes_data=pcm(silence(0.2)))
    assert (await receive_until(comm, "error"))["code"] == "device_revoked"
    while (output := await comm.receive_output())["type"] != "websocket.close":
        pass
    assert output["code"] == 4403


# --- ambient, requests, echo ----------------------------------------------------------------------------


async def test_speech_without_a_wake_word_is_ambient_and_never_a_request(voice_catalog: dict[str, Any], make_device: Any) -> None:
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    started = await start(comm)
    assert (started["transcription"], started["wake_word"]) == ("unavailable", "device")
    await stream(comm, voice_catalog["speech"].say(SENTENCES[0]))
    heard = await utterance(comm)
    assert heard["disposition"] == "ambient" and heard["needs_transcript"] is False and heard["run_id"] is None
    assert heard["voiced_ms"] > 1500
    record = await db_async(VoiceUtterance.objects.get)()
    assert (record.device_id, record.channel, record.disposition) == (sim.device.id, "phone_app", "ambient")
    await comm.send_json_to({"type": "voice.transcript", "utterance_id": heard["utterance_id"], "text": "turn on the oven"})
    assert (await receive_until(comm, "error"))["code"] == "not_a_request"
    assert await db_async(TimelineEntry.objects.count)() == 0 and await db_async(Run.objects.count)() == 0
    await comm.disconnect()


async def test_speech_during_playback_that_is_not_the_owner_is_echo(voice_catalog: dict[str, Any], make_device: Any) -> None:
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    await start(comm)
    await comm.send_json_to({"type": "wake"})
    await receive_until(comm, "wake.ack")
    await comm.send_json_to({"type": "playback", "state": "start"})
    await stream(comm, voice_catalog["speech"].say(SENTENCES[1], GUEST_VOICE))
    heard = await utterance(comm)
    assert heard["disposition"] == "echo" and heard["run_id"] is None and heard["needs_transcript"] is False
    assert (await db_async(VoiceUtterance.objects.get)()).mode == "barge_in"
    await comm.disconnect()


async def test_without_asr_a_request_becomes_a_run_with_the_device_transcript(voice_catalog: dict[str, Any], make_device: Any, brain: Any) -> None:
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    await start(comm)
    await comm.send_json_to({"type": "wake"})
    await receive_until(comm, "wake.ack")
    await stream(comm, voice_catalog["speech"].say(SENTENCES[2]))
    heard = await utterance(comm)
    assert heard["disposition"] == "request" and heard["transcription"] == "unavailable"
    assert heard["needs_transcript"] is True and heard["transcript"] is None and heard["run_id"] is None
    assert heard["speaker"]["reason"] == "no_voiceprint"  # nothing enrolled: not known
    assert await db_async(Run.objects.count)() == 0  # no text, no run — nothing is made up
    text = "Read me the latest news about the football match."
    await comm.send_json_to({"type": "voice.transcript", "id": "t", "utterance_id": heard["utterance_id"], "text": text})
    ack = await receive_until(comm, "voice.transcript.ack")
    assert ack["duplicate"] is False and ack["run_id"]
    await receive_until(comm, "reply.done", "notice")
    record = await db_async(VoiceUtterance.objects.select_related("entry").get)()
    assert (record.transcript_source, record.transcript, record.entry.text) == ("device", text, text)
    run = await db_async(Run.objects.select_related("admission").get)()
    assert (run.scope, run.admission.channel, run.admission.reason) == ("owner_uncertain", "voice", "no_voiceprint")
    await comm.send_json_to({"type": "voice.transcript", "id": "t2", "utterance_id": heard["utterance_id"], "text": text})
    again = await receive_until(comm, "voice.transcript.ack")
    assert again["duplicate"] is True and again["seq"] == ack["seq"]
    assert await db_async(Run.objects.count)() == 1
    await comm.disconnect()


# --- end to end ---------------------------------------------------------------------------------------


async def test_end_to_end_generated_speech_enrolled_identified_and_run_in_owner_scope(
    voice_catalog: dict[str, Any], make_device: Any, brain: Any
) -> None:
    """A device enrolls the owner's voice over the socket (Face ID first), then says a
    request after its wake word: segmented, identified as the owner, a run in owner scope,
    the reply delivered as text and ACKed played; the follow-up window then takes a guest's
    question in guest scope, and speech after the window is ambient."""
    speech = voice_catalog["speech"]
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    started = await start(comm)
    assert started["voiceprint"] == "available"

    issued = int(time.time())
    signature = sim.sign(voice.trust_window_message(str(sim.device.id), "att-e2e", "face_id", issued))
    await comm.send_json_to({"type": "trust.open", "attestation_id": "att-e2e", "method": "face_id", "issued_at": issued, "signature": signature})
    await receive_until(comm, "trust.opened")
    await comm.send_json_to({"type": "enroll.start"})
    assert (await receive_until(comm, "enroll.started"))["model"] == "test-speaker@1"
    for text in SENTENCES[:5]:
        await stream(comm, speech.say(text, OWNER_VOICE), tail=0.8)
        segment = await receive_until(comm, "enroll.segment", timeout=20)
        assert segment["voiced_ms"] >= 1500 and segment["embedded"] is True
    await comm.send_json_to({"type": "enroll.commit"})
    committed = await receive_until(comm, "enroll.committed", "error")
    assert committed["type"] == "enroll.committed" and committed["segments"] == 5, committed
    assert await db_async(VoiceprintEnrollment.objects.filter(channel="phone_app").count)() == 1

    await comm.send_json_to({"type": "wake"})
    await receive_until(comm, "wake.ack")
    await stream(comm, speech.say(SENTENCES[5], OWNER_VOICE))
    heard = await utterance(comm)
    assert heard["disposition"] == "request" and heard["needs_transcript"] is True
    assert heard["speaker"]["scope"] == "owner" and heard["speaker"]["band"] == "verified", heard
    await comm.send_json_to({"type": "voice.transcript", "utterance_id": heard["utterance_id"], "text": SENTENCES[5]})
    ack = await receive_until(comm, "voice.transcript.ack")
    done = await receive_until(comm, "reply.done", timeout=10)
    assert done["reply_to_seq"] == ack["seq"] and done["text"]
    await comm.send_json_to({"type": "ack", "seq": done["seq"], "status": "played"})

    run = await db_async(Run.objects.select_related("admission", "inbound").get)(id=ack["run_id"])
    assert (run.scope, run.state, run.inbound.text) == ("owner", "succeeded", SENTENCES[5])
    assert (run.admission.channel, run.admission.reason) == (AdmissionRecord.Channel.VOICE, "voiceprint_verified")

    # The reply was played: a follow-up needs no wake word. Another voice asks — as a guest.
    await stream(comm, speech.say(SENTENCES[6], GUEST_VOICE))
    followup = await utterance(comm)
    assert followup["disposition"] == "request" and followup["speaker"]["scope"] == "guest", followup
    assert await db_async(Delivery.objects.filter(status="played", entry__seq=done["seq"]).exists)()

    # After the window (8 s) the owner's speech is only an observation.
    await stream(comm, silence(9.0), tail=0.0)
    await stream(comm, speech.say(SENTENCES[7], OWNER_VOICE))
    later = await utterance(comm)
    assert later["disposition"] == "ambient" and later["speaker"]["scope"] == "owner"
    await comm.send_json_to({"type": "voice.stop", "id": "end"})
    await receive_until(comm, "voice.stopped")
    dispositions = await db_async(lambda: list(VoiceUtterance.objects.order_by("stream_start_ms").values_list("disposition", flat=True)))()
    assert dispositions == ["request", "request", "ambient"]
    assert await db_async(Run.objects.count)() == 1
    await comm.disconnect()


async def test_a_call_bound_to_the_trust_window_counts_its_speech_as_the_owner(voice_catalog: dict[str, Any], make_device: Any, brain: Any) -> None:
    speech = voice_catalog["speech"]
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    await start(comm)
    issued = int(time.time())
    signature = sim.sign(voice.trust_window_message(str(sim.device.id), "att-call", "face_id", issued))
    await comm.send_json_to({"type": "trust.open", "attestation_id": "att-call", "method": "face_id", "issued_at": issued, "signature": signature})
    await receive_until(comm, "trust.opened")
    await comm.send_json_to({"type": "call.start", "call_id": "call-7"})
    await receive_until(comm, "call.started")
    await comm.send_json_to({"type": "wake"})
    await receive_until(comm, "wake.ack")
    await stream(comm, speech.say(SENTENCES[3], GUEST_VOICE))  # no enrollment: the window vouches
    heard = await utterance(comm)
    assert (heard["speaker"]["scope"], heard["speaker"]["reason"], heard["call_id"]) == ("owner", "trust_window_call", "call-7")
    assert heard["learning"] == "not_enrolled"  # the window vouches for the call, never teaches an unenrolled voiceprint
    await comm.send_json_to({"type": "call.end", "call_id": "call-7"})
    await receive_until(comm, "call.ended")
    await comm.send_json_to({"type": "wake"})
    await receive_until(comm, "wake.ack")
    await stream(comm, speech.say(SENTENCES[4], GUEST_VOICE))
    after = await utterance(comm)
    assert after["speaker"]["reason"] == "no_voiceprint" and after["call_id"] is None
    await comm.disconnect()



@pytest.mark.django_db
def test_a_request_transcribed_by_the_server_becomes_a_run_with_its_utterance(voice_catalog: dict[str, Any], make_device: Any) -> None:
    """The server-ASR branch of the service (no ASR model exists on this machine, so the
    transcript the recognizer would return is passed in): entry, run and utterance record
    are stored together; a device transcript sent afterwards leaves the server's in place."""
    from voice import services as voice_services
    from yimi_project.errors import YimiError

    sim = make_device()
    session, _ = voice_services.open_session(sim.device, "phone_app")
    samples = np.concatenate([voice_catalog["speech"].say(SENTENCES[4]), silence(1.0)])
    utterances = session.feed(samples).utterances + session.finish().utterances
    assert len(utterances) == 1
    utt = utterances[0]
    session.open_request_window(utt.start_sample, 8.0)
    outcome = voice_services.handle_utterance(sim.device, session, utt, call=None, transcript=" Turn off the lights. ")
    record = outcome.record
    assert (record.disposition, record.transcript_source, record.transcript) == ("request", "server_asr", "Turn off the lights.")
    assert outcome.needs_transcript is False and outcome.accepted is not None
    run = Run.objects.select_related("inbound", "admission").get(id=outcome.accepted.run_id)
    assert run.inbound_id == record.entry_id and run.admission_id == record.admission_id and run.inbound.text == "Turn off the lights."
    again, accepted = voice_services.accept_device_transcript(sim.device, record.id.hex, "something else")
    assert accepted.duplicate is True and accepted.run_id == outcome.accepted.run_id
    assert (again.transcript_source, again.transcript) == ("server_asr", "Turn off the lights.")
    with pytest.raises(YimiError) as err:
        voice_services.accept_device_transcript(sim.device, record.id.hex, "")
    assert err.value.code == "invalid_frame"
