"""The realtime voice front ("fast thinking"; docs/voice.md, "The
realtime front").

A client for the OpenAI Realtime websocket protocol (the ``qwen-omni-realtime``
models speak it), one connection per voice session, used only when the ``realtime``
model role is configured (``llm.roles``). For each spoken request the voice socket
hands over (``turn``): the utterance's audio (``input_audio_buffer.append`` /
``commit``) and ``response.create``. The front answers small talk itself — its audio
(``response.audio.delta``) goes to the device as ``front.audio`` — or calls the one tool
it is given, ``handoff_to_brain`` (``difficulty``, ``intent``, ``thinking``). The socket's
``on_handoff`` decides (only a non-guest turn hands off; the run is the brain's) and its
answer goes back as the function's output (``conversation.item.create``
``function_call_output``), followed by ``response.create``: the front then speaks a short
bridge sentence, or politely declines a guest.

The front never writes anything itself: the voice socket records utterances and starts
runs through the services, exactly as without the front.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import numpy as np
from django.conf import settings
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import WebSocketException

from llm.roles import RoleSettings
from voice.tts import SAMPLE_RATE, Resampler
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

HANDOFF = "handoff_to_brain"
HANDOFF_TOOL: dict[str, Any] = {
    "type": "function",
    "name": HANDOFF,
    "description": (
        "Hand the owner's request to the main brain when it needs memory, private records, an action "
        "(sending, buying, booking, reminding) or deep reasoning. Do not answer such requests yourself."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "difficulty": {"type": "string", "description": "what makes this hard or private, in a few words"},
            "intent": {"type": "string", "description": "the request with every key condition, in the speaker's own words"},
            "thinking": {"type": "boolean", "description": "true if the brain should reason deeply this turn"},
        },
        "required": ["difficulty", "intent", "thinking"],
    },
}
INSTRUCTIONS = (
    "You are Yimi's voice. Answer small talk and simple public knowledge yourself, briefly. "
    f"When the request needs the owner's memory, private records, an action or deep reasoning, call {HANDOFF} "
    "and do not answer it yourself. When its output says handed_off, say one short sentence that you are on it. "
    "When its output says refused, politely say you can only chat with guests and cannot do that for them."
)
BRIDGE_INSTRUCTIONS = "Say one short sentence that you are looking into it; the answer follows shortly."
REFUSAL_INSTRUCTIONS = "Politely say that you can chat, but you cannot reach the owner's things or act for a guest."
MAX_INTENT_CHARS = 2000
APPEND_BYTES = 32000  # one input_audio_buffer.append carries at most this much PCM


def realtime_url(base_url: str, model: str) -> str:
    """``{base_url}/realtime?model=…`` with http(s) turned into ws(s)."""
    parts = urlsplit(base_url.rstrip("/"))
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, parts.path + "/realtime", urlencode({"model": model}), ""))


@dataclass
class FrontTurn:
    """One spoken request the front was given."""

    utterance_id: str
    scope: str
    transcript: str = ""  # the server's own transcript (ASR), if it has one
    heard: str = ""  # the front's transcription of the input, if the session asked for it
    handed_off: bool = False


@dataclass
class Handoff:
    turn: FrontTurn
    call_id: str
    difficulty: str
    intent: str
    thinking: bool


class RealtimeFront:
    """One realtime session. ``on_frame`` sends a frame to the device (``front.audio``,
    ``front.said``); ``on_handoff`` turns a handoff into a run and returns the function's
    output (``{"status": "handed_off", …}`` or ``{"status": "refused", "reason": …}``)."""

    def __init__(
        self,
        role: RoleSettings,
        *,
        on_frame: Callable[[dict[str, Any]], Awaitable[None]],
        on_handoff: Callable[[Handoff], Awaitable[dict[str, Any]]],
    ) -> None:
        self.url = realtime_url(role.base_url, role.model)
        self.api_key = role.api_key
        self.connect_timeout = role.connect_timeout_seconds
        self.on_frame, self.on_handoff = on_frame, on_handoff
        self.input_rate = int(getattr(settings, "VOICE_REALTIME_INPUT_SAMPLE_RATE", 24000))
        self.output_rate = int(getattr(settings, "VOICE_REALTIME_OUTPUT_SAMPLE_RATE", 24000))
        self.voice = str(getattr(settings, "VOICE_REALTIME_VOICE", "alloy"))
        self.transcription_model = str(getattr(settings, "VOICE_REALTIME_TRANSCRIPTION_MODEL", ""))
        self.ws: ClientConnection | None = None
        self.reader: asyncio.Task[None] | None = None
        self.turn_now: FrontTurn | None = None
        self.responses: dict[str, dict[str, Any]] = {}  # response id → {text, part, resampler, kind}
        self.next_kind = "answer"

    async def open(self) -> None:
        """Connect and send ``session.update``; ``realtime_unavailable`` if it cannot."""
        headers = {"OpenAI-Beta": "realtime=v1"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        try:
            self.ws = await connect(self.url, additional_headers=headers, open_timeout=self.connect_timeout,
                                    max_size=4 * 1024 * 1024, proxy=None)
        except (OSError, WebSocketException, TimeoutError) as exc:
            raise YimiError("realtime_unavailable", f"the realtime front cannot be reached: {type(exc).__name__}") from None
        session: dict[str, Any] = {
            "modalities": ["text", "audio"], "instructions": INSTRUCTIONS, "voice": self.voice,
            "input_audio_format": "pcm16", "output_audio_format": "pcm16", "turn_detection": None,
            "tools": [HANDOFF_TOOL], "tool_choice": "auto",
        }
        if self.transcription_model:
            session["input_audio_transcription"] = {"model": self.transcription_model}
        await self._send({"type": "session.update", "session": session})
        self.reader = asyncio.ensure_future(self._read())

    @property
    def open_now(self) -> bool:
        return self.ws is not None and self.reader is not None and not self.reader.done()

    async def turn(self, turn: FrontTurn, samples: np.ndarray) -> None:
        """Give the front one spoken request (16 kHz float samples) and ask for a response."""
        self.turn_now = turn
        pcm = (np.clip(samples, -1.0, 32767 / 32768) * 32768.0).astype("<i2").tobytes()
        pcm = Resampler(SAMPLE_RATE, self.input_rate).feed(pcm) if self.input_rate != SAMPLE_RATE else pcm
        for i in range(0, len(pcm), APPEND_BYTES):
            await self._send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i : i + APPEND_BYTES]).decode("ascii")})
        await self._send({"type": "input_audio_buffer.commit"})
        self.next_kind = "answer"
        await self._send({"type": "response.create"})

    async def cancel_response(self) -> None:
        """Barge-in: the front stops talking."""
        if self.open_now:
            await self._send({"type": "response.cancel"})

    async def close(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await self.ws.close()
            self.ws = None

    async def _send(self, event: dict[str, Any]) -> None:
        if self.ws is None:
            raise YimiError("realtime_unavailable", "the realtime front is not connected")
        try:
            await self.ws.send(json.dumps(event))
        except WebSocketException:
            raise YimiError("realtime_unavailable", "the realtime front closed the connection") from None

    async def _read(self) -> None:
        assert self.ws is not None
        try:
            async for message in self.ws:
                if isinstance(message, bytes):
                    continue
                try:
                    event = json.loads(message)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    await self._on_event(event)
        except WebSocketException:
            pass
        except YimiError as exc:
            log_event("realtime_front_failed", error_code=exc.code)
        except Exception as exc:  # a bug or a dead database: logged, the session goes on without the front
            log_event("realtime_front_failed", error=type(exc).__name__)
        log_event("realtime_front_closed")

    def _response(self, event: dict[str, Any]) -> dict[str, Any]:
        rid = str(event.get("response_id") or (event.get("response") or {}).get("id") or "")
        if rid not in self.responses:
            self.responses[rid] = {"id": rid, "text": "", "part": 0, "kind": self.next_kind,
                                   "resampler": Resampler(self.output_rate, SAMPLE_RATE)}
            while len(self.responses) > 16:
                self.responses.pop(next(iter(self.responses)))
        return self.responses[rid]

    async def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind in ("response.audio.delta", "response.output_audio.delta"):
            r = self._response(event)
            try:
                pcm = base64.b64decode(str(event.get("delta") or ""), validate=True)
            except ValueError:
                return
            audio = r["resampler"].feed(pcm)
            part, r["part"] = r["part"], r["part"] + 1
            await self.on_frame({"type": "front.audio", "response_id": r["id"], "part": part, "kind": r["kind"],
                                 "sample_rate": SAMPLE_RATE, "encoding": "pcm_s16le",
                                 "audio": base64.b64encode(audio).decode("ascii")})
        elif kind in ("response.audio_transcript.delta", "response.output_audio_transcript.delta"):
            r = self._response(event)
            r["text"] += str(event.get("delta") or "")
        elif kind == "conversation.item.input_audio_transcription.completed":
            if self.turn_now is not None and isinstance(event.get("transcript"), str):
                self.turn_now.heard = event["transcript"].strip()
        elif kind == "response.function_call_arguments.done":
            await self._on_function_call(event)
        elif kind == "response.done":
            r = self._response(event)
            if r["text"].strip():
                await self.on_frame({"type": "front.said", "response_id": r["id"], "kind": r["kind"], "text": r["text"].strip()})
        elif kind == "error":
            error = event["error"] if isinstance(event.get("error"), dict) else {}
            log_event("realtime_front_error", code=str(error.get("code") or error.get("type") or "")[:64])

    async def _on_function_call(self, event: dict[str, Any]) -> None:
        call_id = str(event.get("call_id") or "")
        if event.get("name") != HANDOFF or not call_id:
            output: dict[str, Any] = {"status": "refused", "reason": "unknown_function"}
        elif self.turn_now is None or self.turn_now.handed_off:
            output = {"status": "refused", "reason": "no_turn"}
        else:
            try:
                args = json.loads(str(event.get("arguments") or "{}"))
            except ValueError:
                args = None
            if not isinstance(args, dict) or not isinstance(args.get("intent"), str) or not args["intent"].strip():
                output = {"status": "refused", "reason": "invalid_arguments"}
            else:
                handoff = Handoff(
                    turn=self.turn_now, call_id=call_id, difficulty=str(args.get("difficulty") or "")[:200],
                    intent=args["intent"].strip()[:MAX_INTENT_CHARS], thinking=args.get("thinking") is True,
                )
                output = await self.on_handoff(handoff)
                self.turn_now.handed_off = output.get("status") == "handed_off"
        await self._send({"type": "conversation.item.create",
                          "item": {"type": "function_call_output", "call_id": call_id, "output": json.dumps(output)}})
        self.next_kind = "bridge" if output.get("status") == "handed_off" else "refusal"
        instructions = BRIDGE_INSTRUCTIONS if self.next_kind == "bridge" else REFUSAL_INSTRUCTIONS
        await self._send({"type": "response.create", "response": {"instructions": instructions}})
