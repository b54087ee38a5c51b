"""The device websocket's connection: ``/ws/device/`` (protocol version 1, docs/protocol.md).

Thin on purpose: it parses frames, authenticates, and calls services. The connection is
a small state machine: ``challenge`` sent → ``auth`` received and verified → ready.
``DeviceConnection`` is that state machine and the per-frame dispatch (``HANDLERS``, the
table ``devices.consumers.device.DeviceConsumer`` fills from the frame families in this
package); the families' handlers are its subclasses' methods.

Nothing a device sends can kill the socket: every text frame goes through
``parse_frame`` (the one parsing boundary, shared with ``/ws/voice/``) before any handler
sees it, and ``receive`` answers anything unexpected with ``internal_error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from asgiref.sync import ThreadSensitiveContext
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.db import InterfaceError, OperationalError
from redis.exceptions import RedisError

from accounts import devices as device_identity
from accounts.identity import instance_public_key_b64, sign_as_instance
from accounts.models import Device, Scope
from accounts.services import device_scope_limit
from accounts.signatures import challenge_message
from brain.sweeper import ensure_embedded_sweeper
from brain.trace import now_ms
from memory.timeline import entries as timeline
from yimi_project import jsonbody, push
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

PROTOCOL_VERSION = 1

# Close codes (documented in docs/protocol.md).
CLOSE_AUTH_FAILED = 4401
CLOSE_REVOKED = 4403
CLOSE_AUTH_TIMEOUT = 4408
CLOSE_TRY_AGAIN_LATER = 1013  # RFC 6455 registry: a backing service is down
CLOSE_INTERNAL_ERROR = 1011  # RFC 6455: an unexpected condition (a bug, logged)

# What Redis (channel layer) and the database raise when they are down or unreachable.
SERVICE_DOWN_ERRORS = (RedisError, OperationalError, InterfaceError)

# How deep a frame's objects and arrays may nest: the one JSON guard's limit, as over HTTP.
MAX_FRAME_DEPTH = jsonbody.MAX_DEPTH


def parse_frame(text_data: str) -> dict[str, Any]:
    """One text frame, checked once, for both sockets, before any handler sees it.

    Steps: 1. at most ``WS_MAX_FRAME_BYTES`` of UTF-8 (``frame_too_large``); 2. JSON
    without ``NaN``/``Infinity`` (``malformed_json``); 3. an object with a string ``type``
    (``invalid_frame``); 4. the HTTP API's JSON guard (``yimi_project.jsonbody.check``): no
    deeper than ``MAX_FRAME_DEPTH`` — also when the JSON parser itself gives up on the depth
    — no key or string value holding NUL or a lone surrogate, no number too large for a
    float (``invalid_frame``), so every string a handler may store is storable and can be
    sent back. Raises ``YimiError`` with the protocol's code; its ``details["id"]`` is the
    frame's ``id`` when that is a clean string, for the error frame.
    """
    # surrogatepass: a raw lone surrogate (possible in-process, never through daphne, which
    # closes invalid UTF-8 with 1007) is counted here and refused below, not raised on.
    if len(text_data.encode("utf-8", "surrogatepass")) > settings.WS_MAX_FRAME_BYTES:
        raise YimiError("frame_too_large", f"frames are limited to {settings.WS_MAX_FRAME_BYTES} bytes")
    try:
        frame = jsonbody.loads(text_data)
    except jsonbody.Refused as exc:
        raise YimiError("invalid_frame", exc.message) from None
    except jsonbody.Malformed:
        raise YimiError("malformed_json", "the frame is not valid JSON") from None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        raise YimiError("invalid_frame", 'a frame is a JSON object with a string "type"')
    frame_id = frame.get("id") if isinstance(frame.get("id"), str) and jsonbody.unclean(frame["id"]) is None else None
    try:
        jsonbody.check(frame, MAX_FRAME_DEPTH)
    except jsonbody.Refused as exc:
        raise YimiError("invalid_frame", exc.message, id=frame_id) from None
    return frame


class DeviceConnection(AsyncWebsocketConsumer):
    device: Device | None = None
    nonce: str = ""
    _auth_timer: asyncio.Task | None = None
    _accepted: bool = False
    _told_unavailable: bool = False
    _received_ms: float = 0.0
    _frame_id: str | None = None  # the id of the text frame being handled, for an internal_error

    # The frame dispatch: type -> handler, and the frames whose handler re-checks the device
    # itself (``devices.consumers.device.DeviceConsumer`` fills both).
    HANDLERS: ClassVar[dict[str, Callable[[Any, dict[str, Any]], Awaitable[None]]]] = {}
    RECHECKED_IN_HANDLER: ClassVar[frozenset[str]] = frozenset()

    # --- connection lifecycle -----------------------------------------------------------

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Channels' dispatch loop, plus one rule: when Redis or the database fails (here
        or in the channel layer's receive loop), the device is told ``service_unavailable``
        with a ``retry_after`` and the socket closes with 1013, instead of the bare 1011
        an uncaught exception gives.

        The socket's database work runs on a thread of its own (``ThreadSensitiveContext``,
        as Django gives each HTTP request), not on the one thread Channels' consumers share
        by default: concurrent sockets' admissions run side by side, each borrowing a pooled
        connection per call (``CONN_MAX_AGE`` 0). The thread ends with the socket."""
        async with ThreadSensitiveContext():
            try:
                await super().__call__(scope, receive, send)
            except SERVICE_DOWN_ERRORS as exc:
                log_event("ws_service_unavailable", error=type(exc).__name__)
                if self._auth_timer is not None:
                    self._auth_timer.cancel()
                await self._close_service_unavailable()
                with contextlib.suppress(*SERVICE_DOWN_ERRORS):
                    await self.disconnect(CLOSE_TRY_AGAIN_LATER)
            finally:
                # However it ended: the channel layer forgets this socket's inbox and groups
                # (yimi_project.channel_layers; a layer without the hook has nothing to forget).
                forget = getattr(self.channel_layer, "forget_channel", None)
                if forget is not None and getattr(self, "channel_name", None):
                    forget(self.channel_name)

    async def connect(self) -> None:
        ensure_embedded_sweeper()
        await self.accept()
        self._accepted = True
        self.nonce = secrets.token_urlsafe(32)
        await self._send(
            {
                "type": "challenge",
                "protocol": PROTOCOL_VERSION,
                "nonce": self.nonce,
                "server_key": await database_sync_to_async(instance_public_key_b64)(),
                "server_signature": await database_sync_to_async(sign_as_instance)(challenge_message(self.nonce)),
            }
        )
        self._auth_timer = asyncio.ensure_future(self._auth_timeout())

    @staticmethod
    async def wait_auth_deadline(seconds: float) -> None:
        """The one clock of the handshake: waits out the time a device has to send its
        ``auth`` frame. Tests replace it to decide themselves when the deadline passes."""
        await asyncio.sleep(seconds)

    async def _auth_timeout(self) -> None:
        """No ``auth`` frame within ``WS_AUTH_TIMEOUT_SECONDS``: ``auth_timeout``, close 4408.

        The timer only waits for the frame: ``_handle_auth`` stops it as soon as a complete
        ``auth`` frame is received, and the check then ends on its own — ``ready``, an
        authentication error, or ``service_unavailable`` (1013) when the database fails,
        refusing or hanging past its pool's wait, however long after the deadline that is."""
        await self.wait_auth_deadline(settings.WS_AUTH_TIMEOUT_SECONDS)
        if self.device is None:
            await self._error("auth_timeout", "no auth frame within the time limit")
            await self.close(code=CLOSE_AUTH_TIMEOUT)

    async def disconnect(self, code: int) -> None:
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        await self._leave_groups()

    async def _leave_groups(self) -> None:
        if self.device is not None:
            await self.channel_layer.group_discard(push.device_group(self.device.id), self.channel_name)
            await self.channel_layer.group_discard(push.owner_group(self.device.owner_id), self.channel_name)

    # --- inbound frames -----------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """One message from the device, on either socket. The last resort is here: an
        exception no handler expected is logged and answered ``internal_error`` (no trace
        text), and a ready socket stays open; before ``ready`` the socket closes with 1011,
        since nothing else would end the handshake. Redis or the database being down is
        left to ``__call__`` (``service_unavailable``, 1013)."""
        self._frame_id = None
        try:
            if text_data is None:
                await self._receive_binary(bytes_data or b"")
            else:
                await self._receive_text(text_data)
        except SERVICE_DOWN_ERRORS:
            raise
        except Exception as exc:
            await self._internal_error(exc)

    async def _receive_binary(self, data: bytes) -> None:
        if self.device is None:
            await self._refuse_first_frame("binary_not_supported", "the first frame must be auth, a JSON text frame")
            return
        await self._error("binary_not_supported", "this socket takes JSON text frames only")

    async def _receive_text(self, text_data: str) -> None:
        self._received_ms = now_ms()  # the frame's arrival: a text's trace starts here (brain.trace)
        try:
            frame = parse_frame(text_data)
        except YimiError as exc:
            if self.device is None:
                await self._refuse_first_frame(exc.code, exc.message, exc.details.get("id"))
                return
            await self._error(exc.code, exc.message, exc.details.get("id"))
            return
        # parse_frame checked every string: an id that is a string is clean.
        frame_id = self._frame_id = frame.get("id") if isinstance(frame.get("id"), str) else None

        if self.device is None:
            await self._handle_auth(frame)
            return
        handler = self.HANDLERS.get(frame["type"])
        if handler is None:
            await self._error("unknown_type", f"unknown frame type {frame['type'][:32]!r}", frame_id)
            return
        try:
            # Every frame re-checks the device, so a revocation takes effect even if the
            # group message that closes us were lost; a text frame does it in its own
            # database trip (``_on_text``: one trip per utterance, not two).
            if frame["type"] not in self.RECHECKED_IN_HANDLER:
                self.device = await database_sync_to_async(device_identity.active_device)(self.device.id)
            await handler(self, frame)
        except YimiError as exc:
            if exc.code == "device_revoked":
                await self._close_revoked()
                return
            await self._error(exc.code, exc.message, frame_id)

    async def _refuse_first_frame(self, code: str, message: str, frame_id: str | None = None) -> None:
        """A first frame that is not an ``auth`` frame at all (not JSON, binary, too large,
        unclean, ...): its error, then close 4401 at once, as for any other first frame
        that is not ``auth`` — not 4408 when the deadline passes."""
        if self._auth_timer is not None:
            if self._auth_timer.done() and not self._auth_timer.cancelled():
                return  # the deadline passed first: the socket is closing with 4408
            self._auth_timer.cancel()
        await self._error(code, message, frame_id)
        await self.close(code=CLOSE_AUTH_FAILED)

    async def _handle_auth(self, frame: dict[str, Any]) -> None:
        if frame["type"] != "auth":
            await self._error("not_authenticated", "the first frame must be auth")
            await self.close(code=CLOSE_AUTH_FAILED)
            return
        if self._auth_timer is not None:
            if self._auth_timer.done() and not self._auth_timer.cancelled():
                return  # the deadline passed first: the socket is closing with 4408
            self._auth_timer.cancel()  # a complete auth frame came in time: its check may take as long as it takes
        try:
            device = await database_sync_to_async(device_identity.authenticate_challenge)(
                frame.get("device_id"), self.nonce, frame.get("signature")
            )
        except YimiError as exc:
            await self._error(exc.code, exc.message)
            await self.close(code=CLOSE_REVOKED if exc.code == "device_revoked" else CLOSE_AUTH_FAILED)
            log_event("ws_auth_failed", reason=exc.code)
            return
        self.device = device
        await self.channel_layer.group_add(push.device_group(device.id), self.channel_name)
        if not device.is_guest:  # owner-wide frames (timeline hints, cards, reminders) skip guests
            await self.channel_layer.group_add(push.owner_group(device.owner_id), self.channel_name)

        def joined() -> tuple[Device, Any]:
            """In its groups now, the device once more: a revocation between the login check
            and the joins sent its close to a group this socket was not in yet, so it never
            comes. From here on a revocation's close reaches this socket. With the scope
            admission will use (accounts.services.device_scope_limit): a guest device, or a
            device of any account but the owner's, is admitted as guest."""
            fresh = device_identity.active_device(device.id)
            return fresh, device_scope_limit(fresh)

        try:
            device, limit = await database_sync_to_async(joined)()
        except YimiError as exc:
            log_event("ws_auth_failed", reason=exc.code, after="joining")
            if exc.code == "device_revoked":
                await self._close_revoked()
                return
            await self._leave_groups()
            await self._error(exc.code, exc.message)
            await self.close(code=CLOSE_AUTH_FAILED)
            return
        self.device = device
        await self._send(
            {
                "type": "ready",
                "protocol": PROTOCOL_VERSION,
                "device_id": str(device.id),
                "scope": str(limit[0] if limit else Scope.OWNER),
                # A guest learns only the last entry it may see, not how long the owner's timeline is.
                "last_seq": await database_sync_to_async(timeline.last_seq)(
                    device.owner_id, only_device_id=device.id if device.is_guest else None
                ),
                "limits": {"max_frame_bytes": settings.WS_MAX_FRAME_BYTES, "max_text_chars": settings.WS_MAX_TEXT_CHARS},
            }
        )
        await self._send_pending_cards(device)

    async def _send_pending_cards(self, device: Device) -> None:
        """Cards that were pushed while this device was away: the cards' family sends them
        (``devices.consumers.cards.CardFrames``); a bare connection has none."""

    async def _on_ping(self, frame: dict[str, Any]) -> None:
        await self._send({"type": "pong", "id": frame.get("id")})

    # --- messages from the channel layer ------------------------------------------------

    # Frames this consumer only forwards, with no database access. Channels' dispatch runs
    # close_old_connections before every handler, on the one thread all database work of
    # the process shares; under load (every chunk, every timeline.new to every socket)
    # that hop was the web process's queue. These skip it; everything else keeps it.
    FORWARDED = frozenset({"reply.chunk", "reply.done", "notice", "timeline.new"})
    # A frame from the device skips that hop too: its handlers reach the database only
    # through database_sync_to_async, which closes old connections before and after each
    # call on the same thread; the hop before it was one more thread round trip per frame.
    NO_CLOSE_HOP = FORWARDED | {"websocket.receive"}

    async def dispatch(self, message: dict[str, Any]) -> None:
        if message.get("type") in self.NO_CLOSE_HOP:
            await getattr(self, get_handler_name(message))(message)
            return
        await super().dispatch(message)

    async def device_revoked(self, event: dict[str, Any]) -> None:
        await self._close_revoked()

    # --- helpers ------------------------------------------------------------------------

    async def _close_revoked(self) -> None:
        """Out of the device's and the owner's groups first (no frame of theirs follows the
        close), then ``device_revoked`` and close 4403."""
        await self._leave_groups()
        await self._error("device_revoked", "this device was revoked by its owner")
        await self.close(code=CLOSE_REVOKED)

    async def _close_service_unavailable(self) -> None:
        if self._told_unavailable:  # once per socket
            return
        self._told_unavailable = True
        if not self._accepted:  # the channel layer failed before connect() ran
            await self.accept()
            self._accepted = True
        await self._send(
            {
                "type": "error",
                "code": "service_unavailable",
                "message": "the server cannot reach its database or message broker; reconnect later",
                "retry_after": settings.WS_RETRY_AFTER_SECONDS,
            }
        )
        await self.close(code=CLOSE_TRY_AGAIN_LATER)

    async def _internal_error(self, exc: Exception) -> None:
        """The last resort for a frame: log what failed where (type and place, no values),
        tell the device ``internal_error`` without trace text, close only before ``ready``."""
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        log_event(
            "ws_internal_error", level=logging.ERROR, error=type(exc).__name__,
            raised_at=f"{tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}" if tb else None,
            device_id=str(self.device.id) if self.device else None, consumer=type(self).__name__,
        )
        await self._error("internal_error", "the server failed on this frame; it logged the error", self._frame_id)
        if self.device is None:
            await self.close(code=CLOSE_INTERNAL_ERROR)

    async def _error(self, code: str, message: str, frame_id: str | None = None) -> None:
        body: dict[str, Any] = {"type": "error", "code": code, "message": message}
        if frame_id is not None:
            body["id"] = frame_id
        await self._send(body)

    async def _send(self, body: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(body, ensure_ascii=False))
