"""The voice websocket, ``/ws/voice/`` (docs/voice.md).

Same handshake as ``/ws/device/`` (challenge → ``auth`` signed by the device key → ready),
then one capture channel's audio: binary frames of 16 kHz, 16-bit, mono PCM, and JSON
control frames. Thin like the device socket: it checks frames, runs the audio models off
the event loop, and calls services. Replies come back as text through the device's
channel group (``reply.chunk`` / ``reply.done``) and are ACKed ``played``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.utils import timezone

from accounts import devices as device_identity
from accounts import voice as identity
from accounts.models import VoiceCall
from brain.dispatch import dispatch_run
from companion import events as call_events
from companion import snapshot as call_snapshot
from companion.tasks import dispatch_call_summary
from devices import push_to_talk
from devices.consumers.device import DeviceConsumer
from llm import roles
from memory.archive import raw_store
from memory.personal.ambient import AmbientSource
from voice import ambient, asr, audio, config, realtime, tts
from voice import services as voice_services
from voice.services import SessionStatus
from voice.session import SAMPLE_RATE, StreamOutput, Utterance, VoiceSession, ms
from yimi_project import push
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

DEVICE_RECHECK_SECONDS = 1.0
ARCHIVE_MAX_PENDING = 64  # archive batches being written before a socket waits (about 32 s of audio)


class VoiceConsumer(DeviceConsumer):
    session: VoiceSession | None = None
    status: SessionStatus | None = None
    call: VoiceCall | None = None
    enrollment: list[Utterance] | None = None
    speaker: tts.ReplySpeaker | None = None  # speaks the replies of runs started here (voice/tts.py)
    front: realtime.RealtimeFront | None = None  # the realtime front, when configured (voice/realtime.py)
    _checked_at: float | None = None  # when an audio frame last re-checked the device (None: none has yet)
    _audio_heard: bool = False  # the open call's first played audio was recorded (brain.call_events)
    archive: raw_store.ArchiveBatcher | None = None  # the stream's archive batches (memory/archive/raw_store.py), owner devices only

    # The clock of the audio frames' device re-check (tests replace it).
    recheck_clock = staticmethod(time.monotonic)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fronted: set[str] = set()  # utterances given to the realtime front (no device transcript for them)
        self._archive_lock = asyncio.Lock()  # one archive write at a time, in stream order
        self._archive_timer: asyncio.TimerHandle | None = None
        self._archive_refused: list[tuple[int, int, str]] = []  # stream sample ranges not stored, and why (error code)
        self._archive_capture: raw_store.Capture | None = None
        self._archive_tasks: set[asyncio.Task[None]] = set()  # batches being written
        self._ptt_recorded: str | None = None  # the session whose push-to-talk hold is recorded (devices.push_to_talk)

    # --- frames ------------------------------------------------------------------------------

    async def _receive_binary(self, data: bytes) -> None:
        """Audio. Text frames, and the last-resort handler for both, are ``DeviceConsumer``'s
        (``receive``, ``parse_frame``)."""
        await self._on_audio(data)

    async def disconnect(self, code: int) -> None:
        if self.call is not None:
            await self._hang_up(self.call)
            self.call = None
        self._end_analysis()
        await self._end_push_to_talk()
        await self._end_archive(reply=False)
        self.session = None
        await self._end_speech("session_end")
        await super().disconnect(code)

    async def _on_audio(self, frame: bytes) -> None:
        if self.device is None:
            await self._error("not_authenticated", "the first frame must be auth")
            await self.close(code=4401)
            return
        if self.session is None:
            await self._error("voice_not_started", "send voice.start before audio")
            return
        try:
            samples = audio.pcm_to_float(frame, max_bytes=config.max_audio_frame_bytes())
            # Audio frames re-check the device at most every DEVICE_RECHECK_SECONDS (tens of
            # frames a second); every text frame re-checks it (DeviceConsumer._receive_text).
            now = self.recheck_clock()
            if self._checked_at is None or now - self._checked_at >= DEVICE_RECHECK_SECONDS:
                self.device = await database_sync_to_async(device_identity.active_device)(self.device.id)
                self._checked_at = now
        except YimiError as exc:
            if exc.code == "device_revoked":
                await self._close_revoked()
                return
            await self._error(exc.code, exc.message)
            return
        await self._archive_frame(frame)
        output = await sync_to_async(self.session.feed, thread_sensitive=False)(samples)
        await self._process(output)

    # --- the archive (L5 hot store, memory/archive/raw_store.py) ------------------------------------------

    def _open_archive(self) -> None:
        """An owner device's stream is archived as it arrives; a guest's is not kept."""
        assert self.session is not None and self.device is not None
        self.archive, self._archive_refused = None, []
        if self.device.is_guest:
            return
        self.archive = raw_store.ArchiveBatcher(clock=time.monotonic)
        self._archive_capture = raw_store.Capture(self.device.owner_id, self.device.id, self.session.channel, self.device.name)

    async def _archive_frame(self, frame: bytes) -> None:
        """Add one frame; write the batch a threshold completed, or make sure the time
        threshold writes it even if no frame follows. Writes run beside the live path (a
        task each, in order under ``_archive_lock``): a slow disk or a reclaim does not hold
        up speech detection. Only beyond ``ARCHIVE_MAX_PENDING`` batches waiting does the
        socket wait for the oldest (bounded memory)."""
        if self.archive is None:
            return
        batch = self.archive.add(frame)
        if batch is not None:
            self._spawn_store(batch)
            while len(self._archive_tasks) > ARCHIVE_MAX_PENDING:
                await asyncio.wait(set(self._archive_tasks), return_when=asyncio.FIRST_COMPLETED)
        elif self._archive_timer is None and (left := self.archive.seconds_left()) is not None:
            self._archive_timer = asyncio.get_running_loop().call_later(left, self._archive_due)

    def _spawn_store(self, batch: raw_store.Batch) -> None:
        task = asyncio.get_running_loop().create_task(self._store_batch(batch))
        self._archive_tasks.add(task)
        task.add_done_callback(self._archive_tasks.discard)

    def _archive_due(self) -> None:
        self._archive_timer = None
        if self.archive is not None and (batch := self.archive.due()) is not None:
            self._spawn_store(batch)
        elif self.archive is not None and (left := self.archive.seconds_left()) is not None:
            self._archive_timer = asyncio.get_running_loop().call_later(left, self._archive_due)

    async def _store_batch(self, batch: raw_store.Batch, *, reply: bool = True) -> None:
        """Write one batch durably. Not stored — refused by disk admission (``storage_full``)
        or failed (``internal_error``, logged) — the range is remembered (its speech is not
        analysed) and the device is told in an ``error`` frame (``original``: what was not
        stored; ``seq``: the timeline entry that says so, null when a recent one already
        did or none was written)."""
        assert self._archive_capture is not None
        session_id = self.session.id if self.session is not None else ""
        async with self._archive_lock:
            try:
                await database_sync_to_async(raw_store.store_batch)(self._archive_capture, batch, stream=session_id)
                return
            except YimiError as exc:
                if exc.code != "storage_full":
                    raise
                code, message, seq, reason = exc.code, exc.message, exc.details.get("seq"), exc.details.get("reason")
            except Exception as exc:  # noqa: BLE001 - a failed write is said, never passed over as stored
                log_event("raw_batch_failed", logging.ERROR, error=type(exc).__name__)
                code, message, seq, reason = "internal_error", "the server failed writing this audio: it was not stored", None, None
            keep_from = batch.start_sample - 120 * SAMPLE_RATE  # no utterance reaches further back
            self._archive_refused = [r for r in self._archive_refused if r[1] > keep_from]
            self._archive_refused.append((batch.start_sample, batch.end_sample, code))
            if reply:
                await self._send({
                    "type": "error", "code": code, "message": message, "seq": seq,
                    "original": {"kind": "audio", "start_ms": ms(batch.start_sample), "end_ms": ms(batch.end_sample),
                                 "stored": False, "reason": reason},
                })

    async def _archived_through(self, start: int, end: int) -> str | None:
        """Wait until the stream up to sample ``end`` is written (the batch holding it is
        written now, not at its threshold); None when ``[start, end)`` was stored, else the
        error code of the part that was not. Without an archive (a guest device) None."""
        if self.archive is None:
            return None
        if self.archive.position < end and (batch := self.archive.flush()) is not None:
            self._spawn_store(batch)
        if self._archive_tasks:  # every batch cut so far, in order
            await asyncio.gather(*self._archive_tasks, return_exceptions=True)
        return next((code for s, e, code in self._archive_refused if s < end and start < e), None)

    async def _end_archive(self, *, reply: bool = True) -> None:
        if self._archive_timer is not None:
            self._archive_timer.cancel()
            self._archive_timer = None
        archive, self.archive = self.archive, None
        if archive is not None and (batch := archive.flush()) is not None:
            await self._store_batch(batch, reply=reply)
        if self._archive_tasks:
            await asyncio.gather(*self._archive_tasks, return_exceptions=True)

    async def _process(self, output: StreamOutput) -> None:
        assert self.session is not None and self.device is not None
        for position, keyword in output.wake_words:
            _, until = self.session.open_request_window(position, config.request_window_seconds())
            await self._send({"type": "wake.detected", "at_ms": ms(position), "keyword": keyword, "window_until_ms": ms(until)})
        for utt in output.utterances:
            if self.enrollment is not None:
                self.enrollment.append(utt)
                await self._send(
                    {"type": "enroll.segment", "utterance_id": utt.id, "voiced_ms": utt.voiced_ms, "quality": utt.quality,
                     "segments": len(self.enrollment), "embedded": utt.embedding is not None}
                )
                continue
            await self._handle_utterance(utt)

    async def _handle_utterance(self, utt: Utterance) -> None:
        session, device = self.session, self.device
        assert session is not None and device is not None
        heard = asr.Heard()
        if session.in_request_window(utt) or session.during_playback(utt):
            ambient.analysis.scheduler.hold(f"request:{utt.id}")  # ambient analysis waits for a request's words
            try:
                heard = await asr.hear(session.transcriber, utt.samples)  # off the event loop, bounded
            finally:
                ambient.analysis.scheduler.release(f"request:{utt.id}")
        transcript = heard.text
        # With the realtime front, a request goes to the front first: no run until it hands off.
        front = self.front if self.front is not None and self.front.open_now else None
        try:
            outcome = await database_sync_to_async(voice_services.handle_utterance)(
                device, session, utt, call=self.call, transcript=None if front else transcript
            )
        except YimiError as exc:
            await self._error(exc.code, exc.message)
            return
        record, decision = outcome.record, outcome.decision
        body: dict[str, Any] = {
            "type": "voice.utterance",
            "utterance_id": utt.id,
            "start_ms": utt.start_ms,
            "end_ms": utt.end_ms,
            "voiced_ms": utt.voiced_ms,
            "quality": utt.quality,
            "call_id": self.call.call_id if self.call else None,
            "speaker": {"scope": decision.scope, "reason": decision.reason, "band": decision.band or None,
                        "score": round(decision.score, 4) if decision.score is not None else None},
            "disposition": record.disposition,
            "transcription": "failed" if heard.error else "server" if session.transcriber is not None else "unavailable",
            "transcription_error": heard.error.code if heard.error else None,
            "transcript": record.transcript or None,
            "needs_transcript": outcome.needs_transcript,
            "learning": outcome.learning.reason if outcome.learning else None,
            "seq": outcome.accepted.entry.seq if outcome.accepted else None,
            "run_id": str(outcome.accepted.run_id) if outcome.accepted else None,
        }
        body["ambient"] = await self._analyse_ambient(utt, outcome) if record.disposition == "ambient" else None
        fronted = front is not None and record.disposition == "request" and outcome.accepted is None
        body["front"] = fronted
        if fronted:
            body["needs_transcript"] = False
        if record.disposition == "request":  # the owner spoke again: what Yimi was saying stops at once
            await self._stop_speech("barge_in" if session.during_playback(utt) else "new_request")
        await self._send(body)
        if heard.error is not None and body["needs_transcript"]:
            # Not lost: the device's own transcript is still accepted; without one, this is what to say.
            await self._send({"type": "voice.notice", "utterance_id": utt.id, "code": heard.error.code, "text": asr.NOTICE_TEXT})
        if fronted and front is not None:
            self._fronted.add(utt.id)
            await front.turn(realtime.FrontTurn(utt.id, decision.scope, transcript or ""), utt.samples)
        if outcome.accepted is not None and not outcome.accepted.duplicate:
            await self._start_run(outcome.accepted.run_id, outcome.accepted.entry.seq)
        ambient.analysis.kick()

    async def _analyse_ambient(self, utt: Utterance, outcome: Any) -> dict[str, Any]:
        """Ambient speech goes to the process's bounded analysis (voice/ambient.py)
        when the session has a server ASR engine, and only once its original is durably
        archived (memory/archive/raw_store.py); what ``voice.utterance`` says of it: ``analysis``
        ``queued`` (with ``chunks`` and ``dropped``), ``refused`` (with ``code``:
        ``storage_full`` when its original was not stored), or ``off`` (no engine, or a
        guest device: nothing is transcribed)."""
        session, device = self.session, self.device
        assert session is not None and device is not None
        if session.transcriber is None or device.is_guest:
            return {"analysis": "off"}
        if (not_stored := await self._archived_through(utt.start_sample, utt.end_sample)) is not None:
            return {"analysis": "refused", "code": not_stored}
        record, decision = outcome.record, outcome.decision
        source = AmbientSource(device.id, device.name, session.channel, record.id, decision.scope, decision.reason)
        work = ambient.AmbientWork(session.transcriber, device.owner_id, source, utt.start_sample, utt.started_at)
        try:
            submitted = ambient.analysis.scheduler.submit(session.id, utt.start_sample, utt.samples, work)
        except YimiError as exc:
            return {"analysis": "refused", "code": exc.code}
        return {"analysis": "queued", "chunks": len(submitted.queued), "dropped": len(submitted.dropped)}

    async def _end_push_to_talk(self) -> None:
        """Drop the recorded push-to-talk hold, if any (key up, voice.stop, socket closed)."""
        if self._ptt_recorded is not None:
            session_id, self._ptt_recorded = self._ptt_recorded, None
            await database_sync_to_async(push_to_talk.release)(session_id)

    def _end_analysis(self) -> None:
        """The stream ended: its analysis slot is free, a call's hold is released."""
        if self.session is not None:
            scheduler = ambient.analysis.scheduler
            scheduler.close_stream(self.session.id)
            scheduler.release(f"call:{self.session.id}")
            scheduler.release(f"ptt:{self.session.id}")
            ambient.analysis.kick()  # another stream's chunks may go on now

    async def _start_run(self, run_id: Any, seq: int) -> None:
        assert self.device is not None
        if self.speaker is not None:
            self.speaker.expect(run_id)  # a reply to a voice request is spoken
        await dispatch_run(run_id)
        await push.to_owner(self.device.owner_id, {"type": "timeline.new", "seq": seq})

    # --- control frames ----------------------------------------------------------------------

    def _need_session(self) -> VoiceSession:
        if self.session is None:
            raise YimiError("voice_not_started", "send voice.start first")
        return self.session

    def _position(self, frame: dict[str, Any]) -> int:
        """``at_ms`` (stream time, optional) as a sample position; default: now."""
        session = self._need_session()
        at_ms = frame.get("at_ms")
        if at_ms is None:
            return session.position
        if isinstance(at_ms, bool) or not isinstance(at_ms, int) or not 0 <= at_ms <= ms(session.position) + 1000:
            raise YimiError("invalid_frame", "at_ms must be a stream time in milliseconds, not in the future")
        return at_ms * SAMPLE_RATE // 1000

    async def _on_voice_start(self, frame: dict[str, Any]) -> None:
        assert self.device is not None
        if self.session is not None:
            raise YimiError("voice_already_started", "this socket already carries a voice session; send voice.stop first")
        audio.check_format(frame.get("format"))
        session, status = await database_sync_to_async(voice_services.open_session)(
            self.device, frame.get("channel"), frame.get("mode", "normal")
        )
        self.session, self.status = session, status
        self._open_archive()
        speech, front = await self._open_speech(status)
        await self._send(
            {
                "type": "voice.started",
                "id": frame.get("id"),
                "session_id": session.id,
                "channel": session.channel,
                "mode": session.mode,
                "format": audio.WIRE_FORMAT,
                "transcription": status.transcription,
                "transcription_engine": status.transcription_engine,
                "wake_word": status.wake_word,
                "voiceprint": status.voiceprint,
                "problems": status.problems,
                "speech": speech,
                "front": front,
                "limits": {"max_audio_frame_bytes": config.max_audio_frame_bytes(), "max_tts_frame_bytes": tts.FRAME_BYTES},
            }
        )
        log_event("voice_session_started", device_id=str(self.device.id), channel=session.channel, transcription=status.transcription)

    async def _on_voice_stop(self, frame: dict[str, Any]) -> None:
        session = self._need_session()
        output = await sync_to_async(session.finish, thread_sensitive=False)()
        await self._process(output)
        await self._end_archive()
        if self.call is not None:
            await self._hang_up(self.call)
            self.call = None
        self._end_analysis()
        await self._end_push_to_talk()
        self.session, self.enrollment = None, None
        await self._end_speech("session_end")
        await self._send({"type": "voice.stopped", "id": frame.get("id"), "session_id": session.id, "stream_ms": ms(session.position)})

    async def _on_wake(self, frame: dict[str, Any]) -> None:
        session = self._need_session()
        start, until = session.open_request_window(self._position(frame), config.request_window_seconds())
        await self._send({"type": "wake.ack", "id": frame.get("id"), "window_from_ms": ms(start), "window_until_ms": ms(until)})

    async def _on_playback(self, frame: dict[str, Any]) -> None:
        session = self._need_session()
        if frame.get("state") not in ("start", "end"):
            raise YimiError("invalid_frame", "playback state must be start or end")
        session.playback(frame["state"], self._position(frame))

    async def _on_push_to_talk(self, frame: dict[str, Any]) -> None:
        """``push_to_talk`` ``down``: speech from ``at_ms`` on is a request (a window of at
        most ``PTT_HOLD_SECONDS``), ambient analysis yields and no cold pack starts (the
        hold is recorded for every process, ``devices.push_to_talk``); ``up``: the window
        ends there, analysis resumes and the record goes."""
        session = self._need_session()
        state, at = frame.get("state"), self._position(frame)
        key = f"ptt:{session.id}"
        if state == "down":
            window = session.open_request_window(at, ambient.PTT_HOLD_SECONDS, preroll=0.0)
            ambient.analysis.scheduler.hold(key, ambient.PTT_HOLD_SECONDS)
            # Where the worker's cold-pack round sees it too (devices.push_to_talk).
            await database_sync_to_async(push_to_talk.hold)(session.id, self.device)
            self._ptt_recorded = session.id
        elif state == "up":
            window = session.end_request_window(at) or (at, at)
            ambient.analysis.scheduler.release(key)
            ambient.analysis.kick()
            await self._end_push_to_talk()
        else:
            raise YimiError("invalid_frame", "push_to_talk state must be down or up")
        await self._send({"type": "push_to_talk.ack", "id": frame.get("id"), "state": state,
                          "window_from_ms": ms(window[0]), "window_until_ms": ms(window[1])})

    async def _on_call_start(self, frame: dict[str, Any]) -> None:
        session = self._need_session()
        assert self.device is not None
        if self.call is not None and frame.get("call_id") != self.call.call_id:  # the same call_id again: a retried start
            raise YimiError("call_in_progress", "a call is already open on this session; send call.end first")
        asked = timezone.now()
        call = await database_sync_to_async(identity.start_call)(self.device, frame.get("call_id"), session.channel)
        # A call that was open before this start is the same call again (a reconnect): one start per call.
        call_events.record(call, "reconnect" if call.started_at < asked else "start")
        self._audio_heard = False
        # The call's frozen snapshot (persona version, opening, background, card); reused when
        # this call is started again, e.g. after a reconnect (companion.snapshot).
        prepared = await database_sync_to_async(call_snapshot.prepare)(call)
        call_events.record(call, "snapshot_failed" if prepared.snapshot.fallback else "snapshot_built", state=prepared.state)
        self.call = call
        ambient.analysis.scheduler.hold(f"call:{session.id}")  # analysis yields while the owner is in a call
        await self._send({"type": "call.started", "id": frame.get("id"), "call_id": call.call_id, "snapshot": prepared.frame()})

    async def _hang_up(self, call: VoiceCall) -> None:
        """End the call (``identity.end_call``); the hang-up that ended it records the
        ``end`` event and sends the end-of-call summary (``companion.tasks``), off the
        audio path."""
        if await database_sync_to_async(identity.end_call)(call):
            call_events.record(call, "end")
            await dispatch_call_summary(call.pk)

    def _first_audio(self, via: str) -> None:
        """The device reported the call's first played audio (``ack`` ``played`` or
        ``tts.played``): its time is the end of the call's first-audio latency."""
        if self.call is not None and not self._audio_heard:
            self._audio_heard = True
            call_events.record(self.call, "first_audio", via=via)

    async def _on_call_end(self, frame: dict[str, Any]) -> None:
        self._need_session()
        if self.call is None or frame.get("call_id") != self.call.call_id:
            raise YimiError("unknown_call", "there is no open call with this call_id on this session")
        call, self.call = self.call, None
        await self._hang_up(call)
        ambient.analysis.scheduler.release(f"call:{self.session.id}" if self.session else "")
        ambient.analysis.kick()
        await self._send({"type": "call.ended", "id": frame.get("id"), "call_id": call.call_id})

    async def _on_transcript(self, frame: dict[str, Any]) -> None:
        assert self.device is not None
        if frame.get("utterance_id") in self._fronted:
            raise YimiError("transcript_not_needed", "the realtime front took this utterance; it hands it to the brain itself")
        record, accepted = await database_sync_to_async(voice_services.accept_device_transcript)(
            self.device, frame.get("utterance_id"), frame.get("text")
        )
        await self._send(
            {"type": "voice.transcript.ack", "id": frame.get("id"), "utterance_id": record.id.hex, "seq": accepted.entry.seq,
             "run_id": str(accepted.run_id) if accepted.run_id else None, "duplicate": accepted.duplicate,
             "transcript_source": "server" if record.transcript_source == "server_asr" else "device"}
        )
        if not accepted.duplicate:
            await self._start_run(accepted.run_id, accepted.entry.seq)

    async def _on_trust_open(self, frame: dict[str, Any]) -> None:
        assert self.device is not None
        window = await database_sync_to_async(identity.open_trust_window)(
            self.device, attestation_id=frame.get("attestation_id"), method=frame.get("method"),
            issued_at=frame.get("issued_at"), signature=frame.get("signature"),
        )
        await self._send({"type": "trust.opened", "id": frame.get("id"), "expires_at": window.expires_at.isoformat()})

    async def _on_enroll_start(self, frame: dict[str, Any]) -> None:
        session = self._need_session()
        assert self.device is not None
        await database_sync_to_async(voice_services.require_trust_window)(self.device)
        if session.enroll_embedder is None:
            raise YimiError("voiceprint_unavailable", "no voiceprint model is selected in the local catalog")
        session.enrolling, self.enrollment = True, []
        await self._send({"type": "enroll.started", "id": frame.get("id"), "channel": session.channel,
                          "model": session.enroll_embedder.model_key})

    async def _on_enroll_commit(self, frame: dict[str, Any]) -> None:
        session = self._need_session()
        assert self.device is not None
        if self.enrollment is None:
            raise YimiError("not_enrolling", "send enroll.start first")
        collected, self.enrollment, session.enrolling = self.enrollment, None, False
        enrollment = await database_sync_to_async(voice_services.commit_enrollment)(self.device, session.channel, collected)
        await self._send({"type": "enroll.committed", "id": frame.get("id"), "channel": session.channel,
                          "segments": enrollment.segment_count, "model": enrollment.model_key})

    async def _on_enroll_cancel(self, frame: dict[str, Any]) -> None:
        session = self._need_session()
        self.enrollment, session.enrolling = None, False
        await self._send({"type": "enroll.cancelled", "id": frame.get("id")})

    async def _on_ack(self, frame: dict[str, Any]) -> None:
        await super()._on_ack(frame)
        if frame.get("status") == "played":
            self._first_audio("ack")
        if frame.get("status") == "played" and self.session is not None:
            # The reply was heard: the owner may answer without the wake word.
            self.session.open_request_window(self.session.position, config.followup_window_seconds(), preroll=0.0)

    # --- spoken replies and the realtime front (voice/tts.py, voice/realtime.py) ---

    async def _open_speech(self, status: SessionStatus) -> tuple[str, str]:
        """The session's synthesizer and realtime front; returns what ``voice.started``
        says of them (``speech``: the synthesizer's name or ``device``; ``front``:
        ``realtime``, ``off`` or ``unavailable``). A configured one that cannot be used is
        reported in ``problems`` and the session goes on without it."""
        synth, problem = await database_sync_to_async(tts.synthesizer)()
        if problem:
            status.problems["tts"] = problem
        self.speaker = tts.ReplySpeaker(synth, self._send) if synth is not None else None
        if self.speaker is not None:
            self.speaker.on_told = self._told
        try:
            role = await database_sync_to_async(roles.resolve)("realtime")
        except YimiError as exc:
            if exc.code == "role_not_configured":
                return (synth.name if synth else "device"), "off"
            status.problems["realtime"] = exc.code
            return (synth.name if synth else "device"), "unavailable"
        self.front = realtime.RealtimeFront(role, on_frame=self._send, on_handoff=self._front_handoff)
        try:
            await self.front.open()
        except YimiError as exc:
            self.front = None
            status.problems["realtime"] = exc.code
            log_event("realtime_front_unavailable", error_code=exc.code)
            return (synth.name if synth else "device"), "unavailable"
        return (synth.name if synth else "device"), "realtime"

    async def _front_handoff(self, handoff: realtime.Handoff) -> dict[str, Any]:
        """The front called ``handoff_to_brain``: the utterance becomes a run with the
        handoff's thinking switch (a guest's turn is refused); the function's output."""
        assert self.device is not None
        turn = handoff.turn
        text = turn.transcript or turn.heard or handoff.intent  # the server's transcript wins
        try:
            accepted = await database_sync_to_async(voice_services.accept_front_handoff)(
                self.device, turn.utterance_id, text, thinking=handoff.thinking
            )
        except YimiError as exc:
            await self._send({"type": "front.handoff", "utterance_id": turn.utterance_id, "status": "refused", "code": exc.code})
            return {"status": "refused", "reason": "guest" if exc.code == "handoff_refused" else exc.code}
        await self._send({"type": "front.handoff", "utterance_id": turn.utterance_id, "status": "handed_off",
                          "seq": accepted.entry.seq, "run_id": str(accepted.run_id), "thinking": handoff.thinking})
        if not accepted.duplicate:
            await self._start_run(accepted.run_id, accepted.entry.seq)
        return {"status": "handed_off", "run_id": str(accepted.run_id)}

    async def _told(self, seq: int) -> None:
        """Every sentence of a spoken reply was played: the ``played`` ACK (facts told)."""
        await self._on_ack({"type": "ack", "seq": seq, "status": "played"})

    async def _stop_speech(self, reason: str) -> None:
        if self.call is not None and reason == "barge_in":
            call_events.record(self.call, "barge_in")
        if self.speaker is not None:
            await self.speaker.stop(reason)
        if self.front is not None and reason == "barge_in":
            await self.front.cancel_response()

    async def _end_speech(self, reason: str) -> None:
        speaker, front, self.speaker, self.front = self.speaker, self.front, None, None
        if speaker is not None:
            await speaker.stop(reason)
        if front is not None:
            await front.close()

    async def _on_tts_played(self, frame: dict[str, Any]) -> None:
        if self.speaker is None:
            raise YimiError("unknown_run", "nothing is spoken on this socket")
        reply = await self.speaker.played(frame.get("run_id"), frame.get("sentence"))
        self._first_audio("tts.played")
        await self._send({"type": "tts.played.ack", "id": frame.get("id"), "run_id": reply.run_id,
                          "sentence": frame.get("sentence"), "told": reply.told})

    async def _on_tts_stop(self, frame: dict[str, Any]) -> None:
        self._need_session()
        await self._stop_speech("barge_in")

    async def reply_chunk(self, event: dict[str, Any]) -> None:
        await super().reply_chunk(event)
        if self.speaker is not None:
            await self.speaker.chunk(event.get("run_id"), event.get("text"))

    async def reply_done(self, event: dict[str, Any]) -> None:
        await super().reply_done(event)
        if self.speaker is not None:
            await self.speaker.done(event.get("run_id"), event.get("seq"))

    async def notice(self, event: dict[str, Any]) -> None:
        await super().notice(event)
        if self.speaker is not None and self.speaker.speaking(event.get("run_id")):  # an honest notice is spoken too
            await self.speaker.chunk(event.get("run_id"), event.get("text"))
            await self.speaker.done(event.get("run_id"), event.get("seq"))

    HANDLERS = {
        "voice.start": _on_voice_start,
        "voice.stop": _on_voice_stop,
        "wake": _on_wake,
        "playback": _on_playback,
        "push_to_talk": _on_push_to_talk,
        "call.start": _on_call_start,
        "call.end": _on_call_end,
        "voice.transcript": _on_transcript,
        "trust.open": _on_trust_open,
        "enroll.start": _on_enroll_start,
        "enroll.commit": _on_enroll_commit,
        "enroll.cancel": _on_enroll_cancel,
        "ack": _on_ack,
        "tts.played": _on_tts_played,
        "tts.stop": _on_tts_stop,
        "ping": DeviceConsumer._on_ping,
    }
