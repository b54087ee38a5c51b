"""A local fake of a realtime voice model: a real websocket server (``websockets``) that
speaks the OpenAI Realtime wire protocol, scripted.

It cannot understand audio, so the test tells it what it "hears", in order: each
``response.create`` that follows committed audio takes the next entry of ``heard``. The
fake then behaves like a model following the front's instructions: it reports the input
transcription (``conversation.item.input_audio_transcription.completed``), and either
answers itself — audio deltas (a 24 kHz tone) with a transcript — or, when what it heard
contains one of ``handoff_words``, calls ``handoff_to_brain`` with the words as the intent
and ``thinking: true``. After a ``function_call_output`` the next response is the bridge
sentence (``handed_off``) or a polite refusal (anything else).

Everything received is kept in ``events``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import threading
import uuid
from typing import Any

from websockets.asyncio.server import ServerConnection, serve

SMALL_TALK_REPLY = "I am fine, thank you for asking."
BRIDGE_REPLY = "One moment, I am checking that for you."
REFUSAL_REPLY = "Sorry, I can chat with you, but I cannot look into that for a guest."


def tone(seconds: float, rate: int = 24000, freq: float = 440.0) -> bytes:
    n = int(seconds * rate)
    return b"".join(int(8000 * math.sin(2 * math.pi * freq * i / rate)).to_bytes(2, "little", signed=True) for i in range(n))


class FakeRealtimeServer:
    def __init__(self, *, heard: list[str] | None = None, handoff_words: tuple[str, ...] = ("calendar",)) -> None:
        self.heard = list(heard or [])
        self.handoff_words = handoff_words
        self.events: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._stop: asyncio.Future[None] | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeRealtimeServer:
        self.thread.start()
        assert self._ready.wait(10), "the fake realtime server did not start"
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set_result, None)
        self.thread.join(10)

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if e.get("type") == kind]

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = self.loop.create_future()
        async with serve(self._session, "127.0.0.1", 0, max_size=8 * 1024 * 1024) as server:
            self.port = next(iter(server.sockets)).getsockname()[1]
            self._ready.set()
            await self._stop

    async def _session(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        self.paths.append(ws.request.path)
        self.headers.append({k.lower(): v for k, v in ws.request.headers.raw_items()})
        await self._emit(ws, {"type": "session.created", "session": {"id": f"sess_{uuid.uuid4().hex[:8]}"}})
        committed = False
        output: dict[str, Any] | None = None
        async for message in ws:
            event = json.loads(message)
            self.events.append(event)
            kind = event.get("type")
            if kind == "session.update":
                await self._emit(ws, {"type": "session.updated", "session": event.get("session")})
            elif kind == "input_audio_buffer.commit":
                committed = True
                await self._emit(ws, {"type": "input_audio_buffer.committed", "item_id": f"item_{uuid.uuid4().hex[:8]}"})
            elif kind == "conversation.item.create" and (event.get("item") or {}).get("type") == "function_call_output":
                output = json.loads(event["item"]["output"])
            elif kind == "response.create":
                if output is not None:
                    reply = BRIDGE_REPLY if output.get("status") == "handed_off" else REFUSAL_REPLY
                    output = None
                    await self._speak(ws, reply)
                elif committed:
                    committed = False
                    words = self.heard.pop(0) if self.heard else ""
                    await self._emit(ws, {"type": "conversation.item.input_audio_transcription.completed",
                                          "item_id": "item", "content_index": 0, "transcript": words})
                    if any(w in words.lower() for w in self.handoff_words):
                        await self._call_handoff(ws, words)
                    else:
                        await self._speak(ws, SMALL_TALK_REPLY)

    async def _emit(self, ws: ServerConnection, event: dict[str, Any]) -> None:
        await ws.send(json.dumps({"event_id": f"event_{uuid.uuid4().hex[:8]}", **event}))

    async def _speak(self, ws: ServerConnection, text: str) -> None:
        rid = f"resp_{uuid.uuid4().hex[:8]}"
        await self._emit(ws, {"type": "response.created", "response": {"id": rid, "status": "in_progress"}})
        audio = tone(0.3)
        for i in range(3):
            piece = audio[i * len(audio) // 3 : (i + 1) * len(audio) // 3]
            await self._emit(ws, {"type": "response.audio.delta", "response_id": rid, "item_id": "i", "output_index": 0,
                                  "content_index": 0, "delta": base64.b64encode(piece).decode()})
        for word in text.split(" "):
            await self._emit(ws, {"type": "response.audio_transcript.delta", "response_id": rid, "delta": word + " "})
        await self._emit(ws, {"type": "response.audio.done", "response_id": rid})
        await self._emit(ws, {"type": "response.done", "response": {"id": rid, "status": "completed"}})

    async def _call_handoff(self, ws: ServerConnection, words: str) -> None:
        rid, call_id = f"resp_{uuid.uuid4().hex[:8]}", f"call_{uuid.uuid4().hex[:8]}"
        arguments = json.dumps({"difficulty": "private records", "intent": words, "thinking": True})
        await self._emit(ws, {"type": "response.created", "response": {"id": rid, "status": "in_progress"}})
        for i in range(0, len(arguments), 16):
            await self._emit(ws, {"type": "response.function_call_arguments.delta", "response_id": rid, "call_id": call_id,
                                  "delta": arguments[i : i + 16]})
        await self._emit(ws, {"type": "response.function_call_arguments.done", "response_id": rid, "call_id": call_id,
                              "name": "handoff_to_brain", "arguments": arguments})
        await self._emit(ws, {"type": "response.done", "response": {"id": rid, "status": "completed"}})
