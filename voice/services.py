"""What each utterance becomes: the only code that writes ``VoiceUtterance``.

Identity facts are accounts' (``accounts.voice``, ``accounts.voiceprint``); runs are the
brain's (``brain.services.accept_voice_utterance``). This module orders the steps and
records the utterance with its source.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from accounts import voice as identity
from accounts import voiceprint
from accounts.models import Device, VoiceCall
from accounts.voice import SpeakerDecision
from accounts.voiceprint import EnrollmentSegment, LearningOutcome
from brain.models import Run
from brain.services import AcceptedUtterance, accept_voice_utterance
from llm import model_settings
from voice import asr as voice_asr
from voice import config, engines
from voice.models import VoiceUtterance
from voice.session import Utterance, VoiceSession
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

Disposition = VoiceUtterance.Disposition


# --- opening a session ---------------------------------------------------------------------------


@dataclass
class SessionStatus:
    transcription: str  # "server" | "unavailable"
    wake_word: str  # "server" | "device"
    voiceprint: str  # "available" | "unavailable"
    problems: dict[str, str] = field(default_factory=dict)  # kind → error code
    transcription_engine: str | None = None  # "sherpa-onnx" | "faster-whisper" | "remote"


def open_session(device: Device, channel: Any, mode: Any = "normal") -> tuple[VoiceSession, SessionStatus]:
    """Build a session for one capture channel of this device.

    Steps: 1. the channel is one the device declared at pairing; 2. the VAD model this
    process runs (required: without it nothing can be segmented); 3. the effective
    voiceprint model (identity) and the selected one (enrollment); 4. speech recognition:
    the ``asr_remote`` role when configured, else the catalog's ASR model
    (``voice.asr``); the wake-word model when the catalog selects one. Models that fail their checks are reported
    on the settings page and the session runs without them (except VAD).
    """
    if not isinstance(channel, str) or not voiceprint.CHANNEL_NAME.match(channel):
        raise YimiError("invalid_frame", "channel: a capture channel name like phone_app, glasses, mac")
    if device.capture_channels and channel not in device.capture_channels:
        raise YimiError("unknown_channel", f"this device was paired with the capture channels {', '.join(device.capture_channels)}")
    if mode not in identity.MODES:
        raise YimiError("invalid_frame", f"mode must be one of {', '.join(identity.MODES)}")
    problems: dict[str, str] = {}

    def load(kind: str, make: Any, entry: Any) -> Any:
        if entry is None:
            return None
        try:
            engine = make(entry)
        except YimiError as exc:
            model_settings.note_error(kind, exc)
            problems[kind] = exc.code
            log_event("voice_model_unavailable", kind=kind, error_code=exc.code)
            return None
        if kind in model_settings.RESTART_KINDS:
            model_settings.confirm_loaded(kind, entry)
        return engine

    vad = load("vad", engines.voice_activity_detector, model_settings.process_model("vad"))
    if vad is None:
        raise YimiError(
            "vad_unavailable",
            "no usable voice activity model: add a Silero VAD model to the local catalog "
            + (f"({problems['vad']})" if "vad" in problems else ""),
        )
    embedder = load("voiceprint", engines.speaker_embedder, model_settings.effective_entry("voiceprint"))
    selected = model_settings.selected_entry("voiceprint")
    enroll_embedder = embedder
    if selected is not None and (embedder is None or selected.key != embedder.model_key):
        enroll_embedder = load("voiceprint", engines.speaker_embedder, selected)
    asr: voice_asr.Recognizer | None = voice_asr.remote_transcriber(problems)
    if asr is None:
        asr = load("asr", engines.transcriber, model_settings.process_model("asr"))
    spotter = load("wake_word", engines.wake_word_spotter, model_settings.process_model("wake_word"))
    session = VoiceSession(
        channel=channel, vad=vad, embedder=embedder, enroll_embedder=enroll_embedder, transcriber=asr,
        wake_stream=spotter.new_stream() if spotter is not None else None, mode=mode,
    )
    status = SessionStatus(
        transcription="server" if asr is not None else "unavailable",
        transcription_engine=asr.engine if asr is not None else None,
        wake_word="server" if spotter is not None else "device",
        voiceprint="available" if embedder is not None else "unavailable",
        problems=problems,
    )
    return session, status


# --- one utterance ---------------------------------------------------------------------------------


@dataclass
class UtteranceOutcome:
    record: VoiceUtterance
    decision: SpeakerDecision
    accepted: AcceptedUtterance | None = None
    learning: LearningOutcome | None = None

    @property
    def needs_transcript(self) -> bool:
        return self.record.disposition == Disposition.REQUEST and self.record.entry_id is None


def handle_utterance(
    device: Device,
    session: VoiceSession,
    utt: Utterance,
    *,
    call: VoiceCall | None,
    transcript: str | None,
) -> UtteranceOutcome:
    """Decide who spoke and what the utterance becomes.

    Steps: 1. speech overlapping Yimi's own playback is judged in barge-in mode (never
    through the trust window); 2. ``decide_speaker`` sets the scope; 3. speech inside an
    open trust window may become a learning sample (not echo, normal mode); 4. the
    disposition: during playback, the owner barging in is a request and anything else
    is echo; otherwise speech overlapping a request window (wake word or follow-up) is a
    request and everything else is ambient — recorded with its source, never a request;
    5. a request with a server transcript becomes a timeline entry and a run, in the
    same transaction that records the utterance; without one it waits for the device's
    transcript (``accept_device_transcript``).
    """
    during_playback = session.during_playback(utt)
    mode = "barge_in" if during_playback and session.mode == "normal" else session.mode
    decision = identity.decide_speaker(
        device=device, embedding=utt.embedding, model_key=utt.model_key, voiced_ms=utt.voiced_ms,
        started_at=utt.started_at, call=call, mode=mode,
    )
    learning = None
    if utt.embedding is not None:
        learning = identity.learn_in_trust_window(
            device=device, channel=session.channel, embedding=utt.embedding, model_key=utt.model_key,
            voiced_ms=utt.voiced_ms, quality=utt.quality, started_at=utt.started_at, mode=mode, echo=during_playback,
        )
    if during_playback:
        disposition = Disposition.REQUEST if decision.is_owner else Disposition.ECHO
    else:
        disposition = Disposition.REQUEST if session.in_request_window(utt) else Disposition.AMBIENT
    text = (transcript or "").strip() if disposition == Disposition.REQUEST else ""
    with transaction.atomic():
        record = VoiceUtterance.objects.create(
            id=uuid.UUID(utt.id), owner_id=device.owner_id, device=device, channel=session.channel, call=call, mode=mode,
            started_at=utt.started_at, stream_start_ms=utt.start_ms, stream_end_ms=utt.end_ms, voiced_ms=utt.voiced_ms,
            quality=utt.quality, voiceprint_model=utt.model_key, band=decision.band, score=decision.score,
            scope=decision.scope, reason=decision.reason, disposition=disposition,
            transcript=text if transcript else "",
            transcript_source=VoiceUtterance.TranscriptSource.SERVER if text else "",
        )
        accepted = None
        if text:
            accepted = accept_voice_utterance(device, client_id(record), text, scope=decision.scope, reason=decision.reason)
            VoiceUtterance.objects.filter(id=record.id).update(entry=accepted.entry, admission_id=_admission_id(accepted))
            record.refresh_from_db()
    log_event(
        "voice_utterance", device_id=str(device.id), channel=session.channel, disposition=disposition,
        scope=decision.scope, reason=decision.reason, voiced_ms=utt.voiced_ms,
    )
    return UtteranceOutcome(record, decision, accepted, learning)


def client_id(record: VoiceUtterance) -> str:
    """The timeline client id of a spoken request: its utterance id, so it is stored once."""
    return f"voice-{record.id.hex}"


def _admission_id(accepted: AcceptedUtterance) -> Any:
    return Run.objects.filter(id=accepted.run_id).values_list("admission_id", flat=True).first()


def accept_device_transcript(device: Device, utterance_id: Any, text: Any) -> tuple[VoiceUtterance, AcceptedUtterance]:
    """Turn a spoken request into a run with the text the device transcribed itself.

    Used when the server has no transcript of its own (no ASR engine, or it failed). The
    speaker — hence the scope — was decided by the server from the audio; the device
    supplies only the words, and the utterance is marked ``transcript_source = device``.
    Steps: 1. the text is non-empty and within the text limit; 2. the utterance is this
    device's and a request; 3. the server transcribed it already: the server's transcript
    wins — the stored entry and run are returned (``duplicate``) and the difference is
    logged (lengths and a similarity, never the words); 4. it is at most 60 s old
    (``VOICE_TRANSCRIPT_WAIT_SECONDS``); 5. in one transaction: entry + run (idempotent by
    the utterance id), then claim the utterance with a conditional UPDATE ``entry IS
    NULL``. A resend returns the stored entry and run with ``duplicate``.
    """
    if not isinstance(text, str) or not text.strip():
        raise YimiError("invalid_frame", "text must be a non-empty string")
    if len(text) > settings.WS_MAX_TEXT_CHARS:
        raise YimiError("text_too_long", f"text is limited to {settings.WS_MAX_TEXT_CHARS} characters")
    try:
        key = uuid.UUID(str(utterance_id))
    except ValueError:
        raise YimiError("unknown_utterance", "there is no such utterance") from None
    record = VoiceUtterance.objects.filter(id=key, device=device).first()
    if record is None:
        raise YimiError("unknown_utterance", "there is no such utterance on this device")
    if record.disposition != Disposition.REQUEST:
        raise YimiError("not_a_request", f"this utterance was {record.disposition}, not a request; it never becomes a run")
    if record.transcript_source == VoiceUtterance.TranscriptSource.SERVER and record.entry_id is not None:
        accepted = accept_voice_utterance(device, client_id(record), record.transcript, scope=record.scope, reason=record.reason)
        log_event("voice_transcripts_compared", utterance_id=record.id.hex, used="server", **voice_asr.compare_transcripts(record.transcript, text.strip()))
        return record, accepted
    if record.entry_id is None and timezone.now() - record.created_at > timedelta(seconds=config.transcript_wait_seconds()):
        raise YimiError("transcript_too_late", "the transcript came too late; ask again")
    with transaction.atomic():
        accepted = accept_voice_utterance(device, client_id(record), text.strip(), scope=record.scope, reason=record.reason)
        if not accepted.duplicate:
            claimed = VoiceUtterance.objects.filter(id=record.id, entry=None).update(
                entry=accepted.entry, admission_id=_admission_id(accepted), transcript=text.strip(),
                transcript_source=VoiceUtterance.TranscriptSource.DEVICE,
            )
            if claimed != 1:
                raise YimiError("conflict", "this utterance was transcribed meanwhile")
    record.refresh_from_db()
    return record, accepted


def accept_front_handoff(device: Device, utterance_id: Any, text: Any, *, thinking: bool) -> AcceptedUtterance:
    """The realtime front handed a spoken request to the brain (``handoff_to_brain``): the
    utterance becomes a run with the handoff's ``thinking`` as the turn's thinking switch.

    Steps: 1. the text (the server's transcript, else the front's, else the handoff's
    intent — the caller chooses) is non-empty and within the text limit; 2. the utterance
    is this device's and a request; 3. a guest's turn never hands off
    (``handoff_refused``: nothing is written); 4. in one transaction: entry + run
    (idempotent by the utterance id), then claim the utterance with a conditional UPDATE
    ``entry IS NULL``, marking its transcript as the server's (the front is a server-side
    model). A second handoff for the same utterance returns the stored run, ``duplicate``.
    """
    if not isinstance(text, str) or not text.strip():
        raise YimiError("invalid_frame", "the handoff has no text")
    text = text.strip()[: settings.WS_MAX_TEXT_CHARS]
    try:
        key = uuid.UUID(str(utterance_id))
    except ValueError:
        raise YimiError("unknown_utterance", "there is no such utterance") from None
    record = VoiceUtterance.objects.filter(id=key, device=device).first()
    if record is None:
        raise YimiError("unknown_utterance", "there is no such utterance on this device")
    if record.disposition != Disposition.REQUEST:
        raise YimiError("not_a_request", f"this utterance was {record.disposition}, not a request; it never becomes a run")
    if record.scope == "guest":
        raise YimiError("handoff_refused", "a guest's turn is answered by the front; it never reaches the brain")
    with transaction.atomic():
        accepted = accept_voice_utterance(
            device, client_id(record), text, scope=record.scope, reason=record.reason, thinking=thinking
        )
        if not accepted.duplicate:
            VoiceUtterance.objects.filter(id=record.id, entry=None).update(
                entry=accepted.entry, admission_id=_admission_id(accepted), transcript=text,
                transcript_source=VoiceUtterance.TranscriptSource.SERVER,
            )
    log_event("voice_front_handoff", device_id=str(device.id), thinking=thinking, duplicate=accepted.duplicate)
    return accepted


# --- enrollment over the voice socket --------------------------------------------------------------


def commit_enrollment(device: Device, channel: str, utterances: list[Utterance]) -> Any:
    """Enroll the owner's voice on ``channel`` from utterances collected in enrollment mode.

    Steps: 1. only an owner device with an open trust window (Face ID / Touch ID just now)
    may enroll; 2. the utterances must all carry embeddings of the selected voiceprint
    model; 3. ``accounts.voiceprint.enroll_channel`` applies the rules (1,500 ms, 5-20,
    leave-one-out) and writes nothing if one fails; 4. a pending voiceprint switch is
    settled (it becomes effective once every channel in use is enrolled again).
    """
    require_trust_window(device)
    keys = {u.model_key for u in utterances if u.embedding is not None}
    if any(u.embedding is None for u in utterances) or len(keys) > 1:
        raise YimiError("voiceprint_unavailable", "some segments have no voiceprint embedding; no voiceprint model is usable")
    selected = model_settings.selected_entry("voiceprint")
    if selected is None or (keys and keys != {selected.key}):
        raise YimiError("voiceprint_unavailable", "no voiceprint model is selected in the local catalog")
    segments = [EnrollmentSegment(u.embedding.tolist(), u.voiced_ms, u.quality) for u in utterances if u.embedding is not None]
    enrollment = voiceprint.enroll_channel(device.owner_id, channel, selected.key, segments)
    model_settings.settle_voiceprint_switch(device.owner_id)
    return enrollment


def require_trust_window(device: Device) -> None:
    if device.is_guest:
        raise YimiError("forbidden", "a guest device cannot enroll a voiceprint")
    if identity.open_window_at(device, timezone.now()) is None:
        raise YimiError("trust_window_required", "confirm with Face ID or Touch ID first (trust.open), then enroll")

