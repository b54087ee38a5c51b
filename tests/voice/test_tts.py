"""Spoken replies (voice/tts.py): a reply to a voice request is synthesized on the
server sentence by sentence as the checked reply streams, sent on /ws/voice/ as
``tts.audio`` frames tagged with the run id and sentence index; ``tts.played`` of the last
sentence counts as told; a barge-in stops synthesis and sending. espeak-ng is the real
embedded synthesizer; the speech endpoint is exercised against a local HTTP server that
speaks the OpenAI ``/audio/speech`` protocol."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest
from channels.testing import WebsocketCommunicator

from brain.models import Run
from devices.models import Delivery
from tests.conftest import db_async, use_brain
from tests.support import voice_support
from tests.support.voice_support import SENTENCES
from tests.voice.test_voice_session import open_voice, start, stream, utterance
from voice import tts

voice_assets = voice_support.voice_assets
voice_catalog = voice_support.voice_catalog

pytestmark = pytest.mark.django_db(transaction=True)


# --- a brain that waits where the test says -----------------------------------------------------------


class GatedBrain(ThreadingHTTPServer):
    """An OpenAI-compatible streaming Chat Completions server whose reply stops after
    ``before_gate`` until the test opens ``gate``: the test decides when the reply ends."""

    def __init__(self, before_gate: str, after_gate: str) -> None:
        self.before_gate, self.after_gate = before_gate, after_gate
        self.gate = threading.Event()
        super().__init__(("127.0.0.1", 0), _GatedHandler)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _GatedHandler(BaseHTTPRequestHandler):
    server: GatedBrain
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self._delta(self.server.before_gate)
        self.server.gate.wait(30)
        self._delta(self.server.after_gate)
        self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def _delta(self, text: str) -> None:
        self._event({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})

    def _event(self, payload: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk", **payload}).encode() + b"\n\n")
        self.wfile.flush()


def serve(server: ThreadingHTTPServer) -> Iterator[Any]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    if isinstance(server, GatedBrain):
        server.gate.set()
    server.shutdown()
    server.server_close()


FIRST = "The first sentence is here. "
REST_BEFORE_GATE = "The"
REST = " second one follows. And a third one ends it."


@pytest.fixture
def gated_brain(db: Any) -> Iterator[GatedBrain]:
    server = GatedBrain(FIRST + REST_BEFORE_GATE, REST)  # the held-back "The" lets the checker release sentence 0
    yield from serve(server)


# --- a speech endpoint (OpenAI /v1/audio/speech, raw PCM at 24 kHz) -------------------------------------


class SpeechServer(ThreadingHTTPServer):
    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, Any], str]] = []
        super().__init__(("127.0.0.1", 0), _SpeechHandler)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    @staticmethod
    def pcm_for(text: str) -> bytes:
        """0.05 s of a 24 kHz tone per character."""
        n = int(24000 * 0.05 * len(text))
        t = np.arange(n) / 24000
        return (np.sin(2 * np.pi * 300 * t) * 9000).astype("<i2").tobytes()


class _SpeechHandler(BaseHTTPRequestHandler):
    server: SpeechServer

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((body, self.headers.get("Authorization", "")))
        if self.path != "/v1/audio/speech" or body.get("response_format") != "pcm":
            self.send_response(400)
            self.end_headers()
            return
        data = SpeechServer.pcm_for(body["input"])
        self.send_response(200)
        self.send_header("Content-Type", "audio/pcm")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def speech_server(tmp_path: Any, settings: Any) -> Iterator[SpeechServer]:
    """The speech endpoint, and a master key of this test's own (the role's key is sealed)."""
    from llm import keyring

    settings.DATA_DIR, settings.SECRETS_DIR = tmp_path / "data", tmp_path / "secrets"
    settings.DATA_DIR.mkdir()
    settings.SECRETS_DIR.mkdir()
    keyring.ensure_master_key()
    yield from serve(SpeechServer())


def use_tts(base_url: str) -> None:
    from llm import roles

    roles.import_from_environment({})
    roles.apply("tts", provider="fake-tts", base_url=base_url, model="tts-test", options={"timeout_seconds": 10.0},
                api_key="sk-tts-test", source="console", note="the test's speech endpoint")


# --- helpers ----------------------------------------------------------------------------------------------


async def frames_until(comm: WebsocketCommunicator, *types: str, timeout: float = 20) -> list[dict[str, Any]]:
    """Every frame up to and including the first of ``types``."""
    out: list[dict[str, Any]] = []
    while True:
        frame = json.loads(await comm.receive_from(timeout=timeout))
        out.append(frame)
        if frame["type"] in types:
            return out


async def voice_request(comm: WebsocketCommunicator, speech: Any, text: str) -> dict[str, Any]:
    """Wake word, the owner's speech, the device's transcript: the run's ack."""
    await comm.send_json_to({"type": "wake"})
    await frames_until(comm, "wake.ack")
    await stream(comm, speech.say(text))
    heard = await utterance(comm)
    assert heard["disposition"] == "request" and heard["front"] is False
    await comm.send_json_to({"type": "voice.transcript", "id": "t", "utterance_id": heard["utterance_id"], "text": text})
    ack = (await frames_until(comm, "voice.transcript.ack"))[-1]
    assert ack["run_id"]
    return ack


def pcm_of(frames: list[dict[str, Any]], sentence: int) -> bytes:
    return b"".join(base64.b64decode(f["audio"]) for f in frames if f["type"] == "tts.audio" and f["sentence"] == sentence)


# --- the tests --------------------------------------------------------------------------------------------


async def test_a_voice_reply_is_spoken_sentence_by_sentence_first_sentence_before_the_reply_ends(
    voice_catalog: dict[str, Any], make_device: Any, gated_brain: GatedBrain
) -> None:
    await db_async(use_brain)(gated_brain.base_url)
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    started = await start(comm)
    assert (started["speech"], started["front"]) == ("espeak-ng", "off")
    ack = await voice_request(comm, voice_catalog["speech"], SENTENCES[1])

    # Sentence 0 is spoken while the brain is still holding the rest of its reply.
    before = await frames_until(comm, "tts.audio")
    first = before[-1]
    assert (first["run_id"], first["sentence"], first["part"], first["text"]) == (ack["run_id"], 0, 0, FIRST.strip())
    assert not any(f["type"] == "reply.done" for f in before)
    gated_brain.gate.set()
    after = await frames_until(comm, "tts.done")
    done = next(f for f in after if f["type"] == "reply.done")
    frames = [first, *after]
    audio = [f for f in frames if f["type"] == "tts.audio"]
    assert all(f["run_id"] == ack["run_id"] and f["sample_rate"] == 16000 and f["encoding"] == "pcm_s16le" for f in audio)
    order = [(f["sentence"], f["part"]) for f in audio]
    assert order == sorted(order) and {s for s, _ in order} == {0, 1, 2}
    assert [f["text"] for f in audio if f["part"] == 0] == ["The first sentence is here.", "The second one follows.", "And a third one ends it."]
    assert all(len(base64.b64decode(f["audio"])) <= tts.FRAME_BYTES for f in audio)
    for index in range(3):  # real speech: at least half a second of audible PCM per sentence
        samples = np.frombuffer(pcm_of(frames, index), dtype="<i2")
        assert samples.size >= 8000 and np.abs(samples).max() > 1000
    tts_done = after[-1]
    assert (tts_done["run_id"], tts_done["seq"], tts_done["sentences"]) == (ack["run_id"], done["seq"], 3)

    # played: only the last sentence played makes the reply (and its facts) told.
    await comm.send_json_to({"type": "tts.played", "id": "p0", "run_id": ack["run_id"], "sentence": 0})
    assert (await frames_until(comm, "tts.played.ack"))[-1]["told"] is False
    assert not await db_async(Delivery.objects.filter(status="played").exists)()
    await comm.send_json_to({"type": "tts.played", "id": "p2", "run_id": ack["run_id"], "sentence": 2})
    assert (await frames_until(comm, "tts.played.ack"))[-1]["told"] is True
    assert await db_async(Delivery.objects.filter(status="played", entry__seq=done["seq"], device=sim.device).exists)()
    await comm.disconnect()


async def test_bad_tts_played_frames_get_a_stable_code(voice_catalog: dict[str, Any], make_device: Any, gated_brain: GatedBrain) -> None:
    gated_brain.gate.set()
    await db_async(use_brain)(gated_brain.base_url)
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    await start(comm)
    ack = await voice_request(comm, voice_catalog["speech"], SENTENCES[1])
    await frames_until(comm, "tts.done")
    for frame, code in [
        ({"type": "tts.played", "run_id": str(uuid.uuid4()), "sentence": 0}, "unknown_run"),
        ({"type": "tts.played", "run_id": ack["run_id"], "sentence": 3}, "invalid_frame"),
        ({"type": "tts.played", "run_id": ack["run_id"], "sentence": True}, "invalid_frame"),
        ({"type": "tts.played", "run_id": 7, "sentence": 0}, "unknown_run"),
    ]:
        await comm.send_json_to(frame)
        error = (await frames_until(comm, "error"))[-1]
        assert error["code"] == code, (frame, error)
    assert not await db_async(Delivery.objects.exists)()
    await comm.disconnect()


async def test_barge_in_stops_synthesis_and_sending_at_once(
    voice_catalog: dict[str, Any], make_device: Any, gated_brain: GatedBrain
) -> None:
    await db_async(use_brain)(gated_brain.base_url)
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    await start(comm)
    ack = await voice_request(comm, voice_catalog["speech"], SENTENCES[1])
    await frames_until(comm, "tts.audio")
    await comm.send_json_to({"type": "playback", "state": "start"})
    await comm.send_json_to({"type": "tts.stop"})  # the device heard the owner talk over Yimi
    stopped = (await frames_until(comm, "tts.stopped"))[-1]
    assert (stopped["run_id"], stopped["reason"]) == (ack["run_id"], "barge_in")
    gated_brain.gate.set()  # the reply ends: its text still arrives, nothing more is spoken
    after = await frames_until(comm, "reply.done")
    await comm.send_json_to({"type": "ping", "id": "last"})
    after += await frames_until(comm, "pong")
    assert not any(f["type"] in ("tts.audio", "tts.done") for f in after), after
    await comm.send_json_to({"type": "tts.played", "id": "p", "run_id": ack["run_id"], "sentence": 0})
    assert (await frames_until(comm, "tts.played.ack"))[-1]["told"] is False  # an interrupted reply is not told
    assert not await db_async(Delivery.objects.exists)()
    await comm.disconnect()


async def test_a_new_request_stops_the_reply_being_spoken(voice_catalog: dict[str, Any], make_device: Any, gated_brain: GatedBrain) -> None:
    await db_async(use_brain)(gated_brain.base_url)
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    await start(comm)
    ack = await voice_request(comm, voice_catalog["speech"], SENTENCES[1])
    await frames_until(comm, "tts.audio")
    await comm.send_json_to({"type": "wake"})
    await stream(comm, voice_catalog["speech"].say(SENTENCES[3]))
    frames = await frames_until(comm, "voice.utterance")
    assert frames[-1]["disposition"] == "request"
    stopped = next(f for f in frames if f["type"] == "tts.stopped")  # stopped before the new request is announced
    assert (stopped["run_id"], stopped["reason"]) == (ack["run_id"], "new_request")
    gated_brain.gate.set()
    await comm.disconnect()


def test_speech_endpoint_synthesizes_pcm_over_real_http(speech_server: SpeechServer, db: Any) -> None:
    use_tts(speech_server.base_url)
    synth, problem = tts.synthesizer()
    assert problem is None and isinstance(synth, tts.SpeechEndpoint)
    pcm = asyncio.run(synth.synthesize("Hello there."))
    body, auth = speech_server.requests[-1]
    assert body == {"model": "tts-test", "input": "Hello there.", "voice": "alloy", "response_format": "pcm"}
    assert auth == "Bearer sk-tts-test"
    expected = len(SpeechServer.pcm_for("Hello there.")) // 2 * 16000 // 24000
    assert abs(len(pcm) // 2 - expected) <= 2  # 24 kHz resampled to the socket's 16 kHz


async def test_a_voice_reply_is_spoken_by_the_configured_speech_endpoint(
    voice_catalog: dict[str, Any], make_device: Any, speech_server: SpeechServer, gated_brain: GatedBrain
) -> None:
    gated_brain.gate.set()
    await db_async(use_brain)(gated_brain.base_url)
    await db_async(use_tts)(speech_server.base_url)
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    assert (await start(comm))["speech"] == "speech_endpoint"
    ack = await voice_request(comm, voice_catalog["speech"], SENTENCES[1])
    frames = await frames_until(comm, "tts.done")
    assert [f["text"] for f in frames if f["type"] == "tts.audio" and f["part"] == 0] == [
        "The first sentence is here.", "The second one follows.", "And a third one ends it."]
    assert [b["input"] for b, _ in speech_server.requests] == [f["text"] for f in frames if f["type"] == "tts.audio" and f["part"] == 0]
    assert frames[-1]["run_id"] == ack["run_id"] and await db_async(Run.objects.count)() == 1
    await comm.disconnect()


def test_speech_endpoint_failure_is_tts_failed(db: Any) -> None:
    synth = tts.SpeechEndpoint("http://127.0.0.1:9/v1", "m", None, voice="v", source_rate=24000, timeout=2, connect_timeout=1)
    with pytest.raises(Exception) as err:
        asyncio.run(synth.synthesize("Hello."))
    assert getattr(err.value, "code", None) == "tts_failed"


def test_resampling_in_pieces_equals_resampling_at_once() -> None:
    rng = np.random.default_rng(1)
    pcm = (rng.standard_normal(24000) * 3000).astype("<i2").tobytes()
    whole = tts.Resampler(24000, 16000).feed(pcm)
    pieced = tts.Resampler(24000, 16000)
    parts = b"".join(pieced.feed(pcm[i : i + 1234]) for i in range(0, len(pcm), 1234))
    assert abs(len(whole) - 32000) <= 4 and abs(len(parts) - len(whole)) <= 4
    n = min(len(whole), len(parts)) // 2
    assert np.array_equal(np.frombuffer(whole, "<i2")[:n], np.frombuffer(parts, "<i2")[:n])


def test_espeak_speaks_chinese_and_english_as_16khz_pcm() -> None:
    synth = tts.Espeak()
    for text in ("你好，我是依米。", "Hello, I am Yimi."):
        samples = np.frombuffer(asyncio.run(synth.synthesize(text)), dtype="<i2")
        assert 8000 <= samples.size <= 16000 * 5 and np.abs(samples).max() > 1000


def test_long_sentences_are_cut_for_synthesis() -> None:
    text = "word " * 200 + "end. Short one."
    pieces = tts.speakable(text)
    assert all(len(p) <= tts.MAX_SENTENCE_CHARS for p in pieces) and pieces[-1] == "Short one."
    assert " ".join(pieces).split() == text.split()
