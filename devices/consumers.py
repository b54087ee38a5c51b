"""The device websocket, ``/ws/device/`` (protocol version 1, docs/protocol.md).

Thin on purpose: it parses frames, authenticates, and calls services. The connection is
a small state machine: ``challenge`` sent → ``auth`` received and verified → ready.

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
from typing import Any

from asgiref.sync import ThreadSensitiveContext
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.db import InterfaceError, OperationalError
from redis.exceptions import RedisError

from accounts.identity import instance_public_key_b64, sign_as_instance
from accounts.models import Scope
from accounts.services import device_scope_limit, is_owner_device
from brain import catalog, geofences, model_settings, role_drafts
from brain.consent_execution import acknowledge_denied
from brain.dispatch import dispatch_card_execution, dispatch_payment, dispatch_run, publish_run
from brain.payment_execution import acknowledge_declined
from brain.services import accept_utterance, trace_stages_update
from brain.sweeper import ensure_embedded_sweeper
from brain.trace import now_ms
from consent import services as consent
from devices import hud, mac_relay
from devices import images as device_images
from devices import services as device_services
from devices.models import Device
from devices.signatures import challenge_message
from memory import health, location, raw_store
from memory import services as timeline
from payments import services as payments
from releases import baseline as release_baseline
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
# How many sent, un-ACKed reply.done frames a socket remembers for their runs' traces.
DONE_SENT_KEPT = 32


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


class DeviceConsumer(AsyncWebsocketConsumer):
    device: Device | None = None
    nonce: str = ""
    _auth_timer: asyncio.Task | None = None
    _accepted: bool = False
    _told_unavailable: bool = False
    _received_ms: float = 0.0
    _frame_id: str | None = None  # the id of the text frame being handled, for an internal_error

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # reply.done frames sent and not yet ACKed: seq -> (run id, when sent), for the trace.
        # With whether an ACK of it has ledgers to close (``acknowledge``'s ``ledgers``).
        self._done_sent: dict[int, tuple[str, float, bool]] = {}

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
                self.device = await database_sync_to_async(device_services.active_device)(self.device.id)
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
            device = await database_sync_to_async(device_services.authenticate_challenge)(
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
            fresh = device_services.active_device(device.id)
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
        """Cards that were pushed while this device was away, once per connection: open
        consent cards (to phones and glasses) and open payment cards (to phones), each as
        it was first sent."""
        def cards() -> list[dict[str, Any]]:
            if device.is_guest:
                return []
            frames = []
            if device.id in consent.card_devices(device.owner_id):
                frames += [consent.card_frame(c) for c in consent.pending_cards(device.owner_id)]
            if device.id in payments.card_devices(device.owner_id):
                frames += [payments.card_frame(a) for a in payments.pending_cards(device.owner_id)]
            frames += release_baseline.pending_card_frames(device.owner_id, device.id)
            return frames

        for frame in await database_sync_to_async(cards)():
            await self._send(hud.with_hud(device, frame))

    async def _on_text(self, frame: dict[str, Any]) -> None:
        client_id, text = frame.get("id"), frame.get("text")
        if not isinstance(client_id, str) or not 1 <= len(client_id) <= 64:
            raise YimiError("invalid_frame", "text frames need an id of 1 to 64 characters")
        if not isinstance(text, str) or not text.strip():
            raise YimiError("invalid_frame", "text must be a non-empty string")
        if len(text) > settings.WS_MAX_TEXT_CHARS:
            raise YimiError("text_too_long", f"text is limited to {settings.WS_MAX_TEXT_CHARS} characters")
        assert self.device is not None
        thinking = frame.get("thinking") if isinstance(frame.get("thinking"), bool) else None
        device_id, received_ms = self.device.id, self._received_ms

        def admit() -> tuple[Device, Any, bool]:
            """One trip to this socket's database thread: the device re-check (with its
            owner's account, which admission reads), admission + timeline entry + run in
            one transaction, and after commit the run's Celery message (``publish_run``)."""
            device = device_services.active_device(device_id)
            accepted = accept_utterance(device, client_id, text, thinking=thinking, received_ms=received_ms)
            return device, accepted, (not accepted.duplicate and publish_run(accepted.run_id))

        self.device, accepted, published = await database_sync_to_async(admit)()
        await self._send(
            {
                "type": "text.ack",
                "id": client_id,
                "seq": accepted.entry.seq,
                "run_id": str(accepted.run_id) if accepted.run_id else None,
                "duplicate": accepted.duplicate,
            }
        )
        if not accepted.duplicate:
            if not published:  # the embedded default: the run starts on this event loop
                await dispatch_run(accepted.run_id)
            await push.to_owner(self.device.owner_id, push.timeline_new(accepted.entry.seq, known_to_socket=self.channel_name))

    async def _on_ack(self, frame: dict[str, Any]) -> None:
        """Record the ACK; the first ACK of a ``reply.done`` this socket sent also closes that
        run's trace (``done_sent`` and ``ack``, one UPDATE, in the same thread hop)."""
        assert self.device is not None
        device_id, seq, acked_at = self.device.id, frame.get("seq"), self._received_ms
        sent = self._done_sent.get(seq) if isinstance(seq, int) and not isinstance(seq, bool) else None

        def ack() -> Device:
            """One trip to this socket's database thread: the device re-check, the ACK and the
            trace's stamp (on PostgreSQL one statement: ``acknowledge``)."""
            rider = trace_stages_update(sent[0], {"done_sent": sent[1], "ack": acked_at}) if sent is not None else None
            return device_services.acknowledge(
                device_id, seq, frame.get("status"), ledgers=sent[2] if sent is not None else True, rider=rider
            )

        self.device = await database_sync_to_async(ack)()
        if sent is not None:
            self._done_sent.pop(seq, None)

    async def _on_sync(self, frame: dict[str, Any]) -> None:
        after, limit = frame.get("after", 0), frame.get("limit", 50)
        if isinstance(after, bool) or isinstance(limit, bool) or not isinstance(after, int) or not isinstance(limit, int):
            raise YimiError("invalid_frame", "after and limit must be integers")
        assert self.device is not None
        device = self.device
        page = await database_sync_to_async(timeline.page_after)(
            owner_id=device.owner_id,
            after=after,
            limit=min(limit, settings.TIMELINE_PAGE_MAX),
            only_device_id=device.id if device.is_guest else None,
        )
        entries = await database_sync_to_async(lambda: [timeline.serialize_entry(e) for e in page.entries])()
        await self._send(
            {
                "type": "sync.page",
                "id": frame.get("id"),
                "after": page.after,
                "entries": entries,
                "next_after": page.next_after,
                "has_more": page.has_more,
            }
        )

    async def _on_ping(self, frame: dict[str, Any]) -> None:
        await self._send({"type": "pong", "id": frame.get("id")})

    async def _on_consent_answer(self, frame: dict[str, Any]) -> None:
        assert self.device is not None
        card = await database_sync_to_async(consent.answer_card)(
            self.device, frame.get("card_id"), frame.get("answer"), frame.get("signature")
        )
        await self._send({"type": "consent.result", "id": frame.get("id"), "card_id": str(card.id), "state": card.state})
        if card.state == "approved":
            await dispatch_card_execution(card.id)
        elif card.state == "denied":
            await acknowledge_denied(card.id)

    async def _on_release_answer(self, frame: dict[str, Any]) -> None:
        """The owner's answer to a protected-baseline card (releases.baseline)."""
        assert self.device is not None
        card = await database_sync_to_async(release_baseline.answer_card)(
            self.device, frame.get("card_id"), frame.get("answer"), frame.get("signature")
        )
        await self._send({"type": "release.result", "id": frame.get("id"), "card_id": str(card.id), "state": card.state})

    async def _on_payment_answer(self, frame: dict[str, Any]) -> None:
        assert self.device is not None
        auth = await database_sync_to_async(payments.answer_card)(
            self.device, frame.get("authorization_id"), frame.get("answer"), frame.get("signature")
        )
        await self._send({"type": "payment.result", "id": frame.get("id"), "authorization_id": str(auth.id), "state": auth.state})
        if auth.state == "authorized":
            await dispatch_payment(auth.id)
        elif auth.state == "denied":
            await acknowledge_declined(auth.id)

    async def _on_payment_voice_confirm(self, frame: dict[str, Any]) -> None:
        assert self.device is not None
        auth = await database_sync_to_async(payments.voice_confirm)(self.device, frame.get("authorization_id"), frame.get("utterance_seq"))
        await self._send({"type": "payment.result", "id": frame.get("id"), "authorization_id": str(auth.id), "state": auth.state})
        await dispatch_payment(auth.id)

    async def _on_payment_undo(self, frame: dict[str, Any]) -> None:
        assert self.device is not None
        auth = await database_sync_to_async(payments.undo)(self.device, frame.get("authorization_id"), frame.get("signature"))
        await self._send({"type": "payment.result", "id": frame.get("id"), "authorization_id": str(auth.id), "state": auth.state})

    async def _on_unlock(self, frame: dict[str, Any]) -> None:
        assert self.device is not None
        lease = await database_sync_to_async(payments.grant_unlock_lease)(self.device, self.nonce, frame.get("signature"))
        await self._send({"type": "unlock.ok", "id": frame.get("id"), "expires_at": lease.expires_at.isoformat()})

    async def _on_ride_permission(self, frame: dict[str, Any]) -> None:
        assert self.device is not None
        permission = await database_sync_to_async(consent.grant_ride_permission_from_device)(
            self.device, self.nonce, frame.get("minutes"), frame.get("signature")
        )
        await self._send({"type": "ride.permission.ok", "id": frame.get("id"), "expires_at": permission.expires_at.isoformat()})

    async def _on_model_catalog(self, frame: dict[str, Any]) -> None:
        """The local models a device may switch to, with the digests a switch signs."""

        def listing() -> list[dict[str, Any]]:
            rows = []
            for entry in catalog.load_catalog().entries:
                row = model_settings.selection(entry.kind)
                rows.append({
                    "kind": entry.kind, "model_id": entry.id, "version": entry.version,
                    "digest_summary": entry.digest_summary, "selected": row.selected_key == entry.key,
                    "effective": row.effective_key == entry.key, "state": row.state,
                })
            return rows

        assert self.device is not None
        if self.device.is_guest:
            raise YimiError("forbidden", "a guest device cannot see or switch the owner's models")
        await self._send({"type": "model.catalog", "id": frame.get("id"), "models": await database_sync_to_async(listing)()})

    async def _on_model_switch(self, frame: dict[str, Any]) -> None:
        """A switch signed on this device (``brain.model_settings.model_switch_message``)."""
        assert self.device is not None
        payload = {**frame, "device_id": str(self.device.id)}
        row = await database_sync_to_async(lambda: model_settings.switch_model(model_settings.SignedSwitch.from_payload(payload)))()
        await self._send({
            "type": "model.switch.ok", "id": frame.get("id"), "kind": row.kind, "state": row.state,
            "selected": row.selected_key, "effective": row.effective_key, "previous": row.previous_key,
        })

    async def _on_model_drafts(self, frame: dict[str, Any]) -> None:
        """The model-role drafts a device may confirm (open and probed), with their digests."""
        assert self.device is not None
        if not await database_sync_to_async(is_owner_device)(self.device):
            raise YimiError("forbidden", "only the owner's own (non-guest) devices see or confirm the model drafts")
        drafts = await database_sync_to_async(lambda: [role_drafts.serialize_draft(d) for d in role_drafts.offered_drafts()])()
        await self._send({"type": "model.drafts", "id": frame.get("id"), "drafts": drafts})

    async def _on_model_draft_confirm(self, frame: dict[str, Any]) -> None:
        """A draft confirmed on this device (``brain.role_drafts.draft_confirm_message``)."""
        assert self.device is not None
        payload = {**frame, "device_id": str(self.device.id)}
        draft = await database_sync_to_async(lambda: role_drafts.confirm_draft(role_drafts.SignedDraftConfirm.from_payload(payload)))()
        await self._send({
            "type": "model.draft.confirm.ok", "id": frame.get("id"), "draft_id": str(draft.id), "role": draft.role,
            "state": draft.state, "version": draft.applied_version,
        })

    async def _on_image(self, frame: dict[str, Any]) -> None:
        """An uploaded image announced (devices/images.py): on the timeline, analyzed."""
        assert self.device is not None
        device = self.device
        attached = await database_sync_to_async(device_images.attach_from_frame)(device, frame)
        image = attached.image
        await self._send({
            "type": "image.ack", "id": frame.get("id"), "image_id": str(image.id), "seq": attached.entry.seq,
            "duplicate": attached.duplicate,
        })
        if not attached.duplicate:
            await push.to_owner(device.owner_id, push.timeline_new(attached.entry.seq, known_to_socket=self.channel_name))

    async def _on_gesture(self, frame: dict[str, Any]) -> None:
        """A nod or a shake from the glasses on a card (devices/hud.py)."""
        assert self.device is not None
        outcome = await database_sync_to_async(hud.answer_gesture)(self.device, frame)
        await self._send({
            "type": "gesture.result", "id": frame.get("id"), "card_kind": outcome.card_kind, "card_id": outcome.card_id,
            "gesture": outcome.gesture, "effect": outcome.effect, "state": outcome.state,
        })
        if outcome.card is not None and outcome.state == "approved":
            await dispatch_card_execution(outcome.card.id)
        elif outcome.card is not None and outcome.state == "denied":
            await acknowledge_denied(outcome.card.id)

    async def _on_device_state(self, frame: dict[str, Any]) -> None:
        """What the device says about itself: ``riding`` turns gestures off (devices/hud.py)."""
        assert self.device is not None
        state = await database_sync_to_async(hud.report_state)(self.device, frame)
        await self._send({"type": "device.state.ok", "id": frame.get("id"), "riding": state.riding})

    async def _on_location_report(self, frame: dict[str, Any]) -> None:
        """A signed location report from the owner's phone (memory.location), then the
        owner's geofences (brain.geofences): ``location.report.ok``."""
        assert self.device is not None
        device, nonce = self.device, self.nonce

        def accept() -> tuple[Any, int, dict[str, Any] | None]:
            stored = location.record_report(device, nonce, frame)
            notices = [] if stored.duplicate else geofences.on_location_report(stored.report)
            at = stored.report.at
            kept = None if stored.duplicate else raw_store.archive_event(raw_store.device_capture(device), "location.report", frame, started_at=at, ended_at=at)
            return stored, len(notices), kept

        stored, notices, kept = await database_sync_to_async(accept)()
        await self._send({
            "type": "location.report.ok", "id": frame.get("id"), "report_id": str(stored.report.id),
            "duplicate": stored.duplicate, "geofence_notices": notices, **(kept or {}),
        })

    async def _on_health_record(self, frame: dict[str, Any]) -> None:
        """A health record from the owner's watch or phone (memory.health): ``health.record.ok``."""
        assert self.device is not None
        device = self.device

        def accept() -> tuple[Any, dict[str, Any] | None]:
            stored = health.record(device, frame)
            row = stored.record
            kept = None if stored.duplicate else raw_store.archive_event(raw_store.device_capture(device), "health.record", frame, started_at=row.start, ended_at=row.end)
            return stored, kept

        stored, kept = await database_sync_to_async(accept)()
        await self._send({
            "type": "health.record.ok", "id": frame.get("id"), "record_id": str(stored.record.id), "duplicate": stored.duplicate,
            **(kept or {}),
        })

    # Frames whose handler re-checks the device itself, in the database trip it makes anyway.
    RECHECKED_IN_HANDLER = frozenset({"text", "ack"})

    HANDLERS = {
        "text": _on_text,
        "image": _on_image,
        "gesture": _on_gesture,
        "device.state": _on_device_state,
        "model.catalog": _on_model_catalog,
        "model.switch": _on_model_switch,
        "model.drafts": _on_model_drafts,
        "model.draft.confirm": _on_model_draft_confirm,
        "ride.permission": _on_ride_permission,
        "ack": _on_ack,
        "sync": _on_sync,
        "ping": _on_ping,
        "consent.answer": _on_consent_answer,
        "release.answer": _on_release_answer,
        "payment.answer": _on_payment_answer,
        "payment.voice_confirm": _on_payment_voice_confirm,
        "payment.undo": _on_payment_undo,
        "device.unlock": _on_unlock,
        # the Mac relay (devices/mac_relay.py)
        "mac.hello": mac_relay.on_hello,
        "mac.pause": mac_relay.on_pause,
        "mac.result": mac_relay.on_result,
        # location and health (memory.location, memory.health)
        "location.report": _on_location_report,
        "health.record": _on_health_record,
    }

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

    async def reply_chunk(self, event: dict[str, Any]) -> None:
        await self._send(dict(event))

    async def reply_done(self, event: dict[str, Any]) -> None:
        frame = dict(event)
        ledgers = frame.pop("ledgers", True) is not False  # the sender's word, not the device's
        await self._send(frame)
        # The trace's done_sent, kept until the device ACKs (written with the ack; brain.trace).
        if isinstance(event.get("seq"), int) and event.get("run_id"):
            self._done_sent[event["seq"]] = (event["run_id"], now_ms(), ledgers)
            while len(self._done_sent) > DONE_SENT_KEPT:
                self._done_sent.pop(next(iter(self._done_sent)))

    async def notice(self, event: dict[str, Any]) -> None:
        await self._send(dict(event))

    async def consent_card(self, event: dict[str, Any]) -> None:
        await self._send(hud.with_hud(self.device, dict(event)))

    async def payment_card(self, event: dict[str, Any]) -> None:
        await self._send(hud.with_hud(self.device, dict(event)))

    async def release_card(self, event: dict[str, Any]) -> None:
        if self.device is not None and not self.device.is_guest:
            await self._send(dict(event))

    async def activity(self, event: dict[str, Any]) -> None:
        if self.device is not None and not self.device.is_guest:
            await self._send(hud.with_hud(self.device, dict(event)))

    async def timeline_new(self, event: dict[str, Any]) -> None:
        """The hint, to owner devices, except where it tells nothing new (``push.timeline_new``):
        the socket whose ack carried the ``seq``, the device whose ``reply.done`` did."""
        if self.device is None or self.device.is_guest:
            return
        if event.get("known_to_socket") == self.channel_name or event.get("known_to_device") == str(self.device.id):
            return
        await self._send({"type": "timeline.new", "seq": event.get("seq")})

    # an operation for this Mac, and the owner's pause, from the Mac relay (devices/mac_relay.py)
    mac_op = mac_relay.deliver_op
    mac_paused = mac_relay.deliver_paused

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
